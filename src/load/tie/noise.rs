//! How often answers are slow by chance on this client (see [`Noise`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// How often an answer is markedly slow (over [`GATE_AT`](super::GATE_AT) times its method's reference) by
/// chance: the share of slow answers among those whose instance's previous answer was fast, a
/// moving average over the channel's answers. A client short of CPU (a build or a test suite
/// beside it, its runtime's own lag) delays answers from every instance alike; so does a
/// network's jitter. Such a slow answer says nothing of its instance, and two in a row from one
/// instance are then no rarity: a gate that waits for confirmation waits for as many slow
/// answers in a row as it takes for chance to give them less than once in a thousand
/// ([`Noise::run_for`]). An instance that is slow, rather than unlucky, answers slowly
/// every time, and only its first slow answer counts here, so it does not raise the share.
#[derive(Debug, Default)]
pub(crate) struct Noise {
    /// The share of slow answers (`f32` bits, low half) and the answers counted, up to
    /// [`NOISE_WINDOW`] (high half): see [`observe`](Self::observe).
    average: AtomicU64,
    /// The instance whose answer was the channel's last and slow (its record's address), 0
    /// if the last answer was fast: see [`slow_shared`](Self::slow_shared).
    last_slow: AtomicU64,
}

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
/// Above this share of answers slow by chance, the channel is noisy: two slow answers in a row
/// come by chance more than once in a thousand (a gate waits for three or more).
const NOISY: f64 = 0.0316;
/// The longest run of slow answers a gate waits for.
const MAX_CONFIRM: u32 = 8;

impl Noise {
    /// The word as it is now: the share of slow answers and the answers counted (see
    /// [`observe`](Self::observe)).
    #[inline]
    pub(in crate::load) fn word(&self) -> u64 {
        self.average.load(Ordering::Relaxed)
    }

    /// An answer that counts (its instance's previous answer was fast): `slow` or not. The
    /// word holds the share (`f32` bits, low half) and the answers counted, up to
    /// [`NOISE_WINDOW`].
    #[inline]
    pub(in crate::load) fn observe(&self, word: u64, slow: bool) {
        let share = f32::from_bits(word as u32);
        let counted = (word >> 32) as u32;
        if !slow && share <= NOISE_FLOOR && counted >= NOISE_WINDOW {
            return;
        }
        let counted = (counted + 1).min(NOISE_WINDOW);
        let step = 1.0 / (NOISE_PRIOR + counted).min(NOISE_WINDOW) as f32;
        let share = share + step * (f32::from(u8::from(slow)) - share);
        let share = if share <= NOISE_FLOOR { 0.0 } else { share };
        self.average.store(
            (u64::from(counted) << 32) | u64::from(share.to_bits()),
            Ordering::Relaxed,
        );
    }

    /// The share of answers slow by chance.
    #[cfg(test)]
    pub(crate) fn share(&self) -> f64 {
        f64::from(f32::from_bits(self.average.load(Ordering::Relaxed) as u32))
    }

    /// Whether the average in `word` has counted [`NOISE_KNOWN`] answers: whether the channel
    /// knows how often answers are slow by chance.
    #[inline]
    pub(in crate::load) fn is_known(word: u64) -> bool {
        (word >> 32) >= u64::from(NOISE_KNOWN)
    }

    /// Whether, where the average's word was `word`, the channel is noisy (it knows how often
    /// answers are slow by chance, and that is more than one in [`NOISY`]'s) and `strikes`
    /// slow answers in a row from one instance come by chance more than once in a thousand.
    #[cold]
    pub(in crate::load) fn is_noisy(word: u64, strikes: u32) -> bool {
        let share = f64::from(f32::from_bits(word as u32));
        Self::is_known(word) && share > NOISY && share.powi(strikes as i32) > 1e-3
    }

    /// A slow answer from the instance `tag` (its record's address), under a rule that waits
    /// for confirmation: whether the answer before it on the channel was slow too and another
    /// instance's. Such slowness is shared: a busy client holds up whatever answers are on
    /// their way at that moment, whichever instance sent them, so a run of slow answers that
    /// such answers make up is no evidence against one instance (sequential calls beside two
    /// spinning processes: one answer in four was held up, often several in a row).
    #[inline]
    pub(in crate::load) fn slow_shared(&self, tag: u64) -> bool {
        let before = self.last_slow.swap(tag, Ordering::Relaxed);
        before != 0 && before != tag
    }

    /// A fast answer, under a rule that waits for confirmation: the channel's last answer is
    /// fast (written only where it was slow, so a quiet channel writes nothing).
    #[inline]
    pub(in crate::load) fn fast(&self) {
        if self.last_slow.load(Ordering::Relaxed) != 0 {
            self.last_slow.store(0, Ordering::Relaxed);
        }
    }

    /// For fixtures (the benchmarks' fleet, tests): as if the channel had seen a window of
    /// answers, all fast.
    pub(crate) fn settle_quiet(&self) {
        self.average
            .store(u64::from(NOISE_WINDOW) << 32, Ordering::Relaxed);
    }

    /// For tests: as if the channel had seen a window of answers, `share` of them slow.
    #[cfg(test)]
    pub(crate) fn settle_at(&self, share: f32) {
        self.average.store(
            (u64::from(NOISE_WINDOW) << 32) | u64::from(share.to_bits()),
            Ordering::Relaxed,
        );
    }

    /// [`run_for`](Self::run_for) the average as it is now.
    #[cfg(test)]
    pub(crate) fn run_to_gate(&self) -> u32 {
        Self::run_for(self.average.load(Ordering::Relaxed))
    }

    /// The slow answers in a row that a gate waiting for confirmation waits for, where the
    /// average's word was `word`: the fewest, two at least (three before [`NOISE_KNOWN`]
    /// answers have counted), that chance gives less than once in a thousand (2 up to a share
    /// of 3.1%, 3 up to 10%, 4 up to 17.7%, 5 at 25%), at most [`MAX_CONFIRM`].
    #[cold]
    pub(in crate::load) fn run_for(word: u64) -> u32 {
        let share = f64::from(f32::from_bits(word as u32));
        // Until the channel has seen enough answers to know how often they are slow by
        // chance (its first ones are a new connection's, and its client may be busy), three.
        let mut run = if Self::is_known(word) { 2 } else { 3 };
        while run < MAX_CONFIRM && share.powi(run as i32) > 1e-3 {
            run += 1;
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slow answers in a row a gate waits for grow with how often answers are slow by
    /// chance: two on a quiet client, more where a busy one delays one answer in ten or five.
    #[test]
    fn a_gate_waits_for_more_slow_answers_where_they_come_by_chance() {
        let noise = Noise::default();
        assert_eq!(noise.run_to_gate(), 3, "before it knows");
        noise.settle_quiet();
        assert_eq!(noise.run_to_gate(), 2);
        let at = |share: f32| {
            noise.settle_at(share);
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
            fresh.observe(fresh.word(), k % 5 == 0);
        }
        assert_eq!(fresh.run_to_gate(), 4, "{}", fresh.share());
        // Then a moving average: fast answers bring it down to nothing.
        for _ in 0..5_000 {
            fresh.observe(fresh.word(), false);
        }
        assert_eq!(fresh.share(), 0.0);
        assert_eq!(fresh.run_to_gate(), 2);
    }
}
