//! gRPC service configs (feature `service-config`): each field's effect, observed through real
//! calls on the test fleet where it is behaviour (instances in memory on tokio's paused clock
//! where time is: backoffs, deadlines, hedging delays), and malformed configs, each refused
//! naming its JSON path.
#![cfg(feature = "service-config")]
use fleet_service as fleet;

use std::time::Duration;

use fleet::memory::MemoryInstance;
use fleet::pb::fleet_client::FleetClient;
use fleet::pb::{Reply, Req};
use fleet::{req, Behavior, Fleet, Instance};
use tokio::time::Instant;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, RetryPolicy, ServiceConfig, Strategy};

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);
/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(20);

fn config(json: &str) -> ServiceConfig {
    ServiceConfig::from_json(json).unwrap_or_else(|e| panic!("{e}\n{json}"))
}

/// A channel over instances in memory with this config. Ejection off: the tests count
/// attempts, and an instance ejected for its scripted failures would change them.
fn channel(instances: &[&MemoryInstance], json: &str) -> BalancedChannel {
    instances
        .iter()
        .fold(
            BalancedChannel::builder().ejection(Ejection::disabled()),
            |b, i| i.add_to(b),
        )
        .service_config(config(json))
        .build()
        .expect("a valid channel")
}

fn served(instances: &[&MemoryInstance]) -> u64 {
    instances.iter().map(|i| i.served()).sum()
}

/// A client-streaming call of one message: a method no config below names.
async fn client_stream(
    client: &mut FleetClient<BalancedChannel>,
    timeout: Option<Duration>,
) -> Result<Reply, tonic::Status> {
    let mut r = tonic::Request::new(futures::stream::iter(vec![req(7)]));
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    client.client_stream(r).await.map(|r| r.into_inner())
}

// -------------------------------------------------------------------------------------------
// methodConfig

