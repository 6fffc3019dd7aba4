//! What an instance reported of its load (ORCA, gRFC A51), kept as the pick reads it: atomics
//! only. The reports ([`LoadReport`], in `report.rs`) are read and taken in by
//! `learn.rs`; the pick reads what is kept here ([`OthersInFlight`] for least pending;
//! weighted round robin's weight is in [`super::weight`]).
//!
//! Sources:
//! [gRFC A51](https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;

use super::report::LoadReport;
use super::weight::{EndpointWeight, WrrCell, WrrConfig};

/// The clock of the in-flight estimate: nanoseconds >> 20 (about a millisecond), plus one so
/// that 0 means "no report".
const TICK_SHIFT: u32 = 20;

#[inline]
pub(crate) fn tick(ns: u64) -> u64 {
    (ns >> TICK_SHIFT) + 1
}

/// The bits of [`OthersInFlight`] that hold the count; the tick takes the other 40 (2^40 ticks of
/// about a millisecond: 36 years of the channel's clock, so that it never wraps).
pub(crate) const COUNT_BITS: u32 = 24;

/// The report settings of one channel (see the `Builder` methods).
#[derive(Debug)]
pub(crate) struct ReportSettings {
    /// Reports older than this many ticks are not used by the least-pending pick (0: never).
    pub(crate) max_age_ticks: u32,
    pub(crate) wrr: WrrCell,
}

/// The default [`Builder::load_report_max_age`](crate::Builder::load_report_max_age).
pub const DEFAULT_LOAD_REPORT_MAX_AGE: Duration = Duration::from_secs(1);

impl Default for ReportSettings {
    fn default() -> ReportSettings {
        ReportSettings::new(DEFAULT_LOAD_REPORT_MAX_AGE, WrrConfig::default())
    }
}

impl ReportSettings {
    pub(crate) fn new(max_age: Duration, wrr: WrrConfig) -> ReportSettings {
        let ticks = (max_age.as_nanos() >> TICK_SHIFT).min(u128::from(u32::MAX / 2)) as u32;
        // A non-zero age shorter than a tick still uses reports of the same tick.
        let max_age_ticks = if max_age.is_zero() { 0 } else { ticks.max(1) };
        ReportSettings {
            max_age_ticks,
            wrr: WrrCell::new(wrr),
        }
    }
}

/// The other clients' calls in flight on one instance as of its last load report, while that
/// report is fresh: the tick until which it is fresh (high 40 bits) and the count (low 24
/// bits); 0: none. Apart from the rest of [`Reported`] so that it sits in the cache line of
/// the instance that the pick reads.
#[derive(Debug, Default)]
pub(crate) struct OthersInFlight(AtomicU64);

impl OthersInFlight {
    /// The other clients' calls in flight on this instance, from a report still fresh at
    /// `now_tick` ([`tick`] of the pick's clock); 0 when there is none. Read for every
    /// candidate of every least-pending pick while some instance's report is fresh (see
    /// [`ReportsFresh`]): one load, a compare and a select. A report from after
    /// `now_tick` (the pick's coarse clock can lag) is fresh, as it should be.
    #[inline]
    pub(crate) fn get(&self, now_tick: u64) -> usize {
        let w = self.0.load(Ordering::Relaxed);
        if w >> COUNT_BITS >= now_tick {
            (w & ((1 << COUNT_BITS) - 1)) as usize
        } else {
            0
        }
    }

    /// Keeps `count` (at most 2^24 - 1) as the other clients' calls, from a report received at
    /// `at_ns`, fresh for `max_age_ticks` (0: not kept). Returns the tick until which it is
    /// fresh (0: not kept).
    pub(crate) fn set(&self, count: u64, at_ns: u64, max_age_ticks: u32) -> u64 {
        if max_age_ticks == 0 {
            self.0.store(0, Ordering::Relaxed);
            return 0;
        }
        let until = tick(at_ns) + u64::from(max_age_ticks);
        let w = until << COUNT_BITS | count.min((1 << COUNT_BITS) - 1);
        self.0.store(w, Ordering::Relaxed);
        until
    }
}

/// The tick until which some instance of the channel has a fresh count of the other clients'
/// calls (0: none ever). While it is past, every instance's [`OthersInFlight`] reads 0, and the
/// pick scans without reading them: a channel whose servers send no reports (or whose reports
/// went stale) pays nothing for them per candidate.
#[derive(Debug, Default)]
pub(crate) struct ReportsFresh(AtomicU64);

