//! The selection strategies, as pure functions over a slice of candidates.
//!
//! Each function scans the candidates once, reads each one's load through a closure that
//! returns `None` for an instance that must not get calls, and returns the index it chose. No
//! lock, no allocation (`benches/pick.rs` and `scripts/instructions.sh pick` measure it; the
//! figures are in docs/benchmarks.md). Being pure, they are property-tested without
//! a network (see the tests of each file).
//!
//! By role: [`least_pending`](mod@least_pending) (the default, with its tie-break by turns), [`simple`] (Peak EWMA,
//! power of two choices, round robin), [`dispatch`] (the pick over a channel's set: which
//! instances may take a call, slow start, the strategy's state), [`wrr`] (weighted round
//! robin's schedule); `scenarios.rs` tests the tie-break over time on a virtual clock.

pub(crate) mod dispatch;
#[cfg(test)]
mod fastest_scenarios;
pub(crate) mod least_pending;
#[cfg(test)]
mod many_clients_scenarios;
pub(crate) mod probed;
#[cfg(test)]
mod scenarios;
pub(crate) mod simple;
mod strategy;
pub(crate) mod wrr;

use crate::set::Set;

pub use crate::load::tie::{Turn, CREDIT};
pub use least_pending::least_pending;
pub use simple::{peak_ewma, power_of_two, round_robin};
pub use strategy::Strategy;

/// The least-pending choice: which candidate, and the pass its own restarts from at the lowest
/// (`CREDIT` before the runner-up's pass when the runner-up last won; 0 when it had no
/// rival).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chosen {
    /// The index of the chosen candidate.
    pub index: usize,
    /// Its pass after this pick is at least this plus its stride.
    pub floor: u64,
}

/// What the pick needs to know of one candidate: calls in flight and the latency estimate in
/// nanoseconds (0 when unknown).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// Calls in flight on the candidate.
    pub in_flight: usize,
    /// Its latency estimate in nanoseconds, 0 when unknown.
    pub latency_ns: f64,
}

pub use crate::rng::Rng;

/// The pick of one channel: the set it picks from, and its strategy with the strategy's state.
pub(crate) struct Picker {
    pub(crate) set: Set,
    /// The strategy now (a control plane may change it, see [`Picker::set_strategy`]).
    pub(crate) strategy: strategy::Current,
    /// Round robin's counter.
    pub(crate) rr: std::sync::atomic::AtomicUsize,
    /// Weighted round robin's schedule (used with that strategy only).
    pub(crate) wrr: wrr::Wrr,
}

impl Picker {
    pub(crate) fn new(set: Set, strategy: crate::Strategy) -> Picker {
        Picker {
            set,
            strategy: strategy::Current::new(strategy),
            rr: Default::default(),
            wrr: Default::default(),
        }
    }

    /// From now on the pick runs `strategy`, and answers teach the tie-break as it asks
    /// (see [`Strategy::gate_rule`]). What the previous strategy learned stays: the latency
    /// estimates, the turns and the load reports are the instances', whoever reads them.
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn set_strategy(&self, strategy: crate::Strategy) {
        self.set.ctx.load.set_gate(strategy.gate_rule());
        self.strategy.set(strategy);
    }

    /// The set as it is now.
    #[inline]
    pub(crate) fn snapshot(&self) -> arc_swap::Guard<crate::set::Snapshot> {
        self.set.snapshot()
    }
}
