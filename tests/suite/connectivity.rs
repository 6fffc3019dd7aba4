//! The channel's connectivity state, as gRPC's connectivity semantics define its states
//! (grpc/grpc `doc/connectivity-semantics-and-api.md`) and grpc-go aggregates them over a
//! balancer's subchannels: each transition the doc lists, on real servers on 127.0.0.1, and
//! the wait for a change (grpc-go's `GetState` and `WaitForStateChange`).
use fleet_service as fleet;

use std::time::Duration;

use tokio::task::JoinHandle;

use fleet::pb::fleet_client::FleetClient;
use fleet::{req, Behavior, Instance};
use tonic::transport::Endpoint;
use tonic_balancer::{Backoff, BalancedChannel, Change, ConnectivityState, State};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(20);

use ConnectivityState::{Connecting, Idle, Ready, Shutdown, TransientFailure};

/// Waits until the channel is in `want`, through `wait_for_state_change` (no polling).
async fn wait_for(ch: &BalancedChannel, want: ConnectivityState) {
    let mut state = ch.connectivity();
    let waited = tokio::time::timeout(LIMIT, async {
        while state != want {
            state = ch.wait_for_state_change(state).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "not {want} within {LIMIT:?}: {}",
        ch.connectivity()
    );
}

/// Records the channel's states, from the one it is in now, until it reaches `want`: a task
/// that reads each change as it comes (a watch may still skip a state that lasted less than
/// the task took to wake).
fn record(ch: &BalancedChannel, want: ConnectivityState) -> JoinHandle<Vec<ConnectivityState>> {
    let mut watch = ch.watch_connectivity();
    let mut seen = vec![*watch.borrow_and_update()];
    tokio::spawn(async move {
        while *seen.last().unwrap() != want {
            let changed = tokio::time::timeout(LIMIT, watch.changed()).await;
            assert!(
                matches!(changed, Ok(Ok(()))),
                "not {want} within {LIMIT:?}: {seen:?}"
            );
            let now = *watch.borrow_and_update();
            if seen.last() != Some(&now) {
                seen.push(now);
            }
        }
        seen
    })
}

/// Reconnects with a short backoff, so that an instance back up is found soon.
fn quick_reconnects() -> Backoff {
    Backoff::default()
        .initial(Duration::from_millis(50))
        .max(Duration::from_millis(200))
}

/// IDLE until the first call ("channels start IDLE ... the first RPC makes them leave it"),
/// then CONNECTING while the connection opens, then READY once an instance answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_until_the_first_call_then_connecting_then_ready() {
    let fleet = fleet::Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    assert_eq!(ch.connectivity(), Idle);
    // A state other than the one waited from returns at once.
    assert_eq!(ch.wait_for_state_change(Ready).await, Idle);
    let states = record(&ch, Ready);
    let mut client = FleetClient::new(ch.clone());
    client.unary(req(1)).await.unwrap();
    let seen = states.await.unwrap();
    assert!(
        matches!(seen[..], [Idle, Ready] | [Idle, Connecting, Ready]),
        "{seen:?}"
    );
}

/// A connection that never completes (SYNs dropped) holds the channel in CONNECTING ("the
/// channel is trying to establish a connection"); when its attempt fails, TRANSIENT_FAILURE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_while_a_connection_opens_then_transient_failure() {
    let hole = Endpoint::from_shared(fleet::black_hole_uri())
        .unwrap()
        .connect_timeout(Duration::from_secs(2));
    let ch = BalancedChannel::builder().endpoint(hole).build().unwrap();
    assert_eq!(ch.connectivity(), Idle);
    let states = record(&ch, TransientFailure);
    let mut client = FleetClient::new(ch.clone());
    let call = tokio::spawn(async move { client.unary(req(1)).await });
    let seen = states.await.unwrap();
    assert_eq!(seen, [Idle, Connecting, TransientFailure]);
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

/// READY -> TRANSIENT_FAILURE when the one instance goes away and cannot be reached again;
/// back to CONNECTING when it can (the reconnect in the background found it), and READY with
/// the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_to_transient_failure_and_back() {
    let mut inst = Instance::start("a", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uri(&inst.uri())
        .backoff(quick_reconnects())
        .connect()
        .await
        .unwrap();
    assert_eq!(ch.connectivity(), Ready);
    let mut client = FleetClient::new(ch.clone());
    inst.kill();
    // Calls find out: the connection broke, and opening it again fails.
    let start = std::time::Instant::now();
    while ch.connectivity() != TransientFailure {
        let _ = client.unary(req(1)).await;
        assert!(start.elapsed() < LIMIT, "still {}", ch.connectivity());
        tokio::task::yield_now().await;
    }
    inst.restart();
    wait_for(&ch, Connecting).await;
    client.unary(req(2)).await.unwrap();
    wait_for(&ch, Ready).await;
}

/// One instance ready keeps the channel READY, whatever the others do (an unreachable one
/// in TRANSIENT_FAILURE beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ready_instance_makes_the_channel_ready() {
    let inst = Instance::start("a", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uri(&inst.uri())
        .uri(&fleet::unreachable_uri())
        .connect()
        .await
        .unwrap();
    assert_eq!(ch.connectivity(), Ready);
    fleet::wait_until("the unreachable one failing", LIMIT, || {
        ch.endpoints().iter().any(|e| e.state() == State::Failing)
    })
    .await;
    assert_eq!(ch.connectivity(), Ready);
}

/// With discovery: CONNECTING until the source's first answer (the name is being resolved),
/// IDLE with instances never called, TRANSIENT_FAILURE once the source takes every instance
/// away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_connecting_before_its_answer_and_failing_with_none() {
    let inst = Instance::start("a", Behavior::Ok);
    let (ch, tx) = BalancedChannel::balance_channel::<&'static str>(16).unwrap();
    assert_eq!(ch.connectivity(), Connecting);
    tx.send(Change::Insert("a", inst.endpoint())).await.unwrap();
    wait_for(&ch, Idle).await;
    let mut client = FleetClient::new(ch.clone());
    client.unary(req(1)).await.unwrap();
    wait_for(&ch, Ready).await;
    tx.send(Change::Remove("a")).await.unwrap();
    wait_for(&ch, TransientFailure).await;
}

