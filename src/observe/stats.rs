//! [`ChannelStats`]: the totals of a channel, for a look at what it did without a metrics
//! stack.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Totals;
use crate::set::Set;

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
/// [`BalancedChannel::stats`](crate::BalancedChannel::stats): for a look at what the balancer did
/// without a metrics stack.
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
    probes_sent: u64,
    pub(crate) unmatched_method_names: u64,
}

impl ChannelStats {
    /// How many of the method names that the channel's retry and hedging policies, its
    /// service config's method configs and its `metrics_methods` (feature `metrics`) give no
    /// call has matched so far: a
    /// policy for `GetItem` (a service without a package) does nothing for the calls of
    /// `/inventory.v1.Inventory/GetItem`. After 100 calls, the channel also says which, once,
    /// as a warning, with the paths the calls had.
    pub fn unmatched_method_names(&self) -> u64 {
        self.unmatched_method_names
    }

    /// Calls made through the channel: routed ones and refused ones (each call once, whatever
    /// number of attempts it took).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Attempts sent to instances: each call's first one, its retries, its transparent retries
    /// and its hedges (the sum of [`EndpointStats::started`](crate::EndpointStats::started) over
    /// the
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

    /// Probes sent (see [`Builder::probes`](crate::Builder::probes)); 0 without probes.
    pub fn probes_sent(&self) -> u64 {
        self.probes_sent
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
        if self.probes_sent > 0 {
            write!(f, " probes={}", self.probes_sent)?;
        }
        if self.unmatched_method_names > 0 {
            write!(f, " unmatched_method_names={}", self.unmatched_method_names)?;
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
            probes_sent: set.ctx.live.probes_sent(),
            unmatched_method_names: 0,
        }
    }

    /// Adds the calls, attempts and instances of `other`: a cluster's channel of an xDS
    /// split, whose calls are this channel's (its discovery's state stays this channel's).
    pub(crate) fn add(&mut self, other: &ChannelStats) {
        self.calls += other.calls;
        self.attempts += other.attempts;
        self.retries += other.retries;
        self.transparent_retries += other.transparent_retries;
        self.hedges += other.hedges;
        self.refused += other.refused;
        self.retry_budget_exhausted += other.retry_budget_exhausted;
        self.ejections += other.ejections;
        self.ejections_not_enforced += other.ejections_not_enforced;
        self.instances_added += other.instances_added;
        self.instances_removed += other.instances_removed;
        self.probes_sent += other.probes_sent;
    }
}
