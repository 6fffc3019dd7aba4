//! What the least-pending tie-break learns from each answer (the pick itself is in `crate::pick`).
//!
//! Each time an instance answers a call (its response headers arrive), the time it took is
//! compared with the *reference* for the call's method: a channel-wide estimate of how long that
//! method takes on a fast instance. The ratio (the instance's *slowness*) is what the tie-break
//! weighs, so a service whose methods differ in cost does not make whichever instance served
//! the dear ones look slow: each answer is compared with answers to the same method.
//!
//! From the slowness come two things, both stored in the instance for the pick to read:
//!
//! - **The stride**: how far the instance's pass advances when it wins a tie. One turn
//!   ([`UNIT`]) up to [`KNEE`] times the reference (noise between equal instances costs
//!   nothing); beyond it, (slowness / KNEE)² turns, at most [`MAX_TURNS`]. An instance twice as
//!   slow as the rest wins about 40% of its fair share of the ties, three times as slow about
//!   17%: its chance falls smoothly, and it keeps being re-checked, at least once every
//!   [`MAX_TURNS`] turns of the others.
//! - **The gate**: an answer slower than [`GATE_AT`] times the reference closes the instance to
//!   ties for [`GATE_FACTOR`] times the excess (an answer of 50 ms where 5 ms is usual: 4 × 40
//!   ms = 160 ms), doubling with every further slow answer in a row, at most [`MAX_GATE`]. So a re-check
//!   of a slow instance costs at most a fixed share of time whatever the rate of calls, and an
//!   instance that stays slow is re-checked ever more rarely; one that answers fast again is
//!   open again at once. A cold start (a few slow first answers) costs a few short gates, not
//!   a long exclusion.
//!
//! The slowness estimate moves half way towards a new sample, counting a sample for at most 4
//! times the estimate (one hiccup does not mark an instance slow), and drops at once to a
//! sample less than half of it (an instance that recovered is believed at once).
//!
//! The method references live in a small table indexed by a hash of the method's path, tagged
//! so that two methods that share a slot replace each other rather than mix. A reference moves
//! by 1/32 of itself towards each answer, so it settles on the median answer time of the
//! method (the fast instances' time while the pick keeps the slow ones out), and a rare slow
//! answer barely moves it; an answer less than half of it pulls it a quarter of the way down
//! at once, so that a slow first answer (the reference's first value) is soon forgotten.
//!
//! **Dear calls take turns of their own.** A method whose reference is more than [`DEAR_AT`]
//! times the typical call's (the median over calls of their methods' references) is *dear*:
//! its calls hold an instance far longer than most. If they took the same turns as the rest,
//! where they fell would follow the order of the turns (every fourth call dear over four idle
//! instances: all on one), and an instance that drew more than its share would be busy, and out
//! of the ties for the cheap calls, longer than the others; so each instance keeps a second
//! pass for dear calls, and the pick of a dear call compares those (see [`Tie::dear_turn`]).
//! In the shootout's mixed-methods scenario this took the largest deviation from a fair share of
//! the calls from 10-21% to 6-7%.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The stride of an instance as fast as the rest: one turn.
pub const UNIT: u64 = 1 << 16;

/// The turns an instance may be behind the others and win back: one that missed turns because
/// it was busy (a long call kept it out of the ties) wins them back when it is idle again, up
/// to this many; one that was away longer (new, or back from an ejection) is not owed more.
pub const CREDIT: u64 = 8 * UNIT;

/// What the least-pending tie-break reads of a tied candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Turn {
    /// Its pass: the lowest wins the tie.
    pub pass: u64,
    /// How far its pass advances when it wins.
    pub stride: u64,
    /// 0: open. Otherwise it is gated (it answered markedly slower than the rest not long
    /// ago): it wins no tie until the open candidates' passes reach this value, unless every
    /// candidate is gated.
    pub gate: u64,
}

/// Up to this many times the method's reference, an answer costs no turn.
pub(crate) const KNEE: f64 = 1.25;
/// The longest stride, in turns.
pub(crate) const MAX_TURNS: f64 = 8.0;
/// An answer slower than this many times the reference closes the instance to ties...
pub(crate) const GATE_AT: f64 = 2.0;
/// ...for this many times its excess over `GATE_AT` × the reference...
pub(crate) const GATE_FACTOR: f64 = 4.0;
/// ...doubled for each slow answer in a row, at most this long (nanoseconds: 10 s)...
pub(crate) const MAX_GATE: f64 = 10e9;
/// ...or until the others have taken this many turns (doubled likewise), if that comes first.
pub(crate) const GATE_TURNS: u64 = 32;
/// One call in flight in [`Tie::weight`]'s units.
pub(crate) const WEIGHT_ONE: u64 = 16;
/// The most one call in flight on a gated instance weighs, in calls: an instance whose calls
/// in flight plus one are more than 4.5 times the fewest plus one never wins, however slow the
/// one with the fewest has been (with none on it: one with four calls or more loses to it).
pub(crate) const MAX_WEIGHT: f32 = 4.5;
/// How long a slow answer gates an instance: `factor` times the answer's excess over
/// [`GATE_AT`] times its method's reference, at least `min_refs` times that reference, doubled
/// for each slow answer in a row to a re-check, at most [`MAX_GATE`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GateRule {
    pub(crate) factor: f64,
    pub(crate) min_refs: f64,
    /// Whether a gate waits for confirmation where answers come often: a slow answer gates
    /// only if the instance's previous answer was slow too, and the gate is at least
    /// `min_refs` long only after a third slow answer in a row or a slow re-check (see
    /// [`Tie::observe_gated`]).
    pub(crate) confirm: bool,
}

