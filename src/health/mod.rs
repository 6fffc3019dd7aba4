//! Health: what each call's outcome says about its instance, and the state machine that keeps
//! failing instances out of the pick.
//!
//! ```text
//!              connect error                      probe connects
//!   Connecting --------------> Failing  --(backoff)--------------> Ready
//!   Ready      --------------> Failing
//!   Ready --(N failures in a row, or low success rate)--> Ejected --(time)--> Ready (probation)
//!   Ready (probation) --(one failure)--> Ejected (for twice as long)
//!   any --(removed)--> Draining
//! ```
//!
//! Signals, as in gRPC's outlier detection (gRFC A50) and connection backoff specs:
//! - a connect error (refused, timeout, already closed) before any byte of the request went out
//!   marks the instance [`Failing`](crate::State::Failing); a background task probes it with
//!   exponential backoff and marks it ready when a connection opens;
//! - statuses UNAVAILABLE, RESOURCE_EXHAUSTED, a transport error, or a deadline that expires
//!   while the instance holds the call count as failures of the instance; application statuses
//!   (NOT_FOUND, INVALID_ARGUMENT, ...) are the service's answers and count as successes here.

#[cfg(feature = "health-check")]
pub(crate) mod check;
mod outlier;

pub use crate::instance::Backoff;
#[cfg(feature = "health-check")]
pub use check::HealthCheck;
pub use outlier::Ejection;
pub(crate) use outlier::{eject_check, success_rate_sweep};

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

use tonic::Code;

use crate::instance::tie::Method;
use crate::instance::{Instance, State};

/// How a call ended, as far as its instance's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// OK: the instance did its job.
    Success,
    /// An application status (NOT_FOUND, INVALID_ARGUMENT, ...): the instance did its job, the
    /// call failed for the caller.
    AppError,
    /// A status or error that says the instance is in trouble.
    Failure,
    /// The caller gave up (dropped the call or the stream) or the stream ended without status:
    /// says nothing about the instance.
    Cancelled,
}

/// Classifies a call by the `grpc-status` in its trailers (or in a trailers-only response);
/// trailers without one are not gRPC's answer (a proxy's, a broken server's): a failure of the
/// instance.
#[inline]
pub(crate) fn classify_status(code: Option<Code>) -> Outcome {
    code.map_or(Outcome::Failure, classify_code)
}

/// Whether a status code the instance answered with is its fault. DEADLINE_EXCEEDED and
/// CANCELLED from a server are the caller's deadline or cancellation, propagated: an answer,
/// which says nothing against the instance (see `CallGuard::deadline_outcome` for a deadline
/// that passes while the instance has not answered).
pub(crate) fn classify_code(code: Code) -> Outcome {
    match code {
        Code::Unavailable | Code::ResourceExhausted => Outcome::Failure,
        Code::Ok => Outcome::Success,
        Code::Cancelled | Code::DeadlineExceeded => Outcome::Cancelled,
        _ => Outcome::AppError,
    }
}

/// A deadline counts against an instance that has not answered only if the call had been on
/// it at least this long...
pub(crate) const DEADLINE_FLOOR: Duration = Duration::from_millis(10);
/// ...and at least this many times its usual latency: a deadline short next to what the
/// instance usually takes is the caller's choice, not a sign of trouble.
pub(crate) const DEADLINE_LATENCY_FACTOR: f64 = 4.0;

/// One latency sample of `inst`, taken at `at`: the answer to a call to `method` took
/// `elapsed`.
#[inline]
pub(crate) fn observe_latency(inst: &Instance, method: Method, elapsed: Duration, at: Instant) {
    let now = at.saturating_duration_since(inst.ctx.epoch).as_nanos() as u64;
    let sent = now.saturating_sub(elapsed.as_nanos() as u64);
    sample(inst, method, elapsed, sent, now);
}

/// A call to `method` on `inst`, sent at `sent` (nanoseconds since the pool's epoch), taken
/// at `now`, counts as having taken `sample`.
pub(crate) fn sample(inst: &Instance, method: Method, sample: Duration, sent: u64, now: u64) {
    let policy = &inst.ctx;
    let sample = sample.as_nanos() as u64 as f64;
    inst.observe_latency(sample, now, policy.latency_decay);
    let reference = policy.methods.reference(method, sample);
    inst.tie.observe(sample, reference, sent, now);
    policy.clock.fetch_max(now, Ordering::Relaxed);
}

/// A response arrived from `inst`: its connection works.
#[inline]
pub(crate) fn connected(inst: &Instance) {
    if inst.state() == State::Connecting && inst.transition(State::Connecting, State::Ready) {
        crate::metrics::connection_succeeded(inst);
    }
}