/// `retryPolicy` retries the calls of the method it names, after its backoff (random, up to
/// `initialBackoff` × `backoffMultiplier`^n, at most `maxBackoff`), up to `maxAttempts`, for
/// the statuses it names (here by number: 14 is UNAVAILABLE); a method it does not name is
/// sent once.
#[tokio::test(start_paused = true)]
async fn a_retry_policy_retries_the_methods_it_names_after_its_backoff() {
    let a = MemoryInstance::start("a", Behavior::Fail(Code::Unavailable));
    let b = MemoryInstance::start("b", Behavior::Fail(Code::Unavailable));
    let c = MemoryInstance::start("c", Behavior::Fail(Code::Unavailable));
    let all = [&a, &b, &c];
    let ch = channel(
        &all,
        r#"{ "methodConfig": [ {
              "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ],
              "retryPolicy": { "maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1.5s",
                               "backoffMultiplier": 2, "retryableStatusCodes": [ 14 ] } } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    let mut waits = Vec::new();
    for id in 0..20 {
        let before = served(&all);
        let start = Instant::now();
        let status = client.unary(req(id)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(served(&all) - before, 3, "call {id}: 3 attempts");
        waits.push(start.elapsed());
    }
    // Two backoffs: 1 s, then 1.5 s (2 s capped), each 0.8 to 1.2 times that (gRFC A6's
    // jitter): 2 s to 3 s in all; random, so neither always the least nor always the most.
    assert!(
        waits.iter().all(|w| *w >= 2 * SEC && *w <= 3 * SEC),
        "{waits:?}"
    );
    assert!(waits.iter().any(|w| *w > SEC * 5 / 2), "{waits:?}");
    assert!(waits.iter().any(|w| *w < SEC * 5 / 2), "{waits:?}");
    // Not named: sent once, failed at once.
    let before = served(&all);
    let start = Instant::now();
    let status = client_stream(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(served(&all) - before, 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

/// A channel over one address (a Kubernetes Service, a VIP) retries on it, as gRPC does: each
/// retry goes to the instance the call tried, after its backoff. `maxAttempts` 5: five
/// attempts, four backoffs of 1 s × (0.8 to 1.2).
#[tokio::test(start_paused = true)]
async fn a_channel_over_one_address_retries_on_it() {
    let only = MemoryInstance::start("only", Behavior::Fail(Code::Unavailable));
    let ch = channel(
        &[&only],
        r#"{ "methodConfig": [ {
              "name": [ { "service": "fleet.v1.Fleet" } ],
              "retryPolicy": { "maxAttempts": 5, "initialBackoff": "1s", "maxBackoff": "1s",
                               "backoffMultiplier": 1, "retryableStatusCodes": [ "UNAVAILABLE" ] } } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    for id in 0..5 {
        let before = only.served();
        let start = Instant::now();
        let status = client.unary(req(id)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(only.served() - before, 5, "call {id}");
        let took = start.elapsed();
        assert!(took >= 3200 * MS && took <= 4800 * MS, "{took:?}");
    }
}

/// `timeout` is the deadline of a call that sets none, or a later one; a call that sets an
/// earlier one keeps it. The most specific name gives it (the method's, else its service's).
#[tokio::test(start_paused = true)]
async fn a_timeout_is_the_deadline_of_calls_without_an_earlier_one() {
    let a = MemoryInstance::start("a", Behavior::Ok);
    let ch = channel(
        &[&a],
        r#"{ "methodConfig": [
              { "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ], "timeout": "0.25s" },
              { "name": [ { "service": "fleet.v1.Fleet" } ], "timeout": "0.4s" } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    client.unary(req(0)).await.unwrap();
    a.set(Behavior::Hang);
    for (caller, want) in [
        (None, 250 * MS),
        (Some(100 * MS), 100 * MS),
        (Some(SEC), 250 * MS),
    ] {
        let mut r = tonic::Request::new(req(1));
        if let Some(t) = caller {
            r.set_timeout(t);
        }
        let start = Instant::now();
        let status = client.unary(r).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::DeadlineExceeded,
            "{caller:?}: {status:?}"
        );
        assert_eq!(start.elapsed(), want, "caller's timeout {caller:?}");
    }
    // Another method of the service: the service's entry.
    let start = Instant::now();
    let status = client_stream(&mut client, None).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(start.elapsed(), 400 * MS);
}

/// `hedgingPolicy` hedges the calls of the method it names: a second attempt after
/// `hedgingDelay` without an answer, the first answer wins; another method is sent once.
#[tokio::test(start_paused = true)]
async fn a_hedging_policy_hedges_the_methods_it_names() {
    let a = MemoryInstance::start("a", Behavior::Delay(400 * MS));
    let b = MemoryInstance::start("b", Behavior::Delay(400 * MS));
    let both = [&a, &b];
    let ch = channel(
        &both,
        r#"{ "methodConfig": [ {
              "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ],
              "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "0.1s" } } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    // Connections first: the first call on each opens it.
    for id in 0..4 {
        client.unary(req(id)).await.unwrap();
    }
    let before = served(&both);
    let start = Instant::now();
    client.unary(req(9)).await.unwrap();
    assert_eq!(start.elapsed(), 400 * MS, "the first answer ends the call");
    assert_eq!(served(&both) - before, 2, "hedged after 100 ms");
    let before = served(&both);
    let start = Instant::now();
    client_stream(&mut client, None).await.unwrap();
    assert_eq!(start.elapsed(), 400 * MS);
    assert_eq!(served(&both) - before, 1, "not named: not hedged");
}

/// `nonFatalStatusCodes`: an answer with one of them sends the next hedge at once (here both
/// instances answer UNAVAILABLE: 2 attempts, no wait for the 10 s delay); without them, any
/// status is the call's answer.
#[tokio::test(start_paused = true)]
async fn non_fatal_status_codes_send_the_next_hedge_at_once() {
    for (codes, attempts) in [
        (r#", "nonFatalStatusCodes": [ "UNAVAILABLE" ]"#, 2),
        ("", 1),
    ] {
        let a = MemoryInstance::start("a", Behavior::Fail(Code::Unavailable));
        let b = MemoryInstance::start("b", Behavior::Fail(Code::Unavailable));
        let json = format!(
            r#"{{ "methodConfig": [ {{
                  "name": [ {{ "service": "fleet.v1.Fleet" }} ],
                  "hedgingPolicy": {{ "maxAttempts": 2, "hedgingDelay": "10s"{codes} }} }} ] }}"#
        );
        let ch = channel(&[&a, &b], &json);
        let mut client = FleetClient::new(ch);
        for id in 0..5 {
            let before = served(&[&a, &b]);
            let start = Instant::now();
            let status = client.unary(req(id)).await.unwrap_err();
            assert_eq!(status.code(), Code::Unavailable);
            assert_eq!(served(&[&a, &b]) - before, attempts, "{codes:?}");
            assert_eq!(start.elapsed(), Duration::ZERO, "{codes:?}");
        }
    }
}

/// `timeout` as grpc-go reads it: `"0s"` is a deadline already passed, so every call fails at
/// once with DEADLINE_EXCEEDED and nothing is sent; a negative one sets no deadline.
#[tokio::test(start_paused = true)]
async fn a_zero_timeout_fails_calls_at_once_and_a_negative_one_sets_none() {
    let a = MemoryInstance::start("a", Behavior::Delay(5 * SEC));
    let ch = channel(
        &[&a],
        r#"{ "methodConfig": [
              { "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ], "timeout": "0s" },
              { "name": [ { "service": "fleet.v1.Fleet" } ], "timeout": "-1.5s" } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    let start = Instant::now();
    let status = client.unary(req(1)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(a.served(), 0, "sent nothing");
    // The service's entry: no deadline, the answer after 5 s.
    client_stream(&mut client, None).await.unwrap();
    assert_eq!(start.elapsed(), 5 * SEC);
}

/// `hedgingDelay` is optional (gRFC A6): without it, every attempt goes out at once.
#[tokio::test(start_paused = true)]
async fn a_hedging_policy_without_a_delay_sends_every_attempt_at_once() {
    let a = MemoryInstance::start("a", Behavior::Delay(100 * MS));
    let b = MemoryInstance::start("b", Behavior::Delay(100 * MS));
    let c = MemoryInstance::start("c", Behavior::Delay(100 * MS));
    let all = [&a, &b, &c];
    let ch = channel(
        &all,
        r#"{ "methodConfig": [ {
              "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ],
              "hedgingPolicy": { "maxAttempts": 3 } } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    let start = Instant::now();
    client.unary(req(1)).await.unwrap();
    assert_eq!(start.elapsed(), 100 * MS);
    assert_eq!(served(&all), 3, "three attempts at once");
}

/// `backoffMultiplier` below 1 (grpc-go takes any number above zero): each backoff is shorter
/// than the one before. 1 s, then at most 0.5 s, then at most 0.25 s.
#[tokio::test(start_paused = true)]
async fn a_backoff_multiplier_below_one_shrinks_the_backoff() {
    let instances: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| MemoryInstance::start(n, Behavior::Fail(Code::Unavailable)))
        .collect();
    let all: Vec<_> = instances.iter().collect();
    let ch = channel(
        &all,
        r#"{ "methodConfig": [ {
              "name": [ { "service": "fleet.v1.Fleet" } ],
              "retryPolicy": { "maxAttempts": 4, "initialBackoff": "1s", "maxBackoff": "1s",
                               "backoffMultiplier": 0.5, "retryableStatusCodes": [ 14 ] } } ] }"#,
    );
    let mut client = FleetClient::new(ch);
    for id in 0..20 {
        let before = served(&all);
        let start = Instant::now();
        client.unary(req(id)).await.unwrap_err();
        assert_eq!(served(&all) - before, 4);
        // 1.75 s in all, 0.8 to 1.2 times each backoff (gRFC A6's jitter).
        let took = start.elapsed();
        assert!(took >= 1400 * MS && took <= 2100 * MS, "{took:?}");
    }
}

/// A channel over `inst` with this config (the builder's defaults otherwise).
fn channel_to(inst: &Instance, json: &str) -> BalancedChannel {
    BalancedChannel::builder()
        .uri(&inst.uri())
        .service_config(config(json))
        .build()
        .unwrap()
}

/// A request with a payload of `n` bytes.
fn with_payload(id: u64, n: usize) -> Req {
    Req {
        id,
        payload: vec![7; n],
        ..Default::default()
    }
}

/// `maxRequestMessageBytes`: a request message above it fails the call with RESOURCE_EXHAUSTED
/// before it is sent, as grpc-go does: the message reaches no handler, the call is not retried
/// (though its policy retries RESOURCE_EXHAUSTED), and the instance is not blamed. Smaller
/// messages go, and so do the messages of a client stream before the one that is too large.
#[tokio::test]
async fn max_request_message_bytes_fails_a_call_before_its_message_is_sent() {
    let up = Instance::start("up", Behavior::Ok);
    let ch = channel_to(
        &up,
        r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
              "maxRequestMessageBytes": 16,
              "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                               "backoffMultiplier": 1, "retryableStatusCodes": [ "RESOURCE_EXHAUSTED" ] } } ] }"#,
    );
    let mut client = FleetClient::new(ch.clone());
    client.unary(with_payload(1, 8)).await.unwrap();
    let status = client.unary(with_payload(2, 100)).await.unwrap_err();
    assert_eq!(
        up.shared.handled(),
        1,
        "the large message reached no handler"
    );
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "trying to send message larger than max (104 vs. 16)"
    );
    let messages = [with_payload(3, 1), with_payload(4, 1), with_payload(5, 100)];
    let status = client
        .client_stream(futures::stream::iter(messages))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let stats = fleet::stats(&ch, &up.uri());
    assert_eq!(
        (stats.started(), stats.failed()),
        (3, 0),
        "sent once each, no failure"
    );
    fleet::wait_until("counts back to zero", LIMIT, || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
}

/// `maxResponseMessageBytes`: a response message above it fails the call with
/// RESOURCE_EXHAUSTED "grpc: received message larger than max", as grpc-go does; the instance
/// answered, and is not blamed. Smaller answers go through.
#[tokio::test]
async fn max_response_message_bytes_fails_a_call_whose_answer_is_larger() {
    let up = Instance::start("up", Behavior::Ok);
    let ch = channel_to(
        &up,
        r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
              "maxResponseMessageBytes": 16 } ] }"#,
    );
    let mut client = FleetClient::new(ch.clone());
    client.unary(with_payload(1, 0)).await.unwrap();
    let status = client.unary(with_payload(2, 100)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("grpc: received message larger than max (")
            && status.message().ends_with(" vs. 16)"),
        "{status:?}"
    );
    let stats = fleet::stats(&ch, &up.uri());
    assert_eq!(stats.failed(), 0, "the instance answered");
    fleet::wait_until("counts back to zero", LIMIT, || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
}

