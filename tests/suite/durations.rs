//! Every duration and factor a setting takes may be as large as its type allows: `build()`
//! refuses it by name or takes it (a duration as "never"), and nothing panics later, in a call
//! or in a background task. It counts every panic of the process: no test of the suite panics
//! when it passes.
use fleet_service as fleet;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Instance};
use tonic::Code;
use tonic_balancer::orca::WrrConfig;
use tonic_balancer::{
    Backoff, BalancedChannel, Ejection, Error, HedgingPolicy, Resolve, RetryPolicy,
};

const LIMIT: Duration = Duration::from_secs(30);
const MAX: Duration = Duration::MAX;

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Counts every panic of the process, on any thread or task (the suite's: another test's
/// panic while this one runs counts too).
fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::common::on_panic(|info| {
            if let Ok(mut m) = PANICS.lock() {
                m.push(info.to_string());
            }
        });
    });
}

fn no_panic() {
    let panics = PANICS.lock().unwrap();
    assert!(panics.is_empty(), "panicked: {panics:?}");
}

/// A discovery source that counts its lookups and answers with one address.
struct Counting(SocketAddr, Arc<AtomicUsize>);

impl Resolve for Counting {
    fn resolve(
        &self,
    ) -> Pin<
        Box<dyn std::future::Future<Output = Result<Vec<SocketAddr>, tower::BoxError>> + Send + '_>,
    > {
        self.1.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(vec![self.0]) })
    }

    fn name(&self) -> String {
        "counting".into()
    }
}

/// Every duration setting at `Duration::MAX`, and the factors at the largest values they may
/// take: the channel builds, and calls that arm every timer (a hedge after a non-fatal answer,
/// a retry's backoff, a reconnect's backoff, the deadline, the idle connection sweep, the next
/// discovery lookup) go on without a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_longest_durations_panic_nothing() {
    count_panics();
    let failing = Instance::start("failing", Behavior::Fail(Code::Unavailable));
    let ok = Instance::start("ok", Behavior::Ok);
    let unreachable = fleet::unreachable_uri();
    let builder = BalancedChannel::builder()
        .uris([failing.uri(), ok.uri(), unreachable.clone()])
        .backoff(
            Backoff::default()
                .initial(MAX)
                .max(MAX)
                .multiplier(f64::MAX)
                .jitter(1.0)
                .min_connect_timeout(MAX),
        )
        .ejection(
            Ejection::default()
                .base_time(MAX)
                .max_time(MAX)
                .interval(Some(MAX)),
        )
        .retry(
            RetryPolicy::default()
                .initial_backoff(MAX)
                .max_backoff(MAX)
                .multiplier(f64::MAX)
                .budget_ratio(10.0),
        )
        .hedging(
            HedgingPolicy::new(["fleet.v1.Fleet/ServerStream"], MAX)
                .max_attempts(3)
                .budget_ratio(10.0),
        )
        .latency_expiry(MAX)
        .slow_start(MAX)
        .connection_idle_timeout(MAX)
        .max_connections_per_instance(2)
        .max_streams_per_connection(1)
        .load_report_max_age(MAX)
        .load_reports_out_of_band(MAX)
        .weighted_round_robin(
            WrrConfig::default()
                .blackout_period(MAX)
                .weight_expiration_period(MAX)
                .weight_update_period(MAX),
        );
    #[cfg(feature = "health-check")]
    let builder = builder.health_check(
        tonic_balancer::HealthCheck::default()
            .interval(MAX)
            .timeout(MAX),
    );
    let ch = builder
        .build()
        .expect("every duration may be as long as it likes");
    let mut client = FleetClient::new(ch.clone());
    // Calls with a deadline, some retried (the failing instance), one that cannot connect.
    for id in 0..12 {
        let mut req = tonic::Request::new(fleet::req(id));
        req.set_timeout(Duration::from_secs(10));
        let _ = tokio::time::timeout(LIMIT, client.unary(req))
            .await
            .expect("a call ended");
    }
    // A hedged call whose first attempt answers UNAVAILABLE (non-fatal): the next hedge is
    // armed at once.
    for id in 0..4 {
        let _ = tokio::time::timeout(
            LIMIT,
            client.server_stream(fleet::pb::Req {
                id,
                count: 1,
                ..Default::default()
            }),
        )
        .await
        .expect("a hedged call ended");
    }
    // Extra connections opened and their idle sweep armed.
    let calls: Vec<_> = (0..4)
        .map(|id| {
            let mut client = FleetClient::new(ch.clone());
            tokio::spawn(async move { client.unary(fleet::req(id)).await })
        })
        .collect();
    for c in calls {
        let _ = c.await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    no_panic();

    // Discovery asked again "never": its first answer, then a wake-up (an instance found
    // unreachable), which waits at most a second before asking again.
    let lookups = Arc::new(AtomicUsize::new(0));
    let addr: SocketAddr = unreachable.trim_start_matches("http://").parse().unwrap();
    let ch = BalancedChannel::builder()
        .resolver(Counting(addr, lookups.clone()))
        .discovery_interval(MAX)
        .discovery_timeout(MAX)
        .build()
        .unwrap();
    let _ = tokio::time::timeout(LIMIT, FleetClient::new(ch.clone()).unary(fleet::req(1)))
        .await
        .expect("the call ended");
    fleet::wait_until("a second lookup", LIMIT, || {
        lookups.load(Ordering::SeqCst) >= 2
    })
    .await;
    no_panic();
}

/// The factors that make no sense are refused by `build()`, naming the setting, whatever their
/// size: infinities and NaN included.
#[tokio::test]
async fn factors_out_of_range_are_refused_by_name() {
    let cases: Vec<(&str, tonic_balancer::Builder)> = vec![
        (
            "backoff",
            BalancedChannel::builder().backoff(Backoff::default().jitter(f64::INFINITY)),
        ),
        (
            "backoff",
            BalancedChannel::builder().backoff(Backoff::default().jitter(f64::NAN)),
        ),
        (
            "backoff",
            BalancedChannel::builder().backoff(Backoff::default().multiplier(f64::INFINITY)),
        ),
        (
            "retry",
            BalancedChannel::builder().retry(RetryPolicy::default().multiplier(f64::NAN)),
        ),
        (
            "retry",
            BalancedChannel::builder().retry(RetryPolicy::default().budget_ratio(f64::INFINITY)),
        ),
        (
            "hedging",
            BalancedChannel::builder()
                .hedging(HedgingPolicy::new(["a.B/C"], Duration::ZERO).budget_ratio(f64::NAN)),
        ),
        (
            "ejection",
            BalancedChannel::builder()
                .ejection(Ejection::default().success_rate_stdev_factor(f64::NAN)),
        ),
        (
            "weighted_round_robin.error_utilization_penalty",
            BalancedChannel::builder().weighted_round_robin(
                WrrConfig::default().error_utilization_penalty(f64::INFINITY),
            ),
        ),
    ];
    for (want, builder) in cases {
        match builder.uri("http://127.0.0.1:1").build() {
            Err(Error::InvalidSetting { name, .. }) => assert_eq!(name, want),
            other => panic!("{want}: expected InvalidSetting, got {other:?}"),
        }
    }
}
