//! The observation of one call: its tracing span (`tonic_balancer.call`), its attempts counted
//! in the channel's totals, and its metrics ([A66](https://github.com/grpc/proposal/blob/master/A66-otel-stats.md)'s per-call and
//! per-attempt instruments).

use std::sync::atomic::Ordering;

use super::{refused, Totals};
use crate::instance::events::AttemptKind;
use crate::instance::Instance;

/// What a call ends with: the response, or why there is none (the call path's type, defined
/// here, below it).
pub(crate) type CallResult = Result<http::Response<tonic::body::Body>, tower::BoxError>;

/// One call, seen from outside: its span, and what its metrics need. Moves with the call, from
/// its future into its response body; what it records is recorded once, when the call is over
/// (or, if the caller drops it first, when it is dropped: CANCELLED).
pub(crate) struct CallObs {
    /// The span, if a subscriber wants it (boxed: a call without one carries a word, not a
    /// whole `Span`, through its future and its body).
    span: Option<Box<tracing::Span>>,
    /// Attempts so far (the first one included).
    attempts: u32,
    /// Recorded already (or nothing to record).
    done: bool,
    /// The status of the delivered attempt's response head (a trailers-only answer).
    head: Option<tonic::Code>,
    /// The attempt whose answer the caller got, once there is one.
    delivered: AttemptObs,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::Call>,
}

/// One attempt of a call, seen from outside: with metrics on, its own duration, sizes and
/// status (recorded when it is dropped); nothing otherwise.
#[derive(Default)]
pub(crate) struct AttemptObs {
    #[cfg(feature = "metrics")]
    metrics: Option<crate::metrics::AttemptMetrics>,
}

impl AttemptObs {
    /// The request of this attempt, about to be sent: with metrics on, its body counts the
    /// message bytes it yields (A66's sent size).
    #[inline(always)]
    pub(crate) fn count_sent(&self, req: &mut http::Request<tonic::body::Body>) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.as_ref() {
            m.count_sent(req);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = req;
    }

    /// The attempt ended with this status.
    #[inline(always)]
    pub(crate) fn ended(&mut self, code: tonic::Code) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.as_mut() {
            m.ended(code);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = code;
    }
}

impl Default for CallObs {
    /// Nothing to record: what a call's future keeps once its body took the real one.
    fn default() -> Self {
        CallObs {
            span: None,
            attempts: 0,
            done: true,
            head: None,
            delivered: AttemptObs::default(),
            #[cfg(feature = "metrics")]
            metrics: None,
        }
    }
}

impl CallObs {
    /// A call starts, for the method of this request.
    #[inline]
    pub(crate) fn new(shared: &Totals, req: &http::Request<tonic::body::Body>) -> CallObs {
        // The level first, in line: the span's own code stays out of the call path (inlined,
        // it made the channel's `call` too large to inline what it inlined before).
        let span = if tracing::level_enabled!(tracing::Level::DEBUG) {
            call_span(req)
        } else {
            None
        };
        #[cfg(not(feature = "metrics"))]
        let _ = shared;
        CallObs {
            span,
            attempts: 0,
            done: false,
            head: None,
            delivered: AttemptObs::default(),
            #[cfg(feature = "metrics")]
            metrics: crate::metrics::Call::new(&shared.metrics, req.uri().path()),
        }
    }

