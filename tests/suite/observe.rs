//! What the channel tells of itself without a metrics stack: the `tonic_balancer.call` span of
//! each call and the channel's events, as a subscriber sees them (with OpenTelemetry's field
//! names), and the totals of `BalancedChannel::stats`.
use fleet_service as fleet;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet::fields::{Collect, Fields};
use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Fleet};
use tonic::Code;
use tonic_balancer::{BalancedChannel, DiscoveryState, Ejection, RetryPolicy, ServedBy};
use tracing::span::{Attributes, Id, Record};
use tracing::Event;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

const LIMIT: Duration = Duration::from_secs(20);

/// A subscriber layer that keeps the fields of every closed `tonic_balancer.call` span, and of
/// every event of the crate (its message as the field `message`).
#[derive(Clone, Default)]
struct CallSpans {
    open: Arc<Mutex<HashMap<u64, Fields>>>,
    closed: Arc<Mutex<Vec<Fields>>>,
    events: Arc<Mutex<Vec<Fields>>>,
}

impl<S: tracing::Subscriber> Layer<S> for CallSpans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        if attrs.metadata().name() != "tonic_balancer.call" {
            return;
        }
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        self.open.lock().unwrap().insert(id.into_u64(), fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some(fields) = self.open.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Collect(fields));
        }
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        self.events.lock().unwrap().push(fields);
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        if let Some(fields) = self.open.lock().unwrap().remove(&id.into_u64()) {
            self.closed.lock().unwrap().push(fields);
        }
    }
}

impl CallSpans {
    /// Installs the layer for this thread (the tests run on a current-thread runtime, so that
    /// the calls are made and polled here).
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        crate::common::subscribers_per_thread();
        let subscriber = tracing_subscriber::registry().with(self.clone().with_filter(
            tracing_subscriber::filter::filter_fn(|m| m.target().starts_with("tonic_balancer")),
        ));
        tracing::subscriber::set_default(subscriber)
    }

    fn closed(&self) -> Vec<Fields> {
        self.closed.lock().unwrap().clone()
    }

    fn events(&self) -> Vec<Fields> {
        self.events.lock().unwrap().clone()
    }

    /// The events whose message is `message`.
    fn events_named(&self, message: &str) -> Vec<Fields> {
        self.events()
            .into_iter()
            .filter(|f| f.get("message").map(String::as_str) == Some(message))
            .collect()
    }
}

/// Waits for the event `message`, and checks that it came once: its fields.
async fn said_once(spans: &CallSpans, message: &str) -> Fields {
    fleet::wait_until("the warning", LIMIT, || {
        !spans.events_named(message).is_empty()
    })
    .await;
    let mut said = spans.events_named(message);
    assert_eq!(said.len(), 1, "{said:?}");
    said.remove(0)
}

/// Each call is one `tonic_balancer.call` span, closed when the call is over, whose fields
/// (OpenTelemetry's names) are the method (`rpc.method`, without its leading slash), the
/// instance that served it (`server.address`: the one in the response's `ServedBy`), the
/// attempt and the status code (`rpc.grpc.status_code`, its number).
#[tokio::test]
async fn a_call_span_names_the_instance_that_served_it() {
    let spans = CallSpans::default();
    let _guard = spans.install();
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut served = Vec::new();
    for id in 0..6 {
        let resp = client.unary(fleet::req(id)).await.unwrap();
        let by = resp.extensions().get::<ServedBy>().expect("ServedBy");
        served.push(by.uri().to_owned());
    }
    fleet::wait_until("six call spans closed", LIMIT, || spans.closed().len() == 6).await;
    let closed = spans.closed();
    for (fields, by) in closed.iter().zip(&served) {
        assert_eq!(
            fields.get("rpc.method").map(String::as_str),
            Some("fleet.v1.Fleet/Unary"),
            "{fields:?}"
        );
        assert_eq!(fields.get("server.address"), Some(by), "{fields:?}");
        assert_eq!(
            fields.get("attempt").map(String::as_str),
            Some("1"),
            "{fields:?}"
        );
        assert_eq!(
            fields.get("rpc.grpc.status_code").map(String::as_str),
            Some("0"),
            "{fields:?}"
        );
        for old in ["method", "instance", "outcome"] {
            assert!(!fields.contains_key(old), "{old} in {fields:?}");
        }
    }
}

