//! Server-reported load (ORCA, gRFC A51): the report an instance attaches to its responses,
//! and what the channel keeps of it.
//!
//! A server that reports its load puts a trailer [`TRAILER`] (`endpoint-load-metrics-bin`) on
//! its responses: a binary `xds.data.orca.v3.OrcaLoadReport` ([`LoadReport`]). The channel
//! reads it from every response that has one (in the trailers, or in the headers of a
//! trailers-only response) and keeps the latest per instance; a response without a report,
//! or with one that does not decode, changes nothing.
//!
//! What the pick does with reports:
//!
//! - [`Strategy::LeastPending`](crate::Strategy::LeastPending) (and
//!   [`PowerOfTwoChoices`](crate::Strategy::PowerOfTwoChoices)): where an instance reports its
//!   calls in flight (the named metric [`IN_FLIGHT_METRIC`], which the server-side
//!   `OrcaLayer` of the `orca` feature sets), the count the pick compares is the calls the
//!   instance serves for every client, not only this channel's: the others' calls as of the
//!   report plus this channel's calls now. Reports older than
//!   [`Builder::load_report_max_age`](crate::Builder::load_report_max_age) (1 s by default)
//!   are not used: the pick falls back to its own count.
//! - [`Strategy::WeightedRoundRobin`](crate::Strategy::WeightedRoundRobin): weights from the
//!   reported queries, errors and utilization, as gRFC A58 specifies (see [`WrrConfig`]).
//!
//! Reports also come out of band (gRFC A51), for channels that send an instance too few calls
//! to hear from it often: with
//! [`Builder::load_reports_out_of_band`](crate::Builder::load_reports_out_of_band), the channel
//! keeps one `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics` stream open on each
//! instance's connection, and each report it receives counts as a per-call report would. The
//! streams are not calls: not counted, picked or retried.
//!
//! The report types and the out-of-band client need no feature; the server side
//! (`OrcaLayer`, `OrcaHandle`, and `OobService` for out-of-band reports) is in the `orca`
//! feature.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;

pub(crate) mod oob;
#[cfg(feature = "orca")]
mod oob_server;
#[cfg(feature = "orca")]
mod server;
mod wire;

#[cfg(feature = "orca")]
pub use oob_server::{OobService, DEFAULT_MIN_REPORT_INTERVAL};
#[cfg(feature = "orca")]
pub use server::{OrcaBody, OrcaFuture, OrcaHandle, OrcaLayer, OrcaService};

pub use crate::wrr::WrrConfig;

/// The trailer that carries a per-call load report (gRFC A51).
pub const TRAILER: &str = "endpoint-load-metrics-bin";

/// The named metric (in [`LoadReport::named_metrics`]) that holds the calls the instance has in
/// flight, for every client, when the report was made.
pub const IN_FLIGHT_METRIC: &str = "calls_in_flight";

/// An ORCA load report (`xds.data.orca.v3.OrcaLoadReport`), as the instance sent it.
///
/// Decoded and encoded by this crate's own code of the protobuf wire format (no protobuf
/// dependency). The deprecated integer `rps` (field 3) is skipped; use `rps_fractional`.
///
/// ```
/// use tonic_balancer::orca::LoadReport;
///
/// let mut report = LoadReport::default();
/// report.rps_fractional = 120.0;
/// report.application_utilization = 0.6;
/// report.named_metrics.insert("calls_in_flight".into(), 7.0);
/// let bytes = report.encode();
/// assert_eq!(LoadReport::decode(&bytes), Some(report));
/// assert_eq!(LoadReport::decode(b"\x0a\xff"), None); // malformed
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct LoadReport {
    /// CPU utilization, a fraction of the CPU available (may exceed 1).
    pub cpu_utilization: f64,
    /// Memory utilization, a fraction of the memory available.
    pub mem_utilization: f64,
    /// Application-specific costs of the request.
    pub request_cost: BTreeMap<String, f64>,
    /// Utilization of named resources, fractions.
    pub utilization: BTreeMap<String, f64>,
    /// Queries per second the instance serves (for every client).
    pub rps_fractional: f64,
    /// Errors per second the instance serves.
    pub eps: f64,
    /// Application-specific metrics ([`IN_FLIGHT_METRIC`] among them).
    pub named_metrics: BTreeMap<String, f64>,
    /// Utilization as the application sees it (for example the higher of CPU and memory);
    /// weighted round robin prefers it to `cpu_utilization` when it is above 0.
    pub application_utilization: f64,
}

