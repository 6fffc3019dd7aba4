//! The slot that the attempts of one call share: the caller's body until an attempt reads it,
//! the recording of what it yielded, and which attempts' bodies were read.

use std::sync::{Arc, Mutex};
use std::task::Waker;

use bytes::Bytes;
use tonic::body::Body;

/// An attempt's id in its call's slot.
pub(crate) type AttemptId = u32;

/// The slot that a call's attempts share.
pub(super) struct ReplayBuffer {
    /// The attempt that may read the caller's body (and hand it back): each new attempt made
    /// with [`Replay::request`](super::Replay::request) takes the slot over.
    pub(super) owner: AttemptId,
    /// The next attempt's id.
    pub(super) next: AttemptId,
    /// The attempts whose bodies were polled by their connections (bit `id`; an id of 64 or
    /// more counts as read: a call does not make that many attempts).
    pub(super) read: u64,
    /// The caller's body, until an attempt reads it (or after an attempt that never polled it
    /// to a result handed it back).
    pub(super) body: Option<Body>,
    /// Keep a copy of what the caller's body yields, up to `limit` bytes.
    pub(super) record: bool,
    pub(super) limit: usize,
    pub(super) frames: Frames,
    pub(super) trailers: Option<http::HeaderMap>,
    pub(super) len: usize,
    /// The recording holds the whole body.
    pub(super) complete: bool,
    /// Recording given up: the body was larger than the limit, failed, or the response started.
    pub(super) dropped: bool,
    /// The response has started: no further attempt.
    pub(super) committed: bool,
    /// The caller's body failed with this: the call's answer.
    pub(super) caller_error: Option<tonic::Status>,
    /// A call waiting for the recording to be whole (or given up).
    pub(super) waiting: Option<Waker>,
}

impl ReplayBuffer {
    /// Whether another attempt could send the request exactly as the caller sent it.
    pub(super) fn replayable(&self) -> bool {
        !self.committed
            && self.caller_error.is_none()
            && (self.body.is_some() || (self.complete && !self.dropped))
    }

    pub(super) fn stop_recording(&mut self) {
        self.dropped = true;
        self.frames = Frames::default();
        self.trailers = None;
        self.wake();
    }

    pub(super) fn wake(&mut self) {
        if let Some(w) = self.waiting.take() {
            w.wake();
        }
    }

    pub(super) fn mark_read(&mut self, id: AttemptId) {
        if id < 64 {
            self.read |= 1 << id;
        }
    }

    pub(super) fn was_read(&self, id: AttemptId) -> bool {
        id >= 64 || self.read & (1 << id) != 0
    }

    pub(super) fn new_id(&mut self) -> AttemptId {
        let id = self.next;
        self.next = self.next.saturating_add(1);
        id
    }
}

pub(super) type SlotRef = Arc<Mutex<ReplayBuffer>>;

/// The data frames of a recorded body: the first inline (a unary request is one frame, and
/// its recording then costs no allocation), the others after it.
#[derive(Default)]
pub(super) struct Frames {
    pub(super) first: Option<Bytes>,
    pub(super) rest: Vec<Bytes>,
}

impl Frames {
    pub(super) fn push(&mut self, data: Bytes) {
        if self.first.is_none() {
            self.first = Some(data);
        } else {
            self.rest.push(data);
        }
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The frames, to be sent in order.
    pub(super) fn copy(&self) -> Sending {
        Sending {
            first: self.first.clone(),
            rest: self.rest.clone().into_iter(),
        }
    }
}

/// Recorded frames being sent.
pub(super) struct Sending {
    pub(super) first: Option<Bytes>,
    pub(super) rest: std::vec::IntoIter<Bytes>,
}

impl Sending {
    pub(super) fn next(&mut self) -> Option<Bytes> {
        self.first.take().or_else(|| self.rest.next())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.len() == 0
    }
}