impl GateRule {
    /// Least pending's: [`GATE_FACTOR`] times the excess.
    pub(crate) const LEAST_PENDING: GateRule = GateRule {
        factor: GATE_FACTOR,
        min_refs: 0.0,
        confirm: false,
    };

    /// [`Strategy::FewestThenFastest`](crate::Strategy::FewestThenFastest)'s: where answers
    /// come often, a gate only after two slow answers in a row, for ten times the excess; after
    /// a third in a row or a slow re-check (or at once where answers come rarely), at least two
    /// hundred times the method's usual time (a second where 5 ms is usual). A slow instance is re-checked one call at a time, ever more rarely while it
    /// stays slow: a bounded number of calls per second whatever the rate, rather than a share
    /// of the traffic (least pending's gates re-check a 20 times slower instance every 0.4 s at
    /// first, and open by turns as well as by time); and an instance whose slowness comes with
    /// its load (it answers fast when idle, slow with a few calls) is not handed calls again
    /// after every fast answer.
    pub(crate) const FEWEST_THEN_FASTEST: GateRule = GateRule {
        factor: 10.0,
        min_refs: 200.0,
        confirm: true,
    };
}

/// A slow answer that comes more than this many times its method's reference after the
/// instance's previous answer gates at once, without waiting for a second one: a client that
/// sees an instance rarely (one of many clients, or a low rate) would get its confirmation after
/// the slow spell is over. (50 clients sharing 2,000 calls/s see each of 20 instances about
/// twice a second: a gate that waited for two slow answers in a row let least pending's share
/// through, a p99 of 41.6 ms against tower's p2c's 29.4 ms.)
const SPARSE_REFS: f64 = 50.0;
/// Slow answers in a row counted for the doubling.
const MAX_STRIKES: u32 = 7;

/// The tie-break's record of one instance. The pick reads `pass`, `stride`, `recheck_at` and
/// `gate_pass`; the rest is written when an answer arrives.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Tie {
    pass: AtomicU64,
    /// The gate: until this time (nanoseconds since the channel's epoch)...
    recheck_at: AtomicU64,
    /// ...or until the others' passes reach this one, it wins no tie.
    gate_pass: AtomicU64,
    /// How far `pass` advances when the instance wins, in 1/65536 turns.
    stride: AtomicU32,
    /// The slowness estimate (`f32` bits; 0 before the first sample).
    slowness: AtomicU32,
    /// What each call in flight on it weighs while it is gated, in [`WEIGHT_ONE`] units (its
    /// slowness, at most [`MAX_WEIGHT`]): computed with the slowness, so the pick reads an
    /// integer.
    weight: AtomicU32,
    /// The pass of the ties for calls to dear methods (see [`Methods::is_dear`]): they take
    /// turns of their own, so that the calls that hold an instance longest are shared as evenly
    /// as the rest.
    dear_pass: AtomicU64,
    /// When the gate was last set: an answer to a call sent before then is no re-check.
    gated_at: AtomicU64,
    /// Slow answers in a row to re-checks.
    strikes: AtomicU32,
    /// Slow answers in a row, however sent (a gate that waits for confirmation counts them).
    slow_run: AtomicU32,
    /// When the last slow answer came.
    slow_at: AtomicU64,
    /// When the last answer came (any: a gate that waits for confirmation waits only where
    /// answers come often).
    answered_at: AtomicU64,
}

impl Tie {
    pub(crate) fn new() -> Tie {
        Tie {
            pass: AtomicU64::new(0),
            recheck_at: AtomicU64::new(0),
            gate_pass: AtomicU64::new(0),
            stride: AtomicU32::new(UNIT as u32),
            slowness: AtomicU32::new(0),
            weight: AtomicU32::new(WEIGHT_ONE as u32),
            dear_pass: AtomicU64::new(0),
            gated_at: AtomicU64::new(0),
            strikes: AtomicU32::new(0),
            slow_run: AtomicU32::new(0),
            slow_at: AtomicU64::new(0),
            answered_at: AtomicU64::new(0),
        }
    }

    /// What the pick compares; `now_ns` is the channel's clock.
    #[inline]
    pub(crate) fn turn(&self, now_ns: u64) -> Turn {
        Turn {
            pass: self.pass.load(Ordering::Relaxed),
            stride: u64::from(self.stride.load(Ordering::Relaxed)),
            gate: if self.recheck_at.load(Ordering::Relaxed) > now_ns {
                self.gate_pass.load(Ordering::Relaxed)
            } else {
                0
            },
        }
    }

    /// What the pick compares: [`Tie::dear_turn`] for a call to a dear method, else
    /// [`Tie::turn`].
    #[inline]
    pub(crate) fn turn_for(&self, dear: bool, now_ns: u64) -> Turn {
        if dear {
            self.dear_turn(now_ns)
        } else {
            self.turn(now_ns)
        }
    }

    /// What the pick compares for a call to a dear method: the dear pass, and no tie while
    /// the instance is gated (the others' dear passes say nothing of when to open it; the gate's
    /// time still does, and so do the cheap calls' turns).
    #[inline]
    pub(crate) fn dear_turn(&self, now_ns: u64) -> Turn {
        Turn {
            pass: self.dear_pass.load(Ordering::Relaxed),
            stride: u64::from(self.stride.load(Ordering::Relaxed)),
            gate: if self.recheck_at.load(Ordering::Relaxed) > now_ns {
                u64::MAX
            } else {
                0
            },
        }
    }

