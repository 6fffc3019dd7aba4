//! The request of a call, for each of its attempts: the head copied, the caller's body in a slot
//! that the attempts share.
//!
//! A call can go to another instance only if its request can be sent again exactly as the caller
//! sent it (invariant 6). The head is copied when the call is routed. The caller's body waits in
//! the slot; each attempt gets an [`AttemptBody`] that reads it only when its connection first
//! polls it. So:
//! - an attempt that never left (its connection could not be opened, was closed before the
//!   request was written, or is still being opened) leaves the body in the slot, and the next
//!   attempt takes it: not one byte went out (transparent retry). Only a body that was never
//!   polled to a result goes back: once it yielded anything, its end included (an empty
//!   request's END_STREAM may have reached the server whole), it may have gone out;
//! - an attempt that the call gave up on while it waited in a connection's queue can never send
//!   the body later: each new attempt that reads the caller's body takes the slot over, and a
//!   stale attempt that is polled after that fails its stream instead;
//! - the attempt that reads the caller's body keeps a copy of what it sent (up to a size limit),
//!   and later attempts (retries, hedges, replays of a refused stream) send that copy; nothing is
//!   recorded twice, and recording stops (the copy is freed) once the response has started,
//!   when no further attempt can be made;
//! - a body that was partly sent and not recorded whole is never sent again;
//! - **the caller's body failing is the caller's error**: an encoder that refuses a message
//!   (over `max_encoding_message_size`), a request stream the caller ends with an error. The
//!   slot keeps that error; the call ends with it, and nothing is sent again.
//!
//! Each attempt has an id; the slot records which attempts' bodies were read (so the call knows
//! whether anything of an attempt can have gone out), and wakes a call waiting for the copy.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

use crate::lock;

/// An attempt's id in its call's slot.
pub(crate) type AttemptId = u32;

/// The slot that a call's attempts share.
struct Kept {
    /// The attempt that may read the caller's body (and hand it back): each new attempt made
    /// with [`Replay::request`] takes the slot over.
    owner: AttemptId,
    /// The next attempt's id.
    next: AttemptId,
    /// The attempts whose bodies were polled by their connections (bit `id`; an id of 64 or
    /// more counts as read: a call does not make that many attempts).
    read: u64,
    /// The caller's body, until an attempt reads it (or after an attempt that never polled it
    /// to a result handed it back).
    body: Option<Body>,
    /// Keep a copy of what the caller's body yields, up to `limit` bytes.
    record: bool,
    limit: usize,
    frames: Frames,
    trailers: Option<http::HeaderMap>,
    len: usize,
    /// The recording holds the whole body.
    complete: bool,
    /// Recording given up: the body was larger than the limit, failed, or the response started.
    dropped: bool,
    /// The response has started: no further attempt.
    committed: bool,
    /// The caller's body failed with this: the call's answer.
    caller_error: Option<tonic::Status>,
    /// A call waiting for the recording to be whole (or given up).
    waiting: Option<Waker>,
}

impl Kept {
    /// Whether another attempt could send the request exactly as the caller sent it.
    fn replayable(&self) -> bool {
        !self.committed
            && self.caller_error.is_none()
            && (self.body.is_some() || (self.complete && !self.dropped))
    }

    fn stop_recording(&mut self) {
        self.dropped = true;
        self.frames = Frames::default();
        self.trailers = None;
        self.wake();
    }

    fn wake(&mut self) {
        if let Some(w) = self.waiting.take() {
            w.wake();
        }
    }

    fn mark_read(&mut self, id: AttemptId) {
        if id < 64 {
            self.read |= 1 << id;
        }
    }

    fn was_read(&self, id: AttemptId) -> bool {
        id >= 64 || self.read & (1 << id) != 0
    }

    fn new_id(&mut self) -> AttemptId {
        let id = self.next;
        self.next = self.next.saturating_add(1);
        id
    }

    fn recorded(&self) -> BodyFrom {
        BodyFrom::Recorded {
            frames: self.frames.copy(),
            trailers: self.trailers.clone(),
        }
    }
}

