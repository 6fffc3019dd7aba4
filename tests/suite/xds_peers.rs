//! The xDS test peers themselves (`fleet_service::xds`): the go-control-plane control plane and
//! gRPC's own xDS client (C-core through grpcio), real processes on 127.0.0.1, shown to work
//! together on the test fleet before any test of this crate's xDS client relies on them. gRPC's
//! client follows the control plane's snapshots (both instances, then one), and keeps calling
//! through a control plane's death and restart, then follows the restarted one. A peer whose
//! toolchain is missing is skipped (loudly; with `CI=true` it fails).
//!
//! `cargo test --all-features --test suite xds_peers` runs it alone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fleet_service::xds::{ControlPlane, GrpcXdsClient, Snapshot};
use fleet_service::{Behavior, Instance};

/// The bound of each wait for the client to follow a snapshot: it takes well under a second
/// unless something is wrong (a reconnection to a restarted control plane waits for C-core's
/// backoff, 1 s then 1.6 s, ...).
const LIMIT: Duration = Duration::from_secs(60);

/// Batches of `n` calls until one satisfies `done`, every call of every batch succeeding;
/// panics after [`LIMIT`].
fn calls_until(
    client: &mut GrpcXdsClient,
    cp: &ControlPlane,
    what: &str,
    n: usize,
    done: impl Fn(&BTreeMap<String, u64>) -> bool,
) {
    let start = Instant::now();
    loop {
        let (counts, failed) = client.calls(n);
        assert_eq!(
            failed,
            0,
            "{what}: {failed} of {n} calls failed ({counts:?})\n--- the client's stderr ---\n{}\
             \n--- the control plane's ---\n{}",
            client.stderr(),
            cp.stderr()
        );
        if done(&counts) {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "{what}: not within {LIMIT:?}; the last {n} calls went {counts:?}\n\
             --- the client's stderr ---\n{}\n--- the control plane's ---\n{}",
            client.stderr(),
            cp.stderr()
        );
    }
}

#[test]
fn grpc_follows_the_control_plane_through_its_restart() {
    let Some(mut cp) = ControlPlane::start() else {
        return;
    };
    let a = Instance::start("a", Behavior::Ok);
    let b = Instance::start("b", Behavior::Ok);
    cp.set(&Snapshot::simple("1", "svc", &[a.addr, b.addr]));
    let Some(mut client) = GrpcXdsClient::start(&cp.bootstrap("grpcio-peer"), "xds:///svc") else {
        return;
    };

    // Both instances: the cluster names no policy, so gRPC round-robins.
    let (counts, failed) = client.calls(40);
    assert_eq!(
        failed,
        0,
        "{counts:?}\n--- the client's stderr ---\n{}\n--- the control plane's ---\n{}",
        client.stderr(),
        cp.stderr()
    );
    assert_eq!(counts.values().sum::<u64>(), 40, "{counts:?}");
    assert!(
        counts.get("a") > Some(&0) && counts.get("b") > Some(&0),
        "{counts:?}"
    );

    // Only the second.
    cp.set(&Snapshot::simple("2", "svc", &[b.addr]));
    let only_b = |c: &BTreeMap<String, u64>| c.len() == 1 && c.get("b") == Some(&20);
    calls_until(&mut client, &cp, "b alone", 20, only_b);

    // The control plane dies: the client keeps what it has.
    cp.kill();
    calls_until(&mut client, &cp, "b alone, no control plane", 20, only_b);
    // Back, with an empty cache: still what it had.
    cp.restart();
    calls_until(&mut client, &cp, "b alone, an empty cache", 20, only_b);
    // A snapshot with both again: the client hears it from the restarted control plane.
    cp.set(&Snapshot::simple("3", "svc", &[a.addr, b.addr]));
    calls_until(&mut client, &cp, "both after the restart", 20, |c| {
        c.get("a") > Some(&0) && c.get("b") > Some(&0)
    });
    assert!(cp.nacks().is_empty(), "{:?}", cp.nacks());
}