    /// The call's span, to enter while the call is polled (`None`: no subscriber wants it).
    #[inline]
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.span.as_deref()
    }

    /// An attempt of the call goes to `inst`.
    #[inline(always)]
    pub(crate) fn attempt(
        &mut self,
        shared: &Totals,
        inst: &Instance,
        kind: AttemptKind,
    ) -> AttemptObs {
        self.attempts += 1;
        match kind {
            AttemptKind::First => {}
            AttemptKind::Transparent => {
                shared.replays.fetch_add(1, Ordering::Relaxed);
            }
            AttemptKind::Retry => {
                shared.retries.fetch_add(1, Ordering::Relaxed);
            }
            AttemptKind::Hedge => {
                shared.hedges.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(span) = &self.span {
            record_attempt(span, inst, self.attempts);
        }
        AttemptObs {
            #[cfg(feature = "metrics")]
            metrics: self.metrics.as_mut().map(|m| m.attempt(kind)),
        }
    }

    /// The caller gets the answer of this attempt (its response head has come).
    #[inline(always)]
    pub(crate) fn deliver(&mut self, attempt: AttemptObs) {
        self.delivered = attempt;
    }

    /// A frame of the response body (with metrics on, its message bytes count as received).
    #[inline(always)]
    pub(crate) fn received(&mut self, frame: &http_body::Frame<bytes::Bytes>) {
        #[cfg(feature = "metrics")]
        if let (Some(m), Some(data)) = (self.delivered.metrics.as_mut(), frame.data_ref()) {
            m.received(data);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = frame;
    }

    /// The call waits `delay` before its next attempt (a retry's backoff).
    pub(crate) fn retrying(&mut self, delay: std::time::Duration) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.as_mut() {
            m.retrying(delay);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = delay;
    }

    /// The call was refused: no instance could take it.
    pub(crate) fn refused(&mut self, shared: &Totals) {
        refused(shared);
        #[cfg(feature = "metrics")]
        crate::metrics::refused(self.metrics.as_ref());
        self.finish(tonic::Code::Unavailable);
    }

    /// The delivered attempt's response head carries its status (a trailers-only answer).
    pub(crate) fn head(&mut self, code: tonic::Code) {
        self.head = Some(code);
    }

    /// The call is over with this status (the first one given counts; a trailers-only
    /// answer's status wins over what its empty body says).
    #[inline]
    pub(crate) fn finish(&mut self, code: tonic::Code) {
        if self.done {
            return;
        }
        self.done = true;
        let code = self.head.unwrap_or(code);
        self.delivered.ended(code);
        if let Some(span) = &self.span {
            span.record("rpc.grpc.status_code", code as i32);
        }
        #[cfg(feature = "metrics")]
        if let Some(m) = self.metrics.as_mut() {
            m.finish(code);
        }
    }

    /// The call is over with this result of its future; an answer that goes on in a body
    /// records its status when the body ends.
    #[inline]
    pub(crate) fn ended(&mut self, result: &CallResult) {
        if !self.done {
            self.ended_here(result);
        }
    }

    #[inline(never)]
    fn ended_here(&mut self, result: &CallResult) {
        match result {
            Err(e) => self.finish(code_of(&**e)),
            Ok(resp) => {
                // The last answer of a call that could not be sent again.
                let code = crate::headers::grpc_status(resp.headers());
                self.finish(code.unwrap_or(tonic::Code::Unknown));
            }
        }
    }
}

impl Drop for CallObs {
    fn drop(&mut self) {
        // Dropped before its end: the caller gave up on it.
        self.finish(tonic::Code::Cancelled);
    }
}

#[inline(never)]
fn record_attempt(span: &tracing::Span, inst: &Instance, attempt: u32) {
    span.record("server.address", &*inst.target.name);
    span.record("attempt", attempt);
}

/// The span of a call, if a subscriber wants it, with OpenTelemetry's names for its fields:
/// `rpc.method` (`pkg.Service/Method`), `server.address` (the instance of its last attempt),
/// `attempt` (1 for the first), `rpc.grpc.status_code` (the status code's number).
#[inline(never)]
fn call_span(req: &http::Request<tonic::body::Body>) -> Option<Box<tracing::Span>> {
    let path = req.uri().path();
    let span = tracing::debug_span!(
        "tonic_balancer.call",
        rpc.method = path.strip_prefix('/').unwrap_or(path),
        server.address = tracing::field::Empty,
        attempt = tracing::field::Empty,
        rpc.grpc.status_code = tracing::field::Empty,
    );
    (!span.is_disabled()).then(|| Box::new(span))
}

/// The status code a caller sees for this error.
pub(crate) fn code_of(e: &(dyn std::error::Error + 'static)) -> tonic::Code {
    for err in crate::error::sources(e) {
        if let Some(status) = err.downcast_ref::<tonic::Status>() {
            return status.code();
        }
    }
    if crate::error::is_transport(e) {
        tonic::Code::Unavailable
    } else {
        tonic::Code::Unknown
    }
}
