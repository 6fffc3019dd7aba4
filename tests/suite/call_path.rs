//! One call, one path: what ends an attempt does the same to the instance, its connection and
//! the call, whatever kind of call it is (plain, replayed, retried, hedged). Each test here is a
//! case where the two copies of a call's life that the channel once had disagreed.
use fleet_service as fleet;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use fleet::refusing::{Refusing, Rule};
use fleet::{Behavior, Fleet, Instance};
use tonic::transport::Endpoint;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, HedgingPolicy, RetryPolicy, State, Strategy};

/// Generous bounds for a loaded 2-core machine: correctness bounds, not speed.
const LIMIT: Duration = Duration::from_secs(30);

const UNARY: &str = "fleet.v1.Fleet/Unary";

fn big(id: u64, bytes: usize) -> Req {
    Req {
        id,
        payload: vec![7; bytes],
        ..Default::default()
    }
}

/// The calls the fleet's handlers got, whole (a request its client never finished sending is
/// seen by the instance, but not handled).
fn handled(fleet: &Fleet) -> u64 {
    fleet.instances.iter().map(|i| i.shared.handled()).sum()
}

async fn settle(ch: &BalancedChannel) {
    fleet::wait_until("nothing in flight", LIMIT, || {
        fleet::total_in_flight(ch) == 0
    })
    .await;
}

/// A request the caller's own codec refuses (over `max_encoding_message_size`) is the caller's
/// error: the call fails with it, nothing reaches a server, nothing is sent again (not as an
/// empty message elsewhere), and the instances keep their state: with a retry policy and two
/// instances, twenty such calls in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_callers_codec_refuses_is_the_callers_error() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(RetryPolicy::default().budget_ratio(10.0))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 4).await;
    let before = handled(&fleet);
    let mut limited = FleetClient::new(ch.clone()).max_encoding_message_size(1024);
    for id in 0..20 {
        let status = tokio::time::timeout(LIMIT, limited.unary(big(id, 4096)))
            .await
            .expect("the call ended")
            .expect_err("a request over the caller's own limit must fail");
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert!(status.message().contains("too large"), "{status:?}");
    }
    settle(&ch).await;
    assert_eq!(
        handled(&fleet),
        before,
        "a server handled a request the caller never sent"
    );
    for e in ch.endpoints() {
        assert_eq!(e.state(), State::Ready, "{}", fleet::dump(&ch));
        assert_eq!(e.failed(), 0, "the caller's error counted against {e}");
    }
    // The channel still works, for calls within the limit.
    let reply = limited.unary(big(99, 100)).await.unwrap().into_inner();
    assert_eq!(reply.payload.len(), 100);
}

/// A client stream whose second message the caller's codec refuses ends with the caller's
/// error: it is not sent again with what the encoder left behind (empty messages), and no
/// server answers it OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_the_callers_codec_refuses_midway_is_not_sent_again() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 4).await;
    let before = handled(&fleet);
    let mut limited = FleetClient::new(ch.clone()).max_encoding_message_size(1024);
    let messages = vec![big(1, 10), big(2, 4091)];
    let result = tokio::time::timeout(
        LIMIT,
        limited.client_stream(futures::stream::iter(messages)),
    )
    .await
    .expect("the call ended");
    let status = result.expect_err("the caller's second message is over its own limit");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    settle(&ch).await;
    assert!(
        handled(&fleet) <= before + 1,
        "the stream reached more than one handler: {} after {before}",
        handled(&fleet)
    );
    for e in ch.endpoints() {
        assert_eq!(e.state(), State::Ready, "{}", fleet::dump(&ch));
        assert_eq!(e.failed(), 0);
    }
}

/// An empty request stream whose end went out reached its server whole: when the connection
/// then breaks, the call is not sent again elsewhere (the server may have acted on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_request_stream_that_went_out_is_not_sent_again() {
    let mut fleet = Fleet::start(2, Behavior::Hold);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let call = tokio::spawn(async move {
        client
            .client_stream(futures::stream::iter(Vec::<Req>::new()))
            .await
    });
    fleet::wait_until("the call held by an instance", LIMIT, || fleet.held() == 1).await;
    let (holder, other) = if fleet.instances[0].held() == 1 {
        (0, 1)
    } else {
        (1, 0)
    };
    fleet.instances[other].set(Behavior::Ok);
    fleet.instances[holder].stop();
    let status = tokio::time::timeout(LIMIT, call)
        .await
        .expect("the call ended")
        .unwrap()
        .expect_err("its connection broke after the request went out whole");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(
        fleet.instances[other].served(),
        0,
        "the call was sent again after its server had it whole"
    );
}

