//! The server's queries and errors per second, as its load reports give them: events over a
//! sliding second, counted with atomics only (no lock on the call path).

use std::sync::atomic::{AtomicU64, Ordering};

/// Events per second over a sliding second: the count of the current second plus the
/// previous second's count for the part of it still inside the window.
#[derive(Debug, Default)]
pub(super) struct SlidingRate {
    second: AtomicU64,
    current: AtomicU64,
    previous: AtomicU64,
}

impl SlidingRate {
    fn roll(&self, now_ns: u64) {
        let sec = now_ns / 1_000_000_000;
        let at = self.second.load(Ordering::Acquire);
        if at >= sec {
            return;
        }
        if self
            .second
            .compare_exchange(at, sec, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let last = self.current.swap(0, Ordering::AcqRel);
            let prev = if sec == at + 1 { last } else { 0 };
            self.previous.store(prev, Ordering::Release);
        }
    }

    /// One event at `now_ns`.
    pub(super) fn add(&self, now_ns: u64) {
        self.roll(now_ns);
        self.current.fetch_add(1, Ordering::AcqRel);
    }

    /// The events per second over the second up to `now_ns`.
    pub(super) fn per_second(&self, now_ns: u64) -> f64 {
        self.roll(now_ns);
        let into = (now_ns % 1_000_000_000) as f64 * 1e-9;
        self.previous.load(Ordering::Acquire) as f64 * (1.0 - into)
            + self.current.load(Ordering::Acquire) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate over a sliding second: the current second's events plus the part of the
    /// previous second's still in the window; a gap of more than a second forgets them.
    #[test]
    fn rate_slides() {
        let r = SlidingRate::default();
        let s = 1_000_000_000u64;
        for _ in 0..10 {
            r.add(5 * s + 100);
        }
        assert_eq!(r.per_second(5 * s + 500_000_000), 10.0);
        r.add(6 * s);
        // Half of the previous second's 10, plus 1.
        assert!((r.per_second(6 * s + 500_000_000) - 6.0).abs() < 1e-6);
        assert_eq!(r.per_second(9 * s), 0.0);
    }
}
