//! What a cluster says of how to pick and when to eject, applied (`xds::policy`): its
//! load-balancing policy (A52, the `lb_policy` enum) becomes the channel's strategy, and its
//! outlier detection (A50, with Envoy's `consecutive_5xx`) the channel's ejection rules, each
//! where the builder did not choose its own; a channel whose builder chose keeps its choice. Against
//! go-control-plane, as the other xDS tests (`xds.rs`, whose helpers these use).
#![cfg(feature = "xds")]

use std::time::Instant;

use fleet::pb::fleet_client::FleetClient;
use fleet::xds::{
    Cluster, ClusterEndpoints, ControlPlane, Health, LbPolicy, OutlierDetection, Policy,
};
use fleet::{Behavior, Fleet};
use fleet_service as fleet;
use tonic_balancer::xds::Bootstrap;
use tonic_balancer::{BalancedChannel, Ejection, State, Strategy};

use crate::xds::{addrs, channel, locality, only, snapshot_of, until, LIMIT};

/// A channel to `xds:///svc` whose builder chose `strategy` or set `ejection`.
fn chosen(
    cp: &ControlPlane,
    node: &str,
    strategy: Option<Strategy>,
    ejection: Option<Ejection>,
) -> BalancedChannel {
    let bootstrap = Bootstrap::from_json(&cp.bootstrap(node)).expect("the harness's bootstrap");
    let mut b = BalancedChannel::builder()
        .xds("xds:///svc")
        .xds_bootstrap(bootstrap);
    if let Some(s) = strategy {
        b = b.strategy(s);
    }
    if let Some(e) = ejection {
        b = b.ejection(e);
    }
    b.build().expect("an xDS channel")
}

/// With a server stream held open on one instance of three, `n` sequential unary calls: how
/// many went to that instance.
async fn calls_beside_a_held_stream(ch: &BalancedChannel, n: u64) -> u64 {
    let mut client = FleetClient::new(ch.clone());
    let mut stream = client
        .server_stream(fleet::pb::Req {
            count: 1,
            ..Default::default()
        })
        .await
        .expect("a server stream")
        .into_inner();
    let busy = stream
        .message()
        .await
        .expect("the stream's message")
        .expect("a message")
        .instance;
    let mut to_busy = 0;
    for id in 0..n {
        let reply = client
            .unary(fleet::req(id))
            .await
            .expect("a call")
            .into_inner();
        to_busy += u64::from(reply.instance == busy);
    }
    drop(stream);
    to_busy
}

/// The cluster's policy runs, and changes with it: round robin sends a third of the calls to
/// an instance that holds a stream (it ignores load), least request none; a cluster that says
/// nothing runs the channel's default. A channel whose builder chose Peak EWMA keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_policy_runs_where_the_builder_chose_none() {
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let fleet = Fleet::start(3, Behavior::HoldStreams);
    let a = addrs(&fleet);
    let endpoints = || ClusterEndpoints::new("svc").locality(locality(&a, Health::Healthy));
    cp.set(&snapshot_of("1", Cluster::eds("svc"), endpoints()));
    let ch = channel(&cp, "policy");
    let kept = chosen(&cp, "policy", Some(Strategy::PeakEwma), None);
    until(&ch, &cp, "all three", 60, only(&["i0", "i1", "i2"])).await;
    assert_eq!(
        ch.strategy(),
        Strategy::FewestThenFastest,
        "a cluster that says nothing"
    );
    // The default counts calls in flight first: the busy instance gets few calls, fewer than
    // round robin's third. Not none: on a busy machine an idle instance gated for its slow
    // answers weighs its calls by its slowness (up to 4.5), and the busy one (two with this
    // call) can win then; least request, below, never weighs.
    let to_busy = calls_beside_a_held_stream(&ch, 30).await;
    assert!(
        to_busy < 8,
        "the default: {to_busy} of 30 to the busy instance"
    );

    cp.set(&snapshot_of(
        "2",
        Cluster::eds("svc").policy(Policy::round_robin()),
        endpoints(),
    ));
    fleet::wait_until("round robin", LIMIT, || {
        ch.strategy() == Strategy::RoundRobin
    })
    .await;
    let to_busy = calls_beside_a_held_stream(&ch, 30).await;
    assert!(
        (8..=12).contains(&to_busy),
        "round robin: {to_busy} of 30 to the busy instance"
    );

    let least = Policy::wrr_locality(Policy::least_request(Some(2)));
    cp.set(&snapshot_of(
        "3",
        Cluster::eds("svc").policy(least),
        endpoints(),
    ));
    fleet::wait_until("least request", LIMIT, || {
        ch.strategy() == Strategy::LeastPending
    })
    .await;
    assert_eq!(
        calls_beside_a_held_stream(&ch, 30).await,
        0,
        "least request"
    );

    let wrr = Cluster::eds("svc").policy(Policy::wrr());
    cp.set(&snapshot_of("4", wrr, endpoints()));
    fleet::wait_until("weighted round robin", LIMIT, || {
        ch.strategy() == Strategy::WeightedRoundRobin
    })
    .await;
    // The enum, without an A52 list: LEAST_REQUEST is a choice, ROUND_ROBIN its default.
    let enum_least = Cluster::eds("svc").lb_policy(LbPolicy::LeastRequest);
    cp.set(&snapshot_of("5", enum_least, endpoints()));
    fleet::wait_until("LEAST_REQUEST", LIMIT, || {
        ch.strategy() == Strategy::LeastPending
    })
    .await;
    let enum_default = Cluster::eds("svc").lb_policy(LbPolicy::RoundRobin);
    cp.set(&snapshot_of("6", enum_default, endpoints()));
    fleet::wait_until("the channel's default again", LIMIT, || {
        ch.strategy() == Strategy::FewestThenFastest
    })
    .await;
    assert_eq!(kept.strategy(), Strategy::PeakEwma, "the builder's choice");
    let mut client = FleetClient::new(kept.clone());
    client
        .unary(fleet::req(1))
        .await
        .expect("the builder's channel serves");
}