/// Hedged attempts take their place on a connection as any attempt does: past the streams a
/// connection may carry, another connection opens, rather than the hedges queueing inside
/// HTTP/2 where the pick cannot see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedged_attempts_take_a_place_on_a_connection() {
    let fleet = Fleet::start(2, Behavior::Hold);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .max_streams_per_connection(2)
        .max_connections_per_instance(4)
        .hedging(HedgingPolicy::new([UNARY], Duration::ZERO).max_attempts(2))
        .build()
        .unwrap();
    let calls: Vec<_> = (0..6)
        .map(|id| {
            let mut client = FleetClient::new(ch.clone());
            tokio::spawn(async move { client.unary(fleet::req(id)).await })
        })
        .collect();
    fleet::wait_until("every call and its hedge held", LIMIT, || {
        fleet.held() == 12
    })
    .await;
    for (i, e) in ch.endpoints().iter().enumerate() {
        assert_eq!(e.in_flight(), 6, "{}", fleet::dump(&ch));
        assert!(
            e.connections() >= 3,
            "6 attempts at 2 streams per connection on one connection: {e}"
        );
        assert!(
            fleet.instances[i].open_connections() >= 3,
            "{} has {} connections open",
            fleet.instances[i].name(),
            fleet.instances[i].open_connections()
        );
    }
    fleet.release_all(6);
    for call in calls {
        call.await.unwrap().expect("a hedged call answers");
    }
    settle(&ch).await;
}

/// A stream the server refuses (REFUSED_STREAM) is an answer about that stream only: the
/// instance stays ready, its connection stays open, and the call goes again, on another
/// connection (the refusing one is still at its limit), and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_leaves_the_connection_and_the_instance_as_they_were() {
    let server = Refusing::start(Rule::Lagging {
        limit: 1,
        linger: Duration::from_secs(5),
        service: Duration::ZERO,
    })
    .await;
    let ch = BalancedChannel::builder()
        .uri(&server.uri())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    client.unary(fleet::req(1)).await.expect("the first call");
    assert_eq!(ch.endpoints()[0].state(), State::Ready);
    // The server still counts the first stream: it refuses the next one on that connection.
    let reply = tokio::time::timeout(LIMIT, client.unary(fleet::req(2)))
        .await
        .expect("the call ended")
        .expect("a refused stream is sent again elsewhere, and succeeds");
    assert_eq!(reply.into_inner().instance, "refusing");
    assert_eq!(server.refused.load(Ordering::SeqCst), 1);
    let e = &ch.endpoints()[0];
    assert_eq!(e.state(), State::Ready);
    assert_eq!(e.failed(), 0, "a refusal says nothing against the instance");
    assert_eq!(e.connections(), 2, "{e}");
    assert_eq!(
        server.open.load(Ordering::SeqCst),
        2,
        "the refusing connection was closed"
    );
}

