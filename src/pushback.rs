//! Server pushback (gRFC A6): a server says, in the metadata of a failed answer, when the
//! client may try the call again, or that it must not.
//!
//! The key is `grpc-retry-pushback-ms`; its value an ASCII signed 32-bit integer: a
//! non-negative one is how many milliseconds to wait before the next attempt, a negative or
//! unreadable one means "no further attempt". Retries ([`RetryPolicy`](crate::RetryPolicy))
//! and hedges ([`HedgingPolicy`](crate::HedgingPolicy)) both honour it.
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

use std::time::Duration;

use http::HeaderName;

/// `grpc-retry-pushback-ms`.
pub(crate) static GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// What a server's pushback says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushback {
    /// Wait this long before the next attempt (instead of the backoff or the hedging delay).
    After(Duration),
    /// No further attempt for this call.
    Stop,
}

/// The pushback in a response head or trailers, if there is one. Several values: the first
/// counts.
pub(crate) fn read(headers: &http::HeaderMap) -> Option<Pushback> {
    let v = crate::headers::find(headers, &GRPC_RETRY_PUSHBACK_MS)?;
    Some(parse(v.as_bytes()))
}

/// A value of `grpc-retry-pushback-ms`. gRFC A6: "an ASCII encoded signed 32-bit integer with
/// no unnecessary leading zeros"; "negative or unparseable" means not to retry. A value with a
/// sign on a positive number or with leading zeros is not in that form: unparseable.
pub(crate) fn parse(v: &[u8]) -> Pushback {
    let digits = v.strip_prefix(b"-").unwrap_or(v);
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0');
    let ms = canonical
        .then(|| std::str::from_utf8(v).ok()?.parse::<i32>().ok())
        .flatten();
    match ms {
        Some(ms) if ms >= 0 => Pushback::After(Duration::from_millis(ms as u64)),
        _ => Pushback::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values() {
        let ms = |n| Pushback::After(Duration::from_millis(n));
        assert_eq!(parse(b"0"), ms(0));
        assert_eq!(parse(b"250"), ms(250));
        assert_eq!(parse(b"2147483647"), ms(2_147_483_647));
        for stop in [
            &b"-1"[..],
            b"",
            b"abc",
            b"12ms",
            b" 5",
            b"+5",
            b"007",
            b"2147483648",
            b"1.5",
        ] {
            assert_eq!(
                parse(stop),
                Pushback::Stop,
                "{:?}",
                String::from_utf8_lossy(stop)
            );
        }
    }

    #[test]
    fn read_from_headers() {
        let mut h = http::HeaderMap::new();
        assert_eq!(read(&h), None);
        h.insert("grpc-retry-pushback-ms", "40".parse().unwrap());
        assert_eq!(read(&h), Some(Pushback::After(Duration::from_millis(40))));
    }
}
