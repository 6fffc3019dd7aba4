//! A28's routes and weighted clusters: routes that send each method to its cluster, and a
//! route that splits the calls among clusters by weight, each cluster with its own endpoints. Against go-control-plane, beside gRPC's own client (C-core,
//! through grpcio) on the same snapshots, as the other xDS tests (`xds.rs`, whose helpers these
//! use).
#![cfg(feature = "xds")]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use fleet::xds::{
    Cluster, ClusterEndpoints, ControlPlane, Health, RouteConfig, RouteEntry, Snapshot, VirtualHost,
};
use fleet::{Behavior, Fleet};
use fleet_service as fleet;
use tonic_balancer::ConnectivityState;

use crate::xds::{addrs, channel, locality, only, served_in_a_row, tally, until, LIMIT};

/// Listener `svc`, whose route splits the calls among `split` (cluster, weight); cluster `a`
/// has `a`'s endpoints and `b` has `b`'s, each cluster sent only if the route names it (the
/// control plane answers only for what is asked).
fn split_snapshot(
    version: &str,
    split: &[(&str, u32)],
    a: &[SocketAddr],
    b: &[SocketAddr],
) -> Snapshot {
    let mut s = Snapshot::new(version)
        .listener_rds("svc", "route-svc")
        .weighted_route("route-svc", split);
    for (name, addrs) in [("a", a), ("b", b)] {
        if split.iter().any(|(c, _)| *c == name) {
            s = s
                .cluster(Cluster::eds(name))
                .endpoints(ClusterEndpoints::new(name).locality(locality(addrs, Health::Healthy)));
        }
    }
    s
}

/// The share of `counts` that `who` served.
fn share(counts: &BTreeMap<String, u64>, who: &str) -> f64 {
    let total: u64 = counts.values().sum();
    counts.get(who).copied().unwrap_or(0) as f64 / total as f64
}

/// Weights 3:1 between cluster `a` (two instances) and cluster `b` (one): over 800 calls `b`
/// serves a quarter (Binomial(800, 0.25): 200 ± 12; the bounds are five standard deviations),
/// for this channel and for gRPC's; each cluster's channel is listed among the endpoints and its
/// calls counted in the channel's stats. Weights 1:1 then move the share to a half, and a
/// route to `b` alone ends the split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_clusters_split_the_calls_by_weight() {
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let fleet = Fleet::start(3, Behavior::Ok);
    let x = addrs(&fleet);
    let (a, b) = (&x[..2], &x[2..]);
    cp.set(&split_snapshot("1", &[("a", 3), ("b", 1)], a, b));
    let ch = channel(&cp, "split");
    until(&ch, &cp, "the three instances", 60, |c| c.len() == 3).await;
    assert_eq!(ch.endpoints().len(), 3, "{:?}", ch.endpoints());
    assert_eq!(ch.connectivity(), ConnectivityState::Ready);
    let before = ch.stats().calls();
    let counts = tally(&ch, 800).await;
    assert_eq!(ch.stats().calls() - before, 800, "{}", ch.stats());
    let to_b = share(&counts, "i2");
    assert!((0.173..=0.327).contains(&to_b), "3:1: {counts:?}");

    let bootstrap = cp.bootstrap("split-grpc");
    let Some(mut grpc) =
        tokio::task::block_in_place(|| fleet::xds::GrpcXdsClient::start(&bootstrap, "xds:///svc"))
    else {
        return;
    };
    let (theirs, failed) = tokio::task::block_in_place(|| grpc.calls(800));
    assert_eq!(failed, 0, "{}", grpc.stderr());
    let their_b = share(&theirs, "i2");
    assert!((0.173..=0.327).contains(&their_b), "gRPC, 3:1: {theirs:?}");

    cp.set(&split_snapshot("2", &[("a", 1), ("b", 1)], a, b));
    // 1:1: b's share of 400 calls is a half (200 ± 10; within five deviations once applied).
    until(&ch, &cp, "1:1", 400, |c| {
        (0.375..=0.625).contains(&share(c, "i2"))
    })
    .await;
    // Cluster `a` leaves the snapshot with the route that named it: its channel may see its
    // cluster gone before the channel sees the new route, and a call routed to it then fails
    // (as a gRPC call would: the control plane sent the removal before the new route).
    cp.set(&split_snapshot("3", &[("b", 1)], a, b));
    served_in_a_row(&ch, "i2", "b alone").await;
    fleet::wait_until("the split's channels gone", LIMIT, || {
        ch.endpoints().len() == 1
    })
    .await;
}