type SlotRef = Arc<Mutex<Kept>>;

/// The data frames of a recorded body: the first inline (a unary request is one frame, and
/// its recording then costs no allocation), the others after it.
#[derive(Default)]
struct Frames {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

impl Frames {
    fn push(&mut self, data: Bytes) {
        if self.first.is_none() {
            self.first = Some(data);
        } else {
            self.rest.push(data);
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The frames, to be sent in order.
    fn copy(&self) -> Sending {
        Sending {
            first: self.first.clone(),
            rest: self.rest.clone().into_iter(),
        }
    }
}

/// Recorded frames being sent.
struct Sending {
    first: Option<Bytes>,
    rest: std::vec::IntoIter<Bytes>,
}

impl Sending {
    fn next(&mut self) -> Option<Bytes> {
        self.first.take().or_else(|| self.rest.next())
    }

    fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.len() == 0
    }
}

/// Where an attempt's body comes from.
enum BodyFrom {
    /// Not read yet: the caller's body (or the recording) is still in the slot.
    Unclaimed,
    /// The caller's body, taken from the slot.
    Caller {
        body: Body,
        /// Recording what it yields into the slot.
        recording: bool,
        /// Whether it was polled to a result (a frame, its end or an error): then it may have
        /// gone out, and is never handed back.
        polled: bool,
        /// What the body had ready after a data frame it yielded (looked at while recording,
        /// so that a unary body's end is recorded with its message: a stream the server refuses
        /// before the connection reads that end can still be sent again); yielded next.
        peeked: Option<Option<Result<Frame<Bytes>, tonic::Status>>>,
    },
    /// The recording of what an earlier attempt read.
    Recorded {
        frames: Sending,
        trailers: Option<http::HeaderMap>,
    },
    /// Over, or refused.
    Done,
}

/// The request body of one attempt: see the module docs.
pub(crate) struct AttemptBody {
    slot: SlotRef,
    id: AttemptId,
    source: BodyFrom,
    /// Polled by its connection at least once.
    seen: bool,
}

impl AttemptBody {
    /// The connection polls the body for the first time: takes what this attempt sends from
    /// the slot; an error if the attempt has been given up on.
    fn claim(&mut self) -> Result<(), tonic::Status> {
        let mut slot = lock(&self.slot);
        slot.mark_read(self.id);
        if slot.owner != self.id {
            return Err(tonic::Status::cancelled(
                "tonic-balancer: this attempt was given up on before it was sent",
            ));
        }
        self.source = if let Some(body) = slot.body.take() {
            BodyFrom::Caller {
                body,
                recording: slot.record && !slot.dropped && !slot.committed,
                polled: false,
                peeked: None,
            }
        } else if slot.complete && !slot.dropped {
            let source = slot.recorded();
            if slot.committed {
                // The response started before this attempt was read: the copy is no longer
                // needed once this attempt has its own.
                slot.stop_recording();
            }
            source
        } else {
            // Cannot happen: an attempt is only made when the request can be had again.
            return Err(tonic::Status::internal(
                "tonic-balancer: the request body cannot be sent again",
            ));
        };
        Ok(())
    }

    /// Records what the caller's body yielded (`res`), while recording.
    fn record(
        slot: &SlotRef,
        recording: &mut bool,
        res: &Poll<Option<Result<Frame<Bytes>, tonic::Status>>>,
    ) {
        let mut slot = lock(slot);
        if slot.committed || slot.dropped {
            *recording = false;
            return;
        }
        match res {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    slot.len += data.len();
                    if slot.len > slot.limit {
                        slot.stop_recording();
                        *recording = false;
                    } else {
                        slot.frames.push(data.clone());
                    }
                } else if let Some(t) = frame.trailers_ref() {
                    slot.trailers = Some(t.clone());
                }
            }
            Poll::Ready(None) => {
                slot.complete = true;
                *recording = false;
                slot.wake();
            }
            Poll::Ready(Some(Err(_))) => {
                slot.stop_recording();
                *recording = false;
            }
            Poll::Pending => {}
        }
    }
}

