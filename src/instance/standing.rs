//! An instance's state and its calls in flight, in one atomic word, so that the pick's scan
//! reads one word per candidate and compares it without a branch on the state.
//!
//! The low [`STATE_BITS`] bits hold the state's number; above them, the calls the instance
//! would have with one more (its calls in flight plus one, the call being picked for); above
//! that count, one bit is set while the state says that the instance may not take calls. The
//! scan compares [`StateAndCount::key`], the word shifted past the state: the count, plus [`OUT`]
//! for an instance out of service, which is more than any count (and than a count plus the
//! other clients' reported calls) can reach. So an instance out of service never has the
//! fewest, and if the fewest is at least [`OUT`], none is in service. The count starts at one
//! because that is what fewest then fastest weighs (`(calls + 1) × weight`): the scan
//! multiplies the key as it is, one instruction fewer per candidate (an addition) than with
//! the calls alone. One source of truth: the
//! state moves by a compare-and-swap of the whole word, which the calls' increments and
//! decrements (of the count's bits, never carrying past them) cannot disturb.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::State;

/// Bits of the state's number.
const STATE_BITS: u32 = 3;
const _: () = assert!(State::ALL.len() <= 1 << STATE_BITS);

/// Bits of the count. More calls at once would need more memory than the address space holds:
/// each call holds far more than the 256 bytes that 2^24 calls would leave it on a 32-bit
/// target, and 2^40 calls would take terabytes on 64 bits.
const COUNT_BITS: u32 = if usize::BITS >= 64 { 40 } else { 24 };

/// In [`StateAndCount::key`]'s units: added while the instance may not take calls. Above any count,
/// and above a count plus the other clients' reported calls (at most 2^24 - 1, see
/// `load::OthersInFlight`); on 32 bits, the weighted count `key × 72` stays below 2^32
/// (3 × 2^24 × 72 < 2^32).
pub(crate) const OUT: usize = 1 << COUNT_BITS;

/// One call in the word.
const ONE: usize = 1 << STATE_BITS;

/// The state's number in the word.
const STATE: usize = ONE - 1;

/// The count in the word.
const COUNT: usize = (OUT - 1) << STATE_BITS;

/// The state `s` in the word: its number, and the bit above the count out of service.
fn word(s: State) -> usize {
    s as usize | if s.is_usable() { 0 } else { OUT << STATE_BITS }
}

fn state_of(w: usize) -> State {
    State::from_u8((w & STATE) as u8)
}

/// An instance's state and calls in flight (see the module docs).
#[derive(Debug)]
pub(crate) struct StateAndCount(AtomicUsize);

impl StateAndCount {
    pub(crate) fn new(s: State) -> StateAndCount {
        // No call in flight: a count of one (see the module docs).
        StateAndCount(AtomicUsize::new(word(s) | ONE))
    }

    /// Its calls in flight.
    #[inline]
    pub(crate) fn calls(&self) -> usize {
        ((self.0.load(Ordering::Relaxed) & COUNT) >> STATE_BITS) - 1
    }

    /// A call starts.
    #[inline]
    pub(crate) fn enter(&self) {
        self.0.fetch_add(ONE, Ordering::Relaxed);
    }

    /// A call ends (one that [`enter`](Self::enter) counted: below zero the count would
    /// borrow from the state's bits).
    #[inline]
    pub(crate) fn leave(&self) {
        let before = self.0.fetch_sub(ONE, Ordering::Release);
        debug_assert!(before & COUNT > ONE, "a call ended that never started");
    }

    /// What the pick compares: its calls in flight plus one (the call being picked for), plus
    /// [`OUT`] while it may not take calls.
    #[inline(always)]
    pub(crate) fn key(&self) -> usize {
        self.0.load(Ordering::Relaxed) >> STATE_BITS
    }

    /// Whether it may take calls: one load and a test.
    #[inline]
    pub(crate) fn is_usable(&self) -> bool {
        self.0.load(Ordering::Relaxed) < OUT << STATE_BITS
    }

    #[inline]
    pub(crate) fn state(&self) -> State {
        state_of(self.0.load(Ordering::Acquire))
    }

    /// Sets the state whatever it was; returns the previous one.
    pub(crate) fn swap(&self, to: State) -> State {
        self.update(|_| Some(to)).unwrap_or_else(|from| from)
    }

    /// Moves from `from` to `to`; `Err` with the state it found if that was not `from`.
    pub(crate) fn compare_exchange(&self, from: State, to: State) -> Result<State, State> {
        self.update(|s| (s == from).then_some(to))
    }

    /// Moves to `to(state)` unless that is `None`; returns the state it left, or `Err` with the
    /// state that `to` refused. The calls in flight are kept (a retry when one starts or ends
    /// meanwhile).
    fn update(&self, mut to: impl FnMut(State) -> Option<State>) -> Result<State, State> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                to(state_of(w)).map(|s| (w & COUNT) | word(s))
            })
            .map(state_of)
            .map_err(state_of)
    }

    /// Sets the calls in flight (the benchmarks' and tests' fleets), keeping the state.
    pub(crate) fn set_calls(&self, n: usize) {
        let n = (n + 1).min(OUT - 1) << STATE_BITS;
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some((w & !COUNT) | n)
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every state keeps its own number and says whether it may take calls; the calls in
    /// flight survive every change of state; the key is the count with one more call, plus
    /// `OUT` out of service.
    #[test]
    fn state_and_calls_share_the_word() {
        let st = StateAndCount::new(State::Connecting);
        assert_eq!(
            (st.calls(), st.key() % OUT),
            (0, 1),
            "none in flight: one with this call"
        );
        for _ in 0..5 {
            st.enter();
        }
        st.leave();
        let mut calls = 4;
        // Each state with an odd and an even count (no bit of the count is lost or gained).
        for to in State::ALL.into_iter().chain(State::ALL) {
            let before = st.state();
            assert_eq!(st.swap(to), before);
            assert_eq!(st.state(), to);
            assert_eq!(st.calls(), calls, "{to:?}");
            assert_eq!(st.is_usable(), to.is_usable(), "{to:?}");
            let key = st.key();
            let with_one_more = calls + 1;
            let want = if to.is_usable() { 0 } else { OUT } + with_one_more;
            assert_eq!(key, want, "{to:?}");
            st.enter();
            calls += 1;
        }
        for _ in 0..calls - 4 {
            st.leave();
        }
        assert_eq!(
            st.compare_exchange(State::Ready, State::Failing),
            Err(State::Draining)
        );
        assert_eq!(
            st.compare_exchange(State::Draining, State::Ready),
            Ok(State::Draining)
        );
        assert_eq!((st.state(), st.calls()), (State::Ready, 4));
        st.set_calls(9);
        assert_eq!((st.state(), st.calls(), st.key()), (State::Ready, 9, 10));
    }

    /// Calls that start and end on other threads while the state keeps changing: none is lost,
    /// and the state is the last one set.
    #[test]
    fn concurrent_calls_and_changes() {
        let st = std::sync::Arc::new(StateAndCount::new(State::Ready));
        let calls: Vec<_> = (0..2)
            .map(|_| {
                let st = st.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        st.enter();
                        st.enter();
                        st.leave();
                    }
                })
            })
            .collect();
        for k in 0..20_000 {
            st.swap(State::ALL[k % State::ALL.len()]);
        }
        st.swap(State::Ejected);
        for t in calls {
            t.join().unwrap();
        }
        assert_eq!((st.state(), st.calls()), (State::Ejected, 40_000));
        assert!(st.key() >= OUT);
    }
}
