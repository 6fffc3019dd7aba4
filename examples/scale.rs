//! The scale simulation: 100 clients and 1,000 instances, no sockets. A model of
//! the clients, the instances and their queues, driven by the crate's own code: each client's
//! subset comes from the function `Builder::subset` uses (`subset_of` over the instances'
//! `ring_id`s) and each call's instance from the least-pending pick the channel runs
//! (`least_pending` over the client's own calls in flight, with its tie-break turns).
//!
//! ```text
//! cargo run --release --example scale
//! ```
//!
//! It prints, for subsets of 50 (deterministic aperture, this crate's), a full mesh (every
//! client to every instance) and, for comparison, subsets of 50 drawn by rendezvous hashing
//! with a random seed per client (gRPC's A68):
//!
//! - connections, and clients per instance (max / mean);
//! - instance load: calls served per instance (max / mean) and latency percentiles, from a
//!   queueing model: each instance one server, FIFO, exponential service times of 1 ms mean;
//!   calls arrive at random (Poisson) at 70% of the fleet's capacity, each from a client drawn
//!   at random;
//! - stability: for every one of the 1,000 instances, the members of each client's subset
//!   that change when that instance is removed, and when a new instance is added.
//!
//! Targets: with subsetting, max/mean instance load ≤ 1.2 with at most 5% of the
//! full mesh's connections; removing one instance changes on average ≤ 1.1 members per client.
//! Options: `scale [CLIENTS INSTANCES SUBSET SECONDS]` (defaults 100 1000 50 3).
//!
//! `scale picks (subset|all) N [idle]` makes N picks of the channel's own least-pending pick
//! over 1,000 instances (0-3 calls in flight each; `idle`: none), with `subset(50)` (client 7 of
//! 100) or without, for callgrind's instruction count (load-independent, unlike the criterion
//! bench on a shared machine); instructions per pick = (instructions for 2N − instructions for
//! N) / N:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/examples/scale picks subset 20000
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

use tonic_balancer::__bench::{least_pending, ring_id, strides_for, subset_of, Rng, Turn};

/// The tie-break stride of an instance as fast as the others (the crate's `UNIT`).
const STRIDE: u64 = 1 << 16;
const MEAN_SERVICE_S: f64 = 0.001;
const UTILIZATION: f64 = 0.7;

fn name(i: usize) -> String {
    format!("http://10.{}.{}.{}:50051", i >> 16, (i >> 8) & 255, i & 255)
}

/// Each client's subset, as instance numbers, as `Builder::subset(size).subset_client(c,
/// clients)` chooses it among the instances named `names`.
fn aperture(names: &[String], size: usize, clients: usize) -> Vec<Vec<usize>> {
    let ids: Vec<(u64, &str)> = names.iter().map(|n| (ring_id(n), n.as_str())).collect();
    (0..clients)
        .map(|c| subset_of(&ids, size, c, clients))
        .collect()
}

/// A68's random subsetting: the `size` instances with the lowest hash of (client's seed,
/// address).
fn rendezvous(names: &[String], size: usize, clients: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    (0..clients)
        .map(|_| {
            let seed = rng.next_u64();
            let mut h: Vec<(u64, usize)> = names
                .iter()
                .enumerate()
                .map(|(i, n)| (ring_id(&format!("{seed:016x}{n}")), i))
                .collect();
            h.sort_unstable();
            h.into_iter().take(size).map(|(_, i)| i).collect()
        })
        .collect()
}

fn full_mesh(instances: usize, clients: usize) -> Vec<Vec<usize>> {
    vec![(0..instances).collect(); clients]
}

/// max / mean of `xs`.
fn max_over_mean(xs: &[f64]) -> f64 {
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    xs.iter().cloned().fold(0.0, f64::max) / mean
}

/// One client in the model: its members and, per member, its calls in flight and tie-break
/// turn, as its channel keeps them.
struct Client {
    members: Vec<usize>,
    in_flight: Vec<usize>,
    turns: Vec<Turn>,
    strides: Vec<usize>,
    /// The member slots, the items the pick scans.
    slots: Vec<usize>,
}