/// Under load against a server that refuses some streams even within its announced limit (as
/// gRPC's C-core does while a stream closes), with 10 streams per connection and 5 connections:
/// at most 1% of the calls fail, the instance stays ready throughout, and the connections open
/// to carry the load stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streams_under_load_fail_few_calls_and_leave_the_instance_ready() {
    let server = Refusing::start(Rule::Lagging {
        limit: 10,
        linger: Duration::from_millis(2),
        service: Duration::from_millis(1),
    })
    .await;
    let ch = BalancedChannel::builder()
        .uri(&server.uri())
        .max_streams_per_connection(10)
        .max_connections_per_instance(5)
        .build()
        .unwrap();
    FleetClient::new(ch.clone())
        .unary(fleet::req(0))
        .await
        .expect("the first call");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let callers: Vec<_> = (0..45)
        .map(|c| {
            let mut client = FleetClient::new(ch.clone());
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                let mut id = c * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    match client.unary(fleet::req(id)).await {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    let start = Instant::now();
    let mut not_ready = 0;
    let mut samples = 0;
    let mut connections_after_1s = usize::MAX;
    while start.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let e = &ch.endpoints()[0];
        samples += 1;
        if e.state() != State::Ready {
            not_ready += 1;
        }
        if start.elapsed() > Duration::from_secs(1) {
            connections_after_1s = connections_after_1s.min(e.connections());
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    let refused = server.refused.load(Ordering::SeqCst);
    eprintln!(
        "{ok} calls ok, {failed} failed, {refused} streams refused, {samples} samples, {not_ready} not ready, at least {connections_after_1s} connections after 1 s"
    );
    assert!(
        refused > 0,
        "the server refused no stream: the test tests nothing"
    );
    assert!(
        failed * 100 <= ok + failed,
        "{failed} of {} calls failed",
        ok + failed
    );
    assert_eq!(
        not_ready, 0,
        "the instance left ready in {not_ready} of {samples} samples"
    );
    assert!(
        connections_after_1s >= 4,
        "{connections_after_1s} connections"
    );
}

/// A discovery key whose endpoint is replaced (the key now names another address) is one
/// membership change: calls made meanwhile never find the set empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_keys_endpoint_never_empties_the_set() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let (ch, tx) = BalancedChannel::balance_channel::<&str>(16).unwrap();
    let endpoint = |i: usize| Endpoint::from_shared(fleet.instances[i].uri()).unwrap();
    tx.send(tonic_balancer::Change::Insert("k", endpoint(0)))
        .await
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..4)
        .map(|_| {
            let mut client = FleetClient::new(ch.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0u64, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match client.unary(fleet::req(ok)).await {
                        Ok(_) => ok += 1,
                        Err(status) => failed.push(status),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    for flip in 0..200 {
        tx.send(tonic_balancer::Change::Insert(
            "k",
            endpoint((flip + 1) % 2),
        ))
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for c in callers {
        let (ok, failed) = c.await.unwrap();
        total += ok;
        assert!(
            failed.is_empty(),
            "{} calls failed: {:?}",
            failed.len(),
            failed[0]
        );
    }
    assert!(total > 0);
}

/// Asking whether a retry could go anywhere moves nothing of the pick: with round robin over
/// [A, B, C] (A failing UNAVAILABLE), a call goes to A, and its retry to B, the next in turn;
/// the next call goes to C.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_spends_one_turn_of_the_pick() {
    let a = Instance::start("a", Behavior::Fail(Code::Unavailable));
    let b = Instance::start("b", Behavior::Ok);
    let c = Instance::start("c", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .strategy(Strategy::RoundRobin)
        .retry(
            RetryPolicy::default()
                .initial_backoff(Duration::from_millis(1))
                .max_backoff(Duration::from_millis(1))
                .budget_ratio(10.0),
        )
        .ejection(Ejection::disabled())
        .uris([a.uri(), b.uri(), c.uri()])
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 2).await;
    assert_eq!(
        names,
        ["b", "c"],
        "the retry went elsewhere than the next in turn"
    );
    assert_eq!(a.served(), 1);
}

/// While a hedge has no instance left to go to, it asks the set, not the pick: round robin's
/// turns move only for attempts that are sent. Over [i0, i1, i2], each round makes a hedged
/// call (its first attempt and two hedges, then no instance left for the fourth of its 4
/// attempts, which waits until they answer) and then a plain call: four turns a round, so the
/// plain call of round `r` goes to `i{(4r + 3) % 3}`. Five rounds, so that a pick that moved
/// while the hedge waited shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_hedge_spends_no_turn_of_the_pick() {
    let fleet = Fleet::start(3, Behavior::Hold);
    let ch = BalancedChannel::builder()
        .strategy(Strategy::RoundRobin)
        .ejection(Ejection::disabled())
        .hedging(
            HedgingPolicy::new([UNARY], Duration::ZERO)
                .max_attempts(4)
                .budget_ratio(10.0),
        )
        .uris(fleet.uris())
        .build()
        .unwrap();
    for round in 0..5u64 {
        for i in &fleet.instances {
            i.set(Behavior::Hold);
        }
        let mut client = FleetClient::new(ch.clone());
        let call = tokio::spawn(async move { client.unary(fleet::req(round)).await });
        fleet::wait_until("the three attempts held", LIMIT, || fleet.held() == 3).await;
        // The fourth attempt finds no instance left: let it wait a while.
        tokio::time::sleep(Duration::from_millis(30)).await;
        for i in &fleet.instances {
            i.set(Behavior::Ok);
        }
        // The first attempt's instance answers; the others are cancelled while they wait
        // (releasing them too could leave a permit unused for the next round).
        fleet.instances[(4 * round as usize) % 3].release(1);
        call.await.unwrap().expect("the hedged call answers");
        settle(&ch).await;
        // A plain call (client streaming is not hedged): the next in turn.
        let mut client = FleetClient::new(ch.clone());
        let reply = client
            .client_stream(futures::stream::iter(vec![fleet::req(round)]))
            .await
            .expect("a plain call")
            .into_inner();
        let want = format!("i{}", (4 * round + 3) % 3);
        assert_eq!(
            reply.instance, want,
            "round {round}: the pick moved while the hedge waited"
        );
    }
}

/// The state of the instance at `uri` in the set (not a draining one).
fn in_set(ch: &BalancedChannel, uri: &str) -> tonic_balancer::EndpointStats {
    ch.endpoints()
        .into_iter()
        .find(|e| {
            e.uri().trim_end_matches('/') == uri.trim_end_matches('/')
                && e.state() != State::Draining
        })
        .unwrap_or_else(|| panic!("{uri} not in the set: {}", fleet::dump(ch)))
}

/// Holds one call on each instance of `ch` (its two instances both hold calls) and returns
/// the calls' tasks: a removed instance with a call in flight drains (it is kept, and can be
/// taken back) rather than closing at once.
async fn hold_one_each(
    ch: &BalancedChannel,
    a: &Instance,
    b: &Instance,
) -> Vec<tokio::task::JoinHandle<Result<tonic::Response<fleet::pb::Reply>, tonic::Status>>> {
    a.set(Behavior::Hold);
    b.set(Behavior::Hold);
    let mut held = Vec::new();
    // One at a time: the second goes to the instance with no call in flight.
    for id in 0..2 {
        let mut client = FleetClient::new(ch.clone());
        held.push(tokio::spawn(async move {
            client.unary(fleet::req(100 + id)).await
        }));
        fleet::wait_until("the call held", LIMIT, || {
            a.held() + b.held() == id as usize + 1
        })
        .await;
    }
    assert_eq!((a.held(), b.held()), (1, 1), "{}", fleet::dump(ch));
    held
}

/// An ejected instance that is removed while a call of it is in flight (so it drains) and
/// taken back (a discovery answer names it again) is still ejected: no call goes to it before
/// its ejection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_instance_taken_back_stays_ejected() {
    let bad = Instance::start("bad", Behavior::Ok);
    let good = Instance::start("good", Behavior::Ok);
    let hour = Duration::from_secs(3600);
    let ch = BalancedChannel::builder()
        .uris([bad.uri(), good.uri()])
        .ejection(
            Ejection::default()
                .consecutive_failures(1)
                .base_time(hour)
                .max_time(hour),
        )
        .build()
        .unwrap();
    let held = hold_one_each(&ch, &bad, &good).await;
    bad.set(Behavior::Fail(Code::Unavailable));
    good.set(Behavior::Ok);
    let mut client = FleetClient::new(ch.clone());
    for id in 0..4 {
        let _ = client.unary(fleet::req(id)).await;
    }
    assert_eq!(in_set(&ch, &bad.uri()).state(), State::Ejected);
    let served = bad.served();
    let endpoints = [bad.uri(), good.uri()].map(|u| Endpoint::from_shared(u).unwrap());
    assert!(ch.remove(&bad.uri()).unwrap());
    assert_eq!(ch.replace_all(endpoints).unwrap(), (1, 0));
    assert_eq!(
        in_set(&ch, &bad.uri()).state(),
        State::Ejected,
        "taken back out of its ejection: {}",
        fleet::dump(&ch)
    );
    let names = fleet::calls(&mut client, 10).await;
    assert!(names.iter().all(|n| n == "good"), "{names:?}");
    assert_eq!(bad.served(), served);
    bad.release(1);
    good.release(1);
    for h in held {
        let _ = h.await;
    }
}

/// An instance whose health check said NOT_SERVING, removed while a call of it is in flight and
/// taken back, stays out until a health check says SERVING.
#[cfg(feature = "health-check")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_instance_taken_back_stays_out_until_serving() {
    let sick = Instance::start("sick", Behavior::Ok);
    let well = Instance::start("well", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris([sick.uri(), well.uri()])
        .health_check(tonic_balancer::HealthCheck::default().interval(Duration::from_millis(100)))
        .build()
        .unwrap();
    let held = hold_one_each(&ch, &sick, &well).await;
    well.set(Behavior::Ok);
    sick.set_serving(false);
    fleet::wait_until("the sick instance out", LIMIT, || {
        in_set(&ch, &sick.uri()).state() == State::Unhealthy
    })
    .await;
    let endpoints = [sick.uri(), well.uri()].map(|u| Endpoint::from_shared(u).unwrap());
    assert!(ch.remove(&sick.uri()).unwrap());
    assert_eq!(ch.replace_all(endpoints).unwrap(), (1, 0));
    assert_eq!(
        in_set(&ch, &sick.uri()).state(),
        State::Unhealthy,
        "{}",
        fleet::dump(&ch)
    );
    let served = sick.served();
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 10).await;
    assert!(names.iter().all(|n| n == "well"), "{names:?}");
    assert_eq!(sick.served(), served);
    // SERVING again: the next check takes it back into service.
    sick.set_serving(true);
    fleet::wait_until("the sick instance back", LIMIT, || {
        in_set(&ch, &sick.uri()).state() == State::Ready
    })
    .await;
    sick.release(1);
    well.release(1);
    for h in held {
        let _ = h.await;
    }
}

/// Hedges are attempts, not calls: `calls()` counts each call once, `attempts()` counts each
/// hedge too, and `hedges()` says how many there were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_count_as_attempts_not_calls() {
    let fleet = Fleet::start(2, Behavior::Delay(Duration::from_millis(150)));
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .hedging(
            HedgingPolicy::new([UNARY], Duration::from_millis(10))
                .max_attempts(2)
                .budget_ratio(10.0),
        )
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 6).await;
    settle(&ch).await;
    let stats = ch.stats();
    assert_eq!(stats.calls(), 6, "{stats}");
    assert_eq!(stats.hedges(), 6, "every call is hedged: {stats}");
    assert_eq!(stats.attempts(), 12, "{stats}");
}

