//! Health checks as gRPC's client-side health checking specifies them (gRFC A17): one
//! `grpc.health.v1.Health/Watch` stream per instance, whose last status decides whether the
//! instance gets calls.
//!
//! Real tonic servers: the fleet's TCP instances where the network is the point (a server
//! stopped and restarted), instances in memory on tokio's paused clock where time is (the
//! backoff between streams, the first answer's timeout, an hour without asking again).
#![cfg(feature = "health-check")]
use fleet_service as fleet;

use std::time::Duration;

use fleet::memory::MemoryInstance;
use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet};
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tonic::Code;
use tonic_balancer::{Backoff, BalancedChannel, HealthCheck, State};
use tonic_health::pb::health_check_response::ServingStatus;

/// Generous bound for conditions that hold within milliseconds on an idle machine.
const LIMIT: Duration = Duration::from_secs(20);

const WATCH: &str = "grpc.health.v1.Health/Watch";

fn state_of(ch: &BalancedChannel, uri: &str) -> State {
    fleet::stats(ch, uri).state()
}

/// Waits, on the test's clock (paused or not), until the instance called `name` is in `state`;
/// returns when it was first seen there.
async fn wait_for_state(ch: &BalancedChannel, name: &str, state: State) -> Instant {
    fleet::wait_until(&format!("{name} {state}"), LIMIT, || {
        state_of(ch, name) == state
    })
    .await;
    Instant::now()
}

/// On the paused clock: the times (since `since`) at which `inst`'s server got its `Watch`
/// calls number `from + 1` to `to`, to the millisecond.
async fn watch_times(inst: &MemoryInstance, from: usize, to: usize, since: Instant) -> Vec<u64> {
    let mut times = Vec::new();
    let mut seen = from;
    let start = std::time::Instant::now();
    while seen < to {
        let now = inst.shared.health_watches();
        while seen < now.min(to) {
            times.push(since.elapsed().as_millis() as u64);
            seen += 1;
        }
        assert!(
            start.elapsed() < LIMIT,
            "{} Watch calls of {to} after {times:?}",
            seen
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    times
}

/// Asserts that each time is the one expected or at most 10 ms later: the test looks every
/// millisecond, and tokio's timers round each deadline up to the next millisecond.
fn assert_times(got: &[u64], want: &[u64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(g >= w && *g <= w + 10, "{got:?} vs {want:?} (ms)");
    }
}

// -------------------------------------------------------------------------------------------
// The protocol: one Watch per instance, whose last status decides.

/// Each instance is watched by one stream, never polled: NOT_SERVING sent on it takes the
/// instance out, SERVING sent on it brings it back, with no other call to the health service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_is_watched_not_polled_and_follows_its_stream() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .health_check(HealthCheck::default())
        .uris(fleet.uris())
        .build()
        .unwrap();
    fleet::wait_until(
        "a Watch stream open on every instance, answered",
        LIMIT,
        || {
            fleet
                .instances
                .iter()
                .all(|i| i.shared.health_watches_open() == 1 && i.health_checks() == 1)
        },
    )
    .await;
    let sick = &fleet.instances[1];
    let sick_uri = sick.uri();

    sick.set_serving(false);
    fleet::wait_until("instance out", LIMIT, || {
        state_of(&ch, &sick_uri) == State::Unhealthy
    })
    .await;
    let before = sick.served();
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 200).await;
    assert!(names.iter().all(|n| n != sick.name()), "{names:?}");
    assert_eq!(sick.served(), before, "an unhealthy instance got calls");

    sick.set_serving(true);
    fleet::wait_until("instance back in", LIMIT, || {
        state_of(&ch, &sick_uri) == State::Ready
    })
    .await;
    let names = fleet::calls(&mut client, 200).await;
    assert!(names.iter().any(|n| n == sick.name()), "{names:?}");

    for i in &fleet.instances {
        assert_eq!(i.shared.health_check_calls(), 0, "{} was polled", i.name());
        assert_eq!(
            i.shared.health_watches(),
            1,
            "{}: one stream for all",
            i.name()
        );
    }
    assert_eq!(
        sick.health_checks(),
        3,
        "SERVING, NOT_SERVING, SERVING: once each"
    );
}