/// `waitForReady: true`: a call that finds no usable instance (here its only instance refuses
/// connections) waits for one until its deadline, the config's `timeout`, and then fails with
/// DEADLINE_EXCEEDED, as in gRPC, instead of failing at once with UNAVAILABLE.
#[tokio::test]
async fn wait_for_ready_makes_a_call_wait_for_a_usable_instance() {
    let json = r#"{ "methodConfig": [ {
          "name": [ { "service": "fleet.v1.Fleet" } ], "waitForReady": true, "timeout": "0.3s" } ] }"#;
    let down = BalancedChannel::builder()
        .uri(&fleet::unreachable_uri())
        .service_config(config(json))
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    let status = FleetClient::new(down).unary(req(1)).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(start.elapsed() >= 300 * MS, "{:?}", start.elapsed());
}

/// A call's own `WaitForReady` wins over its method's `waitForReady`, as grpc-go's call option
/// does: `false` fails at once where the config waits, `true` waits where it does not.
#[tokio::test]
async fn a_calls_own_wait_for_ready_wins_over_the_configs() {
    use tonic_balancer::WaitForReady;
    for (config_says, call_says, code) in [
        (true, false, Code::Unavailable),
        (false, true, Code::DeadlineExceeded),
    ] {
        let json = format!(
            r#"{{ "methodConfig": [ {{ "name": [ {{ "service": "fleet.v1.Fleet" }} ],
                  "waitForReady": {config_says} }} ] }}"#
        );
        let down = BalancedChannel::builder()
            .uri(&fleet::unreachable_uri())
            .service_config(config(&json))
            .build()
            .unwrap();
        let mut r = tonic::Request::new(req(1));
        r.set_timeout(300 * MS);
        r.extensions_mut().insert(WaitForReady(call_says));
        let status = FleetClient::new(down).unary(r).await.unwrap_err();
        assert_eq!(
            status.code(),
            code,
            "config {config_says}, call {call_says}"
        );
    }
}

