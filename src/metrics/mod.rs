//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`), named
//! and shaped as gRPC's own OpenTelemetry metrics: per call and attempt (gRFC A66), retries
//! (A96), connections (A94), outlier ejection (A91) and weighted round robin (A78), plus the
//! balancer's own gauges and discovery counters under `tonic_balancer.*`.
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
//! | `grpc.subchannel.connection_attempts_succeeded` | counter | `{attempt}` | target, \[instance\] |
//! | `grpc.subchannel.connection_attempts_failed` | counter | `{attempt}` | target, \[instance\] |
//! | `grpc.subchannel.open_connections` | gauge | `{connection}` | target, \[instance\] |
//! | `grpc.subchannel.disconnections` | counter | `{disconnection}` | target, \[instance\], disconnect_error |
//! | `grpc.lb.outlier_detection.ejections_enforced_total` | counter | `{ejection}` | target, \[instance\], reason |
//! | `grpc.lb.outlier_detection.ejections_overflow` | counter | `{ejection}` | target, \[instance\], reason |
//! | `grpc.lb.outlier_detection.ejections_enforced_success_rate` | counter | `{ejection}` | target, \[instance\] |
//! | `grpc.lb.outlier_detection.ejections_detected_success_rate` | counter | `{ejection}` | target, \[instance\] |
//! | `grpc.lb.outlier_detection.ejections_enforced_failure_percentage` | counter | `{ejection}` | target, \[instance\] |
//! | `grpc.lb.outlier_detection.ejections_detected_failure_percentage` | counter | `{ejection}` | target, \[instance\] |
//! | `grpc.lb.wrr.rr_fallback` | counter | `{update}` | target |
//! | `grpc.lb.wrr.endpoint_weight_not_yet_usable` | counter | `{endpoint}` | target |
//! | `grpc.lb.wrr.endpoint_weight_stale` | counter | `{endpoint}` | target |
//! | `grpc.lb.wrr.endpoint_weights` | histogram | `{weight}` | target |
//! | `tonic_balancer.instance.calls_in_flight` | gauge | `{call}` | target, \[instance\] |
//! | `tonic_balancer.instance.state` | gauge | `{instance}` | target, \[instance\], state |
//! | `tonic_balancer.instance.latency` | gauge | s | target, instance (only with it) |
//! | `tonic_balancer.discovery.lookups` | counter | `{lookup}` | target |
//! | `tonic_balancer.discovery.failures` | counter | `{lookup}` | target |
//! | `tonic_balancer.instances.added` | counter | `{instance}` | target |
//! | `tonic_balancer.instances.removed` | counter | `{instance}` | target |
//!
//! # Labels
//!
//! **`grpc.method`** is the full method name without its leading slash (`pkg.Service/Method`).
//! By default, the first [`METHOD_LIMIT`] (64) distinct methods a channel calls label
//! themselves and any further one is `other`, as is a path that is not `pkg.Service/Method`.
//! A client's calls come from its generated stubs, whose methods are a fixed set, so every
//! method it calls is labelled with no setting at all; a caller of arbitrary method names (a
//! proxy that passes paths through, a bug) cannot grow the label past the limit. Why 64: a
//! client of one or a few services calls a few to a few dozen methods (most gRPC services
//! define fewer than 30), so the limit is above what real clients call, while each A66
//! histogram labelled by 64 methods is already 64 × 41 latency buckets × the statuses seen:
//! about ten thousand series per target, as many as a label of unchecked names should ever
//! cost. Past the limit, the methods that label themselves are the first called: to choose
//! them, pin them. [`Builder::metrics_methods`](crate::Builder::metrics_methods) pins an exact
//! set (full names, or services for all their methods; a pinned service's methods count
//! against the limit): only those label themselves. [`Builder::metrics_all_methods`](crate::Builder::metrics_all_methods)
//! labels every method, without a limit (A66's opt-in for generic methods). The label of each
//! method is interned on its first call: a call then takes no lock and allocates nothing for it.
//!
//! **`grpc.target`** is the channel's target, as gRPC's: `dns:///host:port` with
//! [`Builder::dns`](crate::Builder::dns), a [`Resolve`](crate::Resolve) source's name,
//! `discovery stream` with a pushed stream of changes. A list given as a gRPC target string
//! ([`Builder::target`](crate::Builder::target): `ipv4:...`, `unix:...`) is that string; one
//! instance named by a host name is `dns:///host:port`, as grpc-go's `NewClient("host:port")`
//! names its channel. Other lists of URIs have no target of their own (gRPC's target is the
//! one URI a channel is made for): they are `static`, the same for every such channel,
//! whatever its URIs (the build says so in an INFO line), set when it is built and unchanged
//! by [`insert`](crate::BalancedChannel::insert) and [`remove`](crate::BalancedChannel::remove),
//! so that it does not change with every deploy's addresses. Name the service with
//! [`Builder::metrics_target`](crate::Builder::metrics_target). Channels with the same target
//! write the same series: their counters and histograms add up, as two gRPC channels to one
//! target do, and so do their gauges (below).
//!
//! **The instance** (`tonic_balancer.instance`, its URI as in
//! [`EndpointStats::uri`](crate::EndpointStats::uri)) is off by default: gRPC's own
//! instruments (A94, A91) have no per-address label, and where instances come and go (pods),
//! a label per address adds a set of series for every address ever seen, for as long as the
//! exporter keeps series that no longer change (metrics-exporter-prometheus keeps them
//! forever unless given an idle timeout). [`Builder::metrics_per_instance`](crate::Builder::metrics_per_instance)
//! turns it on, for the instruments marked \[instance\] above; pair it with an exporter that
//! forgets idle series.
//!
//! The other labels: `grpc.status`, the status code's name; `grpc.disconnect_error`, A94's
//! values (`GOAWAY <CODE>`, `connection reset`, `connection timed out`, `connection aborted`,
//! `socket error`, `unknown`); `tonic_balancer.ejection_reason`, `consecutive_failures`,
//! `probation`, `success_rate` or `failure_percentage`; `tonic_balancer.state`, an instance's state. gRPC's
//! `grpc.lb.locality` and `grpc.lb.backend_service` (xDS) do not apply.
//!
//! # Gauges
//!
//! The gauges are sampled twice a second. Per target (the default), calls in flight and open
//! connections are the sums over the instances, and `tonic_balancer.instance.state` counts the
//! instances in each state (all six states are there, at 0 when none is in it); the latency
//! estimate is per instance only. With the instance label, each instance has its own: 1 for
//! the state it is in, 0 for the others; its calls, connections and latency estimate. When an
//! instance leaves, its series drop to 0.
//!
//! A gauge series that several channels of the process write (the same target; with the
//! instance label, the same instance in two channels) is the sum of what each live channel
//! contributes (the mean, for a latency), as an OpenTelemetry up-down counter adds up its
//! writers. A channel that is dropped withdraws its contributions within one sampling period:
//! its last values never stay beside a live channel's. A series that no live channel writes
//! drops to 0 (an exporter's idle timeout then forgets it).
//!
//! `grpc.subchannel.open_connections` (A94) counts, per instance, its own connection while the
//! instance is known to be connected, plus the extra connections it has open (see
//! [`Builder::max_connections_per_instance`](crate::Builder::max_connections_per_instance)).
//! tonic's `Channel` does not tell whether its connection is up, so the instance's state says:
//! its own connection counts from the first answer on it (`ready`) until it breaks
//! (`connecting`) or cannot be opened (`failing`); an instance out of service (ejected,
//! unhealthy, draining) counts it as it was when it left service, since nothing closes it
//! then. An extra connection counts from when the balancer opens it (its first call connects
//! it) until it closes it, idle.
//!
//! # Weighted round robin (A78)
//!
//! With [`Strategy::WeightedRoundRobin`](crate::Strategy::WeightedRoundRobin), at each update
//! of its schedule (every weight update period), over the instances that could take calls
//! then: `grpc.lb.wrr.endpoint_weight_not_yet_usable` counts those without a usable weight
//! yet (no load report, or within the blackout period), `grpc.lb.wrr.endpoint_weight_stale`
//! those whose last report is older than the expiration period, `grpc.lb.wrr.rr_fallback`
//! counts the update if fewer than two had a weight (round robin then), and
//! `grpc.lb.wrr.endpoint_weights` records each one's weight (0 without a usable one). The
//! counters show from the first update, at 0 until something is counted.
//!
//! # Buckets
//!
//! The facade carries no histogram buckets: configure the exporter with [`HISTOGRAMS`], every
//! histogram's name and buckets: [`LATENCY_BUCKETS`] for the `s` histograms, [`SIZE_BUCKETS`]
//! for the message sizes, [`COUNT_BUCKETS`] for the retry and hedge counts (A66's boundaries)
//! and [`WEIGHT_BUCKETS`] for weighted round robin's weights.
//!
//! Sources: [gRFC A66](https://github.com/grpc/proposal/blob/master/A66-otel-stats.md).

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

