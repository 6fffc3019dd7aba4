use fleet_service as fleet;

// Failure handling against real servers: unreachable addresses, instances that fail fast,
// die mid-call, hang, or fail now and then; ejection, readmission on probation, the ejection
// cap, and failing fast when nothing is left.
//
// Time: every timer here (reconnect backoff, ejection time, success-rate interval) is set to a
// short *real* duration, and the tests wait for conditions with generous limits
// (`fleet::wait_until`). They do not use tokio's paused clock: with real sockets, auto-advance
// fires timers whenever the runtime is idle waiting for I/O, so deadlines and ejections would
// expire while a call is merely on the wire. Where a test bounds a duration from below
// (timers never fire early), it leaves a wide margin; nothing is bounded from above except by
// the generous limits that turn a hang into a failure.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet::local::LocalFleet;
use fleet::pb::{fleet_client::FleetClient, Reply};
use fleet::{Behavior, Fleet};
use tonic::{Code, Status};
use tonic_balancer::{Backoff, BalancedChannel, Builder, Ejection, State, Strategy};

/// Limit for conditions that should hold within a few hundred milliseconds on an idle machine.
const LIMIT: Duration = Duration::from_secs(20);

type Client = FleetClient<BalancedChannel>;

use fleet::req;

async fn unary(client: &mut Client, id: u64) -> Result<Reply, Status> {
    client.unary(req(id)).await.map(|r| r.into_inner())
}

/// A unary call that must end within `bound`: a hang fails the test.
async fn unary_bounded(client: &mut Client, id: u64, bound: Duration) -> Result<Reply, Status> {
    match tokio::time::timeout(bound, unary(client, id)).await {
        Ok(r) => r,
        Err(_) => panic!("call {id} did not end within {bound:?}"),
    }
}

fn builder(uris: &[String]) -> Builder {
    uris.iter()
        .fold(BalancedChannel::builder(), |b, u| b.uri(u))
}

fn channel(uris: &[String], backoff: Backoff, ejection: Ejection) -> BalancedChannel {
    builder(uris)
        .backoff(backoff)
        .ejection(ejection)
        .build()
        .expect("valid channel")
}

use fleet::{dump, stats};

fn state(ch: &BalancedChannel, uri: &str) -> State {
    stats(ch, uri).state()
}

/// Sequential calls until `cond` holds (checked after each call), for at most `LIMIT`;
/// returns the results. Panics if the condition never holds.
///
/// Bounded in time rather than in calls: with least pending and sequential calls, an instance
/// that answered slowly once (a scheduling hiccup on a loaded machine) is closed to ties for a
/// while, so how many calls it takes for one to reach a given instance varies.
async fn call_until(
    client: &mut Client,
    what: &str,
    mut cond: impl FnMut() -> bool,
) -> Vec<Result<Reply, Status>> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut id = 0;
    while start.elapsed() < LIMIT {
        out.push(unary_bounded(client, id, LIMIT).await);
        id += 1;
        if cond() {
            return out;
        }
    }
    panic!("after {id} calls in {LIMIT:?}, still not: {what}");
}

