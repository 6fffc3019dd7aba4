//! Weighted round robin's weight of one instance (gRFC A58): the weight its load reports give
//! it, and when that weight counts (the blackout after a run of reports begins, the expiry
//! after the last one). Each report comes in through `reported.rs` (from `learn.rs`); the schedule (`crate::pick::wrr`)
//! reads the weights. Kept in the instance, atomics only, written only through
//! [`EndpointWeight`]'s methods.
//!
//! Sources:
//! [gRFC A58](https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md),
//! [gRFC A78](https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::report::LoadReport;

/// The settings of [`Strategy::WeightedRoundRobin`](crate::Strategy::WeightedRoundRobin),
/// with gRPC's defaults (gRFC A58); set with
/// [`Builder::weighted_round_robin`](crate::Builder::weighted_round_robin).
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::orca::WrrConfig;
///
/// let wrr = WrrConfig::default()
///     .blackout_period(Duration::from_secs(2))
///     .error_utilization_penalty(2.0);
/// # let _ = wrr;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct WrrConfig {
    pub(crate) blackout_period: Duration,
    pub(crate) weight_expiration_period: Duration,
    pub(crate) weight_update_period: Duration,
    pub(crate) error_utilization_penalty: f64,
}

impl Default for WrrConfig {
    fn default() -> WrrConfig {
        WrrConfig {
            blackout_period: Duration::from_secs(10),
            weight_expiration_period: Duration::from_secs(180),
            weight_update_period: Duration::from_secs(1),
            error_utilization_penalty: 1.0,
        }
    }
}

impl WrrConfig {
    /// How long after the first report of a run an instance's weight starts to count
    /// (default 10 s; zero: at once).
    pub fn blackout_period(mut self, d: Duration) -> Self {
        self.blackout_period = d;
        self
    }

    /// Without a report for this long, an instance's weight no longer counts, and the next
    /// report starts a new blackout (default 3 min; must be above zero).
    pub fn weight_expiration_period(mut self, d: Duration) -> Self {
        self.weight_expiration_period = d;
        self
    }

    /// How often the schedule is rebuilt from the weights (default 1 s; below 100 ms counts
    /// as 100 ms, as in gRPC).
    pub fn weight_update_period(mut self, d: Duration) -> Self {
        self.weight_update_period = d;
        self
    }

    /// How much errors weigh against an instance: errors per query × this is added to its
    /// utilization (default 1.0; must be finite and ≥ 0).
    pub fn error_utilization_penalty(mut self, p: f64) -> Self {
        self.error_utilization_penalty = p;
        self
    }
}

/// A channel's [`WrrConfig`], which a control plane may change (an xDS cluster's A58
/// settings, see `xds::policy`): each setting a relaxed atomic, read together as one
/// `WrrConfig` where a report is taken in and where the schedule is rebuilt.
#[derive(Debug)]
pub(crate) struct WrrCell {
    blackout_ns: std::sync::atomic::AtomicU64,
    expiration_ns: std::sync::atomic::AtomicU64,
    update_ns: std::sync::atomic::AtomicU64,
    /// `f64` bits.
    penalty: std::sync::atomic::AtomicU64,
}

impl WrrCell {
    /// Settings checked and capped (`WrrConfig::capped`: every duration fits the nanoseconds).
    pub(crate) fn new(cfg: WrrConfig) -> WrrCell {
        let cell = WrrCell {
            blackout_ns: Default::default(),
            expiration_ns: Default::default(),
            update_ns: Default::default(),
            penalty: Default::default(),
        };
        cell.set(cfg);
        cell
    }

    /// The settings now.
    #[inline]
    pub(crate) fn get(&self) -> WrrConfig {
        use std::sync::atomic::Ordering::Relaxed;
        WrrConfig {
            blackout_period: Duration::from_nanos(self.blackout_ns.load(Relaxed)),
            weight_expiration_period: Duration::from_nanos(self.expiration_ns.load(Relaxed)),
            weight_update_period: Duration::from_nanos(self.update_ns.load(Relaxed)),
            error_utilization_penalty: f64::from_bits(self.penalty.load(Relaxed)),
        }
    }

    /// From now on, `cfg` (checked and capped by the caller).
    pub(crate) fn set(&self, cfg: WrrConfig) {
        use std::sync::atomic::Ordering::Relaxed;
        self.blackout_ns
            .store(crate::time::nanos(cfg.blackout_period), Relaxed);
        self.expiration_ns
            .store(crate::time::nanos(cfg.weight_expiration_period), Relaxed);
        self.update_ns
            .store(crate::time::nanos(cfg.weight_update_period), Relaxed);
        self.penalty
            .store(cfg.error_utilization_penalty.to_bits(), Relaxed);
    }
}

