//! The pick alone: how long each strategy takes to choose an instance, over 10, 50 and 1,000
//! instances, without a network.
//!
//! ```text
//! cargo bench --bench pick
//! ```
//!
//! Groups:
//!
//! - `pick/channel/*`: the channel's own pick, exactly as a call makes it (snapshot load, state,
//!   counts and tie-break state read from the real instance records), one thread. Two fleets: `busy`
//!   (0 to 3 calls in flight, latencies of 2 to 10 ms, one instance in twenty unusable) and
//!   `idle` (nothing in flight, equal latencies: every instance ties, the worst case for the
//!   tie-break). No load reports (see `reported` below).
//! - `pick/pure/*`: the least-pending function over a plain `Vec`, its own cost.
//! - `pick/contended/*`: a pick and the +1/-1 a call makes on the chosen instance, while other
//!   threads (one per other core, at least one) run the same loop on the same channel, so that
//!   the counts' cache lines move between cores as they do under load.
//!
//! - `pick/subset/*`: the channel's least-pending pick over 1,000 instances with
//!   `subset(50)` (client 7 of 100: the pick scans its 50), next to the same pick over all
//!   1,000, in the same run; `busy` and `idle` fleets as above, each also `reported`: every
//!   instance has a fresh load report (of no other client's call, so that the ties are the
//!   same), and the pick reads the reported counts too (without any fresh report, it does not).
//!
//! `weighted_round_robin` has a schedule from weights of 10 to 100 (the channel's own cycle, as
//! its background task builds it).
//!
//! Target: at most 100 ns with 50 instances, 1 µs with 1,000. On a machine shared with other
//! tenants, read the low end of the samples (`scripts/criterion-samples.py pick_channel`): the
//! mean mixes in the spells where everything, round robin's pick too, runs twice as slow.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tonic_balancer::__bench::{fleet, least_pending, numbers, strides_for, BenchPicker, Rng, Turn};
use tonic_balancer::Strategy;

const SIZES: [usize; 3] = [10, 50, 1000];

const STRATS: [(Strategy, &str); 6] = [
    (Strategy::FewestThenFastest, "fewest_then_fastest"),
    (Strategy::LeastPending, "least_pending"),
    (Strategy::PeakEwma, "peak_ewma"),
    (Strategy::PowerOfTwoChoices, "power_of_two"),
    (Strategy::RoundRobin, "round_robin"),
    (Strategy::WeightedRoundRobin, "weighted_round_robin"),
];

fn picker(rt: &tokio::runtime::Runtime, n: usize, s: Strategy, busy: bool) -> BenchPicker {
    let _enter = rt.enter();
    let p = BenchPicker::new(n, s);
    p.set_fleet(busy);
    if s == Strategy::WeightedRoundRobin {
        // Weights from 10 to 100 queries per second at full utilization.
        let mut next = numbers(0xE1D + n as u64);
        let weights: Vec<f64> = (0..n).map(|_| 10.0 + (next() % 91) as f64).collect();
        p.set_weights(&weights);
    }
    p
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn bench_channel(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("pick/channel");
    g.throughput(Throughput::Elements(1));
    for fleet in ["busy", "idle"] {
        for n in SIZES {
            for (s, name) in STRATS {
                let p = picker(&rt, n, s, fleet == "busy");
                g.bench_with_input(
                    BenchmarkId::new(format!("{fleet}/{name}"), n),
                    &p,
                    |b, p| b.iter(|| black_box(p.pick())),
                );
            }
        }
    }
    g.finish();
}

fn bench_pure(c: &mut Criterion) {
    let mut g = c.benchmark_group("pick/pure");
    g.throughput(Throughput::Elements(1));
    for n in SIZES {
        // Passes spread like latencies, so that the ties do not all have the same.
        let items: Vec<Option<(usize, Turn)>> = fleet(n, true)
            .into_iter()
            .map(|(f, lat, ok)| {
                ok.then_some((
                    f,
                    Turn {
                        pass: lat.as_nanos() as u64,
                        stride: 1 << 16,
                        gate: 0,
                    },
                ))
            })
            .collect();
        let strides = strides_for(n);
        g.bench_with_input(BenchmarkId::new("least_pending", n), &items, |b, items| {
            b.iter(|| {
                let mut rng = Rng::thread();
                let r = least_pending(
                    black_box(items),
                    &mut rng,
                    &strides,
                    |l| l.map(|(f, _)| f),
                    |l| {
                        l.map_or(
                            Turn {
                                pass: 0,
                                stride: 0,
                                gate: 0,
                            },
                            |(_, t)| t,
                        )
                    },
                );
                rng.store();
                black_box(r)
            })
        });
    }
    g.finish();
}

fn bench_subset(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("pick/subset");
    g.throughput(Throughput::Elements(1));
    for fleet in ["busy", "idle", "busy/reported", "idle/reported"] {
        let busy = fleet.starts_with("busy");
        let reported = fleet.ends_with("reported");
        let subset = {
            let _enter = rt.enter();
            let p = BenchPicker::with_subset(1000, Strategy::LeastPending, 50, 7, 100);
            p.set_fleet(busy);
            p
        };
        assert_eq!(subset.len(), 50);
        let full = picker(&rt, 1000, Strategy::LeastPending, busy);
        if reported {
            for p in [&subset, &full] {
                for i in 0..p.len() {
                    p.report(i, 0);
                }
            }
        }
        for (name, p) in [("subset_50_of_1000", &subset), ("all_1000", &full)] {
            g.bench_with_input(
                BenchmarkId::new(format!("{fleet}/least_pending"), name),
                p,
                |b, p| b.iter(|| black_box(p.pick())),
            );
        }
    }
    g.finish();
}

/// Pick, +1 on the chosen instance, -1: the counting a call does, without the call.
#[inline]
fn pick_and_count(p: &BenchPicker) -> Option<usize> {
    let i = p.pick()?;
    p.bump(i, true);
    p.bump(i, false);
    Some(i)
}

fn bench_contended(c: &mut Criterion) {
    let rt = runtime();
    let others = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .saturating_sub(1)
        .max(1);
    let mut g = c.benchmark_group("pick/contended");
    g.throughput(Throughput::Elements(1));
    for n in SIZES {
        for (s, name) in STRATS {
            let p = Arc::new(picker(&rt, n, s, true));
            let stop = Arc::new(AtomicBool::new(false));
            let threads: Vec<_> = (0..others)
                .map(|_| {
                    let (p, stop) = (p.clone(), stop.clone());
                    std::thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..64 {
                                black_box(pick_and_count(&p));
                            }
                        }
                    })
                })
                .collect();
            g.bench_with_input(
                BenchmarkId::new(format!("{name}+{others}threads"), n),
                &p,
                |b, p| b.iter(|| black_box(pick_and_count(p))),
            );
            stop.store(true, Ordering::Relaxed);
            for t in threads {
                t.join().expect("contending thread");
            }
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_channel, bench_pure, bench_contended, bench_subset
}
criterion_main!(benches);
