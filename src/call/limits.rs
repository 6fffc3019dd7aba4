//! The size limits of a service config's method config (`maxRequestMessageBytes`,
//! `maxResponseMessageBytes`), checked as the bodies pass: each gRPC message is a 5-byte
//! prefix (a compression flag, then its length, big-endian) and that many bytes, so reading the
//! prefixes is enough. Nothing is buffered or copied; a call without limits has none of this.
//!
//! As grpc-go checks them (`rpc_util.go`, `stream.go`): a request message above the limit fails
//! the call with RESOURCE_EXHAUSTED "trying to send message larger than max (N vs. M)" before
//! any byte of it goes out: the caller's own error (invariant 11), never sent again, nothing
//! against the instance. A response message above the limit fails the call with
//! RESOURCE_EXHAUSTED "grpc: received message larger than max (N vs. M)" before any byte of it
//! reaches the caller, and cancels the stream; the instance answered, so nothing counts against
//! it either. The length compared is the prefix's: the message as sent, compressed if it was.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

use super::attempt::GuardedBody;
use crate::instance::events::Outcome;

/// Where a stream of gRPC messages stands, however it is cut into frames.
#[derive(Debug, Default)]
struct Prefixes {
    /// Bytes of the current message still to come.
    left: u64,
    /// Bytes of the current prefix read (0 to 4), and its length so far.
    read: u8,
    len: u32,
}

impl Prefixes {
    /// Reads the next piece of the stream: the first message in it whose length is above
    /// `max`, as where its prefix starts in `data` (0 if in an earlier piece) and its length.
    fn over(&mut self, data: &[u8], max: u32) -> Option<(usize, u32)> {
        let mut i = 0;
        let mut start = 0;
        while i < data.len() {
            if self.left > 0 {
                let skip = self.left.min((data.len() - i) as u64);
                self.left -= skip;
                i += skip as usize;
                continue;
            }
            if self.read == 0 {
                start = i;
            } else {
                self.len = (self.len << 8) | u32::from(data[i]);
            }
            i += 1;
            if self.read < 4 {
                self.read += 1;
                continue;
            }
            let len = std::mem::take(&mut self.len);
            self.read = 0;
            self.left = u64::from(len);
            if len > max {
                return Some((start, len));
            }
        }
        None
    }
}

/// What a limited body does with the frame it polled: yields it, or the part of it before an
/// oversized message and then `status`.
enum Checked {
    Pass(Frame<Bytes>),
    Over(Option<Bytes>, tonic::Status),
}

/// Checks one frame against the limit.
fn check(
    prefixes: &mut Prefixes,
    frame: Frame<Bytes>,
    max: u32,
    status: impl FnOnce(u32) -> tonic::Status,
) -> Checked {
    let Some(data) = frame.data_ref() else {
        return Checked::Pass(frame);
    };
    match prefixes.over(data, max) {
        None => Checked::Pass(frame),
        Some((at, len)) => {
            let before = (at > 0).then(|| data.slice(..at));
            Checked::Over(before, status(len))
        }
    }
}

/// A request body whose messages may not be longer than `max` bytes: the caller's body, before
/// its request is recorded for further attempts.
pub(super) struct LimitedRequest {
    inner: Body,
    max: u32,
    prefixes: Prefixes,
    /// The error to yield next (after the part of a frame before an oversized message), then
    /// nothing.
    over: Option<Option<tonic::Status>>,
}

impl LimitedRequest {
    pub(super) fn new(inner: Body, max: u32) -> LimitedRequest {
        LimitedRequest {
            inner,
            max,
            prefixes: Prefixes::default(),
            over: None,
        }
    }
}

