//! Least pending: the instance with the fewest calls in flight, ties broken by turns.
//!
//! The instance with the fewest calls in flight wins. This is the rule of Finagle's and
//! linkerd's "least loaded" balancers, applied over every instance rather than over two random
//! ones: with a few dozen instances a full scan is cheap and always finds the least loaded one.
//!
//! Ties are frequent (at low load every instance has zero calls in flight), and the naive scan that
//! keeps the first minimum sends every call to the same instance. Here each instance keeps a *pass*
//! (a virtual time, as in stride scheduling): among the tied candidates the one with the lowest
//! pass wins, and its pass then advances by its *stride*. An instance as fast as the rest has a
//! stride of [`UNIT`](crate::load::tie::UNIT), so tied equals take turns, more evenly than a
//! random draw would spread them; one that answers slower has a longer stride, growing smoothly
//! with how much slower it is, so it wins fewer ties but keeps winning some (its chance never drops
//! to zero, and its estimate is re-checked within a bounded share of the calls). An instance that
//! answered markedly slower than the rest is also *gated* for a while after that answer (a time
//! proportional to how much slower it was, growing while its answers stay slow, capped): no tie
//! goes to it before then. The strides, gates and estimates are computed when a call's answer
//! arrives (see `crate::load::tie`), not here: the pick only compares two numbers per
//! candidate.
//!
//! An instance that missed turns because it was busy (a long call kept it out of the ties)
//! is behind the others, and wins them back when it is idle again, so that calls, not only
//! turns, are shared evenly; but an instance that fell far behind (new, or back from an
//! ejection) would win every tie until it caught up; so the chosen instance's pass restarts at
//! the lowest from [`CREDIT`] turns before the runner-up's last one ([`Chosen::floor`]): an
//! instance that kept its turns is never set back by that, and a latecomer wins at most a few
//! more ties than the rest, not a burst. An instance that joins the set, or comes back into
//! service (reconnected, readmitted after an ejection, healthy again), starts at the set's
//! turns (the median pass of those in service, see `TieBreak::join_at`), with no credit at all:
//! with many clients, a few more ties each is a burst on the newcomer.
//!
//! Calls to an expensive method (one many times costlier than the typical call) take turns of their
//! own: the caller hands the pick each candidate's expensive pass instead (see `crate::load::tie`).
//!
//! The scan is one pass over the counts (a tight loop over integers) that also notes where the
//! tied candidates are; the tie-break then looks at all of them if there are at most
//! [`TIE_SAMPLE`] (8), else at [`TIE_WINDOW`] (4) in a row (in the order of the set, around its
//! end) from a random one, so that a pick over many idle instances stays cheap (the lowest pass
//! of four of them is close to the lowest of all, and the turns stay even: see the tests). Each
//! tie is in that window with the same chance, for one random draw (a uniform sample of eight
//! took eight draws and eight reads of a tie's record). With more than [`TIE_BUF`] ties (a
//! large idle fleet), a second pass looks for the sample from a random position with a random
//! stride instead.

use super::{Chosen, Rng, Turn, CREDIT};

/// How many tied candidates the first pass remembers; with more, the second pass looks for
/// them (see `many_ties`).
pub(crate) const TIE_BUF: usize = 64;

/// Up to this many tied candidates, the tie-break looks at all of them; with more than
/// [`TIE_BUF`], at this many met on a random walk (see `many_ties`).
pub(crate) const TIE_SAMPLE: usize = 8;

/// With more than [`TIE_SAMPLE`] ties (and at most [`TIE_BUF`]), the tie-break looks at this
/// many of them in a row from a random one.
pub(crate) const TIE_WINDOW: usize = 4;

