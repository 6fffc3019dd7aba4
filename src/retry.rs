//! Sending a call again: transparent replay of calls that never left, and the opt-in retry
//! policy with its budget.
//!
//! A call can go to another instance only if its request can be sent again. The request head
//! is copied when the call is routed. The caller's body waits in a slot that the call's
//! attempts share ([`Replay`]); each attempt gets an [`AttemptBody`] that takes the caller's body
//! from the slot only when its connection first reads it. So:
//! - an attempt that never left (its connection could not be opened, was closed before the
//!   request was written, or is still being opened) leaves the body in the slot, and the next
//!   attempt takes it: not one byte went out (transparent retry);
//! - an attempt that the call gave up on while it waited in a connection's queue can never send
//!   the body later: each new attempt takes the slot over, and a stale attempt that is read
//!   after that fails its stream instead;
//! - with a retry policy, the attempt that reads the caller's body keeps a copy of what it sent
//!   (up to a size limit), and later attempts send that copy; nothing is recorded twice, and
//!   recording stops (the copy is freed) once the response has started, when no further attempt
//!   can be made;
//! - a body that was partly sent and not recorded whole is never sent again.

use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::Code;

use crate::lock;

/// The default cap on the request body kept to replay a call (64 KiB).
pub const DEFAULT_MAX_REPLAY_BODY: usize = 64 * 1024;

/// Retries of calls that failed with given statuses, on other instances (opt-in, see
/// [`Builder::retry`](crate::Builder::retry)).
///
/// A call is retried when it ends, before any response message, with one of the
/// [`codes`](RetryPolicy::codes) (or a transport error, which is UNAVAILABLE), while: it has
/// attempts left; some instance it has not tried is usable; its request body was kept (at most
/// [`max_replay_body`](crate::Builder::max_replay_body) bytes); its deadline leaves room for
/// the backoff; and the [retry budget](RetryPolicy::budget_ratio) allows it. A call whose
/// response has started (headers with messages) is never retried.
///
/// Built from [`RetryPolicy::default`] with one setter per setting:
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(3)
///     .codes([Code::Unavailable, Code::ResourceExhausted])
///     .initial_backoff(Duration::from_millis(10));
/// # let _ = policy;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a policy out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) codes: Vec<Code>,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) multiplier: f64,
    pub(crate) budget_ratio: f64,
    pub(crate) budget_min_per_sec: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            codes: vec![Code::Unavailable, Code::ResourceExhausted],
            initial_backoff: Duration::from_millis(25),
            max_backoff: Duration::from_secs(1),
            multiplier: 2.0,
            budget_ratio: 0.2,
            budget_min_per_sec: 10,
        }
    }
}

