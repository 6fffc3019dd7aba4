//! The message bytes of a gRPC stream, counted without their prefixes however the stream is cut
//! into frames.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Where a stream of gRPC messages stands: each message is a 5-byte prefix (a compression
/// flag, then the length, big-endian) and that many bytes, cut into frames anywhere.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Messages {
    /// Bytes of the current message still to come.
    left: u64,
    /// Bytes of the current prefix read so far (0 to 4), and its length so far.
    prefix: u8,
    len: u32,
}

impl Messages {
    /// The message bytes (prefixes left out) in the next piece of the stream.
    #[inline]
    pub(crate) fn payload(&mut self, mut data: &[u8]) -> u64 {
        let mut bytes = 0;
        while !data.is_empty() {
            if self.left > 0 {
                let take = self.left.min(data.len() as u64);
                bytes += take;
                self.left -= take;
                data = &data[take as usize..];
                continue;
            }
            if self.prefix > 0 {
                self.len = (self.len << 8) | u32::from(data[0]);
            }
            data = &data[1..];
            if self.prefix == 4 {
                self.left = u64::from(self.len);
                self.prefix = 0;
                self.len = 0;
            } else {
                self.prefix += 1;
            }
        }
        bytes
    }
}

pin_project_lite::pin_project! {
    /// An attempt's request body that counts the message bytes it yields.
    pub(super) struct CountedBody {
        #[pin]
        pub(super) inner: tonic::body::Body,
        pub(super) sent: Arc<AtomicU64>,
        pub(super) messages: Messages,
    }
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        let this = self.project();
        let res = this.inner.poll_frame(cx);
        if let std::task::Poll::Ready(Some(Ok(frame))) = &res {
            if let Some(data) = frame.data_ref() {
                let n = this.messages.payload(data);
                if n > 0 {
                    this.sent.fetch_add(n, Ordering::Relaxed);
                }
            }
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
