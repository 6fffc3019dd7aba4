//! The metrics of the `metrics` feature, as a Prometheus scrape shows them: gRPC's standard
//! names (A66, A78, A94, A91, A96) with their units and labels, and values that match the calls
//! made through a real fleet.
#![cfg(feature = "metrics")]
use fleet_service as fleet;

use std::sync::OnceLock;
use std::time::Duration;

use fleet::pb::fleet_client::FleetClient;
use fleet::prom::Scrape;
use fleet::{Behavior, Fleet};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tonic::Code;
use tonic_balancer::metrics::{
    CALL_HEDGES, CALL_RETRIES, CALL_RETRY_DELAY, CALL_TRANSPARENT_RETRIES, COUNT_BUCKETS,
    LATENCY_BUCKETS, METHOD_LIMIT, SIZE_BUCKETS, WEIGHT_BUCKETS, WRR_ENDPOINT_WEIGHTS,
};
use tonic_balancer::{BalancedChannel, Ejection, HedgingPolicy, RetryPolicy, State};

const LIMIT: Duration = Duration::from_secs(20);

/// The process's recorder: one for every test of this file, and the suite's only one (no other
/// module installs one). Each test labels its channel with a target of its own, which no other
/// module's channel has: those record here too once it is installed, under their default
/// targets (`static`, a resolver's name, `dns:///...`).
fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .with_recommended_naming(true)
            .set_buckets_for_metric(Matcher::Suffix(".duration".into()), LATENCY_BUCKETS)
            .unwrap()
            .set_buckets_for_metric(Matcher::Full(CALL_RETRY_DELAY.into()), LATENCY_BUCKETS)
            .unwrap()
            .set_buckets_for_metric(Matcher::Suffix("message_size".into()), SIZE_BUCKETS)
            .unwrap()
            .set_buckets_for_metric(Matcher::Full(CALL_RETRIES.into()), COUNT_BUCKETS)
            .unwrap()
            .set_buckets_for_metric(
                Matcher::Full(CALL_TRANSPARENT_RETRIES.into()),
                COUNT_BUCKETS,
            )
            .unwrap()
            .set_buckets_for_metric(Matcher::Full(CALL_HEDGES.into()), COUNT_BUCKETS)
            .unwrap()
            .set_buckets_for_metric(Matcher::Full(WRR_ENDPOINT_WEIGHTS.into()), WEIGHT_BUCKETS)
            .unwrap()
            .install_recorder()
            .expect("the only recorder of this process")
    })
}

fn scrape() -> Scrape {
    Scrape::parse(recorder().render())
}

const UNARY: &str = "fleet.v1.Fleet/Unary";