struct Outcome {
    served_max_over_mean: f64,
    p50_ms: f64,
    p99_ms: f64,
    calls: usize,
}

/// An exponential draw of this mean.
fn exp(rng: &mut Rng, mean: f64) -> f64 {
    -mean * (1.0 - rng.unit()).ln()
}

/// Runs the queueing model for `seconds` of simulated time.
fn simulate(subsets: &[Vec<usize>], instances: usize, seconds: f64, seed: u64) -> Outcome {
    let mut clients: Vec<Client> = subsets
        .iter()
        .map(|m| Client {
            members: m.clone(),
            in_flight: vec![0; m.len()],
            turns: vec![
                Turn {
                    pass: 0,
                    stride: STRIDE,
                    gate: 0,
                };
                m.len()
            ],
            strides: strides_for(m.len()),
            slots: (0..m.len()).collect(),
        })
        .collect();
    let mut rng = Rng::seeded(seed);
    let rate = UTILIZATION * instances as f64 / MEAN_SERVICE_S;
    let mut free_at = vec![0.0f64; instances];
    let mut served = vec![0.0f64; instances];
    // Calls in service or queued: (completion time in ns, client, member slot).
    let mut pending: BinaryHeap<Reverse<(u64, usize, usize)>> = BinaryHeap::new();
    let mut latencies = Vec::new();
    let mut t = 0.0;
    while t < seconds {
        t += exp(&mut rng, 1.0 / rate);
        let now_ns = (t * 1e9) as u64;
        while let Some(Reverse((done, c, slot))) = pending.peek().copied() {
            if done > now_ns {
                break;
            }
            pending.pop();
            clients[c].in_flight[slot] -= 1;
        }
        let c = (rng.next_u64() % clients.len() as u64) as usize;
        let client = &mut clients[c];
        let chosen = least_pending(
            &client.slots,
            &mut rng,
            &client.strides,
            |&s| Some(client.in_flight[s]),
            |&s| client.turns[s],
        )
        .expect("every instance is usable in the model");
        let slot = chosen.index;
        let turn = &mut client.turns[slot];
        turn.pass = turn.pass.max(chosen.floor) + turn.stride;
        client.in_flight[slot] += 1;
        let inst = client.members[slot];
        let start = free_at[inst].max(t);
        let done = start + exp(&mut rng, MEAN_SERVICE_S);
        free_at[inst] = done;
        served[inst] += 1.0;
        latencies.push(done - t);
        pending.push(Reverse(((done * 1e9) as u64, c, slot)));
    }
    latencies.sort_by(f64::total_cmp);
    let q = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize] * 1e3;
    Outcome {
        served_max_over_mean: max_over_mean(&served),
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        calls: latencies.len(),
    }
}

/// Clients per instance, max / mean, and connections in all.
fn spread(subsets: &[Vec<usize>], instances: usize) -> (f64, usize) {
    let mut clients = vec![0.0; instances];
    for s in subsets {
        for &i in s {
            clients[i] += 1.0;
        }
    }
    (max_over_mean(&clients), subsets.iter().map(Vec::len).sum())
}

/// Per client, the members of `before` not in `after` (instances named by `names_*`).
fn moved(before: &[Vec<usize>], after: &[Vec<usize>], map: impl Fn(usize) -> usize) -> Vec<usize> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let a: HashSet<usize> = a.iter().map(|&i| map(i)).collect();
            b.iter().filter(|i| !a.contains(i)).count()
        })
        .collect()
}

