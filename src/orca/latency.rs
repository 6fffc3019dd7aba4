//! The latency estimate of a probe's answer (see [`crate::probe`]): how long a call received
//! now would take, by the calls in flight when it arrives.
//!
//! The server keeps, for each bucket of the calls in flight when a call arrived (0, 1, 2, 3,
//! 4-7, 8-15, 16 and more, the call itself not counted), a moving average of the calls'
//! latencies: each new latency moves the bucket's average an eighth of the way towards it (the
//! first sets it), so that the estimate follows a change within twenty calls or so and one
//! outlier moves it little. A probe is answered with the average of the bucket of the calls in
//! flight now (the bucket a call received now would count in); if that bucket has no call yet,
//! the nearest bucket with one (the higher of two at the same distance: the estimate errs on
//! the slow side); none at all, no estimate.
//!
//! A call's latency runs from its request reaching the layer to its response head leaving the
//! inner service. For a unary call (tonic sends the head with the message) that is the whole
//! call; for a stream it is the time to its start, so a long-lived stream does not count as a
//! slow call. Calls answered at once with a failure (UNAVAILABLE, RESOURCE_EXHAUSTED, or
//! CANCELLED, DEADLINE_EXCEEDED in a trailers-only head) are left out: a server shedding load
//! fast would otherwise look fast. Out-of-band report streams and probes are not calls. Which
//! calls count is decided by the call's place in the count (`handle::InFlight`); this module
//! keeps the averages.
//!
//! The cost on the call path: one read of the clock when a call arrives and one when its head
//! returns, one atomic update of the bucket's average; no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The buckets of calls in flight the latency is kept by: 0, 1, 2, 3, 4-7, 8-15, 16+.
const BUCKETS: usize = 7;

/// The bucket of `rif` calls in flight.
pub(super) fn bucket(rif: u64) -> usize {
    match rif {
        0..=3 => rif as usize,
        4..=7 => 4,
        8..=15 => 5,
        _ => 6,
    }
}

/// The latency of calls by the calls in flight when they arrived: per bucket, a moving average
/// in nanoseconds (0: no call yet). See the module's documentation.
#[derive(Debug, Default)]
pub(super) struct LatencyEstimator {
    average_ns: [AtomicU64; BUCKETS],
}

impl LatencyEstimator {
    /// A call that arrived in `bucket` took `ns`.
    pub(super) fn record(&self, bucket: usize, ns: u64) {
        // At least 1 ns, so that a bucket with a call is never taken for one without.
        let sample = ns.max(1);
        let _ = self.average_ns[bucket].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(if avg == 0 {
                sample
            } else {
                // An eighth of the way from the average to the sample.
                let moved = i128::from(avg) + (i128::from(sample) - i128::from(avg)) / 8;
                moved.max(1) as u64
            })
        });
    }

    /// The latency of a call arriving with `rif` calls in flight: its bucket's average, or the
    /// nearest bucket's with one (the higher at equal distance); `None` if no bucket has any.
    pub(super) fn estimate(&self, rif: u64) -> Option<Duration> {
        let at = bucket(rif);
        (0..BUCKETS)
            .flat_map(|d| [at.checked_add(d), at.checked_sub(d)])
            .flatten()
            .filter(|&b| b < BUCKETS)
            .map(|b| self.average_ns[b].load(Ordering::Relaxed))
            .find(|&ns| ns != 0)
            .map(Duration::from_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets: 0, 1, 2, 3, 4-7, 8-15, 16 and more.
    #[test]
    fn buckets_of_calls_in_flight() {
        let at: Vec<usize> = [0, 1, 2, 3, 4, 7, 8, 15, 16, 1_000, u64::MAX]
            .into_iter()
            .map(bucket)
            .collect();
        assert_eq!(at, [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6]);
    }

    /// The first latency sets a bucket's average, each later one moves it an eighth of the way;
    /// 0 ns still counts as a call.
    #[test]
    fn latency_moving_average() {
        let l = LatencyEstimator::default();
        assert_eq!(l.estimate(0), None);
        l.record(0, 80_000);
        assert_eq!(l.estimate(0), Some(Duration::from_micros(80)));
        l.record(0, 160_000);
        assert_eq!(l.estimate(0), Some(Duration::from_micros(90)));
        l.record(0, 10_000);
        assert_eq!(l.estimate(0), Some(Duration::from_micros(80)));
        l.record(6, 0);
        assert_eq!(l.estimate(100), Some(Duration::from_nanos(1)));
        l.record(3, u64::MAX);
        l.record(3, u64::MAX);
        assert_eq!(l.estimate(3), Some(Duration::from_nanos(u64::MAX)));
    }

    /// With no call in its bucket, the estimate is the nearest bucket's, the higher of two at
    /// the same distance.
    #[test]
    fn latency_falls_back_to_the_nearest_bucket() {
        let l = LatencyEstimator::default();
        l.record(1, 1_000);
        for rif in [0, 1, 2, 3, 5, 9, 40] {
            assert_eq!(l.estimate(rif), Some(Duration::from_nanos(1_000)), "{rif}");
        }
        l.record(5, 5_000);
        let at = |rif| l.estimate(rif).map(|d| d.as_nanos());
        assert_eq!(at(0), Some(1_000));
        assert_eq!(at(2), Some(1_000));
        // Bucket 3: buckets 1 and 5 both two away; the higher wins.
        assert_eq!(at(3), Some(5_000));
        assert_eq!(at(4), Some(5_000));
        assert_eq!(at(20), Some(5_000));
    }
}