/// Calls of a registered method and of another: each instrument of A66 and A96 is there with
/// its unit (seconds for durations), its labels (`grpc_method`, `grpc_target`, `grpc_status`)
/// and A66's buckets; the counts match the calls made; the method not registered is `other`.
/// The per-instance gauges (asked for) show every instance ready with nothing in flight once the
/// calls are over, and a connection opened to each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_and_instance_metrics_match_the_calls_made() {
    recorder();
    let target = "test.calls";
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_target(target)
        .metrics_methods([UNARY])
        .metrics_per_instance(true)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 30).await;
    for id in 0..5 {
        let mut stream = client
            .server_stream(fleet::pb::Req {
                id,
                count: 2,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        while stream.message().await.unwrap().is_some() {}
    }
    let t = ("grpc_target", target);
    let unary = [("grpc_method", UNARY), t];
    let other = [("grpc_method", "other"), t];
    let ok = [("grpc_method", UNARY), t, ("grpc_status", "OK")];
    // The per-instance gauges are sampled on a period: wait for a sample taken after the calls
    // (all three ready, with a latency), not one from before the connections were up.
    let ready = [t, ("tonic_balancer_state", "ready")];
    fleet::wait_until("every call recorded, nothing in flight", LIMIT, || {
        let s = scrape();
        s.sum("grpc_client_call_duration_seconds_count", &other) == 5.0
            && s.sum("tonic_balancer_instance_calls_in_flight", &[t]) == 0.0
            && s.matching("tonic_balancer_instance_calls_in_flight", &[t])
                .count()
                == 3
            && s.sum("tonic_balancer_instance_state", &ready) == 3.0
            && s.matching("tonic_balancer_instance_latency_seconds", &[t])
                .count()
                == 3
            && s.sum("grpc_subchannel_open_connections", &[t]) == 3.0
    })
    .await;
    let s = scrape();
    assert_eq!(
        s.sum("grpc_client_attempt_started_total", &unary),
        30.0,
        "{}",
        s.text
    );
    assert_eq!(s.sum("grpc_client_attempt_started_total", &other), 5.0);
    assert_eq!(s.sum("grpc_client_call_duration_seconds_count", &ok), 30.0);
    assert_eq!(
        s.sum("grpc_client_attempt_duration_seconds_count", &ok),
        30.0
    );
    let other_ok = [("grpc_method", "other"), t, ("grpc_status", "OK")];
    assert_eq!(
        s.sum("grpc_client_call_duration_seconds_count", &other_ok),
        5.0
    );
    // Seconds, and sane: positive, each call well under the limit.
    let took = s.sum("grpc_client_call_duration_seconds_sum", &ok);
    assert!(took > 0.0 && took < 30.0 * LIMIT.as_secs_f64(), "{took}");
    // A66's latency buckets, cumulative up to every call.
    for le in ["0", "1e-5", "0.00005", "0.0003", "0.013", "0.065", "100"] {
        let le_f: f64 = le.parse().unwrap();
        let bucket = s
            .matching("grpc_client_call_duration_seconds_bucket", &ok)
            .find(|(l, _)| l.get("le").and_then(|v| v.parse::<f64>().ok()) == Some(le_f));
        assert!(bucket.is_some(), "no bucket le={le} in\n{}", s.text);
    }
    let top = s
        .matching("grpc_client_call_duration_seconds_bucket", &ok)
        .find(|(l, _)| l.get("le").map(String::as_str) == Some("+Inf"))
        .map(|(_, v)| v);
    assert_eq!(top, Some(30.0));
    assert_eq!(
        s.kind("grpc_client_call_duration_seconds"),
        Some("histogram")
    );
    assert_eq!(s.kind("grpc_client_attempt_started_total"), Some("counter"));
    // A96: no retry, no transparent retry, no delay in any call.
    assert_eq!(s.sum("grpc_client_call_retries_count", &unary), 30.0);
    assert_eq!(s.sum("grpc_client_call_retries_sum", &unary), 0.0);
    assert_eq!(
        s.sum("grpc_client_call_transparent_retries_sum", &unary),
        0.0
    );
    assert_eq!(
        s.sum("grpc_client_call_retry_delay_seconds_sum", &unary),
        0.0
    );
    // Per instance: labelled by its URI, ready, nothing in flight, one connection each.
    for uri in fleet.uris() {
        let name = fleet::stats(&ch, &uri).uri().to_owned();
        let inst = [t, ("tonic_balancer_instance", name.as_str())];
        assert_eq!(
            s.matching("tonic_balancer_instance_calls_in_flight", &inst)
                .count(),
            1,
            "{name} in\n{}",
            s.text
        );
        let ready = [
            t,
            ("tonic_balancer_instance", name.as_str()),
            ("tonic_balancer_state", "ready"),
        ];
        assert_eq!(s.sum("tonic_balancer_instance_state", &ready), 1.0);
        assert_eq!(
            s.sum("tonic_balancer_instance_state", &inst),
            1.0,
            "one state at a time"
        );
        let latency = s.sum("tonic_balancer_instance_latency_seconds", &inst);
        assert!(latency > 0.0 && latency < LIMIT.as_secs_f64(), "{latency}");
        assert_eq!(
            s.sum("grpc_subchannel_connection_attempts_succeeded_total", &inst),
            1.0
        );
        assert_eq!(
            s.sum("grpc_subchannel_open_connections", &inst),
            1.0,
            "its one connection, ready"
        );
    }
    assert_eq!(s.kind("grpc_subchannel_open_connections"), Some("gauge"));
    assert_eq!(s.sum("tonic_balancer_instances_added_total", &[t]), 3.0);
    assert_eq!(
        s.kind("tonic_balancer_instance_calls_in_flight"),
        Some("gauge")
    );
}

/// One instance of two fails every call with UNAVAILABLE: its attempts show with that status,
/// the retry policy's retries per call add up to the retries made, every call ends OK, and its
/// ejection is counted with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_ejections_are_counted() {
    recorder();
    let target = "test.retries";
    let fleet = Fleet::start(2, Behavior::Ok);
    fleet.instances[0].set(Behavior::Fail(Code::Unavailable));
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(RetryPolicy::default())
        .ejection(Ejection::default().consecutive_failures(2))
        .metrics_target(target)
        .metrics_all_methods(true)
        .metrics_per_instance(true)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut calls = 0;
    while ch.stats().ejections() == 0 {
        assert!(calls < 500, "never ejected:{}", fleet::dump(&ch));
        client.unary(fleet::req(calls)).await.unwrap();
        calls += 1;
    }
    let t = ("grpc_target", target);
    let unary = [("grpc_method", UNARY), t];
    fleet::wait_until("every call recorded", LIMIT, || {
        scrape().sum("grpc_client_call_duration_seconds_count", &unary) == calls as f64
    })
    .await;
    let s = scrape();
    let stats = ch.stats();
    let bad = fleet.instances[0].served() as f64;
    assert!(bad >= 2.0);
    let unavailable = [("grpc_method", UNARY), t, ("grpc_status", "UNAVAILABLE")];
    assert_eq!(
        s.sum("grpc_client_attempt_duration_seconds_count", &unavailable),
        bad,
        "{}",
        s.text
    );
    let ok = [("grpc_method", UNARY), t, ("grpc_status", "OK")];
    assert_eq!(
        s.sum("grpc_client_call_duration_seconds_count", &ok),
        calls as f64
    );
    assert_eq!(
        s.sum("grpc_client_call_retries_sum", &unary),
        stats.retries() as f64
    );
    assert_eq!(stats.retries() as f64, bad);
    assert_eq!(
        s.sum("grpc_client_attempt_started_total", &unary),
        (calls + stats.retries()) as f64
    );
    // Each attempt's message sizes, recorded with its status: the failed ones sent their
    // request and received no message (a trailers-only answer).
    assert_eq!(
        s.sum(
            "grpc_client_attempt_sent_total_compressed_message_size_bytes_count",
            &unavailable
        ),
        bad
    );
    assert_eq!(
        s.sum(
            "grpc_client_attempt_rcvd_total_compressed_message_size_bytes_count",
            &unavailable
        ),
        bad
    );
    assert_eq!(
        s.sum(
            "grpc_client_attempt_rcvd_total_compressed_message_size_bytes_sum",
            &unavailable
        ),
        0.0
    );
    // Backoff before each retry: some delay recorded.
    assert!(s.sum("grpc_client_call_retry_delay_seconds_sum", &unary) > 0.0);
    let name = fleet::stats(&ch, &fleet.instances[0].uri())
        .uri()
        .to_owned();
    let ejected = [
        t,
        ("tonic_balancer_instance", name.as_str()),
        ("tonic_balancer_ejection_reason", "consecutive_failures"),
    ];
    assert_eq!(
        s.sum(
            "grpc_lb_outlier_detection_ejections_enforced_total",
            &ejected
        ),
        stats.ejections() as f64
    );
}

