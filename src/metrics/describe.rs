//! The instruments of a channel's metrics, described to the recorder (unit, help) when the
//! channel is built, one function per group: the groups gRPC's designs name ([gRFC A66] for
//! calls and attempts, [gRFC A96] for retries, [gRFC A94] for connections, [gRFC A91] for
//! outlier ejection, [gRFC A78] for weighted round robin), and the balancer's own
//! (`tonic_balancer.*`).
//!
//! [gRFC A66]: https://github.com/grpc/proposal/blob/master/A66-otel-stats.md
//! [gRFC A96]: https://github.com/grpc/proposal/blob/master/A96-retry-otel-stats.md
//! [gRFC A94]: https://github.com/grpc/proposal/blob/master/A94-subchannel-otel-metrics.md
//! [gRFC A91]: https://github.com/grpc/proposal/blob/master/A91-outlier-detection-metrics.md
//! [gRFC A78]: https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

use super::names::*;

/// Describes every instrument of the crate to the recorder.
pub(super) fn describe() {
    describe_calls();
    describe_retries();
    describe_refusals();
    describe_connections();
    describe_ejections();
    describe_instances();
    describe_discovery();
    describe_wrr();
    #[cfg(feature = "xds")]
    describe_xds();
}

/// The instruments of calls and attempts (gRFC A66).
fn describe_calls() {
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
}

/// The instruments of retries and hedges (gRFC A96).
fn describe_retries() {
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
}

/// The balancer's own counters of calls and retries it did not make.
fn describe_refusals() {
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
}

/// The instruments of each instance's connections (gRFC A94).
fn describe_connections() {
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
}

/// The instruments of outlier ejection (gRFC A91).
fn describe_ejections() {
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
    describe_counter!(
        EJECTIONS_ENFORCED_FAILURE_PERCENTAGE,
        Unit::Count,
        "ejections by the failure-percentage rule"
    );
    describe_counter!(
        EJECTIONS_DETECTED_FAILURE_PERCENTAGE,
        Unit::Count,
        "outliers found by the failure-percentage rule, ejected or not"
    );
}

/// The balancer's own gauges of its instances.
fn describe_instances() {
    describe_gauge!(
        INSTANCE_CALLS_IN_FLIGHT,
        Unit::Count,
        "calls in flight on each instance"
    );
    describe_gauge!(
        INSTANCE_STATE,
        Unit::Count,
        "instances in each state (with the instance label: 1 for its state, 0 for the others)"
    );
    describe_gauge!(
        INSTANCE_LATENCY,
        Unit::Seconds,
        "each instance's latency estimate"
    );
}

/// The balancer's own counters of discovery and membership.
fn describe_discovery() {
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

/// The instruments of weighted round robin (gRFC A78).
fn describe_wrr() {
    describe_counter!(
        WRR_RR_FALLBACK,
        Unit::Count,
        "weighted round robin schedule updates that fell back to round robin"
    );
    describe_counter!(
        WRR_ENDPOINT_WEIGHT_NOT_YET_USABLE,
        Unit::Count,
        "instances without a usable weight yet, at each weighted round robin schedule update"
    );
    describe_counter!(
        WRR_ENDPOINT_WEIGHT_STALE,
        Unit::Count,
        "instances whose weight is stale, at each weighted round robin schedule update"
    );
    describe_histogram!(
        WRR_ENDPOINT_WEIGHTS,
        Unit::Count,
        "the weight of each instance at each weighted round robin schedule update"
    );
}

/// The xDS client's instruments (gRFC A78).
#[cfg(feature = "xds")]
fn describe_xds() {
    describe_gauge!(
        XDS_CONNECTED,
        Unit::Count,
        "whether the xDS client's stream to its control plane is up"
    );
    describe_counter!(
        XDS_SERVER_FAILURE,
        Unit::Count,
        "the control plane going from healthy to unhealthy"
    );
    describe_counter!(
        XDS_UPDATES_VALID,
        Unit::Count,
        "xDS resources received and taken"
    );
    describe_counter!(
        XDS_UPDATES_INVALID,
        Unit::Count,
        "xDS resources received and refused"
    );
    describe_gauge!(
        XDS_RESOURCES,
        Unit::Count,
        "xDS resources held, by cache state and type"
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    /// The names of the histograms described to it.
    #[derive(Default)]
    struct Described(Arc<Mutex<Vec<String>>>);

    impl Recorder for Described {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
            self.0.lock().unwrap().push(key.as_str().to_owned());
        }
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// Every histogram the channel describes has its buckets in `HISTOGRAMS`, and nothing else
    /// is there: an exporter configured from it renders each as a histogram.
    #[test]
    fn every_histogram_has_its_buckets() {
        let recorder = Described::default();
        metrics::with_local_recorder(&recorder, super::describe);
        let mut described = recorder.0.lock().unwrap().clone();
        described.sort();
        let mut listed: Vec<String> = super::super::HISTOGRAMS
            .iter()
            .map(|(n, _)| (*n).to_owned())
            .collect();
        listed.sort();
        assert_eq!(described, listed);
    }
}
