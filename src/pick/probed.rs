//! The pick with probes (`Builder::probes`): Prequal's hot-cold rule over the instances' fresh
//! probe answers, and the probes each call sends.
//!
//! Each instance keeps its latest answer (`probe::Record`); the *pool* is the instances whose
//! answer is fresh (younger than `max_age`, used for fewer than `reuse` calls) or on its way,
//! at most `pool` of them. The strategy picks first; if its choice is an instance that does
//! not answer probes (UNIMPLEMENTED, or its last probe got no answer), the call goes there, so
//! that a fleet where only some instances answer probes still shares the calls with the rest.
//! Otherwise the probes decide: the pick scans the set once for the fresh answers (the first
//! 64 met), takes the `hot_quantile` of their calls in flight, and among the *cold* ones (at
//! most that many calls) the lowest latency wins (ties: fewer calls in flight); the answer
//! then counts the call. An answer without a latency estimate (`latency_ms` 0: a server that
//! measures none, or `OrcaLayer` before its first call) tells the instance's load but not its
//! speed: it wins no comparison of latencies, and the strategy's choice of it stands while it
//! is cold (ranked below every estimate, such an instance was starved, and its answer, never
//! used, was never asked again: docs/design.md, "Probes"). With fewer than two fresh answers,
//! the strategy's choice stands.
//! Then, per call, `per_call` probes on average go to instances drawn at random that are
//! usable, not in the pool, and not known to refuse probes, while the pool has room.

use std::sync::Arc;

use super::Rng;
use crate::instance::Instance;
use crate::probe::{FreshAnswer, ProbeConfig, ProbeError};

/// The most fresh answers one pick compares.
const MAX_COMPARED: usize = 64;

/// The hot-cold choice among the fresh answers of the usable instances of `snap` not in
/// `tried`, at `now_ns`, where the strategy chose `by_strategy`; `None` with fewer than two.
/// Also returns how many instances are in the pool (fresh answers, and probes on their way).
pub(crate) fn pick(
    snap: &[Arc<Instance>],
    tried: &[Arc<Instance>],
    config: &ProbeConfig,
    now_ns: u64,
    by_strategy: usize,
) -> (Option<usize>, usize) {
    let max_age = config.max_age.as_nanos() as u64;
    let mut fresh = [(
        0u32,
        FreshAnswer {
            rif: 0,
            latency_us: 0,
        },
    ); MAX_COMPARED];
    let mut len = 0;
    let mut pooled = 0;
    for (k, i) in snap.iter().enumerate() {
        let record = &i.probe;
        match record.fresh(now_ns, max_age, config.reuse) {
            Some(f) => {
                pooled += 1;
                let usable =
                    i.is_usable() && (tried.is_empty() || !tried.iter().any(|t| Arc::ptr_eq(t, i)));
                if usable && len < MAX_COMPARED {
                    fresh[len] = (k as u32, f);
                    len += 1;
                }
            }
            None if record.probing() => pooled += 1,
            None => {}
        }
    }
    let chosen = hot_cold(&fresh[..len], config.hot_quantile, by_strategy)
        .inspect(|&k| snap[k].probe.used());
    (chosen, pooled)
}

/// How many instances of `snap` are in the pool at `now_ns` (a fresh answer, or a probe on its
/// way).
pub(crate) fn pooled(snap: &[Arc<Instance>], config: &ProbeConfig, now_ns: u64) -> usize {
    let max_age = config.max_age.as_nanos() as u64;
    snap.iter()
        .filter(|i| i.probe.probing() || i.probe.fresh(now_ns, max_age, config.reuse).is_some())
        .count()
}

/// Prequal's hot-cold rule over `(index, answer)` pairs: the answers with at most the `q`
/// quantile of their calls in flight are cold; the cold one with the lowest latency (no
/// estimate ranks last), then the fewest calls in flight, wins; but the strategy's choice
/// (`by_strategy`) wins if its answer is cold and has no estimate. `None` with fewer than two.
pub(crate) fn hot_cold(fresh: &[(u32, FreshAnswer)], q: f64, by_strategy: usize) -> Option<usize> {
    if fresh.len() < 2 {
        return None;
    }
    let mut rifs = [0u32; MAX_COMPARED];
    for (r, (_, f)) in rifs.iter_mut().zip(fresh) {
        *r = f.rif;
    }
    let rifs = &mut rifs[..fresh.len()];
    // The lower quantile: with few answers, the busiest is hot (0.84 of four answers is the
    // third, not the fourth).
    let at = ((rifs.len() - 1) as f64 * q) as usize;
    let threshold = *rifs.select_nth_unstable(at).1;
    let unknown_and_cold = |f: &FreshAnswer| f.latency_us == 0 && f.rif <= threshold;
    if fresh
        .iter()
        .any(|(k, f)| *k as usize == by_strategy && unknown_and_cold(f))
    {
        return Some(by_strategy);
    }
    fresh
        .iter()
        .filter(|(_, f)| f.rif <= threshold)
        .min_by_key(|(_, f)| {
            let latency = if f.latency_us == 0 {
                u32::MAX
            } else {
                f.latency_us
            };
            (latency, f.rif)
        })
        .map(|(k, _)| *k as usize)
}