/// `waitForReady: false` (gRPC's default): a call that finds no usable instance fails at once
/// with UNAVAILABLE.
#[tokio::test]
async fn without_wait_for_ready_a_call_with_no_usable_instance_fails_at_once() {
    let json = r#"{ "methodConfig": [ {
          "name": [ { "service": "fleet.v1.Fleet" } ], "waitForReady": false } ] }"#;
    let down = BalancedChannel::builder()
        .uri(&fleet::unreachable_uri())
        .service_config(config(json))
        .build()
        .unwrap();
    let status = FleetClient::new(down).unary(req(2)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

/// A config's policy and the builder's take part in one table: the most specific name wins
/// whichever gave it, and a name given a policy by both is refused by build().
#[tokio::test]
async fn config_and_builder_policies_take_part_together() {
    let fleet = Fleet::start(3, Behavior::Fail(Code::Unavailable));
    let json = r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
          "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                           "backoffMultiplier": 1, "retryableStatusCodes": [ "UNAVAILABLE" ] } } ] }"#;
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .ejection(Ejection::disabled())
        .retry(
            RetryPolicy::new(["fleet.v1.Fleet/Unary"])
                .max_attempts(3)
                .initial_backoff(MS)
                .max_backoff(MS),
        )
        .service_config(config(json))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch);
    let before: u64 = fleet.served().iter().sum();
    client.unary(req(1)).await.unwrap_err();
    assert_eq!(
        fleet.served().iter().sum::<u64>() - before,
        3,
        "the builder's, for the method"
    );
    let before: u64 = fleet.served().iter().sum();
    client
        .client_stream(futures::stream::iter(vec![req(2)]))
        .await
        .unwrap_err();
    assert_eq!(
        fleet.served().iter().sum::<u64>() - before,
        2,
        "the config's, for the service"
    );
    let err = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(RetryPolicy::new(["fleet.v1.Fleet"]))
        .service_config(config(json))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`service_config`")
            && err.contains(
                "\"fleet.v1.Fleet\" is named twice, by a retry policy and by methodConfig[0]"
            ),
        "{err}"
    );
}

/// After a server's pushback, the next retry's backoff starts again from `initialBackoff`
/// (gRFC A6), and each attempt after the first says how many went before it
/// (`grpc-previous-rpc-attempts`). The attempts: UNAVAILABLE, UNAVAILABLE with a pushback of
/// 0 ms, UNAVAILABLE, then an answer; the backoffs 50 ms, then 5 s, then 10 s (capped) were it
/// not for the pushback.
#[tokio::test]
async fn a_pushback_restarts_the_backoff_and_each_attempt_counts_those_before() {
    use crate::scripted::{self, status_with, Script};
    let unavailable = || Some(tonic::Status::unavailable("scripted"));
    let pushback = status_with(
        tonic::Status::unavailable("pushback"),
        "grpc-retry-pushback-ms",
        "0",
    );
    let script = Script::new([unavailable(), Some(pushback), unavailable()]);
    let instances = scripted::start(4, &script);
    let ch = BalancedChannel::builder()
        .uris(instances.iter().map(|i| i.uri()).collect::<Vec<_>>())
        .ejection(Ejection::disabled())
        .service_config(config(
            r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
              "retryPolicy": { "maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "10s",
                               "backoffMultiplier": 100, "retryableStatusCodes": [ 14 ] } } ] }"#,
        ))
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    FleetClient::new(ch).unary(req(1)).await.unwrap();
    let took = start.elapsed();
    assert_eq!(script.calls(), 4);
    assert_eq!(
        script.header("grpc-previous-rpc-attempts"),
        [None, Some("1".into()), Some("2".into()), Some("3".into())]
    );
    // 50 ms × (0.8 to 1.2) twice, and nothing for the pushback.
    assert!(took >= 80 * MS && took < 4 * SEC, "{took:?}");
}

// -------------------------------------------------------------------------------------------
// retryThrottling

/// `retryThrottling`: gRPC's token bucket in place of the budget. 4 tokens, 0.1 per success:
/// each UNAVAILABLE takes one, and no retry goes while 2 or fewer are left, so of calls that
/// all fail only the first is retried (the budget would retry the first ten); 30 successes
/// bring 3 tokens back, one failure takes them to 2 (not retried), 11 more successes to 3.1
/// (a failure leaves 2.1: retried).
#[tokio::test(start_paused = true)]
async fn retry_throttling_stops_retries_while_failures_outnumber_successes() {
    let method = r#""methodConfig": [ {
          "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ],
          "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                           "backoffMultiplier": 1, "retryableStatusCodes": [ "UNAVAILABLE" ] } } ]"#;
    let throttled =
        format!(r#"{{ {method}, "retryThrottling": {{ "maxTokens": 4, "tokenRatio": 0.1 }} }}"#);
    let budget = format!("{{ {method} }}");
    for (json, first_five) in [(&throttled, [2, 1, 1, 1, 1]), (&budget, [2, 2, 2, 2, 2])] {
        let a = MemoryInstance::start("a", Behavior::Fail(Code::Unavailable));
        let b = MemoryInstance::start("b", Behavior::Fail(Code::Unavailable));
        let all = [&a, &b];
        let mut client = FleetClient::new(channel(&all, json));
        let mut attempts = Vec::new();
        for _ in 0..5 {
            attempts.push(failing_call(&mut client, &all).await);
        }
        assert_eq!(attempts, first_five, "{json}");
        if json == &budget {
            continue;
        }
        for (successes, after) in [(30, 1), (11, 2)] {
            set(&all, Behavior::Ok);
            fleet::calls(&mut client, successes).await;
            set(&all, Behavior::Fail(Code::Unavailable));
            assert_eq!(
                failing_call(&mut client, &all).await,
                after,
                "after {successes} successes"
            );
        }
    }
}

/// Without `retryThrottling` nothing but `maxAttempts` limits a config's retries, as in gRPC:
/// 20 calls failing everywhere make 60 attempts (the crate's budget for the builder's policies
/// would have stopped them at about 36).
#[tokio::test(start_paused = true)]
async fn without_retry_throttling_nothing_limits_a_configs_retries() {
    let a = MemoryInstance::start("a", Behavior::Fail(Code::Unavailable));
    let b = MemoryInstance::start("b", Behavior::Fail(Code::Unavailable));
    let c = MemoryInstance::start("c", Behavior::Fail(Code::Unavailable));
    let all = [&a, &b, &c];
    let mut client = FleetClient::new(channel(
        &all,
        r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
              "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                               "backoffMultiplier": 1, "retryableStatusCodes": [ "UNAVAILABLE" ] } } ] }"#,
    ));
    let attempts: Vec<u64> = {
        let mut v = Vec::new();
        for _ in 0..20 {
            v.push(failing_call(&mut client, &all).await);
        }
        v
    };
    assert_eq!(attempts, [3; 20]);
}

/// Nor its hedges: each call's first attempt goes to `a`, which answers UNAVAILABLE
/// (non-fatal), and its hedge to `b`, which answers; not one of 60 calls fails (the crate's
/// budget, 10 hedges and one per five calls, would have failed a third of them).
#[tokio::test(start_paused = true)]
async fn without_retry_throttling_nothing_limits_a_configs_hedges() {
    let a = MemoryInstance::start("a", Behavior::Fail(Code::Unavailable));
    let b = MemoryInstance::start("b", Behavior::Ok);
    let mut client = FleetClient::new(channel(
        &[&a, &b],
        r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
              "hedgingPolicy": { "maxAttempts": 2, "hedgingDelay": "10s",
                                 "nonFatalStatusCodes": [ "UNAVAILABLE" ] } } ],
             "loadBalancingConfig": [ { "round_robin": {} } ] }"#,
    ));
    let mut failed = 0;
    for id in 0..60 {
        if client.unary(req(id)).await.is_err() {
            failed += 1;
        }
    }
    assert!(a.served() >= 30, "a got {} first attempts", a.served());
    assert_eq!(failed, 0);
}

