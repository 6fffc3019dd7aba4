//! The request body of one attempt: the caller's body taken from the slot (and recorded), or
//! the recording of what an earlier attempt read.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

use super::kept::{AttemptId, ReplayBuffer, Sending, SlotRef};
use crate::sync::lock;

/// Where an attempt's body comes from.
pub(super) enum BodyFrom {
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

impl BodyFrom {
    /// A copy of what the slot recorded.
    pub(super) fn recorded(kept: &ReplayBuffer) -> BodyFrom {
        BodyFrom::Recorded {
            frames: kept.frames.copy(),
            trailers: kept.trailers.clone(),
        }
    }
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
    /// The body of attempt `id`, from `source`.
    pub(super) fn new(slot: SlotRef, id: AttemptId, source: BodyFrom) -> AttemptBody {
        AttemptBody {
            slot,
            id,
            source,
            seen: false,
        }
    }

    /// The connection polls the body for the first time: takes what this attempt sends from
    /// the slot; an error if the attempt has been given up on.
    pub(super) fn claim(&mut self) -> Result<(), tonic::Status> {
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
            let source = BodyFrom::recorded(&slot);
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
    pub(super) fn record(
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
            // Not before it was polled, even if empty: a connection sends a body that says it
            // is over with its head, without polling it, and the call would take it for
            // never sent (polling marks it read).
            BodyFrom::Recorded { frames, trailers } => {
                self.seen && frames.is_empty() && trailers.is_none()
            }
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