/// An instance that cannot be reached: its failed connection is counted, and the call that
/// then finds nothing usable is counted as refused, with UNAVAILABLE (its method labelled with
/// no setting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_failures_and_refusals_are_counted() {
    recorder();
    let target = "test.refused";
    let uri = fleet::unreachable_uri();
    let ch = BalancedChannel::builder()
        .uri(&uri)
        .metrics_target(target)
        .metrics_per_instance(true)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    assert!(client.unary(fleet::req(1)).await.is_err());
    fleet::wait_until("the instance is failing", LIMIT, || {
        fleet::stats(&ch, &uri).state() == tonic_balancer::State::Failing
    })
    .await;
    assert!(client.unary(fleet::req(2)).await.is_err());
    let t = ("grpc_target", target);
    let s = scrape();
    let name = fleet::stats(&ch, &uri).uri().to_owned();
    let inst = [t, ("tonic_balancer_instance", name.as_str())];
    assert!(
        s.sum("grpc_subchannel_connection_attempts_failed_total", &inst) >= 1.0,
        "{}",
        s.text
    );
    let unary = [("grpc_method", UNARY), t];
    assert_eq!(
        s.sum("tonic_balancer_client_call_refused_total", &unary),
        1.0
    );
    let unavailable = [("grpc_method", UNARY), t, ("grpc_status", "UNAVAILABLE")];
    assert_eq!(
        s.sum("grpc_client_call_duration_seconds_count", &unavailable),
        2.0
    );
    assert_eq!(s.sum("grpc_client_attempt_started_total", &unary), 1.0);
    // The attempt that never reached its instance sent no byte of its request.
    let sent = "grpc_client_attempt_sent_total_compressed_message_size_bytes";
    assert_eq!(s.sum(&format!("{sent}_count"), &unavailable), 1.0);
    assert_eq!(s.sum(&format!("{sent}_sum"), &unavailable), 0.0);
    // Its instance has no connection open.
    assert_eq!(s.sum("grpc_subchannel_open_connections", &inst), 0.0);
}

/// A call its caller gives up on (a timeout of the caller's own, which drops the call) is
/// recorded as CANCELLED, and its instance's in-flight gauge returns to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_call_is_cancelled_and_leaves_nothing_in_flight() {
    recorder();
    let target = "test.cancelled";
    let fleet = Fleet::start(1, Behavior::Hold);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_target(target)
        .metrics_all_methods(true)
        .metrics_per_instance(true)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let call = client.unary(fleet::req(1));
    let t = ("grpc_target", target);
    let name = fleet::stats(&ch, &fleet.uris()[0]).uri().to_owned();
    let inst = [t, ("tonic_balancer_instance", name.as_str())];
    tokio::select! {
        _ = call => panic!("a held call answered"),
        _ = fleet::wait_until("the call shows in flight", LIMIT, || {
            scrape().sum("tonic_balancer_instance_calls_in_flight", &inst) == 1.0
        }) => {}
    }
    let cancelled = [("grpc_method", UNARY), t, ("grpc_status", "CANCELLED")];
    fleet::wait_until(
        "the dropped call recorded, nothing in flight",
        LIMIT,
        || {
            let s = scrape();
            s.sum("grpc_client_call_duration_seconds_count", &cancelled) == 1.0
                && s.sum("tonic_balancer_instance_calls_in_flight", &inst) == 0.0
        },
    )
    .await;
    fleet.release_all(1);
}

/// A discovery source's lookups and failures are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lookups_and_failures_are_counted() {
    struct Broken;
    impl tonic_balancer::Resolve for Broken {
        #[allow(clippy::type_complexity)]
        fn resolve(
            &self,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<std::net::SocketAddr>, tower::BoxError>>
                    + Send
                    + '_,
            >,
        > {
            Box::pin(async { Err("registry down".into()) })
        }

        fn name(&self) -> String {
            "test.discovery".into()
        }
    }
    recorder();
    let ch = BalancedChannel::builder()
        .resolver(Broken)
        .discovery_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let t = [("grpc_target", "test.discovery")];
    fleet::wait_until("three failed lookups", LIMIT, || {
        scrape().sum("tonic_balancer_discovery_failures_total", &t) >= 3.0
    })
    .await;
    let s = scrape();
    assert!(s.sum("tonic_balancer_discovery_lookups_total", &t) >= 3.0);
    assert!(ch.stats().discovery_failures() >= 3);
}

/// A method name that is neither `pkg.Service/Method` nor `pkg.Service` is refused when the
/// channel is built, with an error that names the setting and quotes it; so is an empty target.
#[tokio::test]
async fn malformed_metric_settings_are_refused_at_build() {
    for bad in ["", "/", "a b/c", "pkg.Svc/Method/extra", "pkg.Svc/"] {
        let err = BalancedChannel::builder()
            .uri("http://127.0.0.1:1")
            .metrics_methods([bad])
            .build()
            .expect_err(bad);
        let text = err.to_string();
        assert!(text.contains("metrics_methods"), "{bad:?}: {text}");
        assert!(text.contains(&format!("{bad:?}")), "{bad:?}: {text}");
    }
    let err = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .metrics_target("")
        .build()
        .expect_err("an empty target");
    assert!(err.to_string().contains("metrics_target"), "{err}");
    // Well-formed names, with or without their slash, are accepted.
    BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .metrics_methods(["/fleet.v1.Fleet/Unary", "fleet.v1.Fleet"])
        .build()
        .unwrap();
}

