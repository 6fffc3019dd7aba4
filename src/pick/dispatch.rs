//! The channel's pick over its current set: the strategy's choice among the usable instances
//! (with slow start, and the turns of least pending's tie-break), a pick made again on a set
//! replaced meanwhile, and the check, which changes nothing, of whether any instance could take
//! a call at all.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Chosen, Load, Picker, Rng, Turn};
use crate::instance::Instance;
use crate::load::tie::Method;
use crate::set::{Members, Snapshot};
use crate::Strategy;

/// Picks an instance from the current set (excluding `tried`). A pick that finds nothing in a
/// set that was replaced while it read it (its instances draining by then) is made again on
/// the new set, so that a membership change never fails a call: only a pick that finds
/// nothing in the set as it is now does.
///
/// The pick moves the strategy's state (least pending's turns, round robin's counter): make it
/// only for an attempt that is sent; [`could_take`] asks without moving anything.
pub(crate) fn pick_now(
    picker: &Picker,
    tried: &[Arc<Instance>],
    method: Method,
) -> (arc_swap::Guard<Snapshot>, Option<usize>) {
    if let (Some(config), true) = (&picker.set.ctx.probes, tried.is_empty()) {
        return probed(picker, config, method);
    }
    pick_now_by_strategy(picker, tried, method)
}

/// [`pick_now`] by the strategy alone.
fn pick_now_by_strategy(
    picker: &Picker,
    tried: &[Arc<Instance>],
    method: Method,
) -> (arc_swap::Guard<Snapshot>, Option<usize>) {
    let mut snap = picker.snapshot();
    // Each round needs a new publication; a few are plenty even under constant churn.
    for _ in 0..4 {
        if let Some(idx) = pick(picker, &snap, tried, method) {
            return (snap, Some(idx));
        }
        let now = picker.snapshot();
        if Arc::ptr_eq(&snap, &now) {
            break;
        }
        snap = now;
    }
    (snap, None)
}

/// A first attempt's pick with probes (see `probed`): the strategy's choice if it is an
/// instance that does not answer probes (or answers without a latency estimate, while cold),
/// else the probes' if two or more answers are fresh; then the call's probes.
fn probed(
    picker: &Picker,
    config: &crate::probe::ProbeConfig,
    method: Method,
) -> (arc_swap::Guard<Snapshot>, Option<usize>) {
    let (snap, by_strategy) = pick_now_by_strategy(picker, &[], method);
    let (by_probes, pooled) = match by_strategy {
        Some(i) if !snap[i].probe.unanswered() => {
            super::probed::pick(&snap, &[], config, picker.set.ctx.now_ns(), i)
        }
        _ => (
            None,
            super::probed::pooled(&snap, config, picker.set.ctx.now_ns()),
        ),
    };
    let mut rng = Rng::thread();
    super::probed::send(&snap, config, pooled, &mut rng);
    rng.store();
    (snap, by_probes.or(by_strategy))
}

/// Whether some usable instance of the current set is not in `tried`: whether a pick for
/// another attempt of a call could find one. Reads, never writes: asking changes nothing of
/// what later picks choose.
pub(crate) fn could_take(picker: &Picker, tried: &[Arc<Instance>]) -> bool {
    picker
        .snapshot()
        .iter()
        .any(|i| i.is_usable() && !tried.iter().any(|t| Arc::ptr_eq(t, i)))
}

/// Picks the instance for one call (excluding the ones in `tried`).
#[inline]
pub(crate) fn pick(
    picker: &Picker,
    snap: &Members,
    tried: &[Arc<Instance>],
    method: Method,
) -> Option<usize> {
    if snap.len() == 1 {
        // Nothing to choose: whatever the strategy, the one instance if it is usable.
        return pick_with_one(snap, tried);
    }
    let slow = picker.set.ctx.slow_start_ns;
    if slow > 0 {
        // Slow start may hold back every instance that is warming up; it must never be the
        // reason a call finds nothing.
        if let Some(i) = pick_with(picker, snap, tried, slow, method) {
            return Some(i);
        }
    }
    pick_with(picker, snap, tried, 0, method)
}

#[inline]
fn pick_with_one(snap: &[Arc<Instance>], tried: &[Arc<Instance>]) -> Option<usize> {
    let i = &snap[0];
    (i.is_usable() && !tried.iter().any(|t| Arc::ptr_eq(t, i))).then_some(0)
}

