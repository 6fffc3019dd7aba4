//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`), named
//! and shaped as gRPC's own OpenTelemetry metrics: per call and attempt (gRFC A66), retries
//! (A96), connections (A94) and outlier ejection (A91), plus the balancer's own per-instance
//! gauges and discovery counters under `tonic_balancer.*`.
//!
//! Install a recorder (an exporter for Prometheus or OpenTelemetry) **before** building the
//! channel: the channel describes its instruments (unit, help) when it is built. Label names
//! are those of gRPC (`grpc.method`, `grpc.target`, `grpc.status`, `grpc.disconnect_error`);
//! a Prometheus exporter writes them with `_` for `.`.
//!
//! | name | kind | unit | labels |
//! | --- | --- | --- | --- |
//! | `grpc.client.attempt.started` | counter | `{attempt}` | method, target |
//! | `grpc.client.attempt.duration` | histogram | s | method, target, status |
//! | `grpc.client.attempt.sent_total_compressed_message_size` | histogram | By | method, target, status |
//! | `grpc.client.attempt.rcvd_total_compressed_message_size` | histogram | By | method, target, status |
//! | `grpc.client.call.duration` | histogram | s | method, target, status |
//! | `grpc.client.call.retries` | histogram | `{retry}` | method, target |
//! | `grpc.client.call.transparent_retries` | histogram | `{transparent_retry}` | method, target |
//! | `grpc.client.call.hedges` | histogram | `{hedge}` | method, target |
//! | `grpc.client.call.retry_delay` | histogram | s | method, target |
//! | `tonic_balancer.client.call.refused` | counter | `{call}` | method, target |
//! | `tonic_balancer.client.retry_budget_exhausted` | counter | `{retry}` | target |
//! | `grpc.subchannel.connection_attempts_succeeded` | counter | `{attempt}` | target, instance |
//! | `grpc.subchannel.connection_attempts_failed` | counter | `{attempt}` | target, instance |
//! | `grpc.subchannel.open_connections` | gauge | `{connection}` | target, instance |
//! | `grpc.subchannel.disconnections` | counter | `{disconnection}` | target, instance, disconnect_error |
//! | `grpc.lb.outlier_detection.ejections_enforced_total` | counter | `{ejection}` | target, instance, reason |
//! | `grpc.lb.outlier_detection.ejections_overflow` | counter | `{ejection}` | target, instance, reason |
//! | `grpc.lb.outlier_detection.ejections_enforced_success_rate` | counter | `{ejection}` | target, instance |
//! | `grpc.lb.outlier_detection.ejections_detected_success_rate` | counter | `{ejection}` | target, instance |
//! | `tonic_balancer.instance.calls_in_flight` | gauge | `{call}` | target, instance |
//! | `tonic_balancer.instance.state` | gauge | 1 or 0 | target, instance, state |
//! | `tonic_balancer.instance.latency` | gauge | s | target, instance |
//! | `tonic_balancer.discovery.lookups` | counter | `{lookup}` | target |
//! | `tonic_balancer.discovery.failures` | counter | `{lookup}` | target |
//! | `tonic_balancer.instances.added` | counter | `{instance}` | target |
//! | `tonic_balancer.instances.removed` | counter | `{instance}` | target |
//!
//! `grpc.method` is the full method name without its leading slash
//! (`pkg.Service/Method`) for the methods registered with
//! [`Builder::metrics_methods`](crate::Builder::metrics_methods) (or every method with
//! [`Builder::metrics_all_methods`](crate::Builder::metrics_all_methods)), `other` for the
//! rest, as A66 asks, so that the label cannot grow without bound. `grpc.target` is the
//! channel's target (`dns:///host:port` for DNS discovery; see
//! [`Builder::metrics_target`](crate::Builder::metrics_target)). The instance label
//! (`tonic_balancer.instance`) is an instance's URI as in
//! [`EndpointStats::uri`](crate::EndpointStats::uri): bounded by the set. When an instance
//! leaves, its gauges are set to 0; an exporter's idle timeout drops them for good.
//!
//! `grpc.subchannel.open_connections` (A94) counts, per instance, its own connection while the
//! instance is known to be connected, plus the extra connections it has open (see
//! [`Builder::max_connections_per_instance`](crate::Builder::max_connections_per_instance)).
//! tonic's `Channel` does not tell whether its connection is up, so the instance's state says:
//! its own connection counts from the first answer on it (`ready`) until it breaks
//! (`connecting`) or cannot be opened (`failing`); an instance out of service (ejected,
//! unhealthy, draining) counts it as it was when it left service, since nothing closes it
//! then. An extra connection counts from when the balancer opens it (its first call connects
//! it) until it closes it, idle. The gauge is sampled with the other per-instance gauges,
//! twice a second.
//!
//! The facade carries no histogram buckets: configure the exporter with
//! [`LATENCY_BUCKETS`] for the `s` histograms, [`SIZE_BUCKETS`] for the message sizes and
//! [`COUNT_BUCKETS`] for the retry counts (A66's boundaries).

