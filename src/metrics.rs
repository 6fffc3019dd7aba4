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
pub use imp::names::*;

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
pub(crate) use imp::*;
#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;

/// Without the feature: nothing, inlined away.
#[cfg(not(feature = "metrics"))]
mod off {
    use std::sync::Arc;

    use crate::instance::Instance;
    use crate::set::Set;

    /// Without the feature, there are no labels to keep.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Labels;

    #[inline(always)]
    pub(crate) fn budget_exhausted(_: &Labels) {}
    #[inline(always)]
    pub(crate) fn ejection(_: &Labels, _: &Instance, _: &'static str, _: bool) {}
    #[inline(always)]
    pub(crate) fn discovery_answer(_: &Labels, _: bool) {}
    #[inline(always)]
    pub(crate) fn membership(_: &Labels, _: usize, _: usize) {}
    #[inline(always)]
    pub(crate) fn connection_succeeded(_: &Labels, _: &Instance) {}
    #[inline(always)]
    pub(crate) fn connection_failed(_: &Labels, _: &Instance) {}
    #[inline(always)]
    pub(crate) fn disconnected(_: &Labels, _: &Instance, _: &(dyn std::error::Error + 'static)) {}
    #[inline(always)]
    pub(crate) fn spawn<T: AsRef<Set> + Send + Sync + 'static>(_: &Arc<T>, _: &Labels) {}
}

#[cfg(feature = "metrics")]
mod imp {
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    use metrics::{Label, SharedString, Unit};

    use self::names::*;
    use crate::error::code_name;
    use crate::instance::events::Kind;
    use crate::instance::{Instance, State};
    use crate::set::Set;

    /// The instruments' names, as in gRPC's metrics designs (A66, A94, A91, A96) where one
    /// applies, under `tonic_balancer.` otherwise.
    pub mod names {
        /// Attempts started (A66), labels method and target.
        pub const ATTEMPT_STARTED: &str = "grpc.client.attempt.started";
        /// Duration of each attempt, from its pick to its end (A66), labels method, target
        /// and status.
        pub const ATTEMPT_DURATION: &str = "grpc.client.attempt.duration";
        /// Duration of each call as its caller sees it (A66), labels method, target, status.
        pub const CALL_DURATION: &str = "grpc.client.call.duration";
        /// Bytes of request messages each attempt sent (A66): the messages as they went out
        /// (compressed if they were), without gRPC's 5-byte message prefix nor HTTP/2 framing.
        pub const ATTEMPT_SENT_SIZE: &str =
            "grpc.client.attempt.sent_total_compressed_message_size";
        /// Bytes of response messages each attempt received (A66), counted as
        /// [`ATTEMPT_SENT_SIZE`].
        pub const ATTEMPT_RCVD_SIZE: &str =
            "grpc.client.attempt.rcvd_total_compressed_message_size";
        /// Retries of the retry policy per call (A96).
        pub const CALL_RETRIES: &str = "grpc.client.call.retries";
        /// Transparent retries per call (A96).
        pub const CALL_TRANSPARENT_RETRIES: &str = "grpc.client.call.transparent_retries";
        /// Hedges per call (A96): attempts made by the hedging policy beside the first.
        pub const CALL_HEDGES: &str = "grpc.client.call.hedges";
        /// Time a call spent waiting between attempts (A96).
        pub const CALL_RETRY_DELAY: &str = "grpc.client.call.retry_delay";
        /// Calls refused at once because no instance was usable.
        pub const CALL_REFUSED: &str = "tonic_balancer.client.call.refused";
        /// Retries the retry budget did not allow.
        pub const RETRY_BUDGET_EXHAUSTED: &str = "tonic_balancer.client.retry_budget_exhausted";
        /// Connections opened to an instance (A94).
        pub const CONNECTION_ATTEMPTS_SUCCEEDED: &str =
            "grpc.subchannel.connection_attempts_succeeded";
        /// Connections to an instance that could not be opened (A94).
        pub const CONNECTION_ATTEMPTS_FAILED: &str = "grpc.subchannel.connection_attempts_failed";
        /// Connections open to an instance (A94): its own one while it is known to be
        /// connected, and its extra ones (see the module docs).
        pub const OPEN_CONNECTIONS: &str = "grpc.subchannel.open_connections";
        /// Connections that broke under calls (A94), label `grpc.disconnect_error`.
        pub const DISCONNECTIONS: &str = "grpc.subchannel.disconnections";
        /// Ejections made (A91), label `tonic_balancer.ejection_reason`.
        pub const EJECTIONS_ENFORCED: &str = "grpc.lb.outlier_detection.ejections_enforced_total";
        /// Outliers not ejected because of the cap on ejected instances (A91).
        pub const EJECTIONS_OVERFLOW: &str = "grpc.lb.outlier_detection.ejections_overflow";
        /// Ejections made by the success-rate rule (A91).
        pub const EJECTIONS_ENFORCED_SUCCESS_RATE: &str =
            "grpc.lb.outlier_detection.ejections_enforced_success_rate";
        /// Outliers found by the success-rate rule, ejected or not (A91).
        pub const EJECTIONS_DETECTED_SUCCESS_RATE: &str =
            "grpc.lb.outlier_detection.ejections_detected_success_rate";
        /// Calls in flight on each instance.
        pub const INSTANCE_CALLS_IN_FLIGHT: &str = "tonic_balancer.instance.calls_in_flight";
        /// 1 for each instance's state, 0 for the others (label `tonic_balancer.state`).
        pub const INSTANCE_STATE: &str = "tonic_balancer.instance.state";
        /// Each instance's latency estimate (the one the pick uses), in seconds.
        pub const INSTANCE_LATENCY: &str = "tonic_balancer.instance.latency";
        /// Answers of the discovery source.
        pub const DISCOVERY_LOOKUPS: &str = "tonic_balancer.discovery.lookups";
        /// Answers of the discovery source that were failures.
        pub const DISCOVERY_FAILURES: &str = "tonic_balancer.discovery.failures";
        /// Instances added to the set.
        pub const INSTANCES_ADDED: &str = "tonic_balancer.instances.added";
        /// Instances removed from the set.
        pub const INSTANCES_REMOVED: &str = "tonic_balancer.instances.removed";

        /// The full method name (`pkg.Service/Method`), or `other`.
        pub const LABEL_METHOD: &str = "grpc.method";
        /// The channel's target.
        pub const LABEL_TARGET: &str = "grpc.target";
        /// The status code's name (`OK`, `UNAVAILABLE`, ...).
        pub const LABEL_STATUS: &str = "grpc.status";
        /// Why a connection broke (A94's values: `GOAWAY NO_ERROR`, `connection reset`, ...).
        pub const LABEL_DISCONNECT_ERROR: &str = "grpc.disconnect_error";
        /// The instance (its URI).
        pub const LABEL_INSTANCE: &str = "tonic_balancer.instance";
        /// An instance state (`connecting`, `ready`, `failing`, `ejected`, `unhealthy`,
        /// `draining`).
        pub const LABEL_STATE: &str = "tonic_balancer.state";
        /// Why an outlier was found (`consecutive_failures`, `probation`, `success_rate`).
        pub const LABEL_EJECTION_REASON: &str = "tonic_balancer.ejection_reason";
    }

    /// How often the per-instance gauges are sampled.
    const GAUGE_PERIOD: Duration = Duration::from_millis(500);

    /// The metrics settings of a [`Builder`](crate::Builder).
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Settings {
        target: Option<String>,
        methods: Vec<String>,
        all_methods: bool,
    }

    impl crate::Builder {
        /// The `grpc.target` label of this channel's metrics (feature `metrics`). The default
        /// is `dns:///host:port` with [`dns`](crate::Builder::dns) discovery, the source's
        /// name with another one, and the instances' URIs joined by `,` for a fixed set.
        pub fn metrics_target(mut self, target: impl Into<String>) -> crate::Builder {
            self.metrics.target = Some(target.into());
            self
        }

        /// The methods whose names label the metrics (`grpc.method`; feature `metrics`): each
        /// `pkg.Service/Method`, or `pkg.Service` for all the methods of a service (those of
        /// your generated stubs). Other methods are labelled `other`, as gRPC's metrics design
        /// (A66) asks, so that a caller of arbitrary method names cannot grow the label
        /// without bound. A malformed name is refused by [`build`](crate::Builder::build).
        ///
        /// ```no_run
        /// # async fn demo() -> Result<(), tonic_balancer::Error> {
        /// let channel = tonic_balancer::BalancedChannel::builder()
        ///     .uri("http://10.0.0.7:50051")
        ///     .metrics_methods(["helloworld.Greeter", "fleet.Fleet/Unary"])
        ///     .build()?;
        /// # let _ = channel; Ok(()) }
        /// ```
        pub fn metrics_methods<I, S>(mut self, methods: I) -> crate::Builder
        where
            I: IntoIterator<Item = S>,
            S: Into<String>,
        {
            self.metrics
                .methods
                .extend(methods.into_iter().map(Into::into));
            self
        }

        /// Labels every method with its own name (feature `metrics`), instead of only the ones
        /// registered with [`metrics_methods`](crate::Builder::metrics_methods): for a client
        /// that calls only the methods of its generated stubs (off by default).
        pub fn metrics_all_methods(mut self, on: bool) -> crate::Builder {
            self.metrics.all_methods = on;
            self
        }
    }

    impl Settings {
        /// Refuses a malformed method name, naming it.
        pub(crate) fn validate(&self) -> Result<(), crate::Error> {
            for m in &self.methods {
                let name = m.strip_prefix('/').unwrap_or(m);
                let ok = !name.is_empty()
                    && name.split('/').count() <= 2
                    && name.split('/').all(|part| {
                        !part.is_empty() && !part.chars().any(|c| c.is_whitespace() || c == '?')
                    });
                if !ok {
                    return Err(crate::Error::InvalidSetting {
                        name: "metrics_methods",
                        reason: format!("{m:?} is not `pkg.Service/Method` nor `pkg.Service`"),
                    });
                }
            }
            if self.target.as_deref() == Some("") {
                return Err(crate::Error::InvalidSetting {
                    name: "metrics_target",
                    reason: "must not be empty".to_owned(),
                });
            }
            Ok(())
        }
    }

    /// The labels of one channel's metrics, once it is built (none: its metrics are off).
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Labels(Arc<std::sync::OnceLock<Config>>);

    impl Labels {
        fn get(&self) -> Option<&Config> {
            self.0.get()
        }
    }

    /// What the metrics of one channel need: its labels.
    #[derive(Debug)]
    pub(crate) struct Config {
        target: SharedString,
        /// Registered methods, without their slash, and their label.
        methods: HashMap<Box<str>, SharedString>,
        /// Services all of whose methods are labelled.
        services: HashSet<Box<str>>,
        all_methods: bool,
    }

    impl Config {
        /// The `grpc.method` label of a request path (`/pkg.Service/Method`).
        fn method(&self, path: &str) -> SharedString {
            let name = path.strip_prefix('/').unwrap_or(path);
            if let Some(label) = self.methods.get(name) {
                return label.clone();
            }
            let known = self.all_methods
                || name
                    .split_once('/')
                    .is_some_and(|(service, _)| self.services.contains(service));
            if known {
                SharedString::from(name.to_owned())
            } else {
                SharedString::const_str("other")
            }
        }
    }

    /// Sets the metrics' labels of a channel just built and describes its instruments to the
    /// recorder. `default_target`: the target label if the builder set none.
    pub(crate) fn configure(labels: &Labels, settings: Settings, default_target: String) {
        let mut methods = HashMap::new();
        let mut services = HashSet::new();
        for m in settings.methods {
            let name = m.strip_prefix('/').unwrap_or(&m);
            if name.contains('/') {
                let label: Arc<str> = Arc::from(name);
                methods.insert(name.into(), SharedString::from(label));
            } else {
                services.insert(name.into());
            }
        }
        let target: Arc<str> = Arc::from(settings.target.unwrap_or(default_target));
        let config = Config {
            target: SharedString::from(target),
            methods,
            services,
            all_methods: settings.all_methods,
        };
        let _ = labels.0.set(config);
        describe();
    }

    fn describe() {
        use metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(ATTEMPT_STARTED, Unit::Count, "RPC attempts started");
        describe_histogram!(
            ATTEMPT_DURATION,
            Unit::Seconds,
            "time of each RPC attempt, from its pick to its end"
        );
        describe_histogram!(
            ATTEMPT_SENT_SIZE,
            Unit::Bytes,
            "bytes of the request messages each RPC attempt sent"
        );
        describe_histogram!(
            ATTEMPT_RCVD_SIZE,
            Unit::Bytes,
            "bytes of the response messages each RPC attempt received"
        );
        describe_histogram!(
            CALL_DURATION,
            Unit::Seconds,
            "time of each RPC as its caller sees it"
        );
        describe_histogram!(CALL_RETRIES, Unit::Count, "retries per call");
        describe_histogram!(
            CALL_TRANSPARENT_RETRIES,
            Unit::Count,
            "transparent retries per call"
        );
        describe_histogram!(CALL_HEDGES, Unit::Count, "hedges per call");
        describe_histogram!(
            CALL_RETRY_DELAY,
            Unit::Seconds,
            "time per call spent waiting between attempts"
        );
        describe_counter!(
            CALL_REFUSED,
            Unit::Count,
            "calls refused because no instance was usable"
        );
        describe_counter!(
            RETRY_BUDGET_EXHAUSTED,
            Unit::Count,
            "retries not made because the retry budget was spent"
        );
        describe_counter!(
            CONNECTION_ATTEMPTS_SUCCEEDED,
            Unit::Count,
            "connections opened to an instance"
        );
        describe_counter!(
            CONNECTION_ATTEMPTS_FAILED,
            Unit::Count,
            "connections to an instance that could not be opened"
        );
        describe_gauge!(
            OPEN_CONNECTIONS,
            Unit::Count,
            "connections open to an instance"
        );
        describe_counter!(
            DISCONNECTIONS,
            Unit::Count,
            "connections to an instance that broke"
        );
        describe_counter!(EJECTIONS_ENFORCED, Unit::Count, "ejections of instances");
        describe_counter!(
            EJECTIONS_OVERFLOW,
            Unit::Count,
            "outliers not ejected because of the cap on ejected instances"
        );
        describe_counter!(
            EJECTIONS_ENFORCED_SUCCESS_RATE,
            Unit::Count,
            "ejections by the success-rate rule"
        );
        describe_counter!(
            EJECTIONS_DETECTED_SUCCESS_RATE,
            Unit::Count,
            "outliers found by the success-rate rule, ejected or not"
        );
        describe_gauge!(
            INSTANCE_CALLS_IN_FLIGHT,
            Unit::Count,
            "calls in flight on each instance"
        );
        describe_gauge!(
            INSTANCE_STATE,
            Unit::Count,
            "1 for the state each instance is in, 0 for the others"
        );
        describe_gauge!(
            INSTANCE_LATENCY,
            Unit::Seconds,
            "each instance's latency estimate"
        );
        describe_counter!(
            DISCOVERY_LOOKUPS,
            Unit::Count,
            "answers of the discovery source"
        );
        describe_counter!(
            DISCOVERY_FAILURES,
            Unit::Count,
            "failed answers of the discovery source"
        );
        describe_counter!(INSTANCES_ADDED, Unit::Count, "instances added to the set");
        describe_counter!(
            INSTANCES_REMOVED,
            Unit::Count,
            "instances removed from the set"
        );
    }

    fn target(labels: &Labels) -> Option<SharedString> {
        labels.get().map(|c| c.target.clone())
    }

    /// The labels of an instance's metrics.
    fn instance_labels(labels: &Labels, inst: &Instance) -> Option<Vec<Label>> {
        let target = target(labels)?;
        Some(vec![
            Label::new(LABEL_TARGET, target),
            Label::new(LABEL_INSTANCE, SharedString::from(inst.target.name.clone())),
        ])
    }

    /// The metrics of one call (its attempts have their own, [`Attempt`]).
    pub(crate) struct Call {
        start: Instant,
        retries: u32,
        transparent: u32,
        hedges: u32,
        delay: Duration,
        method: SharedString,
        target: SharedString,
    }

    impl Call {
        pub(crate) fn new(labels: &Labels, path: &str) -> Option<Call> {
            let config = labels.get()?;
            Some(Call {
                start: Instant::now(),
                retries: 0,
                transparent: 0,
                hedges: 0,
                delay: Duration::ZERO,
                method: config.method(path),
                target: config.target.clone(),
            })
        }

        fn labels(&self) -> [Label; 2] {
            [
                Label::new(LABEL_METHOD, self.method.clone()),
                Label::new(LABEL_TARGET, self.target.clone()),
            ]
        }

        fn labels_with(&self, code: tonic::Code) -> [Label; 3] {
            [
                Label::new(LABEL_METHOD, self.method.clone()),
                Label::new(LABEL_TARGET, self.target.clone()),
                Label::new(LABEL_STATUS, code_name(code)),
            ]
        }

        /// An attempt of the call starts.
        pub(crate) fn attempt(&mut self, kind: Kind) -> Attempt {
            match kind {
                Kind::First => {}
                Kind::Transparent => self.transparent += 1,
                Kind::Retry => self.retries += 1,
                Kind::Hedge => self.hedges += 1,
            }
            metrics::counter!(ATTEMPT_STARTED, self.labels().iter()).increment(1);
            Attempt {
                start: Instant::now(),
                sent: Arc::new(AtomicU64::new(0)),
                rcvd: 0,
                rcvd_messages: Messages::default(),
                method: self.method.clone(),
                target: self.target.clone(),
                recorded: false,
            }
        }

        /// The call waits `delay` before its next attempt.
        pub(crate) fn retrying(&mut self, delay: Duration) {
            self.delay += delay;
        }

        pub(crate) fn finish(&mut self, code: tonic::Code) {
            let took = self.start.elapsed().as_secs_f64();
            metrics::histogram!(CALL_DURATION, self.labels_with(code).iter()).record(took);
            let labels = self.labels();
            metrics::histogram!(CALL_RETRIES, labels.iter()).record(f64::from(self.retries));
            metrics::histogram!(CALL_TRANSPARENT_RETRIES, labels.iter())
                .record(f64::from(self.transparent));
            metrics::histogram!(CALL_HEDGES, labels.iter()).record(f64::from(self.hedges));
            metrics::histogram!(CALL_RETRY_DELAY, labels.iter()).record(self.delay.as_secs_f64());
        }
    }

    /// The metrics of one attempt: recorded when it ends, with its status, or when it is
    /// dropped before (CANCELLED: the call gave it up, or its caller did).
    pub(crate) struct Attempt {
        start: Instant,
        /// Message bytes its request body yielded (written by that body, wherever its
        /// connection polls it).
        sent: Arc<AtomicU64>,
        /// Message bytes of its response, and where its frames stand.
        rcvd: u64,
        rcvd_messages: Messages,
        method: SharedString,
        target: SharedString,
        recorded: bool,
    }

    impl Attempt {
        /// Counts the message bytes that this attempt's request body yields.
        pub(crate) fn count_sent(&self, req: &mut http::Request<tonic::body::Body>) {
            let inner = std::mem::take(req.body_mut());
            *req.body_mut() = tonic::body::Body::new(CountedBody {
                inner,
                sent: self.sent.clone(),
                messages: Messages::default(),
            });
        }

        /// A data frame of the attempt's response body.
        #[inline]
        pub(crate) fn received(&mut self, data: &[u8]) {
            self.rcvd += self.rcvd_messages.payload(data);
        }

        /// The attempt ended with this status: recorded now (once).
        pub(crate) fn ended(&mut self, code: tonic::Code) {
            if std::mem::replace(&mut self.recorded, true) {
                return;
            }
            let took = self.start.elapsed().as_secs_f64();
            let labels = [
                Label::new(LABEL_METHOD, self.method.clone()),
                Label::new(LABEL_TARGET, self.target.clone()),
                Label::new(LABEL_STATUS, code_name(code)),
            ];
            metrics::histogram!(ATTEMPT_DURATION, labels.iter()).record(took);
            let sent = self.sent.load(Ordering::Relaxed);
            metrics::histogram!(ATTEMPT_SENT_SIZE, labels.iter()).record(sent as f64);
            metrics::histogram!(ATTEMPT_RCVD_SIZE, labels.iter()).record(self.rcvd as f64);
        }
    }

    impl Drop for Attempt {
        fn drop(&mut self) {
            self.ended(tonic::Code::Cancelled);
        }
    }

    /// Where a stream of gRPC messages stands: each message is a 5-byte prefix (a compression
    /// flag, then the length, big-endian) and that many bytes, cut into frames anywhere.
    #[derive(Debug, Default, Clone, Copy)]
    pub(crate) struct Messages {
        /// Bytes of the current message still to come.
        left: u64,
        /// Bytes of the current prefix read so far (0 to 4), and its length so far.
        prefix: u8,
        len: u32,
    }

    impl Messages {
        /// The message bytes (prefixes left out) in the next piece of the stream.
        #[inline]
        pub(crate) fn payload(&mut self, mut data: &[u8]) -> u64 {
            let mut bytes = 0;
            while !data.is_empty() {
                if self.left > 0 {
                    let take = self.left.min(data.len() as u64);
                    bytes += take;
                    self.left -= take;
                    data = &data[take as usize..];
                    continue;
                }
                if self.prefix > 0 {
                    self.len = (self.len << 8) | u32::from(data[0]);
                }
                data = &data[1..];
                if self.prefix == 4 {
                    self.left = u64::from(self.len);
                    self.prefix = 0;
                    self.len = 0;
                } else {
                    self.prefix += 1;
                }
            }
            bytes
        }
    }

    pin_project_lite::pin_project! {
        /// An attempt's request body that counts the message bytes it yields.
        struct CountedBody {
            #[pin]
            inner: tonic::body::Body,
            sent: Arc<AtomicU64>,
            messages: Messages,
        }
    }

    impl http_body::Body for CountedBody {
        type Data = bytes::Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>>
        {
            let this = self.project();
            let res = this.inner.poll_frame(cx);
            if let std::task::Poll::Ready(Some(Ok(frame))) = &res {
                if let Some(data) = frame.data_ref() {
                    let n = this.messages.payload(data);
                    if n > 0 {
                        this.sent.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
            res
        }

        fn is_end_stream(&self) -> bool {
            self.inner.is_end_stream()
        }

        fn size_hint(&self) -> http_body::SizeHint {
            self.inner.size_hint()
        }
    }

    pub(crate) fn refused(call: Option<&Call>) {
        if let Some(call) = call {
            metrics::counter!(CALL_REFUSED, call.labels().iter()).increment(1);
        }
    }

    pub(crate) fn budget_exhausted(labels: &Labels) {
        if let Some(target) = target(labels) {
            metrics::counter!(RETRY_BUDGET_EXHAUSTED, LABEL_TARGET => target).increment(1);
        }
    }

    pub(crate) fn ejection(labels: &Labels, inst: &Instance, why: &'static str, enforced: bool) {
        let Some(mut labels) = instance_labels(labels, inst) else {
            return;
        };
        let reason = match why {
            "low success rate" => "success_rate",
            "failed on probation" => "probation",
            _ => "consecutive_failures",
        };
        if reason == "success_rate" {
            if enforced {
                metrics::counter!(EJECTIONS_ENFORCED_SUCCESS_RATE, labels.iter()).increment(1);
            }
            metrics::counter!(EJECTIONS_DETECTED_SUCCESS_RATE, labels.iter()).increment(1);
        }
        labels.push(Label::new(LABEL_EJECTION_REASON, reason));
        if enforced {
            metrics::counter!(EJECTIONS_ENFORCED, labels).increment(1);
        } else {
            metrics::counter!(EJECTIONS_OVERFLOW, labels).increment(1);
        }
    }

    pub(crate) fn discovery_answer(labels: &Labels, failed: bool) {
        let Some(target) = target(labels) else { return };
        metrics::counter!(DISCOVERY_LOOKUPS, LABEL_TARGET => target.clone()).increment(1);
        if failed {
            metrics::counter!(DISCOVERY_FAILURES, LABEL_TARGET => target).increment(1);
        }
    }

    pub(crate) fn membership(labels: &Labels, added: usize, removed: usize) {
        let Some(target) = target(labels) else { return };
        metrics::counter!(INSTANCES_ADDED, LABEL_TARGET => target.clone()).increment(added as u64);
        metrics::counter!(INSTANCES_REMOVED, LABEL_TARGET => target).increment(removed as u64);
    }

    pub(crate) fn connection_succeeded(labels: &Labels, inst: &Instance) {
        if let Some(labels) = instance_labels(labels, inst) {
            metrics::counter!(CONNECTION_ATTEMPTS_SUCCEEDED, labels).increment(1);
        }
    }

    pub(crate) fn connection_failed(labels: &Labels, inst: &Instance) {
        if let Some(labels) = instance_labels(labels, inst) {
            metrics::counter!(CONNECTION_ATTEMPTS_FAILED, labels).increment(1);
        }
    }

    pub(crate) fn disconnected(
        labels: &Labels,
        inst: &Instance,
        error: &(dyn std::error::Error + 'static),
    ) {
        if let Some(mut labels) = instance_labels(labels, inst) {
            labels.push(Label::new(LABEL_DISCONNECT_ERROR, disconnect_error(error)));
            metrics::counter!(DISCONNECTIONS, labels).increment(1);
        }
    }

    /// A94's `grpc.disconnect_error` for the error that broke a connection: the first reason
    /// found in its chain.
    fn disconnect_error(error: &(dyn std::error::Error + 'static)) -> &'static str {
        for err in crate::error::sources(error) {
            if let Some(h2) = err.downcast_ref::<h2::Error>() {
                if h2.is_go_away() {
                    return goaway(h2.reason().map_or(u32::MAX, u32::from));
                }
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                return match io.kind() {
                    std::io::ErrorKind::ConnectionReset => "connection reset",
                    std::io::ErrorKind::TimedOut => "connection timed out",
                    std::io::ErrorKind::ConnectionAborted => "connection aborted",
                    _ => "socket error",
                };
            }
        }
        "unknown"
    }

    fn goaway(code: u32) -> &'static str {
        const NAMES: [&str; 14] = [
            "GOAWAY NO_ERROR",
            "GOAWAY PROTOCOL_ERROR",
            "GOAWAY INTERNAL_ERROR",
            "GOAWAY FLOW_CONTROL_ERROR",
            "GOAWAY SETTINGS_TIMEOUT",
            "GOAWAY STREAM_CLOSED",
            "GOAWAY FRAME_SIZE_ERROR",
            "GOAWAY REFUSED_STREAM",
            "GOAWAY CANCEL",
            "GOAWAY COMPRESSION_ERROR",
            "GOAWAY CONNECT_ERROR",
            "GOAWAY ENHANCE_YOUR_CALM",
            "GOAWAY INADEQUATE_SECURITY",
            "GOAWAY HTTP_1_1_REQUIRED",
        ];
        NAMES.get(code as usize).copied().unwrap_or("unknown")
    }

    /// Spawns the task that samples the per-instance gauges of the set `owner` holds, until
    /// it is dropped.
    pub(crate) fn spawn<T: AsRef<Set> + Send + Sync + 'static>(owner: &Arc<T>, labels: &Labels) {
        let set = (**owner).as_ref();
        if labels.get().is_none() {
            return;
        }
        set.spawn(sample(Arc::downgrade(owner), labels.clone()));
    }

    async fn sample<T: AsRef<Set> + Send + Sync + 'static>(
        owner: std::sync::Weak<T>,
        config: Labels,
    ) {
        let mut tick = tokio::time::interval(GAUGE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The instances reported at the last tick: their labels, and whether their own
        // connection was counted as open.
        let mut seen: HashMap<Arc<str>, (Vec<Label>, bool)> = HashMap::new();
        loop {
            tick.tick().await;
            let Some(owner) = owner.upgrade() else { return };
            let set = (*owner).as_ref();
            let mut now: HashMap<Arc<str>, (Vec<Label>, bool)> = HashMap::new();
            let members = set.snapshot();
            let draining = set.draining();
            for inst in members.iter().chain(draining.iter()) {
                let Some(labels) = instance_labels(&config, inst) else {
                    return;
                };
                let in_flight = inst.in_flight.load(Ordering::Relaxed);
                metrics::gauge!(INSTANCE_CALLS_IN_FLIGHT, labels.iter()).set(in_flight as f64);
                let state = inst.state();
                set_states(&labels, Some(state));
                let ns = f64::from_bits(inst.latency_ns.load(Ordering::Relaxed));
                if ns > 0.0 {
                    metrics::gauge!(INSTANCE_LATENCY, labels.iter()).set(ns * 1e-9);
                }
                let before = seen.get(&inst.target.name).is_some_and(|(_, own)| *own);
                let own = own_connection_open(state, before);
                let extra = inst
                    .extra
                    .as_deref()
                    .map_or(0, crate::instance::conns::Extra::open);
                metrics::gauge!(OPEN_CONNECTIONS, labels.iter())
                    .set((usize::from(own) + extra) as f64);
                now.insert(inst.target.name.clone(), (labels, own));
            }
            for (name, (labels, _)) in seen.drain() {
                if !now.contains_key(&name) {
                    // Gone: nothing in flight, in no state, its connections closed.
                    metrics::gauge!(INSTANCE_CALLS_IN_FLIGHT, labels.iter()).set(0.0);
                    metrics::gauge!(OPEN_CONNECTIONS, labels.iter()).set(0.0);
                    set_states(&labels, None);
                }
            }
            seen = now;
        }
    }

    /// Whether an instance's own connection (the one of its tonic `Channel`) counts as open,
    /// from its state (`before`: whether it counted at the last sample). tonic's `Channel`
    /// does not tell its connection's state; the instance's state does, from what its calls
    /// and connection attempts showed: `Ready` once a call was answered on the connection,
    /// back to `Connecting` when the connection broke, `Failing` when it could not be opened.
    /// An instance out of service (ejected, unhealthy, draining) keeps its connection as it
    /// was: nothing closes it, and no call reports on it meanwhile.
    pub(crate) fn own_connection_open(state: State, before: bool) -> bool {
        match state {
            State::Ready => true,
            State::Connecting | State::Failing => false,
            State::Ejected | State::Unhealthy | State::Draining => before,
        }
    }

    fn set_states(labels: &[Label], current: Option<State>) {
        for s in State::ALL {
            let mut l = labels.to_vec();
            l.push(Label::new(LABEL_STATE, s.as_str()));
            let v = if Some(s) == current { 1.0 } else { 0.0 };
            metrics::gauge!(INSTANCE_STATE, l).set(v);
        }
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::imp::Messages;

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