/// An application status is the span's status code; the span still names the instance.
#[tokio::test]
async fn a_call_span_records_the_status_of_a_failed_call() {
    let spans = CallSpans::default();
    let _guard = spans.install();
    let fleet = Fleet::start(1, Behavior::Fail(Code::NotFound));
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch);
    let err = client.unary(fleet::req(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    fleet::wait_until("the call span closed", LIMIT, || spans.closed().len() == 1).await;
    let fields = &spans.closed()[0];
    assert_eq!(
        fields.get("rpc.grpc.status_code").map(String::as_str),
        Some("5"),
        "NOT_FOUND: {fields:?}"
    );
    let uri = fleet.uris()[0].clone();
    assert_eq!(
        fields
            .get("server.address")
            .map(|s| s.trim_end_matches('/')),
        Some(uri.trim_end_matches('/')),
        "{fields:?}"
    );
}

/// A call the retry policy sent again shows its second attempt and the instance that served
/// it, not the one that failed it.
#[tokio::test]
async fn a_retried_call_span_names_the_instance_of_its_last_attempt() {
    let spans = CallSpans::default();
    let _guard = spans.install();
    let fleet = Fleet::start(2, Behavior::Ok);
    fleet.instances[0].set(Behavior::Fail(Code::Unavailable));
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(RetryPolicy::default())
        .ejection(Ejection::disabled())
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let good = fleet.instances[1].uri();
    let mut calls = 0;
    while fleet.instances[0].served() == 0 {
        assert!(calls < 200, "the failing instance never got a call");
        let resp = client.unary(fleet::req(calls)).await.unwrap();
        let by = resp.extensions().get::<ServedBy>().unwrap();
        assert_eq!(by.uri().trim_end_matches('/'), good.trim_end_matches('/'));
        calls += 1;
    }
    fleet::wait_until("every call span closed", LIMIT, || {
        spans.closed().len() == calls as usize
    })
    .await;
    let retried: Vec<Fields> = spans
        .closed()
        .into_iter()
        .filter(|f| f.get("attempt").map(String::as_str) == Some("2"))
        .collect();
    assert_eq!(
        retried.len() as u64,
        fleet.instances[0].served(),
        "{retried:?}"
    );
    for fields in &retried {
        assert_eq!(
            fields
                .get("server.address")
                .map(|s| s.trim_end_matches('/')),
            Some(good.trim_end_matches('/')),
            "{fields:?}"
        );
        assert_eq!(
            fields.get("rpc.grpc.status_code").map(String::as_str),
            Some("0")
        );
    }
    assert_eq!(ch.stats().retries(), fleet.instances[0].served());
}

/// The channel's events name an instance one way, `server.address`, everywhere (no `addr`,
/// `to`, `from` or `instance`): an instance added, its state changes (the new one `state`, the
/// old one `previous.state`), a failed connection; and a call sent again elsewhere because its
/// instance could not be reached names the instance it goes to `server.address` and the one it
/// leaves `previous.server.address`.
#[tokio::test]
async fn events_name_the_instance_server_address() {
    let spans = CallSpans::default();
    let _guard = spans.install();
    let fleet = Fleet::start(1, Behavior::Ok);
    let good = fleet.uris()[0].clone();
    let bad = fleet::unreachable_uri();
    let ch = BalancedChannel::builder()
        .uris([good.clone(), bad.clone()])
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut id = 0;
    // Until the unreachable instance was tried: its call goes to the other one.
    while fleet::stats(&ch, &bad).state() != tonic_balancer::State::Failing {
        assert!(
            id < 200,
            "the unreachable instance never tried:{}",
            fleet::dump(&ch)
        );
        client.unary(fleet::req(id)).await.unwrap();
        id += 1;
    }
    let same = |a: Option<&String>, b: &str| {
        a.map(|a| a.trim_end_matches('/')) == Some(b.trim_end_matches('/'))
    };
    let events = spans.events();
    assert!(!events.is_empty());
    for fields in &events {
        for old in ["addr", "to", "from", "instance", "code"] {
            assert!(!fields.contains_key(old), "{old} in {fields:?}");
        }
    }
    let added = spans.events_named("instance added");
    assert_eq!(added.len(), 2, "{events:#?}");
    for uri in [&good, &bad] {
        assert!(
            added.iter().any(|f| same(f.get("server.address"), uri)),
            "{uri}: {added:#?}"
        );
    }
    let moved = spans.events_named("call sent again: its attempt was not processed");
    assert!(!moved.is_empty(), "{events:#?}");
    for fields in &moved {
        assert!(same(fields.get("server.address"), &good), "{fields:?}");
        assert!(
            same(fields.get("previous.server.address"), &bad),
            "{fields:?}"
        );
    }
    let changes = spans.events_named("instance state changed");
    let failing = changes
        .iter()
        .find(|f| same(f.get("server.address"), &bad))
        .unwrap_or_else(|| panic!("{changes:#?}"));
    assert_eq!(failing.get("state").map(String::as_str), Some("failing"));
    assert!(failing.contains_key("previous.state"), "{failing:?}");
    let refused = spans.events_named("cannot connect to instance; reconnecting with backoff");
    assert!(
        refused.iter().any(|f| same(f.get("server.address"), &bad)),
        "{events:#?}"
    );
}

/// The totals count each call once, each attempt once, and keep the attempts of an instance
/// that left the set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_calls_and_attempts_across_membership_changes() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 60).await;
    let s = ch.stats();
    assert_eq!((s.calls(), s.attempts(), s.retries()), (60, 60, 0), "{s}");
    assert_eq!((s.transparent_retries(), s.refused()), (0, 0), "{s}");
    assert_eq!((s.instances_added(), s.instances_removed()), (3, 0), "{s}");
    assert_eq!(s.discovery_source(), None);
    assert_eq!(s.discovery_state(), None);
    // One instance leaves: once it has drained and is gone, its attempts still count.
    let gone = fleet.uris()[0].clone();
    assert!(ch.remove(&gone).unwrap());
    fleet::wait_until("the removed instance is gone", LIMIT, || {
        ch.endpoints().len() == 2
    })
    .await;
    fleet::calls(&mut client, 10).await;
    let s = ch.stats();
    assert_eq!((s.calls(), s.attempts()), (70, 70), "{s}");
    assert_eq!(s.instances_removed(), 1, "{s}");
    let served: u64 = fleet.served().iter().sum();
    assert_eq!(served, 70);
}