/// Least pending with the pass tie-break (see the module docs). `in_flight` returns `None` for
/// an instance that must not get calls; `turn` is read only for the candidates tied for the
/// fewest calls in flight. `strides` are steps prime to `items.len()` and below it (see
/// [`strides_for`](crate::set::strides_for)); empty means in order.
///
/// One pass finds the fewest calls in flight and notes where the tied candidates are (up to
/// 64 of them); the tie-break then looks at all of them if there are at most 8, else at 4 in a
/// row from a random one, and takes the lowest pass among those not gated. With more than 64
/// ties, a second pass from a random position with a random stride finds the sample.
#[inline]
pub fn least_pending<T>(
    items: &[T],
    rng: &mut Rng,
    strides: &[usize],
    mut in_flight: impl FnMut(&T) -> Option<usize>,
    turn: impl FnMut(&T) -> Turn,
) -> Option<Chosen> {
    // Pass 1: the fewest in flight, and where the candidates that have it are (the last
    // TIE_BUF of them). Every candidate with at most the fewest so far goes into the ring
    // `ties` at `end`; a new fewest marks where its ties `start`. The count `end` only ever
    // grows by one: a reset to zero on a new fewest made each candidate wait for the one before
    // (a select then an increment), which the idle pick paid for in time.
    let mut min = usize::MAX;
    let mut ties = [0u32; TIE_BUF];
    let (mut start, mut end) = (0usize, 0usize);
    // By index rather than `enumerate`: the loop then keeps the slice's address in a register
    // rather than reloading it for each candidate (`scripts/instructions.sh pick`).
    #[allow(clippy::needless_range_loop)]
    for i in 0..items.len() {
        match in_flight(&items[i]) {
            // One branch for the common case, a candidate with more than the fewest.
            Some(f) if f <= min => {
                if f < min {
                    min = f;
                    start = end;
                }
                ties[end % TIE_BUF] = i as u32;
                end += 1;
            }
            _ => {}
        }
    }
    if min == usize::MAX {
        return None;
    }
    // The ties, in the order of the set; all in the ring while there are at most TIE_BUF.
    let t = end - start;
    let tie = |j: usize| ties[(start + j) % TIE_BUF] as usize;
    if t == 1 {
        return Some(Chosen {
            index: tie(0),
            floor: 0,
        });
    }
    if t <= TIE_WINDOW {
        // Every tie is looked at (a sample only as large as needed: it is cleared first).
        return Sample::<TIE_WINDOW>::of((0..t).map(tie), items, turn);
    }
    if t <= TIE_SAMPLE {
        return Sample::<TIE_SAMPLE>::of((0..t).map(tie), items, turn);
    }
    if t <= TIE_BUF {
        // TIE_WINDOW ties in a row from a random one on (around the end): each tie is in the
        // window with the same chance, for one random draw.
        let k = rng.below(t);
        let window = (k..k + TIE_WINDOW).map(|j| tie(if j < t { j } else { j - t }));
        return Sample::<TIE_WINDOW>::of(window, items, turn);
    }
    many_ties(items, rng, strides, min, in_flight, turn)
}

/// The tie-break over the tied candidates it looks at (at most `N`), fed one at a time: the
/// open ones (not gated) as they come, the gated ones once the lowest open pass is known.
struct Sample<const N: usize> {
    /// Candidates fed.
    len: usize,
    lowest: Lowest,
    /// The gated candidates.
    gated: [(u32, Turn); N],
    n_gated: usize,
}

/// The lowest pass among the open candidates fed so far, its index and stride, and the
/// runner-up's pass and stride. `u64::MAX` stands for none: no pass reaches it.
#[derive(Clone, Copy)]
struct Lowest {
    index: u32,
    pass: u64,
    stride: u64,
    runner_up: u64,
    runner_up_stride: u64,
}

impl Lowest {
    const NONE: Lowest = Lowest {
        index: 0,
        pass: u64::MAX,
        stride: 0,
        runner_up: u64::MAX,
        runner_up_stride: 0,
    };

