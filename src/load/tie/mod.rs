//! What the least-pending tie-break learns from each answer (the pick itself is in `crate::pick`).
//!
//! Each time an instance answers a call (its response headers arrive), the time it took is
//! compared with the *reference* for the call's method: a channel-wide estimate of how long that
//! method takes on a fast instance. The ratio (the instance's *slowness*) is what the tie-break
//! weighs, so a service whose methods differ in cost does not make whichever instance served
//! the expensive ones look slow: each answer is compared with answers to the same method.
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
//! **Expensive calls take turns of their own.** A method whose reference is more than
//! [`EXPENSIVE_AT`] times the typical call's (the median over calls of their methods'
//! references) is *expensive*: its calls hold an instance far longer than most. If they took the
//! same turns as the rest, where they fell would follow the order of the turns (every fourth
//! call expensive over four idle instances: all on one), and an instance that drew more than its
//! share would be busy, and out of the ties for the cheap calls, longer than the others; so each
//! instance keeps a second pass for expensive calls, and the pick of an expensive call compares
//! those (see [`TieBreak::expensive_turn`]; what it changed in the shootout: `docs/design.md`,
//! "Decisions").

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

mod level;
mod method;
mod noise;
#[cfg(test)]
mod tests;

pub(crate) use level::Level;
pub(crate) use method::{Method, Methods};
pub(crate) use noise::Noise;

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
/// The most turns an instance's first answer charges the turn its call was won at (see
/// `TieBreak::learn`): half the longest stride, since a first answer is the least sure sign
/// (a new connection, a cold server, a client busy at that moment).
pub(super) const FIRST_CHARGE_TURNS: u64 = 4;
/// A failed answer counts in the tie-break as an answer this many times its method's reference
/// (unless it was slower): a slow answer, past [`GATE_AT`], so that an instance that fails at
/// once, whose calls end sooner than anyone's, does not win the ties as the idlest and fastest:
/// it takes the longest stride, and it is gated under [`GateRule::FAILED`].
pub(crate) const FAILED_AS: f64 = 4.0;
/// One call in flight in [`TieBreak::weight`]'s units.
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
    /// [`TieBreak::observe_gated`]).
    pub(crate) confirm: bool,
    /// Whether its gates are a failed answer's: an answer slow by chance after one is no slow
    /// re-check (it adds no strike to a failure's).
    pub(crate) failure: bool,
    /// The slow re-checks in a row that double the gate, at most.
    pub(crate) max_strikes: u32,
}

impl GateRule {
    /// Least pending's: [`GATE_FACTOR`] times the excess.
    pub(crate) const LEAST_PENDING: GateRule = GateRule {
        factor: GATE_FACTOR,
        min_refs: 0.0,
        confirm: false,
        failure: false,
        max_strikes: MAX_STRIKES,
    };

    /// A failed answer's ([`FAILED_AS`]), whatever the strategy: least pending's short gates,
    /// at the first failure, opened by the others' turns as well as by time. A failure is no
    /// chance delay of a busy client (it feeds no [`Noise`]), and an instance that fails at
    /// once is out of the ties from its first failure; but failures that every instance
    /// answers alike (a lookup service's NOT_FOUND, three calls in ten) must not shut one out
    /// for seconds, as the default's long gates after a run of three would: its gates stay as
    /// short as 32 turns of the others, doubled only while re-checks fail in a row.
    pub(crate) const FAILED: GateRule = GateRule {
        failure: true,
        max_strikes: 2,
        ..GateRule::LEAST_PENDING
    };

    /// [`Strategy::FewestThenFastest`](crate::Strategy::FewestThenFastest)'s: where answers
    /// come often, a gate only after two slow answers in a row, for ten times the excess; after
    /// a third in a row or a slow re-check (or at once where answers come rarely), at least two
    /// hundred times the method's usual time (a second where 5 ms is usual). A slow instance is
    /// re-checked one call at a time, ever more rarely while it stays slow: a bounded number of
    /// calls per second whatever the rate, rather than a share of the traffic (least pending's
    /// gates re-check a 20 times slower instance every 0.4 s at first, and open by turns as
    /// well as by time); and an instance whose slowness comes with
    /// its load (it answers fast when idle, slow with a few calls) is not handed calls again
    /// after every fast answer.
    pub(crate) const FEWEST_THEN_FASTEST: GateRule = GateRule {
        factor: 10.0,
        min_refs: 200.0,
        confirm: true,
        failure: false,
        max_strikes: MAX_STRIKES,
    };
}