/// gRPC's throttle counts as a failure an answer whose pushback says not to retry, whatever its
/// status (gRFC A6, grpc-go): two INVALID_ARGUMENT answers with `grpc-retry-pushback-ms: -1`
/// take 4 tokens to 2, and the next UNAVAILABLE is not retried.
#[tokio::test(start_paused = true)]
async fn retry_throttling_counts_a_pushback_that_says_not_to_retry() {
    let refusal = Behavior::FailWith {
        code: Code::InvalidArgument,
        message: "no".into(),
        key: "grpc-retry-pushback-ms",
        value: "-1".into(),
    };
    let a = MemoryInstance::start("a", refusal.clone());
    let b = MemoryInstance::start("b", refusal);
    let all = [&a, &b];
    let mut client = FleetClient::new(channel(
        &all,
        r#"{ "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet" } ],
              "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.001s", "maxBackoff": "0.001s",
                               "backoffMultiplier": 1, "retryableStatusCodes": [ "UNAVAILABLE" ] } } ],
             "retryThrottling": { "maxTokens": 4, "tokenRatio": 0.1 } }"#,
    ));
    for id in 0..2 {
        let status = client.unary(req(id)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
    }
    set(&all, Behavior::Fail(Code::Unavailable));
    assert_eq!(failing_call(&mut client, &all).await, 1, "throttled");
}

