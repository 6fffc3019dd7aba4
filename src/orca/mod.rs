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

#[cfg(feature = "orca")]
pub use handle::OrcaHandle;
#[cfg(feature = "orca")]
pub use layer::{OrcaBody, OrcaFuture, OrcaLayer, OrcaService};
#[cfg(feature = "orca")]
pub use oob_server::{OobService, DEFAULT_MIN_REPORT_INTERVAL};

pub use crate::load::report::{LoadReport, IN_FLIGHT_METRIC};
pub use crate::load::reported::DEFAULT_LOAD_REPORT_MAX_AGE;
pub use crate::load::weight::WrrConfig;

pub use crate::load::report::TRAILER;