// 1. Unreachable addresses among live ones: never seen by the caller.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_instances_cost_no_call() {
    let fleet = Fleet::start(5, Behavior::Ok);
    let dead = [fleet::unreachable_uri(), fleet::unreachable_uri()];
    let mut uris = fleet.uris();
    uris.insert(1, dead[0].clone());
    uris.push(dead[1].clone());
    let ch = BalancedChannel::from_static(&uris).unwrap();
    let mut client = FleetClient::new(ch.clone());

    // 500 sequential calls.
    for id in 0..500 {
        if let Err(s) = unary_bounded(&mut client, id, LIMIT).await {
            panic!("sequential call {id} failed: {s:?}{}", dump(&ch));
        }
    }
    // 500 concurrent calls: 10 tasks of 50.
    let tasks: Vec<_> = (0..10u64)
        .map(|t| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut failed = Vec::new();
                for i in 0..50 {
                    if let Err(s) = unary_bounded(&mut client, 1000 + t * 50 + i, LIMIT).await {
                        failed.push(s);
                    }
                }
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in tasks {
        failed.extend(t.await.unwrap());
    }
    assert!(
        failed.is_empty(),
        "{} concurrent calls failed: {failed:?}{}",
        failed.len(),
        dump(&ch)
    );
    assert_eq!(fleet.served().iter().sum::<u64>(), 1000);

    for d in &dead {
        let s = stats(&ch, d);
        assert_eq!(s.state(), State::Failing, "{}", dump(&ch));
        assert!(s.started() >= 1, "never tried: {s}");
    }
    for u in fleet.uris() {
        assert_eq!(state(&ch, &u), State::Ready, "{}", dump(&ch));
    }
    fleet::wait_until("in-flight counts back to 0", LIMIT, || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
}

// 2. Every address unreachable: each call fails with UNAVAILABLE, none hangs.

#[tokio::test]
async fn all_unreachable_fails_fast_with_unavailable() {
    let dead: Vec<String> = (0..3).map(|_| fleet::unreachable_uri()).collect();
    let ch = BalancedChannel::from_static(&dead).unwrap();
    let mut client = FleetClient::new(ch.clone());

    for id in 0..100 {
        let err = unary_bounded(&mut client, id, Duration::from_secs(2))
            .await
            .expect_err("no instance is reachable");
        assert_eq!(err.code(), Code::Unavailable, "call {id}: {err:?}");
    }
    for d in &dead {
        assert_eq!(state(&ch, d), State::Failing, "{}", dump(&ch));
    }
    // Once all are known down, the channel refuses at once and says why.
    let err = unary_bounded(&mut client, 100, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().contains("no usable instance"),
        "message: {:?}",
        err.message()
    );
    assert_eq!(fleet::total_in_flight(&ch), 0);
}

// 3. One instance failing fast (UNAVAILABLE, RESOURCE_EXHAUSTED) among five: ejected quickly.

async fn one_fail_fast_instance(code: Code) {
    let fleet = Fleet::start(5, Behavior::Ok);
    let bad = &fleet.instances[2];
    bad.set(Behavior::Fail(code));
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());

    let mut failed = 0;
    for id in 0..1000 {
        match unary_bounded(&mut client, id, LIMIT).await {
            Ok(r) => assert_ne!(r.instance, bad.name()),
            Err(s) => {
                assert_eq!(s.code(), code, "{s:?}");
                failed += 1;
            }
        }
    }
    assert!(
        failed <= 10,
        "{failed} of 1000 calls failed (> 1%){}",
        dump(&ch)
    );
    assert_eq!(failed as u64, bad.served(), "every failure came from it");

    // Five failures in a row eject it. With sequential calls it may have had fewer than five:
    // one slow answer of its (a scheduling hiccup on a loaded machine) closes it to ties (all
    // at 0 in flight) for a while. Then concurrent calls, which it wins while the others are
    // busy, bring its five.
    if stats(&ch, &bad.uri()).ejections() == 0 {
        assert!(
            bad.served() < 5,
            "5 failures in a row and not ejected:{}",
            dump(&ch)
        );
        eprintln!(
            "{code:?}: only {} of 1000 sequential calls reached the failing instance; \
             concurrent calls until it is ejected:{}",
            bad.served(),
            dump(&ch)
        );
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..4u64)
            .map(|t| {
                let (mut client, stop) = (client.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut id = t << 32;
                    while !stop.load(Ordering::SeqCst) {
                        id += 1;
                        let _ = unary_bounded(&mut client, id, LIMIT).await;
                    }
                })
            })
            .collect();
        fleet::wait_until("the failing instance ejected", LIMIT, || {
            stats(&ch, &bad.uri()).ejections() >= 1
        })
        .await;
        stop.store(true, Ordering::SeqCst);
        for t in tasks {
            t.await.unwrap();
        }
    }
    let s = stats(&ch, &bad.uri());
    assert!(s.ejections() >= 1, "never ejected: {}", dump(&ch));
    assert_eq!(s.state(), State::Ejected, "{}", dump(&ch));
    assert!(bad.served() <= 10, "ejected after its 5th failure in a row");
}

#[tokio::test]
async fn fail_fast_unavailable_instance_is_ejected() {
    one_fail_fast_instance(Code::Unavailable).await;
}

#[tokio::test]
async fn fail_fast_resource_exhausted_instance_is_ejected() {
    one_fail_fast_instance(Code::ResourceExhausted).await;
}

/// The other server faults: UNKNOWN (a handler that throws, in grpcio and grpc-java), INTERNAL
/// and DATA_LOSS.
#[tokio::test]
async fn fail_fast_server_fault_instances_are_ejected() {
    for code in [Code::Unknown, Code::Internal, Code::DataLoss] {
        one_fail_fast_instance(code).await;
    }
}