    /// An open candidate: the lowest pass so far (the first of equals), or the runner-up.
    #[inline]
    fn open(&mut self, i: u32, pass: u64, stride: u64) {
        if pass < self.pass {
            (self.runner_up, self.runner_up_stride) = (self.pass, self.stride);
            (self.index, self.pass, self.stride) = (i, pass, stride);
        } else if pass < self.runner_up {
            (self.runner_up, self.runner_up_stride) = (pass, stride);
        }
    }

    /// The lowest pass among the open candidates: those not gated (fed already), and the
    /// `gated` ones whose gate the lowest pass of those not gated has reached. If every
    /// candidate is gated, the lowest pass of all (the fewest calls in flight still win).
    #[inline]
    fn chosen(mut self, gated: &[(u32, Turn)]) -> Option<Chosen> {
        let open_pass = self.pass;
        if open_pass == u64::MAX {
            let (i, _) = gated.iter().min_by_key(|(_, t)| t.pass)?;
            return Some(Chosen {
                index: *i as usize,
                floor: 0,
            });
        }
        for &(i, t) in gated {
            if t.gate <= open_pass {
                self.open(i, t.pass, t.stride);
            }
        }
        let floor = if self.runner_up == u64::MAX {
            0
        } else {
            self.runner_up
                .saturating_sub(self.runner_up_stride + CREDIT)
        };
        Some(Chosen {
            index: self.index as usize,
            floor,
        })
    }
}

/// Candidate `i` with `turn`: into `lowest` if it is open, else among the `gated`.
#[inline(always)]
fn feed(lowest: &mut Lowest, gated: &mut [(u32, Turn)], n_gated: &mut usize, i: usize, turn: Turn) {
    if turn.gate == 0 {
        lowest.open(i as u32, turn.pass, turn.stride);
    } else {
        gated[*n_gated] = (i as u32, turn);
        *n_gated += 1;
    }
}

impl<const N: usize> Default for Sample<N> {
    fn default() -> Self {
        Sample {
            len: 0,
            lowest: Lowest::NONE,
            gated: [(0, Turn::default()); N],
            n_gated: 0,
        }
    }
}

impl<const N: usize> Sample<N> {
    /// The choice among the candidates at `indices` (at most `N`).
    #[inline]
    fn of<T>(
        indices: impl Iterator<Item = usize>,
        items: &[T],
        mut turn: impl FnMut(&T) -> Turn,
    ) -> Option<Chosen> {
        // Kept in locals rather than in a `Sample`, so that they stay in registers.
        let mut lowest = Lowest::NONE;
        let mut gated = [(0, Turn::default()); N];
        let mut n_gated = 0;
        for i in indices {
            feed(&mut lowest, &mut gated, &mut n_gated, i, turn(&items[i]));
        }
        lowest.chosen(&gated[..n_gated])
    }

    #[inline]
    fn push(&mut self, i: usize, turn: Turn) {
        self.len += 1;
        feed(
            &mut self.lowest,
            &mut self.gated,
            &mut self.n_gated,
            i,
            turn,
        );
    }

    fn chosen(&self) -> Option<Chosen> {
        self.lowest.chosen(&self.gated[..self.n_gated])
    }
}

/// More ties than fit the buffer (a large idle fleet): the first [`TIE_SAMPLE`] candidates with
/// `min` in flight met from a random position with a random stride, and the lowest pass among
/// them. Close to uniform over the ties.
#[cold]
fn many_ties<T>(
    items: &[T],
    rng: &mut Rng,
    strides: &[usize],
    min: usize,
    mut in_flight: impl FnMut(&T) -> Option<usize>,
    mut turn: impl FnMut(&T) -> Turn,
) -> Option<Chosen> {
    let n = items.len();
    let start = rng.below(n);
    // Visit in a random stride, not in order, so that a run of busy instances does not make
    // the tie right after it the first one seen more often than the others.
    let stride = match strides.len() {
        0 => 1,
        k => strides[rng.below(k)],
    };
    let mut sample = Sample::<TIE_SAMPLE>::default();
    // Counts move under concurrent calls: the least loaded seen in this pass, in case none of
    // the first pass's minimum is left.
    let mut fallback: Option<(usize, usize)> = None;
    let mut i = start;
    for k in 0..n {
        if k > 0 {
            i += stride;
            if i >= n {
                i -= n;
            }
        }
        let item = &items[i];
        let Some(f) = in_flight(item) else { continue };
        if f > min {
            if fallback.is_none_or(|(_, g)| f < g) {
                fallback = Some((i, f));
            }
            continue;
        }
        sample.push(i, turn(item));
        if sample.len == TIE_SAMPLE {
            break;
        }
    }
    sample
        .chosen()
        .or(fallback.map(|(index, _)| Chosen { index, floor: 0 }))
}