/// A connection that breaks under a call counts as a disconnection of its instance, with one of
/// A94's reasons; the retry the budget then refuses is counted, and so is an instance removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disconnections_spent_budget_and_removals_are_counted() {
    recorder();
    let target = "test.disconnect";
    let mut fleet = Fleet::start(2, Behavior::Ok);
    // A budget of no retry at all.
    let policy = RetryPolicy::default()
        .budget_ratio(0.0)
        .budget_min_per_sec(0);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(policy)
        .metrics_target(target)
        .metrics_per_instance(true)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    // Both connected (ready) first.
    let mut id = 0;
    while fleet.served().contains(&0) {
        assert!(id < 500, "an instance never got a call");
        client.unary(fleet::req(id)).await.unwrap();
        id += 1;
    }
    for i in &fleet.instances {
        i.set(Behavior::Hold);
    }
    let mut held = client.clone();
    let call = tokio::spawn(async move { held.unary(fleet::req(1_000_000)).await });
    fleet::wait_until("the call is held", LIMIT, || fleet.held() == 1).await;
    let k = fleet.instances.iter().position(|i| i.held() == 1).unwrap();
    let name = fleet::stats(&ch, &fleet.instances[k].uri())
        .uri()
        .to_owned();
    fleet.instances[k].stop();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let t = ("grpc_target", target);
    let s = scrape();
    let inst = [t, ("tonic_balancer_instance", name.as_str())];
    let broken: Vec<_> = s
        .matching("grpc_subchannel_disconnections_total", &inst)
        .collect();
    assert_eq!(
        broken.iter().map(|(_, v)| v).sum::<f64>(),
        1.0,
        "{}",
        s.text
    );
    let why = broken[0].0.get("grpc_disconnect_error").unwrap();
    let a94 = [
        "connection reset",
        "connection timed out",
        "connection aborted",
        "socket error",
        "unknown",
    ];
    assert!(
        a94.contains(&why.as_str()) || why.starts_with("GOAWAY "),
        "{why}"
    );
    assert_eq!(
        s.sum("tonic_balancer_client_retry_budget_exhausted_total", &[t]),
        1.0
    );
    assert_eq!(ch.stats().retry_budget_exhausted(), 1);
    let other = fleet.instances[1 - k].uri();
    assert!(ch.remove(&other).unwrap());
    let s = scrape();
    assert_eq!(s.sum("tonic_balancer_instances_removed_total", &[t]), 1.0);
    fleet.release_all(1);
}

/// A66's message sizes: each attempt's request and response message bytes, exactly as prost
/// encodes the messages (compressed size: no compression here), without gRPC's 5-byte message
/// prefixes, for messages of every size (empty, a few bytes, several HTTP/2 frames) and for a
/// client stream of several messages; with A66's size buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_sizes_are_the_bytes_of_each_attempts_messages() {
    use prost::Message;
    recorder();
    let target = "test.sizes";
    let fleet = Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_target(target)
        .metrics_all_methods(true)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let (mut sent, mut rcvd) = (0, 0);
    let sizes = [0usize, 1, 3000, 70_000];
    for (k, &n) in sizes.iter().enumerate() {
        let req = fleet::pb::Req {
            id: k as u64,
            payload: vec![7; n],
            ..Default::default()
        };
        sent += req.encoded_len();
        let reply = client.unary(req).await.unwrap().into_inner();
        assert_eq!(reply.payload.len(), n, "the payload comes back");
        rcvd += reply.encoded_len();
    }
    let parts: Vec<fleet::pb::Req> = [100usize, 20_000, 5]
        .iter()
        .map(|&n| fleet::pb::Req {
            id: n as u64,
            payload: vec![1; n],
            ..Default::default()
        })
        .collect();
    let stream_sent: usize = parts.iter().map(Message::encoded_len).sum();
    let reply = client
        .client_stream(tokio_stream::iter(parts))
        .await
        .unwrap()
        .into_inner();
    let stream_rcvd = reply.encoded_len();
    let t = ("grpc_target", target);
    let unary = [("grpc_method", UNARY), t, ("grpc_status", "OK")];
    let stream = [
        ("grpc_method", "fleet.v1.Fleet/ClientStream"),
        t,
        ("grpc_status", "OK"),
    ];
    fleet::wait_until("every call recorded", LIMIT, || {
        let s = scrape();
        s.sum("grpc_client_call_duration_seconds_count", &unary) == sizes.len() as f64
            && s.sum("grpc_client_call_duration_seconds_count", &stream) == 1.0
    })
    .await;
    let s = scrape();
    let sent_name = "grpc_client_attempt_sent_total_compressed_message_size_bytes";
    let rcvd_name = "grpc_client_attempt_rcvd_total_compressed_message_size_bytes";
    assert_eq!(s.kind(sent_name), Some("histogram"), "{}", s.text);
    assert_eq!(s.kind(rcvd_name), Some("histogram"));
    let n = sizes.len() as f64;
    assert_eq!(s.sum(&format!("{sent_name}_count"), &unary), n);
    assert_eq!(s.sum(&format!("{rcvd_name}_count"), &unary), n);
    assert_eq!(s.sum(&format!("{sent_name}_sum"), &unary), sent as f64);
    assert_eq!(s.sum(&format!("{rcvd_name}_sum"), &unary), rcvd as f64);
    assert_eq!(
        s.sum(&format!("{sent_name}_sum"), &stream),
        stream_sent as f64
    );
    assert_eq!(
        s.sum(&format!("{rcvd_name}_sum"), &stream),
        stream_rcvd as f64
    );
    // A66's size buckets: the empty request in `le="0"`, the 3000-byte one under 4096, the
    // 70,000-byte one under 262144 only.
    let bucket = |name: &str, le: &str| {
        s.matching(&format!("{name}_bucket"), &unary)
            .find(|(l, _)| l.get("le").map(String::as_str) == Some(le))
            .map(|(_, v)| v)
    };
    assert_eq!(bucket(sent_name, "0"), Some(1.0), "{}", s.text);
    assert_eq!(bucket(sent_name, "1024"), Some(2.0));
    assert_eq!(bucket(sent_name, "2048"), Some(2.0));
    assert_eq!(bucket(sent_name, "4096"), Some(3.0));
    assert_eq!(bucket(sent_name, "65536"), Some(3.0));
    assert_eq!(bucket(sent_name, "262144"), Some(4.0));
    assert_eq!(bucket(sent_name, "4294967296"), Some(4.0));
    assert_eq!(bucket(sent_name, "+Inf"), Some(4.0));
}