impl LoadReport {
    /// Decodes a serialised report; `None` if it is malformed. Unknown fields are skipped.
    pub fn decode(bytes: &[u8]) -> Option<LoadReport> {
        wire::decode(bytes)
    }

    /// Serialises the report (protobuf wire format; fields at their default are left out).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        wire::encode(self, &mut out);
        out
    }

    /// The instance's calls in flight, if it reports them (a finite value ≥ 0 of the named
    /// metric [`IN_FLIGHT_METRIC`]).
    pub fn calls_in_flight(&self) -> Option<f64> {
        self.named_metrics
            .get(IN_FLIGHT_METRIC)
            .copied()
            .filter(|v| v.is_finite() && *v >= 0.0)
    }
}

/// A name made once: looking up a `&str` would parse and check it on every response.
static NAME: http::HeaderName = http::HeaderName::from_static(TRAILER);

/// Reads and decodes the report in these headers or trailers, if any. Takes the map apart to
/// reuse tonic's base64 decoding, and puts it back as it was.
pub(crate) fn read(map: &mut http::HeaderMap) -> Option<LoadReport> {
    if !map.contains_key(&NAME) {
        return None;
    }
    let md = tonic::metadata::MetadataMap::from_headers(std::mem::take(map));
    let report = md
        .get_bin(TRAILER)
        .and_then(|v| v.to_bytes().ok())
        .and_then(|b| LoadReport::decode(&b));
    *map = md.into_headers();
    report
}

/// The clock of the in-flight estimate: nanoseconds >> 20 (about a millisecond), plus one so
/// that 0 means "no report".
const TICK_SHIFT: u32 = 20;

#[inline]
pub(crate) fn tick(ns: u64) -> u64 {
    (ns >> TICK_SHIFT) + 1
}

/// The bits of [`Others`] that hold the count; the tick takes the other 40 (2^40 ticks of
/// about a millisecond: 36 years of the pool's clock, so that it never wraps).
const COUNT_BITS: u32 = 24;

/// The report settings of one channel (see the `Builder` methods).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    /// Reports older than this many ticks are not used by the least-pending pick (0: never).
    pub(crate) max_age_ticks: u32,
    pub(crate) wrr: WrrConfig,
    /// Out-of-band reports asked of every instance at this interval, if on.
    pub(crate) oob: Option<Duration>,
}

/// The default [`Builder::load_report_max_age`](crate::Builder::load_report_max_age).
pub const DEFAULT_LOAD_REPORT_MAX_AGE: Duration = Duration::from_secs(1);

impl Default for Settings {
    fn default() -> Settings {
        Settings::new(DEFAULT_LOAD_REPORT_MAX_AGE, WrrConfig::default())
    }
}

impl Settings {
    pub(crate) fn new(max_age: Duration, wrr: WrrConfig) -> Settings {
        let ticks = (max_age.as_nanos() >> TICK_SHIFT).min(u128::from(u32::MAX / 2)) as u32;
        // A non-zero age shorter than a tick still uses reports of the same tick.
        let max_age_ticks = if max_age.is_zero() { 0 } else { ticks.max(1) };
        Settings {
            max_age_ticks,
            wrr,
            oob: None,
        }
    }
}

/// The other clients' calls in flight on one instance as of its last load report, while that
/// report is fresh: the tick until which it is fresh (high 40 bits) and the count (low 24
/// bits); 0: none. Apart from the rest of [`Reported`] so that it sits in the cache line of
/// the instance that the pick reads.
#[derive(Debug, Default)]
pub(crate) struct Others(AtomicU64);

