//! The protobuf wire format of the probe's two messages (`proto/tonic_balancer/probe/v1/
//! probe.proto`), encoded and decoded by hand with `crate::protowire` (as ORCA's reports are):
//! two scalar fields do not call for `prost`.
//!
//! `ProbeResponse`: 1 `requests_in_flight` (`uint64`, a varint), 2 `latency_ms` (`double`,
//! fixed 64 bits). `ProbeRequest`: no field yet.
//!
//! The decoder does what a generated one does: fields it does not know, of every wire type
//! (groups included), are skipped; the last value of a field given twice wins; a field that is
//! missing has its default. Input that does not parse is malformed: a truncated key, varint or
//! value, a length past the end, field number 0, a known field with another wire type than its
//! own, an end of group without its start, a reserved wire type.

use std::time::Duration;

use super::ProbeAnswer;
use crate::protowire::{put_double, put_varint, Reader, FIXED64, VARINT};

/// The input does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Malformed;

/// Decodes a `ProbeResponse`.
pub(super) fn decode_answer(bytes: &[u8]) -> Result<ProbeAnswer, Malformed> {
    let mut input = Reader::new(bytes);
    let mut rif = 0u64;
    let mut latency_ms = 0f64;
    while !input.is_empty() {
        match input.key().ok_or(Malformed)? {
            (1, VARINT) => rif = input.varint().ok_or(Malformed)?,
            (2, FIXED64) => latency_ms = input.double().ok_or(Malformed)?,
            (1 | 2, _) => return Err(Malformed),
            (field, wire) => input.skip(field, wire, 0).ok_or(Malformed)?,
        }
    }
    Ok(ProbeAnswer {
        requests_in_flight: rif,
        latency: latency_from_ms(latency_ms),
    })
}

/// Decodes a `ProbeRequest`: it has no field, so this only checks that it parses. (Only the
/// server side, in the `orca` feature, reads requests.)
#[cfg(any(feature = "orca", test))]
pub(super) fn decode_request(bytes: &[u8]) -> Result<(), Malformed> {
    let mut input = Reader::new(bytes);
    while !input.is_empty() {
        let (field, wire) = input.key().ok_or(Malformed)?;
        input.skip(field, wire, 0).ok_or(Malformed)?;
    }
    Ok(())
}

/// Encodes a `ProbeResponse` in field order, leaving out the fields at their default (proto3):
/// no estimate is `latency_ms` 0.
pub(super) fn encode_answer(answer: &ProbeAnswer, out: &mut Vec<u8>) {
    if answer.requests_in_flight != 0 {
        put_varint(out, u64::from(1 << 3 | VARINT));
        put_varint(out, answer.requests_in_flight);
    }
    put_double(out, 2, latency_to_ms(answer.latency));
}

/// The `latency_ms` of an estimate; 0 for none. Through nanoseconds, so that a duration of
/// whole nanoseconds (under 104 days) comes back exactly from [`latency_from_ms`].
fn latency_to_ms(latency: Option<Duration>) -> f64 {
    latency.map_or(0.0, |d| d.as_nanos() as f64 / 1e6)
}

