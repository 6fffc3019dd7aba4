//! Hedging (gRFC A6's hedging policy), and the server pushback that retries and hedges honour.
use fleet_service as fleet;

use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use fleet::{req, Behavior, Fleet, Instance};
use tonic::transport::Endpoint;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, HedgingPolicy, RetryPolicy};

const UNARY: &str = "fleet.v1.Fleet/Unary";
const SERVER_STREAM: &str = "/fleet.v1.Fleet/ServerStream";
const PUSHBACK: &str = "grpc-retry-pushback-ms";
/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(20);

/// A channel over `uris` with this hedging policy. Ejection off: the tests count attempts,
/// and an instance ejected for its scripted failures would change them.
fn hedged(uris: &[String], policy: HedgingPolicy) -> BalancedChannel {
    BalancedChannel::builder()
        .uris(uris)
        .hedging(policy)
        .ejection(Ejection::disabled())
        .build()
        .expect("valid settings")
}

/// The calls that reached the servers so far.
fn served(fleet: &Fleet) -> u64 {
    fleet.served().iter().sum()
}

async fn idle(ch: &BalancedChannel) {
    fleet::wait_until("every count back to zero", LIMIT, || {
        fleet::total_in_flight(ch) == 0
    })
    .await;
}

/// The first answer wins, and the other attempt is cancelled at once: its count is released
/// by the time the caller has its reply, and its server sees the call cancelled. Both ways:
/// the hedge wins, then the first attempt wins. The instance for the hedge joins the set
/// only once the first attempt holds, so that which instance gets which attempt is known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_answer_wins_and_the_loser_is_cancelled() {
    for hedge_wins in [true, false] {
        let first = Instance::start("first", Behavior::Hold);
        let second = Instance::start("second", Behavior::Hold);
        let policy = HedgingPolicy::new([UNARY], Duration::from_millis(20)).max_attempts(2);
        let ch = hedged(&[first.uri()], policy);
        let mut client = FleetClient::new(ch.clone());
        let call = tokio::spawn(async move { client.unary(req(7)).await });
        fleet::wait_until("the first attempt held", LIMIT, || first.held() == 1).await;
        ch.insert(Endpoint::from_shared(second.uri()).unwrap())
            .unwrap();
        fleet::wait_until("the hedge held", LIMIT, || second.held() == 1).await;
        assert_eq!(fleet::total_in_flight(&ch), 2, "{}", fleet::dump(&ch));
        let (winner, loser) = if hedge_wins {
            (&second, &first)
        } else {
            (&first, &second)
        };
        winner.release(1);
        let reply = call.await.unwrap().expect("the call").into_inner();
        assert_eq!(reply.instance, winner.name());
        assert_eq!(reply.id, 7);
        assert_eq!(
            fleet::total_in_flight(&ch),
            0,
            "hedge_wins={hedge_wins}: counts held after the answer:{}",
            fleet::dump(&ch)
        );
        fleet::wait_until("the loser's server saw the cancellation", LIMIT, || {
            loser.held() == 0 && loser.active() == 0
        })
        .await;
        assert_eq!((first.served(), second.served()), (1, 1));
    }
}

/// A server-streaming call is hedged until a stream starts: the first instance stalls
/// before its response headers, the hedge's stream arrives whole, and the stalled attempt
/// is cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_streaming_call_is_hedged_until_a_stream_starts() {
    let stalled = Instance::start(
        "stalled",
        Behavior::Stall {
            p: 1.0,
            stall: Duration::from_secs(600),
            base: Duration::ZERO,
        },
    );
    let fast = Instance::start("fast", Behavior::Ok);
    let policy = HedgingPolicy::new([SERVER_STREAM], Duration::from_millis(20));
    let ch = hedged(&[stalled.uri()], policy);
    let mut client = FleetClient::new(ch.clone());
    let call = tokio::spawn(async move {
        let mut stream = client
            .server_stream(Req {
                id: 3,
                count: 5,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut replies = Vec::new();
        while let Some(r) = stream.message().await? {
            replies.push(r);
        }
        Ok::<_, tonic::Status>(replies)
    });
    fleet::wait_until("the first attempt stalled", LIMIT, || stalled.active() == 1).await;
    ch.insert(Endpoint::from_shared(fast.uri()).unwrap())
        .unwrap();
    let replies = call.await.unwrap().expect("the stream");
    assert_eq!(replies.len(), 5);
    assert!(replies.iter().all(|r| r.instance == "fast" && r.id == 3));
    assert_eq!(fleet::total_in_flight(&ch), 0, "{}", fleet::dump(&ch));
    fleet::wait_until("the stalled attempt cancelled", LIMIT, || {
        stalled.active() == 0
    })
    .await;
}

/// Hedges take from the retry budget and stop when it is spent: with half a hedge earned per
/// call and nothing per second, 20 calls that all outlast the delay make exactly 10 hedges
/// (the third attempt each allows finds the budget spent); with no budget, none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_stops_hedges() {
    for (ratio, calls, hedges) in [(0.5, 20u64, 10u64), (0.0, 10, 0)] {
        let fleet = Fleet::start(3, Behavior::Delay(Duration::from_millis(250)));
        let policy = HedgingPolicy::new([UNARY], Duration::from_millis(2))
            .max_attempts(3)
            .budget_ratio(ratio)
            .budget_min_per_sec(0);
        let ch = hedged(&fleet.uris(), policy);
        let mut client = FleetClient::new(ch.clone());
        fleet::calls(&mut client, calls).await;
        idle(&ch).await;
        assert_eq!(
            served(&fleet) - calls,
            hedges,
            "ratio {ratio}: {:?}",
            fleet.served()
        );
    }
}