#[cfg(feature = "metrics")]
pub use names::*;

/// A66's bucket boundaries for latency histograms, in seconds.
#[cfg(feature = "metrics")]
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// A66's bucket boundaries for size histograms, in bytes (the message sizes per attempt).
#[cfg(feature = "metrics")]
pub const SIZE_BUCKETS: &[f64] = &[
    0.0,
    1024.0,
    2048.0,
    4096.0,
    16384.0,
    65536.0,
    262144.0,
    1048576.0,
    4194304.0,
    16777216.0,
    67108864.0,
    268435456.0,
    1073741824.0,
    4294967296.0,
];

/// A66's bucket boundaries for count histograms (retries per call).
#[cfg(feature = "metrics")]
pub const COUNT_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0,
];

#[cfg(feature = "metrics")]
mod call;
#[cfg(feature = "metrics")]
mod events;
#[cfg(feature = "metrics")]
mod framing;
#[cfg(feature = "metrics")]
mod gauges;
#[cfg(feature = "metrics")]
mod labels;
#[cfg(feature = "metrics")]
mod names;
#[cfg(not(feature = "metrics"))]
mod off;
#[cfg(feature = "metrics")]
mod settings;

#[cfg(feature = "metrics")]
pub(crate) use call::{budget_exhausted, refused, Attempt, Call};
#[cfg(feature = "metrics")]
pub(crate) use events::{
    connection_failed, connection_succeeded, disconnected, discovery_answer, ejection, membership,
};
#[cfg(feature = "metrics")]
pub(crate) use gauges::spawn;
#[cfg(feature = "metrics")]
pub(crate) use labels::{configure, Labels};
#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;
#[cfg(feature = "metrics")]
pub(crate) use settings::LabelSettings;

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::framing::Messages;

    /// A stream of gRPC messages: each its 5-byte prefix and its bytes.
    fn stream(sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, &n) in sizes.iter().enumerate() {
            out.push(0);
            out.extend_from_slice(&(n as u32).to_be_bytes());
            out.extend(std::iter::repeat_n(k as u8, n));
        }
        out
    }

    /// The message bytes are counted, the prefixes left out, however the stream is cut into
    /// frames: whole, byte by byte, and at every cut in two.
    #[test]
    fn message_bytes_are_counted_without_their_prefixes_wherever_frames_cut() {
        let sizes = [3, 0, 300, 1, 70_000];
        let data = stream(&sizes);
        let want: u64 = sizes.iter().sum::<usize>() as u64;
        assert_eq!(Messages::default().payload(&data), want);
        let mut m = Messages::default();
        assert_eq!(data.chunks(1).map(|c| m.payload(c)).sum::<u64>(), want);
        for cut in (0..data.len()).step_by(97).chain([1, 4, 5, 6, 8, 9]) {
            let mut m = Messages::default();
            let (a, b) = data.split_at(cut);
            assert_eq!(m.payload(a) + m.payload(b), want, "cut at {cut}");
        }
        // A length prefix read in pieces (the 4th byte of a 300-byte message's length).
        let mut m = Messages::default();
        assert_eq!(m.payload(&[0, 0, 0, 1]), 0);
        assert_eq!(m.payload(&[44]), 0);
        assert_eq!(m.payload(&[7; 300]), 300);
        assert_eq!(m.payload(&[0, 0, 0, 0, 2, 9]), 1);
    }
}