/// Slow answers in a row counted for the doubling.
pub(super) const MAX_STRIKES: u32 = 7;

/// The tie-break's record of one instance. The pick reads `pass`, `stride`, `recheck_at` and
/// `gate_pass`; the rest is written when an answer arrives.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct TieBreak {
    pub(super) pass: AtomicU64,
    /// The gate: until this time (nanoseconds since the channel's epoch)...
    pub(super) recheck_at: AtomicU64,
    /// ...or until the others' passes reach this one, it wins no tie.
    pub(super) gate_pass: AtomicU64,
    /// How far `pass` advances when the instance wins, in 1/65536 turns.
    pub(super) stride: AtomicU32,
    /// The slowness estimate (`f32` bits; 0 before the first sample).
    pub(super) slowness: AtomicU32,
    /// What each call in flight on it weighs while it is gated, in [`WEIGHT_ONE`] units (its
    /// slowness, at most [`MAX_WEIGHT`]): computed with the slowness, so the pick reads an
    /// integer.
    pub(super) weight: AtomicU32,
    /// The pass of the ties for calls to expensive methods (see [`Methods::is_expensive`]): they take
    /// turns of their own, so that the calls that hold an instance longest are shared as evenly
    /// as the rest.
    pub(super) expensive_pass: AtomicU64,
    /// When the gate was last set: an answer to a call sent before then is no re-check.
    pub(super) gated_at: AtomicU64,
    /// When the gate set last ends (as first set: a re-check's hold does not move it): an
    /// answer to a call sent before then is no re-check for a gate that waits for
    /// confirmation.
    pub(super) gate_end: AtomicU64,
    /// Slow answers in a row to re-checks, and `FAILURE_GATE` (`learn.rs`) if the gate set last was a
    /// failed answer's.
    pub(super) strikes: AtomicU32,
    /// Slow answers in a row, however sent (a gate that waits for confirmation counts them).
    pub(super) slow_run: AtomicU32,
    /// When the last slow answer came.
    pub(super) slow_at: AtomicU64,
    /// When the last answer came (any: a gate that waits for confirmation waits only where
    /// answers come often).
    pub(super) answered_at: AtomicU64,
    /// Its stride's multiple for a weight the membership gives it (an xDS endpoint's share),
    /// in 1/[`SCALE_ONE`]: the heaviest instance's is one, one of a third its weight three, so
    /// that it wins a third as many ties. Folded into `stride` when that is written, so the
    /// pick reads one number.
    pub(super) scale: AtomicU32,
    /// The turns its pass was moved on by (`Chosen::floor`: an instance behind the others is
    /// owed at most [`CREDIT`] of the turns it missed) since its last fast answer while open:
    /// where a gate came since and proves false (see [`TieBreak::owed`]), the turns it made
    /// it miss.
    pub(super) forgiven: AtomicU64,
    /// Turns (in pass units) it is owed for a gate that proved false: its first re-check
    /// answered fast. Until they are paid, each tie it wins advances its pass by half its
    /// stride, so that it takes twice its share of the ties, not every tie: without this a
    /// gate that the client's own delays set moved calls from it to the others for good (with
    /// weights 3:1 on a busy client, a share of 56% instead of 75%), and with it, a burst of
    /// calls on an instance just found fast would come from every client at once.
    pub(super) owed: AtomicU64,
}

/// The most turns a false gate's debt repays: a gate of seconds at a high rate would
/// otherwise owe thousands, paid over a long spell at twice the share.
pub(crate) const MAX_OWED: u64 = 4096 * UNIT;

/// A stride multiple of one (see `TieBreak::scale`).
pub(crate) const SCALE_ONE: u32 = 256;
/// The largest stride multiple: an instance weighs at least 1/256 of the heaviest.
#[cfg(feature = "xds")]
pub(crate) const MAX_SCALE: u32 = 256 * SCALE_ONE;

impl TieBreak {
    pub(crate) fn new() -> TieBreak {
        TieBreak {
            pass: AtomicU64::new(0),
            recheck_at: AtomicU64::new(0),
            gate_pass: AtomicU64::new(0),
            stride: AtomicU32::new(UNIT as u32),
            slowness: AtomicU32::new(0),
            weight: AtomicU32::new(WEIGHT_ONE as u32),
            expensive_pass: AtomicU64::new(0),
            gated_at: AtomicU64::new(0),
            gate_end: AtomicU64::new(0),
            strikes: AtomicU32::new(0),
            slow_run: AtomicU32::new(0),
            slow_at: AtomicU64::new(0),
            answered_at: AtomicU64::new(0),
            scale: AtomicU32::new(SCALE_ONE),
            forgiven: AtomicU64::new(0),
            owed: AtomicU64::new(0),
        }
    }

