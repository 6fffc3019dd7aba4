//! Correctness of the paths a call can take when things go wrong: a request stream sent again,
//! a set replaced while calls flow, a retry with nowhere to go, a removed instance that comes
//! back, and calls queued behind a connect that never completes.
use fleet_service as fleet;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet::pb::{fleet_client::FleetClient, Reply, Req};
use fleet::{Behavior, Fleet, Instance};
use tonic::transport::Endpoint;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, RetryPolicy, Strategy};
#[cfg(feature = "health-check")]
use tonic_balancer::{HealthCheck, State};

/// A retry policy that retries at once and is never stopped by its budget.
fn eager_retry() -> RetryPolicy {
    RetryPolicy::default()
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(1))
        .budget_ratio(10.0)
}

/// Ejection off: these tests are about where each attempt goes, not about ejection.
fn no_ejection() -> Ejection {
    Ejection::disabled()
}

/// URIs compare equal with or without the path `/` that `Endpoint` adds.
fn same_uri(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The state of the instance with this URI that is in the set (a draining one otherwise).
#[cfg(feature = "health-check")]
fn state_of(ch: &BalancedChannel, uri: &str) -> Option<State> {
    let listed = ch.endpoints();
    let mine = || listed.iter().filter(|e| same_uri(e.uri(), uri));
    mine()
        .find(|e| e.state() != State::Draining)
        .or_else(|| mine().next())
        .map(|e| e.state())
}

fn started_on(ch: &BalancedChannel, uri: &str) -> u64 {
    ch.endpoints()
        .iter()
        .filter(|e| same_uri(e.uri(), uri))
        .map(|e| e.started())
        .sum()
}

/// A fresh round-robin channel over [A, U, B, C] with the retry policy on (3 attempts). The
/// pick's counter of a new channel starts at 0 and each pick takes the next untried instance in
/// turn, so a call goes to A; its retry to U, which refuses the connection, so it is replayed
/// on B; B's failure is retried on C. The attempt after the replay on B is where a request
/// stream can come out doubled: B's attempt, fed from the copy recorded on A, records itself
/// on top of that copy.
fn a_u_b_c_channel(a: &Instance, u: &str, b: &Instance, c: &Instance) -> BalancedChannel {
    BalancedChannel::builder()
        .strategy(Strategy::RoundRobin)
        .retry(eager_retry())
        .ejection(no_ejection())
        .uris([a.uri(), u.to_owned(), b.uri(), c.uri()])
        .build()
        .unwrap()
}

fn messages(round: u64, n: u64) -> Vec<Req> {
    (0..n)
        .map(|i| Req {
            id: round * 100 + i,
            ..Default::default()
        })
        .collect()
}

/// A request stream sent again reaches the server exactly once per attempt: a client-streaming
/// call of 7 messages that goes A (UNAVAILABLE after reading it all: policy retry), U
/// (connection refused: transparent replay), B (UNAVAILABLE again), C arrives at C with 7
/// messages, not 14.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_client_stream_reaches_the_server_once_per_attempt() {
    let a = Instance::start("a", Behavior::Fail(Code::Unavailable));
    let b = Instance::start("b", Behavior::Fail(Code::Unavailable));
    let c = Instance::start("c", Behavior::Ok);
    let u = fleet::unreachable_uri();
    for round in 0..5u64 {
        let ch = a_u_b_c_channel(&a, &u, &b, &c);
        let mut client = FleetClient::new(ch.clone());
        let (a0, b0, c0) = (a.served(), b.served(), c.served());
        let sent = messages(round, 7);
        let reply = client
            .client_stream(tokio_stream::iter(sent))
            .await
            .unwrap_or_else(|e| panic!("round {round}: call failed: {e:?}"))
            .into_inner();
        assert_eq!(
            a.served(),
            a0 + 1,
            "round {round}: A was not the first attempt"
        );
        assert_eq!(started_on(&ch, &u), 1, "round {round}: U was not tried");
        assert_eq!(b.served(), b0 + 1, "round {round}: B was not tried");
        assert_eq!(
            c.served(),
            c0 + 1,
            "round {round}: C was not the last attempt"
        );
        assert_eq!(reply.instance, "c", "round {round}");
        assert_eq!(
            reply.seq, 7,
            "round {round}: C received {} messages for a stream of 7",
            reply.seq
        );
        assert_eq!(reply.id, round * 100 + 6, "round {round}: last message");
    }
}