/// The instance that answers one server stream of one message.
async fn stream_answered_by(ch: &tonic_balancer::BalancedChannel) -> Result<String, tonic::Status> {
    let mut client = fleet::pb::fleet_client::FleetClient::new(ch.clone());
    let mut stream = client
        .server_stream(fleet::pb::Req {
            count: 1,
            ..Default::default()
        })
        .await?
        .into_inner();
    Ok(stream
        .message()
        .await?
        .map(|m| m.instance)
        .unwrap_or_default())
}

/// A28's routes by path: unary calls (`/fleet.v1.Fleet/Unary`, a whole path) to cluster `a`,
/// every other call to `b`; a prefix that ignores case takes the server streams to `a` too;
/// with no route for every call, a call no route takes fails UNAVAILABLE naming its path.
/// gRPC's client, beside, sends its unary calls to `a` as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_send_each_method_to_its_cluster() {
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let fleet = Fleet::start(2, Behavior::Ok);
    let x = addrs(&fleet);
    let routed = |version: &str, vh: VirtualHost| {
        Snapshot::new(version)
            .listener_rds("svc", "route-svc")
            .route_config(RouteConfig::new("route-svc").virtual_host(vh))
            .cluster(Cluster::eds("a"))
            .cluster(Cluster::eds("b"))
            .endpoints(ClusterEndpoints::new("a").locality(locality(&x[..1], Health::Healthy)))
            .endpoints(ClusterEndpoints::new("b").locality(locality(&x[1..], Health::Healthy)))
    };
    let unary_to_a =
        VirtualHost::to_cluster("b").route_before(RouteEntry::path("/fleet.v1.Fleet/Unary", "a"));
    cp.set(&routed("1", unary_to_a));
    let ch = channel(&cp, "routes");
    until(&ch, &cp, "unary calls to a", 40, only(&["i0"])).await;
    for _ in 0..10 {
        assert_eq!(stream_answered_by(&ch).await.expect("a stream"), "i1");
    }
    let bootstrap = cp.bootstrap("routes-grpc");
    let Some(mut grpc) =
        tokio::task::block_in_place(|| fleet::xds::GrpcXdsClient::start(&bootstrap, "xds:///svc"))
    else {
        return;
    };
    let (theirs, failed) = tokio::task::block_in_place(|| grpc.calls(40));
    assert_eq!(
        (failed, only(&["i0"])(&theirs)),
        (0, true),
        "gRPC: {theirs:?}"
    );

    // Case ignored: the server streams to `a` as well.
    let streams_to_a = VirtualHost::to_cluster("b")
        .route_before(RouteEntry::prefix("/FLEET.v1.fleet/serverstream", "a").case_insensitive());
    cp.set(&routed("2", streams_to_a));
    let start = std::time::Instant::now();
    while stream_answered_by(&ch).await.expect("a stream") != "i0" {
        assert!(start.elapsed() < LIMIT, "streams not routed to a");
    }
    until(&ch, &cp, "unary calls to b", 40, only(&["i1"])).await;

    // No route for every call: a stream, which no route takes, is refused.
    let only_unary = VirtualHost::to_cluster("a").prefix("/fleet.v1.Fleet/Unary");
    cp.set(&routed("3", only_unary));
    until(&ch, &cp, "unary calls to a again", 40, only(&["i0"])).await;
    let refused = stream_answered_by(&ch)
        .await
        .expect_err("no route for streams");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("/fleet.v1.Fleet/ServerStream"),
        "{refused:?}"
    );
}