#[cfg(test)]
mod tests {
    use super::Rng;
    use super::*;
    use crate::load::tie::UNIT;
    use crate::set::strides_for;
    use proptest::prelude::*;

    /// A candidate as the tie-break sees it, with the stride the channel would apply when it
    /// is chosen.
    #[derive(Debug, Clone, Copy)]
    struct Candidate {
        in_flight: Option<usize>,
        pass: u64,
        stride: u64,
        gate: u64,
    }

    fn cand(in_flight: Option<usize>) -> Candidate {
        Candidate {
            in_flight,
            pass: 0,
            stride: UNIT,
            gate: 0,
        }
    }

    const IF: fn(&Candidate) -> Option<usize> = |c| c.in_flight;
    const TURN: fn(&Candidate) -> Turn = |c| Turn {
        pass: c.pass,
        stride: c.stride,
        gate: c.gate,
    };

    /// One pick as the channel makes it: the choice, then the chosen one's pass advances.
    fn pick(items: &mut [Candidate], rng: &mut Rng) -> Option<usize> {
        let strides = strides_for(items.len());
        let c = least_pending(items, rng, &strides, IF, TURN)?;
        let it = &mut items[c.index];
        it.pass = it.pass.max(c.floor) + it.stride;
        Some(c.index)
    }

    fn arb_fleet() -> impl Strategy<Value = Vec<Candidate>> {
        prop::collection::vec(
            (
                prop::option::weighted(0.85, 0usize..6),
                0u64..20 * UNIT,
                1u64..16,
                prop::option::weighted(0.2, 1u64..40 * UNIT),
            )
                .prop_map(|(in_flight, pass, stride, gate)| Candidate {
                    in_flight,
                    pass,
                    stride: stride * UNIT,
                    gate: gate.unwrap_or(0),
                }),
            0..100,
        )
    }