/// The same path for a bidi call (A and B answer UNAVAILABLE, trailers-only, after reading the
/// whole stream): C receives exactly the messages sent, in order, and answers each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_bidi_stream_reaches_the_server_once_per_attempt() {
    let a = Instance::start("a", Behavior::FailAfterInput(Code::Unavailable));
    let b = Instance::start("b", Behavior::FailAfterInput(Code::Unavailable));
    let c = Instance::start("c", Behavior::Ok);
    let u = fleet::unreachable_uri();
    for round in 0..5u64 {
        let ch = a_u_b_c_channel(&a, &u, &b, &c);
        let mut client = FleetClient::new(ch.clone());
        let (a0, b0, c0) = (a.served(), b.served(), c.served());
        let sent = messages(round, 7);
        let want: Vec<u64> = sent.iter().map(|r| r.id).collect();
        let mut replies = client
            .bidi(tokio_stream::iter(sent))
            .await
            .unwrap_or_else(|e| panic!("round {round}: call failed: {e:?}"))
            .into_inner();
        let mut got: Vec<Reply> = Vec::new();
        while let Some(r) = replies
            .message()
            .await
            .unwrap_or_else(|e| panic!("round {round}: stream failed: {e:?}"))
        {
            got.push(r);
        }
        assert_eq!(
            a.served(),
            a0 + 1,
            "round {round}: A was not the first attempt"
        );
        assert_eq!(started_on(&ch, &u), 1, "round {round}: U was not tried");
        assert_eq!(b.served(), b0 + 1, "round {round}: B was not tried");
        assert_eq!(
            c.served(),
            c0 + 1,
            "round {round}: C was not the last attempt"
        );
        assert!(got.iter().all(|r| r.instance == "c"), "round {round}");
        let ids: Vec<u64> = got.iter().map(|r| r.id).collect();
        assert_eq!(
            ids, want,
            "round {round}: C did not receive exactly what was sent"
        );
    }
}