#[inline]
fn pick_with(
    picker: &Picker,
    snap: &Members,
    tried: &[Arc<Instance>],
    slow: u64,
    method: Method,
) -> Option<usize> {
    let policy = &picker.set.ctx;
    let now = policy.load.clock();
    // Calls in flight: this channel's, plus the other clients' as of a fresh load report.
    let tick = crate::load::reported::tick(now);
    let mut rng = Rng::thread();
    // An independent stream for the slow-start draws (the strategy's own draws use `rng`).
    let mut gate =
        (slow > 0).then(|| Rng::seeded(rng.next_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    // Whether the pick may send calls to `i` at all.
    let usable = |i: &Arc<Instance>| -> bool {
        if !i.is_usable() || (!tried.is_empty() && tried.iter().any(|t| Arc::ptr_eq(t, i))) {
            return false;
        }
        if let Some(g) = gate.as_mut() {
            // Slow start: a warming instance takes part in a share of the picks that grows
            // linearly over the window (from 5%).
            let ramp = ramp(i, now, slow);
            if ramp < 1.0 && g.unit() >= ramp {
                return false;
            }
        }
        true
    };
    let strategy = picker.strategy.get();
    let picked = match strategy {
        Strategy::FewestThenFastest | Strategy::LeastPending => fewest_first(
            picker,
            snap,
            !tried.is_empty(),
            method,
            When {
                now,
                tick,
                slow,
                strategy,
            },
            &mut rng,
            usable,
        ),
        strategy => by_load(picker, snap, strategy, (now, tick), &mut rng, usable),
    };
    rng.store();
    picked
}

/// What a pick reads of the time: the channel's clock, the load reports' tick (see
/// `instance::load::tick`), and slow start's window (0: none); and the strategy, as read once
/// for the pick.
#[derive(Debug, Clone, Copy)]
struct When {
    now: u64,
    tick: u64,
    slow: u64,
    strategy: Strategy,
}

/// [`Strategy::FewestThenFastest`] and [`Strategy::LeastPending`]: the fewest calls in flight
/// (weighed, for the former, by the slowness of an instance gated for a slow answer), ties
/// broken by turns; `retry`: the call tried other instances before.
#[inline(always)]
fn fewest_first(
    picker: &Picker,
    snap: &Members,
    retry: bool,
    method: Method,
    When {
        now,
        tick,
        slow,
        strategy,
    }: When,
    rng: &mut Rng,
    mut usable: impl FnMut(&Arc<Instance>) -> bool,
) -> Option<usize> {
    let policy = &picker.set.ctx;
    let expensive = policy.load.methods.is_expensive(method);
    // While no instance is gated, fewest then fastest weighs no call: the plain scan.
    let weighted = strategy == Strategy::FewestThenFastest && policy.load.gated_until() > now;
    // The common case, a first attempt without slow start: nothing to check but the
    // state, which the scan reads with the count (see `tight`).
    let quick = if !retry && slow == 0 {
        let turn = |i: &Arc<Instance>| i.tie.turn_for(expensive, now);
        // No instance has a fresh report (every `others` reads 0): the scan does not
        // read them.
        let fresh = policy.load.reports_fresh.any(tick);
        match (weighted, fresh) {
            (true, true) => tight::<true, true>(snap, rng, tick, now, turn),
            (true, false) => tight::<true, false>(snap, rng, tick, now, turn),
            (false, true) => tight::<false, true>(snap, rng, tick, now, turn),
            (false, false) => tight::<false, false>(snap, rng, tick, now, turn),
        }
    } else {
        None
    };
    match quick {
        Some(c) => {
            if strategy == Strategy::FewestThenFastest {
                recheck(&snap[c.index], now);
            }
            Some(took_turn(snap, c, expensive))
        }
        // Retries, slow start, and a quick scan that found no instance in service
        // (there is none, or the one it chose just left): each candidate checked.
        None => super::least_pending(
            snap,
            rng,
            &snap.strides,
            |i| {
                usable(i).then(|| {
                    let n = counted(i, tick, true);
                    if weighted {
                        weighted_count(n + 1, i, now)
                    } else {
                        n
                    }
                })
            },
            |i| i.tie.turn_for(expensive, now),
        )
        .map(|c| {
            // As the quick scan's choice: the call is its re-check if its gate is
            // over (whether or not another instance is gated now).
            if strategy == Strategy::FewestThenFastest {
                recheck(&snap[c.index], now);
            }
            // Slow start again: a tie won costs a warming instance 1/ramp turns, so
            // that among ties (at low load) its share of the calls is the ramp times
            // its fair share. Taking part in a share of the picks is not enough
            // there: an instance left out of some picks falls behind in turns, then
            // wins every pick it takes part in (a share of all the calls, the fair
            // share of 20 instances from the start).
            let stretch = if slow > 0 {
                1.0 / ramp(&snap[c.index], now, slow)
            } else {
                1.0
            };
            took_turn_stretched(snap, c, expensive, stretch)
        }),
    }
}

/// The strategies that weigh a load (calls in flight, a latency estimate) or take turns: peak
/// EWMA, power of two choices, weighted round robin, round robin; `(now, tick)` as in
/// [`When`].
#[inline(always)]
fn by_load(
    picker: &Picker,
    snap: &Members,
    strategy: Strategy,
    (now, tick): (u64, u64),
    rng: &mut Rng,
    mut usable: impl FnMut(&Arc<Instance>) -> bool,
) -> Option<usize> {
    let policy = &picker.set.ctx;
    let expiry = policy.load.latency_expiry_ns;
    let inv_expiry = policy.load.inv_latency_expiry;
    // Peak EWMA's latency already carries the other clients' load (their calls
    // queue with ours): it weighs this channel's own calls only (see
    // examples/shootout/many_clients.rs for what adding the reported ones did).
    let reports = strategy != Strategy::PeakEwma;
    let mut load = |i: &Arc<Instance>| -> Option<Load> {
        usable(i).then(|| Load {
            in_flight: counted(i, tick, reports),
            latency_ns: i.latency.estimate(now, expiry, inv_expiry),
        })
    };
    match strategy {
        Strategy::PeakEwma => super::peak_ewma(snap, rng, policy.load.default_latency_ns, load),
        Strategy::PowerOfTwoChoices => super::power_of_two(snap, rng, load),
        Strategy::WeightedRoundRobin => {
            picker
                .wrr
                .pick(snap, rng, |i| load(i).is_some())
                .or_else(|| {
                    let c = picker.rr.fetch_add(1, Ordering::Relaxed);
                    super::round_robin(snap, c, load)
                })
        }
        _ => {
            let c = picker.rr.fetch_add(1, Ordering::Relaxed);
            super::round_robin(snap, c, load)
        }
    }
}

/// The calls in flight on `i` that the pick compares: this channel's, plus, with `reports`,
/// the other clients' as of a report still fresh at `tick` (see `orca::OthersInFlight`).
#[inline(always)]
fn counted(i: &Instance, tick: u64, reports: bool) -> usize {
    i.in_flight() + if reports { i.others.get(tick) } else { 0 }
}

/// The count [`Strategy::FewestThenFastest`] compares for `i` with `with_this` calls in flight
/// counting this one: each weighs [`TieBreak::weight`](crate::load::tie::TieBreak) (one, or the
/// slowness of an instance gated for a slow answer), so that among equally fast instances the
/// order is least pending's.
#[inline(always)]
fn weighted_count(with_this: usize, i: &Instance, now: u64) -> usize {
    with_this * i.tie.weight(now) as usize
}

/// The chosen instance, if its gate for a slow answer is over, is re-checked by this call:
/// it stays gated until the answer, held for twice its usual latency (at least 1 ms, at most
/// 10 s), so that one re-check goes at a time.
#[inline(always)]
fn recheck(i: &Instance, now: u64) {
    if i.tie.is_due_for_recheck(now) {
        let usual = i.latency.usual_ns();
        let hold = (2.0 * usual).clamp(1e6, 1e10) as u64;
        let until = i.tie.recheck_sent(now, hold);
        i.ctx.load.gate_until(until);
    }
}

/// The least-pending pick (with `WEIGHTED`, fewest-then-fastest's) of a first attempt without
/// slow start: nothing to check but the state, so the scan's loop stays tight; the other
/// clients' calls are read only with `REPORTS` (a loop of its own without them).
///
/// The scan compares each instance's [`key`](crate::instance::standing::StateAndCount::key), its
/// count (with this call) and state in one load: one out of service has more than any count,
/// so it is chosen only if none is in service, and then the choice is `None`.
///
/// Not inlined: in `pick_with`, among the other strategies' code, the loop lost a register
/// and reloaded the slice's address for every candidate (`scripts/instructions.sh pick`).
#[inline(never)]
fn tight<const WEIGHTED: bool, const REPORTS: bool>(
    snap: &Members,
    rng: &mut Rng,
    tick: u64,
    now: u64,
    turn: impl FnMut(&Arc<Instance>) -> Turn,
) -> Option<Chosen> {
    super::least_pending(
        snap,
        rng,
        &snap.strides,
        |i| {
            let n = i.standing.key() + if REPORTS { i.others.get(tick) } else { 0 };
            Some(if WEIGHTED {
                weighted_count(n, i, now)
            } else {
                n
            })
        },
        turn,
    )
    .filter(|c| snap[c.index].is_usable())
}

/// Where `i` is in its slow start at `now` (a window of `slow` ns): from 0.05 when it starts to
/// 1 at the window's end; 1 when it is not warming up.
#[inline]
fn ramp(i: &Instance, now: u64, slow: u64) -> f64 {
    let from = i.warm_from.load(Ordering::Relaxed);
    let since = now.saturating_sub(from);
    if slow == 0 || from == 0 || since >= slow {
        1.0
    } else {
        (since as f64 / slow as f64).max(0.05)
    }
}

/// As [`took_turn`], the turn costing `stretch` times the instance's stride.
fn took_turn_stretched(snap: &[Arc<Instance>], c: Chosen, expensive: bool, stretch: f64) -> usize {
    if stretch > 1.0 {
        snap[c.index]
            .tie
            .advance_stretched(expensive, c.floor, stretch);
        return c.index;
    }
    took_turn(snap, c, expensive)
}

/// The least-pending choice's instance takes its turn (its pass advances; and its expensive pass,
/// for a call to an expensive method).
#[inline]
fn took_turn(snap: &[Arc<Instance>], c: Chosen, expensive: bool) -> usize {
    let tie = &snap[c.index].tie;
    if expensive {
        tie.advance_expensive(c.floor);
    } else {
        tie.advance(c.floor);
    }
    c.index
}

/// Why nothing could be picked, for the UNAVAILABLE message.
pub(crate) fn no_instance_message(picker: &Picker, snap: &[Arc<Instance>]) -> String {
    if snap.is_empty() {
        return match picker.set.discovery_error() {
            Some(e) => format!("tonic-balancer: no instances in the set (discovery: {e})"),
            None => "tonic-balancer: no instances in the set".to_owned(),
        };
    }
    let mut counts = std::collections::BTreeMap::<&'static str, usize>::new();
    for i in snap {
        *counts.entry(i.state().as_str()).or_default() += 1;
    }
    let states: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    format!(
        "tonic-balancer: no usable instance among {} ({})",
        snap.len(),
        states.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel with `strategy` over `n` instances on 127.0.0.1 ports 1..=n (never connected:
    /// the tests make no `.await`, so no connection attempt runs), and its clock started: the
    /// channel, and the clock's reading.
    fn fleet(strategy: crate::Strategy, n: u16) -> (crate::BalancedChannel, u64) {
        let mut b = crate::BalancedChannel::builder().strategy(strategy);
        for port in 1..=n {
            b = b.uri(&format!("http://127.0.0.1:{port}"));
        }
        let ch = b.build().unwrap();
        // One second into the channel's life, every instance's previous answer long before:
        // one slow answer gates at once, as where answers come rarely.
        let now = ch.shared.ctx.now_ns() + 1_000_000_000;
        for inst in ch.shared.snapshot().iter() {
            inst.tie.answered_long_before(1);
        }
        ch.shared.ctx.load.methods.noise.settle_quiet();
        ch.shared.ctx.load.advance_clock(now);
        (ch, now)
    }

    /// `inst` answered ten times slower than the method's usual time (2 ms) at `now`: when
    /// the gate it sets ends.
    fn slow_answer(
        ctx: &crate::instance::Context,
        inst: &crate::instance::Instance,
        now: u64,
    ) -> u64 {
        inst.tie.observe_gated(
            20e6,
            2e6,
            now,
            now,
            ctx.load.gate(),
            &ctx.load.methods.noise,
        )
    }

    /// The quick scan reads an instance's state with its count: one out of service never wins,
    /// however few calls it has (fewest then fastest and least pending; without and with a
    /// gated instance, which weighs the counts; without and with fresh load reports, each a
    /// loop of its own); with none in service the pick finds nothing.
    #[tokio::test]
    async fn the_quick_scan_never_picks_an_instance_out_of_service() {
        use crate::{State, Strategy};
        for strategy in [Strategy::FewestThenFastest, Strategy::LeastPending] {
            for gated in [false, true] {
                for reports in [false, true] {
                    let case = format!("{strategy:?}, gated {gated}, reports {reports}");
                    let (ch, now) = fleet(strategy, 4);
                    let pool = &ch.shared;
                    let snap = pool.snapshot();
                    // 0 and 1 idle but out of service; 2 and 3 in service with calls.
                    for (inst, (calls, state)) in snap.iter().zip([
                        (0, State::Ejected),
                        (0, State::Failing),
                        (3, State::Ready),
                        (2, State::Ready),
                    ]) {
                        inst.standing.set_calls(calls);
                        inst.set_state(state);
                    }
                    if gated {
                        let until = slow_answer(&pool.ctx, &snap[2], now);
                        pool.ctx.load.gate_until(until);
                        assert!(until > now, "{case}: gated");
                    }
                    if reports {
                        let until = snap[3]
                            .others
                            .set(0, now, pool.ctx.load.reports.max_age_ticks);
                        pool.ctx.load.reports_fresh.note(until);
                    }
                    for _ in 0..20 {
                        let picked = pick(&pool.picker, &snap, &[], Method::NONE);
                        assert_eq!(picked, Some(3), "{case}");
                    }
                    snap[2].set_state(State::Unhealthy);
                    snap[3].set_state(State::Draining);
                    let picked = pick(&pool.picker, &snap, &[], Method::NONE);
                    assert_eq!(picked, None, "{case}: none in service");
                    // Back in service, with the fewest calls: it wins at once.
                    snap[1].set_state(State::Ready);
                    let picked = pick(&pool.picker, &snap, &[], Method::NONE);
                    assert_eq!(picked, Some(1), "{case}: back");
                }
            }
        }
    }

    /// An instance whose gate for a slow answer is over takes its re-check from whichever
    /// scan chooses it: a retry's pick (the full scan) holds it gated until the answer, as a
    /// first attempt's does, also when no other instance is gated any more (so that the scan
    /// weighs no call).
    #[tokio::test]
    async fn a_retry_that_chooses_an_instance_due_for_a_recheck_is_its_recheck() {
        use crate::{State, Strategy};
        for retry in [false, true] {
            let (ch, now) = fleet(Strategy::FewestThenFastest, 2);
            let pool = &ch.shared;
            let snap = pool.snapshot();
            for inst in snap.iter() {
                inst.set_state(State::Ready);
            }
            // Instance 0 answered ten times slower than the method's usual time: gated until
            // `until`; then the clock reaches it (no instance gated any more).
            let until = slow_answer(&pool.ctx, &snap[0], now);
            assert!(until > now, "gated");
            pool.ctx.load.gate_until(until);
            pool.ctx.load.advance_clock(until);
            assert!(snap[0].tie.is_due_for_recheck(until));
            // Instance 1 has a call in flight: instance 0 wins either way.
            snap[1].standing.set_calls(1);
            let tried = if retry { vec![snap[1].clone()] } else { vec![] };
            let picked = pick(&pool.picker, &snap, &tried, Method::NONE);
            assert_eq!(picked, Some(0), "retry {retry}");
            assert!(
                !snap[0].tie.is_due_for_recheck(until),
                "retry {retry}: held until the re-check's answer"
            );
        }
    }

    /// Peak EWMA weighs this channel's own calls only: a report of the other clients' calls,
    /// which least pending counts, does not move it (its latency already carries that load).
    #[tokio::test]
    async fn peak_ewma_ignores_reported_calls() {
        use crate::Strategy;
        for (strategy, want) in [(Strategy::PeakEwma, 0), (Strategy::LeastPending, 1)] {
            let (ch, now) = fleet(strategy, 2);
            let pool = &ch.shared;
            let snap = pool.snapshot();
            for (inst, ns) in snap.iter().zip([2e6f64, 4e6]) {
                inst.latency.set(ns, now, false);
            }
            let until = snap[0]
                .others
                .set(10, now, pool.ctx.load.reports.max_age_ticks);
            pool.ctx.load.reports_fresh.note(until);
            let picked = pick(&pool.picker, &snap, &[], crate::load::tie::Method::NONE);
            assert_eq!(picked, Some(want), "{strategy:?}");
        }
    }
}