    proptest! {
        /// The least-pending pick never chooses an instance with more calls in flight than
        /// another usable one, never an unusable one, and finds one whenever one exists; it
        /// picks a gated one only when no candidate it looked at is open; and the floor it
        /// gives never lets the chosen one's pass go back.
        #[test]
        fn least_pending_is_least(fleet in arb_fleet(), seed: u64) {
            let mut rng = Rng::seeded(seed);
            let got = least_pending(&fleet, &mut rng, &strides_for(fleet.len()), IF, TURN);
            let min = fleet.iter().filter_map(|c| c.in_flight).min();
            match (got, min) {
                (None, None) => {}
                (Some(c), Some(m)) => {
                    let chosen = fleet[c.index];
                    prop_assert_eq!(chosen.in_flight, Some(m), "picked {:?}", chosen);
                    let tied: Vec<usize> = (0..fleet.len()).filter(|&i| fleet[i].in_flight == Some(m)).collect();
                    let t = tied.len();
                    // The ties the tie-break looked at: all of them up to TIE_SAMPLE; up to
                    // TIE_BUF, the window of TIE_WINDOW from the first draw of the same seed.
                    let looked: Option<Vec<usize>> = if t <= TIE_SAMPLE {
                        Some(tied.clone())
                    } else if t <= TIE_BUF {
                        let k = Rng::seeded(seed).below(t);
                        Some((0..TIE_WINDOW).map(|j| tied[(k + j) % t]).collect())
                    } else {
                        None
                    };
                    if let Some(looked) = looked {
                        prop_assert!(looked.contains(&c.index), "chose {} outside {:?}", c.index, looked);
                        let v = looked.iter().filter(|&&i| fleet[i].gate == 0).map(|&i| fleet[i].pass).min();
                        match v {
                            // All gated: the lowest pass.
                            None => prop_assert_eq!(Some(chosen.pass), looked.iter().map(|&i| fleet[i].pass).min()),
                            Some(v) => {
                                // Open (not gated, or the gate reached): the lowest pass of those.
                                prop_assert!(chosen.gate <= v, "a gated one chosen: {:?}", chosen);
                                let open: Vec<usize> = looked.iter().copied().filter(|&i| fleet[i].gate <= v).collect();
                                prop_assert_eq!(Some(chosen.pass), open.iter().map(|&i| fleet[i].pass).min());
                                // The floor: the credit before the runner-up's last turn (the
                                // lowest pass of the other open ones).
                                if open.len() > 1 {
                                    let before = |i: usize| fleet[i].pass.saturating_sub(fleet[i].stride + CREDIT);
                                    let others = || open.iter().copied().filter(|&i| i != c.index);
                                    let runner_up = others().map(|i| fleet[i].pass).min();
                                    prop_assert!(others().any(|i| Some(fleet[i].pass) == runner_up && c.floor == before(i)), "floor {}", c.floor);
                                } else {
                                    prop_assert_eq!(c.floor, 0);
                                }
                            }
                        }
                    }
                }
                other => prop_assert!(false, "pick {:?}", other),
            }
        }

        /// Equal ties take turns: over many picks every tied instance gets its fair share
        /// within 10% (a random draw would need far more picks for that), also past the tie
        /// buffer (more than 64 ties) and with busy instances among them.
        #[test]
        fn ties_take_turns(n in 2usize..150, busy in prop::collection::vec(prop::bool::weighted(0.3), 150), seed: u64) {
            let mut items: Vec<Candidate> =
                (0..n).map(|i| cand(Some(usize::from(busy[i])))).collect();
            let tied: Vec<usize> = (0..n).filter(|&i| !busy[i]).collect();
            let tied = if tied.is_empty() { (0..n).collect() } else { tied };
            let mut rng = Rng::seeded(seed);
            let rounds = 100;
            let picks = rounds * tied.len();
            let mut counts = vec![0usize; n];
            for _ in 0..picks {
                counts[pick(&mut items, &mut rng).unwrap()] += 1;
            }
            prop_assert_eq!(counts.iter().sum::<usize>(), picks);
            for &i in &tied {
                prop_assert!(counts[i] * 10 >= rounds * 9 && counts[i] * 10 <= rounds * 11,
                    "instance {} got {} picks, fair {}: {:?}", i, counts[i], rounds, counts);
            }
        }

        /// A slower instance (a longer stride) wins fewer ties, in proportion, but never none;
        /// a gated one wins none while another tie is open, until the others' turns reach its
        /// gate.
        #[test]
        fn a_longer_stride_wins_fewer_ties(n in 2usize..30, slow in 0usize..30, k in 2u64..20, seed: u64) {
            let slow = slow % n;
            let mut items: Vec<Candidate> = (0..n).map(|_| cand(Some(0))).collect();
            items[slow].stride = k * UNIT;
            let mut rng = Rng::seeded(seed);
            let rounds = 40 * k as usize;
            let picks = rounds * (n - 1) + rounds / k as usize;
            let mut counts = vec![0usize; n];
            for _ in 0..picks {
                counts[pick(&mut items, &mut rng).unwrap()] += 1;
            }
            let fair_slow = rounds / k as usize;
            prop_assert!(counts[slow] > 0);
            prop_assert!(counts[slow] * 10 <= fair_slow * 13 + 10, "slow got {}, expected about {}: {:?}", counts[slow], fair_slow, counts);
            prop_assert!(counts[slow] * 10 >= fair_slow * 7, "slow got {}, expected about {}: {:?}", counts[slow], fair_slow, counts);
            // Gated until the others' passes reach far ahead: no tie for it meanwhile.
            let far = items.iter().map(|c| c.pass).max().unwrap() + 1000 * UNIT;
            items[slow].gate = far;
            for _ in 0..100 {
                prop_assert_ne!(pick(&mut items, &mut rng), Some(slow));
            }
            // Gated until the others reach where they are about to be: it opens soon.
            let near = items.iter().enumerate().filter(|&(i, _)| i != slow).map(|(_, c)| c.pass).min().unwrap() + 2 * UNIT;
            items[slow].gate = near;
            // (Its own pass may be up to its stride ahead of the others'.)
            let within = (k as usize + 4) * n * 2;
            prop_assert!((0..within).any(|_| pick(&mut items, &mut rng) == Some(slow)), "never opened");
        }

        /// An instance whose pass is far behind (back from an ejection) wins about its credit
        /// of extra ties, then takes turns like the others: no burst. (It wins when it is in
        /// the tie-break's window and still behind: with a window of 4 of 49 ties it catches up
        /// over more picks than with 8, and takes a turn or two of the others' advance
        /// meanwhile: at most its credit, its 3 turns and 4 more, where the window of 8 kept
        /// it to 2 more.)
        #[test]
        fn a_latecomer_gets_no_burst(n in 2usize..60, late in 0usize..60, seed: u64) {
            let late = late % n;
            let mut items: Vec<Candidate> = (0..n)
                .map(|i| Candidate { pass: 1_000_000 * UNIT + i as u64, ..cand(Some(0)) })
                .collect();
            items[late].pass = 0;
            let mut rng = Rng::seeded(seed);
            let picks = 3 * n;
            let got = (0..picks).filter(|_| pick(&mut items, &mut rng) == Some(late)).count();
            prop_assert!(got <= 3 + 4 + (CREDIT / UNIT) as usize, "the latecomer got {} of {} picks", got, picks);
            // And it is not left out: within 3n more picks it takes a turn too (the chance
            // that a window of 4 misses it 6n times in a row is about e^-24).
            let later = (0..picks).filter(|_| pick(&mut items, &mut rng) == Some(late)).count();
            prop_assert!(got + later >= 1, "the latecomer got no pick of {}", 2 * picks);
        }
    }