/// Replacing the set never leaves it empty: while a thread flips the set between two
/// instances with `replace_all`, not one of the calls of 4 tasks fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_all_never_empties_the_set() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let uris = fleet.uris();
    let ch = BalancedChannel::from_static(&uris[..1]).unwrap();
    let flipping = Arc::new(AtomicBool::new(true));
    let flipper = {
        let (ch, uris, flipping) = (ch.clone(), uris.clone(), flipping.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut flips = 0u32;
            while flips < 20_000 && start.elapsed() < Duration::from_secs(2) {
                let uri = uris[1 - (flips % 2) as usize].clone();
                ch.replace_all([Endpoint::from_shared(uri).unwrap()])
                    .unwrap();
                flips += 1;
            }
            flipping.store(false, Ordering::SeqCst);
            flips
        })
    };
    let calls = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<tonic::Status>));
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let mut client = FleetClient::new(ch.clone());
            let (flipping, calls, failures, first_error) = (
                flipping.clone(),
                calls.clone(),
                failures.clone(),
                first_error.clone(),
            );
            tokio::spawn(async move {
                let mut id = t << 32;
                while flipping.load(Ordering::SeqCst) {
                    id += 1;
                    let req = Req {
                        id,
                        ..Default::default()
                    };
                    if let Err(e) = client.unary(req).await {
                        failures.fetch_add(1, Ordering::SeqCst);
                        first_error.lock().unwrap().get_or_insert(e);
                    }
                    calls.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let flips = flipper.join().unwrap();
    let calls = calls.load(Ordering::SeqCst);
    let failures = failures.load(Ordering::SeqCst);
    assert!(
        flips > 100 && calls > 100,
        "too little overlap to judge: {flips} flips, {calls} calls"
    );
    assert_eq!(
        failures,
        0,
        "{failures} of {calls} calls failed during {flips} flips; the first: {:?}",
        first_error.lock().unwrap()
    );
}

/// Trailer metadata of the scripted refusal.
const REASON_KEY: &str = "x-fleet-reason";

fn refusal() -> Behavior {
    Behavior::FailWith {
        code: Code::ResourceExhausted,
        message: "tenant 7 is over its quota".to_owned(),
        key: REASON_KEY,
        value: "quota".to_owned(),
    }
}

fn assert_is_the_refusal(err: &tonic::Status, what: &str) {
    assert_eq!(err.code(), Code::ResourceExhausted, "{what}: {err:?}");
    assert_eq!(
        err.message(),
        "tenant 7 is over its quota",
        "{what}: {err:?}"
    );
    assert_eq!(
        err.metadata()
            .get(REASON_KEY)
            .map(|v| v.to_str().unwrap().to_owned()),
        Some("quota".to_owned()),
        "{what}: the server's metadata is lost: {err:?}"
    );
}

/// A call whose retries are spent gives the caller the server's own answer (its code, its
/// message, its metadata), not an error of the channel's making: every instance answers
/// RESOURCE_EXHAUSTED, and the retry policy retries it, on instances the call tried when there
/// is no other, until its attempts are spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_with_nowhere_to_go_returns_the_servers_answer() {
    let policy = eager_retry()
        .max_attempts(5)
        .codes([Code::Unavailable, Code::ResourceExhausted]);
    // One instance: every retry goes to it.
    let one = Fleet::start(1, refusal());
    let ch = BalancedChannel::builder()
        .retry(policy.clone())
        .ejection(no_ejection())
        .uris(one.uris())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch);
    for id in 0..5 {
        let req = Req {
            id,
            ..Default::default()
        };
        let err = client.unary(req).await.unwrap_err();
        assert_is_the_refusal(&err, "one instance");
    }
    assert_eq!(one.served(), vec![25], "five attempts per call");

    // Two instances: the first retry goes to the other one, the next ones to either.
    let two = Fleet::start(2, refusal());
    let ch = BalancedChannel::builder()
        .retry(policy)
        .ejection(no_ejection())
        .uris(two.uris())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch);
    for id in 0..5 {
        let before: u64 = two.served().iter().sum();
        let req = Req {
            id,
            ..Default::default()
        };
        let err = client.unary(req).await.unwrap_err();
        assert_is_the_refusal(&err, "two instances");
        let after: u64 = two.served().iter().sum();
        assert_eq!(after - before, 5, "call {id}: five attempts");
    }
}

/// A removed instance that is re-added while it drains keeps its health checks: once back in
/// the set, answering NOT_SERVING still takes it out.
#[cfg(feature = "health-check")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revived_instance_keeps_its_health_checks() {
    let fleet = Fleet::start(2, Behavior::Hold);
    let check = HealthCheck::default()
        .interval(Duration::from_millis(50))
        .timeout(Duration::from_millis(500));
    let ch = BalancedChannel::builder()
        .health_check(check)
        .uris(fleet.uris())
        .build()
        .unwrap();
    fleet::wait_until("first health checks", Duration::from_secs(10), || {
        fleet.instances.iter().all(|i| i.health_checks() > 0)
    })
    .await;
    // A held call keeps the removed instance draining.
    let mut client = FleetClient::new(ch.clone());
    let held = tokio::spawn(async move { client.unary(Req::default()).await });
    fleet::wait_until("call held", Duration::from_secs(10), || fleet.held() == 1).await;
    let x = fleet.instances.iter().find(|i| i.held() == 1).unwrap();
    let x_uri = x.uri();
    assert!(ch.remove(&x_uri).unwrap());
    assert_eq!(state_of(&ch, &x_uri), Some(State::Draining));
    // Let the checker see the draining state: wait until X's checks stop for 6 intervals
    // (they do today within one interval), or at most 3 s (a checker that goes on checking a
    // draining instance is fine too).
    let start = Instant::now();
    let (mut last, mut since) = (x.health_checks(), Instant::now());
    while start.elapsed() < Duration::from_secs(3) && since.elapsed() < Duration::from_millis(300) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = x.health_checks();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    // The set named again with X in it (as a discovery answer would): X is taken back.
    let everyone = fleet
        .uris()
        .into_iter()
        .map(|u| Endpoint::from_shared(u).unwrap());
    assert_eq!(ch.replace_all(everyone).unwrap(), (1, 0));
    assert!(
        state_of(&ch, &x_uri).is_some_and(|s| s.is_usable()),
        "re-added instance not usable: {:?}",
        state_of(&ch, &x_uri)
    );
    x.set_serving(false);
    fleet::wait_until(
        "re-added instance marked unhealthy by its health checks",
        Duration::from_secs(5),
        || state_of(&ch, &x_uri) == Some(State::Unhealthy),
    )
    .await;
    x.set_serving(true);
    fleet::wait_until("re-added instance back in", Duration::from_secs(5), || {
        state_of(&ch, &x_uri).is_some_and(|s| s.is_usable())
    })
    .await;
    x.release(1);
    held.await.unwrap().expect("the held call completes");
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