/// A94's open connections of an instance: none before its first call, its own connection once
/// a call was answered on it, plus each extra connection opened when the others are at their
/// stream limit, back to one when the extra ones close idle, and none once its connection broke
/// and could not be opened again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_count_the_instance_and_its_extra_connections() {
    recorder();
    let target = "test.open";
    let mut fleet = Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .max_connections_per_instance(3)
        .max_streams_per_connection(1)
        .connection_idle_timeout(Duration::from_millis(200))
        .metrics_target(target)
        .metrics_per_instance(true)
        .build()
        .unwrap();
    let name = fleet::stats(&ch, &fleet.uris()[0]).uri().to_owned();
    let inst = [
        ("grpc_target", target),
        ("tonic_balancer_instance", name.as_str()),
    ];
    let open = || {
        scrape()
            .matching("grpc_subchannel_open_connections", &inst)
            .map(|(_, v)| v)
            .next()
    };
    fleet::wait_until("a sample before any call", LIMIT, || open().is_some()).await;
    assert_eq!(open(), Some(0.0), "no connection before the first call");
    let mut client = FleetClient::new(ch.clone());
    client.unary(fleet::req(1)).await.unwrap();
    fleet::wait_until("its own connection", LIMIT, || open() == Some(1.0)).await;
    // Three calls held at once, one stream per connection: two extra connections.
    fleet.instances[0].set(Behavior::Hold);
    let calls: Vec<_> = (0..3)
        .map(|id| {
            let mut c = client.clone();
            tokio::spawn(async move { c.unary(fleet::req(10 + id)).await })
        })
        .collect();
    fleet::wait_until("three calls held", LIMIT, || fleet.held() == 3).await;
    assert_eq!(ch.endpoints()[0].connections(), 3);
    fleet::wait_until("three open connections", LIMIT, || open() == Some(3.0)).await;
    fleet.instances[0].set(Behavior::Ok);
    fleet.release_all(3);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    fleet::wait_until("the extra ones closed, idle", LIMIT, || open() == Some(1.0)).await;
    // Stopped: the next call cannot connect; the instance is failing, nothing open.
    fleet.instances[0].stop();
    let _ = client.unary(fleet::req(2)).await;
    let _ = client.unary(fleet::req(3)).await;
    fleet::wait_until("the instance is failing", LIMIT, || {
        fleet::stats(&ch, &fleet.uris()[0]).state() == tonic_balancer::State::Failing
    })
    .await;
    fleet::wait_until("no connection open", LIMIT, || open() == Some(0.0)).await;
}

/// Hedges are attempts (A66) of one call each (A96): every hedged call counts one call, two
/// attempts started, two attempt durations (the winner's OK, the other CANCELLED: the call gave
/// it up), and one hedge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_are_attempts_of_one_call() {
    recorder();
    let target = "test.hedges";
    let fleet = Fleet::start(2, Behavior::Delay(Duration::from_millis(150)));
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_target(target)
        .metrics_methods([UNARY])
        .hedging(
            HedgingPolicy::new([UNARY], Duration::from_millis(10))
                .max_attempts(2)
                .budget_ratio(10.0),
        )
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 5).await;
    let t = ("grpc_target", target);
    let unary = [("grpc_method", UNARY), t];
    fleet::wait_until("every attempt recorded", LIMIT, || {
        scrape().sum("grpc_client_attempt_duration_seconds_count", &unary) == 10.0
    })
    .await;
    let s = scrape();
    assert_eq!(
        s.sum("grpc_client_call_duration_seconds_count", &unary),
        5.0
    );
    assert_eq!(
        s.sum("grpc_client_attempt_started_total", &unary),
        10.0,
        "{}",
        s.text
    );
    let ok = [("grpc_method", UNARY), t, ("grpc_status", "OK")];
    let cancelled = [("grpc_method", UNARY), t, ("grpc_status", "CANCELLED")];
    assert_eq!(
        s.sum("grpc_client_attempt_duration_seconds_count", &ok),
        5.0
    );
    assert_eq!(
        s.sum("grpc_client_attempt_duration_seconds_count", &cancelled),
        5.0
    );
    assert_eq!(s.sum("grpc_client_call_hedges_count", &unary), 5.0);
    assert_eq!(
        s.sum("grpc_client_call_hedges_sum", &unary),
        5.0,
        "{}",
        s.text
    );
    assert_eq!(s.sum("grpc_client_call_retries_sum", &unary), 0.0);
    assert_eq!(
        s.sum("grpc_client_call_transparent_retries_sum", &unary),
        0.0
    );
    assert_eq!(ch.stats().calls(), 5);
    assert_eq!(ch.stats().hedges(), 5);
}

