//! Server-reported load (ORCA) end to end: tonic servers with `OrcaLayer`, a channel that reads
//! their reports, the reported calls in flight steering the least-pending pick (and not once
//! they are stale), and weighted round robin following the reported utilization.
#![cfg(feature = "orca")]

use fleet_service as fleet;

use std::time::Duration;

use fleet::pb::fleet_client::FleetClient;
use fleet::{stats, wait_until, Behavior, Instance};
use tonic::Code;
use tonic_balancer::orca::WrrConfig;
use tonic_balancer::{BalancedChannel, ServedBy, Strategy};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(30);

/// One unary call; the URI of the instance that answered it.
async fn call(ch: &BalancedChannel) -> String {
    let resp = FleetClient::new(ch.clone())
        .unary(fleet::req(1))
        .await
        .expect("the call succeeds");
    resp.extensions()
        .get::<ServedBy>()
        .expect("ServedBy")
        .uri()
        .to_owned()
}

fn same_uri(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// A server with the layer sends a report on every response, in the trailers of a normal
/// answer and in the head of a trailers-only error, and the channel keeps it per instance:
/// the server's calls in flight (the call itself included), its query and error rates, the
/// utilization the application set.
#[tokio::test]
async fn the_channel_keeps_the_servers_report() {
    let (a, handle) = Instance::start_reporting("a", Behavior::Ok);
    handle.set_application_utilization(0.3);
    handle.set_cpu_utilization(0.5);
    let ch = BalancedChannel::from_static([a.uri()]).unwrap();
    assert!(stats(&ch, &a.uri()).load_report().is_none());
    call(&ch).await;
    let report = stats(&ch, &a.uri())
        .load_report()
        .cloned()
        .expect("a report from the first answer");
    assert_eq!(report.application_utilization, 0.3);
    assert_eq!(report.cpu_utilization, 0.5);
    assert_eq!(report.calls_in_flight(), Some(1.0), "{report:?}");
    assert!(report.rps_fractional >= 1.0, "{report:?}");
    assert_eq!(report.eps, 0.0);
    assert_eq!(handle.in_flight(), 0, "the server's count is released");

    // A trailers-only error carries its report in the head.
    a.set(Behavior::Fail(Code::Unavailable));
    let err = FleetClient::new(ch.clone())
        .unary(fleet::req(2))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let report = stats(&ch, &a.uri()).load_report().cloned().unwrap();
    assert!(report.eps >= 1.0, "the error counted: {report:?}");
}

/// A response without a report, or with one that does not decode, changes nothing: the
/// instance keeps no report, and the caller sees the trailer as the server sent it.
#[tokio::test]
async fn a_missing_or_malformed_report_changes_nothing() {
    // A server whose trailers-only answers carry a report that is not a message:
    // "////" is base64 of 0xff 0xff 0xff (a varint cut short).
    let shared = fleet::Shared::new("garbage", Behavior::Fail(Code::NotFound));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let server = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            |mut r: http::Response<tonic::body::Body>| {
                r.headers_mut().insert(
                    "endpoint-load-metrics-bin",
                    http::HeaderValue::from_static("////"),
                );
                r
            },
        ))
        .add_service(fleet::service(shared.clone()))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener));
    let server = tokio::spawn(server);
    let ch = BalancedChannel::from_static([uri.clone()]).unwrap();
    let err = FleetClient::new(ch.clone())
        .unary(fleet::req(1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(
        err.metadata()
            .get_bin("endpoint-load-metrics-bin")
            .map(|v| v.to_bytes().unwrap()),
        Some(vec![0xff, 0xff, 0xff].into()),
        "the caller sees the trailer as the server sent it"
    );
    assert!(stats(&ch, &uri).load_report().is_none());
    // No report at all: nothing either.
    let plain = Instance::start("plain", Behavior::Ok);
    let ch = BalancedChannel::from_static([plain.uri()]).unwrap();
    call(&ch).await;
    assert!(stats(&ch, &plain.uri()).load_report().is_none());
    server.abort();
}

/// Many clients: another client holds 5 calls on instance A; this channel
/// sees A's reported calls in flight and sends every call to B, while a channel that ignores
/// reports (the control) still sends some to A.
#[tokio::test]
async fn reported_in_flight_steers_the_pick() {
    let (a, _ha) = Instance::start_reporting("a", Behavior::Hold);
    let (b, _hb) = Instance::start_reporting("b", Behavior::Ok);
    // The other client: 5 calls held on A.
    let other = BalancedChannel::from_static([a.uri()]).unwrap();
    let held: Vec<_> = (0..5)
        .map(|id| {
            let mut c = FleetClient::new(other.clone());
            tokio::spawn(async move { c.unary(fleet::req(id)).await })
        })
        .collect();
    wait_until("A holds the other client's 5 calls", LIMIT, || {
        a.held() == 5
    })
    .await;
    a.set(Behavior::Ok);

    let ch = BalancedChannel::builder()
        .uris([a.uri(), b.uri()])
        .load_report_max_age(Duration::from_secs(60))
        .build()
        .unwrap();
    // Until one call reached A, this channel knows nothing of the other client.
    let mut reached_a = false;
    for _ in 0..200 {
        if same_uri(&call(&ch).await, &a.uri()) {
            reached_a = true;
            break;
        }
    }
    assert!(reached_a, "no call reached A among 200");
    assert_eq!(
        stats(&ch, &a.uri())
            .load_report()
            .unwrap()
            .calls_in_flight(),
        Some(6.0),
        "the other client's 5 and ours"
    );
    for i in 0..30 {
        let to = call(&ch).await;
        assert!(same_uri(&to, &b.uri()), "call {i} went to {to}");
    }

    // The control: reports ignored, the two idle-looking instances share the calls.
    let control = BalancedChannel::builder()
        .uris([a.uri(), b.uri()])
        .load_report_max_age(Duration::ZERO)
        .build()
        .unwrap();
    let mut to_a = 0;
    for _ in 0..60 {
        if same_uri(&call(&control).await, &a.uri()) {
            to_a += 1;
        }
    }
    assert!(to_a > 0, "without reports A looks idle and gets calls");

    a.release(5);
    for h in held {
        h.await.unwrap().expect("the held calls succeed");
    }
}

/// A report older than the maximum age is not used: the pick falls back to its own count,
/// and the instance that reported many calls in flight gets calls again.
#[tokio::test]
async fn stale_reports_fall_back_to_the_own_count() {
    let (a, _ha) = Instance::start_reporting("a", Behavior::Hold);
    let (b, _hb) = Instance::start_reporting("b", Behavior::Ok);
    let other = BalancedChannel::from_static([a.uri()]).unwrap();
    let held: Vec<_> = (0..5)
        .map(|id| {
            let mut c = FleetClient::new(other.clone());
            tokio::spawn(async move { c.unary(fleet::req(id)).await })
        })
        .collect();
    wait_until("A holds the other client's 5 calls", LIMIT, || {
        a.held() == 5
    })
    .await;
    a.set(Behavior::Ok);
    let max_age = Duration::from_millis(200);
    let ch = BalancedChannel::builder()
        .uris([a.uri(), b.uri()])
        .load_report_max_age(max_age)
        .build()
        .unwrap();
    let mut reached_a = false;
    for _ in 0..200 {
        if same_uri(&call(&ch).await, &a.uri()) {
            reached_a = true;
            break;
        }
    }
    assert!(reached_a, "no call reached A among 200");
    // The report must age: this wait is the condition itself, not a guess.
    tokio::time::sleep(max_age * 2).await;
    // A still holds the 5 calls, but its report is stale: A looks idle again.
    let mut again = false;
    for _ in 0..200 {
        if same_uri(&call(&ch).await, &a.uri()) {
            again = true;
            break;
        }
    }
    assert!(
        again,
        "A never got a call again after its report went stale"
    );
    a.release(5);
    for h in held {
        h.await.unwrap().expect("the held calls succeed");
    }
}

/// Weighted round robin: an instance that reports a quarter of the other's utilization at
/// the same query rate weighs four times as much, and gets most calls once the weights count;
/// round robin (before the weights) would split them evenly.
#[tokio::test]
async fn weighted_round_robin_follows_reported_utilization() {
    let (a, ha) = Instance::start_reporting("a", Behavior::Ok);
    let (b, hb) = Instance::start_reporting("b", Behavior::Ok);
    ha.set_application_utilization(0.2);
    hb.set_application_utilization(0.8);
    let wrr = WrrConfig::default()
        .blackout_period(Duration::ZERO)
        .weight_update_period(Duration::from_millis(100));
    let ch = BalancedChannel::builder()
        .uris([a.uri(), b.uri()])
        .weighted_round_robin(wrr)
        .build()
        .unwrap();
    assert_eq!(ch.strategy(), Strategy::WeightedRoundRobin);
    let start = std::time::Instant::now();
    loop {
        let (mut to_a, mut to_b) = (0, 0);
        for _ in 0..50 {
            if same_uri(&call(&ch).await, &a.uri()) {
                to_a += 1;
            } else {
                to_b += 1;
            }
        }
        if to_a > 3 * to_b {
            break;
        }
        assert!(
            start.elapsed() < LIMIT,
            "A never got most of the calls: last batch {to_a} to A, {to_b} to B"
        );
    }
}