    /// How much one call in flight on the instance weighs in
    /// [`Strategy::FewestThenFastest`](crate::Strategy::FewestThenFastest)'s count, in
    /// [`WEIGHT_ONE`] units: one call while the instance is open; while it is gated (it answered
    /// markedly slower than the rest), its slowness, at most [`MAX_WEIGHT`].
    ///
    /// Without a branch: whether an instance is gated follows no pattern the processor could
    /// learn, and with the branch the pick over 50 busy instances took 120-129 ns against
    /// 106-112 ns without (`benches/pick.rs`, three interleaved runs each).
    #[inline]
    pub(crate) fn weight(&self, now_ns: u64) -> u64 {
        let gated = self.recheck_at.load(Ordering::Relaxed) > now_ns;
        // The stored weight is never below one call's (see `observe_gated`).
        let weight = u64::from(self.weight.load(Ordering::Relaxed));
        std::hint::select_unpredictable(gated, weight, WEIGHT_ONE)
    }

    /// Whether the instance answered markedly slower than the rest last time (a gate was set)
    /// and its gate is over: the call it is picked for now re-checks it.
    #[inline]
    pub(crate) fn is_due_for_recheck(&self, now_ns: u64) -> bool {
        let at = self.recheck_at.load(Ordering::Relaxed);
        at != 0 && at <= now_ns
    }

    /// A re-check was sent at `now_ns`: the instance stays gated for `hold_ns` more, until its
    /// answer says whether it is fast again (a fast answer opens it at once), so that one
    /// re-check goes at a time rather than every call while the answer is on its way.
    #[cold]
    pub(crate) fn recheck_sent(&self, now_ns: u64, hold_ns: u64) -> u64 {
        let until = now_ns.saturating_add(hold_ns.max(1));
        self.recheck_at.store(until, Ordering::Relaxed);
        until
    }

    /// The instance won a tie: its pass advances by its stride, from at least `floor` (see
    /// `pick::Chosen::floor`). Two picks at once may both read the old pass and one advance be
    /// lost: harmless, a turn is a share, not a count.
    #[inline]
    pub(crate) fn advance(&self, floor: u64) {
        self.step(floor, self.stride());
    }

    /// The instance won a tie for a call to a dear method, `floor` read from the dear passes:
    /// its dear pass advances from at least `floor`, and its pass as for any call (a dear call
    /// is a turn too).
    #[inline]
    pub(crate) fn advance_dear(&self, floor: u64) {
        self.step_dear(floor, self.stride());
    }

    /// As [`advance`](Self::advance) or [`advance_dear`](Self::advance_dear), by `stretch`
    /// times its stride (a warming instance in slow start).
    pub(crate) fn advance_stretched(&self, dear: bool, floor: u64, stretch: f64) {
        let stride = (self.stride() as f64 * stretch) as u64;
        if dear {
            self.step_dear(floor, stride);
        } else {
            self.step(floor, stride);
        }
    }

    #[inline]
    fn stride(&self) -> u64 {
        u64::from(self.stride.load(Ordering::Relaxed))
    }

    #[inline]
    fn step(&self, floor: u64, stride: u64) {
        let pass = self.pass.load(Ordering::Relaxed).max(floor);
        self.pass.store(pass + stride, Ordering::Relaxed);
    }

    #[inline]
    fn step_dear(&self, floor: u64, stride: u64) {
        let dear = self.dear_pass.load(Ordering::Relaxed).max(floor);
        self.dear_pass.store(dear + stride, Ordering::Relaxed);
        let pass = self.pass.load(Ordering::Relaxed);
        self.pass.store(pass + stride, Ordering::Relaxed);
    }

    /// The instance joins a set whose turns are at `level`: its passes start there (or stay
    /// where they are, if further on). Without this a newcomer (pass 0) would win
    /// [`CREDIT`] turns in a row from every client at once: with 50
    /// clients, 400 calls in a burst on an instance that gets 2 a second from each.
    pub(crate) fn join_at(&self, level: Level) {
        self.pass.fetch_max(level.pass, Ordering::Relaxed);
        self.dear_pass.fetch_max(level.dear_pass, Ordering::Relaxed);
    }

    /// Records that the instance answered at `at` (nanoseconds on the channel's clock) without
    /// a sample: for fixtures (the benchmarks' fleet, tests) whose next answer is to be judged
    /// as one that comes rarely, so that one slow answer gates at once.
    pub(crate) fn answered_long_before(&self, at: u64) {
        self.answered_at.store(at.max(1), Ordering::Relaxed);
    }

    /// The slowness estimate (1.0: as fast as the method's reference), `None` before the first
    /// sample.
    pub(crate) fn slowness(&self) -> Option<f64> {
        let s = f32::from_bits(self.slowness.load(Ordering::Relaxed));
        (s > 0.0).then_some(f64::from(s))
    }

    /// As [`observe_gated`](Self::observe_gated) with least pending's gates.
    #[cfg(test)]
    pub(crate) fn observe(&self, sample_ns: f64, reference_ns: f64, sent_ns: u64, now_ns: u64) {
        self.observe_gated(
            sample_ns,
            reference_ns,
            sent_ns,
            now_ns,
            GateRule::LEAST_PENDING,
            &Noise::default(),
        );
    }

