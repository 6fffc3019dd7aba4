//! Memory and tasks over 10,000 xDS updates (issue 38's target: flat): one xDS channel follows a
//! real control plane (go-control-plane, `peers/xds`, as the xDS tests run it) through 10,000
//! endpoint assignments, each of which changes the set (one instance of three in or out, weights
//! changed), each applied before the next is sent. Every 1,000 updates, once the leaving
//! instances have drained and 100 calls went through, it reads the bytes the process holds (a
//! counting allocator: everything the process allocates, the fleet's servers and the control
//! plane harness included) and the tokio tasks alive.
//!
//! ```text
//! cargo run --release --features xds --example xds_updates [UPDATES]
//! ```
//!
//! Fails (exit 1) if the tasks alive at a checkpoint are more than [`TASK_SLACK`] above the
//! first checkpoint's (a task left behind every 1,000 updates would be 9 above it at the last),
//! or if the bytes held grow by more than [`SLACK_PER_UPDATE`] per update over the checkpoints
//! (the slope of a least-squares line: one reading moves by some 20 KB with what is in flight at
//! that moment; a leak of 16 bytes per update read 22.8). `.ci/run` runs it; the figures of a
//! run are in `docs/xds.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::xds::{Cluster, ClusterEndpoints, ControlPlane, Health, Locality, Snapshot};
use fleet::{Behavior, Fleet};
use fleet_service as fleet;
use tonic_balancer::xds::Bootstrap;
use tonic_balancer::{BalancedChannel, State};

/// The allocator of the process, counting the bytes it holds.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is passed to `System` as is; the counter only adds and subtracts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The growth of the bytes held that counts as flat, per update.
const SLACK_PER_UPDATE: f64 = 10.0;
/// The tasks alive above the first checkpoint's that still count as flat: those of a connection
/// that is closing, or of a drained instance's last moments, at the time of the reading.
const TASK_SLACK: usize = 3;
/// Updates between two checkpoints.
const EVERY: usize = 1_000;
/// The bound of each wait (an update applied, the drained instances gone).
const LIMIT: Duration = Duration::from_secs(30);

/// The endpoint assignment of update `k`: `a[0]` and one of the other two, in turn, with
/// weights that change with `k`.
fn snapshot(k: usize, a: &[SocketAddr]) -> (Snapshot, [SocketAddr; 2]) {
    let members = [a[0], a[1 + k % 2]];
    let locality = Locality::new("r1", "z1")
        .endpoint(members[0], Health::Healthy, 1 + (k % 4) as u32)
        .endpoint(members[1], Health::Healthy, 1);
    let snapshot = Snapshot::new(format!("u{k}"))
        .listener_rds("svc", "route-svc")
        .route("route-svc", "svc")
        .cluster(Cluster::eds("svc"))
        .endpoints(ClusterEndpoints::new("svc").locality(locality));
    (snapshot, members)
}

/// The instances in service (not draining), by address.
fn in_service(ch: &BalancedChannel) -> Vec<String> {
    let mut uris: Vec<String> = ch
        .endpoints()
        .into_iter()
        .filter(|e| e.state() != State::Draining)
        .map(|e| e.uri().to_owned())
        .collect();
    uris.sort();
    uris
}

async fn wait(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// The least-squares slope of the bytes held over the updates.
fn slope(readings: &[Reading]) -> f64 {
    let n = readings.len() as f64;
    let mx = readings.iter().map(|r| r.updates as f64).sum::<f64>() / n;
    let my = readings.iter().map(|r| r.held as f64).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for r in readings {
        let dx = r.updates as f64 - mx;
        sxy += dx * (r.held as f64 - my);
        sxx += dx * dx;
    }
    sxy / sxx
}

/// What a checkpoint reads.
#[derive(Debug, Clone, Copy)]
struct Reading {
    updates: usize,
    held: isize,
    tasks: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let updates: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("UPDATES: a number"))
        .unwrap_or(10_000);
    let Some(mut cp) = ControlPlane::start() else {
        println!("xds_updates: skipped (no Go for the control plane peer)");
        return;
    };
    let fleet = Fleet::start(3, Behavior::Ok);
    let a: Vec<SocketAddr> = fleet.instances.iter().map(|i| i.addr).collect();
    let bootstrap = Bootstrap::from_json(&cp.bootstrap("updates")).expect("a bootstrap");
    let ch = BalancedChannel::builder()
        .xds("xds:///svc")
        .xds_bootstrap(bootstrap)
        .build()
        .expect("an xDS channel");
    let mut client = FleetClient::new(ch.clone());
    let mut readings: Vec<Reading> = Vec::new();
    let started = Instant::now();
    for k in 1..=updates {
        let (snapshot, members) = snapshot(k, &a);
        cp.set(&snapshot);
        let mut want: Vec<String> = members.iter().map(|m| format!("http://{m}")).collect();
        want.sort();
        wait(&format!("update {k} applied"), || in_service(&ch) == want).await;
        if k % EVERY == 0 {
            for id in 0..100 {
                client.unary(fleet::req(id)).await.expect("a call");
            }
            wait("the leaving instances drained", || {
                ch.endpoints().len() == 2
            })
            .await;
            let r = Reading {
                updates: k,
                held: HELD.load(Ordering::Relaxed),
                tasks: tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks(),
            };
            println!(
                "after {:>6} updates ({:>5.1} s): {:>9} bytes held, {:>3} tasks alive",
                r.updates,
                started.elapsed().as_secs_f64(),
                r.held,
                r.tasks
            );
            readings.push(r);
        }
    }
    let (Some(first), Some(_)) = (readings.first(), readings.get(1)) else {
        println!("fewer than {} updates: nothing to compare", 2 * EVERY);
        return;
    };
    let mut failed = Vec::new();
    for r in &readings {
        if r.tasks > first.tasks + TASK_SLACK {
            failed.push(format!(
                "{} tasks after {} updates, {} after {}",
                r.tasks, r.updates, first.tasks, first.updates
            ));
        }
    }
    let per_update = slope(&readings);
    println!("growth over the checkpoints (least squares): {per_update:.2} bytes per update (flat: at most {SLACK_PER_UPDATE})");
    if per_update > SLACK_PER_UPDATE {
        failed.push(format!("{per_update:.2} bytes held more per update"));
    }
    if !failed.is_empty() {
        eprintln!("xds_updates: not flat: {failed:?}");
        std::process::exit(1);
    }
}