impl RetryPolicy {
    /// Attempts in all, the first included: 2 to 10 (default 3).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The statuses that are retried: at least one, and not OK (default UNAVAILABLE,
    /// RESOURCE_EXHAUSTED). A transport error counts as UNAVAILABLE.
    #[must_use]
    pub fn codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.codes = codes.into_iter().collect();
        self
    }

    /// Backoff before the first retry (default 25 ms); each next one is
    /// [`multiplier`](Self::multiplier) times longer, up to [`max_backoff`](Self::max_backoff),
    /// each drawn at random between zero and that value (gRPC's retry design).
    #[must_use]
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }

    /// Cap on the backoff: at least [`initial_backoff`](Self::initial_backoff) (default 1 s).
    #[must_use]
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// Growth of the backoff per retry: a finite number of at least 1 (default 2).
    #[must_use]
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// Retries may add at most this share of the calls (0.2: one retry per five calls), 0 to
    /// 10 (default 0.2), plus [`budget_min_per_sec`](Self::budget_min_per_sec).
    #[must_use]
    pub fn budget_ratio(mut self, ratio: f64) -> Self {
        self.budget_ratio = ratio;
        self
    }

    /// Retries allowed per second on top of [`budget_ratio`](Self::budget_ratio), so that a
    /// quiet channel can still retry (default 10).
    #[must_use]
    pub fn budget_min_per_sec(mut self, n: u32) -> Self {
        self.budget_min_per_sec = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let bad = |reason: &str| crate::Error::InvalidSetting {
            name: "retry",
            reason: reason.to_owned(),
        };
        if !(2..=10).contains(&self.max_attempts) {
            return Err(bad("max_attempts must be between 2 and 10"));
        }
        if self.codes.is_empty() || self.codes.contains(&Code::Ok) {
            return Err(bad("codes must name at least one status, and not OK"));
        }
        if self.max_backoff < self.initial_backoff {
            return Err(bad("max_backoff must be at least initial_backoff"));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(bad("multiplier must be a finite number of at least 1"));
        }
        if !(0.0..=10.0).contains(&self.budget_ratio) {
            return Err(bad("budget_ratio must be between 0 and 10"));
        }
        Ok(())
    }

    /// The backoff before retry number `retry` (1 for the first), with full jitter.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let cap = (self.initial_backoff.as_secs_f64()
            * self.multiplier.powi(retry.saturating_sub(1).min(64) as i32))
        .min(self.max_backoff.as_secs_f64());
        Duration::from_secs_f64(cap * crate::pick::random_unit())
    }

    pub(crate) fn retries(&self, code: Code) -> bool {
        self.codes.contains(&code)
    }
}

/// The retry budget: a balance of tokens that each call adds `ratio` to and each retry takes
/// one from, topped up by `min_per_sec` per second, capped so that a long quiet spell does not
/// bank a burst. Lock-free.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Tokens × 1000.
    balance: AtomicI64,
    /// Last top-up, in ms since `epoch`.
    topped_at: AtomicU64,
    epoch: Instant,
    ratio_milli: i64,
    min_per_sec: i64,
    cap_milli: i64,
}

impl Budget {
    pub(crate) fn new(policy: &RetryPolicy) -> Budget {
        Budget::with(policy.budget_ratio, policy.budget_min_per_sec)
    }

    /// A budget of `ratio` of a retry per call plus `min_per_sec` per second.
    pub(crate) fn with(ratio: f64, min_per_sec: u32) -> Budget {
        let min = i64::from(min_per_sec);
        Budget {
            balance: AtomicI64::new(min * 1000),
            topped_at: AtomicU64::new(0),
            epoch: Instant::now(),
            ratio_milli: (ratio * 1000.0) as i64,
            min_per_sec: min,
            cap_milli: (min * 1000).max(10_000) + 100_000,
        }
    }

    /// A call started: it earns `ratio` of a retry.
    #[inline]
    pub(crate) fn deposit(&self) {
        let b = self.balance.fetch_add(self.ratio_milli, Ordering::Relaxed);
        if b > self.cap_milli {
            self.balance.fetch_sub(self.ratio_milli, Ordering::Relaxed);
        }
    }

    /// Takes one retry from the budget; false if it is spent.
    pub(crate) fn withdraw(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.topped_at.swap(now, Ordering::Relaxed);
        let refill = (now.saturating_sub(last) as i64).saturating_mul(self.min_per_sec);
        if refill > 0 {
            let b = self.balance.fetch_add(refill, Ordering::Relaxed) + refill;
            if b > self.cap_milli {
                self.balance
                    .fetch_sub(b - self.cap_milli, Ordering::Relaxed);
            }
        }
        self.balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b >= 1000).then_some(b - 1000)
            })
            .is_ok()
    }
}

/// The slot that a call's attempts share.
struct Slot {
    /// The attempt that may take the body: attempts are numbered from 0, and each new attempt
    /// takes the slot over.
    owner: u32,
    /// Whether the owner's body has been read by its connection (it may have gone out).
    claimed: bool,
    /// The caller's body, until an attempt reads it (or after an attempt that yielded nothing
    /// of it handed it back).
    body: Option<Body>,
    /// Keep a copy of what the caller's body yields (retry policy on), up to `limit` bytes.
    record: bool,
    limit: usize,
    frames: Vec<Bytes>,
    trailers: Option<http::HeaderMap>,
    len: usize,
    /// The recording holds the whole body.
    complete: bool,
    /// Recording given up: the body was larger than the limit, failed, or the response started.
    dropped: bool,
    /// The response has started: no further attempt.
    committed: bool,
}