    /// One answer to a call sent at `sent_ns`: it took `sample_ns`, where the method's
    /// reference is `reference_ns`, at `now_ns` on the channel's clock. A gate it sets lasts as
    /// `rule` says. Returns when the gate it set ends (0: it set none).
    pub(crate) fn observe_gated(
        &self,
        sample_ns: f64,
        reference_ns: f64,
        sent_ns: u64,
        now_ns: u64,
        rule: GateRule,
        noise: &Noise,
    ) -> u64 {
        if !(reference_ns > 0.0 && sample_ns.is_finite()) {
            return 0;
        }
        // How many slow answers in a row it takes is judged before this answer counts.
        let before = noise.0.load(Ordering::Relaxed);
        if rule.confirm && self.slow_run.load(Ordering::Relaxed) == 0 {
            noise.observe(before, sample_ns > GATE_AT * reference_ns);
        }
        let prev = self.learn(sample_ns / reference_ns);
        let excess = sample_ns - GATE_AT * reference_ns;
        // The instance's first answer says nothing of how often answers come (and is often a
        // warm-up's: a new connection, a cold server).
        let sparse = rule.confirm && {
            let last = self.answered_at.swap(now_ns, Ordering::Relaxed);
            last != 0 && now_ns.saturating_sub(last) as f64 > SPARSE_REFS * reference_ns
        };
        if excess > 0.0 {
            let gated_at = self.gated_at.load(Ordering::Relaxed);
            let strikes = self.strikes.load(Ordering::Relaxed);
            let (strikes, floor) = if rule.confirm {
                let confirm = Noise::run_for(before);
                let Some(gate) =
                    self.confirmed(now_ns, sent_ns, reference_ns, rule, confirm, sparse)
                else {
                    return 0;
                };
                gate
            } else {
                // A strike: slow again when re-checked after a gate (answers to calls that
                // were already on their way when the gate was set add none).
                let strikes = if prev < GATE_AT {
                    0
                } else if sent_ns >= gated_at {
                    (strikes + 1).min(MAX_STRIKES)
                } else {
                    strikes
                };
                (strikes, rule.min_refs * reference_ns)
            };
            self.strikes.store(strikes, Ordering::Relaxed);
            let gate =
                ((rule.factor * excess).max(floor) * f64::from(1u32 << strikes)).min(MAX_GATE);
            let turns = (GATE_TURNS << strikes) * UNIT;
            let pass = self.pass.load(Ordering::Relaxed);
            self.gate_pass
                .store(pass.saturating_add(turns), Ordering::Relaxed);
            let until = now_ns.saturating_add(gate as u64);
            self.recheck_at.store(until, Ordering::Relaxed);
            self.gated_at.store(now_ns, Ordering::Relaxed);
            until
        } else {
            self.slow_run.store(0, Ordering::Relaxed);
            self.recheck_at.store(0, Ordering::Relaxed);
            self.strikes.store(0, Ordering::Relaxed);
            0
        }
    }
}

impl Tie {
    /// The slowness estimate moves with an answer `x` times the method's reference (see the
    /// module docs), and the stride and the weight of a gated instance's calls with it.
    /// Returns the estimate before.
    fn learn(&self, x: f64) -> f64 {
        let prev = f64::from(f32::from_bits(self.slowness.load(Ordering::Relaxed)));
        let s = if prev <= 0.0 || x < 0.5 * prev {
            x
        } else {
            prev + 0.5 * (x.min(4.0 * prev) - prev)
        };
        self.slowness.store((s as f32).to_bits(), Ordering::Relaxed);
        let weight = s.clamp(1.0, f64::from(MAX_WEIGHT)) * WEIGHT_ONE as f64;
        self.weight.store(weight as u32, Ordering::Relaxed);
        let turns = (s / KNEE).powi(2).clamp(1.0, MAX_TURNS);
        self.stride
            .store((turns * UNIT as f64) as u32, Ordering::Relaxed);
        prev
    }

    /// A slow answer, under a rule that waits for confirmation: `None` if it sets no gate yet,
    /// else the gate's strikes and floor.
    ///
    /// One slow answer from an instance whose previous answer was fast is most often the tail
    /// every instance has (a pause, a dear request): where answers come often, it sets no
    /// gate. `confirm` in a row (see [`Noise::run_for`]: two on a quiet client), within
    /// the longest gate, set a gate as long as the excess says; the long minimum waits for one
    /// more in a row or a slow re-check. Where answers come rarely (see [`SPARSE_REFS`]), one
    /// fewer sets the long gate at once. See
    /// `pick::fastest_scenarios::equal_instances_with_a_tail` for what a gate at every slow
    /// answer cost, and `a_client_that_stalls_gates_no_instance` for what a fixed two did on a
    /// busy client.
    fn confirmed(
        &self,
        now_ns: u64,
        sent_ns: u64,
        reference_ns: f64,
        rule: GateRule,
        confirm: u32,
        sparse: bool,
    ) -> Option<(u32, f64)> {
        let last = self.slow_at.swap(now_ns, Ordering::Relaxed);
        let run = if last != 0 && now_ns.saturating_sub(last) <= MAX_GATE as u64 {
            self.slow_run.load(Ordering::Relaxed).saturating_add(1)
        } else {
            1
        };
        self.slow_run.store(run, Ordering::Relaxed);
        if run < confirm - u32::from(sparse) {
            return None;
        }
        let strikes = self.strikes.load(Ordering::Relaxed);
        let strikes = if self.recheck_at.load(Ordering::Relaxed) == 0 {
            0
        } else if sent_ns >= self.gated_at.load(Ordering::Relaxed) {
            (strikes + 1).min(MAX_STRIKES)
        } else {
            strikes
        };
        let long = strikes > 0 || run > confirm || sparse;
        Some((
            strikes,
            if long {
                rule.min_refs * reference_ns
            } else {
                0.0
            },
        ))
    }
}