/// A hedge that overtakes an attempt teaches the pick that the attempt's instance is slow, as
/// an answer would: with one instance answering in 300 ms and one at once, one call at a time,
/// and hedging after 20 ms, the slow instance's estimate is at least the time its attempts were
/// held, and few calls start on it (each such call waits for its hedge), where without that
/// lesson it had no estimate and kept getting first attempts (43 of 100 measured from outside;
/// all of them here). How few is the tie-break's (6-7 of 100 on an idle machine, about 20 on a
/// loaded one, where the fast instance's answers slow down too, and some of its calls are
/// hedged to the slow one): the bound is for a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overtaken_attempt_teaches_the_pick() {
    let slow = Instance::start("slow", Behavior::Delay(Duration::from_millis(300)));
    let fast = Instance::start("fast", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris([slow.uri(), fast.uri()])
        .hedging(
            HedgingPolicy::new([UNARY], Duration::from_millis(20))
                .max_attempts(2)
                .budget_ratio(10.0),
        )
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 100).await;
    assert!(names.iter().all(|n| n == "fast"), "the hedge answers first");
    let on_slow = slow.served();
    let estimate = fleet::stats(&ch, &slow.uri()).latency();
    eprintln!(
        "{on_slow} of 100 calls reached the slow instance: {}",
        fleet::dump(&ch)
    );
    assert!(
        estimate.is_some_and(|e| e >= Duration::from_millis(20)),
        "the slow instance's estimate is {estimate:?}: {}",
        fleet::dump(&ch)
    );
    assert!(
        on_slow <= 30,
        "{on_slow} of 100 calls reached the slow instance: {}",
        fleet::dump(&ch)
    );
}
