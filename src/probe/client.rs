//! The client's side of a probe: one unary call of [`PATH`](super::PATH), straight on an
//! instance's tonic `Channel`, through tonic's gRPC framing with this module's codec.

use std::time::Duration;

use bytes::Buf;
use tonic::codec::{DecodeBuf, EncodeBuf};
use tonic::{Code, Status};

use super::{wire, ProbeAnswer, PATH};

/// Why a probe brought no answer.
#[derive(Debug)]
pub(crate) enum ProbeError {
    /// The instance does not serve probes (it answered UNIMPLEMENTED).
    Unimplemented,
    /// No answer within the probe's timeout.
    Timeout,
    /// Any other failure: the connection, the server's status, an answer that does not decode
    /// (INTERNAL).
    Other(Status),
}

/// Probes the instance behind `channel`: the answer, or why there is none within `timeout`
/// (measured on tokio's clock, so a paused clock drives it).
///
/// The probe is not a call of the balancer: it goes to the instance's own `Channel`, and is
/// neither picked nor counted nor retried. Dropping the future cancels the probe's stream.
pub(crate) async fn probe(
    channel: tonic::transport::Channel,
    timeout: Duration,
) -> Result<ProbeAnswer, ProbeError> {
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(crate::error::chain(&e)))?;
        let path = http::uri::PathAndQuery::from_static(PATH);
        grpc.unary(tonic::Request::new(ProbeRequest), path, ProbeCodec)
            .await
            .map(tonic::Response::into_inner)
    };
    // No grpc-timeout on the request: tonic's own timer for it could end the call with a
    // status of its own at the very instant this one fires.
    match tokio::time::timeout(crate::time::cap(timeout), call).await {
        Err(_) => Err(ProbeError::Timeout),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(status)) if status.code() == Code::Unimplemented => Err(ProbeError::Unimplemented),
        Ok(Err(status)) => Err(ProbeError::Other(status)),
    }
}

/// A `ProbeRequest`: no field.
struct ProbeRequest;

/// tonic's gRPC framing around the probe's hand-made messages: sends a [`ProbeRequest`], receives
/// a [`ProbeAnswer`].
#[derive(Clone, Copy)]
struct ProbeCodec;

impl tonic::codec::Codec for ProbeCodec {
    type Encode = ProbeRequest;
    type Decode = ProbeAnswer;
    type Encoder = ProbeCodec;
    type Decoder = ProbeCodec;

    fn encoder(&mut self) -> ProbeCodec {
        ProbeCodec
    }

    fn decoder(&mut self) -> ProbeCodec {
        ProbeCodec
    }
}

impl tonic::codec::Encoder for ProbeCodec {
    type Item = ProbeRequest;
    type Error = Status;

    fn encode(
        &mut self,
        ProbeRequest: ProbeRequest,
        _dst: &mut EncodeBuf<'_>,
    ) -> Result<(), Status> {
        // The empty message: nothing to write.
        Ok(())
    }
}

impl tonic::codec::Decoder for ProbeCodec {
    type Item = ProbeAnswer;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<ProbeAnswer>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        wire::decode_answer(&bytes)
            .map(Some)
            .map_err(|wire::Malformed| Status::internal("malformed ProbeResponse"))
    }
}