/// Where a set's turns are: the median of its instances' passes (the median, so that neither
/// an instance far ahead, a slow one with a long stride, nor one far behind, owed turns it
/// missed while busy, sets it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Level {
    pass: u64,
    dear_pass: u64,
}

impl Level {
    /// The level of these records; `None` for none.
    pub(crate) fn of<'a>(ties: impl Iterator<Item = &'a Tie>) -> Option<Level> {
        let (mut passes, mut dear): (Vec<u64>, Vec<u64>) = ties
            .map(|t| {
                (
                    t.pass.load(Ordering::Relaxed),
                    t.dear_pass.load(Ordering::Relaxed),
                )
            })
            .unzip();
        if passes.is_empty() {
            return None;
        }
        let mid = passes.len() / 2;
        Some(Level {
            pass: *passes.select_nth_unstable(mid).1,
            dear_pass: *dear.select_nth_unstable(mid).1,
        })
    }
}

/// Which slot of the method table a call's method uses, and the tag that tells its method from
/// others that hash to the same slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Method(u32);

const SLOTS: usize = 256;
/// How far a reference moves for one answer, as a share of itself.
const STEP: f64 = 1.0 / 32.0;

impl Method {
    /// No method: never dear, for picks made outside a call (benchmarks).
    pub(crate) const NONE: Method = Method(0);

    /// The key of a method path (`/package.Service/Method`): a hash of its bytes, eight at a
    /// time.
    #[inline]
    pub(crate) fn of(path: &str) -> Method {
        let mut h: u64 = 0x243F_6A88_85A3_08D3 ^ path.len() as u64;
        let bytes = path.as_bytes();
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            h = (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
        }
        let mut last = [0u8; 8];
        let rest = chunks.remainder();
        last[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(last)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 32;
        // Never 0: 0 marks an empty slot.
        Method((h as u32) | 1)
    }

    fn slot(self) -> usize {
        (self.0 >> 24) as usize % SLOTS
    }
}

/// A method whose reference is more than this many times the typical call's is dear.
pub(crate) const DEAR_AT: f64 = 4.0;

/// How often an answer is markedly slow (over [`GATE_AT`] times its method's reference) by
/// chance: the share of slow answers among those whose instance's previous answer was fast, a
/// moving average over the channel's answers. A client short of CPU (a build or a test suite
/// beside it, its runtime's own lag) delays answers from every instance alike; so does a
/// network's jitter. Such a slow answer says nothing of its instance, and two in a row from one
/// instance are then no rarity: a gate that waits for confirmation waits for as many slow
/// answers in a row as it takes for chance to give them less than once in a thousand
/// ([`Noise::run_for`]). An instance that is slow, rather than unlucky, answers slowly
/// every time, and only its first slow answer counts here, so it does not raise the share.
#[derive(Debug, Default)]
pub(crate) struct Noise(AtomicU64);

/// [`Noise`]'s average starts as if it had seen this many fast answers, and weighs each new
/// answer as one of those seen (the plain mean) until it has seen [`NOISE_WINDOW`] in all;
/// then it is a moving average over about that many. So a fresh channel on a busy client
/// learns its share of slow answers within its first few dozen answers.
const NOISE_PRIOR: u32 = 8;
/// Until this many answers have counted, the channel does not know how often answers are slow
/// by chance: a gate waits for three in a row at least.
const NOISE_KNOWN: u32 = 32;
/// The answers [`Noise`]'s moving average spans.
const NOISE_WINDOW: u32 = 128;
/// Below this share, chance counts for nothing (and the average stops being written).
const NOISE_FLOOR: f32 = 1e-4;
/// The longest run of slow answers a gate waits for.
const MAX_CONFIRM: u32 = 8;

impl Noise {
    /// An answer that counts (its instance's previous answer was fast): `slow` or not. The
    /// word holds the share (`f32` bits, low half) and the answers counted, up to
    /// [`NOISE_WINDOW`].
    #[inline]
    fn observe(&self, word: u64, slow: bool) {
        let share = f32::from_bits(word as u32);
        let counted = (word >> 32) as u32;
        if !slow && share <= NOISE_FLOOR && counted >= NOISE_WINDOW {
            return;
        }
        let counted = (counted + 1).min(NOISE_WINDOW);
        let step = 1.0 / (NOISE_PRIOR + counted).min(NOISE_WINDOW) as f32;
        let share = share + step * (f32::from(u8::from(slow)) - share);
        let share = if share <= NOISE_FLOOR { 0.0 } else { share };
        self.0.store(
            (u64::from(counted) << 32) | u64::from(share.to_bits()),
            Ordering::Relaxed,
        );
    }

    /// The share of answers slow by chance.
    #[cfg(test)]
    pub(crate) fn share(&self) -> f64 {
        f64::from(f32::from_bits(self.0.load(Ordering::Relaxed) as u32))
    }

    /// For fixtures (the benchmarks' fleet, tests): as if the channel had seen a window of
    /// answers, all fast.
    pub(crate) fn settle_quiet(&self) {
        self.0
            .store(u64::from(NOISE_WINDOW) << 32, Ordering::Relaxed);
    }

    /// [`run_for`](Self::run_for) the average as it is now.
    #[cfg(test)]
    pub(crate) fn run_to_gate(&self) -> u32 {
        Self::run_for(self.0.load(Ordering::Relaxed))
    }

