//! A28's weighted clusters: a route that splits the calls among clusters by weight, each
//! cluster with its own endpoints. Against go-control-plane, beside gRPC's own client (C-core,
//! through grpcio) on the same snapshots, as the other xDS tests (`xds.rs`, whose helpers these
//! use).
#![cfg(feature = "xds")]

use std::collections::BTreeMap;
use std::net::SocketAddr;

use fleet::xds::{Cluster, ClusterEndpoints, ControlPlane, Health, Snapshot};
use fleet::{Behavior, Fleet};
use fleet_service as fleet;
use tonic_balancer::ConnectivityState;

use crate::xds::{addrs, channel, locality, only, tally, until, LIMIT};

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
    cp.set(&split_snapshot("3", &[("b", 1)], a, b));
    until(&ch, &cp, "b alone", 40, only(&["i2"])).await;
    fleet::wait_until("the split's channels gone", LIMIT, || {
        ch.endpoints().len() == 1
    })
    .await;
}