/// A server's `grpc-retry-pushback-ms` in a non-fatal answer governs the next hedge: a
/// negative or malformed value stops the call's hedging (one attempt, and the caller gets that
/// answer, trailer included), a valid one delays the next attempt by its value instead of
/// sending it at once, and without one every instance is tried at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushback_stops_or_delays_hedges() {
    // The hedging delay is long: every further attempt here comes from a non-fatal answer.
    let policy = HedgingPolicy::new([UNARY], Duration::from_secs(600))
        .max_attempts(3)
        .budget_ratio(10.0);
    pushback_cases(|uris| hedged(uris, policy.clone())).await;
}

/// The same for the retry policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushback_stops_or_delays_retries() {
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(1))
        .budget_ratio(10.0);
    pushback_cases(|uris| {
        BalancedChannel::builder()
            .uris(uris)
            .retry(policy.clone())
            .ejection(Ejection::disabled())
            .build()
            .unwrap()
    })
    .await;
}

/// Three instances that all answer UNAVAILABLE with a pushback value (or none); the attempts
/// per call, and the least time a call takes, for each.
async fn pushback_cases(channel: impl Fn(&[String]) -> BalancedChannel) {
    let wait = Duration::from_millis(300);
    let cases = [
        (Some("-1"), 1, Duration::ZERO),
        (Some("soon"), 1, Duration::ZERO),
        (Some("300"), 3, wait * 2),
        (None, 3, Duration::ZERO),
    ];
    for (value, attempts, least) in cases {
        let behavior = match value {
            Some(v) => Behavior::FailWith {
                code: Code::Unavailable,
                message: "busy".into(),
                key: PUSHBACK,
                value: v.into(),
            },
            None => Behavior::Fail(Code::Unavailable),
        };
        let fleet = Fleet::start(3, behavior);
        let ch = channel(&fleet.uris());
        let mut client = FleetClient::new(ch.clone());
        for id in 0..3 {
            let before = served(&fleet);
            let start = Instant::now();
            let err = client.unary(req(id)).await.unwrap_err();
            let took = start.elapsed();
            assert_eq!(err.code(), Code::Unavailable, "{value:?}: {err:?}");
            if let Some(v) = value {
                // The server's answer, unchanged.
                assert_eq!(err.message(), "busy");
                assert_eq!(err.metadata().get(PUSHBACK).unwrap(), v);
            }
            assert_eq!(served(&fleet) - before, attempts, "pushback {value:?}");
            assert!(took >= least, "pushback {value:?}: call over in {took:?}");
        }
        idle(&ch).await;
    }
}

/// A request body larger than the replay cap is sent once: the call is not hedged, and it
/// succeeds. A small one is hedged (the same calls otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_cap_is_sent_once() {
    for (payload, attempts) in [(4096, 1u64), (16, 2)] {
        let fleet = Fleet::start(3, Behavior::Delay(Duration::from_millis(200)));
        let ch = BalancedChannel::builder()
            .uris(fleet.uris())
            .max_replay_body(1024)
            .hedging(
                HedgingPolicy::new([UNARY], Duration::from_millis(2))
                    .max_attempts(2)
                    .budget_ratio(10.0),
            )
            .build()
            .unwrap();
        let mut client = FleetClient::new(ch.clone());
        for id in 0..5 {
            let before = served(&fleet);
            let body = vec![id as u8; payload];
            let reply = client
                .unary(Req {
                    id,
                    payload: body.clone(),
                    ..Default::default()
                })
                .await
                .expect("the call")
                .into_inner();
            assert_eq!((reply.id, reply.payload), (id, body));
            idle(&ch).await;
            assert_eq!(served(&fleet) - before, attempts, "a {payload}-byte body");
        }
    }
}

/// Only the methods named are hedged: with a policy for another method (ServerStream), a
/// slow unary call is sent once; with one for its service, the same call is hedged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_not_named_is_never_hedged() {
    for (name, attempts) in [(SERVER_STREAM, 1u64), ("fleet.v1.Fleet", 2)] {
        let fleet = Fleet::start(3, Behavior::Delay(Duration::from_millis(200)));
        let policy = HedgingPolicy::new([name], Duration::from_millis(2))
            .max_attempts(2)
            .budget_ratio(10.0);
        let ch = hedged(&fleet.uris(), policy);
        let mut client = FleetClient::new(ch.clone());
        for id in 0..5 {
            let before = served(&fleet);
            client.unary(req(id)).await.expect("the call");
            idle(&ch).await;
            assert_eq!(served(&fleet) - before, attempts, "policy for {name}");
        }
    }
}

