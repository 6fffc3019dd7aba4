//! What a channel keeps of an instance's latest probe answer: lock-free, read by the pick.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::ProbeAnswer;

/// An instance's latest probe answer, as the pick reads it.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Its calls in flight as answered, plus the calls this channel sent it since.
    rif: AtomicU32,
    /// Its latency estimate in microseconds (0: none).
    latency_us: AtomicU32,
    /// When the answer came, on the channel's clock (0: no answer).
    at: AtomicU64,
    /// Calls picked by this answer.
    uses: AtomicU32,
    /// A probe is on its way.
    probing: AtomicBool,
    /// It answered UNIMPLEMENTED: not probed again until its connection is opened again.
    unsupported: AtomicBool,
    /// Its last probe got no answer (timed out, or failed): probed again, and meanwhile left
    /// to the strategy.
    silent: AtomicBool,
}

/// A fresh answer, as the pick compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreshAnswer {
    pub(crate) rif: u32,
    pub(crate) latency_us: u32,
}

impl FreshAnswer {
    /// An answer as the pick compares it: its calls in flight (at most `u32::MAX / 2`, so that
    /// the calls counted on it since cannot wrap), its latency in microseconds (0: none).
    pub(crate) fn of(answer: &ProbeAnswer) -> FreshAnswer {
        FreshAnswer {
            rif: answer.requests_in_flight.min(u64::from(u32::MAX / 2)) as u32,
            latency_us: answer
                .latency
                .map_or(0, |d| d.as_micros().clamp(1, u128::from(u32::MAX)) as u32),
        }
    }
}

impl Record {
    /// The answer arrived at `now_ns`.
    pub(crate) fn store(&self, answer: ProbeAnswer, now_ns: u64) {
        let FreshAnswer { rif, latency_us } = FreshAnswer::of(&answer);
        self.rif.store(rif, Ordering::Relaxed);
        self.latency_us.store(latency_us, Ordering::Relaxed);
        self.uses.store(0, Ordering::Relaxed);
        self.at.store(now_ns.max(1), Ordering::Release);
        self.silent.store(false, Ordering::Relaxed);
    }

    /// Whether a probe of the instance is on its way.
    #[inline]
    pub(crate) fn probing(&self) -> bool {
        self.probing.load(Ordering::Relaxed)
    }

    /// Claims the instance's one probe on its way: `false` if one is already.
    pub(crate) fn start_probe(&self) -> bool {
        self.probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// The probe claimed with [`Record::start_probe`] is over (answered or not).
    pub(crate) fn probe_over(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// Whether the instance answered UNIMPLEMENTED.
    #[inline]
    pub(crate) fn unsupported(&self) -> bool {
        self.unsupported.load(Ordering::Relaxed)
    }

    /// It answered UNIMPLEMENTED; `true` if that is news.
    pub(crate) fn set_unsupported(&self) -> bool {
        !self.unsupported.swap(true, Ordering::Relaxed)
    }

    /// Its probe got no answer; `true` if it had answered the one before (news).
    pub(crate) fn set_silent(&self) -> bool {
        !self.silent.swap(true, Ordering::Relaxed)
    }

    /// Whether the instance is left to the strategy: it does not answer probes (UNIMPLEMENTED,
    /// or its last probe got no answer).
    #[inline]
    pub(crate) fn unanswered(&self) -> bool {
        self.unsupported.load(Ordering::Relaxed) || self.silent.load(Ordering::Relaxed)
    }

    /// The answer, if it is younger than `max_age_ns` at `now_ns` and picked fewer than `reuse`
    /// calls.
    #[inline]
    pub(crate) fn fresh(&self, now_ns: u64, max_age_ns: u64, reuse: u32) -> Option<FreshAnswer> {
        let at = self.at.load(Ordering::Acquire);
        if at == 0 || now_ns.saturating_sub(at) >= max_age_ns {
            return None;
        }
        if self.uses.load(Ordering::Relaxed) >= reuse {
            return None;
        }
        Some(FreshAnswer {
            rif: self.rif.load(Ordering::Relaxed),
            latency_us: self.latency_us.load(Ordering::Relaxed),
        })
    }

    /// The answer picked a call: it is used once more, and the instance has one call more.
    #[inline]
    pub(crate) fn used(&self) {
        self.uses.fetch_add(1, Ordering::Relaxed);
        self.rif.fetch_add(1, Ordering::Relaxed);
    }

    /// Its connection was opened again: it may answer probes now.
    pub(crate) fn reconnected(&self) {
        self.unsupported.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_answer_is_fresh_for_its_age_and_its_uses() {
        let r = Record::default();
        assert_eq!(r.fresh(5, 100, 2), None, "no answer yet");
        r.store(ProbeAnswer::new(3, Some(Duration::from_millis(7))), 1_000);
        let want = FreshAnswer {
            rif: 3,
            latency_us: 7_000,
        };
        assert_eq!(r.fresh(1_099, 100, 2), Some(want));
        assert_eq!(r.fresh(1_100, 100, 2), None, "too old");
        r.used();
        assert_eq!(r.fresh(1_050, 100, 2), Some(FreshAnswer { rif: 4, ..want }));
        r.used();
        assert_eq!(r.fresh(1_050, 100, 2), None, "used up");
    }
}