/// One unary call of `path` (any method name) through the channel; its status.
async fn call_path(ch: &BalancedChannel, path: &str, id: u64) -> Code {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready().await.expect("the channel is ready");
    let path = http::uri::PathAndQuery::try_from(path).expect("a path");
    let codec = tonic_prost::ProstCodec::<fleet::pb::Req, fleet::pb::Req>::default();
    match grpc
        .unary(tonic::Request::new(fleet::req(id)), path, codec)
        .await
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

/// With no setting, the methods a channel calls label its metrics with their own names, up to
/// `METHOD_LIMIT` distinct ones: the first `METHOD_LIMIT` methods called (a real one and the
/// rest unknown to the server, which answers UNIMPLEMENTED) each have their series, the next
/// one and a path that is not `pkg.Service/Method` are `other`, and a method labelled before
/// keeps its label after the limit is reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn methods_label_themselves_up_to_the_limit() {
    recorder();
    let target = "test.methods";
    let fleet = Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_target(target)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    client.unary(fleet::req(0)).await.unwrap();
    let names: Vec<String> = (1..METHOD_LIMIT)
        .map(|i| format!("test.Bounded/Method{i}"))
        .collect();
    for (i, name) in names.iter().enumerate() {
        let code = call_path(&ch, &format!("/{name}"), i as u64).await;
        assert_eq!(code, Code::Unimplemented, "{name}");
    }
    // Past the limit: a new method, then a path that is not a method's full name.
    let code = call_path(&ch, "/test.Bounded/OneTooMany", 100).await;
    assert_eq!(code, Code::Unimplemented);
    let code = call_path(&ch, "/not-a-method", 101).await;
    assert_ne!(code, Code::Ok);
    // The method labelled first still is.
    client.unary(fleet::req(1)).await.unwrap();
    let t = ("grpc_target", target);
    let calls = "grpc_client_call_duration_seconds_count";
    fleet::wait_until("every call recorded", LIMIT, || {
        scrape().sum(calls, &[t]) == (METHOD_LIMIT + 3) as f64
    })
    .await;
    let s = scrape();
    let mut methods: Vec<String> = s
        .matching(calls, &[t])
        .map(|(l, _)| l["grpc_method"].clone())
        .collect();
    methods.sort();
    methods.dedup();
    assert_eq!(methods.len(), METHOD_LIMIT + 1, "{methods:?}");
    assert_eq!(
        s.sum(calls, &[("grpc_method", UNARY), t]),
        2.0,
        "{}",
        s.text
    );
    for name in &names {
        assert_eq!(s.sum(calls, &[("grpc_method", name), t]), 1.0, "{name}");
    }
    assert_eq!(s.sum(calls, &[("grpc_method", "other"), t]), 2.0);
    assert_eq!(
        s.sum(calls, &[("grpc_method", "test.Bounded/OneTooMany"), t]),
        0.0
    );
}

/// The per-instance label is there only when asked for: by default every per-instance
/// instrument is per target (calls in flight and open connections summed over the instances,
/// the state gauge counting the instances in each state, no latency gauge), and no series of
/// the channel names an instance; with `metrics_per_instance(true)`, each instance has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_instance_label_unless_asked() {
    recorder();
    let fleet = Fleet::start(2, Behavior::Ok);
    let mut labelled = Vec::new();
    for (target, per_instance) in [("test.per_target", false), ("test.per_instance", true)] {
        let ch = BalancedChannel::builder()
            .uris(fleet.uris())
            .metrics_target(target)
            .metrics_per_instance(per_instance)
            .build()
            .unwrap();
        make_ready(&ch, &fleet.uris()).await;
        let t = ("grpc_target", target);
        let ready = [t, ("tonic_balancer_state", "ready")];
        let latencies = if per_instance { 2 } else { 0 };
        fleet::wait_until("both instances shown ready", LIMIT, || {
            let s = scrape();
            s.sum("tonic_balancer_instance_state", &ready) == 2.0
                && s.sum("grpc_subchannel_open_connections", &[t]) == 2.0
                && s.matching("tonic_balancer_instance_latency_seconds", &[t])
                    .count()
                    == latencies
        })
        .await;
        let s = scrape();
        let with_instance: Vec<&str> = s
            .text
            .lines()
            .filter(|l| l.contains(&format!("grpc_target=\"{target}\"")))
            .filter(|l| l.contains("tonic_balancer_instance="))
            .collect();
        if per_instance {
            for uri in fleet.uris() {
                let name = fleet::stats(&ch, &uri).uri().to_owned();
                let inst = [t, ("tonic_balancer_instance", name.as_str())];
                assert_eq!(
                    s.sum("grpc_subchannel_connection_attempts_succeeded_total", &inst),
                    1.0,
                    "{}",
                    s.text
                );
                assert_eq!(s.sum("tonic_balancer_instance_state", &inst), 1.0);
                assert!(s.sum("tonic_balancer_instance_latency_seconds", &inst) > 0.0);
            }
            labelled = with_instance.iter().map(|l| l.to_string()).collect();
        } else {
            assert!(with_instance.is_empty(), "{with_instance:#?}");
            assert_eq!(
                s.sum("grpc_subchannel_connection_attempts_succeeded_total", &[t]),
                2.0,
                "{}",
                s.text
            );
            assert_eq!(
                s.matching("tonic_balancer_instance_calls_in_flight", &[t])
                    .count(),
                1
            );
            assert_eq!(s.sum("tonic_balancer_instance_calls_in_flight", &[t]), 0.0);
            assert_eq!(s.matching("tonic_balancer_instance_state", &[t]).count(), 6);
            assert_eq!(s.sum("tonic_balancer_instance_state", &[t]), 2.0);
        }
    }
    assert!(!labelled.is_empty());
}

/// Calls through `ch` until each of `uris` is ready in it, with a latency estimate.
async fn make_ready(ch: &BalancedChannel, uris: &[String]) {
    let mut client = FleetClient::new(ch.clone());
    let mut id = 0;
    while uris.iter().any(|u| {
        let e = fleet::stats(ch, u);
        e.state() != State::Ready || e.latency().is_none()
    }) {
        assert!(id < 500, "an instance never got ready:{}", fleet::dump(ch));
        client.unary(fleet::req(id)).await.unwrap();
        id += 1;
    }
}

