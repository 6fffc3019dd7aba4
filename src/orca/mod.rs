//! Server-reported load (ORCA, [gRFC A51]): the report an instance attaches to its responses,
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
//!   reported queries, errors and utilization, as [gRFC A58] specifies (see [`WrrConfig`]).
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
//! feature. The server side is one role per file: `handle` (the server's own load), `layer`
//! (`OrcaLayer`), `probe_server` (its answers to probes), `latency` (the probe answer's latency
//! estimate), `rate` (queries and errors per second), `oob_server` (`OobService`).
//!
//! [gRFC A51]: https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md
//! [gRFC A58]: https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md

#[cfg(feature = "orca")]
mod handle;
#[cfg(feature = "orca")]
mod latency;
#[cfg(feature = "orca")]
mod layer;
pub(crate) mod oob;
#[cfg(feature = "orca")]
mod oob_server;
#[cfg(feature = "orca")]
mod probe_server;
#[cfg(feature = "orca")]
mod rate;
mod wire;

#[cfg(feature = "orca")]
pub use handle::OrcaHandle;
#[cfg(feature = "orca")]
pub use layer::{OrcaBody, OrcaFuture, OrcaLayer, OrcaService};
#[cfg(feature = "orca")]
pub use oob_server::{OobService, DEFAULT_MIN_REPORT_INTERVAL};

pub use crate::instance::load::DEFAULT_LOAD_REPORT_MAX_AGE;
use crate::instance::load::{OthersInFlight, ReportSettings, Reported, ReportsFresh};
pub use crate::instance::report::{LoadReport, IN_FLIGHT_METRIC};
pub use crate::instance::wrr_weight::WrrConfig;

/// The trailer that carries a per-call load report (gRFC A51).
pub const TRAILER: &str = "endpoint-load-metrics-bin";

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
    let policy = &inst.ctx;
    let now = policy.now_ns();
    // The pick's coarse clock moves on with every report.
    policy.live.advance_clock(now);
    let own = inst.in_flight();
    tracing::trace!(server.address = %inst.target.name, own, in_flight = ?report.calls_in_flight(), "load report");
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
    let policy = &inst.ctx;
    keep(
        &inst.others,
        &policy.reports_fresh,
        &inst.reported,
        report,
        own,
        now_ns,
        &policy.reports,
    );
}

/// What [`observe`] keeps, and where.
fn keep(
    others_now: &OthersInFlight,
    fresh: &ReportsFresh,
    reported: &Reported,
    report: LoadReport,
    own: usize,
    now_ns: u64,
    settings: &ReportSettings,
) {
    if let Some(total) = report.calls_in_flight() {
        let others = (total.round() - own as f64).clamp(0.0, f64::from(u32::MAX)) as u64;
        fresh.note(others_now.set(others, now_ns, settings.max_age_ticks));
    }
    reported.record(report, now_ns, settings);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::load::{tick, ReportSettings, COUNT_BITS};
    use std::time::Duration;

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

    /// A report's count of the other clients' calls is its total minus this channel's own
    /// (never below zero); a report without the metric leaves the estimate alone. The
    /// channel's [`ReportsFresh`] says some count is fresh exactly while one is.
    #[test]
    fn observe_subtracts_own_calls() {
        let s = ReportSettings::default();
        let r = Reported::default();
        let o = OthersInFlight::default();
        let f = ReportsFresh::default();
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
        let off = ReportSettings::new(Duration::ZERO, WrrConfig::default());
        let f = ReportsFresh::default();
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
}
