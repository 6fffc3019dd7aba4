//! tonic's gRPC framing around messages the library encodes by hand (ORCA's out-of-band
//! reports, xDS's discovery messages): a [`tonic::codec::Codec`] over two small traits, so
//! that no build of the library needs `prost` or generated code.

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use tonic::codec::{DecodeBuf, EncodeBuf};
use tonic::Status;

/// A message sent, encoded by hand.
pub(crate) trait Encode: Send + 'static {
    fn encode_to(&self, out: &mut Vec<u8>);
}

/// A message received, decoded by hand.
pub(crate) trait Decode: Sized + Send + 'static {
    fn decode_from(bytes: &[u8]) -> Result<Self, Status>;
}

/// tonic's gRPC framing around hand-made messages: `E` sent, `D` received.
pub(crate) struct HandCodec<E, D>(PhantomData<fn(E) -> D>);

impl<E, D> Default for HandCodec<E, D> {
    fn default() -> Self {
        HandCodec(PhantomData)
    }
}

impl<E: Encode, D: Decode> tonic::codec::Codec for HandCodec<E, D> {
    type Encode = E;
    type Decode = D;
    type Encoder = HandCodec<E, D>;
    type Decoder = HandCodec<E, D>;

    fn encoder(&mut self) -> Self::Encoder {
        HandCodec::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        HandCodec::default()
    }
}

impl<E: Encode, D> tonic::codec::Encoder for HandCodec<E, D> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let mut out = Vec::with_capacity(64);
        item.encode_to(&mut out);
        dst.put_slice(&out);
        Ok(())
    }
}

impl<E, D: Decode> tonic::codec::Decoder for HandCodec<E, D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        D::decode_from(&bytes).map(Some)
    }
}