/// `total` unary calls from `callers` concurrent callers; the failed ones' statuses.
async fn concurrent_calls(client: &Client, callers: u64, total: u64) -> Vec<Status> {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (mut client, next) = (client.clone(), next.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                loop {
                    let id = next.fetch_add(1, Ordering::SeqCst);
                    if id >= total {
                        return failed;
                    }
                    if let Err(s) = unary_bounded(&mut client, id, LIMIT).await {
                        failed.push(s);
                    }
                }
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in tasks {
        failed.extend(t.await.unwrap());
    }
    failed
}

/// One instance of five whose handler fails at once with a server fault (a bad deploy: a
/// handler that throws answers UNKNOWN in grpcio and grpc-java), four that answer in 5 ms, 4
/// callers, 1,200 calls, the default settings: the failing instance, which looks idle and fast,
/// would draw most of the calls; it is ejected after its fifth failure in a row, so at most 2%
/// of the calls fail. Then, on a channel whose ejections are short, it comes back once it
/// answers again.
async fn a_server_fault_does_not_draw_the_traffic(code: Code) {
    let fleet = Fleet::start(5, Behavior::Delay(Duration::from_millis(5)));
    let bad = &fleet.instances[2];
    bad.set(Behavior::Fail(code));
    let ch = channel(&fleet.uris(), Backoff::default(), Ejection::default());
    let failed = concurrent_calls(&FleetClient::new(ch.clone()), 4, 1200).await;
    assert!(
        failed.len() <= 24,
        "{code:?}: {} of 1,200 calls failed (> 2%):{}",
        failed.len(),
        dump(&ch)
    );
    assert!(failed.iter().all(|s| s.code() == code), "{failed:?}");
    let s = stats(&ch, &bad.uri());
    assert_eq!(s.ejections(), 1, "{code:?}:{}", dump(&ch));
    // Ejected after five failures in a row; four callers may have had a call on it each.
    assert!(
        bad.served() <= 5 + 4,
        "{code:?}: {} calls before its ejection:{}",
        bad.served(),
        dump(&ch)
    );

    // It recovers: readmitted on probation after its (short) ejection, it answers and stays.
    let ejection = Ejection::default()
        .base_time(Duration::from_millis(100))
        .max_time(Duration::from_millis(100));
    let ch = channel(&fleet.uris(), Backoff::default(), ejection);
    let mut client = FleetClient::new(ch.clone());
    call_until(&mut client, "the failing instance ejected", || {
        state(&ch, &bad.uri()) == State::Ejected
    })
    .await;
    bad.set(Behavior::Delay(Duration::from_millis(5)));
    let served = bad.served();
    call_until(&mut client, "it serves calls again", || {
        bad.served() >= served + 5
    })
    .await;
    assert_eq!(state(&ch, &bad.uri()), State::Ready, "{}", dump(&ch));
}

/// Without ejection, an instance that fails at once still gets no more than its share: a
/// failed answer teaches the latency estimate nothing fast (the default strategy would
/// otherwise take it for the fastest instance and send it most of the calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_answer_is_never_a_fast_answer() {
    for code in [Code::Unknown, Code::NotFound] {
        let fleet = Fleet::start(5, Behavior::Delay(Duration::from_millis(5)));
        let bad = &fleet.instances[2];
        bad.set(Behavior::Fail(code));
        let ch = channel(&fleet.uris(), Backoff::default(), Ejection::disabled());
        let failed = concurrent_calls(&FleetClient::new(ch.clone()), 4, 1000).await;
        eprintln!(
            "{code:?}: {} of 1,000 calls to the failing instance",
            failed.len()
        );
        // A fifth is its share; a little more, as least pending gives an instance whose calls
        // end sooner a little more of the ties.
        assert!(
            failed.len() <= 300,
            "{code:?}: {} of 1,000 calls went to the failing instance:{}",
            failed.len(),
            dump(&ch)
        );
    }
}

