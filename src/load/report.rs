//! An ORCA load report as an instance sent it ([`LoadReport`], gRFC A51): what `reported.rs` keeps
//! of it for the pick and `weight.rs` weighs, both reading this one type.
//!
//! Sources:
//! [gRFC A51](https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md).

use std::collections::BTreeMap;

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
    /// The instance's calls in flight, if it reports them (a finite value ≥ 0 of the named
    /// metric [`IN_FLIGHT_METRIC`]).
    pub fn calls_in_flight(&self) -> Option<f64> {
        self.named_metrics
            .get(IN_FLIGHT_METRIC)
            .copied()
            .filter(|v| v.is_finite() && *v >= 0.0)
    }
}