/// `max_attempts` above gRFC A6's cap of 5 (or below 2) is refused by `build()`, naming it.
#[tokio::test]
async fn max_attempts_above_five_is_refused() {
    for n in [6, 100, 1] {
        let err = BalancedChannel::builder()
            .uri("http://127.0.0.1:1")
            .hedging(HedgingPolicy::new([UNARY], Duration::from_millis(5)).max_attempts(n))
            .build()
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("hedging") && msg.contains("max_attempts"),
            "{n}: {msg}"
        );
    }
    BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .hedging(HedgingPolicy::new([UNARY], Duration::from_millis(5)).max_attempts(5))
        .build()
        .expect("5 attempts are allowed");
}

/// No hedge ever goes to an instance the call has tried, whatever the instances do: over
/// calls on five instances, each redrawn before every call at random to answer at once, after
/// a random delay, with UNAVAILABLE (non-fatal) or never, no instance sees a call twice (the
/// servers record the ids of the calls they get), no call makes more than `max_attempts`
/// attempts, and every count is released after each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hedge_repeats_an_instance() {
    let fleet = Fleet::start(5, Behavior::Ok);
    for inst in &fleet.instances {
        inst.record_ids();
    }
    let policy = HedgingPolicy::new([UNARY], Duration::from_millis(3))
        .max_attempts(5)
        .budget_ratio(10.0);
    let ch = hedged(&fleet.uris(), policy);
    let mut client = FleetClient::new(ch.clone());
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let calls = 60;
    let mut scripts = Vec::new();
    for id in 0..calls {
        let mut script = Vec::new();
        for inst in &fleet.instances {
            let b = match next() % 4 {
                0 => Behavior::Ok,
                1 => Behavior::Delay(Duration::from_millis(next() % 40)),
                2 => Behavior::Fail(Code::Unavailable),
                _ => Behavior::Hang,
            };
            inst.set(b.clone());
            script.push(b);
        }
        scripts.push(script);
        let mut request = tonic::Request::new(req(id));
        request.set_timeout(Duration::from_millis(300));
        let _ = client.unary(request).await;
        idle(&ch).await;
    }
    fleet::wait_until("every handler over", LIMIT, || {
        fleet.instances.iter().all(|i| i.active() == 0)
    })
    .await;
    let ids: Vec<Vec<u64>> = fleet.instances.iter().map(Instance::ids).collect();
    let mut hedged_calls = 0;
    for id in 0..calls {
        let seen: Vec<usize> = ids
            .iter()
            .map(|got| got.iter().filter(|&&i| i == id).count())
            .collect();
        let script = &scripts[id as usize];
        assert!(
            seen.iter().all(|&n| n <= 1),
            "call {id}: an instance got two attempts: {seen:?} for {script:?}"
        );
        let attempts: usize = seen.iter().sum();
        assert!((1..=5).contains(&attempts), "call {id}: {seen:?}");
        if attempts > 1 {
            hedged_calls += 1;
        }
    }
    // The property is only worth something if calls were hedged.
    assert!(hedged_calls > 10, "only {hedged_calls} calls hedged");
}

/// A hedged call whose instance cannot be reached goes on elsewhere, unseen (transparent
/// retry), and every call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hedged_call_moves_on_from_an_unreachable_instance() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let mut uris = fleet.uris();
    uris.push(fleet::unreachable_uri());
    let policy = HedgingPolicy::new([UNARY], Duration::from_millis(50));
    let ch = hedged(&uris, policy);
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 30).await;
    assert!(names.iter().all(|n| n == "i0" || n == "i1"), "{names:?}");
    idle(&ch).await;
}

/// Every hedge after the first attempt says how many attempts went before it
/// (`grpc-previous-rpc-attempts`, gRFC A6): here the first two answer UNAVAILABLE (non-fatal:
/// the next goes at once), the third answers.
#[tokio::test]
async fn hedges_count_the_attempts_before_them() {
    use crate::scripted::{self, Script};
    let unavailable = || Some(tonic::Status::unavailable("scripted"));
    let script = Script::new([unavailable(), unavailable()]);
    let instances = scripted::start(3, &script);
    let uris: Vec<String> = instances.iter().map(|i| i.uri()).collect();
    let policy = HedgingPolicy::new([UNARY], Duration::from_secs(600)).max_attempts(3);
    let mut client = FleetClient::new(hedged(&uris, policy));
    client.unary(req(1)).await.unwrap();
    assert_eq!(script.calls(), 3);
    assert_eq!(
        script.header("grpc-previous-rpc-attempts"),
        [None, Some("1".into()), Some("2".into())]
    );
}
