//! The call's deadline, from its `grpc-timeout` header (set by `tonic::Request::set_timeout`).
//!
//! The channel enforces it itself, over the whole call (the response head *and* the response
//! stream), and ends a call whose deadline passes with DEADLINE_EXCEEDED, the gRPC code for it.
//! (tonic's own timer covers only the response head and reports CANCELLED "Timeout expired".)

use std::time::Duration;

/// The timeout in a `grpc-timeout` header: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`). `None` when absent or malformed (the call then has no deadline of the channel's,
/// as in tonic).
pub(crate) fn from_headers(headers: &http::HeaderMap) -> Option<Duration> {
    parse(crate::headers::find(headers, &crate::headers::GRPC_TIMEOUT)?.as_bytes())
}

pub(crate) fn parse(v: &[u8]) -> Option<Duration> {
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A `grpc-timeout` value for `d`: the finest unit whose count fits the header's 8 digits,
/// rounded up so that an attempt is never given less time than is left (at least 1 ns).
pub(crate) fn encode(d: Duration) -> http::HeaderValue {
    const MAX: u128 = 99_999_999;
    let ns = d.as_nanos().max(1);
    let units: [(u128, char); 6] = [
        (1, 'n'),
        (1_000, 'u'),
        (1_000_000, 'm'),
        (1_000_000_000, 'S'),
        (60_000_000_000, 'M'),
        (3_600_000_000_000, 'H'),
    ];
    let (n, unit) = units
        .iter()
        .map(|&(per, unit)| (ns.div_ceil(per), unit))
        .find(|&(n, _)| n <= MAX)
        .unwrap_or((MAX, 'H'));
    http::HeaderValue::from_str(&format!("{n}{unit}")).expect("digits and a unit")
}

/// Whether the deadline has come, whether or not its timer has fired yet (an answer can arrive
/// in the same instant, before the timer's wake-up).
#[inline]
pub(crate) fn passed(deadline: &tokio::time::Sleep) -> bool {
    deadline.is_elapsed() || deadline.deadline() <= tokio::time::Instant::now()
}

/// A deadline counts against an instance that has not answered only if the call had been on
/// it at least this long...
pub(crate) const FLOOR: Duration = Duration::from_millis(10);
/// ...and at least this many times its usual latency: a deadline short next to what the
/// instance usually takes is the caller's choice, not a sign of trouble.
pub(crate) const LATENCY_FACTOR: f64 = 4.0;

/// Whether a call sent to an instance at `start` that has not answered, where the instance's
/// usual latency is `usual_ns` (0: unknown), was held long enough, by `deadline` (now, if the
/// channel knows no deadline), for the silence to say something of the instance: at least
/// [`FLOOR`] and [`LATENCY_FACTOR`] times its usual latency.
pub(crate) fn held_long_enough(
    start: tokio::time::Instant,
    usual_ns: f64,
    deadline: Option<tokio::time::Instant>,
) -> bool {
    // Held until the deadline at most: past it the call was over whatever the instance
    // did, and a timer that fires late (a client short of CPU) says nothing of it.
    let now = tokio::time::Instant::now();
    let until = deadline.map_or(now, |d| d.min(now));
    let held = until.saturating_duration_since(start);
    let enough = FLOOR.as_secs_f64().max(usual_ns * 1e-9 * LATENCY_FACTOR);
    held.as_secs_f64() >= enough
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::Duration;

    #[test]
    fn units() {
        assert_eq!(parse(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse(b"3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse(b"500m"), Some(Duration::from_millis(500)));
        assert_eq!(parse(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse(b"99999999n"), Some(Duration::from_nanos(99_999_999)));
    }

    #[test]
    fn encode_round_trips_rounding_up() {
        use super::encode;
        for d in [
            Duration::from_nanos(1),
            Duration::from_nanos(99_999_999),
            Duration::from_nanos(100_000_001),
            Duration::from_millis(1500),
            Duration::from_secs(3 * 3600),
            Duration::from_secs(1_000_000_000),
        ] {
            let v = encode(d);
            let back = parse(v.as_bytes()).unwrap();
            assert!(
                back >= d.min(Duration::from_secs(99_999_999 * 3600)),
                "{d:?} -> {v:?}"
            );
            assert!(v.len() <= 9, "{v:?}");
        }
        assert_eq!(encode(Duration::from_millis(1500)), "1500000u");
        assert_eq!(encode(Duration::ZERO), "1n");
    }

    #[test]
    fn malformed() {
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"12x",
            b"-1S",
            b"1.5S",
            b" 1S",
        ] {
            assert_eq!(parse(bad), None, "{:?}", std::str::from_utf8(bad));
        }
    }
}