/// Only SERVING is healthy: NOT_SERVING, UNKNOWN and SERVICE_UNKNOWN each take an instance out
/// until SERVING comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_but_serving_takes_an_instance_out() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .health_check(HealthCheck::default())
        .uris(fleet.uris())
        .build()
        .unwrap();
    let x = &fleet.instances[0];
    let uri = x.uri();
    fleet::wait_until("x watched and in", LIMIT, || {
        x.health_checks() == 1 && state_of(&ch, &uri) == State::Ready
    })
    .await;
    for status in [
        ServingStatus::NotServing,
        ServingStatus::Unknown,
        ServingStatus::ServiceUnknown,
    ] {
        x.shared.set_health_status(status);
        fleet::wait_until(&format!("x out on {status:?}"), LIMIT, || {
            state_of(&ch, &uri) == State::Unhealthy
        })
        .await;
        x.set_serving(true);
        fleet::wait_until("x back on SERVING", LIMIT, || {
            state_of(&ch, &uri) == State::Ready
        })
        .await;
    }
    assert_eq!(x.shared.health_watches(), 1);
    assert_eq!(x.shared.health_check_calls(), 0);
}

/// The service name of the settings goes with the Watch (the server as a whole by default).
#[tokio::test(start_paused = true)]
async fn the_service_name_goes_with_the_watch() {
    let named = MemoryInstance::start_with_health("named", Behavior::Ok);
    let whole = MemoryInstance::start_with_health("whole", Behavior::Ok);
    let check = HealthCheck::default().service("fleet.v1.Fleet");
    let _named = named
        .add_to(BalancedChannel::builder().health_check(check))
        .build()
        .unwrap();
    let _whole = whole
        .add_to(BalancedChannel::builder().health_check(HealthCheck::default()))
        .build()
        .unwrap();
    fleet::wait_until("both asked", LIMIT, || {
        named.shared.health_checks() == 1 && whole.shared.health_checks() == 1
    })
    .await;
    assert_eq!(
        named.shared.health_asked(),
        [("Watch", "fleet.v1.Fleet".to_owned())]
    );
    assert_eq!(whole.shared.health_asked(), [("Watch", String::new())]);
}

// -------------------------------------------------------------------------------------------
// Servers without the health service.

/// A server without the health service answers UNIMPLEMENTED: its instance counts as healthy
/// and gets calls, is not asked again on that connection (an hour later, still one Watch),
/// and one warning says so, naming the instance.
#[tokio::test(start_paused = true)]
async fn a_server_without_health_checks_is_healthy_and_not_asked_again() {
    let events = crate::common::Events::default();
    let _guard = events.install();
    // A server with no health service at all, and one whose health service says UNIMPLEMENTED
    // (the same answer on the wire), which counts what it is asked.
    let bare = MemoryInstance::start("bare", Behavior::Ok);
    let refusing = MemoryInstance::start_with_health("refusing", Behavior::Ok);
    refusing.shared.refuse_health(Some(Code::Unimplemented));
    let builder = BalancedChannel::builder().health_check(
        HealthCheck::default()
            .interval(Duration::from_millis(100))
            .timeout(Duration::from_millis(100)),
    );
    let ch = refusing.add_to(bare.add_to(builder)).build().unwrap();
    for name in ["bare", "refusing"] {
        wait_for_state(&ch, name, State::Ready).await;
    }
    assert_eq!(refusing.shared.health_watches(), 1);
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 20).await;
    assert!(names.iter().any(|n| n == "bare"), "{names:?}");
    assert!(names.iter().any(|n| n == "refusing"), "{names:?}");

    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(refusing.shared.health_watches(), 1, "asked again");
    assert_eq!(refusing.shared.health_check_calls(), 0);
    for name in ["bare", "refusing"] {
        assert_eq!(state_of(&ch, name), State::Ready, "{}", fleet::dump(&ch));
    }
    let served = (bare.served(), refusing.served());
    fleet::calls(&mut client, 20).await;
    assert!(bare.served() > served.0 && refusing.served() > served.1);

    let mut warned = events.with("UNIMPLEMENTED");
    warned.sort_by(|a, b| a.1.get("server.address").cmp(&b.1.get("server.address")));
    assert_eq!(warned.len(), 2, "{warned:?}");
    for ((level, fields), name) in warned.iter().zip(["bare", "refusing"]) {
        assert_eq!(*level, tracing::Level::WARN);
        assert_eq!(fields["server.address"], name, "{fields:?}");
        assert_eq!(fields["rpc.method"], WATCH, "{fields:?}");
        assert_eq!(fields["rpc.grpc.status_code"], "12", "{fields:?}");
    }
    assert!(events.with("either").is_empty(), "asked again");
}