fn with_connect_timeout(uri: String) -> Endpoint {
    Endpoint::from_shared(uri)
        .unwrap()
        .connect_timeout(CONNECT_TIMEOUT)
}

/// Sends `n` unary calls at once; returns each one's outcome and how long it took.
async fn concurrent_calls(
    ch: &BalancedChannel,
    n: u64,
) -> Vec<(Result<Reply, tonic::Status>, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|id| {
            let mut client = FleetClient::new(ch.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let r = client
                    .unary(Req {
                        id,
                        ..Default::default()
                    })
                    .await
                    .map(|r| r.into_inner());
                (r, start.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Calls queued behind a connect that never completes (SYNs dropped) move on when it fails:
/// each is replayed on the good instance after about one connect timeout, rather than waiting
/// for a connect attempt of its own, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_on_a_black_hole_move_on_when_its_connect_fails() {
    let good = Instance::start("good", Behavior::Ok);
    let hole = fleet::black_hole_uri();
    // Round robin over [hole, good]: of 12 calls made at once, 6 are routed to the hole
    // (its connect fails only after CONNECT_TIMEOUT, long after every pick).
    let ch = BalancedChannel::builder()
        .strategy(Strategy::RoundRobin)
        .endpoints([
            with_connect_timeout(hole.clone()),
            with_connect_timeout(good.uri()),
        ])
        .build()
        .unwrap();
    let results = concurrent_calls(&ch, 12).await;
    // Several calls were queued on it (6 with today's round robin).
    let queued = started_on(&ch, &hole);
    assert!(queued >= 2, "only {queued} calls routed to the black hole");
    let bound = CONNECT_TIMEOUT.mul_f64(2.5);
    let times: Vec<Duration> = results.iter().map(|(_, t)| *t).collect();
    for (id, (r, took)) in results.iter().enumerate() {
        let reply = r
            .as_ref()
            .unwrap_or_else(|e| panic!("call {id} failed: {e:?}"));
        assert_eq!(reply.instance, "good", "call {id}");
        assert!(
            *took < bound,
            "call {id} took {took:?} (bound {bound:?}); all: {times:?}"
        );
    }
}

/// The same with the black hole alone: the calls queued on it all end with UNAVAILABLE once
/// its connect fails, not one per connect timeout in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_on_a_lone_black_hole_fail_together() {
    let hole = fleet::black_hole_uri();
    let ch = BalancedChannel::builder()
        .endpoints([with_connect_timeout(hole)])
        .build()
        .unwrap();
    let results = concurrent_calls(&ch, 6).await;
    let bound = CONNECT_TIMEOUT.mul_f64(2.5);
    let times: Vec<Duration> = results.iter().map(|(_, t)| *t).collect();
    for (id, (r, took)) in results.iter().enumerate() {
        let err = r.as_ref().expect_err("a black hole cannot answer");
        assert_eq!(err.code(), Code::Unavailable, "call {id}: {err:?}");
        assert!(
            *took < bound,
            "call {id} took {took:?} (bound {bound:?}); all: {times:?}"
        );
    }
}