impl Others {
    /// The other clients' calls in flight on this instance, from a report still fresh at
    /// `now_tick` ([`tick`] of the pick's clock); 0 when there is none. Read for every
    /// candidate of every least-pending pick while some instance's report is fresh (see
    /// [`Fresh`]): one load, a compare and a select. A report from after
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
/// calls (0: none ever). While it is past, every instance's [`Others`] reads 0, and the pick
/// scans without reading them: a channel whose servers send no reports (or whose reports went
/// stale) pays nothing for them per candidate.
#[derive(Debug, Default)]
pub(crate) struct Fresh(AtomicU64);

impl Fresh {
    /// An instance's count is fresh until `until`. A plain load first: with per-call reports
    /// this runs on every response, and the word moves at most once a tick.
    #[inline]
    pub(crate) fn note(&self, until: u64) {
        if until > self.0.load(Ordering::Relaxed) {
            self.0.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Whether some instance may have a count fresh at `now_tick` (see [`Others::get`]).
    #[inline]
    pub(crate) fn any(&self, now_tick: u64) -> bool {
        self.0.load(Ordering::Relaxed) >= now_tick
    }
}

/// What one instance reported last, as the pick reads it: atomics only.
pub(crate) struct Reported {
    /// Weighted round robin's state (gRFC A58).
    pub(crate) wrr: crate::wrr::EndpointWeight,
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

    /// The last report, if any.
    pub(crate) fn last(&self) -> Option<Arc<LoadReport>> {
        self.last.load_full()
    }
}

/// Reads the load report in a response's trailers (or trailers-only head) from `inst`, if
/// there is one, and keeps what the pick needs of it. Called while the call's guard still
/// counts the call.
#[inline]
pub(crate) fn take_report(inst: &crate::instance::Instance, map: &mut http::HeaderMap) {
    // Most responses have none: one lookup, and the rest out of line.
    if map.contains_key(&NAME) {
        take_report_slow(inst, map);
    }
}

#[inline(never)]
fn take_report_slow(inst: &crate::instance::Instance, map: &mut http::HeaderMap) {
    let Some(report) = read(map) else { return };
    let policy = &inst.policy;
    let now = policy.now_ns();
    // The pick's coarse clock moves on with every report.
    policy.clock.fetch_max(now, Ordering::Relaxed);
    let own = inst.in_flight.load(Ordering::Relaxed);
    tracing::trace!(addr = %inst.target.name, own, in_flight = ?report.calls_in_flight(), "load report");
    observe(inst, report, own, now);
}

/// Takes in a report from `inst`, received at `now_ns` while this channel had `own` calls in
/// flight there (the call that carried it included, as the server counted it).
pub(crate) fn observe(
    inst: &crate::instance::Instance,
    report: LoadReport,
    own: usize,
    now_ns: u64,
) {
    let policy = &inst.policy;
    keep(
        &inst.others,
        &policy.reports_fresh,
        &inst.reported,
        report,
        own,
        now_ns,
        &policy.orca,
    );
}

/// What [`observe`] keeps, and where.
fn keep(
    others_now: &Others,
    fresh: &Fresh,
    reported: &Reported,
    report: LoadReport,
    own: usize,
    now_ns: u64,
    settings: &Settings,
) {
    if let Some(total) = report.calls_in_flight() {
        let others = (total.round() - own as f64).clamp(0.0, f64::from(u32::MAX)) as u64;
        fresh.note(others_now.set(others, now_ns, settings.max_age_ticks));
    }
    reported.wrr.update(&report, now_ns, &settings.wrr);
    reported.last.store(Some(Arc::new(report)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-flight estimate uses only fresh reports: a report at most the age old counts,
    /// an older one does not, and a report from the future (the coarse clock lags) counts.
    #[test]
    fn others_only_while_fresh() {
        let s = Settings::new(Duration::from_millis(100), WrrConfig::default());
        let r = Others::default();
        let at = 5_000_000_000u64;
        assert_eq!(r.get(tick(at)), 0);
        r.set(7, at, s.max_age_ticks);
        assert_eq!(r.get(tick(at)), 7);
        assert_eq!(r.get(tick(at + 90_000_000)), 7);
        assert_eq!(r.get(tick(at + 200_000_000)), 0);
        // The pick's clock may lag the report's.
        assert_eq!(r.get(tick(at - 50_000_000)), 7);
        let off = Settings::new(Duration::ZERO, WrrConfig::default());
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
        let longest = Settings::new(Duration::MAX, WrrConfig::default());
        r.set(7, at, longest.max_age_ticks);
        assert_eq!(r.get(tick(at - 1_000_000_000)), 7);
        assert_eq!(r.get(tick(at + 86_400_000_000_000)), 7);
        // A count past 24 bits is kept as the most it can hold.
        r.set(u64::MAX, at, s.max_age_ticks);
        assert_eq!(r.get(tick(at)), (1 << COUNT_BITS) - 1);
    }

    /// A report's count of the other clients' calls is its total minus this channel's own
    /// (never below zero); a report without the metric leaves the estimate alone. The
    /// channel's [`Fresh`] says some count is fresh exactly while one is.
    #[test]
    fn observe_subtracts_own_calls() {
        let s = Settings::default();
        let r = Reported::default();
        let o = Others::default();
        let f = Fresh::default();
        assert!(!f.any(tick(0)));
        // A report without the metric: nothing fresh.
        keep(&o, &f, &r, LoadReport::default(), 1, 1_000, &s);
        assert!(!f.any(tick(1_000)));
        let mut rep = LoadReport::default();
        rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), 12.0);
        keep(&o, &f, &r, rep.clone(), 4, 1_000, &s);
        assert_eq!(o.get(tick(1_000)), 8);
        assert!(f.any(tick(1_000)));
        rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), 2.0);
        keep(&o, &f, &r, rep, 4, 1_000, &s);
        assert_eq!(o.get(tick(1_000)), 0);
        let mut other = LoadReport::default();
        other.named_metrics.insert(IN_FLIGHT_METRIC.into(), 9.0);
        keep(&o, &f, &r, other, 1, 1_000, &s);
        keep(&o, &f, &r, LoadReport::default(), 1, 2_000, &s);
        assert_eq!(o.get(tick(2_000)), 8);
        assert_eq!(r.last().as_deref(), Some(&LoadReport::default()));
        // Fresh for the max age (1 s) after the last count, and no longer.
        let until = tick(1_000) + u64::from(s.max_age_ticks);
        assert!(f.any(until));
        assert_eq!(o.get(until), 8);
        assert!(!f.any(until + 1));
        assert_eq!(o.get(until + 1), 0);
        // Reports not kept (max age 0): nothing fresh.
        let off = Settings::new(Duration::ZERO, WrrConfig::default());
        let f = Fresh::default();
        let mut rep = LoadReport::default();
        rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), 12.0);
        keep(&o, &f, &r, rep, 4, 1_000, &off);
        assert!(!f.any(tick(1_000)));
    }

    /// A report with a negative, infinite or NaN in-flight metric is not used for the count.
    #[test]
    fn nonsense_in_flight_is_ignored() {
        for v in [-1.0, f64::NAN, f64::INFINITY] {
            let mut rep = LoadReport::default();
            rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), v);
            assert_eq!(rep.calls_in_flight(), None);
        }
    }

    /// Peak EWMA weighs this channel's own calls only: a report of the other clients' calls,
    /// which least pending counts, does not move it (its latency already carries that load).
    #[tokio::test]
    async fn peak_ewma_ignores_reported_calls() {
        use crate::Strategy;
        for (strategy, want) in [(Strategy::PeakEwma, 0), (Strategy::LeastPending, 1)] {
            let ch = crate::BalancedChannel::builder()
                .strategy(strategy)
                .uri("http://127.0.0.1:1")
                .uri("http://127.0.0.1:2")
                .build()
                .unwrap();
            let pool = &ch.pool;
            let snap = pool.snapshot();
            let now = pool.policy.now_ns().max(1);
            pool.policy.clock.fetch_max(now, Ordering::Relaxed);
            for (inst, ns) in snap.iter().zip([2e6f64, 4e6]) {
                inst.latency_ns.store(ns.to_bits(), Ordering::Relaxed);
                inst.latency_at.store(now, Ordering::Relaxed);
            }
            let until = snap[0].others.set(10, now, pool.policy.orca.max_age_ticks);
            pool.policy.reports_fresh.note(until);
            let picked =
                crate::pick::dispatch::pick(pool, &snap, &[], crate::tiebreak::Method::NONE);
            assert_eq!(picked, Some(want), "{strategy:?}");
        }
    }
}