impl Slot {
    /// Whether another attempt could send the request exactly as the caller sent it.
    fn replayable(&self) -> bool {
        !self.committed && (self.body.is_some() || (self.complete && !self.dropped))
    }

    fn stop_recording(&mut self) {
        self.dropped = true;
        self.frames = Vec::new();
        self.trailers = None;
    }
}

type SlotRef = Arc<Mutex<Slot>>;

/// Where an attempt's body comes from.
enum Source {
    /// Not read yet: the caller's body (or the recording) is still in the slot.
    Unclaimed,
    /// The caller's body, taken from the slot.
    Caller {
        body: Body,
        /// Recording what it yields into the slot.
        recording: bool,
        /// Whether it yielded anything (then it may have gone out, and is never handed back).
        yielded: bool,
        /// What the body had ready after a data frame it yielded (looked at while recording,
        /// so that a unary body's end is recorded with its message: a stream the server refuses
        /// before the connection reads that end can still be sent again); yielded next.
        peeked: Option<Option<Result<Frame<Bytes>, tonic::Status>>>,
    },
    /// The recording of an earlier attempt.
    Recorded {
        frames: std::vec::IntoIter<Bytes>,
        trailers: Option<http::HeaderMap>,
    },
    /// Over, or refused.
    Done,
}

/// The request body of one attempt: see the module docs.
pub(crate) struct AttemptBody {
    slot: SlotRef,
    attempt: u32,
    source: Source,
}

