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
//!
//! Here: [`Replay`], the call's side; in `kept.rs`, the slot; in `body.rs`, an attempt's body.
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

mod body;
mod kept;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use tonic::body::Body;

use crate::sync::lock;

pub(crate) use body::AttemptBody;
use body::BodyFrom;
pub(crate) use kept::AttemptId;
use kept::{Frames, ReplayBuffer, SlotRef};

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
        let slot = Arc::new(Mutex::new(ReplayBuffer {
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
        let body = Body::new(AttemptBody::new(slot, 0, BodyFrom::Unclaimed));
        (http::Request::from_parts(parts, body), replay)
    }

    /// The request's extensions (what the caller put in them: a
    /// [`WaitForReady`](crate::WaitForReady), say).
    pub(crate) fn extensions(&self) -> &http::Extensions {
        &self.extensions
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
    /// deadline, and `grpc-previous-rpc-attempts` to `previous` if above zero. An earlier
    /// attempt that has not read its body can no longer send it. `None` if the request cannot
    /// be had again exactly as the caller sent it.
    pub(crate) fn request(
        &self,
        time_left: Option<Duration>,
        previous: u32,
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
        let body = Body::new(AttemptBody::new(self.slot.clone(), id, BodyFrom::Unclaimed));
        Some((self.head(body, time_left, previous), id))
    }

    /// The request for an attempt in place of attempt `id`, which the server did not process:
    /// if `id` holds the slot, the new attempt takes it over (the caller's body if `id` never
    /// polled it to a result, else the recording); a copy of the recording otherwise. `None`
    /// if the request cannot be had again whole. (`time_left`, `previous`: as for
    /// [`request`](Self::request).)
    pub(crate) fn instead_of(
        &self,
        id: AttemptId,
        time_left: Option<Duration>,
        previous: u32,
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
                (BodyFrom::recorded(&slot), slot.new_id())
            } else {
                return None;
            }
        };
        let body = Body::new(AttemptBody::new(self.slot.clone(), id, source));
        Some((self.head(body, time_left, previous), id))
    }

    /// For hedging: the request for an attempt alongside the ones in flight, whose body is the
    /// recording of what the caller sent (the slot is left to its owner). While the recording
    /// is not whole yet, `cx` is woken when it is. (`time_left`, `previous`: as for
    /// [`request`](Self::request).)
    pub(crate) fn copy(
        &self,
        time_left: Option<Duration>,
        previous: u32,
        cx: &mut Context<'_>,
    ) -> Copied {
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
            (BodyFrom::recorded(&slot), slot.new_id())
        };
        let body = Body::new(AttemptBody::new(self.slot.clone(), id, source));
        Copied::Ready(self.head(body, time_left, previous), id)
    }

    /// A request with the call's head and this body, the time left in its `grpc-timeout`, and
    /// the attempts before it in `grpc-previous-rpc-attempts` (gRFC A6: absent on the first).
    fn head(&self, body: Body, time_left: Option<Duration>, previous: u32) -> http::Request<Body> {
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
        if previous > 0 {
            req.headers_mut().insert(
                crate::headers::GRPC_PREVIOUS_RPC_ATTEMPTS.clone(),
                http::HeaderValue::from(previous),
            );
        }
        req
    }
}
