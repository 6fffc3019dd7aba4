//! What the channel tells of itself: the totals of
//! [`BalancedChannel::stats`](crate::BalancedChannel::stats), the tracing span
//! of each call (`tonic_balancer.call`), and the hooks through which the metrics (feature
//! `metrics`, see [`crate::metrics`]) are recorded.
//!
//! Nothing here costs a call anything it did not cost before when no subscriber listens and
//! the `metrics` feature is off: the totals of the rare events (retries, replays, refusals,
//! ejections, lookups) are atomics bumped on those rare paths, and the count of attempts is
//! the sum of the instances' own counts (which the call path keeps already), so that the hot
//! path writes no shared counter of its own.
//!
//! The tracing fields have one name for each thing, everywhere, OpenTelemetry's where it has
//! one: an instance is `server.address` (its URI, as in
//! [`EndpointStats::uri`](crate::EndpointStats::uri)), a method `rpc.method`
//! (`pkg.Service/Method`), a status `rpc.grpc.status_code` (its number, as OpenTelemetry
//! records it). An event that names two instances (a call sent again elsewhere) names the
//! one the call goes to `server.address`, as every event about an attempt does, and the one it
//! leaves `previous.server.address`; a change of an instance's state names the new one
//! `state` and the old one `previous.state`.
//!
//! Here: the channel's totals and the hooks of its rare events; in `call.rs`, each call's span
//! and observation; in `stats.rs`, [`ChannelStats`]; in `connectivity.rs`, the channel's
//! [`ConnectivityState`].

mod call;
mod connectivity;
mod stats;

pub(crate) use call::{code_of, AttemptObs, CallObs, CallResult};
pub(crate) use connectivity::Connectivity;
pub use connectivity::ConnectivityState;
pub use stats::{ChannelStats, DiscoveryState};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::instance::Instance;

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
    /// The channel's connectivity state (see `connectivity.rs`).
    pub(crate) connectivity: Connectivity,
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