    /// The slow answers in a row that a gate waiting for confirmation waits for, where the
    /// average's word was `word`: the fewest, two at least (three before [`NOISE_KNOWN`]
    /// answers have counted), that chance gives less than once in a thousand (2 up to a share
    /// of 3.1%, 3 up to 10%, 4 up to 17.7%, 5 at 25%), at most [`MAX_CONFIRM`].
    #[cold]
    fn run_for(word: u64) -> u32 {
        let share = f64::from(f32::from_bits(word as u32));
        // Until the channel has seen enough answers to know how often they are slow by
        // chance (its first ones are a new connection's, and its client may be busy), three.
        let mut run = if (word >> 32) < u64::from(NOISE_KNOWN) {
            3
        } else {
            2
        };
        while run < MAX_CONFIRM && share.powi(run as i32) > 1e-3 {
            run += 1;
        }
        run
    }
}

/// The channel's method references (see the module docs).
pub(crate) struct Methods {
    /// Per slot: the tag of its method (high 32 bits) and its reference in nanoseconds (`f32`
    /// bits, low 32 bits); 0 when empty.
    slots: Box<[AtomicU64]>,
    /// The typical call's reference (`f32` bits, nanoseconds; 0 before the first answer): it
    /// moves by [`STEP`] of itself towards the reference of each answered call's method, so it
    /// settles on the median over calls (a method called nine times in ten sets it).
    typical: AtomicU32,
    /// How often an answer is slow by chance (see [`Noise`]).
    pub(crate) noise: Noise,
}

impl Methods {
    pub(crate) fn new() -> Methods {
        Methods {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            typical: AtomicU32::new(0),
            noise: Noise::default(),
        }
    }

    /// Whether calls to `method` are dear: its reference is more than [`DEAR_AT`] times the
    /// typical call's. Such calls hold an instance much longer than most; the pick gives them
    /// turns of their own ([`Tie::dear_turn`]), so that each instance gets its share of them,
    /// and with it its share of all the calls (an instance that drew more than its share of
    /// dear calls would be busy, and out of the ties for cheap ones, longer than the rest).
    /// Two loads; false for a method not seen yet.
    #[inline]
    pub(crate) fn is_dear(&self, method: Method) -> bool {
        let word = self.slots[method.slot()].load(Ordering::Relaxed);
        if (word >> 32) as u32 != method.0 {
            return false;
        }
        let r = f32::from_bits(word as u32);
        let typical = f32::from_bits(self.typical.load(Ordering::Relaxed));
        typical > 0.0 && f64::from(r) > DEAR_AT * f64::from(typical)
    }

    /// The reference for `method` before this sample, which then updates it. A method new to
    /// its slot takes it, and its first sample is its own reference.
    pub(crate) fn reference(&self, method: Method, sample_ns: f64) -> f64 {
        let slot = &self.slots[method.slot()];
        let word = slot.load(Ordering::Relaxed);
        let (tag, r) = ((word >> 32) as u32, f64::from(f32::from_bits(word as u32)));
        let (reference, next) = if tag == method.0 && r > 0.0 {
            let next = if sample_ns > r {
                sample_ns.min(r * (1.0 + STEP))
            } else if sample_ns < 0.5 * r {
                r + 0.25 * (sample_ns - r)
            } else {
                sample_ns.max(r * (1.0 - STEP))
            };
            (r, next)
        } else {
            (sample_ns, sample_ns)
        };
        let packed = (u64::from(method.0) << 32) | u64::from((next as f32).to_bits());
        if packed != word {
            slot.store(packed, Ordering::Relaxed);
        }
        let typical = f64::from(f32::from_bits(self.typical.load(Ordering::Relaxed)));
        let moved = if typical <= 0.0 {
            next
        } else if next > typical {
            next.min(typical * (1.0 + STEP))
        } else {
            next.max(typical * (1.0 - STEP))
        };
        if moved != typical {
            self.typical
                .store((moved as f32).to_bits(), Ordering::Relaxed);
        }
        reference
    }
}

impl std::fmt::Debug for Methods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Methods").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: f64 = 1e6;

    /// An instance back in service starts at the turns of the instances in service: with most
    /// of the set still out (their passes stopped where they left), their passes do not count.
    #[tokio::test]
    async fn a_returning_instance_starts_at_the_turns_of_those_in_service() {
        use crate::State;
        let ch = crate::BalancedChannel::builder()
            .uris((1..=5).map(|p| format!("http://127.0.0.1:{p}")))
            .build()
            .unwrap();
        let snap = ch.shared.snapshot();
        let ahead = 50 * UNIT;
        for (k, inst) in snap.iter().enumerate() {
            if k < 4 {
                inst.set_state(State::Ejected);
                inst.tie.pass.store(0, Ordering::Relaxed);
            } else {
                inst.set_state(State::Ready);
                inst.tie.pass.store(ahead, Ordering::Relaxed);
            }
        }
        // Back (the median of all four others would be a pass of 0).
        snap[0].set_state(State::Ready);
        assert_eq!(snap[0].tie.pass.load(Ordering::Relaxed), ahead);
        // With none in service, no level: the pass stays where it was.
        for inst in snap.iter() {
            inst.set_state(State::Ejected);
        }
        snap[1].set_state(State::Ready);
        assert_eq!(snap[1].tie.pass.load(Ordering::Relaxed), 0);
        // A pass further on than the set's stays.
        snap[0].tie.pass.store(2 * ahead, Ordering::Relaxed);
        snap[0].set_state(State::Ready);
        assert_eq!(snap[0].tie.pass.load(Ordering::Relaxed), 2 * ahead);
    }

