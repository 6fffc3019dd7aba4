//! Wait-for-ready (grpc/grpc `doc/wait-for-ready.md`, grpc-go's `grpc.WaitForReady(true)`):
//! a call that finds no usable instance waits for one, up to its deadline, instead of failing
//! at once with UNAVAILABLE; it goes through connection failures too. Per call with the
//! `WaitForReady` request extension (a service config's `waitForReady` is in
//! `service_config.rs`).
use fleet_service as fleet;

use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::{req, Behavior, Instance};
use tonic::Code;
use tonic_balancer::{Backoff, BalancedChannel, State, WaitForReady};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(20);

/// A request for call `id` with wait-for-ready `on`, and a deadline if `timeout` is given.
fn request(id: u64, on: bool, timeout: Option<Duration>) -> tonic::Request<fleet::pb::Req> {
    let mut r = tonic::Request::new(req(id));
    r.extensions_mut().insert(WaitForReady(on));
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}

/// Reconnects with a short backoff, so that an instance back up is found soon.
fn quick_reconnects() -> Backoff {
    Backoff::default()
        .initial(Duration::from_millis(50))
        .max(Duration::from_millis(200))
}

/// Over an instance that refuses connections, a wait-for-ready call waits for its deadline
/// (DEADLINE_EXCEEDED, not before it), where another call fails at once with UNAVAILABLE. It
/// waits without polling: its attempts after the first are the reconnects that let it try
/// again, none in 300 ms with gRPC's backoff (1 s), one each at most.
#[tokio::test]
async fn a_wait_for_ready_call_waits_for_its_deadline() {
    let ch = BalancedChannel::builder()
        .uri(&fleet::unreachable_uri())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let deadline = Duration::from_millis(300);
    for _ in 0..2 {
        let start = Instant::now();
        let status = client
            .unary(request(1, true, Some(deadline)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(start.elapsed() >= deadline, "{:?}", start.elapsed());
    }
    let again = ch.stats().transparent_retries();
    assert!(
        again <= 2,
        "{again} attempts sent again while the calls waited"
    );
    let status = client.unary(request(2, false, None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// A wait-for-ready call goes through connection failures (TRANSIENT_FAILURE): its instance
/// down, it waits, without a deadline, until the instance is back, then is answered.
#[tokio::test]
async fn a_wait_for_ready_call_goes_once_its_instance_is_back() {
    let mut inst = Instance::start("a", Behavior::Ok);
    let uri = inst.uri();
    inst.kill();
    let ch = BalancedChannel::builder()
        .uri(&uri)
        .backoff(quick_reconnects())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let call = tokio::spawn(async move { client.unary(request(1, true, None)).await });
    fleet::wait_until("the instance failing", LIMIT, || {
        fleet::stats(&ch, &uri).state() == State::Failing
    })
    .await;
    assert!(!call.is_finished(), "{:?}", call.await);
    inst.restart();
    let reply = tokio::time::timeout(LIMIT, call)
        .await
        .expect("answered once the instance is back")
        .unwrap()
        .expect("the instance's answer");
    assert_eq!(reply.into_inner().instance, "a");
}

/// Over an empty set, a wait-for-ready call waits for an instance to join, then is answered;
/// another call fails at once.
#[tokio::test]
async fn a_wait_for_ready_call_waits_for_an_instance_to_join() {
    let inst = Instance::start("a", Behavior::Ok);
    let ch = BalancedChannel::builder().uri(&inst.uri()).build().unwrap();
    assert!(ch.remove(&inst.uri()).unwrap(), "the set is empty");
    let mut client = FleetClient::new(ch.clone());
    let status = client.unary(request(1, false, None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let mut waiting = client.clone();
    let mut call = Box::pin(waiting.unary(request(2, true, None)));
    assert!(
        futures::poll!(&mut call).is_pending(),
        "routed nowhere: waits"
    );
    ch.insert(tonic::transport::Endpoint::from_shared(inst.uri()).unwrap())
        .unwrap();
    let reply = tokio::time::timeout(LIMIT, call)
        .await
        .expect("answered once the instance joined")
        .expect("the instance's answer");
    assert_eq!(reply.into_inner().id, 2);
}

/// An instance out of service (its health check says NOT_SERVING): a wait-for-ready call
/// waits until it says SERVING.
#[cfg(feature = "health-check")]
#[tokio::test]
async fn a_wait_for_ready_call_waits_for_an_unhealthy_instance_to_serve() {
    let inst = Instance::start("a", Behavior::Ok);
    inst.set_serving(false);
    let ch = BalancedChannel::builder()
        .uri(&inst.uri())
        .health_check(tonic_balancer::HealthCheck::default())
        .build()
        .unwrap();
    fleet::wait_until("the instance unhealthy", LIMIT, || {
        fleet::stats(&ch, &inst.uri()).state() == State::Unhealthy
    })
    .await;
    let mut client = FleetClient::new(ch);
    let mut call = Box::pin(client.unary(request(1, true, None)));
    assert!(
        futures::poll!(&mut call).is_pending(),
        "nothing usable: waits"
    );
    inst.set_serving(true);
    let reply = tokio::time::timeout(LIMIT, call)
        .await
        .expect("answered once the instance serves")
        .expect("the instance's answer");
    assert_eq!(reply.into_inner().id, 1);
}