/// A call that finds no usable instance is refused and counted as such; a call whose instance
/// could not be reached counts its one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_refused_calls() {
    let uri = fleet::unreachable_uri();
    let ch = BalancedChannel::from_static([&uri]).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let first = client.unary(fleet::req(1)).await.unwrap_err();
    assert_eq!(first.code(), Code::Unavailable);
    fleet::wait_until("the instance is failing", LIMIT, || {
        fleet::stats(&ch, &uri).state() == tonic_balancer::State::Failing
    })
    .await;
    let second = client.unary(fleet::req(2)).await.unwrap_err();
    assert_eq!(second.code(), Code::Unavailable);
    let s = ch.stats();
    assert_eq!((s.calls(), s.attempts(), s.refused()), (2, 1, 1), "{s}");
}

/// Ejections and retries the budget refused are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_ejections_and_spent_budget() {
    let fleet = Fleet::start(2, Behavior::Ok);
    fleet.instances[0].set(Behavior::Fail(Code::Unavailable));
    // A budget of no retry at all: every retry wanted is refused by it.
    let policy = RetryPolicy::default()
        .budget_ratio(0.0)
        .budget_min_per_sec(0);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(policy)
        .ejection(Ejection::default().consecutive_failures(3))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut failed = 0;
    for id in 0..400 {
        if client.unary(fleet::req(id)).await.is_err() {
            failed += 1;
        }
        if ch.stats().ejections() > 0 {
            break;
        }
    }
    let s = ch.stats();
    let ejections: u64 = ch
        .endpoints()
        .iter()
        .map(|e| u64::from(e.ejections()))
        .sum();
    assert_eq!(s.ejections(), ejections, "{s}");
    assert!(s.ejections() >= 1, "{s}{}", fleet::dump(&ch));
    assert_eq!(s.retries(), 0, "{s}");
    assert_eq!(s.retry_budget_exhausted(), failed, "{s}");
}

/// A discovery source that fails shows as failing, with its error and its count of lookups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_show_the_discovery_source_and_its_last_error() {
    struct Broken;
    impl tonic_balancer::Resolve for Broken {
        fn resolve(
            &self,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<std::net::SocketAddr>, tower::BoxError>>
                    + Send
                    + '_,
            >,
        > {
            Box::pin(async { Err("registry down".into()) })
        }

        fn name(&self) -> String {
            "broken registry".into()
        }
    }
    let ch = BalancedChannel::builder()
        .resolver(Broken)
        .discovery_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    fleet::wait_until("two lookups", LIMIT, || ch.stats().discovery_lookups() >= 2).await;
    let s = ch.stats();
    assert_eq!(s.discovery_source(), Some("broken registry"));
    assert_eq!(s.discovery_state(), Some(DiscoveryState::Failing));
    assert!(s.discovery_failures() >= 2, "{s}");
    assert!(
        s.discovery_error()
            .is_some_and(|e| e.contains("registry down")),
        "{s}"
    );
}