/// The estimate a `latency_ms` says: none for 0, below 0, infinite or NaN; at most the longest
/// duration the crate uses (30 years). A value under half a nanosecond is 1 ns, so that an
/// estimate stays one.
fn latency_from_ms(ms: f64) -> Option<Duration> {
    if !(ms > 0.0 && ms.is_finite()) {
        return None;
    }
    let longest = crate::time::FOREVER.as_nanos() as f64;
    let nanos = (ms * 1e6).round().clamp(1.0, longest);
    Some(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protowire::MAX_DEPTH;
    use prost::Message;

    /// `ProbeResponse` as prost derives it from the `.proto`: the reference encoding.
    #[derive(Clone, PartialEq, prost::Message)]
    struct ProbeResponse {
        #[prost(uint64, tag = "1")]
        requests_in_flight: u64,
        #[prost(double, tag = "2")]
        latency_ms: f64,
    }

    /// `ProbeResponse` with fields a later version might add (numbers 3 and up, every wire
    /// type prost writes).
    #[derive(Clone, PartialEq, prost::Message)]
    struct ProbeResponseLater {
        #[prost(uint64, tag = "1")]
        requests_in_flight: u64,
        #[prost(double, tag = "2")]
        latency_ms: f64,
        #[prost(string, tag = "3")]
        note: String,
        #[prost(fixed32, tag = "4")]
        small: u32,
        #[prost(sint64, repeated, tag = "5")]
        many: Vec<i64>,
        #[prost(double, tag = "1000")]
        far: f64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct ProbeRequestLater {
        #[prost(string, tag = "1")]
        purpose: String,
        #[prost(uint64, tag = "2")]
        tick: u64,
    }

    fn answer(rif: u64, latency: Option<Duration>) -> ProbeAnswer {
        ProbeAnswer {
            requests_in_flight: rif,
            latency,
        }
    }

    fn encoded(a: &ProbeAnswer) -> Vec<u8> {
        let mut out = Vec::new();
        encode_answer(a, &mut out);
        out
    }

    /// What this module encodes decodes to the same answer, for the edges of both fields.
    #[test]
    fn round_trip() {
        let latencies = [
            None,
            Some(Duration::from_nanos(1)),
            Some(Duration::from_micros(1500)),
            Some(Duration::from_millis(40)),
            Some(Duration::new(3_600, 123_456_789)),
        ];
        for rif in [0, 1, 127, 128, 300, u64::from(u32::MAX) + 1, u64::MAX] {
            for latency in latencies {
                let a = answer(rif, latency);
                assert_eq!(decode_answer(&encoded(&a)), Ok(a), "{a:?}");
            }
        }
        assert_eq!(encoded(&answer(0, None)), b"", "defaults are left out");
    }

    /// Bytes written by hand: RIF 300 is `08 ac 02`; 1.5 ms is the double 1.5 at field 2.
    #[test]
    fn hand_made_bytes() {
        let mut b = vec![0x08, 0xac, 0x02, 0x11];
        b.extend(1.5f64.to_le_bytes());
        let a = answer(300, Some(Duration::from_micros(1500)));
        assert_eq!(encoded(&a), b);
        assert_eq!(decode_answer(&b), Ok(a));
    }

    /// prost reads what this module writes and the other way round, field for field.
    #[test]
    fn agrees_with_prost() {
        for (rif, ms) in [
            (0, 0.0),
            (3, 0.25),
            (1 << 40, 12.5),
            (u64::MAX, 86_400_000.0),
        ] {
            let theirs = ProbeResponse {
                requests_in_flight: rif,
                latency_ms: ms,
            };
            let ours = decode_answer(&theirs.encode_to_vec()).expect("prost's bytes decode");
            assert_eq!(ours.requests_in_flight, rif);
            assert_eq!(ours.latency, latency_from_ms(ms));
            let back = ProbeResponse::decode(&encoded(&ours)[..]).expect("prost decodes ours");
            assert_eq!(back, theirs);
        }
    }

    /// Fields this decoder does not know are skipped, whatever their wire type: those prost
    /// writes for a later version of the message, and hand-made fixed64 and nested groups.
    #[test]
    fn skips_unknown_fields() {
        let later = ProbeResponseLater {
            requests_in_flight: 9,
            latency_ms: 2.0,
            note: "from a later version".into(),
            small: 7,
            many: vec![-1, 5, i64::MIN],
            far: 1.0,
        };
        assert_eq!(
            decode_answer(&later.encode_to_vec()),
            Ok(answer(9, Some(Duration::from_millis(2))))
        );
        // Field 6 fixed64, then a group 7 holding a group 8 holding a varint, then RIF.
        let mut b = vec![6 << 3 | 1, 1, 2, 3, 4, 5, 6, 7, 8];
        b.extend([7 << 3 | 3, 8 << 3 | 3, 9 << 3, 1, 8 << 3 | 4, 7 << 3 | 4]);
        b.extend([0x08, 4]);
        assert_eq!(decode_answer(&b), Ok(answer(4, None)));
        // A request with fields: still a request.
        let req = ProbeRequestLater {
            purpose: "load".into(),
            tick: 3,
        };
        assert_eq!(decode_request(&req.encode_to_vec()), Ok(()));
        assert_eq!(decode_request(&[]), Ok(()));
    }

    /// The last value of a field given twice wins, as in every protobuf decoder.
    #[test]
    fn last_value_wins() {
        let mut b = vec![0x08, 1, 0x11];
        b.extend(5.0f64.to_le_bytes());
        b.extend([0x08, 2, 0x11]);
        b.extend(0.0f64.to_le_bytes());
        assert_eq!(decode_answer(&b), Ok(answer(2, None)));
    }

    /// Input that does not parse is an error, in either message.
    #[test]
    fn refuses_malformed() {
        let cases: &[&[u8]] = &[
            &[0x08],                            // RIF without its value
            &[0x08, 0x80],                      // RIF cut short
            &[0x11, 0, 0, 0],                   // latency cut short
            &[0x09, 0, 0, 0, 0, 0, 0, 0, 0],    // RIF as a fixed64
            &[0x10, 1],                         // latency as a varint
            &[0x0a, 0],                         // RIF as bytes
            &[0x00, 1],                         // field 0
            &[0x80],                            // a key cut short
            &[0x1a, 5, 1],                      // unknown bytes past the end
            &[0x1b],                            // a group never closed
            &[0x1b, 0x24],                      // closed by another field's end
            &[0x1c],                            // an end without a start
            &[0x1e, 0],                         // wire type 6
            &[0x1f, 0],                         // wire type 7
            &[0x85, 0x80, 0x80, 0x80, 0x10, 0], // a key above 32 bits
        ];
        for c in cases {
            assert_eq!(decode_answer(c), Err(Malformed), "{c:x?}");
        }
        for c in cases.iter().filter(|c| !matches!(c[0], 0x08..=0x11)) {
            assert_eq!(decode_request(c), Err(Malformed), "{c:x?}");
        }
        // Groups nested as deep as allowed are skipped; one more level is refused.
        let nested = |levels: u32| {
            let mut b = vec![3 << 3 | 3; levels as usize];
            b.extend(vec![3 << 3 | 4; levels as usize]);
            b
        };
        assert_eq!(decode_request(&nested(MAX_DEPTH)), Ok(()));
        assert_eq!(decode_request(&nested(MAX_DEPTH + 1)), Err(Malformed));
    }

    /// A varint longer than 64 bits is malformed, not wrapped.
    #[test]
    fn overlong_varint() {
        let mut ten = vec![0x08];
        ten.extend([0xff; 9]);
        ten.push(0x01);
        assert_eq!(decode_answer(&ten), Ok(answer(u64::MAX, None)));
        *ten.last_mut().unwrap() = 0x02;
        assert_eq!(decode_answer(&ten), Err(Malformed));
        let mut eleven = vec![0x08];
        eleven.extend([0x80; 10]);
        eleven.push(0);
        assert_eq!(decode_answer(&eleven), Err(Malformed));
    }

    /// `latency_ms`: no estimate for 0, negatives, infinities and NaN; tiny values stay an
    /// estimate; huge ones are capped at 30 years.
    #[test]
    fn latency_edges() {
        for ms in [0.0, -0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(latency_from_ms(ms), None, "{ms}");
        }
        assert_eq!(latency_from_ms(1e-12), Some(Duration::from_nanos(1)));
        assert_eq!(latency_from_ms(1e300), Some(crate::time::FOREVER));
        assert_eq!(latency_from_ms(0.25), Some(Duration::from_micros(250)));
    }
}
