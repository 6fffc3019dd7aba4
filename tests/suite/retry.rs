//! The opt-in retry policy and its budget.
use fleet_service as fleet;

use std::time::{Duration, Instant};

use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet, Instance};
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, RetryPolicy};

fn retrying(uris: Vec<String>, policy: RetryPolicy, ejection: Ejection) -> BalancedChannel {
    let b = BalancedChannel::builder()
        .retry(policy)
        .ejection(ejection)
        .uris(&uris);
    b.build().unwrap()
}

/// One instance of five answers UNAVAILABLE (or RESOURCE_EXHAUSTED) at once: with the retry
/// policy on, not one of 1,000 calls fails, and the bad instance did get calls (the retries
/// are what saved them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_policy_hides_a_failing_instance() {
    for code in [Code::Unavailable, Code::ResourceExhausted] {
        let fleet = Fleet::start(5, Behavior::Ok);
        fleet.instances[2].set(Behavior::Fail(code));
        let ch = retrying(fleet.uris(), RetryPolicy::default(), Ejection::default());
        let mut client = FleetClient::new(ch.clone());
        let mut failed = 0;
        for id in 0..1000 {
            if client
                .unary(Req {
                    id,
                    ..Default::default()
                })
                .await
                .is_err()
            {
                failed += 1;
            }
        }
        assert_eq!(failed, 0, "{code:?}: calls failed despite the retry policy");
        assert!(
            fleet.instances[2].served() > 0,
            "the failing instance was never tried"
        );
        fleet::wait_until("counts back to zero", Duration::from_secs(10), || {
            fleet::total_in_flight(&ch) == 0
        })
        .await;
    }
}

/// With every instance failing, the budget caps retries at its ratio (20%) plus its floor
/// (10 per second, and the 10 it starts with), instead of tripling the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_stops_retries_when_everything_fails() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(2));
    // Ejection off: this test is about the budget alone.
    let ejection = Ejection::disabled();
    let ch = retrying(fleet.uris(), policy, ejection);
    let mut client = FleetClient::new(ch);
    let start = Instant::now();
    let calls = 1000u64;
    for id in 0..calls {
        let err = client
            .unary(Req {
                id,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
    }
    let secs = start.elapsed().as_secs_f64();
    let served: u64 = fleet.served().iter().sum();
    let retries = served - calls;
    let allowed = 0.2 * calls as f64 + 10.0 * secs + 10.0 + 2.0;
    assert!(
        (retries as f64) <= allowed,
        "{retries} retries for {calls} calls in {secs:.1}s; the budget allows {allowed:.0}"
    );
    // Without the budget, each call would make 3 attempts.
    assert!(
        retries < calls,
        "{retries} retries: the budget did not bite"
    );
}

/// A retry never outlives the call's deadline: with every instance failing, a backoff that
/// cannot fit in the deadline means no retry (exactly one attempt per call, and the call ends
/// at once with the status it got, not by its deadline); a backoff that fits means every
/// attempt is made.
#[tokio::test]
async fn retries_respect_the_deadline() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    // Ejection off: every call reaches a server, so the attempts can be counted exactly.
    let ejection = Ejection::disabled();
    // (backoff cap, deadline, attempts per call). The backoff is drawn between 0 and its cap:
    // a cap of a day leaves a chance of one in 300,000 per call that it fits in 300 ms; a cap
    // of 10 ms always fits in 5 s, so each call makes its 3 attempts.
    let cases = [
        (Duration::from_secs(86_400), Duration::from_millis(300), 1),
        (Duration::from_millis(10), Duration::from_secs(5), 3),
    ];
    for (backoff, deadline, attempts) in cases {
        let policy = RetryPolicy::default()
            .max_attempts(3)
            .initial_backoff(backoff)
            .max_backoff(backoff)
            // The budget never stops a retry here.
            .budget_ratio(10.0);
        let ch = retrying(fleet.uris(), policy, ejection.clone());
        let mut client = FleetClient::new(ch);
        for id in 0..20 {
            let mut req = tonic::Request::new(Req {
                id,
                ..Default::default()
            });
            req.set_timeout(deadline);
            let before: u64 = fleet.served().iter().sum();
            let start = Instant::now();
            let err = client.unary(req).await.unwrap_err();
            let seen = fleet.served().iter().sum::<u64>() - before;
            // UNAVAILABLE from a server: a call that waited for a backoff past its deadline
            // would end with DEADLINE_EXCEEDED instead.
            assert_eq!(
                err.code(),
                Code::Unavailable,
                "backoff {backoff:?}: {err:?}"
            );
            assert!(
                err.message().contains("scripted to fail"),
                "backoff {backoff:?}: not a server's status: {err:?}"
            );
            assert_eq!(
                seen, attempts,
                "backoff {backoff:?}, deadline {deadline:?}: call {id} made {seen} attempts"
            );
            assert!(
                start.elapsed() < deadline + Duration::from_secs(2),
                "call outlived its deadline"
            );
        }
    }
}

