//! What outlier ejection keeps of one instance: its failures, its runs, its ejections and the
//! interval rules' window (see [`EjectionRecord`]). The rules that read and move it are
//! `health`'s (`health/mod.rs`, `outlier.rs`, `sweep.rs`); the record is here, below them,
//! because the instance holds it by value, and the instance is below `health`.
//!
//! Sources: [gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// The answers that a run of successes must reach to end a streak of ejections.
const STREAK_ENDS_AFTER: u32 = 100;

/// One instance's record for outlier ejection. Its fields are its own: `health` moves them
/// through the transitions below, each one step of gRFC A50's state machine (a failure, an
/// answer, an ejection, a readmission), and the rest of the crate reads the totals.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct EjectionRecord {
    /// Calls that ended in a failure of any class but success (for `EndpointStats`).
    failed: AtomicU64,
    consecutive_failures: AtomicU32,
    /// Answers in a row that were not faults, counted only during a streak of ejections.
    consecutive_successes: AtomicU32,
    ejections: AtomicU32,
    /// Ejections in a row without a healthy spell between them: the next ejection lasts
    /// `base × 2^streak`.
    ejection_streak: AtomicU32,
    /// Readmitted after an ejection: one more failure ejects it again.
    probation: AtomicBool,
    /// The current ejection's number: a readmission timer readmits only the ejection it was
    /// set for (not a later one, after the instance was removed and taken back).
    ejection_id: AtomicU32,
    /// When the current ejection ends, in nanoseconds since the channel's epoch.
    ejected_until: AtomicU64,
    /// The interval rules' window: answers that were successes (or ordinary)...
    window_ok: AtomicU64,
    /// ...and the others.
    window_err: AtomicU64,
}

impl EjectionRecord {
    /// Calls that ended in a failure (of any class but success).
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Server faults in a row.
    pub(crate) fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Ejections so far.
    pub(crate) fn ejections(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// Whether it is on probation (readmitted, and not yet answered since).
    pub(crate) fn on_probation(&self) -> bool {
        self.probation.load(Ordering::Relaxed)
    }

    /// A call ended in the interval rules' window: `ok` (a success or an ordinary answer) or
    /// not; `failed` also counts it in [`failed`](Self::failed) (anything but a success).
    #[inline]
    pub(crate) fn ended(&self, ok: bool, failed: bool) {
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        let window = if ok {
            &self.window_ok
        } else {
            &self.window_err
        };
        window.fetch_add(1, Ordering::Relaxed);
    }

    /// A server fault: its run of successes ends. Returns the faults in a row, this one
    /// included.
    #[inline]
    pub(crate) fn fault(&self) -> u32 {
        self.consecutive_successes.store(0, Ordering::Relaxed);
        self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// An answer that is not a fault: its run of faults ends, and so do its probation and,
    /// after [`STREAK_ENDS_AFTER`] such answers in a row, its streak of ejections. Returns
    /// whether it was on probation.
    #[inline]
    pub(crate) fn answered(&self) -> bool {
        // Writes only when there is something to reset: on the common path these are loads,
        // and the instance's counters stay shared between cores.
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
        let was_on_probation = self.probation.load(Ordering::Relaxed);
        if was_on_probation {
            self.probation.store(false, Ordering::Relaxed);
        }
        if self.ejection_streak.load(Ordering::Relaxed) > 0
            && self.consecutive_successes.fetch_add(1, Ordering::Relaxed) + 1 >= STREAK_ENDS_AFTER
        {
            self.ejection_streak.store(0, Ordering::Relaxed);
        }
        was_on_probation
    }

    /// Ejected: one more ejection, and one more in its streak. Returns the streak before this
    /// one (the ejection lasts `base × 2^streak`).
    pub(crate) fn ejected(&self) -> u32 {
        self.ejections.fetch_add(1, Ordering::Relaxed);
        self.ejection_streak.fetch_add(1, Ordering::Relaxed)
    }

    /// Numbers a new ejection that ends at `until_ns` (the channel's clock); returns its
    /// number.
    pub(crate) fn start(&self, until_ns: u64) -> u32 {
        self.ejected_until.store(until_ns, Ordering::Relaxed);
        self.ejection_id
            .fetch_add(1, Ordering::AcqRel)
            .wrapping_add(1)
    }

    /// What is left of its ejection at `now_ns`, in nanoseconds (0: none).
    pub(crate) fn left_ns(&self, now_ns: u64) -> u64 {
        self.ejected_until
            .load(Ordering::Relaxed)
            .saturating_sub(now_ns)
    }

    /// Whether `id` is the current ejection's number (a timer of an earlier ejection readmits
    /// nothing).
    pub(crate) fn is_current(&self, id: u32) -> bool {
        self.ejection_id.load(Ordering::Acquire) == id
    }

    /// Back in service after an ejection (readmitted, or taken back with no time left): on
    /// probation, with no run of faults.
    pub(crate) fn on_probation_again(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.probation.store(true, Ordering::Relaxed);
    }

    /// Reachable again after its connection failed: its run of faults is over.
    pub(crate) fn reconnected(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    /// The interval rules' window so far (successes, failures), which starts again empty.
    pub(crate) fn take_window(&self) -> (u64, u64) {
        (
            self.window_ok.swap(0, Ordering::Relaxed),
            self.window_err.swap(0, Ordering::Relaxed),
        )
    }

    /// For tests: the current ejection's time is over.
    #[cfg(test)]
    pub(crate) fn time_over(&self) {
        self.ejected_until.store(0, Ordering::Relaxed);
    }

    /// For tests: the current ejection's number.
    #[cfg(test)]
    pub(crate) fn ejection_id(&self) -> u32 {
        self.ejection_id.load(Ordering::Acquire)
    }
}