/// After a call's pick: its probes, `per_call` on average, each to an instance of `snap`
/// drawn at random that is usable, not in the pool and not known to refuse probes, while
/// the pool (`pooled` now) has room.
pub(crate) fn send(snap: &[Arc<Instance>], config: &ProbeConfig, pooled: usize, rng: &mut Rng) {
    let whole = config.per_call.trunc();
    let mut n = whole as usize + usize::from(rng.unit() < config.per_call - whole);
    n = n.min(config.pool.saturating_sub(pooled));
    // A few draws per probe: in a small set most instances may be in the pool already.
    let mut draws = 4 * n;
    while n > 0 && draws > 0 && !snap.is_empty() {
        draws -= 1;
        let inst = &snap[rng.below(snap.len())];
        let record = &inst.probe;
        if !inst.is_usable()
            || record.unsupported()
            || record
                .fresh(
                    inst.ctx.now_ns(),
                    config.max_age.as_nanos() as u64,
                    config.reuse,
                )
                .is_some()
            || !record.start_probe()
        {
            continue;
        }
        n -= 1;
        inst.ctx.live.probe_sent();
        spawn(inst, config.timeout);
    }
}

/// One probe of `inst`, on the channel's runtime; its answer goes to the instance's record.
fn spawn(inst: &Arc<Instance>, timeout: std::time::Duration) {
    let channel = inst.channel.clone();
    let weak = Arc::downgrade(inst);
    inst.ctx.runtime.spawn(async move {
        let answer = crate::probe::probe(channel, timeout).await;
        let Some(inst) = weak.upgrade() else { return };
        let record = &inst.probe;
        match answer {
            Ok(a) => record.store(a, inst.ctx.now_ns()),
            Err(ProbeError::Unimplemented) => {
                if record.set_unsupported() {
                    tracing::info!(server.address = %inst.target.name, "instance does not answer probes (UNIMPLEMENTED): left to the strategy until it reconnects");
                }
            }
            Err(e) => {
                // Said once each time the instance falls silent (a timeout, UNAVAILABLE, an
                // answer that does not decode): it is left to the strategy until a probe of it
                // is answered.
                if record.set_silent() {
                    let why = match e {
                        ProbeError::Timeout => "no answer within the probe's timeout".to_owned(),
                        ProbeError::Other(status) => format!("{:?}: {}", status.code(), status.message()),
                        ProbeError::Unimplemented => unreachable!("matched above"),
                    };
                    tracing::info!(server.address = %inst.target.name, error = %why, "probe not answered: instance left to the strategy until a probe of it is");
                }
            }
        }
        record.probe_over();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn f(rif: u32, latency_us: u32) -> FreshAnswer {
        FreshAnswer { rif, latency_us }
    }

    /// Among the cold answers (calls in flight at most the quantile), the lowest latency wins;
    /// a hot one never does, however fast; with every answer as busy, the fastest.
    #[test]
    fn the_fastest_cold_instance_wins() {
        let pool = [
            (0, f(1, 9_000)),
            (1, f(2, 5_000)),
            (2, f(9, 1_000)),
            (3, f(1, 6_000)),
        ];
        // Quantile 0.84 of [1, 1, 2, 9]: 2 (the lower, index 2.52 -> 2). Cold: 0, 1, 3;
        // fastest 1.
        assert_eq!(hot_cold(&pool, 0.84, 0), Some(1));
        // Quantile 0: only those with 1 call are cold; the faster of them is 3.
        assert_eq!(hot_cold(&pool, 0.0, 0), Some(3));
        // Quantile 1: every one is cold: 2 is the fastest.
        assert_eq!(hot_cold(&pool, 1.0, 0), Some(2));
        // No estimate ranks last; among equal latencies, fewer calls.
        assert_eq!(hot_cold(&[(0, f(0, 0)), (1, f(3, 0))], 1.0, 9), Some(0));
        assert_eq!(hot_cold(&[(0, f(0, 0)), (1, f(0, 4))], 1.0, 1), Some(1));
        // But the strategy's choice stands if its answer has no estimate and is cold...
        assert_eq!(hot_cold(&[(0, f(0, 0)), (1, f(0, 4))], 1.0, 0), Some(0));
        // ...not if it is hot.
        let hot = [(0, f(9, 0)), (1, f(0, 4)), (2, f(1, 5))];
        assert_eq!(hot_cold(&hot, 0.5, 0), Some(1));
        assert_eq!(
            hot_cold(&[(0, f(0, 4))], 1.0, 0),
            None,
            "one answer: the strategy picks"
        );
    }

    proptest! {
        /// Whatever the answers: the winner is cold (no more calls in flight than the
        /// quantile's), and no cold answer is faster.
        #[test]
        fn the_winner_is_cold_and_fastest(
            answers in prop::collection::vec((0u32..20, 0u32..50_000), 2..64),
            q in 0.0f64..=1.0,
        ) {
            let pool: Vec<(u32, FreshAnswer)> =
                answers.iter().enumerate().map(|(k, &(r, l))| (k as u32, f(r, l))).collect();
            let k = hot_cold(&pool, q, usize::MAX).unwrap();
            let mut rifs: Vec<u32> = answers.iter().map(|a| a.0).collect();
            rifs.sort_unstable();
            let threshold = rifs[((rifs.len() - 1) as f64 * q) as usize];
            let won = pool[k].1;
            prop_assert!(won.rif <= threshold);
            let rank = |l: u32| if l == 0 { u32::MAX } else { l };
            for (_, other) in &pool {
                if other.rif <= threshold {
                    prop_assert!(rank(won.latency_us) <= rank(other.latency_us));
                }
            }
        }
    }
}