/// Each attempt goes to an instance the call has not tried: with 3 attempts and two failing
/// instances out of three, every call succeeds.
#[tokio::test]
async fn attempts_go_to_untried_instances() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    fleet.instances[1].set(Behavior::Ok);
    let ejection = Ejection::disabled();
    let policy = RetryPolicy::default()
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(1))
        .budget_ratio(10.0);
    let ch = retrying(fleet.uris(), policy, ejection);
    let mut client = FleetClient::new(ch);
    let names = fleet::calls(&mut client, 100).await;
    assert!(names.iter().all(|n| n == "i1"), "{names:?}");
}

/// A channel over one address (a Kubernetes Service, a VIP) retries on it: with no other
/// instance, a retry goes to the one the call tried, still usable, after its backoff (gRFC A6
/// picks each retry afresh, and the pick may choose the same instance).
#[tokio::test]
async fn a_single_instance_is_retried() {
    let only = Instance::start("only", Behavior::Fail(Code::Unavailable));
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(1));
    let ch = retrying(vec![only.uri()], policy, Ejection::default());
    let mut client = FleetClient::new(ch);
    for id in 0..3 {
        let before = only.served();
        let err = client.unary(fleet::req(id)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        assert_eq!(
            only.served() - before,
            3,
            "call {id}: 3 attempts on the one instance"
        );
    }
    // An answer on a later attempt is the call's.
    only.set(Behavior::Ok);
    client.unary(fleet::req(9)).await.unwrap();
}

/// The budget's token goes with a retry that goes out, not with one that was only decided: a
/// retry whose instance is removed during its wait (a pushback of 300 ms) does not go, and
/// leaves the budget's one token for the next call's retry.
#[tokio::test]
async fn a_retry_that_does_not_go_out_leaves_the_budget_its_token() {
    use crate::scripted::{self, Script};
    let unavailable = || Some(tonic::Status::unavailable("scripted"));
    let mut pushback = tonic::Status::unavailable("pushback");
    pushback
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", "300".parse().unwrap());
    let script = Script::new([Some(pushback), unavailable()]);
    let instances = scripted::start(1, &script);
    let uri = instances[0].uri();
    // One token, and nothing more for a second.
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .initial_backoff(Duration::from_millis(1))
        .max_backoff(Duration::from_millis(1))
        .budget_ratio(0.0)
        .budget_min_per_sec(1);
    let ch = retrying(vec![uri.clone()], policy, Ejection::disabled());
    let mut client = FleetClient::new(ch.clone());
    let first = tokio::spawn(async move { client.unary(fleet::req(1)).await });
    fleet::wait_until(
        "the first attempt answered",
        Duration::from_secs(20),
        || script.calls() == 1 && fleet::total_in_flight(&ch) == 0,
    )
    .await;
    assert!(ch.remove(&uri).unwrap());
    let err = first.await.unwrap().unwrap_err();
    assert_eq!(err.message(), "pushback", "the first answer, not retried");
    ch.insert(tonic::transport::Endpoint::from_shared(uri).unwrap())
        .unwrap();
    FleetClient::new(ch)
        .unary(fleet::req(2))
        .await
        .expect("retried with the budget's token");
    assert_eq!(script.calls(), 3);
}