/// Bucket boundaries for weighted round robin's weights (`grpc.lb.wrr.endpoint_weights`),
/// which A78 leaves open: OpenTelemetry's default boundaries, which gRPC's own implementations
/// record this histogram with. A weight is queries per second over utilization (see
/// [`orca`](crate::orca)): a server at 100 queries per second and half its CPU weighs 200.
#[cfg(feature = "metrics")]
pub const WEIGHT_BUCKETS: &[f64] = &[
    0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0, 7500.0,
    10000.0,
];

/// Every histogram of the channel, with its bucket boundaries: for an exporter that takes
/// buckets per metric, so that none is left out (metrics-exporter-prometheus renders a
/// histogram without buckets as a summary, which cannot be summed across pods; A66 and A96
/// define histograms).
///
/// ```
/// # #[cfg(feature = "metrics")] {
/// use tonic_balancer::metrics::{HISTOGRAMS, CALL_RETRIES, COUNT_BUCKETS};
///
/// assert!(HISTOGRAMS.contains(&(CALL_RETRIES, COUNT_BUCKETS)));
/// // With metrics-exporter-prometheus:
/// // for (name, buckets) in HISTOGRAMS {
/// //     builder = builder.set_buckets_for_metric(Matcher::Full((*name).into()), buckets)?;
/// // }
/// # }
/// ```
#[cfg(feature = "metrics")]
pub const HISTOGRAMS: &[(&str, &[f64])] = &[
    (ATTEMPT_DURATION, LATENCY_BUCKETS),
    (CALL_DURATION, LATENCY_BUCKETS),
    (ATTEMPT_SENT_SIZE, SIZE_BUCKETS),
    (ATTEMPT_RCVD_SIZE, SIZE_BUCKETS),
    (CALL_RETRIES, COUNT_BUCKETS),
    (CALL_TRANSPARENT_RETRIES, COUNT_BUCKETS),
    (CALL_HEDGES, COUNT_BUCKETS),
    (CALL_RETRY_DELAY, LATENCY_BUCKETS),
    (WRR_ENDPOINT_WEIGHTS, WEIGHT_BUCKETS),
];