/// Two channels of one target, one over both instances and one over the first only: the
/// gauges add up what both see (three instances ready, three connections), and once the first
/// channel is dropped they show the live one's alone: its one instance ready, one connection,
/// nothing left of the instance only the dropped channel had. With the instance label and
/// without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_channel_leaves_no_gauges_beside_a_live_one() {
    recorder();
    let fleet = Fleet::start(2, Behavior::Ok);
    let uris = fleet.uris();
    for (target, per_instance) in [("test.two", false), ("test.two_instances", true)] {
        let build = |uris: &[String]| {
            BalancedChannel::builder()
                .uris(uris)
                .metrics_target(target)
                .metrics_per_instance(per_instance)
                .build()
                .unwrap()
        };
        let both = build(&uris);
        let one = build(&uris[..1]);
        make_ready(&both, &uris).await;
        make_ready(&one, &uris[..1]).await;
        let t = ("grpc_target", target);
        let ready = [t, ("tonic_balancer_state", "ready")];
        fleet::wait_until("both channels' instances counted", LIMIT, || {
            let s = scrape();
            s.sum("tonic_balancer_instance_state", &ready) == 3.0
                && s.sum("tonic_balancer_instance_state", &[t]) == 3.0
                && s.sum("grpc_subchannel_open_connections", &[t]) == 3.0
        })
        .await;
        let gone = fleet::stats(&both, &uris[1]).uri().to_owned();
        drop(both);
        fleet::wait_until("only the live channel's gauges", LIMIT, || {
            let s = scrape();
            s.sum("tonic_balancer_instance_state", &ready) == 1.0
                && s.sum("tonic_balancer_instance_state", &[t]) == 1.0
                && s.sum("grpc_subchannel_open_connections", &[t]) == 1.0
                && s.sum("tonic_balancer_instance_calls_in_flight", &[t]) == 0.0
        })
        .await;
        if per_instance {
            // The instance only the dropped channel had: its series at 0.
            let s = scrape();
            let inst = [t, ("tonic_balancer_instance", gone.as_str())];
            assert_eq!(
                s.matching("tonic_balancer_instance_state", &inst).count(),
                6
            );
            assert_eq!(
                s.sum("tonic_balancer_instance_state", &inst)
                    + s.sum("grpc_subchannel_open_connections", &inst),
                0.0,
                "{}",
                s.text
            );
        }
        drop(one);
        fleet::wait_until("nothing left once both are dropped", LIMIT, || {
            let s = scrape();
            s.sum("tonic_balancer_instance_state", &[t]) == 0.0
                && s.sum("grpc_subchannel_open_connections", &[t]) == 0.0
        })
        .await;
    }
}

/// Weighted round robin's instruments (gRFC A78), at each schedule update: before any load
/// report, each instance's weight is not yet usable (counted, and recorded as 0) and the
/// update falls back to round robin (counted); once the reports come, the weights recorded are
/// the instances' own; once they stop for longer than the expiration period, each instance's
/// weight is stale (counted).
#[cfg(feature = "orca")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_round_robin_records_a78_instruments() {
    use tonic_balancer::orca::WrrConfig;
    recorder();
    let target = "test.wrr";
    let (a, ha) = fleet::Instance::start_reporting("a", Behavior::Ok);
    let (b, hb) = fleet::Instance::start_reporting("b", Behavior::Ok);
    ha.set_application_utilization(0.2);
    hb.set_application_utilization(0.8);
    let wrr = WrrConfig::default()
        .blackout_period(Duration::ZERO)
        .weight_update_period(Duration::from_millis(100))
        .weight_expiration_period(Duration::from_millis(500));
    let ch = BalancedChannel::builder()
        .uris([a.uri(), b.uri()])
        .weighted_round_robin(wrr)
        .metrics_target(target)
        .build()
        .unwrap();
    let t = [("grpc_target", target)];
    let count = |s: &Scrape, name: &str| s.sum(name, &t);
    let weights = "grpc_lb_wrr_endpoint_weights";
    // No call yet, so no report: every update falls back to round robin, with both weights not
    // yet usable, recorded as 0.
    fleet::wait_until("updates without any weight", LIMIT, || {
        let s = scrape();
        count(&s, "grpc_lb_wrr_rr_fallback_total") >= 1.0
            && count(&s, "grpc_lb_wrr_endpoint_weight_not_yet_usable_total") >= 2.0
            && count(&s, &format!("{weights}_count")) >= 2.0
    })
    .await;
    let s = scrape();
    assert_eq!(s.kind(weights), Some("histogram"), "{}", s.text);
    assert_eq!(s.kind("grpc_lb_wrr_rr_fallback_total"), Some("counter"));
    assert_eq!(count(&s, "grpc_lb_wrr_endpoint_weight_stale_total"), 0.0);
    let zero = s
        .matching(&format!("{weights}_bucket"), &t)
        .find(|(l, _)| l.get("le").map(String::as_str) == Some("0"))
        .map(|(_, v)| v);
    assert!(zero.is_some_and(|z| z >= 2.0), "{}", s.text);
    // Calls, whose answers carry the reports: the weights count.
    let mut client = FleetClient::new(ch.clone());
    let start = std::time::Instant::now();
    let mut id = 0;
    while scrape().sum(&format!("{weights}_sum"), &t) == 0.0 {
        assert!(
            start.elapsed() < LIMIT,
            "no weight recorded:{}",
            fleet::dump(&ch)
        );
        client.unary(fleet::req(id)).await.unwrap();
        id += 1;
    }
    // No more calls: no more reports; past the expiration period, both weights are stale.
    let stale = count(&scrape(), "grpc_lb_wrr_endpoint_weight_stale_total");
    fleet::wait_until("stale weights counted", LIMIT, || {
        count(&scrape(), "grpc_lb_wrr_endpoint_weight_stale_total") >= stale + 2.0
    })
    .await;
}

