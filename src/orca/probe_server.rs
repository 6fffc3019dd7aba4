//! The server side of load probes ([`crate::probe`]): [`OrcaLayer`](super::OrcaLayer) answers
//! the method [`probe::PATH`] itself, without passing it to the service it wraps and without
//! counting it as a call. This module reads and checks the probe's request and makes the
//! response: the [`OrcaHandle::probe_answer`] as of the moment the request was read, in one
//! gRPC message, then the trailers of status OK; a malformed request gets a trailers-only
//! response with the status it deserves.

use std::future::Future;
use std::pin::Pin;

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;

use super::OrcaHandle;
use crate::headers::GRPC_STATUS;
use crate::probe;

/// The largest probe request read (the message has no field yet; a later one will be small):
/// larger is answered with RESOURCE_EXHAUSTED.
const MAX_PROBE_REQUEST: usize = 16 * 1024;

/// Reading a probe's request: whether it was one well-formed `ProbeRequest`, and if not, the
/// status to answer with.
type ReadingProbeRequest = Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;

/// Reads a probe's request body to its end and checks it.
async fn read_request<B: HttpBody + Send + 'static>(body: B) -> Result<(), Status> {
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let Some(frame) = frame else { break };
        let Ok(mut data) = frame
            .map_err(|_| Status::cancelled("the probe's request broke off"))?
            .into_data()
        else {
            continue;
        };
        if bytes.len() + data.remaining() > MAX_PROBE_REQUEST {
            return Err(Status::resource_exhausted("probe request too large"));
        }
        while data.has_remaining() {
            let chunk = data.chunk();
            bytes.extend_from_slice(chunk);
            let n = chunk.len();
            data.advance(n);
        }
    }
    check_request(&bytes)
}

/// Checks a unary gRPC request body: exactly one message (a flag byte, its length in four
/// bytes big-endian, the message), uncompressed, a well-formed `ProbeRequest`.
fn check_request(body: &[u8]) -> Result<(), Status> {
    let (head, message) = body
        .split_at_checked(5)
        .ok_or_else(|| Status::internal("the probe request has no message"))?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    match head[0] {
        0 => {}
        // gRPC's rule for a compression the server does not support.
        1 => {
            return Err(Status::unimplemented(
                "compressed probe requests are not supported",
            ))
        }
        _ => return Err(Status::internal("malformed gRPC message frame")),
    }
    if message.len() != len {
        return Err(Status::internal(if message.len() < len {
            "the probe request's message is cut short"
        } else {
            "more than one message in a unary probe request"
        }));
    }
    if !probe::is_request(message) {
        return Err(Status::internal("malformed ProbeRequest"));
    }
    Ok(())
}

/// A probe being answered: its request is being read.
pub(super) struct PendingProbe {
    handle: OrcaHandle,
    read: ReadingProbeRequest,
}

impl std::fmt::Debug for PendingProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingProbe").finish_non_exhaustive()
    }
}

impl PendingProbe {
    /// A probe whose request is `body`, to be answered from `handle`.
    pub(super) fn new<B: HttpBody + Send + 'static>(handle: OrcaHandle, body: B) -> PendingProbe {
        PendingProbe {
            handle,
            read: Box::pin(read_request(body)),
        }
    }

    /// Reads the request to its end: the result of its checks.
    pub(super) fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Status>> {
        self.read.as_mut().poll(cx)
    }

    /// The response to the probe, its request read with this result: the answer as of now in
    /// one gRPC message, then the trailers of status OK; or a trailers-only response with the
    /// status the request deserves.
    pub(super) fn respond(self, read: Result<(), Status>) -> http::Response<ProbeResponseBody> {
        if let Err(status) = read {
            let (head, ()) = status.into_http::<()>().into_parts();
            return http::Response::from_parts(head, ProbeResponseBody::default());
        }
        let message = self.handle.probe_answer().encode();
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0);
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(&message);
        let mut trailers = http::HeaderMap::with_capacity(1);
        trailers.insert(GRPC_STATUS.clone(), http::HeaderValue::from_static("0"));
        let mut resp = http::Response::new(ProbeResponseBody {
            data: Some(Bytes::from(frame)),
            trailers: Some(trailers),
        });
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        resp
    }
}

/// What is left to send of the answer to a probe: its message, then its trailers.
#[derive(Debug, Default)]
pub(super) struct ProbeResponseBody {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl ProbeResponseBody {
    /// The next frame to send; `None` once all is sent.
    pub(super) fn next_frame<D: From<Bytes>>(&mut self) -> Option<Frame<D>> {
        match (self.data.take(), self.trailers.take()) {
            (Some(data), trailers) => {
                self.trailers = trailers;
                Some(Frame::data(D::from(data)))
            }
            (None, Some(trailers)) => Some(Frame::trailers(trailers)),
            (None, None) => None,
        }
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut b = vec![flag];
        b.extend((message.len() as u32).to_be_bytes());
        b.extend(message);
        b
    }

    /// A probe request must be one uncompressed, well-formed `ProbeRequest` (fields unknown to
    /// the server skipped).
    #[test]
    fn probe_request_checks() {
        let code = |b: &[u8]| check_request(b).map_err(|s| s.code());
        assert_eq!(code(&framed(0, &[])), Ok(()));
        assert_eq!(code(&framed(0, &[0x08, 1, 0x12, 1, b'x'])), Ok(()));
        let mut two = framed(0, &[]);
        two.extend(framed(0, &[]));
        let cases: [(&[u8], tonic::Code); 7] = [
            (&[], tonic::Code::Internal),
            (&[0, 0, 0, 0], tonic::Code::Internal),
            (&[0, 0, 0, 0, 2], tonic::Code::Internal),
            (&two, tonic::Code::Internal),
            (&framed(0, &[0x08]), tonic::Code::Internal),
            (&framed(1, &[]), tonic::Code::Unimplemented),
            (&framed(2, &[]), tonic::Code::Internal),
        ];
        for (bytes, expected) in cases {
            assert_eq!(code(bytes), Err(expected), "{bytes:x?}");
        }
    }
}