impl AttemptBody {
    /// Takes the body from the slot; an error if this attempt has been given up on.
    fn claim(&mut self) -> Result<(), tonic::Status> {
        let mut slot = lock(&self.slot);
        if slot.owner != self.attempt {
            return Err(tonic::Status::cancelled(
                "tonic-balancer: this attempt was given up on before it was sent",
            ));
        }
        slot.claimed = true;
        self.source = if let Some(body) = slot.body.take() {
            Source::Caller {
                body,
                recording: slot.record && !slot.dropped && !slot.committed,
                yielded: false,
                peeked: None,
            }
        } else if slot.complete && !slot.dropped {
            let source = Source::Recorded {
                frames: slot.frames.clone().into_iter(),
                trailers: slot.trailers.clone(),
            };
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
}

impl Drop for AttemptBody {
    fn drop(&mut self) {
        // A caller's body that yielded nothing went nowhere: hand it back for the next attempt.
        if let Source::Caller {
            yielded: false,
            body,
            ..
        } = &mut self.source
        {
            let body = std::mem::take(body);
            let mut slot = lock(&self.slot);
            if slot.body.is_none() && !slot.committed {
                slot.body = Some(body);
                if slot.owner == self.attempt {
                    slot.claimed = false;
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
        if let Source::Unclaimed = this.source {
            if let Err(status) = this.claim() {
                this.source = Source::Done;
                return Poll::Ready(Some(Err(status)));
            }
        }
        match &mut this.source {
            Source::Unclaimed | Source::Done => Poll::Ready(None),
            Source::Recorded { frames, trailers } => match frames.next() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(t)))),
            },
            Source::Caller {
                body,
                recording,
                yielded,
                peeked,
            } => {
                let res = match peeked.take() {
                    Some(next) => Poll::Ready(next),
                    None => Pin::new(&mut *body).poll_frame(cx),
                };
                if matches!(res, Poll::Ready(Some(Ok(_)))) {
                    *yielded = true;
                }
                if *recording {
                    let mut slot = lock(&this.slot);
                    if slot.committed || slot.dropped {
                        *recording = false;
                    } else {
                        match &res {
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
                            }
                            Poll::Ready(Some(Err(_))) => {
                                slot.stop_recording();
                                *recording = false;
                            }
                            Poll::Pending => {}
                        }
                    }
                }
                if *recording && matches!(&res, Poll::Ready(Some(Ok(f))) if f.is_data()) {
                    // Look ahead: a body whose end is ready now is recorded whole at once.
                    let mut now = Context::from_waker(std::task::Waker::noop());
                    if let Poll::Ready(next) = Pin::new(&mut *body).poll_frame(&mut now) {
                        if next.is_none() {
                            let mut slot = lock(&this.slot);
                            if !slot.committed && !slot.dropped {
                                slot.complete = true;
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
            Source::Unclaimed => false,
            Source::Caller { body, peeked, .. } => match peeked {
                Some(next) => next.is_none(),
                None => body.is_end_stream(),
            },
            Source::Recorded { frames, trailers } => frames.len() == 0 && trailers.is_none(),
            Source::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Caller { body, .. } => body.size_hint(),
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

impl Replay {
    /// Moves the request's body into a slot and returns the first attempt's request.
    /// `record`: keep a copy of what is sent (retry policy), up to `limit` bytes.
    pub(crate) fn wrap(
        req: http::Request<Body>,
        record: bool,
        limit: usize,
    ) -> (http::Request<Body>, Replay) {
        let (mut parts, body) = req.into_parts();
        let slot = Arc::new(Mutex::new(Slot {
            owner: 0,
            claimed: false,
            body: Some(body),
            record,
            limit,
            frames: Vec::new(),
            trailers: None,
            len: 0,
            complete: false,
            dropped: false,
            committed: false,
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
            attempt: 0,
            source: Source::Unclaimed,
        });
        (http::Request::from_parts(parts, body), replay)
    }

    /// Whether another attempt could send the request exactly as the caller sent it.
    pub(crate) fn replayable(&self) -> bool {
        lock(&self.slot).replayable()
    }

    /// Whether the current attempt's connection has not read its body yet: nothing of the
    /// request went out, and the call may give the attempt up and go elsewhere.
    pub(crate) fn unsent(&self) -> bool {
        let slot = lock(&self.slot);
        !slot.claimed && slot.replayable()
    }

    /// The response has started: no attempt will follow, so stop recording and free the copy.
    pub(crate) fn commit(&self) {
        let mut slot = lock(&self.slot);
        slot.committed = true;
        // The current attempt may not have read its body yet (a server can answer before it
        // reads): if that body is the recording, it is freed when the attempt takes it.
        if slot.claimed || slot.body.is_some() {
            slot.stop_recording();
        }
    }

    /// The request for a new attempt, with `grpc-timeout` set to `time_left` when the call
    /// has a deadline. The previous attempt can no longer send the body. `None` if the request
    /// cannot be had again exactly as the caller sent it.
    pub(crate) fn request(&self, time_left: Option<Duration>) -> Option<http::Request<Body>> {
        let attempt = {
            let mut slot = lock(&self.slot);
            if !slot.replayable() {
                return None;
            }
            slot.owner += 1;
            slot.claimed = false;
            slot.owner
        };
        let body = Body::new(AttemptBody {
            slot: self.slot.clone(),
            attempt,
            source: Source::Unclaimed,
        });
        Some(self.head(body, time_left))
    }

    /// For hedging: the request for an attempt alongside the ones in flight, whose body is the
    /// recording of what the caller sent (the slot is left to its owner). `None` unless the
    /// recording holds the whole body.
    pub(crate) fn copy(&self, time_left: Option<Duration>) -> Option<http::Request<Body>> {
        let source = {
            let slot = lock(&self.slot);
            if slot.committed || !slot.complete || slot.dropped {
                return None;
            }
            Source::Recorded {
                frames: slot.frames.clone().into_iter(),
                trailers: slot.trailers.clone(),
            }
        };
        let body = Body::new(AttemptBody {
            slot: self.slot.clone(),
            // Never the slot's owner: this attempt does not claim the slot.
            attempt: u32::MAX,
            source,
        });
        Some(self.head(body, time_left))
    }

    /// For hedging: whether the attempt that reads the caller's body is recording it and has
    /// not finished, so that [`copy`](Self::copy) may succeed later.
    pub(crate) fn recording(&self) -> bool {
        let slot = lock(&self.slot);
        slot.claimed && slot.record && !slot.complete && !slot.dropped && !slot.committed
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
    use std::collections::VecDeque;

    /// A request body of fixed frames.
    struct Frames(VecDeque<Bytes>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
            Poll::Ready(self.0.pop_front().map(|d| Ok(Frame::data(d))))
        }
    }

    fn request(frames: &[&'static str]) -> http::Request<Body> {
        let body = Frames(
            frames
                .iter()
                .map(|f| Bytes::from_static(f.as_bytes()))
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

    #[test]
    fn every_attempt_sends_the_body_once_as_the_caller_sent_it() {
        let (req, replay) = Replay::wrap(request(&["a", "b", "c"]), true, 1024);
        let mut first = req.into_body();
        assert_eq!(read_all(&mut first), ["a", "b", "c"]);
        // A policy retry sends the recording; it is not recorded again.
        let mut second = replay.request(None).unwrap().into_body();
        assert_eq!(read_all(&mut second), ["a", "b", "c"]);
        // An attempt that never left (dropped unread), then another one.
        drop(replay.request(None).unwrap());
        let mut fourth = replay.request(None).unwrap().into_body();
        assert_eq!(read_all(&mut fourth), ["a", "b", "c"]);
    }

    #[test]
    fn an_attempt_given_up_on_cannot_send_the_body_later() {
        let (req, replay) = Replay::wrap(request(&["a"]), false, 1024);
        let mut stale = req.into_body();
        assert!(replay.unsent());
        let mut next_attempt = replay.request(None).unwrap().into_body();
        assert!(
            next(&mut stale).unwrap().is_err(),
            "the stale attempt must fail"
        );
        assert_eq!(read_all(&mut next_attempt), ["a"]);
    }

    #[test]
    fn a_partly_sent_body_is_never_sent_again() {
        let (req, replay) = Replay::wrap(request(&["a", "b"]), false, 1024);
        let mut body = req.into_body();
        assert_eq!(next(&mut body).unwrap().unwrap(), "a");
        assert!(!replay.replayable());
        assert!(!replay.unsent());
        assert!(replay.request(None).is_none());
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
        assert!(replay.copy(None).is_none(), "nothing recorded yet");
        assert_eq!(next(&mut first).unwrap().unwrap(), "a");
        assert!(replay.recording());
        assert!(
            replay.copy(None).is_none(),
            "the recording is not whole yet"
        );
        assert_eq!(read_all(&mut first), ["b"]);
        assert!(!replay.recording());
        // Two hedges, each with the whole body; the slot stays the first attempt's.
        let mut second = replay.copy(None).unwrap().into_body();
        let mut third = replay.copy(None).unwrap().into_body();
        assert_eq!(read_all(&mut third), ["a", "b"]);
        assert_eq!(read_all(&mut second), ["a", "b"]);
        replay.commit();
        assert!(replay.copy(None).is_none(), "no attempt after the commit");
    }

    #[test]
    fn a_body_over_the_limit_is_never_copied() {
        let (req, replay) = Replay::wrap(request(&["aaaa", "bbbb"]), true, 6);
        let mut first = req.into_body();
        assert_eq!(read_all(&mut first).len(), 2);
        assert!(!replay.recording());
        assert!(replay.copy(None).is_none());
    }

    #[test]
    fn a_replayed_attempt_carries_the_time_left() {
        let (req, replay) = Replay::wrap(request(&["a"]), false, 1024);
        drop(req);
        let again = replay.request(Some(Duration::from_millis(250))).unwrap();
        let timeout = again.headers().get("grpc-timeout").unwrap();
        assert_eq!(
            crate::deadline::parse(timeout.as_bytes()),
            Some(Duration::from_millis(250))
        );
    }
}
