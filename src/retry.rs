//! Sending a call again: transparent replay of calls that never left, and the opt-in retry
//! policy with its budget.
//!
//! A call can go to another instance only if its request can be sent again. The request head
//! is copied when the call is routed; the body is wrapped in a [`ReplayBody`] that either hands
//! itself back untouched when the connection drops it unread (transparent retry: not one byte
//! went out), or, with a retry policy, keeps a copy of what it sent up to a size limit.

use std::collections::VecDeque;
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
/// A call is retried when it ends, before any response message, with one of `codes` (or a
/// transport error, which is UNAVAILABLE), while: it has attempts left; some instance it has
/// not tried is usable; its request body was kept (at most
/// [`max_replay_body`](crate::Builder::max_replay_body) bytes); its deadline leaves room for
/// the backoff; and the [retry budget](RetryPolicy::budget_ratio) allows it. A call whose
/// response has started (headers with messages) is never retried.
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer::RetryPolicy;
///
/// let policy = RetryPolicy {
///     max_attempts: 3,
///     codes: vec![Code::Unavailable, Code::ResourceExhausted],
///     initial_backoff: Duration::from_millis(10),
///     ..RetryPolicy::default()
/// };
/// # let _ = policy;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (2 to 10).
    pub max_attempts: u32,
    /// The statuses that are retried (default: UNAVAILABLE, RESOURCE_EXHAUSTED).
    pub codes: Vec<Code>,
    /// Backoff before the first retry; each next one is `multiplier` times longer, up to
    /// `max_backoff`, each drawn at random between zero and that value (gRPC's retry design).
    pub initial_backoff: Duration,
    /// Cap on the backoff.
    pub max_backoff: Duration,
    /// Growth of the backoff per retry.
    pub multiplier: f64,
    /// Retries may add at most this share of the calls (0.2: one retry per five calls)...
    pub budget_ratio: f64,
    /// ...plus this many retries per second, so that a quiet channel can still retry.
    pub budget_min_per_sec: u32,
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
        let min = i64::from(policy.budget_min_per_sec);
        Budget {
            balance: AtomicI64::new(min * 1000),
            topped_at: AtomicU64::new(0),
            epoch: Instant::now(),
            ratio_milli: (policy.budget_ratio * 1000.0) as i64,
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

/// What a call keeps of its request body for another attempt.
#[derive(Default)]
pub(crate) struct Kept {
    /// The body, handed back unread.
    unsent: Option<Body>,
    /// What was sent, when recording.
    frames: Vec<Bytes>,
    trailers: Option<http::HeaderMap>,
    len: usize,
    complete: bool,
    overflow: bool,
}

pub(crate) type KeptRef = Arc<Mutex<Kept>>;

/// A request body that can be had again: see the module docs.
pub(crate) struct ReplayBody {
    inner: Body,
    kept: Option<KeptRef>,
    /// Keep a copy of what is sent, up to `limit` bytes.
    record: bool,
    limit: usize,
    started: bool,
}

impl ReplayBody {
    pub(crate) fn new(inner: Body, kept: KeptRef, record: bool, limit: usize) -> ReplayBody {
        ReplayBody {
            inner,
            kept: Some(kept),
            record,
            limit,
            started: false,
        }
    }
}

impl Drop for ReplayBody {
    fn drop(&mut self) {
        if !self.started {
            if let Some(kept) = self.kept.take() {
                let body = std::mem::take(&mut self.inner);
                lock(&kept).unsent = Some(body);
            }
        }
    }
}

impl HttpBody for ReplayBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = &mut *self;
        if !this.started {
            this.started = true;
            if !this.record {
                // Transparent retry only: from the first read on the body belongs to this
                // attempt, and polling takes no lock.
                this.kept = None;
            }
        }
        let res = Pin::new(&mut this.inner).poll_frame(cx);
        if let Some(kept) = &this.kept {
            let mut k = lock(kept);
            match &res {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        k.len += data.len();
                        if k.len > this.limit {
                            k.overflow = true;
                            k.frames = Vec::new();
                        } else {
                            k.frames.push(data.clone());
                        }
                    } else if let Some(t) = frame.trailers_ref() {
                        k.trailers = Some(t.clone());
                    }
                }
                Poll::Ready(None) => k.complete = true,
                Poll::Ready(Some(Err(_))) => k.overflow = true,
                Poll::Pending => {}
            }
            let stop = k.overflow || k.complete;
            drop(k);
            if stop {
                this.kept = None;
            }
        }
        res
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A recorded body, sent again.
struct Recorded {
    frames: VecDeque<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl HttpBody for Recorded {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        if let Some(d) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.trailers.is_none()
    }
}

/// The request head and body of a call, for another attempt.
pub(crate) struct Replay {
    method: http::Method,
    uri: http::Uri,
    version: http::Version,
    headers: http::HeaderMap,
    extensions: http::Extensions,
    kept: KeptRef,
    record: bool,
    limit: usize,
}

impl Replay {
    /// Wraps the request's body so that it can be had again.
    pub(crate) fn wrap(
        req: http::Request<Body>,
        record: bool,
        limit: usize,
    ) -> (http::Request<Body>, Replay) {
        let (parts, body) = req.into_parts();
        let kept = KeptRef::default();
        let replay = Replay {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            headers: parts.headers.clone(),
            extensions: parts.extensions.clone(),
            kept: kept.clone(),
            record,
            limit,
        };
        let body = Body::new(ReplayBody::new(body, kept, record, limit));
        (http::Request::from_parts(parts, body), replay)
    }

    /// The request again: its body handed back unread, or (when recorded) what was sent.
    /// `None` if neither is to be had.
    pub(crate) fn request(&self) -> Option<http::Request<Body>> {
        let (body, record) = {
            let mut k = lock(&self.kept);
            if let Some(b) = k.unsent.take() {
                // Never read: record it on this attempt as on the first.
                (b, self.record)
            } else if k.complete && !k.overflow {
                // Recorded whole: the frames stay in `kept` for any further attempt.
                let body = Body::new(Recorded {
                    frames: k.frames.iter().cloned().collect(),
                    trailers: k.trailers.clone(),
                });
                (body, false)
            } else {
                return None;
            }
        };
        let body = Body::new(ReplayBody::new(body, self.kept.clone(), record, self.limit));
        let mut req = http::Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        *req.extensions_mut() = self.extensions.clone();
        Some(req)
    }
}