// -------------------------------------------------------------------------------------------
// A stream that ends: out, and opened again with backoff.

/// A stream the server ends takes the instance out (A17: TRANSIENT_FAILURE) and is opened
/// again: at once, since it carried an answer, then, while the new ones fail without an
/// answer, after the interval growing as the channel's backoff (1 s, ×1.6); the instance stays
/// out until SERVING comes. An answer resets the backoff: the next failure waits 1 s again.
/// The end of the stream with OK counts as an end like any other.
#[tokio::test(start_paused = true)]
async fn an_ended_stream_is_opened_again_with_backoff_and_the_instance_is_out_meanwhile() {
    let x = MemoryInstance::start_with_health("x", Behavior::Ok);
    let y = MemoryInstance::start_with_health("y", Behavior::Ok);
    let builder = BalancedChannel::builder()
        .backoff(Backoff::default().jitter(0.0))
        .health_check(
            HealthCheck::default()
                .interval(Duration::from_secs(1))
                .timeout(Duration::from_secs(60)),
        );
    let ch = y.add_to(x.add_to(builder)).build().unwrap();
    wait_for_state(&ch, "x", State::Ready).await;
    wait_for_state(&ch, "y", State::Ready).await;
    assert_eq!(x.shared.health_watches(), 1);

    // The stream ends with an error; the next ones fail at once, without an answer.
    x.shared.refuse_health(Some(Code::Internal));
    let t0 = Instant::now();
    x.shared.end_health_watches(Some(Code::Unavailable));
    let times = watch_times(&x, 1, 5, t0).await;
    assert_times(&times, &[0, 1000, 2600, 5160]);
    assert_eq!(state_of(&ch, "x"), State::Unhealthy, "{}", fleet::dump(&ch));
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 10).await;
    assert!(names.iter().all(|n| n == "y"), "{names:?}");

    // The server answers again: the next stream (5.16 s + 4.096 s) brings it back.
    x.shared.refuse_health(None);
    let back = wait_for_state(&ch, "x", State::Ready).await;
    assert_times(&[(back - t0).as_millis() as u64], &[9256]);
    assert_eq!(x.shared.health_watches(), 6);

    // The stream carried an answer: ended (with OK this time), it opens again at once, and the
    // failure after it waits the first delay again, not the next one.
    x.shared.refuse_health(Some(Code::Internal));
    let t1 = Instant::now();
    x.shared.end_health_watches(None);
    let times = watch_times(&x, 6, 8, t1).await;
    assert_times(&times, &[0, 1000]);
    assert_eq!(state_of(&ch, "x"), State::Unhealthy);
    x.shared.refuse_health(None);
    let back = wait_for_state(&ch, "x", State::Ready).await;
    assert_times(&[(back - t1).as_millis() as u64], &[2600]);
    assert_eq!(x.shared.health_check_calls(), 0);
}

/// A stream with no first answer within the timeout takes the instance out (the stream stays
/// open); before that the new instance is usable (the channel does not hold calls for the
/// first answer); the answer, when it comes on the same stream, brings it back.
#[tokio::test(start_paused = true)]
async fn no_first_answer_in_time_takes_an_instance_out_until_it_answers() {
    let x = MemoryInstance::start_with_health("x", Behavior::Ok);
    let y = MemoryInstance::start_with_health("y", Behavior::Ok);
    x.shared.set_health_hangs(true);
    let builder = BalancedChannel::builder().health_check(
        HealthCheck::default()
            .interval(Duration::from_millis(100))
            .timeout(Duration::from_millis(300)),
    );
    let t0 = Instant::now();
    let ch = y.add_to(x.add_to(builder)).build().unwrap();
    assert!(state_of(&ch, "x").is_usable());
    let out = wait_for_state(&ch, "x", State::Unhealthy).await;
    assert_times(&[(out - t0).as_millis() as u64], &[300]);
    assert_eq!(x.shared.health_watches_open(), 1);
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 10).await;
    assert!(names.iter().all(|n| n == "y"), "{names:?}");

    x.shared.set_health_hangs(false);
    wait_for_state(&ch, "x", State::Ready).await;
    assert_eq!(x.shared.health_watches(), 1, "the same stream answered");
}