impl Drop for AttemptBody {
    fn drop(&mut self) {
        // A caller's body that was never polled to a result went nowhere: hand it back for the
        // next attempt.
        if let BodyFrom::Caller {
            polled: false,
            body,
            ..
        } = &mut self.source
        {
            let body = std::mem::take(body);
            let mut slot = lock(&self.slot);
            if slot.body.is_none() && !slot.committed {
                slot.body = Some(body);
                if slot.owner == self.id {
                    // Nothing of it went out: the attempt counts as unread.
                    if self.id < 64 {
                        slot.read &= !(1 << self.id);
                    }
                }
            }
        }
    }
}

impl HttpBody for AttemptBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if !this.seen {
            this.seen = true;
            if let BodyFrom::Unclaimed = this.source {
                if let Err(status) = this.claim() {
                    this.source = BodyFrom::Done;
                    return Poll::Ready(Some(Err(status)));
                }
            } else {
                // A copy: its own, but the call must know that it went out.
                lock(&this.slot).mark_read(this.id);
            }
        }
        match &mut this.source {
            BodyFrom::Unclaimed | BodyFrom::Done => Poll::Ready(None),
            BodyFrom::Recorded { frames, trailers } => match frames.next() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))),
            },
            BodyFrom::Caller {
                body,
                recording,
                polled,
                peeked,
            } => {
                let res = match peeked.take() {
                    Some(next) => Poll::Ready(next),
                    None => Pin::new(&mut *body).poll_frame(cx),
                };
                if res.is_ready() {
                    *polled = true;
                }
                if let Poll::Ready(Some(Err(status))) = &res {
                    // The caller's own error: the call's answer, and nothing is sent again.
                    let mut slot = lock(&this.slot);
                    if slot.caller_error.is_none() {
                        slot.caller_error = Some(status.clone());
                    }
                    slot.stop_recording();
                    *recording = false;
                }
                if *recording {
                    Self::record(&this.slot, recording, &res);
                }
                if *recording && matches!(&res, Poll::Ready(Some(Ok(f))) if f.is_data()) {
                    // Look ahead: a body whose end is ready now is recorded whole at once.
                    let mut now = Context::from_waker(Waker::noop());
                    if let Poll::Ready(next) = Pin::new(&mut *body).poll_frame(&mut now) {
                        if next.is_none() {
                            let mut slot = lock(&this.slot);
                            if !slot.committed && !slot.dropped {
                                slot.complete = true;
                                slot.wake();
                            }
                            *recording = false;
                        }
                        *peeked = Some(next);
                    }
                }
                res
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            // Unknown until it is read: the connection reads it to find out.
            BodyFrom::Unclaimed => false,
            BodyFrom::Caller { body, peeked, .. } => match peeked {
                Some(next) => next.is_none(),
                None => body.is_end_stream(),
            },
            BodyFrom::Recorded { frames, trailers } => frames.is_empty() && trailers.is_none(),
            BodyFrom::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            BodyFrom::Caller { body, .. } => body.size_hint(),
            _ => SizeHint::default(),
        }
    }
}

/// The request of a call, for its attempts: the head, copied, and the body's slot.
pub(crate) struct Replay {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    extensions: http::Extensions,
    slot: SlotRef,
}

/// What [`Replay::copy`] found.
// A value returned and matched at once: boxing the request would cost an allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Copied {
    /// The request for one more attempt.
    Ready(http::Request<Body>, AttemptId),
    /// The recording is not whole yet: the caller is woken when it is (or is given up).
    Later,
    /// No attempt has read the caller's body yet: the caller is woken once one has recorded it
    /// whole (or gave up).
    Unread,
    /// There will be no copy: the body was larger than the limit, failed, or the response
    /// started.
    Never,
}

