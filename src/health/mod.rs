//! Health: what each call's outcome says about its instance, and the state machine that keeps
//! failing instances out of the pick.
//!
//! ```text
//!              connect error                      probe connects
//!   Connecting --------------> Failing  --(backoff)--------------> Ready
//!   Ready      --------------> Failing
//!   Ready --(N failures in a row, or low success rate)--> Ejected --(time)--> Ready (probation)
//!   Ready (probation) --(one failure)--> Ejected (for twice as long)
//!   Connecting, Ready --(health check: not SERVING, stream ended, no first answer)--> Unhealthy
//!   Unhealthy --(health check: SERVING, or no health service)--> Ready
//!   any --(removed)--> Draining
//! ```
//!
//! Signals, as in gRPC's outlier detection (gRFC A50) and connection backoff specs:
//! - a connect error (refused, timeout, already closed) before any byte of the request went out
//!   marks the instance [`Failing`](crate::State::Failing); a background task probes it with
//!   exponential backoff and marks it ready when a connection opens;
//! - server faults (UNKNOWN, INTERNAL, DATA_LOSS, UNAVAILABLE, RESOURCE_EXHAUSTED), a transport
//!   error, or a deadline that expires while the instance holds the call count as failures of
//!   the instance; application statuses (NOT_FOUND, INVALID_ARGUMENT, ...) are the service's
//!   answers: they break no run of failures, and count as failures only in the interval rules,
//!   where an instance is compared with the others (see [`Ejection`]); the codes the user names
//!   ordinary never count;
//! - with health checks on (feature `health-check`), a `grpc.health.v1.Health/Watch` stream per
//!   instance keeps it in service only while its last status is SERVING (gRFC A17, see
//!   `HealthCheck`).
//!
//! Sources:
//! [gRFC A17](https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md),
//! [gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md).

#[cfg(feature = "health-check")]
pub(crate) mod check;
mod ejection;
mod outlier;
mod sweep;

pub(crate) use crate::instance::events::Outcome;
pub use crate::instance::Backoff;
#[cfg(feature = "health-check")]
pub use check::HealthCheck;
use ejection::Class;
pub use ejection::Ejection;
pub(crate) use sweep::{restart_windows, sweep};

use std::sync::{Arc, Weak};

use crate::instance::{Instance, State};
use crate::metrics::Labels;
use crate::observe::Totals;

/// What health needs of its channel: the ejection settings, and the totals and metrics it
/// counts ejections and connection attempts in. Clones share the settings.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    /// The ejection rules now: the builder's, or those of an xDS cluster's outlier detection
    /// (gRFC A50) where the builder set none. Read when a call fails and at each interval,
    /// never on a call that succeeds.
    rules: Arc<arc_swap::ArcSwap<Ejection>>,
    /// Wakes the interval rules' task when the rules change.
    changed: Arc<tokio::sync::Notify>,
    /// The codes the user named ordinary answers (one bit per code): the service's, whatever
    /// the rules.
    ordinary: u32,
    pub(crate) totals: Arc<Totals>,
}

impl Health {
    pub(crate) fn new(ejection: Ejection, totals: Arc<Totals>) -> Health {
        Health {
            ordinary: ejection.ordinary,
            rules: Arc::new(arc_swap::ArcSwap::from_pointee(ejection)),
            changed: Default::default(),
            totals,
        }
    }

    /// The ejection rules now.
    pub(crate) fn rules(&self) -> Arc<Ejection> {
        self.rules.load_full()
    }

    /// From now on, `rules` (checked by the caller), with the user's ordinary codes; the
    /// interval rules start a new interval.
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn set_rules(&self, mut rules: Ejection) {
        rules.ordinary = self.ordinary;
        self.rules.store(Arc::new(rules));
        self.changed.notify_one();
    }

    /// Resolves at the next change of the rules.
    pub(crate) async fn rules_changed(&self) {
        self.changed.notified().await
    }

    fn labels(&self) -> &Labels {
        &self.totals.metrics
    }
}

/// Records the outcome of one call of `inst` (from the guard's `Drop`, through the channel's
/// events).
#[inline]
pub(crate) fn record(health: &Health, inst: &Arc<Instance>, outcome: Outcome) {
    let class = match outcome {
        Outcome::Neutral => return,
        Outcome::Failure => Class::Fault,
        Outcome::Answer(code) => Ejection::class_of(health.ordinary, code),
    };
    let record = &inst.ejection;
    record.ended(
        matches!(class, Class::Success | Class::Ordinary),
        class != Class::Success,
    );
    if class == Class::Fault {
        let n = record.fault();
        outlier::eject_check(health, inst, n);
    } else if record.answered() {
        tracing::debug!(server.address = %inst.target.name, "instance passed probation");
    }
}

/// A draining instance is taken back into the set (a discovery answer names it again): it
/// returns to what its state when it was removed says, not straight into service. One that
/// was unhealthy stays out until a health check says `SERVING`; one that was ejected stays
/// out for what was left of its ejection (or, with no time left or no room under the cap,
/// comes back on probation); any other is connecting. `members`: the instances of the set it
/// joins. False if it was not draining.
pub(crate) fn revive(health: &Health, inst: &Arc<Instance>, members: usize) -> bool {
    match inst.drained_from() {
        State::Unhealthy => inst.transition(State::Draining, State::Unhealthy),
        State::Ejected => {
            if outlier::resume_ejection(health, inst, members) {
                return true;
            }
            let back = inst.transition(State::Draining, State::Connecting);
            if back {
                inst.ejection.on_probation_again();
            }
            back
        }
        _ => inst.transition(State::Draining, State::Connecting),
    }
}

/// The instance's connection could not be opened: take it out of the pick and reconnect in the
/// background with backoff.
pub(crate) fn connect_failed(health: &Health, inst: &Arc<Instance>, error: &dyn std::error::Error) {
    let prev = inst.state();
    if !matches!(prev, State::Connecting | State::Ready) {
        return;
    }
    if !inst.transition(prev, State::Failing) {
        return;
    }
    crate::metrics::connection_failed(health.labels(), inst);
    tracing::warn!(server.address = %inst.target.name, error = %error, "cannot connect to instance; reconnecting with backoff");
    // Calls waiting for this connection move on now rather than each waiting for its own
    // connect attempt in the connection's queue.
    inst.unreachable.notify_waiters();
    if let Some(wake) = inst.ctx.discovery_wake.get() {
        wake.notify_one();
    }
    let weak = Arc::downgrade(inst);
    let backoff = inst.ctx.backoff.clone();
    inst.spawn(reconnect(weak, backoff, health.labels().clone()));
}

async fn reconnect(weak: Weak<Instance>, backoff: Backoff, labels: Labels) {
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
                crate::metrics::connection_succeeded(&labels, &inst);
                // Connecting (usable): the next call opens the instance's connection.
                if inst.transition(State::Failing, State::Connecting) {
                    inst.ejection.reconnected();
                    inst.warm_up();
                    tracing::info!(server.address = %name, attempt, "instance reachable again");
                }
                return;
            }
            Ok(Err(e)) => {
                crate::metrics::connection_failed(&labels, &inst);
                tracing::debug!(server.address = %name, attempt, error = %e, "reconnect failed");
            }
            Err(_) => {
                crate::metrics::connection_failed(&labels, &inst);
                tracing::debug!(server.address = %name, attempt, "reconnect timed out");
            }
        }
        attempt = attempt.saturating_add(1);
    }
}
