//! Many independent clients on the virtual clock of `scenarios.rs`: each client its own pick
//! over the same instances, seeing only its own calls, the instances' answer times made by
//! every client's calls together. The queue case of issue 40: 20 instances, 18 answering in a
//! fixed 5 ms whatever their load, 2 serving one call at a time (12.5 ms each, each call
//! waiting for those before it: 80 calls/s at most); 50 clients sharing 2,000 calls/s, open
//! loop, each call from a client drawn at random. Each client sees each instance about twice
//! a second: its own counts are zero almost everywhere, and what it learns of an instance
//! comes from one answer in a while.

use std::time::Duration;

use super::scenarios::{Sim, UNARY};
use crate::instance::context::Context;
use crate::Strategy;

/// The fixed instances' answer time.
const FIXED: Duration = Duration::from_millis(5);
/// A queue instance's time per call.
const QUEUED: Duration = Duration::from_micros(12_500);
/// The queue instances.
const QUEUES: [usize; 2] = [0, 10];
/// Seconds of calls at the start that [`Outcome::p99`] leaves out.
const WARM_UP: f64 = 1.5;

/// A seeded random sequence (splitmix64).
struct Seq(u64);

impl Seq {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The p99 of the calls' times in one run, in ms.
struct Outcome {
    /// After the warm-up.
    p99: f64,
    /// Of every call, from the moment every client starts.
    p99_from_start: f64,
}

/// 50 clients with `strategy`, all starting at once, sharing 2,000 calls/s for 5.5 s over
/// the 20 instances of the queue case; `seed` draws which client makes each call.
fn run(strategy: Strategy, seed: u64) -> Outcome {
    const CLIENTS: usize = 50;
    const RATE: f64 = 2000.0;
    const SECS: f64 = 5.5;
    let mut sims: Vec<Sim> = (0..CLIENTS)
        .map(|_| Sim::with_strategy(20, Context::for_tests(), strategy))
        .collect();
    let start = sims[0].now;
    // When each queue instance is free again.
    let mut free_at = [start; 20];
    let mut seq = Seq(seed);
    let gap = (1e9 / RATE) as u64;
    let calls = (RATE * SECS) as u64;
    let mut all = Vec::with_capacity(calls as usize);
    let mut after = Vec::with_capacity(calls as usize);
    for k in 1..=calls {
        let at = start + k * gap;
        let sim = &mut sims[(seq.next() % CLIENTS as u64) as usize];
        sim.advance_to(at);
        let mut took = FIXED;
        sim.start_with(UNARY, |_, i, _| {
            if QUEUES.contains(&i) {
                free_at[i] = free_at[i].max(at) + QUEUED.as_nanos() as u64;
                took = Duration::from_nanos(free_at[i] - at);
            }
            took
        });
        all.push(took);
        if k as f64 > RATE * WARM_UP {
            after.push(took);
        }
    }
    let p99 = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        v[(v.len() - 1) * 99 / 100].as_secs_f64() * 1e3
    };
    Outcome {
        p99: p99(&mut after),
        p99_from_start: p99(&mut all),
    }
}

/// The median over seven seeds of what `of` takes from each run.
fn median(strategy: Strategy, of: impl Fn(&Outcome) -> f64) -> (f64, Vec<f64>) {
    let mut v: Vec<f64> = (0..7).map(|seed| of(&run(strategy, 7 + seed))).collect();
    v.sort_by(f64::total_cmp);
    (v[3], v)
}

/// Once every client has seen every instance (after 1.5 s), the default's p99 is the queue
/// instances' own time, as two random choices' (tower's p2c) is: no client herds onto them.
#[tokio::test]
async fn fifty_clients_do_not_herd_onto_the_queues_once_warm() {
    let (p2c, p2cs) = median(Strategy::PowerOfTwoChoices, |o| o.p99);
    let (default, defaults) = median(Strategy::FewestThenFastest, |o| o.p99);
    assert!(
        default <= 1.1 * p2c,
        "default {defaults:?} ms, two random choices {p2cs:?} ms"
    );
}

/// Fifty clients starting together: each must call each instance once to learn anything of
/// it, so the queue instances are over their 80 calls/s for a moment whatever the rule. The
/// default's first answer from an instance charges the turn it won (at most four turns more,
/// `TieBreak::learn`): without that every client's second call to a queue came within the
/// same second, and its p99 from the start was several times that of two random choices; with
/// it, within twice theirs (the figures: docs/design.md, "Many clients starting together").
#[tokio::test]
async fn fifty_clients_starting_together_spread_their_first_calls() {
    let (p2c, p2cs) = median(Strategy::PowerOfTwoChoices, |o| o.p99_from_start);
    let (default, defaults) = median(Strategy::FewestThenFastest, |o| o.p99_from_start);
    if std::env::var("MANY_CLIENTS_FIGURES").is_ok() {
        for s in [
            Strategy::LeastPending,
            Strategy::PeakEwma,
            Strategy::RoundRobin,
        ] {
            eprintln!("{s:?}: {:?} ms", median(s, |o| o.p99_from_start).1);
        }
        eprintln!("default {defaults:?} ms, two random choices {p2cs:?} ms");
    }
    assert!(
        default <= 2.0 * p2c,
        "default {defaults:?} ms, two random choices {p2cs:?} ms"
    );
}
