//! What the channel tells of itself: the totals of [`BalancedChannel::stats`], the tracing span
//! of each call (`tonic_balancer.call`), and the hooks through which the metrics (feature
//! `metrics`, see [`crate::metrics`]) are recorded.
//!
//! Nothing here costs a call anything it did not cost before when no subscriber listens and
//! the `metrics` feature is off: the totals of the rare events (retries, replays, refusals,
//! ejections, lookups) are atomics bumped on those rare paths, and the count of attempts is
//! the sum of the instances' own counts (which the call path keeps already), so that the hot
//! path writes no shared counter of its own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::instance::events::Kind;
use crate::instance::Instance;
use crate::set::Set;

type CallResult = Result<http::Response<tonic::body::Body>, tower::BoxError>;

/// The totals of one channel (and of its clones), and its metrics' labels.
#[derive(Debug, Default)]
pub(crate) struct Totals {
    retries: AtomicU64,
    replays: AtomicU64,
    hedges: AtomicU64,
    refused: AtomicU64,
    budget_exhausted: AtomicU64,
    ejections: AtomicU64,
    ejections_not_enforced: AtomicU64,
    lookups: AtomicU64,
    lookup_failures: AtomicU64,
    added: AtomicU64,
    removed: AtomicU64,
    /// Attempts routed to instances that are gone: their own counts went with them.
    retired_attempts: AtomicU64,
    /// The discovery source, if there is one.
    source: OnceLock<String>,
    /// The metrics' labels, set when the channel is built.
    pub(crate) metrics: crate::metrics::Labels,
}

impl Totals {
    /// Names the channel's discovery source (for [`ChannelStats::discovery_source`]).
    pub(crate) fn set_source(&self, name: String) {
        let _ = self.source.set(name);
    }
}

/// An instance leaves for good: its count of attempts moves to the channel's.
pub(crate) fn retired(shared: &Totals, inst: &Instance) {
    let started = inst.started.load(Ordering::Relaxed);
    shared
        .retired_attempts
        .fetch_add(started, Ordering::Relaxed);
}

/// A call was refused: no instance could take it.
pub(crate) fn refused(shared: &Totals) {
    shared.refused.fetch_add(1, Ordering::Relaxed);
}

/// A retry was wanted but the retry budget was spent.
pub(crate) fn budget_exhausted(shared: &Totals) {
    shared.budget_exhausted.fetch_add(1, Ordering::Relaxed);
    crate::metrics::budget_exhausted(&shared.metrics);
}

/// An outlier was found: `enforced` if it was ejected, else held back by the ejection cap.
pub(crate) fn ejection(shared: &Totals, inst: &Instance, why: &'static str, enforced: bool) {
    if enforced {
        shared.ejections.fetch_add(1, Ordering::Relaxed);
    } else {
        shared
            .ejections_not_enforced
            .fetch_add(1, Ordering::Relaxed);
    }
    crate::metrics::ejection(&shared.metrics, inst, why, enforced);
}

/// The discovery source answered (`error`: with a failure).
pub(crate) fn discovery_answer(shared: &Totals, error: Option<&str>) {
    shared.lookups.fetch_add(1, Ordering::Relaxed);
    if error.is_some() {
        shared.lookup_failures.fetch_add(1, Ordering::Relaxed);
    }
    crate::metrics::discovery_answer(&shared.metrics, error.is_some());
}