    /// Its weight against the heaviest instance's, `weight` in (0, 1]: its stride is
    /// `1 / weight` times as long, so that it wins that share of the ties the heaviest wins.
    #[cfg(feature = "xds")]
    pub(crate) fn set_weight(&self, weight: f64) {
        let scale =
            (f64::from(SCALE_ONE) / weight.clamp(1e-9, 1.0)).min(f64::from(MAX_SCALE)) as u32;
        if self.scale.swap(scale, Ordering::Relaxed) != scale {
            let slowness = f64::from(f32::from_bits(self.slowness.load(Ordering::Relaxed)));
            self.store_stride(slowness);
        }
    }

    /// The stride for this slowness (0: none known yet) and the weight's multiple.
    pub(super) fn store_stride(&self, slowness: f64) {
        let turns = (slowness / KNEE).powi(2).clamp(1.0, MAX_TURNS);
        let scale = f64::from(self.scale.load(Ordering::Relaxed)) / f64::from(SCALE_ONE);
        self.stride
            .store((turns * scale * UNIT as f64) as u32, Ordering::Relaxed);
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

    /// What the pick compares: [`TieBreak::expensive_turn`] for a call to an expensive method, else
    /// [`TieBreak::turn`].
    #[inline]
    pub(crate) fn turn_for(&self, expensive: bool, now_ns: u64) -> Turn {
        if expensive {
            self.expensive_turn(now_ns)
        } else {
            self.turn(now_ns)
        }
    }

    /// What the pick compares for a call to an expensive method: the expensive pass, and no tie while
    /// the instance is gated (the others' expensive passes say nothing of when to open it; the gate's
    /// time still does, and so do the cheap calls' turns).
    #[inline]
    pub(crate) fn expensive_turn(&self, now_ns: u64) -> Turn {
        Turn {
            pass: self.expensive_pass.load(Ordering::Relaxed),
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
    /// learn, and a mispredicted branch per candidate costs the pick more than the select
    /// (measured in docs/design.md, "Decisions").
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

    /// The instance won a tie for a call to an expensive method, `floor` read from the expensive passes:
    /// its expensive pass advances from at least `floor`, and its pass as for any call (an expensive call
    /// is a turn too).
    #[inline]
    pub(crate) fn advance_expensive(&self, floor: u64) {
        self.step_expensive(floor, self.stride());
    }

    /// As [`advance`](Self::advance) or [`advance_expensive`](Self::advance_expensive), by `stretch`
    /// times its stride (a warming instance in slow start).
    pub(crate) fn advance_stretched(&self, expensive: bool, floor: u64, stretch: f64) {
        let stride = (self.stride() as f64 * stretch) as u64;
        if expensive {
            self.step_expensive(floor, stride);
        } else {
            self.step(floor, stride);
        }
    }

    #[inline]
    pub(super) fn stride(&self) -> u64 {
        u64::from(self.stride.load(Ordering::Relaxed))
    }

    #[inline]
    fn step(&self, floor: u64, stride: u64) {
        let pass = self.pass.load(Ordering::Relaxed);
        if floor > pass || self.owed.load(Ordering::Relaxed) != 0 {
            return self.step_owed(pass, floor, stride);
        }
        self.pass.store(pass + stride, Ordering::Relaxed);
    }

    /// [`step`](Self::step) for an instance behind the floor, or owed turns: the turns the
    /// floor forgives are noted (a false gate's are owed back), and owed turns are paid half a
    /// stride per tie won.
    #[cold]
    fn step_owed(&self, pass: u64, floor: u64, stride: u64) {
        if floor > pass {
            self.forgiven.fetch_add(floor - pass, Ordering::Relaxed);
        }
        let owed = self.owed.load(Ordering::Relaxed);
        let paid = (stride / 2).min(owed);
        if paid > 0 {
            self.owed.store(owed - paid, Ordering::Relaxed);
        }
        self.pass
            .store(pass.max(floor) + stride - paid, Ordering::Relaxed);
    }

    #[inline]
    fn step_expensive(&self, floor: u64, stride: u64) {
        let expensive = self.expensive_pass.load(Ordering::Relaxed).max(floor);
        self.expensive_pass
            .store(expensive + stride, Ordering::Relaxed);
        let pass = self.pass.load(Ordering::Relaxed);
        self.pass.store(pass + stride, Ordering::Relaxed);
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
}