/// The connection of `inst` broke under a call: until a response shows a new one works, calls
/// routed to it wait for a connection to be opened (and move on if that fails).
pub(crate) fn disconnected(inst: &Instance, error: &(dyn std::error::Error + 'static)) {
    if inst.transition(State::Ready, State::Connecting) {
        crate::metrics::disconnected(inst, error);
    }
}

/// Records the outcome of one call of `inst` (from the guard's `Drop`).
pub(crate) fn record(inst: &Arc<Instance>, outcome: Outcome) {
    match outcome {
        Outcome::Cancelled => {}
        Outcome::Success | Outcome::AppError => {
            if outcome == Outcome::AppError {
                inst.failed.fetch_add(1, Ordering::Relaxed);
            }
            inst.window_ok.fetch_add(1, Ordering::Relaxed);
            // Writes only when there is something to reset: on the common path these are
            // loads, and the instance's counters stay shared between cores.
            if inst.consecutive_failures.load(Ordering::Relaxed) != 0 {
                inst.consecutive_failures.store(0, Ordering::Relaxed);
            }
            if inst.probation.load(Ordering::Relaxed) {
                inst.probation.store(false, Ordering::Relaxed);
                tracing::debug!(addr = %inst.target.name, "instance passed probation");
            }
            // A streak of ejections ends after 100 successes in a row.
            if inst.ejection_streak.load(Ordering::Relaxed) > 0
                && inst.consecutive_successes.fetch_add(1, Ordering::Relaxed) + 1 >= 100
            {
                inst.ejection_streak.store(0, Ordering::Relaxed);
            }
        }
        Outcome::Failure => {
            inst.failed.fetch_add(1, Ordering::Relaxed);
            inst.window_err.fetch_add(1, Ordering::Relaxed);
            inst.consecutive_successes.store(0, Ordering::Relaxed);
            let n = inst.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
            eject_check(inst, n);
        }
    }
}

/// A draining instance is taken back into the set (a discovery answer names it again): it
/// returns to what its state when it was removed says, not straight into service. One that
/// was unhealthy stays out until a health check says `SERVING`; one that was ejected stays
/// out for what was left of its ejection (or, with no time left or no room under the cap,
/// comes back on probation); any other is connecting. `members`: the instances of the set it
/// joins. False if it was not draining.
pub(crate) fn revive(inst: &Arc<Instance>, members: usize) -> bool {
    match inst.drained_from() {
        State::Unhealthy => inst.transition(State::Draining, State::Unhealthy),
        State::Ejected => {
            if outlier::resume_ejection(inst, members) {
                return true;
            }
            let back = inst.transition(State::Draining, State::Connecting);
            if back {
                inst.consecutive_failures.store(0, Ordering::Relaxed);
                inst.probation.store(true, Ordering::Relaxed);
            }
            back
        }
        _ => inst.transition(State::Draining, State::Connecting),
    }
}

/// The instance's connection could not be opened: take it out of the pick and reconnect in the
/// background with backoff.
pub(crate) fn connect_failed(inst: &Arc<Instance>, error: &dyn std::error::Error) {
    let prev = inst.state();
    if !matches!(prev, State::Connecting | State::Ready) {
        return;
    }
    if !inst.transition(prev, State::Failing) {
        return;
    }
    crate::metrics::connection_failed(inst);
    tracing::warn!(addr = %inst.target.name, error = %error, "cannot connect to instance; reconnecting with backoff");
    // Calls waiting for this connection move on now rather than each waiting for its own
    // connect attempt in the connection's queue.
    inst.unreachable.notify_waiters();
    if let Some(wake) = inst.ctx.discovery_wake.get() {
        wake.notify_one();
    }
    let weak = Arc::downgrade(inst);
    let backoff = inst.ctx.backoff.clone();
    inst.spawn(reconnect(weak, backoff));
}

async fn reconnect(weak: Weak<Instance>, backoff: Backoff) {
    let mut attempt = 0u32;
    loop {
        let delay = backoff.delay(attempt);
        tokio::time::sleep(delay).await;
        let Some(inst) = weak.upgrade() else { return };
        if inst.state() != State::Failing {
            return;
        }
        let attempt_connect = inst.target.connect();
        let name = inst.target.name.clone();
        drop(inst);
        let result = tokio::time::timeout(backoff.min_connect_timeout, attempt_connect).await;
        let Some(inst) = weak.upgrade() else { return };
        match result {
            Ok(Ok(_probe)) => {
                crate::metrics::connection_succeeded(&inst);
                // Connecting (usable): the next call opens the instance's connection.
                if inst.transition(State::Failing, State::Connecting) {
                    inst.consecutive_failures.store(0, Ordering::Relaxed);
                    inst.warm_up();
                    tracing::info!(addr = %name, attempt, "instance reachable again");
                }
                return;
            }
            Ok(Err(e)) => {
                crate::metrics::connection_failed(&inst);
                tracing::debug!(addr = %name, attempt, error = %e, "reconnect failed");
            }
            Err(_) => {
                crate::metrics::connection_failed(&inst);
                tracing::debug!(addr = %name, attempt, "reconnect timed out");
            }
        }
        attempt = attempt.saturating_add(1);
    }
}