    #[test]
    fn method_keys_differ_and_are_stable() {
        let a = Method::of("/fleet.Fleet/Unary");
        let b = Method::of("/fleet.Fleet/ClientStream");
        assert_eq!(a, Method::of("/fleet.Fleet/Unary"));
        assert_ne!(a, b);
        assert_ne!(Method::of(""), Method(0));
    }

    /// The reference follows fast answers and a rare slow one barely moves it; each method
    /// has its own.
    #[test]
    fn a_method_is_dear_against_the_typical_call() {
        let m = Methods::new();
        let cheap = Method::of("/s.S/Cheap");
        let dear = Method::of("/s.S/Dear");
        let twice = Method::of("/s.S/Twice");
        assert!(!m.is_dear(dear), "nothing known yet");
        // Nine cheap calls in ten: the typical call is a cheap one.
        for k in 0..400 {
            match k % 10 {
                3 => m.reference(dear, 100.0 * MS),
                7 => m.reference(twice, 10.0 * MS),
                _ => m.reference(cheap, 5.0 * MS),
            };
        }
        assert!(m.is_dear(dear), "20x the typical call");
        assert!(!m.is_dear(twice), "2x is not dear");
        assert!(!m.is_dear(cheap));
        assert!(!m.is_dear(Method::of("/s.S/Unseen")));
        assert!(!m.is_dear(Method::NONE));
        // A service of dear calls only: none is dear against the typical call, itself.
        let alone = Methods::new();
        for _ in 0..100 {
            alone.reference(dear, 100.0 * MS);
        }
        assert!(!alone.is_dear(dear));
    }

    #[test]
    fn dear_calls_take_turns_of_their_own() {
        // Two equal instances; the dear pass decides dear ties, the pass the others, and a
        // dear call is a turn of the pass too.
        let a = Tie::new();
        let b = Tie::new();
        a.advance(0);
        assert!(a.turn(0).pass > b.turn(0).pass, "b's turn for a cheap call");
        assert_eq!(a.dear_turn(0).pass, b.dear_turn(0).pass, "no dear call yet");
        a.advance_dear(0);
        assert!(
            a.dear_turn(0).pass > b.dear_turn(0).pass,
            "b's turn for a dear one"
        );
        assert_eq!(
            a.turn(0).pass,
            2 * UNIT,
            "a dear call advances the pass too"
        );
        // Gated: no dear tie at all while the gate's time runs, whatever the passes.
        a.observe(100.0 * MS, 5.0 * MS, 0, 0);
        assert_eq!(a.dear_turn(1).gate, u64::MAX);
        assert_eq!(a.turn_for(true, 1), a.dear_turn(1));
        assert_eq!(a.turn_for(false, 1), a.turn(1));
        assert_eq!(b.dear_turn(1).gate, 0);
    }

    #[test]
    fn references_follow_the_fast_answers_per_method() {
        let m = Methods::new();
        let cheap = Method::of("/s.S/Cheap");
        let dear = Method::of("/s.S/Dear");
        assert_eq!(m.reference(cheap, 5.0 * MS), 5.0 * MS);
        assert_eq!(m.reference(dear, 100.0 * MS), 100.0 * MS);
        for _ in 0..20 {
            m.reference(cheap, 5.0 * MS);
            m.reference(dear, 100.0 * MS);
        }
        let before = m.reference(cheap, 100.0 * MS);
        let after = m.reference(cheap, 5.0 * MS);
        assert!((before - 5.0 * MS).abs() < 0.01 * MS, "{before}");
        assert!(after < 5.2 * MS, "one slow answer moved it to {after}");
        // A slow first answer is soon forgotten.
        let late = Method::of("/s.S/Late");
        m.reference(late, 50.0 * MS);
        let r = (0..40).fold(0.0, |_, _| m.reference(late, 5.0 * MS));
        assert!(r < 5.5 * MS, "{r}");
        assert!((m.reference(dear, 100.0 * MS) - 100.0 * MS).abs() < 0.1 * MS);
    }

    /// Equal answers: one turn, never gated. A slow one: a longer stride, a gate that grows
    /// while the answers stay slow, and both gone at the first fast answer.
    #[test]
    fn slowness_sets_stride_and_gate() {
        let t = Tie::new();
        t.observe(5.0 * MS, 5.0 * MS, 0, 0);
        assert_eq!(t.stride.load(Ordering::Relaxed), UNIT as u32);
        assert_eq!(t.turn(0).gate, 0);
        // 10x slower: counted as 4x (slowness 2.5: 4 turns), gated for 4 x (50 - 10) ms.
        t.observe(50.0 * MS, 5.0 * MS, 900, 1_000);
        assert_eq!(t.stride.load(Ordering::Relaxed), 4 * UNIT as u32);
        let gate1 = t.recheck_at.load(Ordering::Relaxed) - 1_000;
        assert_eq!(gate1, (GATE_FACTOR * 40.0 * MS) as u64);
        // ...or until the others took GATE_TURNS turns.
        assert_eq!(t.turn(1_000 + gate1 - 1).gate, GATE_TURNS * UNIT);
        assert_eq!(t.turn(1_000 + gate1).gate, 0);
        // An answer to a call sent before the gate: no strike.
        t.observe(50.0 * MS, 5.0 * MS, 999, 1_500);
        assert_eq!(t.recheck_at.load(Ordering::Relaxed) - 1_500, gate1);
        // Slow again when re-checked: the longest stride, and the gate doubles.
        t.observe(50.0 * MS, 5.0 * MS, 1_600, 2_000);
        assert_eq!(
            t.stride.load(Ordering::Relaxed),
            (MAX_TURNS * UNIT as f64) as u32
        );
        let gate2 = t.recheck_at.load(Ordering::Relaxed) - 2_000;
        assert_eq!(gate2, 2 * gate1);
        assert_eq!(t.turn(2_000).gate, 2 * GATE_TURNS * UNIT);
        // Fast again: open at once, one turn.
        t.observe(5.0 * MS, 5.0 * MS, 2_900, 3_000);
        assert_eq!(t.turn(3_000).gate, 0);
        assert_eq!(t.stride.load(Ordering::Relaxed), UNIT as u32);
        assert_eq!(t.slowness(), Some(1.0));
    }