/// tonic-health's own server, as most tonic services run it: its status changes reach the
/// channel; clearing the service ends the stream with OK, and the name it then does not know
/// is refused with NOT_FOUND (where the protocol says SERVICE_UNKNOWN): out, and asked again
/// with backoff until the service is back.
#[tokio::test(start_paused = true)]
async fn tonic_healths_own_server_is_watched() {
    let (mut reporter, service) = tonic_health::server::health_reporter();
    const NAME: &str = "fleet.v1.Fleet";
    reporter
        .set_service_status(NAME, tonic_health::ServingStatus::Serving)
        .await;
    let x = MemoryInstance::start_with_health_service("x", Behavior::Ok, service);
    let y = MemoryInstance::start("y", Behavior::Ok);
    let builder = BalancedChannel::builder()
        .health_check(HealthCheck::default().service(NAME))
        .backoff(Backoff::default().jitter(0.0));
    let ch = y.add_to(x.add_to(builder)).build().unwrap();
    wait_for_state(&ch, "x", State::Ready).await;

    reporter
        .set_service_status(NAME, tonic_health::ServingStatus::NotServing)
        .await;
    wait_for_state(&ch, "x", State::Unhealthy).await;
    reporter
        .set_service_status(NAME, tonic_health::ServingStatus::Serving)
        .await;
    wait_for_state(&ch, "x", State::Ready).await;

    let t0 = Instant::now();
    reporter.clear_service_status(NAME).await;
    wait_for_state(&ch, "x", State::Unhealthy).await;
    // Refused at once (the stream had answered), then after 1 s and 1.6 s: still out.
    tokio::time::sleep(Duration::from_millis(2700)).await;
    assert_eq!(state_of(&ch, "x"), State::Unhealthy);
    reporter
        .set_service_status(NAME, tonic_health::ServingStatus::Serving)
        .await;
    // The next attempt, 2.56 s later (5.16 s from the end), finds it.
    let back = wait_for_state(&ch, "x", State::Ready).await;
    assert_times(&[(back - t0).as_millis() as u64], &[5160]);
}

/// An instance whose server says NOT_SERVING while it is ejected stays out when its ejection
/// ends: only SERVING brings it back (the last status decides, whenever the instance would
/// come back into service).
#[tokio::test(start_paused = true)]
async fn an_ejected_instance_whose_last_status_is_not_serving_stays_out() {
    let x = MemoryInstance::start_with_health("x", Behavior::Fail(Code::Unavailable));
    let y = MemoryInstance::start_with_health("y", Behavior::Ok);
    let builder = BalancedChannel::builder()
        .ejection(
            tonic_balancer::Ejection::default()
                .consecutive_failures(3)
                .base_time(Duration::from_secs(10))
                .interval(None),
        )
        .health_check(HealthCheck::default());
    let ch = y.add_to(x.add_to(builder)).build().unwrap();
    wait_for_state(&ch, "x", State::Ready).await;
    let mut client = FleetClient::new(ch.clone());
    for id in 0..100 {
        if state_of(&ch, "x") == State::Ejected {
            break;
        }
        let _ = client.unary(fleet::req(id)).await;
    }
    assert_eq!(state_of(&ch, "x"), State::Ejected, "{}", fleet::dump(&ch));
    x.set(Behavior::Ok);
    x.shared.set_serving(false);
    fleet::wait_until("NOT_SERVING sent", LIMIT, || x.shared.health_checks() == 2).await;
    assert_eq!(state_of(&ch, "x"), State::Ejected);

    // The ejection ends: out again at once, on its last status.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(state_of(&ch, "x"), State::Unhealthy, "{}", fleet::dump(&ch));
    let served = x.served();
    let names = fleet::calls(&mut client, 10).await;
    assert!(names.iter().all(|n| n == "y"), "{names:?}");
    assert_eq!(x.served(), served);
    x.shared.set_serving(true);
    wait_for_state(&ch, "x", State::Ready).await;
    assert_eq!(x.shared.health_watches(), 1);
}

