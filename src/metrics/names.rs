//! The instruments' names, as in gRPC's metrics designs where one applies, under
//! `tonic_balancer.` otherwise; and the label names. The designs:
//! [A66](https://github.com/grpc/proposal/blob/master/A66-otel-stats.md) (per call and attempt),
//! [A78](https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md) (balancers and the xDS client),
//! [A94](https://github.com/grpc/proposal/blob/master/A94-subchannel-otel-metrics.md) (subchannels),
//! [A91](https://github.com/grpc/proposal/blob/master/A91-outlier-detection-metrics.md) (outlier detection),
//! [A96](https://github.com/grpc/proposal/blob/master/A96-retry-otel-stats.md) (retries and hedges).

/// Attempts started (A66), labels method and target.
pub const ATTEMPT_STARTED: &str = "grpc.client.attempt.started";
/// Duration of each attempt, from its pick to its end (A66), labels method, target
/// and status.
pub const ATTEMPT_DURATION: &str = "grpc.client.attempt.duration";
/// Duration of each call as its caller sees it (A66), labels method, target, status.
pub const CALL_DURATION: &str = "grpc.client.call.duration";
/// Bytes of request messages each attempt sent (A66): the messages as they went out
/// (compressed if they were), without gRPC's 5-byte message prefix nor HTTP/2 framing.
pub const ATTEMPT_SENT_SIZE: &str = "grpc.client.attempt.sent_total_compressed_message_size";
/// Bytes of response messages each attempt received (A66), counted as
/// [`ATTEMPT_SENT_SIZE`].
pub const ATTEMPT_RCVD_SIZE: &str = "grpc.client.attempt.rcvd_total_compressed_message_size";
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
pub const CONNECTION_ATTEMPTS_SUCCEEDED: &str = "grpc.subchannel.connection_attempts_succeeded";
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
/// Ejections made by the failure-percentage rule (A91).
pub const EJECTIONS_ENFORCED_FAILURE_PERCENTAGE: &str =
    "grpc.lb.outlier_detection.ejections_enforced_failure_percentage";
/// Outliers found by the failure-percentage rule, ejected or not (A91).
pub const EJECTIONS_DETECTED_FAILURE_PERCENTAGE: &str =
    "grpc.lb.outlier_detection.ejections_detected_failure_percentage";
/// Calls in flight: per target, or on each instance with the instance label.
pub const INSTANCE_CALLS_IN_FLIGHT: &str = "tonic_balancer.instance.calls_in_flight";
/// The instances in each state (label `tonic_balancer.state`): per target, or with the
/// instance label 1 for each instance's state and 0 for the others.
pub const INSTANCE_STATE: &str = "tonic_balancer.instance.state";
/// Each instance's latency estimate (the one the pick uses), in seconds; with the instance
/// label only.
pub const INSTANCE_LATENCY: &str = "tonic_balancer.instance.latency";
/// Answers of the discovery source.
pub const DISCOVERY_LOOKUPS: &str = "tonic_balancer.discovery.lookups";
/// Answers of the discovery source that were failures.
pub const DISCOVERY_FAILURES: &str = "tonic_balancer.discovery.failures";
/// Instances added to the set.
pub const INSTANCES_ADDED: &str = "tonic_balancer.instances.added";
/// Instances removed from the set.
pub const INSTANCES_REMOVED: &str = "tonic_balancer.instances.removed";
/// Weighted round robin's schedule updates with fewer than two instances with a usable weight,
/// which fell back to round robin (A78).
pub const WRR_RR_FALLBACK: &str = "grpc.lb.wrr.rr_fallback";
/// Instances, counted at each schedule update of weighted round robin, without a usable weight
/// yet: no load report, or one within the blackout period (A78).
pub const WRR_ENDPOINT_WEIGHT_NOT_YET_USABLE: &str = "grpc.lb.wrr.endpoint_weight_not_yet_usable";
/// Instances, counted at each schedule update of weighted round robin, whose last load report
/// is older than the expiration period (A78).
pub const WRR_ENDPOINT_WEIGHT_STALE: &str = "grpc.lb.wrr.endpoint_weight_stale";
/// The weight of each instance at each schedule update of weighted round robin, 0 for one
/// without a usable weight (A78).
pub const WRR_ENDPOINT_WEIGHTS: &str = "grpc.lb.wrr.endpoint_weights";

/// Whether the xDS client's stream to its control plane is up (A78).
pub const XDS_CONNECTED: &str = "grpc.xds_client.connected";
/// The xDS client's control plane going from healthy to unhealthy (A78).
pub const XDS_SERVER_FAILURE: &str = "grpc.xds_client.server_failure";
/// xDS resources received and taken (A78).
pub const XDS_UPDATES_VALID: &str = "grpc.xds_client.resource_updates_valid";
/// xDS resources received and refused (A78).
pub const XDS_UPDATES_INVALID: &str = "grpc.xds_client.resource_updates_invalid";
/// xDS resources the client holds, by cache state and type (A78).
pub const XDS_RESOURCES: &str = "grpc.xds_client.resources";

/// The full method name (`pkg.Service/Method`), or `other` (see the module docs).
pub const LABEL_METHOD: &str = "grpc.method";
/// The channel's target.
pub const LABEL_TARGET: &str = "grpc.target";
/// The xDS control plane's URI (A78).
pub const LABEL_XDS_SERVER: &str = "grpc.xds.server";
/// The xDS authority: `#old` for names that are not `xdstp:` (A78).
pub const LABEL_XDS_AUTHORITY: &str = "grpc.xds.authority";
/// An xDS resource's cache state (A78): `requested`, `does_not_exist`, `acked`, `nacked`.
pub const LABEL_XDS_CACHE_STATE: &str = "grpc.xds.cache_state";
/// An xDS resource type, such as `envoy.config.listener.v3.Listener` (A78).
pub const LABEL_XDS_RESOURCE_TYPE: &str = "grpc.xds.resource_type";
/// The status code's name (`OK`, `UNAVAILABLE`, ...).
pub const LABEL_STATUS: &str = "grpc.status";
/// Why a connection broke (A94's values: `GOAWAY NO_ERROR`, `connection reset`, ...).
pub const LABEL_DISCONNECT_ERROR: &str = "grpc.disconnect_error";
/// The instance (its URI), on the per-instance instruments when
/// [`Builder::metrics_per_instance`](crate::Builder::metrics_per_instance) turns it on.
pub const LABEL_INSTANCE: &str = "tonic_balancer.instance";
/// An instance state (`connecting`, `ready`, `failing`, `ejected`, `unhealthy`,
/// `draining`).
pub const LABEL_STATE: &str = "tonic_balancer.state";
/// Why an outlier was found (`consecutive_failures`, `probation`, `success_rate`,
/// `failure_percentage`).
pub const LABEL_EJECTION_REASON: &str = "tonic_balancer.ejection_reason";