    /// The slow answers in a row a gate waits for grow with how often answers are slow by
    /// chance: two on a quiet client, more where a busy one delays one answer in ten or five.
    #[test]
    fn a_gate_waits_for_more_slow_answers_where_they_come_by_chance() {
        let noise = Noise::default();
        assert_eq!(noise.run_to_gate(), 3, "before it knows");
        noise.settle_quiet();
        assert_eq!(noise.run_to_gate(), 2);
        let at = |share: f32| {
            noise.0.store(
                (u64::from(NOISE_WINDOW) << 32) | u64::from(share.to_bits()),
                Ordering::Relaxed,
            );
            noise.run_to_gate()
        };
        assert_eq!(at(0.03), 2);
        assert_eq!(at(0.09), 3);
        assert_eq!(at(0.17), 4);
        assert_eq!(at(0.25), 5);
        assert_eq!(at(0.9), MAX_CONFIRM);
        // One slow answer in five over the first fifty answers: it waits for four (a share of
        // 10 in 58, with the 8 fast answers it starts from).
        let fresh = Noise::default();
        for k in 0..50 {
            fresh.observe(fresh.0.load(Ordering::Relaxed), k % 5 == 0);
        }
        assert_eq!(fresh.run_to_gate(), 4, "{}", fresh.share());
        // Then a moving average: fast answers bring it down to nothing.
        for _ in 0..5_000 {
            fresh.observe(fresh.0.load(Ordering::Relaxed), false);
        }
        assert_eq!(fresh.share(), 0.0);
        assert_eq!(fresh.run_to_gate(), 2);
    }

    /// A quiet client's: a thousand answers, all fast.
    fn quiet_client() -> Noise {
        let quiet = Noise::default();
        quiet.settle_quiet();
        quiet
    }

    /// The default's gates wait for confirmation where answers come often: one slow answer
    /// after fast ones sets none (the tail every instance has); a second in a row gates for ten
    /// times its excess; a third in a row, or a slow re-check, for at least two hundred usual
    /// call times. Where answers come rarely, the first slow one gates at once.
    #[test]
    fn the_default_gates_after_two_slow_answers_in_a_row() {
        let rule = GateRule::FEWEST_THEN_FASTEST;
        let t = Tie::new();
        let quiet = quiet_client();
        t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
        assert_eq!(
            t.observe_gated(15.0 * MS, 5.0 * MS, 1_000, 2_000, rule, &quiet),
            0
        );
        assert_eq!(t.weight(2_000), WEIGHT_ONE, "open");
        // A fast answer in between: the next slow one is the first again.
        t.observe_gated(5.0 * MS, 5.0 * MS, 2_000, 3_000, rule, &quiet);
        assert_eq!(
            t.observe_gated(15.0 * MS, 5.0 * MS, 3_000, 4_000, rule, &quiet),
            0
        );
        let until = t.observe_gated(15.0 * MS, 5.0 * MS, 4_000, 5_000, rule, &quiet);
        assert_eq!(
            until - 5_000,
            (10.0 * 5.0 * MS) as u64,
            "ten times the excess"
        );
        assert!(t.weight(5_000) > WEIGHT_ONE, "gated, its calls weigh more");
        let until = t.observe_gated(15.0 * MS, 5.0 * MS, 4_500, 6_000, rule, &quiet);
        assert_eq!(until - 6_000, (200.0 * 5.0 * MS) as u64, "the long minimum");
        // Where answers come rarely (the previous one more than 50 usual call times before),
        // one slow answer sets the long gate at once: no second one would come in time.
        let t = Tie::new();
        let quiet = quiet_client();
        t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
        let later = 1_000 + (50.0 * 5.0 * MS) as u64 + 1;
        let until = t.observe_gated(15.0 * MS, 5.0 * MS, later - 1, later, rule, &quiet);
        assert_eq!(until - later, (200.0 * 5.0 * MS) as u64);
    }

    /// Moderately slower: a stride that grows smoothly with the slowness, no cliff.
    #[test]
    fn the_stride_grows_smoothly() {
        let mut last = 0;
        for k in 0..40 {
            let t = Tie::new();
            let x = 1.0 + k as f64 * 0.1;
            t.observe(x * MS, MS, 0, 0);
            let stride = t.stride.load(Ordering::Relaxed);
            assert!(stride >= last, "stride fell at {x}");
            assert!(u64::from(stride) - u64::from(last) <= UNIT, "a step at {x}");
            last = stride;
        }
    }

    /// One hiccup (a sample 20x the estimate) counts for 4x at most.
    #[test]
    fn one_hiccup_counts_little() {
        let t = Tie::new();
        t.observe(5.0 * MS, 5.0 * MS, 0, 0);
        t.observe(100.0 * MS, 5.0 * MS, 0, 0);
        assert_eq!(t.slowness(), Some(2.5));
    }
}