/// The shortest weight update period (gRPC's floor).
pub(crate) const MIN_UPDATE_PERIOD: Duration = Duration::from_millis(100);

impl WrrConfig {
    /// Refuses settings that make no sense, naming them.
    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        use crate::checks::Checks;
        Checks::of("weighted_round_robin.error_utilization_penalty")
            .non_negative(self.error_utilization_penalty)?;
        Checks::of("weighted_round_robin.weight_expiration_period")
            .above_zero(self.weight_expiration_period)
    }

    /// The same settings with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> WrrConfig {
        self.blackout_period = crate::time::cap(self.blackout_period);
        self.weight_expiration_period = crate::time::cap(self.weight_expiration_period);
        self.weight_update_period = crate::time::cap(self.weight_update_period);
        self
    }

    pub(crate) fn update_period(&self) -> Duration {
        self.weight_update_period.max(MIN_UPDATE_PERIOD)
    }
}

/// gRPC's weight of one report (0: the report is ignored).
pub(crate) fn weight_of(report: &LoadReport, penalty: f64) -> f64 {
    let qps = report.rps_fractional;
    let eps = report.eps;
    let u = if report.application_utilization > 0.0 {
        report.application_utilization
    } else {
        report.cpu_utilization
    };
    if !(qps > 0.0 && u > 0.0 && qps.is_finite() && u.is_finite()) {
        return 0.0;
    }
    let errors = if eps > 0.0 && penalty > 0.0 {
        eps / qps * penalty
    } else {
        0.0
    };
    let w = qps / (u + errors);
    if w.is_finite() {
        w
    } else {
        0.0
    }
}

/// One instance's weight and its timestamps (nanoseconds since the channel's epoch).
#[derive(Default)]
pub(crate) struct EndpointWeight {
    /// `f64` bits of the last weight.
    weight: AtomicU64,
    /// When the last weight came.
    last_update: AtomicU64,
    /// When the current run of reports began, plus one; 0: no run.
    non_empty_since: AtomicU64,
}

impl EndpointWeight {
    /// Takes in one report.
    pub(crate) fn update(&self, report: &LoadReport, now_ns: u64, cfg: &WrrConfig) {
        let w = weight_of(report, cfg.error_utilization_penalty);
        if w <= 0.0 {
            return;
        }
        let _ = self.non_empty_since.compare_exchange(
            0,
            now_ns + 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.weight.store(w.to_bits(), Ordering::Relaxed);
        self.last_update.store(now_ns, Ordering::Relaxed);
    }

    /// The instance left service: its weight no longer counts, and its next report starts a
    /// new blackout.
    pub(crate) fn reset(&self) {
        self.non_empty_since.store(0, Ordering::Relaxed);
    }

    /// The weight that counts now: 0 before the blackout is over, after expiry, or without
    /// reports. Expiry ends the run (the next report starts a new blackout).
    #[cfg(test)]
    pub(crate) fn get(&self, now_ns: u64, cfg: &WrrConfig) -> f64 {
        self.read(now_ns, cfg).0
    }

    /// The weight that counts now (0 before the blackout is over, after expiry, or without
    /// reports; expiry ends the run), and why it is 0 when it is: gRFC A78 counts, at each
    /// schedule update, the instances whose weight is not yet usable and those whose weight is
    /// stale.
    pub(crate) fn read(&self, now_ns: u64, cfg: &WrrConfig) -> (f64, WeightState) {
        let since = self.non_empty_since.load(Ordering::Relaxed);
        let last = self.last_update.load(Ordering::Relaxed);
        let expired = now_ns.saturating_sub(last) >= cfg.weight_expiration_period.as_nanos() as u64;
        if since == 0 {
            // No run of reports: none ever (no weight kept), the instance left service and
            // has not reported since, or its last report expired (still stale, as gRPC counts
            // it at every update until a report comes).
            let reported = self.weight.load(Ordering::Relaxed) != 0;
            let state = if reported && expired {
                WeightState::Stale
            } else {
                WeightState::NotYetUsable
            };
            return (0.0, state);
        }
        if expired {
            let _ = self.non_empty_since.compare_exchange(
                since,
                0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return (0.0, WeightState::Stale);
        }
        let blackout = cfg.blackout_period.as_nanos() as u64;
        if blackout > 0 && now_ns.saturating_sub(since - 1) < blackout {
            return (0.0, WeightState::NotYetUsable);
        }
        let w = f64::from_bits(self.weight.load(Ordering::Relaxed));
        (w, WeightState::Usable)
    }
}

/// Where an instance's weight stands at a schedule update, as gRFC A78's instruments count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightState {
    /// It counts.
    Usable,
    /// No report yet (in this run of reports), or still in the blackout period.
    NotYetUsable,
    /// The last report is older than the expiration period.
    Stale,
}