impl Replay {
    /// Moves the request's body into a slot and returns the first attempt's request (id 0).
    /// `record`: keep a copy of what is sent, up to `limit` bytes.
    pub(crate) fn wrap(
        req: http::Request<Body>,
        record: bool,
        limit: usize,
    ) -> (http::Request<Body>, Replay) {
        let (mut parts, body) = req.into_parts();
        let slot = Arc::new(Mutex::new(Kept {
            owner: 0,
            next: 1,
            read: 0,
            body: Some(body),
            record,
            limit,
            frames: Frames::default(),
            trailers: None,
            len: 0,
            complete: false,
            dropped: false,
            committed: false,
            caller_error: None,
            waiting: None,
        }));
        let replay = Replay {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            // Taken rather than copied: nothing below tonic's `Channel` reads a request's
            // extensions (the stub's layers, above this channel, have seen them), so the first
            // attempt goes without them and later attempts get copies of them.
            extensions: std::mem::take(&mut parts.extensions),
            slot: slot.clone(),
        };
        let body = Body::new(AttemptBody {
            slot,
            id: 0,
            source: BodyFrom::Unclaimed,
            seen: false,
        });
        (http::Request::from_parts(parts, body), replay)
    }

    /// Whether another attempt could send the request exactly as the caller sent it.
    pub(crate) fn replayable(&self) -> bool {
        lock(&self.slot).replayable()
    }

    /// Whether attempt `id`'s connection polled its body: something of the request may have
    /// gone out on it. An attempt whose body was never polled sent nothing.
    pub(crate) fn was_read(&self, id: AttemptId) -> bool {
        lock(&self.slot).was_read(id)
    }

    /// Whether attempt `id` sent nothing and the request can be had again whole: the call may
    /// give the attempt up and send the request elsewhere.
    pub(crate) fn unsent(&self, id: AttemptId) -> bool {
        let slot = lock(&self.slot);
        !slot.was_read(id) && slot.replayable()
    }

    /// The caller's body failed with this status: the call's answer.
    pub(crate) fn caller_error(&self) -> Option<tonic::Status> {
        lock(&self.slot).caller_error.clone()
    }

    /// The response has started: no attempt will follow, so stop recording and free the copy.
    pub(crate) fn commit(&self) {
        let mut slot = lock(&self.slot);
        slot.committed = true;
        // The current attempt may not have read its body yet (a server can answer before it
        // reads): if that body is the recording, it is freed when the attempt takes it.
        let owner = slot.owner;
        if slot.was_read(owner) || slot.body.is_some() {
            slot.stop_recording();
        }
    }

    /// The request for a new attempt that takes the slot over (the caller's body if no attempt
    /// read it, else the recording), with `grpc-timeout` set to `time_left` when the call has a
    /// deadline. An earlier attempt that has not read its body can no longer send it. `None` if
    /// the request cannot be had again exactly as the caller sent it.
    pub(crate) fn request(
        &self,
        time_left: Option<Duration>,
    ) -> Option<(http::Request<Body>, AttemptId)> {
        let id = {
            let mut slot = lock(&self.slot);
            if !slot.replayable() {
                return None;
            }
            let id = slot.new_id();
            slot.owner = id;
            id
        };
        let body = Body::new(AttemptBody {
            slot: self.slot.clone(),
            id,
            source: BodyFrom::Unclaimed,
            seen: false,
        });
        Some((self.head(body, time_left), id))
    }

    /// The request for an attempt in place of attempt `id`, which the server did not process:
    /// if `id` holds the slot, the new attempt takes it over (the caller's body if `id` never
    /// polled it to a result, else the recording); a copy of the recording otherwise. `None`
    /// if the request cannot be had again whole.
    pub(crate) fn instead_of(
        &self,
        id: AttemptId,
        time_left: Option<Duration>,
    ) -> Option<(http::Request<Body>, AttemptId)> {
        let (source, id) = {
            let mut slot = lock(&self.slot);
            if !slot.replayable() {
                return None;
            }
            if slot.owner == id {
                let id = slot.new_id();
                slot.owner = id;
                (BodyFrom::Unclaimed, id)
            } else if slot.complete && !slot.dropped {
                (slot.recorded(), slot.new_id())
            } else {
                return None;
            }
        };
        let body = Body::new(AttemptBody {
            slot: self.slot.clone(),
            id,
            source,
            seen: false,
        });
        Some((self.head(body, time_left), id))
    }