/// The other side of [`a_failed_answer_is_never_a_fast_answer`]: errors that every instance
/// answers alike (a lookup service's NOT_FOUND, three calls in ten at random) count as slow
/// answers on every instance alike, and move no calls: each instance keeps at least half its
/// fair share, under the default and under least pending (whose gates need no confirmation).
/// The instances are equal: served on the test's runtime, so that a busy machine's scheduling
/// delays fall on all of them alike ([`LocalFleet`]). On threads of their own, one of them drew
/// 129 of 2,000 calls once in 29 runs of the suite beside two spinning processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_errors_that_every_instance_answers_move_no_calls() {
    for strategy in [Strategy::FewestThenFastest, Strategy::LeastPending] {
        let fleet = LocalFleet::start(
            5,
            Behavior::FailAtRandom {
                p: 0.3,
                code: Code::NotFound,
                delay: Duration::ZERO,
            },
        )
        .await;
        let ch = builder(&fleet.uris())
            .strategy(strategy)
            .ejection(Ejection::disabled())
            .build()
            .unwrap();
        let failed = concurrent_calls(&FleetClient::new(ch.clone()), 4, 2000).await;
        assert!(failed.iter().all(|s| s.code() == Code::NotFound));
        let started: Vec<u64> = ch.endpoints().iter().map(|e| e.started()).collect();
        let fair = started.iter().sum::<u64>() / 5;
        eprintln!("{strategy:?}: calls started on each instance {started:?}");
        assert!(
            started.iter().all(|&n| 2 * n >= fair),
            "{strategy:?}: {started:?}:{}",
            dump(&ch)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_answering_unknown_at_once_does_not_draw_the_traffic() {
    a_server_fault_does_not_draw_the_traffic(Code::Unknown).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_answering_internal_at_once_does_not_draw_the_traffic() {
    a_server_fault_does_not_draw_the_traffic(Code::Internal).await;
}

// 4. An instance killed under load, then restarted on the same port.

/// Call outcomes by phase of the test (by when the call *started*).
#[derive(Default)]
struct Tally {
    ok: [AtomicU64; 4],
    failed: [AtomicU64; 4],
    errors: Mutex<Vec<(usize, Status)>>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_instance_costs_only_its_calls_in_flight_and_comes_back() {
    const TASKS: usize = 8;
    let mut fleet = Fleet::start(5, Behavior::Delay(Duration::from_millis(5)));
    let victim_uri = fleet.instances[2].uri();
    let backoff = Backoff::default().initial(Duration::from_millis(200));
    let ch = channel(&fleet.uris(), backoff, Ejection::default());
    let client = FleetClient::new(ch.clone());

    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let tasks: Vec<_> = (0..TASKS as u64)
        .map(|t| {
            let (mut client, phase, stop, tally) =
                (client.clone(), phase.clone(), stop.clone(), tally.clone());
            tokio::spawn(async move {
                let mut id = t << 32;
                while !stop.load(Ordering::SeqCst) {
                    id += 1;
                    let p = phase.load(Ordering::SeqCst);
                    match unary_bounded(&mut client, id, LIMIT).await {
                        Ok(_) => tally.ok[p].fetch_add(1, Ordering::SeqCst),
                        Err(s) => {
                            tally.errors.lock().unwrap().push((p, s));
                            tally.failed[p].fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            })
        })
        .collect();
    let done =
        |p: usize| tally.ok[p].load(Ordering::SeqCst) + tally.failed[p].load(Ordering::SeqCst);

    // Warm: every instance connected and busy.
    fleet::wait_until("200 calls before the kill", LIMIT, || done(0) >= 200).await;
    let victim_in_flight = stats(&ch, &victim_uri).in_flight();
    tokio::task::block_in_place(|| fleet.instances[2].stop());
    phase.store(1, Ordering::SeqCst);

    fleet::wait_until("the killed instance marked failing", LIMIT, || {
        state(&ch, &victim_uri) == State::Failing
    })
    .await;
    phase.store(2, Ordering::SeqCst);
    fleet::wait_until("200 calls while it is down", LIMIT, || done(2) >= 200).await;

    let served_before = fleet.instances[2].served();
    tokio::task::block_in_place(|| fleet.instances[2].restart());
    phase.store(3, Ordering::SeqCst);
    // One backoff step is ~200 ms to ~1 s here (it grows while the instance is down); the
    // limit is generous for a loaded machine.
    let restarted = Instant::now();
    fleet::wait_until("the restarted instance gets calls again", LIMIT, || {
        fleet.instances[2].served() > served_before
    })
    .await;
    let back_after = restarted.elapsed();
    fleet::wait_until("the restarted instance gets its share", LIMIT, || {
        fleet.instances[2].served() > served_before + 20
    })
    .await;
    assert_eq!(state(&ch, &victim_uri), State::Ready, "{}", dump(&ch));

    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let f = |p: usize| tally.failed[p].load(Ordering::SeqCst);
    let errors = std::mem::take(&mut *tally.errors.lock().unwrap());
    eprintln!(
        "in flight on the victim just before the kill: {victim_in_flight}; \
         calls again {back_after:?} after the restart; \
         failed by phase (before kill, kill..failing, down, restarted): {:?}; ok: {:?}; errors: {errors:?}",
        [f(0), f(1), f(2), f(3)],
        [0, 1, 2, 3].map(|p| tally.ok[p].load(Ordering::SeqCst)),
    );
    // At most the calls it had in flight fail: with 8 tasks, at most 8.
    assert!(
        f(0) + f(1) <= TASKS as u64,
        "{} calls failed around the kill (in flight on it before: {victim_in_flight}): {errors:?}",
        f(0) + f(1)
    );
    assert_eq!(
        f(2) + f(3),
        0,
        "calls failed after the instance was known down: {errors:?}"
    );
    // A connection that broke under a call is UNAVAILABLE in gRPC's terms (tonic alone says
    // UNKNOWN "transport error").
    for (_, status) in &errors {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    fleet::wait_until("in-flight counts back to 0", LIMIT, || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
}

// 5. An instance that never answers, and calls with a deadline.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_instance_costs_few_calls_which_end_by_their_deadline() {
    const TASKS: u64 = 8;
    const PER_TASK: u64 = 50;
    // On the test's runtime ([`LocalFleet`]): on threads of their own, a healthy instance whose
    // thread was served the CPU late answered two calls after their 500 ms deadline once, beside
    // two test suites and two spinning processes.
    let fleet = LocalFleet::start(5, Behavior::Ok).await;
    let hung = &fleet.instances[0];
    hung.set(Behavior::Hang);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let client = FleetClient::new(ch.clone());

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for i in 0..PER_TASK {
                    let mut r = tonic::Request::new(req(t * PER_TASK + i));
                    r.set_timeout(Duration::from_millis(500));
                    let res = tokio::time::timeout(LIMIT, client.unary(r))
                        .await
                        .expect("a call with a 500 ms deadline ended");
                    out.push(res.map(|r| r.into_inner()));
                }
                out
            })
        })
        .collect();
    let mut ok = 0;
    let mut failed = Vec::new();
    for t in tasks {
        for r in t.await.unwrap() {
            match r {
                Ok(reply) => {
                    assert_ne!(reply.instance, hung.name);
                    ok += 1;
                }
                Err(s) => failed.push(s),
            }
        }
    }
    let total = TASKS * PER_TASK;
    assert!(
        ok * 100 >= total * 98,
        "{ok} of {total} succeeded: {failed:?}{}",
        dump(&ch)
    );
    for s in &failed {
        assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    }
    fleet::wait_until("in-flight counts back to 0", LIMIT, || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
}

// 6. Ejection, readmission on probation, the cap, and nothing left.

/// Sequential calls while `uri` stays ejected; returns how many calls provably went out while
/// it was ejected (checked before and after each call: still ejected, same ejection count),
/// asserting that none of them reached it.
async fn calls_while_ejected(
    client: &mut Client,
    ch: &BalancedChannel,
    bad: &fleet::Instance,
    max: usize,
) -> usize {
    let uri = bad.uri();
    let mut clean = 0;
    for id in 0..max as u64 {
        let before = stats(ch, &uri);
        if before.state() != State::Ejected {
            break;
        }
        let served = bad.served();
        let r = unary_bounded(client, id, LIMIT).await;
        let after = stats(ch, &uri);
        if after.state() == State::Ejected && after.ejections() == before.ejections() {
            // Ejected all along: the call cannot have gone to it.
            assert_eq!(bad.served(), served, "a call reached an ejected instance");
            let reply = r.expect("calls go to the healthy instances");
            assert_ne!(reply.instance, bad.name());
            clean += 1;
        }
    }
    clean
}

#[tokio::test]
async fn ejected_then_readmitted_on_probation() {
    let base = Duration::from_millis(500);
    let fleet = Fleet::start(3, Behavior::Ok);
    let bad = &fleet.instances[1];
    let uri = bad.uri();
    bad.set(Behavior::Fail(Code::Unavailable));
    let ejection = Ejection::default()
        .consecutive_failures(3)
        .base_time(base)
        .interval(None);
    let ch = channel(&fleet.uris(), Backoff::default(), ejection);
    let mut client = FleetClient::new(ch.clone());

    // Three failures in a row eject it.
    call_until(&mut client, "ejected after 3 failures", || {
        state(&ch, &uri) == State::Ejected
    })
    .await;
    let s = stats(&ch, &uri);
    assert_eq!(s.ejections(), 1);
    assert_eq!(bad.served(), 3, "ejected at the third failure");

    // No calls while ejected.
    let mut clean = calls_while_ejected(&mut client, &ch, bad, 200).await;

    // Readmitted after base_time, on probation.
    fleet::wait_until("readmitted", LIMIT, || state(&ch, &uri) == State::Ready).await;
    assert_eq!(stats(&ch, &uri).ejections(), 1);

    // On probation one failure ejects it again, for longer.
    let served = bad.served();
    let results = call_until(&mut client, "a call reaches it on probation", || {
        bad.served() > served
    })
    .await;
    let ejected_at = Instant::now();
    assert_eq!(
        results.last().unwrap().as_ref().unwrap_err().code(),
        Code::Unavailable
    );
    let s = stats(&ch, &uri);
    assert_eq!(s.state(), State::Ejected, "{}", dump(&ch));
    assert_eq!(s.ejections(), 2, "one failure on probation ejects");
    assert_eq!(bad.served(), served + 1);

    // It answers OK from now on.
    bad.set(Behavior::Ok);
    clean += calls_while_ejected(&mut client, &ch, bad, 200).await;
    assert!(
        clean >= 10,
        "only {clean} calls checked while ejected (machine too slow?)"
    );

    fleet::wait_until("readmitted again", LIMIT, || {
        state(&ch, &uri) == State::Ready
    })
    .await;
    // The second ejection lasts twice base_time; timers never fire early, so it lasted more
    // than base_time even allowing for the delay in seeing the ejection.
    let second = ejected_at.elapsed();
    assert!(
        second > base,
        "second ejection lasted {second:?}, not longer than the first ({base:?})"
    );

    // Now it answers: it passes probation and stays in.
    let served = bad.served();
    call_until(&mut client, "it serves 20 calls after readmission", || {
        bad.served() >= served + 20
    })
    .await;
    // Past probation, one failure no longer ejects (3 in a row are needed).
    bad.set(Behavior::Fail(Code::Unavailable));
    let served = bad.served();
    call_until(&mut client, "one more failure", || bad.served() > served).await;
    bad.set(Behavior::Ok);
    let s = stats(&ch, &uri);
    assert_eq!(s.state(), State::Ready, "{}", dump(&ch));
    assert_eq!(s.ejections(), 2);
    let served = bad.served();
    for id in 0..300 {
        unary_bounded(&mut client, id, LIMIT)
            .await
            .expect("all instances answer");
    }
    let s = stats(&ch, &uri);
    assert_eq!(s.state(), State::Ready, "{}", dump(&ch));
    assert_eq!(s.ejections(), 2);
    assert!(bad.served() > served, "it keeps getting calls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejection_cap_keeps_half_in() {
    let fleet = Fleet::start(4, Behavior::Ok);
    for i in &fleet.instances[1..] {
        i.set(Behavior::Fail(Code::Unavailable));
    }
    let ejection = Ejection::default()
        .consecutive_failures(3)
        // Long: nothing is readmitted while the test runs.
        .base_time(Duration::from_secs(60))
        .max_time(Duration::from_secs(60))
        .max_ejected_percent(50)
        .interval(None);
    let ch = channel(&fleet.uris(), Backoff::default(), ejection);
    let client = FleetClient::new(ch.clone());

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8u64)
        .map(|t| {
            let (mut client, stop, calls) = (client.clone(), stop.clone(), calls.clone());
            tokio::spawn(async move {
                let mut id = t << 32;
                while !stop.load(Ordering::SeqCst) && calls.load(Ordering::SeqCst) < 20_000 {
                    id += 1;
                    let _ = unary_bounded(&mut client, id, LIMIT).await;
                    calls.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();

    let ejected = || {
        ch.endpoints()
            .iter()
            .filter(|e| e.state() == State::Ejected)
            .count()
    };
    let start = Instant::now();
    let mut max_seen = 0;
    // Sample the states while calls flow: until 2 are ejected and 1,000 more calls went by.
    let mut calls_at_two = None;
    loop {
        let n = ejected();
        max_seen = max_seen.max(n);
        assert!(n <= 2, "{n} ejected at once, cap is 2:{}", dump(&ch));
        if n == 2 && calls_at_two.is_none() {
            calls_at_two = Some(calls.load(Ordering::SeqCst));
        }
        if let Some(c) = calls_at_two {
            if calls.load(Ordering::SeqCst) >= c + 1000 {
                break;
            }
        }
        assert!(
            start.elapsed() < LIMIT && calls.load(Ordering::SeqCst) < 20_000,
            "two instances never ejected:{}",
            dump(&ch)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(ejected(), 2, "{}", dump(&ch));
    assert_eq!(state(&ch, &fleet.instances[0].uri()), State::Ready);
    let total: u32 = ch.endpoints().iter().map(|e| e.ejections()).sum();
    assert_eq!(total, 2, "only two ejections ever:{}", dump(&ch));
    // The failing one left in keeps failing and keeps getting calls.
    let left: Vec<_> = fleet.instances[1..]
        .iter()
        .map(|i| stats(&ch, &i.uri()))
        .filter(|s| s.state() != State::Ejected)
        .collect();
    assert_eq!(left.len(), 1);
    assert!(left[0].consecutive_failures() >= 3, "{}", left[0]);
}

#[tokio::test]
async fn nothing_usable_fails_fast_with_unavailable() {
    let dead = fleet::unreachable_uri();
    let ch = BalancedChannel::from_static([&dead]).unwrap();
    let mut client = FleetClient::new(ch.clone());

    // The first call finds out.
    let err = unary_bounded(&mut client, 0, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    fleet::wait_until("marked failing", LIMIT, || {
        state(&ch, &dead) == State::Failing
    })
    .await;

    // From then on, every call is refused at once.
    for id in 1..=100 {
        let err = unary_bounded(&mut client, id, Duration::from_secs(2))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert!(
            err.message().contains("no usable instance"),
            "message: {:?}",
            err.message()
        );
    }
    assert_eq!(stats(&ch, &dead).started(), 1, "no call was routed to it");
}

// 7. Application errors are answers: they break no run of failures, and eject an instance
// only if it answers them far more often than its peers (the interval rules, gRFC A50); codes
// a user names ordinary never count.

/// The interval rules judging every `every`, over instances with 20 calls or more.
fn judging_often(every: Duration) -> Ejection {
    Ejection::default()
        .interval(Some(every))
        .success_rate_min_calls(20)
        .failure_percentage_min_calls(20)
}

/// Every instance answers NOT_FOUND to a call in ten, at random: chance alone spreads their
/// success rates, and gRFC A50's rule alone (1.9 standard deviations below the mean) ejects
/// some instance in one interval of twenty (`scripts/outlier_false_positives.py`: 4.2% with
/// five instances; this test runs about thirty intervals); the channel also asks that its
/// failures be beyond chance at the others' rate, so nobody is ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_errors_that_every_instance_answers_eject_nobody() {
    let fleet = Fleet::start(
        5,
        Behavior::FailAtRandom {
            p: 0.1,
            code: Code::NotFound,
            delay: Duration::ZERO,
        },
    );
    let ch = builder(&fleet.uris())
        .strategy(Strategy::RoundRobin)
        .ejection(judging_often(Duration::from_millis(250)))
        .build()
        .unwrap();
    let client = FleetClient::new(ch.clone());
    let started = Instant::now();
    let mut failed = Vec::new();
    // Thirty intervals of the rules, at least, whatever the machine's speed.
    while started.elapsed() < Duration::from_millis(250 * 30) {
        failed.extend(concurrent_calls(&client, 4, 1000).await);
    }
    assert!(
        failed.iter().all(|s| s.code() == Code::NotFound),
        "{failed:?}"
    );
    for e in ch.endpoints() {
        assert_eq!(e.ejections(), 0, "{e}:{}", dump(&ch));
        assert_eq!(e.consecutive_failures(), 0, "{e}");
    }
    assert_eq!(ch.stats().ejections_not_enforced(), 0);
}

/// One instance of five answers every call with an application error (FAILED_PRECONDITION:
/// an instance whose local state is broken) while its peers answer OK: no run of failures
/// (application errors are answers), but the interval rules eject it, whatever its code.
/// Named an ordinary code of the service, the same answers eject nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_failing_far_more_than_its_peers_is_ejected_whatever_its_codes() {
    for ordinary in [false, true] {
        let fleet = Fleet::start(5, Behavior::Delay(Duration::from_millis(1)));
        let bad = &fleet.instances[1];
        bad.set(Behavior::Fail(Code::FailedPrecondition));
        // Long enough for 20 calls to each instance: sequential calls (the ejection) take
        // up to 7 ms each on a client beside two spinning processes, 14 per instance in half
        // a second; four callers (nothing ejected) make five times as many.
        let every = if ordinary { 500 } else { 2_000 };
        let mut ejection = judging_often(Duration::from_millis(every));
        if ordinary {
            ejection = ejection.ordinary_codes([Code::FailedPrecondition]);
        }
        let ch = builder(&fleet.uris())
            .strategy(Strategy::RoundRobin)
            .ejection(ejection)
            .build()
            .unwrap();
        let mut client = FleetClient::new(ch.clone());
        if !ordinary {
            call_until(&mut client, "the instance ejected", || {
                state(&ch, &bad.uri()) == State::Ejected
            })
            .await;
            let s = stats(&ch, &bad.uri());
            assert_eq!(s.consecutive_failures(), 0, "{s}");
            continue;
        }
        // Ten intervals' worth of calls and more: nothing ejected.
        concurrent_calls(&FleetClient::new(ch.clone()), 4, 1500).await;
        for e in ch.endpoints() {
            assert_eq!(e.ejections(), 0, "ordinary codes ejected {e}:{}", dump(&ch));
        }
        assert!(stats(&ch, &bad.uri()).failed() >= 200, "{}", dump(&ch));
    }
}

// 8. The success-rate rule: fails a third of its calls, never two in a row.

#[tokio::test]
async fn low_success_rate_ejects_without_consecutive_failures() {
    let fleet = Fleet::start(5, Behavior::Ok);
    let bad = &fleet.instances[4];
    let uri = bad.uri();
    let ejection = Ejection::default()
        .consecutive_failures(5)
        .base_time(Duration::from_secs(60))
        .max_time(Duration::from_secs(60))
        .interval(Some(Duration::from_secs(1)))
        .success_rate_min_calls(20);
    // Round robin, so that every instance gets its fifth of the calls in each interval: least
    // pending with sequential calls sends most of them to the fastest instance, and the rule
    // judges only instances with `success_rate_min_calls` calls in the interval. (With five
    // judged instances, four at 100%, the odd one lies sqrt(4) = 2 deviations below the mean,
    // beyond the default 1.9, whatever its rate.)
    let ch = builder(&fleet.uris())
        .strategy(Strategy::RoundRobin)
        .ejection(ejection)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());

    // The fleet's behaviours are all-or-nothing; calls are sequential, so setting the
    // behaviour before each call scripts the bad instance's calls one by one: every third
    // one fails with UNAVAILABLE.
    let start = Instant::now();
    let mut id = 0;
    while state(&ch, &uri) != State::Ejected {
        assert!(
            start.elapsed() < LIMIT * 2 && id < 200_000,
            "not ejected after {id} calls:{}",
            dump(&ch)
        );
        bad.set(if bad.served() % 3 == 2 {
            Behavior::Fail(Code::Unavailable)
        } else {
            Behavior::Ok
        });
        let _ = unary_bounded(&mut client, id, LIMIT).await;
        id += 1;
        let s = stats(&ch, &uri);
        assert!(s.consecutive_failures() <= 1, "{s}");
        for e in ch.endpoints() {
            if e.uri() != uri {
                assert_eq!(e.ejections(), 0, "a healthy instance was ejected: {e}");
            }
        }
    }
    eprintln!(
        "ejected after {id} calls, {:?}:{}",
        start.elapsed(),
        dump(&ch)
    );
    let s = stats(&ch, &uri);
    assert_eq!(s.ejections(), 1, "{s}");
    assert!(s.consecutive_failures() <= 1, "{s}");
    let failed = s.failed() as f64 / bad.served() as f64;
    assert!((0.25..0.4).contains(&failed), "failure share {failed}");
}

/// A connection that breaks under a call: the status is UNAVAILABLE, its source is the
/// channel's `Error::Unavailable` naming the instance, and the cause is kept as itself, not as
/// text: the chain below it reaches the transport's own error (hyper's, h2's or the socket's),
/// which a caller can downcast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_keeps_its_cause_as_a_typed_source() {
    let mut fleet = Fleet::start(1, Behavior::Hold);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut stream = client
        .server_stream(fleet::pb::Req {
            id: 1,
            count: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..2 {
        stream.message().await.unwrap().expect("2 replies");
    }
    fleet::wait_until("the server holds the call", LIMIT, || fleet.held() == 1).await;
    fleet.instances[0].stop();
    let status = stream.message().await.expect_err("the connection broke");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let mut chain = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&status);
    while let Some(e) = next {
        chain.push(e);
        next = e.source();
    }
    let ours = chain
        .iter()
        .find_map(|e| e.downcast_ref::<tonic_balancer::Error>())
        .unwrap_or_else(|| panic!("no tonic_balancer::Error in {chain:?}"));
    assert!(
        matches!(ours, tonic_balancer::Error::Unavailable { uri, .. } if *uri == fleet.uris()[0]),
        "{ours:?}"
    );
    assert!(
        chain
            .iter()
            .any(|e| e.is::<hyper::Error>() || e.is::<h2::Error>() || e.is::<std::io::Error>()),
        "the transport's error is not in the chain: {chain:?}"
    );
}

/// A call whose only instance refuses its connection says so: the connection could not be
/// opened, not that it broke during the call (there was none).
#[tokio::test]
async fn a_refused_connection_is_named_as_such() {
    let dead = fleet::unreachable_uri();
    let ch = BalancedChannel::from_static([&dead]).unwrap();
    let mut client = FleetClient::new(ch);
    let s = unary_bounded(&mut client, 1, LIMIT).await.unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert!(
        s.message().contains("could not be opened") && !s.message().contains("broke"),
        "{s:?}"
    );
}
