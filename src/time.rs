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

/// The longest duration protobuf's `Duration` holds: 10,000 years, in seconds.
#[cfg(any(feature = "service-config", feature = "xds-tls"))]
const MAX_SECONDS: u64 = 315_576_000_000;

/// Reads a protobuf JSON duration (`"1.5s"`: seconds with up to nine decimals, then `s`), as
/// the service config and the xDS bootstrap give them; why not, if it is not one. Never
/// negative: each setting that takes a negative one reads its sign first.
#[cfg(any(feature = "service-config", feature = "xds-tls"))]
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let malformed = || {
        format!("{s:?} is not a duration: seconds with up to nine decimals, then `s` (\"1.5s\")")
    };
    let body = s.strip_suffix('s').ok_or_else(malformed)?;
    if body.starts_with('-') {
        return Err(format!(
            "{s:?}: must not be negative (a duration such as \"1.5s\", or \"0s\")"
        ));
    }
    let (whole, frac) = body.split_once('.').unwrap_or((body, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) || frac.len() > 9 {
        return Err(malformed());
    }
    let secs: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| malformed())?
    };
    if secs > MAX_SECONDS {
        return Err(format!(
            "{s:?}: above protobuf's longest duration ({MAX_SECONDS}s)"
        ));
    }
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().map_err(|_| malformed())?
    };
    Ok(Duration::new(secs, nanos))
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

    #[cfg(any(feature = "service-config", feature = "xds-tls"))]
    #[test]
    fn durations_in_protobuf_json() {
        for (s, d) in [
            ("1.5s", Duration::from_millis(1500)),
            ("0s", Duration::ZERO),
            ("30s", Duration::from_secs(30)),
            (".25s", Duration::from_millis(250)),
            ("2.s", Duration::from_secs(2)),
            ("0.000000001s", Duration::from_nanos(1)),
            ("0.020s", Duration::from_millis(20)),
            ("315576000000s", Duration::from_secs(MAX_SECONDS)),
        ] {
            assert_eq!(parse_duration(s), Ok(d), "{s}");
        }
        for bad in [
            "",
            "s",
            ".s",
            "1",
            "1.5",
            "1ms",
            "1m",
            "-1s",
            "-0.5s",
            "1.0000000001s",
            "1e3s",
            "+1s",
            " 1s",
            "1.5.1s",
            "315576000001s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