/// `picks (subset|all) N [idle]`: N picks over 1,000 instances with 0 to 3 calls in flight
/// each (`idle`: none in flight, every instance ties).
fn picks(which: &str, n: usize, idle: bool) {
    use tonic_balancer::__bench::BenchPicker;
    use tonic_balancer::Strategy;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _enter = rt.enter();
    let p = match which {
        "subset" => BenchPicker::with_subset(1000, Strategy::LeastPending, 50, 7, 100),
        "all" => BenchPicker::new(1000, Strategy::LeastPending),
        other => panic!("picks subset|all N, not {other}"),
    };
    let mut r = Rng::seeded(0xB05);
    for i in 0..p.len() {
        let busy = if idle { 0 } else { (r.next_u64() % 4) as usize };
        p.set(i, busy, std::time::Duration::from_millis(2), true);
    }
    let mut sum = 0usize;
    for _ in 0..n {
        sum += std::hint::black_box(p.pick()).unwrap_or(0);
    }
    println!("{n} picks over {} instances (checksum {sum})", p.len());
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some("picks") {
        let n = raw.get(2).and_then(|n| n.parse().ok()).unwrap_or(10_000);
        let idle = raw.get(3).map(String::as_str) == Some("idle");
        return picks(raw.get(1).map_or("subset", String::as_str), n, idle);
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .expect("numbers: CLIENTS INSTANCES SUBSET SECONDS")
        })
        .collect();
    let arg = |i: usize, default: usize| args.get(i).copied().unwrap_or(default);
    let (clients, instances, size, seconds) = (arg(0, 100), arg(1, 1000), arg(2, 50), arg(3, 3));
    let names: Vec<String> = (0..instances).map(name).collect();
    println!(
        "scale model: {clients} clients x {instances} instances, subsets of {size}; \
         1 ms mean service, {:.0}% utilization, {seconds} s simulated",
        UTILIZATION * 100.0
    );

    let mut rng = Rng::seeded(0x5CA1E);
    let contenders = [
        ("subset (aperture)", aperture(&names, size, clients)),
        ("full mesh", full_mesh(instances, clients)),
        (
            "subset (rendezvous, A68)",
            rendezvous(&names, size, clients, &mut rng),
        ),
    ];
    let mesh = clients * instances;
    println!(
        "\n{:<26} {:>11} {:>8} {:>19} {:>14} {:>8} {:>8} {:>9}",
        "",
        "connections",
        "of mesh",
        "clients per instance",
        "load max/mean",
        "p50 ms",
        "p99 ms",
        "calls"
    );
    for (i, (label, subsets)) in contenders.iter().enumerate() {
        let (clients_ratio, connections) = spread(subsets, instances);
        let o = simulate(subsets, instances, seconds as f64, 0xC0FFEE + i as u64);
        println!(
            "{label:<26} {connections:>11} {:>7.1}% {:>10.2} max/mean {:>14.3} {:>8.2} {:>8.2} {:>9}",
            100.0 * connections as f64 / mesh as f64,
            clients_ratio,
            o.served_max_over_mean,
            o.p50_ms,
            o.p99_ms,
            o.calls,
        );
    }

    // Stability: each instance removed in turn, and a new one added at each of as many
    // places on the ring (a different name each time).
    let before = aperture(&names, size, clients);
    let (mut removal, mut removal_max, mut addition, mut addition_max) = (0usize, 0, 0usize, 0);
    let mut holders = 0usize;
    for gone in 0..instances {
        let mut fewer = names.clone();
        fewer.remove(gone);
        let after = aperture(&fewer, size, clients);
        let m = moved(&before, &after, |i| if i >= gone { i + 1 } else { i });
        holders += before.iter().filter(|s| s.contains(&gone)).count();
        removal += m.iter().sum::<usize>();
        removal_max = removal_max.max(*m.iter().max().unwrap_or(&0));

        let mut more = names.clone();
        more.push(format!("http://10.255.{}.{}:50051", gone >> 8, gone & 255));
        let after = aperture(&more, size, clients);
        let m = moved(&before, &after, |i| i);
        addition += m.iter().sum::<usize>();
        addition_max = addition_max.max(*m.iter().max().unwrap_or(&0));
    }
    let per = (instances * clients) as f64;
    println!(
        "\nstability over {instances} removals and {instances} additions, members moved per client: \
         removal {:.3} on average (max {removal_max}; {:.3} of them the removed instance itself), \
         addition {:.3} on average (max {addition_max})",
        removal as f64 / per,
        holders as f64 / per,
        addition as f64 / per,
    );
}