/// The cluster's outlier detection ejects: with `consecutive_5xx` 2, an instance that fails
/// every call is ejected at its second failure (the channel's own rule waits for 5). A
/// channel whose builder set its rules (50 in a row) does not eject it after 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clusters_outlier_detection_ejects_where_the_builder_set_no_rules() {
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let fleet = Fleet::start(3, Behavior::Ok);
    let a = addrs(&fleet);
    let od = OutlierDetection {
        consecutive_5xx: Some(2),
        base_ejection_time_ms: Some(600_000),
        max_ejection_percent: Some(50),
        ..Default::default()
    };
    let cluster = Cluster::eds("svc").outlier_detection(od);
    let endpoints = ClusterEndpoints::new("svc").locality(locality(&a, Health::Healthy));
    cp.set(&snapshot_of("1", cluster, endpoints));
    let ch = channel(&cp, "outlier");
    let kept = chosen(
        &cp,
        "outlier",
        None,
        Some(Ejection::default().consecutive_failures(50)),
    );
    let all = only(&["i0", "i1", "i2"]);
    until(&ch, &cp, "all three", 60, &all).await;
    until(&kept, &cp, "all three, the builder's channel", 60, &all).await;
    let failing = fleet.uris()[0].clone();
    fleet.instances[0].set(Behavior::Fail(tonic::Code::Unavailable));
    let of = |ch: &BalancedChannel| {
        ch.endpoints()
            .into_iter()
            .find(|e| e.uri() == failing)
            .expect("the failing instance is in the set")
    };
    // Calls until the failing instance is ejected (the cluster's rule)...
    let mut client = FleetClient::new(ch.clone());
    let start = Instant::now();
    let mut id = 0;
    while of(&ch).state() != State::Ejected {
        let _ = client.unary(fleet::req(id)).await;
        id += 1;
        assert!(
            start.elapsed() < LIMIT,
            "not ejected within {LIMIT:?}: {:?}",
            ch.endpoints()
        );
    }
    assert_eq!(
        of(&ch).failed(),
        2,
        "ejected at its second failure in a row: {:?}",
        of(&ch)
    );
    // ...and on the builder's channel, until it failed 6 times.
    let mut client = FleetClient::new(kept.clone());
    while of(&kept).failed() < 6 {
        let _ = client.unary(fleet::req(id)).await;
        id += 1;
        assert!(
            start.elapsed() < 2 * LIMIT,
            "6 failures not within {LIMIT:?}: {:?}",
            kept.endpoints()
        );
    }
    assert_ne!(
        of(&kept).state(),
        State::Ejected,
        "the builder's rules: {:?}",
        of(&kept)
    );
}
