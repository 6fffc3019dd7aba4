//! The channel's clock, and durations the user sets, made safe to add to it.
//!
//! Every timer and timestamp of the channel reads tokio's clock (`tokio::time::Instant`): in a
//! test on tokio's paused clock (`#[tokio::test(start_paused = true)]`), backoff, ejection,
//! slow start, the tie-break's gates, latency expiry, hedging delays and discovery intervals
//! all run on the time the test advances.
//!
//! Every duration a setting takes may be as long as the user likes (`Duration::MAX` for
//! "never"). Added to an instant, or turned into nanoseconds, a duration that long overflows;
//! so the settings cap what they take at [`FOREVER`] when the channel is built, and the timers
//! that add a duration to the clock use [`after`], which saturates.

use std::time::Duration;

/// The longest duration the channel uses: 30 years, tokio's own "far future". A setting longer
/// than this (such as `Duration::MAX`) is taken as this: for a timer, never.
pub(crate) const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `d`, at most [`FOREVER`].
#[inline]
pub(crate) fn cap(d: Duration) -> Duration {
    d.min(FOREVER)
}

/// The instant `d` from now on tokio's clock, saturating at [`FOREVER`] from now.
#[inline]
pub(crate) fn after(d: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(cap(d)).unwrap_or(now + FOREVER)
}

/// `secs` seconds as a duration: 0 for a negative or NaN value, [`FOREVER`] for one above it.
#[inline]
pub(crate) fn from_secs_f64(secs: f64) -> Duration {
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(secs).map_or(FOREVER, cap)
}

/// `d` in nanoseconds, as the channel's clock counts them (at most [`FOREVER`]'s).
#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    cap(d).as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_durations_are_forever() {
        assert_eq!(cap(Duration::MAX), FOREVER);
        assert_eq!(cap(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(from_secs_f64(f64::INFINITY), FOREVER);
        assert_eq!(from_secs_f64(f64::MAX), FOREVER);
        assert_eq!(from_secs_f64(f64::NAN), Duration::ZERO);
        assert_eq!(from_secs_f64(-1.0), Duration::ZERO);
        assert_eq!(from_secs_f64(0.5), Duration::from_millis(500));
        assert_eq!(nanos(Duration::MAX), FOREVER.as_nanos() as u64);
    }

    #[tokio::test(start_paused = true)]
    async fn after_saturates() {
        let now = tokio::time::Instant::now();
        assert_eq!(after(Duration::MAX), now + FOREVER);
        assert_eq!(after(Duration::from_secs(2)), now + Duration::from_secs(2));
    }
}