    /// For hedging: the request for an attempt alongside the ones in flight, whose body is the
    /// recording of what the caller sent (the slot is left to its owner). While the recording
    /// is not whole yet, `cx` is woken when it is.
    pub(crate) fn copy(&self, time_left: Option<Duration>, cx: &mut Context<'_>) -> Copied {
        let (source, id) = {
            let mut slot = lock(&self.slot);
            if !slot.record || slot.committed || slot.dropped || slot.caller_error.is_some() {
                return Copied::Never;
            }
            if !slot.complete {
                slot.waiting = Some(cx.waker().clone());
                return if slot.body.is_some() {
                    Copied::Unread
                } else {
                    Copied::Later
                };
            }
            (slot.recorded(), slot.new_id())
        };
        let body = Body::new(AttemptBody {
            slot: self.slot.clone(),
            id,
            source,
            seen: false,
        });
        Copied::Ready(self.head(body, time_left), id)
    }

    /// A request with the call's head and this body.
    fn head(&self, body: Body, time_left: Option<Duration>) -> http::Request<Body> {
        let mut req = http::Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        *req.extensions_mut() = self.extensions.clone();
        if let Some(left) = time_left {
            req.headers_mut().insert(
                crate::headers::GRPC_TIMEOUT.clone(),
                crate::deadline::encode(left),
            );
        }
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// A request body of fixed frames; `Err` items are the caller's errors.
    struct Frames(VecDeque<Result<Bytes, tonic::Status>>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
            Poll::Ready(self.0.pop_front().map(|d| d.map(Frame::data)))
        }
    }