/// Bad retry settings are refused by build(), naming the setting.
#[tokio::test]
async fn bad_retry_settings_are_refused() {
    for bad in [
        RetryPolicy::default().max_attempts(1),
        RetryPolicy::default().codes([]),
        RetryPolicy::default().multiplier(0.1),
        RetryPolicy::default().max_backoff(Duration::ZERO),
    ] {
        let err = BalancedChannel::builder()
            .uri("http://127.0.0.1:1")
            .retry(bad)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("`retry`"), "{err}");
    }
    // One cap on the attempts, gRPC's 5, for retries and hedges alike (a service config's
    // maxAttempts above it counts as 5, as in gRPC).
    let err = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .retry(RetryPolicy::default().max_attempts(6))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
    assert!(err.to_string().contains('5'), "{err}");
    let err = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .hedging(
            tonic_balancer::HedgingPolicy::new(["a.B/C"], Duration::from_millis(5)).max_attempts(6),
        )
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
    let err = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .max_replay_body(1 << 30)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_replay_body"), "{err}");
}

// -------------------------------------------------------------------------------------------
// Which calls a policy covers: only the methods it names (gRPC's method config rule).

const UNARY: &str = "fleet.v1.Fleet/Unary";
const CLIENT_STREAM: &str = "/fleet.v1.Fleet/ClientStream";
const SERVICE: &str = "fleet.v1.Fleet";

/// A channel over `fleet` with these retry policies: short backoffs, a budget that never
/// stops a retry, no ejection (every attempt reaches a server, so they can be counted).
fn scoped(fleet: &Fleet, policies: Vec<RetryPolicy>) -> BalancedChannel {
    let b = policies.into_iter().fold(
        BalancedChannel::builder()
            .uris(fleet.uris())
            .ejection(Ejection::disabled()),
        |b, p| {
            b.retry(
                p.initial_backoff(Duration::from_millis(1))
                    .max_backoff(Duration::from_millis(1))
                    .budget_ratio(10.0),
            )
        },
    );
    b.build().unwrap()
}