    /// Ties among equals are spread more evenly than chance: 10 tied instances, 2,000 picks,
    /// each within 2% of its fair share (chance alone: a standard deviation of 6.7%).
    #[test]
    fn ties_are_even() {
        let mut items: Vec<Candidate> = (0..10).map(|_| cand(Some(0))).collect();
        let mut rng = Rng::seeded(99);
        let mut counts = [0usize; 10];
        for _ in 0..2_000 {
            counts[pick(&mut items, &mut rng).unwrap()] += 1;
        }
        assert!(
            counts.iter().all(|&c| (196..=204).contains(&c)),
            "{counts:?}"
        );
    }

    /// When every tied candidate is gated, the fewest calls in flight still win: a gate never
    /// sends a call to a busier instance.
    #[test]
    fn all_gated_still_least_pending() {
        let mut items = vec![cand(Some(0)), cand(Some(0)), cand(Some(1))];
        items[0].gate = u64::MAX;
        items[1].gate = u64::MAX;
        let mut rng = Rng::seeded(5);
        for _ in 0..100 {
            assert!(pick(&mut items, &mut rng).unwrap() < 2);
        }
    }

    #[test]
    fn nothing_usable_nothing_picked() {
        let mut rng = Rng::seeded(7);
        let none: Vec<Candidate> = vec![cand(None); 5];
        assert_eq!(least_pending(&none, &mut rng, &[], IF, TURN), None);
        let empty: Vec<Candidate> = vec![];
        assert_eq!(least_pending(&empty, &mut rng, &[], IF, TURN), None);
    }
}