impl ReportsFresh {
    /// An instance's count is fresh until `until`. A plain load first: with per-call reports
    /// this runs on every response, and the word moves at most once a tick.
    #[inline]
    pub(crate) fn note(&self, until: u64) {
        if until > self.0.load(Ordering::Relaxed) {
            self.0.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Whether some instance may have a count fresh at `now_tick` (see [`OthersInFlight::get`]).
    #[inline]
    pub(crate) fn any(&self, now_tick: u64) -> bool {
        self.0.load(Ordering::Relaxed) >= now_tick
    }
}

/// What one instance reported last, as the pick reads it: atomics only.
pub(crate) struct Reported {
    /// Weighted round robin's state (gRFC A58).
    pub(crate) wrr: EndpointWeight,
    /// The last report whole, for [`EndpointStats`](crate::EndpointStats).
    last: ArcSwapOption<LoadReport>,
    /// Signalled on every change of the instance's state, for its out-of-band reports.
    events: tokio::sync::watch::Sender<()>,
    /// How many times its connection was lost or re-added (states `Connecting` and `Failing`
    /// entered): a server that does not implement out-of-band reports is asked again only
    /// once this moved.
    reconnects: std::sync::atomic::AtomicU32,
}

impl Default for Reported {
    fn default() -> Reported {
        Reported {
            wrr: Default::default(),
            last: ArcSwapOption::empty(),
            events: tokio::sync::watch::Sender::new(()),
            reconnects: Default::default(),
        }
    }
}

impl Reported {
    /// The instance moved to state `to` (see `Instance::transition`).
    pub(crate) fn state_changed(&self, to: crate::State) {
        if matches!(to, crate::State::Connecting | crate::State::Failing) {
            self.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        if self.events.receiver_count() > 0 {
            self.events.send_replace(());
        }
    }

    /// Changes of the instance's state, as they come.
    pub(crate) fn events(&self) -> tokio::sync::watch::Receiver<()> {
        self.events.subscribe()
    }

    pub(crate) fn reconnects(&self) -> u32 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// A report arrived at `now_ns`: weighted round robin's weight learns from it, and it is
    /// the last one.
    pub(crate) fn record(&self, report: LoadReport, now_ns: u64, settings: &ReportSettings) {
        self.wrr.update(&report, now_ns, &settings.wrr.get());
        self.last.store(Some(Arc::new(report)));
    }

    /// The last report, if any.
    pub(crate) fn last(&self) -> Option<Arc<LoadReport>> {
        self.last.load_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-flight estimate uses only fresh reports: a report at most the age old counts,
    /// an older one does not, and a report from the future (the coarse clock lags) counts.
    #[test]
    fn others_only_while_fresh() {
        let s = ReportSettings::new(Duration::from_millis(100), WrrConfig::default());
        let r = OthersInFlight::default();
        let at = 5_000_000_000u64;
        assert_eq!(r.get(tick(at)), 0);
        r.set(7, at, s.max_age_ticks);
        assert_eq!(r.get(tick(at)), 7);
        assert_eq!(r.get(tick(at + 90_000_000)), 7);
        assert_eq!(r.get(tick(at + 200_000_000)), 0);
        // The pick's clock may lag the report's.
        assert_eq!(r.get(tick(at - 50_000_000)), 7);
        let off = ReportSettings::new(Duration::ZERO, WrrConfig::default());
        r.set(7, at, off.max_age_ticks);
        assert_eq!(r.get(tick(at)), 0);
        // Long past: stale, an hour or 30 or 60 days later (a 32-bit tick wrapped after 26
        // days and made a count from long ago fresh again for as long).
        r.set(7, at, s.max_age_ticks);
        for later in [3_600u64, 30 * 86_400, 60 * 86_400] {
            assert_eq!(
                r.get(tick(at + later * 1_000_000_000)),
                0,
                "{later} s later"
            );
        }
        // The longest age stays fresh however far the pick's clock lags.
        let longest = ReportSettings::new(Duration::MAX, WrrConfig::default());
        r.set(7, at, longest.max_age_ticks);
        assert_eq!(r.get(tick(at - 1_000_000_000)), 7);
        assert_eq!(r.get(tick(at + 86_400_000_000_000)), 7);
        // A count past 24 bits is kept as the most it can hold.
        r.set(u64::MAX, at, s.max_age_ticks);
        assert_eq!(r.get(tick(at)), (1 << COUNT_BITS) - 1);
    }
}