/// A membership change added and removed these many instances.
pub(crate) fn membership(shared: &Totals, added: usize, removed: usize) {
    shared.added.fetch_add(added as u64, Ordering::Relaxed);
    shared.removed.fetch_add(removed as u64, Ordering::Relaxed);
    crate::metrics::membership(&shared.metrics, added, removed);
}

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
    metrics: Option<crate::metrics::Attempt>,
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
    pub(crate) fn attempt(&mut self, shared: &Totals, inst: &Instance, kind: Kind) -> AttemptObs {
        self.attempts += 1;
        match kind {
            Kind::First => {}
            Kind::Transparent => {
                shared.replays.fetch_add(1, Ordering::Relaxed);
            }
            Kind::Retry => {
                shared.retries.fetch_add(1, Ordering::Relaxed);
            }
            Kind::Hedge => {
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
            span.record("outcome", crate::error::code_name(code));
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
    span.record("instance", &*inst.target.name);
    span.record("attempt", attempt);
}

/// The span of a call, if a subscriber wants it.
#[inline(never)]
fn call_span(req: &http::Request<tonic::body::Body>) -> Option<Box<tracing::Span>> {
    let span = tracing::debug_span!(
        "tonic_balancer.call",
        method = %req.uri().path(),
        instance = tracing::field::Empty,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
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

/// Where the channel's discovery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DiscoveryState {
    /// The source has not answered yet.
    Waiting,
    /// Its last answer was good.
    Ok,
    /// Its last lookup failed (or found no address): the channel keeps its last good set.
    Failing,
}

/// Totals of one channel (and its clones) since it was built, from
/// [`BalancedChannel::stats`]: for a look at what the balancer did without a metrics stack.
///
/// The counters are read one by one, not in one atomic step: while calls flow, one total may
/// include a call that the next does not yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelStats {
    calls: u64,
    attempts: u64,
    retries: u64,
    transparent_retries: u64,
    hedges: u64,
    refused: u64,
    retry_budget_exhausted: u64,
    ejections: u64,
    ejections_not_enforced: u64,
    instances_added: u64,
    instances_removed: u64,
    discovery_source: Option<String>,
    discovery_state: Option<DiscoveryState>,
    discovery_lookups: u64,
    discovery_failures: u64,
    discovery_error: Option<String>,
}

impl ChannelStats {
    /// Calls made through the channel: routed ones and refused ones (each call once, whatever
    /// number of attempts it took).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Attempts sent to instances: each call's first one, its retries, its transparent retries
    /// and its hedges (the sum of [`EndpointStats::started`](crate::EndpointStats::started) over the
    /// instances, those that have left included).
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    /// Attempts made by the [`RetryPolicy`](crate::RetryPolicy) after a failed one.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// Attempts made again, unseen by the caller, because the previous one never reached its
    /// instance (gRPC's transparent retry).
    pub fn transparent_retries(&self) -> u64 {
        self.transparent_retries
    }

    /// Attempts made by a [`HedgingPolicy`](crate::HedgingPolicy) beside each hedged call's
    /// first one.
    pub fn hedges(&self) -> u64 {
        self.hedges
    }

    /// Calls refused at once with UNAVAILABLE because no instance was usable (or the set was
    /// empty).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Retries the retry policy wanted but its budget did not allow.
    pub fn retry_budget_exhausted(&self) -> u64 {
        self.retry_budget_exhausted
    }

    /// Ejections of instances (see [`Ejection`](crate::Ejection)).
    pub fn ejections(&self) -> u64 {
        self.ejections
    }

    /// Outliers found but not ejected: the cap on ejected instances (or ejection turned off)
    /// held them back.
    pub fn ejections_not_enforced(&self) -> u64 {
        self.ejections_not_enforced
    }

    /// Instances added to the set (by the builder, `insert`, `replace_all` or discovery).
    pub fn instances_added(&self) -> u64 {
        self.instances_added
    }

    /// Instances removed from the set (they drain).
    pub fn instances_removed(&self) -> u64 {
        self.instances_removed
    }

    /// The discovery source (for DNS, `dns:///host:port`), if the channel has one.
    pub fn discovery_source(&self) -> Option<&str> {
        self.discovery_source.as_deref()
    }

    /// Where discovery stands, if the channel has a source.
    pub fn discovery_state(&self) -> Option<DiscoveryState> {
        self.discovery_state
    }

    /// Answers of the discovery source: lookups of a polled source (DNS, a
    /// [`Resolve`](crate::Resolve)), changes and errors of a pushed one, failures included.
    pub fn discovery_lookups(&self) -> u64 {
        self.discovery_lookups
    }

    /// Answers of the discovery source that were failures (an error, no address, no answer in
    /// time).
    pub fn discovery_failures(&self) -> u64 {
        self.discovery_failures
    }

    /// The discovery source's last error, if its last answer was one.
    pub fn discovery_error(&self) -> Option<&str> {
        self.discovery_error.as_deref()
    }
}

impl std::fmt::Display for ChannelStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "calls={} attempts={} retries={} transparent_retries={} hedges={} refused={} budget_exhausted={} ejections={}",
            self.calls,
            self.attempts,
            self.retries,
            self.transparent_retries,
            self.hedges,
            self.refused,
            self.retry_budget_exhausted,
            self.ejections
        )?;
        if let Some(source) = &self.discovery_source {
            write!(
                f,
                " discovery={source} lookups={} failures={}",
                self.discovery_lookups, self.discovery_failures
            )?;
            if let Some(e) = &self.discovery_error {
                write!(f, " error={e:?}")?;
            }
        }
        Ok(())
    }
}

impl ChannelStats {
    /// The totals of the channel of `set`.
    pub(crate) fn of(set: &Set, shared: &Totals) -> ChannelStats {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let retired = load(&shared.retired_attempts);
        let live: u64 = set
            .snapshot()
            .iter()
            .chain(set.draining().iter())
            .map(|i| i.started.load(Ordering::Relaxed))
            .sum();
        let attempts = live + retired;
        let retries = load(&shared.retries);
        let replays = load(&shared.replays);
        let hedges = load(&shared.hedges);
        let refused = load(&shared.refused);
        let source = shared.source.get().cloned();
        let error = set.discovery_error();
        let state = source.as_ref().map(|_| {
            if load(&shared.lookups) == 0 {
                DiscoveryState::Waiting
            } else if error.is_some() {
                DiscoveryState::Failing
            } else {
                DiscoveryState::Ok
            }
        });
        ChannelStats {
            calls: (attempts + refused).saturating_sub(retries + replays + hedges),
            attempts,
            retries,
            transparent_retries: replays,
            hedges,
            refused,
            retry_budget_exhausted: load(&shared.budget_exhausted),
            ejections: load(&shared.ejections),
            ejections_not_enforced: load(&shared.ejections_not_enforced),
            instances_added: load(&shared.added),
            instances_removed: load(&shared.removed),
            discovery_source: source,
            discovery_state: state,
            discovery_lookups: load(&shared.lookups),
            discovery_failures: load(&shared.lookup_failures),
            discovery_error: error,
        }
    }
}
