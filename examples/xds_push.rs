//! From a control plane's push to the first call on a new endpoint: this channel beside gRPC's
//! own xDS client (C-core, through grpcio: `peers/python/xds_client.py`), on the same control
//! plane (go-control-plane, `peers/xds`) and the same snapshots (issue 38's target: no slower
//! than C-core by more than 10 ms, median of 20).
//!
//! Each round replaces the one endpoint of the cluster with an instance neither client has
//! seen (so each connects to it anew): both clients make sequential calls, the snapshot is set,
//! and each notes when the new instance first answers. The time counts from just before the
//! snapshot is handed to the control plane to that answer (the wall clock of each process, on
//! one machine).
//!
//! ```text
//! cargo run --release --features xds --example xds_push [ROUNDS]
//! ```
//!
//! Prints each round and the medians; fails (exit 1) if this channel's median is more than
//! 10 ms over C-core's. `.ci/run` runs it; the figures of a run are in `docs/xds.md`.

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use fleet::pb::fleet_client::FleetClient;
use fleet::xds::{ControlPlane, GrpcXdsClient, Snapshot};
use fleet::{Behavior, Fleet};
use fleet_service as fleet;
use tonic_balancer::xds::Bootstrap;
use tonic_balancer::BalancedChannel;

/// How much slower than C-core this channel's median may be.
const MARGIN: Duration = Duration::from_millis(10);
/// The bound of each round, for each client.
const LIMIT: Duration = Duration::from_secs(30);

/// Sequential calls until `name` answers one: when it did. `started` is told once the first
/// call has ended.
async fn until_first(
    ch: BalancedChannel,
    name: String,
    started: tokio::sync::oneshot::Sender<()>,
) -> Option<SystemTime> {
    let mut client = FleetClient::new(ch);
    let mut started = Some(started);
    let begin = Instant::now();
    let mut id = 0;
    while begin.elapsed() < LIMIT {
        id += 1;
        let answer = client.unary(fleet::req(id)).await;
        let at = SystemTime::now();
        if let Some(s) = started.take() {
            let _ = s.send(());
        }
        if answer.is_ok_and(|r| r.get_ref().instance == name) {
            return Some(at);
        }
    }
    None
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("ROUNDS: a number"))
        .unwrap_or(20);
    let Some(mut cp) = ControlPlane::start() else {
        println!("xds_push: skipped (no Go for the control plane peer)");
        return;
    };
    let fleet = Fleet::start(rounds + 1, Behavior::Ok);
    let a: Vec<SocketAddr> = fleet.instances.iter().map(|i| i.addr).collect();
    cp.set(&Snapshot::simple("r0", "svc", &a[..1]));
    let bootstrap = Bootstrap::from_json(&cp.bootstrap("push")).expect("a bootstrap");
    let ch = BalancedChannel::builder()
        .xds("xds:///svc")
        .xds_bootstrap(bootstrap)
        .build()
        .expect("an xDS channel");
    let Some(mut grpc) = tokio::task::block_in_place(|| {
        GrpcXdsClient::start(&cp.bootstrap("push-grpc"), "xds:///svc")
    }) else {
        println!("xds_push: skipped (no Python for gRPC's client)");
        return;
    };
    // Both on the first instance before the first round.
    FleetClient::new(ch.clone())
        .unary(fleet::req(0))
        .await
        .expect("the channel's first call");
    let (_, failed) = tokio::task::block_in_place(|| grpc.calls(1));
    assert_eq!(failed, 0, "gRPC's first call: {}", grpc.stderr());
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    println!("round  this channel  C-core (grpcio)");
    for k in 1..=rounds {
        let name = format!("i{k}");
        tokio::task::block_in_place(|| grpc.start_until(&name, LIMIT));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(until_first(ch.clone(), name.clone(), tx));
        rx.await.expect("the channel is calling");
        let pushed = SystemTime::now();
        cp.set(&Snapshot::simple(format!("r{k}"), "svc", &a[k..=k]));
        let our_first = task.await.expect("the task").unwrap_or_else(|| {
            panic!(
                "round {k}: {name} never answered this channel: {}",
                ch.stats()
            )
        });
        let (their_first, calls, failed) = tokio::task::block_in_place(|| grpc.until_first(LIMIT));
        let their_first = their_first.unwrap_or_else(|| {
            panic!(
                "round {k}: {name} never answered C-core ({calls} calls, {failed} failed): {}",
                grpc.stderr()
            )
        });
        let us = our_first.duration_since(pushed).unwrap_or_default();
        let them = their_first.duration_since(pushed).unwrap_or_default();
        println!(
            "{k:>5}  {:>9.1} ms  {:>9.1} ms",
            us.as_secs_f64() * 1e3,
            them.as_secs_f64() * 1e3
        );
        ours.push(us);
        theirs.push(them);
    }
    let (us, them) = (median(ours), median(theirs));
    println!(
        "median over {rounds} rounds: this channel {:.1} ms, C-core {:.1} ms (target: at most {} ms more)",
        us.as_secs_f64() * 1e3,
        them.as_secs_f64() * 1e3,
        MARGIN.as_millis()
    );
    if us > them + MARGIN {
        eprintln!("xds_push: this channel's median is more than {MARGIN:?} over C-core's");
        std::process::exit(1);
    }
}
