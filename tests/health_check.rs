//! Active health checks (grpc.health.v1) take an instance out and bring it back.
#![cfg(feature = "health-check")]
use tonic_balancer_fleet as fleet;

use std::time::Duration;

use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet};
use tonic_balancer::{BalancedChannel, HealthCheck, State};

fn state_of(ch: &BalancedChannel, uri: &str) -> State {
    ch.endpoints()
        .into_iter()
        .find(|e| e.uri() == uri)
        .expect("instance listed")
        .state()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_serving_takes_an_instance_out_and_serving_brings_it_back() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let check = HealthCheck::default()
        .interval(Duration::from_millis(50))
        .timeout(Duration::from_millis(500));
    let b = BalancedChannel::builder()
        .health_check(check)
        .uris(fleet.uris());
    let ch = b.build().unwrap();
    let sick = &fleet.instances[1];
    let sick_uri = sick.uri();
    fleet::wait_until("first health checks", Duration::from_secs(10), || {
        fleet.instances.iter().all(|i| i.health_checks() > 0)
    })
    .await;

    sick.set_serving(false);
    fleet::wait_until("instance marked unhealthy", Duration::from_secs(10), || {
        state_of(&ch, &sick_uri) == State::Unhealthy
    })
    .await;
    let before = sick.served();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 200).await;
    assert_eq!(sick.served(), before, "an unhealthy instance got calls");

    sick.set_serving(true);
    fleet::wait_until("instance back in", Duration::from_secs(10), || {
        state_of(&ch, &sick_uri) == State::Ready
    })
    .await;
    fleet::calls(&mut client, 200).await;
    assert!(sick.served() > before, "a healthy instance got no calls");
}

/// An instance that does not answer health checks in time is taken out too, by the check's
/// timeout (its server is up and its connection open: only the timeout can see it), and comes
/// back once it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_answer_takes_an_instance_out() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let check = HealthCheck::default()
        .interval(Duration::from_millis(50))
        .timeout(Duration::from_millis(200));
    let b = BalancedChannel::builder()
        .health_check(check)
        .uris(fleet.uris());
    let ch = b.build().unwrap();
    let keep = &fleet.instances[0];
    let mute = &fleet.instances[1];
    let mute_uri = mute.uri();
    fleet::wait_until("first health checks", Duration::from_secs(10), || {
        fleet.instances.iter().all(|i| i.health_checks() > 0)
    })
    .await;
    assert!(state_of(&ch, &mute_uri).is_usable());

    mute.set_health_hangs(true);
    let asked = mute.health_checks();
    fleet::wait_until("silent instance out", Duration::from_secs(10), || {
        state_of(&ch, &mute_uri) == State::Unhealthy
    })
    .await;
    assert!(
        mute.health_checks() > asked,
        "no check reached the silent instance"
    );
    assert!(mute.is_running());
    let mut client = FleetClient::new(ch.clone());
    let served = mute.served();
    for id in 0..50 {
        let r = client
            .unary(Req {
                id,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(r.into_inner().instance, keep.name());
    }
    assert_eq!(mute.served(), served, "an unhealthy instance got calls");

    mute.set_health_hangs(false);
    fleet::wait_until("instance back in", Duration::from_secs(10), || {
        state_of(&ch, &mute_uri) == State::Ready
    })
    .await;
    let names = fleet::calls(&mut client, 50).await;
    assert!(names.iter().any(|n| n == mute.name()), "{names:?}");
}

#[tokio::test]
async fn bad_health_check_settings_are_refused() {
    let err = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .health_check(HealthCheck::default().interval(Duration::ZERO))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("health_check"), "{err}");
}