/// An instance its health check takes out (gRFC A17: NOT_SERVING) is in TRANSIENT_FAILURE,
/// as gRPC shows an unhealthy subchannel to its balancer; SERVING again, READY.
#[cfg(feature = "health-check")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_instance_is_a_transient_failure() {
    let fleet = fleet::Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .health_check(tonic_balancer::HealthCheck::default())
        .uris(fleet.uris())
        .connect()
        .await
        .unwrap();
    let sick = &fleet.instances[0];
    fleet::wait_until("the Watch stream answered", LIMIT, || {
        sick.health_checks() >= 1
    })
    .await;
    wait_for(&ch, Ready).await;
    sick.set_serving(false);
    wait_for(&ch, TransientFailure).await;
    sick.set_serving(true);
    wait_for(&ch, Ready).await;
}

/// Every clone dropped: a watcher that outlives the channel reads SHUTDOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_when_every_clone_is_dropped() {
    let inst = Instance::start("a", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uri(&inst.uri())
        .connect()
        .await
        .unwrap();
    let mut watch = ch.watch_connectivity();
    assert_eq!(*watch.borrow_and_update(), Ready);
    let clone = ch.clone();
    drop(ch);
    assert_eq!(*watch.borrow(), Ready, "a clone still holds the channel");
    drop(clone);
    let state = tokio::time::timeout(LIMIT, watch.wait_for(|s| *s == Shutdown)).await;
    assert!(matches!(state, Ok(Ok(_))), "{state:?}");
}