/// The attempts of one unary call that fails with UNAVAILABLE.
async fn failing_call(client: &mut FleetClient<BalancedChannel>, all: &[&MemoryInstance]) -> u64 {
    let before = served(all);
    let status = client.unary(req(1)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    served(all) - before
}

fn set(all: &[&MemoryInstance], behavior: Behavior) {
    for i in all {
        i.set(behavior.clone());
    }
}

// -------------------------------------------------------------------------------------------
// loadBalancingConfig, loadBalancingPolicy

/// The first policy of `loadBalancingConfig` that the channel knows sets its strategy
/// (unknown ones skipped); `pick_first` keeps the strategy it has; the older
/// `loadBalancingPolicy` is read without `loadBalancingConfig`.
#[tokio::test]
async fn load_balancing_config_sets_the_strategy() {
    let cases = [
        (
            r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#,
            Strategy::RoundRobin,
        ),
        (
            r#"{"loadBalancingConfig": [{"grpclb": {"childPolicy": []}}, {"rls_experimental": {}}, {"round_robin": {}}, {"pick_first": {}}]}"#,
            Strategy::RoundRobin,
        ),
        (
            r#"{"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": true}}, {"round_robin": {}}]}"#,
            Strategy::PeakEwma,
        ),
        (
            r#"{"loadBalancingConfig": [{"least_request_experimental": {"choiceCount": 2}}]}"#,
            Strategy::PowerOfTwoChoices,
        ),
        (
            r#"{"loadBalancingConfig": [{"least_request_experimental": {"choiceCount": 40}}]}"#,
            Strategy::LeastPending,
        ),
        (
            r#"{"loadBalancingConfig": [{"tonic_balancer": {"strategy": "least_pending"}}]}"#,
            Strategy::LeastPending,
        ),
        (
            r#"{"loadBalancingConfig": [{"tonic_balancer": {}}]}"#,
            Strategy::FewestThenFastest,
        ),
        (
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {"blackoutPeriod": "1s"}}]}"#,
            Strategy::WeightedRoundRobin,
        ),
        (
            r#"{"loadBalancingPolicy": "ROUND_ROBIN"}"#,
            Strategy::RoundRobin,
        ),
        (r#"{"loadBalancingPolicy": "grpclb"}"#, Strategy::PeakEwma),
        (r#"{"methodConfig": []}"#, Strategy::PeakEwma),
    ];
    for (json, want) in cases {
        // A config without a policy the channel uses keeps the builder's strategy (set first
        // here); one that chooses a strategy does so on a builder that chose none (two choices
        // that differ are refused: below).
        let builder = BalancedChannel::builder().uri("http://127.0.0.1:1");
        let builder = if want == Strategy::PeakEwma {
            builder.strategy(Strategy::PeakEwma)
        } else {
            builder
        };
        let ch = builder.service_config(config(json)).build().unwrap();
        assert_eq!(ch.strategy(), want, "{json}");
    }
    // The builder chose one strategy and the config another: refused, naming both.
    let e = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .strategy(Strategy::PeakEwma)
        .service_config(config(r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#))
        .build()
        .unwrap_err();
    assert!(
        matches!(&e, tonic_balancer::Error::InvalidSetting { name: "service_config", reason, .. }
            if reason.contains("PeakEwma") && reason.contains("RoundRobin")),
        "{e:?}"
    );
}

/// `round_robin`, on real calls: the instances in turn, each the same number of calls.
#[tokio::test]
async fn round_robin_sends_the_calls_in_turn() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .service_config(config(r#"{"loadBalancingConfig": [{"round_robin": {}}]}"#))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch);
    let names = fleet::calls(&mut client, 30).await;
    for pair in names.windows(3) {
        assert!(
            pair[0] != pair[1] && pair[1] != pair[2] && pair[0] != pair[2],
            "{names:?}"
        );
    }
    assert_eq!(fleet.served(), vec![10, 10, 10]);
}

/// `weighted_round_robin` with `enableOobLoadReport`: the channel asks each instance for
/// out-of-band load reports (`OpenRcaService/StreamCoreMetrics`) on its own.
#[tokio::test]
async fn weighted_round_robin_asks_for_out_of_band_reports_when_enabled() {
    let inst = Instance::start("w", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uri(&inst.uri())
        .service_config(config(
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {
                  "enableOobLoadReport": true, "oobReportingPeriod": "1s",
                  "blackoutPeriod": "0s", "weightUpdatePeriod": "0.1s" }}]}"#,
        ))
        .build()
        .unwrap();
    assert_eq!(ch.strategy(), Strategy::WeightedRoundRobin);
    fleet::wait_until("an out-of-band report asked for", LIMIT, || {
        inst.oob_requests() > 0
    })
    .await;
    let mut client = FleetClient::new(ch);
    fleet::calls(&mut client, 3).await;
}

// -------------------------------------------------------------------------------------------
// healthCheckConfig, connectionScaling

/// `healthCheckConfig.serviceName`: each instance is checked for that service, and one that
/// is not serving gets no calls.
#[cfg(feature = "health-check")]
#[tokio::test]
async fn health_check_config_checks_each_instance_for_its_service() {
    let a = Instance::start("a", Behavior::Ok);
    let b = Instance::start("b", Behavior::Ok);
    b.set_serving(false);
    let ch = BalancedChannel::builder()
        .uris([a.uri(), b.uri()])
        .service_config(config(
            r#"{"healthCheckConfig": {"serviceName": "fleet.v1.Fleet"}}"#,
        ))
        .build()
        .unwrap();
    fleet::wait_until("b out", LIMIT, || {
        fleet::stats(&ch, &b.uri()).state() == tonic_balancer::State::Unhealthy
    })
    .await;
    let mut client = FleetClient::new(ch);
    let names = fleet::calls(&mut client, 20).await;
    assert!(names.iter().all(|n| n == "a"), "{names:?}");
    let asked = b.shared.health_asked();
    assert!(
        !asked.is_empty() && asked.iter().all(|(_, service)| service == "fleet.v1.Fleet"),
        "{asked:?}"
    );
}

/// Without the `health-check` feature, `healthCheckConfig` is ignored (a warning is logged):
/// the config is taken, and no instance is asked.
#[cfg(not(feature = "health-check"))]
#[tokio::test]
async fn health_check_config_is_ignored_without_the_feature() {
    let a = Instance::start("a", Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uri(&a.uri())
        .service_config(config(r#"{"healthCheckConfig": {"serviceName": ""}}"#))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch);
    fleet::calls(&mut client, 5).await;
    assert!(a.shared.health_asked().is_empty());
}

/// `connectionScaling.maxConnectionsPerSubchannel`: the connections the channel opens to one
/// instance when each carries its streams (here one each).
#[tokio::test]
async fn connection_scaling_caps_the_connections_per_instance() {
    for (max, conns) in [(1, 1), (2, 2)] {
        let inst = Instance::start("held", Behavior::Hold);
        let json = format!(r#"{{"connectionScaling": {{"maxConnectionsPerSubchannel": {max}}}}}"#);
        let ch = BalancedChannel::builder()
            .uri(&inst.uri())
            .max_streams_per_connection(1)
            .service_config(config(&json))
            .build()
            .unwrap();
        let mut calls = Vec::new();
        for id in 0..2 {
            let mut client = FleetClient::new(ch.clone());
            calls.push(tokio::spawn(async move { client.unary(req(id)).await }));
            let held = id as usize + 1;
            fleet::wait_until("the call held", LIMIT, || inst.held() == held).await;
        }
        assert_eq!(inst.open_connections(), conns, "max {max}");
        inst.release(2);
        for call in calls {
            call.await.unwrap().expect("released");
        }
    }
}

// -------------------------------------------------------------------------------------------
// gRPC's own examples

/// grpc-go's retry example (`examples/features/retry`), as it is but for the service's name:
/// its keys in Go's case (`"MaxAttempts"`), a duration without its leading zero (`".01s"`).
/// grpc-go retries every method of the service, 4 attempts in all; so does the channel.
#[tokio::test]
async fn grpc_gos_retry_example_retries_as_grpc_go_does() {
    let fleet = Fleet::start(4, Behavior::Fail(Code::Unavailable));
    let json = r#"{
		"methodConfig": [{
		  "name": [{"service": "fleet.v1.Fleet"}],
		  "waitForReady": true,
		  "retryPolicy": {
			  "MaxAttempts": 4,
			  "InitialBackoff": ".01s",
			  "MaxBackoff": ".01s",
			  "BackoffMultiplier": 1.0,
			  "RetryableStatusCodes": [ "UNAVAILABLE" ]
		  }
		}]}"#;
    let channel = || {
        BalancedChannel::builder()
            .uris(fleet.uris())
            .ejection(Ejection::disabled())
            .service_config(config(json))
            .build()
            .unwrap()
    };
    let mut client = FleetClient::new(channel());
    for id in 0..3 {
        let before: u64 = fleet.served().iter().sum();
        let status = client.unary(req(id)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(fleet.served().iter().sum::<u64>() - before, 4);
    }
    // With one instance answering, a call reaches it within its 4 attempts.
    fleet.instances[2].set(Behavior::Ok);
    let names = fleet::calls(&mut FleetClient::new(channel()), 1).await;
    assert_eq!(names, ["i2"]);
}

/// The example of gRPC's service config doc (method config, round robin, throttling, health
/// checks) reads whole and configures the channel.
#[tokio::test]
async fn the_documented_example_configures_the_channel() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let json = r#"{ "loadBalancingConfig": [ { "round_robin": {} } ],
      "methodConfig": [ { "name": [ { "service": "fleet.v1.Fleet", "method": "Unary" } ],
          "timeout": "1.5s", "waitForReady": false,
          "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                           "backoffMultiplier": 2, "retryableStatusCodes": [ "UNAVAILABLE" ] } },
        { "name": [ { "service": "fleet.v1.Fleet", "method": "ServerStream" } ],
          "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.02s",
                             "nonFatalStatusCodes": [ "UNAVAILABLE" ] } } ],
      "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 },
      "healthCheckConfig": { "serviceName": "" } }"#;
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .ejection(Ejection::disabled())
        .service_config(config(json))
        .build()
        .unwrap();
    assert_eq!(ch.strategy(), Strategy::RoundRobin);
    let mut client = FleetClient::new(ch);
    fleet.instances[0].set(Behavior::Fail(Code::Unavailable));
    // Round robin sends the failing instance its turns; each such call is retried on the next
    // instance. (Six calls: three failures leave the throttle's bucket above half.)
    let names = fleet::calls(&mut client, 6).await;
    assert!(names.iter().all(|n| n != "i0"), "{names:?}");
    assert!(fleet.instances[0].served() >= 2, "{:?}", fleet.served());
}

// -------------------------------------------------------------------------------------------
// Malformed configs

/// Each malformed config is refused, naming the JSON path of what is wrong and why.
#[test]
fn malformed_configs_are_refused_naming_their_path() {
    let retry = |fields: &str| {
        format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "s.S"}}], "retryPolicy": {{{fields}}}}}]}}"#
        )
    };
    let ok_retry =
        r#""maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2"#;
    let cases: Vec<(String, &str)> = vec![
        ("".into(), "not JSON"),
        ("[]".into(), "must be an object, not a list"),
        (r#"{"methodConfig": {}}"#.into(), "methodConfig: must be a list, not an object"),
        (
            r#"{"methodConfig": [{"name": {"service": "s.S"}}]}"#.into(),
            "methodConfig[0].name: must be a list, not an object",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S", "method": 3}]}]}"#.into(),
            "methodConfig[0].name[0].method: must be a string, not a number",
        ),
        (
            r#"{"methodConfig": [{"name": [{"method": "M"}]}]}"#.into(),
            "methodConfig[0].name[0]: method \"M\" has no service",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}]}, {"name": [{"service": "s.S"}]}]}"#.into(),
            "methodConfig[1].name[0]: \"s.S\" is named already, by methodConfig[0].name[0]",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "timeout": "1500ms"}]}"#.into(),
            "methodConfig[0].timeout: \"1500ms\" is not a duration",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "timeout": 1.5}]}"#.into(),
            "methodConfig[0].timeout: must be a duration such as \"1.5s\", not a number",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "timeout": "-1ms"}]}"#.into(),
            "methodConfig[0].timeout: \"-1ms\" is not a duration",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "waitForReady": "yes"}]}"#.into(),
            "methodConfig[0].waitForReady: must be true or false, not a string",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "maxRequestMessageBytes": -1}]}"#.into(),
            "methodConfig[0].maxRequestMessageBytes: must be a whole number of at least 0, not -1",
        ),
        (
            retry(r#""maxAttempts": 1, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#),
            "methodConfig[0].retryPolicy.maxAttempts: must be at least 2, not 1",
        ),
        (
            retry(r#""maxAttempts": 2, "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#),
            "methodConfig[0].retryPolicy.initialBackoff: required",
        ),
        (
            retry(r#""maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "0s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#),
            "methodConfig[0].retryPolicy.maxBackoff: must be above zero",
        ),
        (
            retry(r#""maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 0, "retryableStatusCodes": ["UNAVAILABLE"]"#),
            "methodConfig[0].retryPolicy.backoffMultiplier: must be a number above zero",
        ),
        (
            retry(r#""maxAttempts": 2, "initialBackoff": "-1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]"#),
            "methodConfig[0].retryPolicy.initialBackoff: \"-1s\": must not be negative (a duration such as \"1.5s\"",
        ),
        (
            retry(&format!(r#"{ok_retry}, "retryableStatusCodes": []"#)),
            "methodConfig[0].retryPolicy.retryableStatusCodes: must name at least one status",
        ),
        (
            retry(ok_retry),
            "methodConfig[0].retryPolicy.retryableStatusCodes: required",
        ),
        (
            retry(&format!(r#"{ok_retry}, "retryableStatusCodes": ["UNAVAILABLE", "OK"]"#)),
            "methodConfig[0].retryPolicy.retryableStatusCodes[1]: OK is not a failure",
        ),
        (
            retry(&format!(r#"{ok_retry}, "retryableStatusCodes": ["unavailable"]"#)),
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]: unknown status code \"unavailable\": the names are upper case (UNAVAILABLE)",
        ),
        (
            retry(&format!(r#"{ok_retry}, "retryableStatusCodes": [17]"#)),
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]: unknown status code 17",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "hedgingPolicy": {"maxAttempts": 1, "hedgingDelay": "1s"}}]}"#.into(),
            "methodConfig[0].hedgingPolicy.maxAttempts: must be at least 2, not 1",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "-0.5s"}}]}"#.into(),
            "methodConfig[0].hedgingPolicy.hedgingDelay: \"-0.5s\": must not be negative",
        ),
        (
            r#"{"methodConfig": [{"name": [{"service": "s.S"}], "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0s", "nonFatalStatusCodes": ["NOPE"]}}]}"#.into(),
            "methodConfig[0].hedgingPolicy.nonFatalStatusCodes[0]: unknown status code \"NOPE\"",
        ),
        (
            format!(
                r#"{{"methodConfig": [{{"name": [{{}}], "retryPolicy": {{{ok_retry}, "retryableStatusCodes": [14]}}, "hedgingPolicy": {{"maxAttempts": 2, "hedgingDelay": "0s"}}}}]}}"#
            ),
            "methodConfig[0]: retryPolicy and hedgingPolicy are both set",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 1001, "tokenRatio": 0.1}}"#.into(),
            "retryThrottling.maxTokens: must be above 0 and at most 1000, not 1001",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0}}"#.into(),
            "retryThrottling.tokenRatio: must be at least 0.001",
        ),
        (
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.0004}}"#.into(),
            "retryThrottling.tokenRatio: must be at least 0.001",
        ),
        (
            r#"{"retryThrottling": {"tokenRatio": 0.1}}"#.into(),
            "retryThrottling.maxTokens: required",
        ),
        (
            r#"{"loadBalancingConfig": {"round_robin": {}}}"#.into(),
            "loadBalancingConfig: must be a list, not an object",
        ),
        (
            r#"{"loadBalancingConfig": [{"round_robin": {}, "pick_first": {}}]}"#.into(),
            "loadBalancingConfig[0]: must hold exactly one policy",
        ),
        (
            r#"{"loadBalancingConfig": [{"grpclb": {}}, {"ring_hash_experimental": {}}]}"#.into(),
            "loadBalancingConfig: names no load-balancing policy this channel knows",
        ),
        (
            r#"{"loadBalancingConfig": [{"round_robin": []}]}"#.into(),
            "loadBalancingConfig[0].round_robin: must be an object, not a list",
        ),
        (
            r#"{"loadBalancingConfig": [{"least_request_experimental": {"choiceCount": 1}}]}"#.into(),
            "loadBalancingConfig[0].least_request_experimental.choiceCount: must be at least 2, not 1",
        ),
        (
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {"errorUtilizationPenalty": -1}}]}"#.into(),
            "loadBalancingConfig[0].weighted_round_robin.errorUtilizationPenalty: must be at least 0, not -1",
        ),
        (
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {"weightExpirationPeriod": "0s"}}]}"#.into(),
            "loadBalancingConfig[0].weighted_round_robin.weightExpirationPeriod: must be above zero",
        ),
        (
            r#"{"loadBalancingConfig": [{"weighted_round_robin": {"blackoutPeriod": "10"}}]}"#.into(),
            "loadBalancingConfig[0].weighted_round_robin.blackoutPeriod: \"10\" is not a duration",
        ),
        (
            r#"{"loadBalancingConfig": [{"tonic_balancer": {"strategy": "fastest"}}]}"#.into(),
            "loadBalancingConfig[0].tonic_balancer.strategy: unknown strategy \"fastest\"",
        ),
        (
            r#"{"loadBalancingPolicy": 5}"#.into(),
            "loadBalancingPolicy: must be a string, not a number",
        ),
        (
            r#"{"healthCheckConfig": {"serviceName": 7}}"#.into(),
            "healthCheckConfig.serviceName: must be a string, not a number",
        ),
        (
            r#"{"connectionScaling": {"maxConnectionsPerSubchannel": 0}}"#.into(),
            "connectionScaling.maxConnectionsPerSubchannel: must be at least 1",
        ),
    ];
    for (json, want) in cases {
        let err = ServiceConfig::from_json(&json).expect_err(&json);
        assert!(
            matches!(
                err,
                tonic_balancer::Error::InvalidSetting {
                    name: "service_config",
                    ..
                }
            ),
            "{err:?}"
        );
        let got = err.to_string();
        assert!(
            got.contains(&format!("`service_config`: {want}")),
            "{json}\n  got: {got}\n want: {want}"
        );
    }
    // What gRPC accepts and this reading takes too.
    for json in [
        "{}",
        r#"{"methodConfig": [{"timeout": "1s"}, {"name": [], "timeout": "bad"}]}"#,
        r#"{"methodConfig": [{"name": [{"service": "s.S", "method": null}], "timeout": ".5s"}]}"#,
        r#"{"methodConfig": [{"name": [{"service": "s.S"}], "retryPolicy": {"maxAttempts": 9, "initialBackoff": "2s", "maxBackoff": "1s", "backoffMultiplier": 1, "retryableStatusCodes": [14, "INTERNAL"]}}]}"#,
        r#"{"retryThrottling": {"maxTokens": 1000, "tokenRatio": 0.001}, "unknownField": [1, 2]}"#,
        r#"{"loadBalancingConfig": [{"weighted_round_robin": {"weightUpdatePeriod": "0.01s", "errorUtilizationPenalty": 0}}]}"#,
        r#"{"connectionScaling": {"maxConnectionsPerSubchannel": 50}}"#,
        // grpc-go takes these: a deadline of zero, a negative timeout (no deadline), a
        // multiplier below 1; gRFC A6 makes hedgingDelay optional.
        r#"{"methodConfig": [{"name": [{"service": "s.S"}], "timeout": "0s"}]}"#,
        r#"{"methodConfig": [{"name": [{"service": "s.S"}], "timeout": "-1s"}]}"#,
        r#"{"methodConfig": [{"name": [{"service": "s.S"}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 0.5, "retryableStatusCodes": [14]}}]}"#,
        r#"{"methodConfig": [{"name": [{"service": "s.S"}], "hedgingPolicy": {"maxAttempts": 2}}]}"#,
    ] {
        ServiceConfig::from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"));
    }
}
