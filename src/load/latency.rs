//! One instance's latency estimates, as the pick reads them: a peak-sensitive moving average of
//! the time to response headers (what Peak EWMA and power of two choices compare), and a
//! spike-resistant one (its usual latency, for the deadline rule). What an answer does to them
//! is in `learn.rs`.
//!
//! Sources: Finagle's
//! [`PeakEwma`](https://github.com/twitter/finagle/blob/develop/finagle-core/src/main/scala/com/twitter/finagle/loadbalancer/PeakEwma.scala),
//! tower's [`PeakEwma`](https://docs.rs/tower/latest/tower/load/peak_ewma/struct.PeakEwma.html).

use std::sync::atomic::{AtomicU64, Ordering};

/// One instance's latency estimates: `f64` bits in nanoseconds (0 before the first sample),
/// and when they were last updated, on the channel's clock.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Latency {
    /// Peak-sensitive moving average of the time to response headers.
    pub(super) estimate_ns: AtomicU64,
    /// When the estimates were last updated, in nanoseconds since the channel's epoch.
    pub(super) at: AtomicU64,
    /// A spike-resistant moving average of the same samples, the instance's usual latency for
    /// the deadline rule: a sample counts for at most 4× the estimate, so that one scheduling
    /// hiccup does not move it much, while a consistently slow instance moves it within a few
    /// calls.
    pub(super) steady_ns: AtomicU64,
}

impl Latency {
    /// No sample yet, as of `now_ns`.
    pub(crate) fn new(now_ns: u64) -> Latency {
        Latency {
            estimate_ns: AtomicU64::new(0),
            at: AtomicU64::new(now_ns),
            steady_ns: AtomicU64::new(0),
        }
    }

    /// The estimate in nanoseconds (0: unknown), fading linearly to 0 over `expiry` without a
    /// new sample: a spike, or an instance that was slow once, does not keep it out of the ties
    /// for long, and it is tried again. Cheap enough for the pick: two loads, a compare and a
    /// multiply.
    #[inline]
    pub(crate) fn estimate(&self, now_ns: u64, expiry_ns: u64, inv_expiry: f64) -> f64 {
        let at = self.at.load(Ordering::Relaxed);
        let idle = now_ns.saturating_sub(at);
        if idle >= expiry_ns {
            return 0.0;
        }
        let est = f64::from_bits(self.estimate_ns.load(Ordering::Relaxed));
        est * (1.0 - idle as f64 * inv_expiry)
    }

    /// The estimate as last updated, unfaded (for stats and gauges; 0: no sample yet).
    pub(crate) fn last_ns(&self) -> f64 {
        f64::from_bits(self.estimate_ns.load(Ordering::Relaxed))
    }

    /// The instance's usual latency in nanoseconds (0: no sample yet).
    #[inline]
    pub(crate) fn usual_ns(&self) -> f64 {
        f64::from_bits(self.steady_ns.load(Ordering::Relaxed))
    }

    /// For fixtures (the benchmarks' fleet, tests): the estimate is `ns` as of `at` (the
    /// channel's clock), and with `steady`, the usual latency too.
    pub(crate) fn set(&self, ns: f64, at: u64, steady: bool) {
        self.estimate_ns.store(ns.to_bits(), Ordering::Relaxed);
        self.at.store(at, Ordering::Relaxed);
        if steady {
            self.steady_ns.store(ns.to_bits(), Ordering::Relaxed);
        }
    }
}