impl HttpBody for LimitedRequest {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if let Some(over) = &mut this.over {
            return Poll::Ready(over.take().map(Err));
        }
        let frame = match std::task::ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        let max = this.max;
        let status = |len| {
            tonic::Status::resource_exhausted(format!(
                "trying to send message larger than max ({len} vs. {max})"
            ))
        };
        Poll::Ready(Some(match check(&mut this.prefixes, frame, max, status) {
            Checked::Pass(frame) => Ok(frame),
            Checked::Over(Some(before), status) => {
                this.over = Some(Some(status));
                Ok(Frame::data(before))
            }
            Checked::Over(None, status) => {
                this.over = Some(None);
                Err(status)
            }
        }))
    }

    fn is_end_stream(&self) -> bool {
        match &self.over {
            // The error must still be polled: the request must not end as if it were whole.
            Some(Some(_)) => false,
            Some(None) => true,
            None => self.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.over {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

/// A response body whose messages may not be longer than `max` bytes: the delivered answer,
/// which holds its call's guard.
pub(super) struct LimitedResponse {
    /// The answer; dropped (its stream cancelled, its count released) once a message is over.
    inner: Option<GuardedBody>,
    max: u32,
    prefixes: Prefixes,
    /// The error to yield next, after the part of a frame before an oversized message.
    over: Option<tonic::Status>,
}

impl LimitedResponse {
    pub(super) fn new(inner: GuardedBody, max: u32) -> LimitedResponse {
        LimitedResponse {
            inner: Some(inner),
            max,
            prefixes: Prefixes::default(),
            over: None,
        }
    }

    /// The call is over with `status`: the caller's limit, not the instance's fault; the
    /// stream is cancelled.
    fn fail(&mut self, status: tonic::Status) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Some(mut inner) = self.inner.take() {
            inner.end_here(Outcome::Neutral, status.code());
        }
        Poll::Ready(Some(Err(status)))
    }
}

impl HttpBody for LimitedResponse {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if let Some(status) = this.over.take() {
            return this.fail(status);
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match std::task::ready!(Pin::new(inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        let max = this.max;
        let status = |len| {
            tonic::Status::resource_exhausted(format!(
                "grpc: received message larger than max ({len} vs. {max})"
            ))
        };
        match check(&mut this.prefixes, frame, max, status) {
            Checked::Pass(frame) => Poll::Ready(Some(Ok(frame))),
            Checked::Over(Some(before), status) => {
                this.over = Some(status);
                Poll::Ready(Some(Ok(Frame::data(before))))
            }
            Checked::Over(None, status) => this.fail(status),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.over.is_none() && self.inner.as_ref().is_none_or(HttpBody::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(SizeHint::default, HttpBody::size_hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages of these lengths, each with its prefix.
    fn stream(lens: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &len in lens {
            out.push(0);
            out.extend_from_slice(&len.to_be_bytes());
            out.extend(std::iter::repeat_n(7u8, len as usize));
        }
        out
    }

    /// The first message over the limit is found wherever the stream is cut, and where its
    /// prefix starts in the piece that completes it.
    #[test]
    fn an_oversized_message_is_found_however_the_stream_is_cut() {
        let data = stream(&[3, 16, 0, 17, 2]);
        let want = 5 + 3 + 5 + 16 + 5;
        assert_eq!(Prefixes::default().over(&data, 16), Some((want, 17)));
        assert_eq!(Prefixes::default().over(&data, 17), None);
        for cut in 1..data.len() {
            let mut p = Prefixes::default();
            let found = match p.over(&data[..cut], 16) {
                Some((at, len)) => Some((at, len)),
                None => p.over(&data[cut..], 16).map(|(at, len)| (at + cut, len)),
            };
            // A prefix cut in two is found in the second piece, from its start.
            let start = if cut > want && cut < want + 5 {
                cut
            } else {
                want
            };
            assert_eq!(found, Some((start, 17)), "cut at {cut}");
        }
        for step in 1..7 {
            let mut p = Prefixes::default();
            let found = data
                .chunks(step)
                .find_map(|piece| p.over(piece, 16))
                .map(|(_, len)| len);
            assert_eq!(found, Some(17), "pieces of {step}");
        }
    }

    /// A request body whose one frame holds a message within the limit and then one above it:
    /// the first goes, the body does not end there (it would end the request as if whole: the
    /// server would take the messages before for all of it), and the error follows.
    #[test]
    fn a_request_fails_after_the_messages_within_its_limit() {
        struct One(Option<Bytes>);
        impl HttpBody for One {
            type Data = Bytes;
            type Error = tonic::Status;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
                Poll::Ready(self.0.take().map(|d| Ok(Frame::data(d))))
            }
            fn is_end_stream(&self) -> bool {
                self.0.is_none()
            }
        }
        let data = Bytes::from(stream(&[3, 40]));
        let mut body = LimitedRequest::new(Body::new(One(Some(data.clone()))), 16);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(f))) => assert_eq!(f.into_data().unwrap(), data.slice(..8)),
            other => panic!("the message within the limit first: {other:?}"),
        }
        assert!(
            !body.is_end_stream(),
            "not over: the error is still to come"
        );
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(Some(Err(status))) => assert_eq!(
                status.message(),
                "trying to send message larger than max (40 vs. 16)"
            ),
            other => panic!("{other:?}"),
        }
        assert!(body.is_end_stream());
    }

    /// A length of up to 4 GiB reads whole (its bytes big-endian).
    #[test]
    fn lengths_read_big_endian() {
        let mut p = Prefixes::default();
        assert_eq!(
            p.over(&[1, 0xff, 0xff, 0xff, 0xff], 1 << 31),
            Some((0, u32::MAX))
        );
        let mut p = Prefixes::default();
        assert_eq!(p.over(&[0, 0, 1, 0, 0], 65_535), Some((0, 65_536)));
    }
}