/// The attempts that one unary call and one client-streaming call each made, every instance
/// answering UNAVAILABLE: (unary, client stream).
async fn attempts_per_method(fleet: &Fleet, ch: &BalancedChannel) -> (u64, u64) {
    let mut client = FleetClient::new(ch.clone());
    let before = fleet.served().iter().sum::<u64>();
    let err = client.unary(fleet::req(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let unary = fleet.served().iter().sum::<u64>() - before;
    let before = fleet.served().iter().sum::<u64>();
    let err = client
        .client_stream(futures::stream::iter(vec![fleet::req(2)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let stream = fleet.served().iter().sum::<u64>() - before;
    (unary, stream)
}

/// A policy that names one method retries that method's calls (3 attempts each, on the 3
/// instances) and no other: the client-streaming call, not named, is sent once.
#[tokio::test]
async fn a_method_not_named_is_not_retried() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    let ch = scoped(&fleet, vec![RetryPolicy::new([UNARY]).max_attempts(3)]);
    assert_eq!(attempts_per_method(&fleet, &ch).await, (3, 1));
    // And the other way round, named with its leading `/`.
    let ch = scoped(
        &fleet,
        vec![RetryPolicy::new([CLIENT_STREAM]).max_attempts(3)],
    );
    assert_eq!(attempts_per_method(&fleet, &ch).await, (1, 3));
}

/// A policy that names a service covers every method of it, and only of it.
#[tokio::test]
async fn a_service_wide_policy_covers_its_methods() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    let ch = scoped(&fleet, vec![RetryPolicy::new([SERVICE]).max_attempts(3)]);
    assert_eq!(attempts_per_method(&fleet, &ch).await, (3, 3));
    // Another service (a prefix of this one's name included) covers none of them.
    for other in ["other.v1.Other", "fleet.v1.Flee", "fleet.v1"] {
        let ch = scoped(&fleet, vec![RetryPolicy::new([other]).max_attempts(3)]);
        assert_eq!(attempts_per_method(&fleet, &ch).await, (1, 1), "{other}");
    }
}

/// A method's own policy wins over its service's, and a service's over the default (every
/// method), whichever order they were given in; the others keep theirs.
#[tokio::test]
async fn a_methods_own_policy_wins() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    let service = RetryPolicy::new([SERVICE]).max_attempts(3);
    let method = RetryPolicy::new([UNARY]).max_attempts(2);
    for policies in [
        vec![service.clone(), method.clone()],
        vec![method.clone(), service.clone()],
    ] {
        let ch = scoped(&fleet, policies);
        assert_eq!(attempts_per_method(&fleet, &ch).await, (2, 3));
    }
    // The method's own policy does not retry UNAVAILABLE: its calls are not retried, though
    // its service's policy would.
    let own = RetryPolicy::new([UNARY]).codes([Code::ResourceExhausted]);
    let ch = scoped(&fleet, vec![own, service.clone()]);
    assert_eq!(attempts_per_method(&fleet, &ch).await, (1, 3));
    // A method's policy over the default (every method), which covers the other method.
    let every = RetryPolicy::default().max_attempts(2);
    let ch = scoped(
        &fleet,
        vec![every.clone(), RetryPolicy::new([UNARY]).max_attempts(3)],
    );
    assert_eq!(attempts_per_method(&fleet, &ch).await, (3, 2));
    // A service's policy over the default.
    let ch = scoped(
        &fleet,
        vec![RetryPolicy::new([SERVICE]).max_attempts(3), every],
    );
    assert_eq!(attempts_per_method(&fleet, &ch).await, (3, 3));
    // A hedging policy for the method: hedged (its non-fatal UNAVAILABLE sends the next
    // attempt at once), and not retried on top.
    let hedging =
        tonic_balancer::HedgingPolicy::new([UNARY], Duration::from_secs(600)).max_attempts(2);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .ejection(Ejection::disabled())
        .retry(service.budget_ratio(10.0))
        .hedging(hedging.budget_ratio(10.0))
        .build()
        .unwrap();
    assert_eq!(attempts_per_method(&fleet, &ch).await, (2, 3));
}

/// Contradictory or malformed names are refused by build(), naming the setting and the name.
#[tokio::test]
async fn contradictory_or_malformed_names_are_refused() {
    let hedging = |names: &[&str]| {
        tonic_balancer::HedgingPolicy::new(names.iter().copied(), Duration::from_millis(10))
    };
    let none: [&str; 0] = [];
    let cases: Vec<(Vec<RetryPolicy>, Vec<tonic_balancer::HedgingPolicy>, &str)> = vec![
        (
            vec![
                RetryPolicy::new([UNARY]),
                RetryPolicy::new([format!("/{UNARY}")]),
            ],
            vec![],
            "`retry`: \"fleet.v1.Fleet/Unary\" is named twice",
        ),
        (
            vec![RetryPolicy::new([SERVICE])],
            vec![hedging(&[SERVICE])],
            "\"fleet.v1.Fleet\" is named twice, by a retry policy and by a hedging policy",
        ),
        (
            vec![
                RetryPolicy::default(),
                RetryPolicy::default().max_attempts(4),
            ],
            vec![],
            "every method is named twice",
        ),
        (
            vec![RetryPolicy::new(none)],
            vec![],
            "`retry`: the policy names no method",
        ),
        (
            vec![RetryPolicy::new(["fleet.v1.Fleet/Unary/x"])],
            vec![],
            "`retry`: method name \"fleet.v1.Fleet/Unary/x\"",
        ),
        (
            vec![RetryPolicy::new(["fleet Fleet"])],
            vec![],
            "\"fleet Fleet\"",
        ),
        (
            vec![
                RetryPolicy::new([UNARY]),
                RetryPolicy::new([SERVICE]).budget_ratio(0.5),
            ],
            vec![],
            "one budget",
        ),
    ];
    for (retry, hedging, want) in cases {
        let b = retry.into_iter().fold(
            BalancedChannel::builder().uri("http://127.0.0.1:1"),
            |b, p| b.retry(p),
        );
        let b = hedging.into_iter().fold(b, |b, p| b.hedging(p));
        let err = b.build().unwrap_err().to_string();
        assert!(err.contains(want), "want {want:?} in: {err}");
    }
}
