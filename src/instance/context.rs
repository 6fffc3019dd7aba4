//! What the instances of one channel share.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
#[cfg(test)]
use std::time::Duration;

use tokio::time::Instant;

use super::backoff::Backoff;
use super::events::Events;
use crate::load::ChannelLoad;

/// What every instance of one channel shares: the clock, the runtime, the settings the
/// instances and the pick read, and the channel-wide counters.
pub(crate) struct Context {
    pub(crate) epoch: Instant,
    /// The runtime the channel was built in: its connections, timers and background tasks
    /// run there, whichever thread inserts an instance or drops a call.
    pub(crate) runtime: tokio::runtime::Handle,
    /// The channel-wide counters that move while it runs (members, ejections, probes sent),
    /// each written through its own method.
    pub(crate) live: Live,
    /// What the instances learn in common: the tie-break's per-method references, the
    /// estimates' settings, the pick's clock and gates' end.
    pub(crate) load: ChannelLoad,
    /// Slow start window in nanoseconds (0: off).
    pub(crate) slow_start_ns: u64,
    /// The status codes the user named ordinary answers of the service
    /// ([`Ejection::ordinary_codes`](crate::Ejection::ordinary_codes)), one bit per code: such
    /// an answer is an answer like OK, to the latency estimates too.
    pub(crate) ordinary_codes: u32,
    pub(crate) backoff: Backoff,
    /// Wakes the discovery task, if there is one.
    pub(crate) discovery_wake: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    /// Connections per instance.
    pub(crate) conns: super::conns::Limits,
    /// Where the instances and the set tell what happens to them (see [`Events`]).
    pub(crate) events: Arc<dyn Events>,
    /// The channel's attempts in flight, each counted from its pick to its end, where a cap
    /// applies to them (an xDS cluster's `max_requests`, see `call::admission`); `None`: not
    /// counted.
    pub(crate) attempts: Option<AtomicU32>,
    /// Probes (`Builder::probes`), if the channel sends them.
    pub(crate) probes: Option<crate::probe::ProbeConfig>,
}

impl Context {
    /// Whether an answer with `code` is an ordinary answer of the service (OK, or a code the
    /// user named so).
    #[inline]
    pub(crate) fn is_ordinary(&self, code: tonic::Code) -> bool {
        code == tonic::Code::Ok || self.ordinary_codes & code_bit(code) != 0
    }

    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// The channel-wide values that move while the channel runs: atomics, each written only
/// through a method here, so that what may change them is in one place.
#[derive(Debug, Default)]
pub(crate) struct Live {
    /// Instances ejected now.
    ejected: AtomicUsize,
    /// Instances in the set now (not draining).
    members: AtomicUsize,
    /// Probes sent so far.
    probes_sent: AtomicU64,
}

impl Live {
    /// Takes one of the ejections that `cap` allows at once; `false` when all are taken
    /// (concurrent ejections cannot exceed it).
    pub(crate) fn reserve_ejection(&self, cap: usize) -> bool {
        self.ejected
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                (e < cap).then_some(e + 1)
            })
            .is_ok()
    }

    /// An ejection reserved with [`Live::reserve_ejection`] is over (or did not happen).
    pub(crate) fn ejection_over(&self) {
        self.ejected.fetch_sub(1, Ordering::AcqRel);
    }

    /// Instances in the set now (not draining).
    pub(crate) fn members(&self) -> usize {
        self.members.load(Ordering::Relaxed)
    }

    /// The set now has `n` members.
    pub(crate) fn set_members(&self, n: usize) {
        self.members.store(n, Ordering::Relaxed);
    }

    /// Probes sent so far.
    pub(crate) fn probes_sent(&self) -> u64 {
        self.probes_sent.load(Ordering::Relaxed)
    }

    /// One more probe sent.
    pub(crate) fn probe_sent(&self) {
        self.probes_sent.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
impl Context {
    /// A context with the builder's defaults and nothing observing, for tests of the layers
    /// below the channel. Needs a tokio runtime.
    pub(crate) fn for_tests() -> Context {
        let expiry = Duration::from_secs(5);
        let epoch = Instant::now();
        Context {
            epoch,
            runtime: tokio::runtime::Handle::current(),
            live: Live::default(),
            load: ChannelLoad::new(
                epoch,
                expiry,
                Duration::from_secs(1),
                crate::load::tie::GateRule::LEAST_PENDING,
                Default::default(),
            ),
            slow_start_ns: 0,
            ordinary_codes: 0,
            backoff: Backoff::default(),
            discovery_wake: std::sync::OnceLock::new(),
            conns: Default::default(),
            events: Arc::new(Unobserved),
            attempts: None,
            probes: None,
        }
    }
}

/// Events nobody observes (tests of the layers below the channel).
#[cfg(test)]
struct Unobserved;

#[cfg(test)]
impl Events for Unobserved {
    fn outcome(&self, _: &Arc<super::Instance>, _: super::events::Outcome) {}
    fn connected(&self, _: &super::Instance) {}
    fn disconnected(&self, _: &super::Instance, _: &(dyn std::error::Error + 'static)) {}
    fn connect_failed(&self, _: &Arc<super::Instance>, _: &dyn std::error::Error) {}
    fn dropped(&self, _: &super::Instance) {}
    fn back_in_service(&self, _: &super::Instance) {}
    fn joined(&self, _: &Arc<super::Instance>) {}
    fn taken_back(&self, _: &Arc<super::Instance>, _: usize) {}
    fn membership(&self, _: usize, _: usize) {}
    fn discovery_answer(&self, _: Option<&str>) {}
    fn connectivity(&self) {}
}

/// A status code's bit in a set of codes (`u32`: gRPC's codes are 0 to 16).
#[inline]
pub(crate) fn code_bit(code: tonic::Code) -> u32 {
    1u32 << (code as u32).min(31)
}
