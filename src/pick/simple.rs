//! The simple strategies, for comparison: Peak EWMA, power of two choices, round robin.
//!
//! # Peak EWMA
//!
//! Cost = (calls in flight + 1) × the peak-sensitive moving average of latency, as in Finagle's
//! and linkerd's `PeakEwma`; the cheapest wins, ties at random.
//!
//! # Power of two choices
//!
//! The less loaded of two distinct instances drawn at random (Mitzenmacher, "The Power of Two
//! Choices in Randomized Load Balancing", 2001), as tower's `p2c` does.
//!
//! # Round robin
//!
//! The next usable instance in order, ignoring load: the baseline.

use super::{Load, Rng};

/// Peak EWMA: the lowest (in flight + 1) × latency; unknown latency counts as `floor_ns`.
#[inline]
pub fn peak_ewma<T>(
    items: &[T],
    rng: &mut Rng,
    floor_ns: f64,
    mut load: impl FnMut(&T) -> Option<Load>,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut best_cost = f64::INFINITY;
    let mut ties = 0usize;
    for (i, item) in items.iter().enumerate() {
        let Some(l) = load(item) else { continue };
        let cost = (l.in_flight as f64 + 1.0) * l.latency_ns.max(floor_ns);
        if cost < best_cost {
            best = Some(i);
            best_cost = cost;
            ties = 1;
        } else if cost == best_cost {
            ties += 1;
            if rng.below(ties) == 0 {
                best = Some(i);
            }
        }
    }
    best
}

/// Power of two choices: the less loaded of two distinct random candidates (fewer in flight;
/// on equal counts the lower latency; then the first draw). Falls back to a scan when random
/// draws keep hitting unusable instances.
#[inline]
pub fn power_of_two<T>(
    items: &[T],
    rng: &mut Rng,
    mut load: impl FnMut(&T) -> Option<Load>,
) -> Option<usize> {
    let n = items.len();
    if n == 0 {
        return None;
    }
    // A draw among all indices but `not` (distinct by construction); a few tries to land on a
    // usable one.
    let mut draw = |rng: &mut Rng, not: Option<usize>| -> Option<(usize, Load)> {
        let range = n - usize::from(not.is_some());
        for _ in 0..8 {
            let mut i = rng.below(range);
            if not.is_some_and(|x| i >= x) {
                i += 1;
            }
            if let Some(l) = load(&items[i]) {
                return Some((i, l));
            }
        }
        None
    };
    let Some(a) = draw(rng, None) else {
        // Most are unusable: take a uniformly random usable one, if any.
        return uniform_usable(items, rng, load);
    };
    if n == 1 {
        return Some(a.0);
    }
    let Some(b) = draw(rng, Some(a.0)) else {
        return Some(a.0);
    };
    let a_wins = (a.1.in_flight, a.1.latency_ns) <= (b.1.in_flight, b.1.latency_ns);
    Some(if a_wins { a.0 } else { b.0 })
}

fn uniform_usable<T>(
    items: &[T],
    rng: &mut Rng,
    mut load: impl FnMut(&T) -> Option<Load>,
) -> Option<usize> {
    let mut best = None;
    let mut seen = 0usize;
    for (i, item) in items.iter().enumerate() {
        if load(item).is_some() {
            seen += 1;
            if rng.below(seen) == 0 {
                best = Some(i);
            }
        }
    }
    best
}

/// Round robin: the first usable candidate at or after `counter` (mod the length).
#[inline]
pub fn round_robin<T>(
    items: &[T],
    counter: usize,
    mut load: impl FnMut(&T) -> Option<Load>,
) -> Option<usize> {
    let n = items.len();
    for k in 0..n {
        let i = (counter + k) % n;
        if load(&items[i]).is_some() {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::Rng;
    use super::*;
    use proptest::prelude::*;

    /// Loads for the other strategies.
    fn loads(v: &[(Option<usize>, f64)]) -> Vec<Option<Load>> {
        v.iter()
            .map(|&(f, l)| {
                f.map(|in_flight| Load {
                    in_flight,
                    latency_ns: l,
                })
            })
            .collect()
    }

    fn arb_loads() -> impl Strategy<Value = Vec<(Option<usize>, f64)>> {
        prop::collection::vec(
            (
                prop::option::weighted(0.85, 0usize..6),
                prop_oneof![Just(0.0), Just(2e6), 0.0f64..50e6],
            ),
            0..60,
        )
    }

    proptest! {
        /// Peak EWMA and p2c never pick an unusable instance and find one whenever one exists;
        /// peak EWMA picks the lowest cost.
        #[test]
        fn other_strategies_pick_usable(fleet in arb_loads(), seed: u64, counter: usize) {
            let items = loads(&fleet);
            let any = items.iter().any(|l| l.is_some());
            let mut rng = Rng::seeded(seed);
            let pe = peak_ewma(&items, &mut rng, 1e6, |l| *l);
            prop_assert_eq!(pe.is_some(), any);
            if let Some(i) = pe {
                let cost = |l: &Load| (l.in_flight as f64 + 1.0) * l.latency_ns.max(1e6);
                let c = cost(&items[i].unwrap());
                prop_assert!(items.iter().flatten().all(|l| cost(l) >= c));
            }
            let p2 = power_of_two(&items, &mut rng, |l| *l);
            prop_assert_eq!(p2.is_some(), any);
            prop_assert!(p2.is_none_or(|i| items[i].is_some()));
            let rr = round_robin(&items, counter, |l| *l);
            prop_assert_eq!(rr.is_some(), any);
            prop_assert!(rr.is_none_or(|i| items[i].is_some()));
        }
    }

    #[test]
    fn nothing_usable_nothing_picked() {
        let mut rng = Rng::seeded(7);
        let none: Vec<Option<Load>> = vec![None; 5];
        assert_eq!(peak_ewma(&none, &mut rng, 1.0, |l| *l), None);
        assert_eq!(power_of_two(&none, &mut rng, |l| *l), None);
        assert_eq!(round_robin(&none, 3, |l| *l), None);
        let empty: Vec<Option<Load>> = vec![];
        assert_eq!(power_of_two(&empty, &mut rng, |l| *l), None);
    }

    #[test]
    fn p2c_prefers_less_loaded_of_two() {
        let items = loads(&[(Some(5), 0.0), (Some(0), 0.0)]);
        let mut rng = Rng::seeded(3);
        for _ in 0..100 {
            assert_eq!(power_of_two(&items, &mut rng, |l| *l), Some(1));
        }
    }
}