// -------------------------------------------------------------------------------------------
// Connections and membership.

/// A server that stops breaks its stream: the instance is out, and calls go elsewhere; once
/// the server is back, a new stream on the new connection brings it back and carries its
/// status from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_is_watched_again() {
    let mut fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .backoff(
            Backoff::default()
                .initial(Duration::from_millis(50))
                .max(Duration::from_millis(200)),
        )
        .health_check(HealthCheck::default().interval(Duration::from_millis(50)))
        .uris(fleet.uris())
        .build()
        .unwrap();
    fleet::wait_until("both watched", LIMIT, || {
        fleet.instances.iter().all(|i| i.health_checks() == 1)
    })
    .await;
    let uri = fleet.instances[1].uri();
    fleet.instances[1].stop();
    fleet::wait_until("stopped instance out", LIMIT, || {
        !state_of(&ch, &uri).is_usable()
    })
    .await;
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 20).await;
    assert!(names.iter().all(|n| n == "i0"), "{names:?}");

    fleet.instances[1].restart();
    let x = &fleet.instances[1];
    fleet::wait_until("restarted instance back, watched", LIMIT, || {
        state_of(&ch, &uri) == State::Ready && x.shared.health_watches_open() == 1
    })
    .await;
    assert!(x.shared.health_watches() >= 2);
    x.set_serving(false);
    fleet::wait_until("restarted instance out on NOT_SERVING", LIMIT, || {
        state_of(&ch, &uri) == State::Unhealthy
    })
    .await;
    x.set_serving(true);
    fleet::wait_until("and back on SERVING", LIMIT, || {
        state_of(&ch, &uri) == State::Ready
    })
    .await;
}

/// Checks pause while an instance drains: its stream is closed. Taken back into the set, it
/// is watched again by a new stream, whose NOT_SERVING takes it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_pause_while_an_instance_drains() {
    let fleet = Fleet::start(2, Behavior::Hold);
    let ch = BalancedChannel::builder()
        .health_check(HealthCheck::default())
        .uris(fleet.uris())
        .build()
        .unwrap();
    fleet::wait_until("both watched", LIMIT, || {
        fleet
            .instances
            .iter()
            .all(|i| i.health_checks() == 1 && i.shared.health_watches_open() == 1)
    })
    .await;
    // A held call keeps the removed instance draining.
    let mut client = FleetClient::new(ch.clone());
    let held = tokio::spawn(async move { client.unary(Req::default()).await });
    fleet::wait_until("call held", LIMIT, || fleet.held() == 1).await;
    let x = fleet.instances.iter().find(|i| i.held() == 1).unwrap();
    let uri = x.uri();
    assert!(ch.remove(&uri).unwrap());
    assert_eq!(state_of(&ch, &uri), State::Draining);
    fleet::wait_until("the draining instance's stream closed", LIMIT, || {
        x.shared.health_watches_open() == 0
    })
    .await;
    assert_eq!(x.shared.health_watches(), 1);

    let everyone = fleet
        .uris()
        .into_iter()
        .map(|u| Endpoint::from_shared(u).unwrap());
    assert_eq!(ch.replace_all(everyone).unwrap(), (1, 0));
    fleet::wait_until("taken back, watched again", LIMIT, || {
        x.shared.health_watches() == 2 && x.shared.health_watches_open() == 1
    })
    .await;
    x.set_serving(false);
    fleet::wait_until("out on NOT_SERVING", LIMIT, || {
        state_of(&ch, &uri) == State::Unhealthy
    })
    .await;
    x.set_serving(true);
    fleet::wait_until("back on SERVING", LIMIT, || {
        state_of(&ch, &uri) == State::Ready
    })
    .await;
    x.release(1);
    held.await.unwrap().expect("the held call completes");
}

#[tokio::test]
async fn bad_health_check_settings_are_refused_by_name() {
    for (check, field) in [
        (HealthCheck::default().interval(Duration::ZERO), "interval"),
        (HealthCheck::default().timeout(Duration::ZERO), "timeout"),
    ] {
        let err = BalancedChannel::builder()
            .uri("http://127.0.0.1:1")
            .health_check(check)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("health_check") && err.contains(field), "{err}");
    }
}