    fn request(frames: &[&'static str]) -> http::Request<Body> {
        let body = Frames(
            frames
                .iter()
                .map(|f| Ok(Bytes::from_static(f.as_bytes())))
                .collect(),
        );
        http::Request::new(Body::new(body))
    }

    /// Polls one frame: `Some(Ok(data))`, `Some(Err(_))` or `None` at the end.
    fn next(body: &mut Body) -> Option<Result<Bytes, tonic::Status>> {
        futures::executor::block_on(std::future::poll_fn(|cx| {
            Pin::new(&mut *body).poll_frame(cx)
        }))
        .map(|r| r.map(|f| f.into_data().unwrap_or_default()))
    }

    fn read_all(body: &mut Body) -> Vec<Bytes> {
        let mut out = Vec::new();
        while let Some(frame) = next(body) {
            out.push(frame.expect("a frame"));
        }
        out
    }

    fn copy(replay: &Replay) -> Copied {
        let mut cx = Context::from_waker(Waker::noop());
        replay.copy(None, &mut cx)
    }

    fn copied(replay: &Replay) -> Body {
        match copy(replay) {
            Copied::Ready(req, _) => req.into_body(),
            _ => panic!("no copy"),
        }
    }

    #[test]
    fn every_attempt_sends_the_body_once_as_the_caller_sent_it() {
        let (req, replay) = Replay::wrap(request(&["a", "b", "c"]), true, 1024);
        let mut first = req.into_body();
        assert_eq!(read_all(&mut first), ["a", "b", "c"]);
        // A policy retry sends the recording; it is not recorded again.
        let mut second = replay.request(None).unwrap().0.into_body();
        assert_eq!(read_all(&mut second), ["a", "b", "c"]);
        // An attempt that never left (dropped unread), then another one.
        drop(replay.request(None).unwrap());
        let mut fourth = replay.request(None).unwrap().0.into_body();
        assert_eq!(read_all(&mut fourth), ["a", "b", "c"]);
    }

    #[test]
    fn an_attempt_given_up_on_cannot_send_the_body_later() {
        let (req, replay) = Replay::wrap(request(&["a"]), false, 1024);
        let mut stale = req.into_body();
        assert!(replay.unsent(0));
        let (next_req, id) = replay.request(None).unwrap();
        let mut next_attempt = next_req.into_body();
        assert!(
            next(&mut stale).unwrap().is_err(),
            "the stale attempt must fail"
        );
        assert!(replay.was_read(0), "the stale attempt was polled");
        assert!(!replay.was_read(id));
        assert_eq!(read_all(&mut next_attempt), ["a"]);
        assert!(replay.was_read(id));
    }

    #[test]
    fn a_partly_sent_body_is_never_sent_again() {
        let (req, replay) = Replay::wrap(request(&["a", "b"]), false, 1024);
        let mut body = req.into_body();
        assert_eq!(next(&mut body).unwrap().unwrap(), "a");
        assert!(!replay.replayable());
        assert!(!replay.unsent(0));
        assert!(replay.request(None).is_none());
        drop(body);
        assert!(replay.instead_of(0, None).is_none());
    }

    #[test]
    fn a_body_never_polled_to_a_result_goes_back_to_the_slot() {
        let (req, replay) = Replay::wrap(request(&["a"]), true, 1024);
        drop(req);
        assert!(replay.unsent(0), "an attempt never polled sent nothing");
        let (again, id) = replay.instead_of(0, None).unwrap();
        assert_eq!(read_all(&mut again.into_body()), ["a"]);
        assert!(replay.was_read(id));
    }

    /// An empty request stream whose end was polled may have reached the server whole (its
    /// END_STREAM went out): not handed back as unsent.
    #[test]
    fn an_empty_body_polled_to_its_end_was_sent() {
        let (req, replay) = Replay::wrap(request(&[]), false, 1024);
        let mut body = req.into_body();
        assert!(next(&mut body).is_none());
        drop(body);
        assert!(!replay.unsent(0));
        assert!(replay.was_read(0));
    }

    /// The caller's own body failing (an encoder refusing a message) is the call's answer:
    /// the body is not handed back, nothing can be sent again, and the error is kept.
    #[test]
    fn a_caller_body_error_is_kept_and_nothing_is_sent_again() {
        let body = Frames(
            [
                Ok(Bytes::from_static(b"a")),
                Err(tonic::Status::out_of_range("message too large")),
            ]
            .into_iter()
            .collect(),
        );
        let (req, replay) = Replay::wrap(http::Request::new(Body::new(body)), true, 1024);
        let mut first = req.into_body();
        assert_eq!(next(&mut first).unwrap().unwrap(), "a");
        assert!(next(&mut first).unwrap().is_err());
        drop(first);
        let kept = replay.caller_error().expect("the caller's error kept");
        assert_eq!(kept.code(), tonic::Code::OutOfRange);
        assert!(!replay.replayable());
        assert!(replay.request(None).is_none());
        assert!(replay.instead_of(0, None).is_none());
        assert!(matches!(copy(&replay), Copied::Never));
    }

    /// An error on the very first poll (nothing yielded) is the caller's too: the body is not
    /// handed back to be sent empty.
    #[test]
    fn a_caller_body_error_on_the_first_poll_is_not_handed_back() {
        let body = Frames(
            [Err(tonic::Status::out_of_range("message too large"))]
                .into_iter()
                .collect(),
        );
        let (req, replay) = Replay::wrap(http::Request::new(Body::new(body)), true, 1024);
        let mut first = req.into_body();
        assert!(next(&mut first).unwrap().is_err());
        drop(first);
        assert!(replay.caller_error().is_some());
        assert!(!replay.unsent(0));
        assert!(replay.instead_of(0, None).is_none());
    }

    #[test]
    fn a_body_larger_than_the_limit_is_not_recorded() {
        let (req, replay) = Replay::wrap(request(&["aaaa", "bbbb"]), true, 6);
        let mut body = req.into_body();
        assert_eq!(read_all(&mut body).len(), 2);
        assert!(!replay.replayable());
    }

    #[test]
    fn recording_stops_once_the_response_has_started() {
        let (req, replay) = Replay::wrap(request(&["a", "b", "c"]), true, 1024);
        let mut body = req.into_body();
        assert_eq!(next(&mut body).unwrap().unwrap(), "a");
        replay.commit();
        assert_eq!(read_all(&mut body), ["b", "c"]);
        let slot = lock(&replay.slot);
        assert!(
            slot.frames.is_empty() && !slot.complete,
            "recorded after the commit"
        );
        drop(slot);
        assert!(replay.request(None).is_none());
    }

    #[test]
    fn a_hedge_sends_the_recording_alongside_the_first_attempt() {
        let (req, replay) = Replay::wrap(request(&["a", "b"]), true, 1024);
        let mut first = req.into_body();
        assert!(matches!(copy(&replay), Copied::Unread), "nothing read yet");
        assert_eq!(next(&mut first).unwrap().unwrap(), "a");
        assert!(
            matches!(copy(&replay), Copied::Later),
            "the recording is not whole yet"
        );
        assert_eq!(read_all(&mut first), ["b"]);
        // Two hedges, each with the whole body; the slot stays the first attempt's.
        let (second_req, second_id) = match copy(&replay) {
            Copied::Ready(req, id) => (req, id),
            _ => panic!("no copy"),
        };
        let mut second = second_req.into_body();
        let mut third = copied(&replay);
        assert!(!replay.was_read(second_id));
        assert_eq!(read_all(&mut third), ["a", "b"]);
        assert_eq!(read_all(&mut second), ["a", "b"]);
        assert!(replay.was_read(second_id), "a copy read is marked");
        // A copy refused by its server is sent again from the recording.
        assert!(replay.instead_of(second_id, None).is_some());
        replay.commit();
        assert!(
            matches!(copy(&replay), Copied::Never),
            "no attempt after the commit"
        );
    }

    #[test]
    fn a_waiting_hedge_is_woken_when_the_recording_is_whole() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl std::task::Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let flag = Arc::new(Flag(Default::default()));
        let waker = Waker::from(flag.clone());
        let (req, replay) = Replay::wrap(request(&["a", "b"]), true, 1024);
        let mut first = req.into_body();
        assert_eq!(next(&mut first).unwrap().unwrap(), "a");
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(replay.copy(None, &mut cx), Copied::Later));
        assert!(!flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(read_all(&mut first), ["b"]);
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn a_body_over_the_limit_is_never_copied() {
        let (req, replay) = Replay::wrap(request(&["aaaa", "bbbb"]), true, 6);
        let mut first = req.into_body();
        assert_eq!(read_all(&mut first).len(), 2);
        assert!(matches!(copy(&replay), Copied::Never));
    }

    #[test]
    fn a_replayed_attempt_carries_the_time_left() {
        let (req, replay) = Replay::wrap(request(&["a"]), false, 1024);
        drop(req);
        let (again, _) = replay.request(Some(Duration::from_millis(250))).unwrap();
        let timeout = again.headers().get("grpc-timeout").unwrap();
        assert_eq!(
            crate::deadline::parse(timeout.as_bytes()),
            Some(Duration::from_millis(250))
        );
    }

    /// One step of a call's attempts over the slot.
    #[derive(Debug, Clone)]
    enum Op {
        /// A new attempt that takes the slot over (a retry).
        Request,
        /// A hedge beside the attempts in flight.
        Copy,
        /// An attempt in place of attempt `k`, which the server did not process.
        InsteadOf(usize),
        /// Attempt `k`'s connection polls one frame of its body.
        Poll(usize),
        /// Attempt `k`'s connection reads its body to the end.
        ReadAll(usize),
        /// Attempt `k` is dropped (its request gone, sent or not).
        Drop(usize),
        /// The response started.
        Commit,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Request),
            Just(Op::Copy),
            (0usize..6).prop_map(Op::InsteadOf),
            (0usize..6).prop_map(Op::Poll),
            (0usize..6).prop_map(Op::ReadAll),
            (0usize..6).prop_map(Op::Drop),
            Just(Op::Commit),
        ]
    }

    /// The caller's body, counting every frame pulled from it.
    struct Counted(
        VecDeque<Result<Bytes, tonic::Status>>,
        Arc<std::sync::atomic::AtomicUsize>,
    );

    impl HttpBody for Counted {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
            let next = self.0.pop_front();
            if next.is_some() {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Poll::Ready(next.map(|d| d.map(Frame::data)))
        }
    }

    /// An attempt's body as its connection reads it: the frames so far, and how it ended.
    struct Reader {
        body: Option<Body>,
        got: Vec<Bytes>,
        /// `Some(true)`: read to its end; `Some(false)`: ended with an error.
        ended: Option<bool>,
    }

    impl Reader {
        fn new(req: http::Request<Body>) -> Reader {
            Reader {
                body: Some(req.into_body()),
                got: Vec::new(),
                ended: None,
            }
        }

        fn poll(&mut self) {
            let Some(body) = self.body.as_mut() else {
                return;
            };
            if self.ended.is_some() {
                return;
            }
            match next(body) {
                Some(Ok(data)) => self.got.push(data),
                Some(Err(_)) => self.ended = Some(false),
                None => self.ended = Some(true),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever its attempts do (retries, hedges, replays of unprocessed attempts, drops,
        /// reads, a commit), a request reaches every attempt exactly as the caller sent it: a
        /// body read to its end holds the caller's frames, in order, once; each frame of the
        /// caller's body is pulled from it once at most; and a caller's body that fails sends
        /// nothing whole, anywhere.
        #[test]
        fn every_attempt_sends_the_request_as_the_caller_sent_it(
            frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..6), 0..4),
            error_at in proptest::option::of(0usize..4),
            limit in 0usize..30,
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let mut body: VecDeque<Result<Bytes, tonic::Status>> =
                frames.iter().map(|f| Ok(Bytes::from(f.clone()))).collect();
            let fails = error_at.map(|at| at.min(body.len()));
            if let Some(at) = fails {
                body.insert(at, Err(tonic::Status::out_of_range("the caller's own error")));
                body.truncate(at + 1);
            }
            let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let (req, replay) = Replay::wrap(
                http::Request::new(Body::new(Counted(body, pulled.clone()))),
                true,
                limit,
            );
            let mut attempts = vec![(Reader::new(req), 0)];
            for op in ops {
                match op {
                    Op::Request => {
                        if let Some((req, id)) = replay.request(None) {
                            attempts.push((Reader::new(req), id));
                        }
                    }
                    Op::Copy => {
                        if let Copied::Ready(req, id) = copy(&replay) {
                            attempts.push((Reader::new(req), id));
                        }
                    }
                    Op::InsteadOf(k) => {
                        if let Some((_, id)) = attempts.get(k % attempts.len()) {
                            if let Some((req, id)) = replay.instead_of(*id, None) {
                                attempts.push((Reader::new(req), id));
                            }
                        }
                    }
                    Op::Poll(k) => {
                        let n = attempts.len();
                        attempts[k % n].0.poll();
                    }
                    Op::ReadAll(k) => {
                        let n = attempts.len();
                        for _ in 0..8 {
                            attempts[k % n].0.poll();
                        }
                    }
                    Op::Drop(k) => {
                        let n = attempts.len();
                        attempts[k % n].0.body = None;
                    }
                    Op::Commit => replay.commit(),
                }
            }
            let want: Vec<Bytes> = frames.iter().map(|f| Bytes::from(f.clone())).collect();
            for (r, id) in &attempts {
                if r.ended == Some(true) {
                    prop_assert!(fails.is_none(), "attempt {id} sent a request the caller never finished");
                    prop_assert_eq!(&r.got, &want, "attempt {}", id);
                }
            }
            let total = frames.len() + usize::from(fails.is_some());
            prop_assert!(pulled.load(std::sync::atomic::Ordering::SeqCst) <= total);
            if fails.is_some() && replay.caller_error().is_some() {
                prop_assert!(replay.request(None).is_none());
                prop_assert!(matches!(copy(&replay), Copied::Never));
            }
        }
    }
}
