//! Internals exposed for `benches/` only; not part of the API.
pub use crate::pick::{
    least_pending, peak_ewma, power_of_two, round_robin, Chosen, Load, Rng, Turn,
};
pub use crate::set::strides_for;
pub use crate::set::subset::{choose_by as subset_of, id_of as ring_id};

use std::time::Duration;

/// The probes' hot-cold choice (Prequal's rule, as a channel with probes makes it) among
/// `(index, answer)` pairs (at most 64), with `q` the quantile of the calls in flight above
/// which an answer is hot: the index of the chosen pair's instance; `None` with fewer than
/// two answers.
pub fn hot_cold(answers: &[(u32, crate::probe::ProbeAnswer)], q: f64) -> Option<usize> {
    use crate::probe::FreshAnswer;
    let none = FreshAnswer {
        rif: 0,
        latency_us: 0,
    };
    let mut fresh = [(0u32, none); 64];
    let n = answers.len().min(fresh.len());
    for (slot, (i, a)) in fresh.iter_mut().zip(answers) {
        *slot = (*i, FreshAnswer::of(a));
    }
    // No strategy's choice: the rule over the answers alone.
    crate::pick::probed::hot_cold(&fresh[..n], q, usize::MAX)
}

/// A deterministic stream of numbers (xorshift), for the benchmarks' fleets.
pub fn numbers(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The benchmarks' fleet of `n` instances, `(calls in flight, latency, usable)` each, as
/// the pick meets them under load (`busy`: 0 to 3 calls in flight, latencies of 2 to 10
/// ms, one instance in twenty unusable) or on an idle fleet (nothing in flight, 2 ms).
pub fn fleet(n: usize, busy: bool) -> Vec<(usize, Duration, bool)> {
    let mut next = numbers(0x5EED + n as u64);
    (0..n)
        .map(|_| {
            let r = next();
            if busy {
                let lat = Duration::from_micros(2_000 + (r >> 8) % 8_000);
                ((r % 4) as usize, lat, r % 20 != 7)
            } else {
                (0, Duration::from_millis(2), true)
            }
        })
        .collect()
}

/// The channel's own pick over real instance records (whose connections are never
/// opened), to measure the pick as calls make it.
pub struct BenchPicker {
    channel: crate::BalancedChannel,
}

impl BenchPicker {
    /// `n` instances on 127.0.0.1 ports 1..=n (never connected). Needs a tokio runtime.
    pub fn new(n: usize, strategy: crate::Strategy) -> BenchPicker {
        let mut b = crate::BalancedChannel::builder().strategy(strategy);
        if strategy.keeps_weights() {
            b = b.weighted_round_robin(
                crate::load::weight::WrrConfig::default().blackout_period(Duration::ZERO),
            );
        }
        for port in 1..=n {
            b = b.uri(&format!("http://127.0.0.1:{port}"));
        }
        BenchPicker {
            channel: b.build().expect("valid bench set-up"),
        }
    }

    /// A channel over `n` instances as [`new`](BenchPicker::new) makes them, with subsetting:
    /// client `index` of `count` keeps `size` of them (`Builder::subset`).
    pub fn with_subset(
        n: usize,
        strategy: crate::Strategy,
        size: usize,
        index: usize,
        count: usize,
    ) -> BenchPicker {
        let mut b = crate::BalancedChannel::builder()
            .strategy(strategy)
            .subset(size)
            .subset_client(index, count);
        for port in 1..=n {
            b = b.uri(&format!("http://127.0.0.1:{port}"));
        }
        BenchPicker {
            channel: b.build().expect("valid bench set-up"),
        }
    }

    /// The instances the pick chooses among (the subset, with subsetting).
    pub fn len(&self) -> usize {
        self.channel.shared.snapshot().len()
    }

    /// Whether the pick has no instance to choose.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets one instance's load as the pick will read it: calls in flight, and one answer
    /// in `latency` where the method's reference is 2 ms.
    pub fn set(&self, i: usize, in_flight: usize, latency: Duration, usable: bool) {
        let pool = &self.channel.shared;
        let snap = pool.snapshot();
        let inst = &snap[i];
        inst.standing.set_calls(in_flight);
        let ns = latency.as_nanos() as f64;
        // One second into the channel's life, its previous answer long before: one slow
        // answer gates at once, as where answers come rarely.
        let now = pool.ctx.now_ns() + 1_000_000_000;
        inst.tie.answered_long_before(1);
        pool.ctx.load.methods.noise.settle_quiet();
        let noise = &pool.ctx.load.methods.noise;
        let gated = inst
            .tie
            .observe_gated(ns, 2e6, now, now, pool.ctx.load.gate(), noise);
        pool.ctx.load.gate_until(gated);
        inst.latency.set(ns, now, true);
        pool.ctx.load.advance_clock(now);
        inst.set_state(if usable {
            crate::State::Ready
        } else {
            crate::State::Ejected
        });
    }

    /// Sets every instance's load as [`fleet`] has it (busy or idle).
    pub fn set_fleet(&self, busy: bool) {
        for (i, (in_flight, latency, usable)) in fleet(self.len(), busy).into_iter().enumerate() {
            self.set(i, in_flight, latency, usable);
        }
    }

    /// Gives instance `i` a load report of `others` calls in flight from other clients,
    /// fresh for as long as a report can be (the pick then reads every instance's reported
    /// count, as it does while any instance's report is fresh).
    pub fn report(&self, i: usize, others: u64) {
        let pool = &self.channel.shared;
        let snap = pool.snapshot();
        let now = pool.ctx.now_ns();
        let until = snap[i].others.set(others, now, u32::MAX / 2);
        pool.ctx.load.reports_fresh.note(until);
    }

    /// Removes the last instance while a call holds it (it drains) and takes it back at
    /// once, as a discovery answer that names it again does: the same instance, last again.
    pub fn remove_and_take_back_last(&self) {
        let snap = self.channel.shared.snapshot();
        let endpoints: Vec<_> = snap.iter().map(|i| i.target.endpoint.clone()).collect();
        // What a call in flight holds: the instance drains rather than closes.
        let held = snap.last().expect("an instance").clone();
        drop(snap);
        assert!(self.channel.shared.set().remove(&held.target.key));
        let (added, _) = self
            .channel
            .replace_all(endpoints)
            .expect("the same endpoints");
        assert_eq!(added, 1);
        let snap = self.channel.shared.snapshot();
        assert!(
            std::sync::Arc::ptr_eq(snap.last().expect("an instance"), &held),
            "taken back, not made anew"
        );
    }

    /// Gives instance `i` a weighted-round-robin weight (a report of `weight` queries per
    /// second at utilization 1), then rebuilds the schedule as the channel's task does.
    /// For a channel built with [`Strategy::WeightedRoundRobin`](crate::Strategy) and no
    /// blackout.
    pub fn set_weights(&self, weights: &[f64]) {
        let pool = &self.channel.shared;
        let snap = pool.snapshot();
        let cfg = pool.ctx.load.reports.wrr.get();
        let now = pool.ctx.now_ns();
        for (inst, &w) in snap.iter().zip(weights) {
            let report = crate::load::report::LoadReport {
                rps_fractional: w,
                cpu_utilization: 1.0,
                ..Default::default()
            };
            inst.reported.wrr.update(&report, now, &cfg);
        }
        pool.picker.wrr.rebuild(&snap, now, &cfg);
    }

    /// One pick, exactly as a call makes it.
    #[inline]
    pub fn pick(&self) -> Option<usize> {
        let pool = &self.channel.shared;
        let snap = pool.snapshot();
        crate::pick::dispatch::pick(&pool.picker, &snap, &[], crate::load::tie::Method::NONE)
    }

    /// Adds `delta` to instance `i`'s count, as a call's guard does.
    #[inline]
    pub fn bump(&self, i: usize, up: bool) {
        let snap = self.channel.shared.snapshot();
        if up {
            snap[i].standing.enter();
        } else {
            snap[i].standing.leave();
        }
    }
}