/// A channel over a list of URIs with no `metrics_target` is labelled `static`: one target
/// whatever its addresses, the same after `insert` and `remove` (it was the URIs joined by
/// commas, frozen at build: a new series for each deploy's addresses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_uris_is_target_static() {
    recorder();
    let fleet = Fleet::start(2, Behavior::Ok);
    let [a, b] = [0, 1].map(|i| fleet.uris()[i].clone());
    let ch = BalancedChannel::builder().uri(&a).build().unwrap();
    let mut client = FleetClient::new(ch.clone());
    client.unary(fleet::req(0)).await.unwrap();
    ch.insert(tonic::transport::Endpoint::from_shared(b.clone()).unwrap())
        .unwrap();
    assert_eq!(ch.remove(&a), Ok(true));
    client.unary(fleet::req(1)).await.unwrap();
    let calls = "grpc_client_call_duration_seconds_count";
    let t = [("grpc_target", "static"), ("grpc_method", UNARY)];
    fleet::wait_until("both calls recorded under `static`", LIMIT, || {
        scrape().sum(calls, &t) >= 2.0
    })
    .await;
    let s = scrape();
    assert!(
        !s.text.lines().any(|l| l.contains("grpc_target=\"http")),
        "a target named by addresses: {}",
        s.text
    );
}

/// A list given as a gRPC target string is labelled with it, as gRPC labels a channel with
/// the target it was made with (A66); one instance named by a host name with the target
/// grpc-go gives `NewClient("host:port")`, `dns:///host:port`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_given_as_a_target_string_is_labelled_with_it() {
    recorder();
    let fleet = Fleet::start(2, Behavior::Ok);
    let [a, b] = [0, 1].map(|i| fleet.instances[i].addr().port());
    let target = format!("ipv4:127.0.0.1:{a},127.0.0.1:{b}");
    let by_name = format!("dns:///localhost:{a}");
    for (ch, label) in [
        (BalancedChannel::for_target(&target).unwrap(), &target),
        (
            BalancedChannel::from_static([format!("http://localhost:{a}")]).unwrap(),
            &by_name,
        ),
    ] {
        FleetClient::new(ch).unary(fleet::req(0)).await.unwrap();
        let t = [("grpc_target", label.as_str()), ("grpc_method", UNARY)];
        fleet::wait_until(&format!("the call recorded under {label}"), LIMIT, || {
            scrape().sum("grpc_client_call_duration_seconds_count", &t) >= 1.0
        })
        .await;
    }
}

/// The xDS client's instruments (A78), against go-control-plane: resources taken and refused
/// by type, the resources held by state, and the control plane's health, lost when it dies
/// (the stream fails without a response) and back with its first response after a restart.
#[cfg(feature = "xds")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_xds_client_counts_its_updates_and_its_control_planes_health() {
    use fleet::xds::{Cluster, ClusterEndpoints, ControlPlane, Health, Locality, Policy, Snapshot};
    recorder();
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let fleet = Fleet::start(1, Behavior::Ok);
    let snapshot =
        |v: &str, cluster: Cluster| {
            Snapshot::new(v)
                .listener_rds("svc", "route-svc")
                .route("route-svc", "svc")
                .cluster(cluster)
                .endpoints(ClusterEndpoints::new("svc").locality(
                    Locality::new("r1", "z1").endpoint(fleet.instances[0].addr, Health::Healthy, 1),
                ))
        };
    cp.set(&snapshot("1", Cluster::eds("svc")));
    let bootstrap = tonic_balancer::xds::Bootstrap::from_json(&cp.bootstrap("metrics")).unwrap();
    let ch = BalancedChannel::builder()
        .xds("xds:///svc")
        .xds_bootstrap(bootstrap)
        .build()
        .unwrap();
    let server = cp.uri();
    let typed = |t: &'static str| {
        [
            ("grpc_xds_server", server.clone()),
            ("grpc_xds_resource_type", t.to_owned()),
        ]
    };
    let sum = |name: &str, labels: &[(&str, String)]| {
        let l: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        scrape().sum(name, &l)
    };
    let cluster_type = "envoy.config.cluster.v3.Cluster";
    fleet::wait_until("the four resources taken", LIMIT, || {
        sum(
            "grpc_xds_client_resource_updates_valid_total",
            &typed(cluster_type),
        ) >= 1.0
            && sum(
                "grpc_xds_client_resource_updates_valid_total",
                &typed("envoy.config.endpoint.v3.ClusterLoadAssignment"),
            ) >= 1.0
    })
    .await;
    let held = |state: &str| {
        sum(
            "grpc_xds_client_resources",
            &[
                ("grpc_xds_cache_state", state.to_owned()),
                (
                    "grpc_xds_resource_type",
                    "envoy.config.listener.v3.Listener".to_owned(),
                ),
            ],
        )
    };
    assert!(held("acked") >= 1.0, "{}", recorder().render());
    cp.set(&snapshot(
        "2",
        Cluster::eds("svc").policy(Policy::ring_hash(None, None)),
    ));
    fleet::wait_until("the refused cluster counted", LIMIT, || {
        sum(
            "grpc_xds_client_resource_updates_invalid_total",
            &typed(cluster_type),
        ) >= 1.0
    })
    .await;
    let up = [("grpc_xds_server", server.clone())];
    assert_eq!(sum("grpc_xds_client_connected", &up), 1.0);
    cp.kill();
    fleet::wait_until("the control plane's failure counted", LIMIT, || {
        sum("grpc_xds_client_server_failure_total", &up) >= 1.0
            && sum("grpc_xds_client_connected", &up) == 0.0
    })
    .await;
    cp.restart();
    cp.set(&snapshot("3", Cluster::eds("svc")));
    fleet::wait_until("connected again", LIMIT, || {
        sum("grpc_xds_client_connected", &up) == 1.0
    })
    .await;
    drop(ch);
}