/// A retry policy that names a method no call carries (`GetItem`, a valid name: a service
/// without a package) does nothing, and the channel says so: `stats()` counts the names no call
/// matched, and after 100 calls a warning names them once, with the paths the calls had.
#[tokio::test]
async fn a_policy_that_names_no_call_is_said_once() {
    let spans = CallSpans::default();
    let _guard = spans.install();
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .retry(RetryPolicy::new(["GetItem"]))
        .build()
        .unwrap();
    assert_eq!(ch.stats().unmatched_method_names(), 1);
    let mut client = FleetClient::new(ch.clone());
    for id in 0..100 {
        client.unary(fleet::req(id)).await.unwrap();
    }
    const SAID: &str = "a retry or hedging policy, or a service config's method config, names \
                        methods that no call of this channel has matched: it does nothing for \
                        them (a method is named `package.Service/Method`, as the calls' paths are)";
    let said = said_once(&spans, SAID).await;
    assert_eq!(
        said.get("unmatched").map(String::as_str),
        Some("[\"/GetItem/\"]")
    );
    assert_eq!(
        said.get("calls_seen").map(String::as_str),
        Some("[\"/fleet.v1.Fleet/Unary\"]")
    );
    assert_eq!(ch.stats().unmatched_method_names(), 1);
    // Named as the calls' paths are, the policy matches them.
    let b = BalancedChannel::builder().retry(RetryPolicy::new(["fleet.v1.Fleet/Unary"]));
    assert_eq!(unmatched_after_one_call(b, &fleet).await, 0);
    // A hedging policy's names alike: a misspelt service matches no call, the right one does.
    let b = BalancedChannel::builder().hedging(tonic_balancer::HedgingPolicy::new(
        ["fleet.v1.Flete", "fleet.v1.Fleet"],
        Duration::from_secs(1),
    ));
    assert_eq!(unmatched_after_one_call(b, &fleet).await, 1);
}

/// The names no call matched, of a channel built by `builder` over `fleet`, after one unary
/// call.
async fn unmatched_after_one_call(builder: tonic_balancer::Builder, fleet: &Fleet) -> u64 {
    let ch = builder.uris(fleet.uris()).build().unwrap();
    FleetClient::new(ch.clone())
        .unary(fleet::req(1))
        .await
        .unwrap();
    ch.stats().unmatched_method_names()
}

/// Method names pinned for the metrics' labels that no call has (`Unary` alone, a service of
/// that name; a misspelt service) label nothing, and the channel says so as it does for
/// policies: counted in `stats()`, and named once in a warning after 100 calls. A pinned name
/// counts until a call has it.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_methods_that_name_no_call_are_said_once() {
    let spans = CallSpans::default();
    let _guard = spans.install();
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_methods(["fleet.v1.Fleet/Unary", "Unary", "fleet.v1.Flete"])
        .build()
        .unwrap();
    assert_eq!(ch.stats().unmatched_method_names(), 3);
    let mut client = FleetClient::new(ch.clone());
    for id in 0..100 {
        client.unary(fleet::req(id)).await.unwrap();
    }
    assert_eq!(ch.stats().unmatched_method_names(), 2);
    const SAID: &str = "Builder::metrics_methods names methods that no call of this channel has \
                        had: they label nothing, and the calls are labelled `other` (a method is \
                        named `package.Service/Method`, a service `package.Service`)";
    let said = said_once(&spans, SAID).await;
    assert_eq!(
        said.get("unmatched").map(String::as_str),
        Some("[\"Unary\", \"fleet.v1.Flete\"]")
    );
    // A pinned service that a call has is matched.
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .metrics_methods(["fleet.v1.Fleet"])
        .build()
        .unwrap();
    assert_eq!(ch.stats().unmatched_method_names(), 1);
    FleetClient::new(ch.clone())
        .unary(fleet::req(1))
        .await
        .unwrap();
    assert_eq!(ch.stats().unmatched_method_names(), 0);
}
