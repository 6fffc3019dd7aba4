//! What the instances of one channel share.

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::backoff::Backoff;
use super::events::Events;

/// What every instance of one channel shares: the clock, the runtime, the settings the
/// instances and the pick read, and the channel-wide counters.
pub(crate) struct Context {
    pub(crate) epoch: Instant,
    /// The runtime the channel was built in: its connections, timers and background tasks
    /// run there, whichever thread inserts an instance or drops a call.
    pub(crate) runtime: tokio::runtime::Handle,
    /// A coarse clock for the pick, in nanoseconds since `epoch`: the time of the latest
    /// latency sample of any instance. Reading it costs a load, not a clock call.
    pub(crate) clock: AtomicU64,
    /// A latency estimate older than this counts as unknown.
    pub(crate) latency_expiry_ns: u64,
    /// `1 / latency_expiry_ns`, so that the pick multiplies instead of dividing.
    pub(crate) inv_latency_expiry: f64,
    /// Time constant of the moving average of latency.
    pub(crate) latency_decay: Duration,
    /// The per-method references of the least-pending tie-break.
    pub(crate) methods: super::tie::Methods,
    /// Slow start window in nanoseconds (0: off).
    pub(crate) slow_start_ns: u64,
    /// How long the tie-break gates a markedly slow instance for (`tie::GateRule`).
    pub(crate) gate: super::tie::GateRule,
    /// Until when some instance may be gated (the latest gate's end, on the pick's clock):
    /// after it, fewest then fastest weighs no call and scans the plain counts, as least
    /// pending does.
    pub(crate) gated_until: AtomicU64,
    /// Peak EWMA: the latency of an instance with no estimate yet.
    pub(crate) default_latency_ns: f64,
    /// The status codes the user named ordinary answers of the service
    /// ([`Ejection::ordinary_codes`](crate::Ejection::ordinary_codes)), one bit per code: such
    /// an answer is an answer like OK, to the latency estimates too.
    pub(crate) ordinary_codes: u32,
    pub(crate) backoff: Backoff,
    /// Wakes the discovery task, if there is one.
    pub(crate) discovery_wake: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    /// Instances ejected now.
    pub(crate) ejected: AtomicUsize,
    /// Instances in the set now (not draining).
    pub(crate) members: AtomicUsize,
    /// Connections per instance.
    pub(crate) conns: super::conns::Limits,
    /// What the pick does with server-reported load.
    pub(crate) reports: super::load::ReportSettings,
    /// Until when some instance's report of the other clients' calls is fresh.
    pub(crate) reports_fresh: super::load::ReportsFresh,
    /// Where the instances and the set tell what happens to them (see [`Events`]).
    pub(crate) events: Arc<dyn Events>,
    /// Probes (`Builder::probes`), if the channel sends them.
    pub(crate) probes: Option<crate::probe::ProbeConfig>,
    /// Probes sent so far.
    pub(crate) probes_sent: AtomicU64,
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

#[cfg(test)]
impl Context {
    /// A context with the builder's defaults and nothing observing, for tests of the layers
    /// below the channel. Needs a tokio runtime.
    pub(crate) fn for_tests() -> Context {
        let expiry = Duration::from_secs(5);
        Context {
            epoch: Instant::now(),
            runtime: tokio::runtime::Handle::current(),
            clock: AtomicU64::new(0),
            latency_expiry_ns: expiry.as_nanos() as u64,
            inv_latency_expiry: 1.0 / expiry.as_nanos() as f64,
            latency_decay: Duration::from_secs(1),
            methods: super::tie::Methods::new(),
            slow_start_ns: 0,
            gate: super::tie::GateRule::LEAST_PENDING,
            gated_until: AtomicU64::new(0),
            default_latency_ns: 1_000_000.0,
            ordinary_codes: 0,
            backoff: Backoff::default(),
            discovery_wake: std::sync::OnceLock::new(),
            ejected: AtomicUsize::new(0),
            members: AtomicUsize::new(0),
            conns: Default::default(),
            reports: Default::default(),
            reports_fresh: Default::default(),
            events: Arc::new(Unobserved),
            probes: None,
            probes_sent: AtomicU64::new(0),
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