/// The most distinct method names that label a channel's metrics by themselves
/// (`grpc.method`); further ones are `other`. See the [module docs](self#labels).
#[cfg(feature = "metrics")]
pub const METHOD_LIMIT: usize = 64;

/// A66's bucket boundaries for count histograms (retries per call).
#[cfg(feature = "metrics")]
pub const COUNT_BUCKETS: &[f64] = &[
    0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0,
];

#[cfg(feature = "metrics")]
mod call;
#[cfg(feature = "metrics")]
mod describe;
#[cfg(feature = "metrics")]
mod events;
#[cfg(feature = "metrics")]
mod framing;
#[cfg(feature = "metrics")]
mod gauges;
#[cfg(feature = "metrics")]
mod labels;
#[cfg(feature = "metrics")]
mod methods;
#[cfg(feature = "metrics")]
mod names;
#[cfg(not(feature = "metrics"))]
mod off;
#[cfg(feature = "metrics")]
mod settings;
#[cfg(feature = "metrics")]
mod wrr;
#[cfg(all(feature = "metrics", feature = "xds"))]
mod xds;

#[cfg(feature = "metrics")]
pub(crate) use call::{budget_exhausted, refused, AttemptMetrics, Call};
#[cfg(feature = "metrics")]
pub(crate) use events::{
    connection_failed, connection_succeeded, disconnected, discovery_answer, ejection, membership,
    outlier_detected,
};
#[cfg(feature = "metrics")]
pub(crate) use labels::{configure, unmatched_methods, Labels};
#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;
#[cfg(feature = "metrics")]
pub(crate) use settings::LabelSettings;
#[cfg(all(feature = "metrics", feature = "xds"))]
pub(crate) use xds::{xds_connected, xds_resources, xds_server_failure, xds_updates};

/// Attaches the metrics of a channel just built: its per-instance gauges (a task that samples
/// them) and weighted round robin's instruments.
#[cfg(feature = "metrics")]
pub(crate) fn spawn<T>(owner: &std::sync::Arc<T>, labels: &Labels)
where
    T: AsRef<crate::set::Set> + AsRef<crate::pick::Picker> + Send + Sync + 'static,
{
    let Some(config) = labels.get() else { return };
    let picker: &crate::pick::Picker = (**owner).as_ref();
    wrr::attach(picker, config.target.clone());
    gauges::spawn(owner, labels);
}

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
