//! What the instances of one channel learn in common: the per-method references of the
//! tie-break, the settings of the estimates, the freshness of load reports, and the pick's
//! coarse clock and gates' end. What an answer does to them is in `learn.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::reported::{ReportSettings, ReportsFresh};
use super::tie::{GateRule, Methods};

/// Peak EWMA: the latency of an instance with no estimate yet.
const DEFAULT_LATENCY_NS: f64 = 1_000_000.0;

/// What the instances of one channel learn in common, and the settings of what each learns.
#[derive(Debug)]
pub(crate) struct ChannelLoad {
    /// The channel's epoch: its clock counts nanoseconds from here (as the context's does).
    epoch: Instant,
    /// A latency estimate older than this counts as unknown.
    pub(crate) latency_expiry_ns: u64,
    /// `1 / latency_expiry_ns`, so that the pick multiplies instead of dividing.
    pub(crate) inv_latency_expiry: f64,
    /// Time constant of the moving average of latency.
    pub(crate) latency_decay: Duration,
    /// Peak EWMA: the latency of an instance with no estimate yet.
    pub(crate) default_latency_ns: f64,
    /// The per-method references of the least-pending tie-break.
    pub(crate) methods: Methods,
    /// How long the tie-break gates a markedly slow instance for: the default strategy's rule
    /// (gates wait for confirmation) if set, else least pending's (see [`ChannelLoad::gate`]).
    confirm_gates: AtomicBool,
    /// What the pick does with server-reported load.
    pub(crate) reports: ReportSettings,
    /// Until when some instance's report of the other clients' calls is fresh.
    pub(crate) reports_fresh: ReportsFresh,
    /// A coarse clock for the pick, in nanoseconds since the channel's epoch: the time of the
    /// latest latency sample or load report of any instance. Reading it costs a load, not a
    /// clock call.
    clock: AtomicU64,
    /// Until when some instance may be gated (the latest gate's end, on the pick's clock):
    /// after it, fewest then fastest weighs no call and scans the plain counts, as least
    /// pending does.
    gated_until: AtomicU64,
}

impl ChannelLoad {
    /// On the clock that starts at `epoch`: estimates that count as unknown after `latency_expiry` and move with time constant
    /// `latency_decay`, gates as `gate` says, reports as `reports` says.
    pub(crate) fn new(
        epoch: Instant,
        latency_expiry: Duration,
        latency_decay: Duration,
        gate: GateRule,
        reports: ReportSettings,
    ) -> ChannelLoad {
        let expiry = latency_expiry.as_nanos().max(1) as u64;
        ChannelLoad {
            epoch,
            latency_expiry_ns: expiry,
            inv_latency_expiry: 1.0 / expiry as f64,
            latency_decay,
            default_latency_ns: DEFAULT_LATENCY_NS,
            methods: Methods::new(),
            confirm_gates: AtomicBool::new(gate.confirm),
            reports,
            reports_fresh: Default::default(),
            clock: AtomicU64::new(0),
            gated_until: AtomicU64::new(0),
        }
    }

    /// How long the tie-break gates a markedly slow instance for: one of the strategies' two
    /// rules, [`GateRule::FEWEST_THEN_FASTEST`] or [`GateRule::LEAST_PENDING`].
    #[inline]
    pub(crate) fn gate(&self) -> GateRule {
        if self.confirm_gates.load(Ordering::Relaxed) {
            GateRule::FEWEST_THEN_FASTEST
        } else {
            GateRule::LEAST_PENDING
        }
    }

    /// From now on, `rule` (a strategy's: see [`ChannelLoad::gate`]).
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn set_gate(&self, rule: GateRule) {
        debug_assert!(
            rule == GateRule::FEWEST_THEN_FASTEST || rule == GateRule::LEAST_PENDING,
            "{rule:?} is no strategy's rule"
        );
        self.confirm_gates.store(rule.confirm, Ordering::Relaxed);
    }

    /// Nanoseconds since the channel's epoch at `at`.
    #[inline]
    pub(crate) fn ns_at(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The pick's coarse clock (see [`ChannelLoad::advance_clock`]).
    #[inline]
    pub(crate) fn clock(&self) -> u64 {
        self.clock.load(Ordering::Relaxed)
    }

    /// Moves the pick's clock on to `now_ns` (never back).
    #[inline]
    pub(crate) fn advance_clock(&self, now_ns: u64) {
        self.clock.fetch_max(now_ns, Ordering::Relaxed);
    }

    /// Until when some instance may be gated, on the pick's clock.
    #[inline]
    pub(crate) fn gated_until(&self) -> u64 {
        self.gated_until.load(Ordering::Relaxed)
    }

    /// Some instance is gated until `until` (the latest end is kept).
    #[inline]
    pub(crate) fn gate_until(&self, until: u64) {
        self.gated_until.fetch_max(until, Ordering::Relaxed);
    }
}
