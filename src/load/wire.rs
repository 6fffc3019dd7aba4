//! The protobuf wire format of `xds.data.orca.v3.OrcaLoadReport`, decoded and encoded by hand.
//!
//! The message is nine fields of two shapes (doubles and `map<string, double>`), so a decoder
//! of the wire format is a few dozen lines, where `prost` would be a new dependency of every
//! build (tonic 0.14 no longer pulls it in) for one message. The decoder follows the protobuf
//! rules a generated one follows: unknown fields of every wire type (groups included) are
//! skipped, the last value of a repeated scalar field wins, a map entry with a repeated key
//! replaces the earlier one, a missing key or value is the default; anything that does not
//! parse (a truncated varint or length, a length past the end, a known field with the wrong
//! wire type, a key that is not UTF-8, field number 0, an unmatched end of group) makes the
//! whole report malformed. The property tests check it against prost's encoding.
//!
//! Field numbers, from [`xds/data/orca/v3/orca_load_report.proto`] (cncf/xds):
//! 1 `cpu_utilization`, 2 `mem_utilization`, 3 `rps` (deprecated, `uint64`, skipped),
//! 4 `request_cost`, 5 `utilization`, 6 `rps_fractional`, 7 `eps`, 8 `named_metrics`,
//! 9 `application_utilization`. The request of out-of-band reports is
//! [`xds/service/orca/v3/orca.proto`]'s `OrcaLoadReportRequest`; what it means is [gRFC A51]'s.
//!
//! [`xds/data/orca/v3/orca_load_report.proto`]: https://github.com/cncf/xds/blob/main/xds/data/orca/v3/orca_load_report.proto
//! [`xds/service/orca/v3/orca.proto`]: https://github.com/cncf/xds/blob/main/xds/service/orca/v3/orca.proto
//! [gRFC A51]: https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md

use std::collections::BTreeMap;

use super::report::LoadReport;

use crate::protowire::{put_double, put_varint, varint_len, Reader, FIXED64, LEN, VARINT};

impl LoadReport {
    /// Decodes a serialised report; `None` if it is malformed. Unknown fields are skipped.
    pub fn decode(bytes: &[u8]) -> Option<LoadReport> {
        decode(bytes)
    }

    /// Serialises the report (protobuf wire format; fields at their default are left out).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        encode(self, &mut out);
        out
    }
}

/// One `map<string, double>` entry: key 1, value 2.
fn map_entry(buf: &[u8], into: &mut BTreeMap<String, f64>) -> Option<()> {
    let mut r = Reader::new(buf);
    let mut key: &[u8] = b"";
    let mut value = 0.0;
    while !r.is_empty() {
        match r.key()? {
            (1, LEN) => key = r.len_delimited()?,
            (2, FIXED64) => value = r.double()?,
            (1 | 2, _) => return None,
            (f, w) => r.skip(f, w, 0)?,
        }
    }
    into.insert(std::str::from_utf8(key).ok()?.to_owned(), value);
    Some(())
}

/// Decodes a serialised `OrcaLoadReport`; `None` if it is malformed.
pub(crate) fn decode(buf: &[u8]) -> Option<LoadReport> {
    let mut r = Reader::new(buf);
    let mut report = LoadReport::default();
    while !r.is_empty() {
        let (field, wire) = r.key()?;
        let double = match field {
            1 => &mut report.cpu_utilization,
            2 => &mut report.mem_utilization,
            6 => &mut report.rps_fractional,
            7 => &mut report.eps,
            9 => &mut report.application_utilization,
            4 | 5 | 8 => {
                if wire != LEN {
                    return None;
                }
                let map = match field {
                    4 => &mut report.request_cost,
                    5 => &mut report.utilization,
                    _ => &mut report.named_metrics,
                };
                map_entry(r.len_delimited()?, map)?;
                continue;
            }
            3 if wire != VARINT => return None,
            _ => {
                r.skip(field, wire, 0)?;
                continue;
            }
        };
        if wire != FIXED64 {
            return None;
        }
        *double = r.double()?;
    }
    Some(report)
}

fn put_map(out: &mut Vec<u8>, field: u32, map: &BTreeMap<String, f64>) {
    for (k, &v) in map {
        let value_len = if v != 0.0 { 9 } else { 0 };
        let key_len = if k.is_empty() {
            0
        } else {
            1 + varint_len(k.len() as u64) + k.len()
        };
        put_varint(out, u64::from(field) << 3 | u64::from(LEN));
        put_varint(out, (key_len + value_len) as u64);
        if !k.is_empty() {
            put_varint(out, 1 << 3 | u64::from(LEN));
            put_varint(out, k.len() as u64);
            out.extend_from_slice(k.as_bytes());
        }
        put_double(out, 2, v);
    }
}

/// Encodes a report in field order, leaving out fields at their default.
pub(crate) fn encode(report: &LoadReport, out: &mut Vec<u8>) {
    put_double(out, 1, report.cpu_utilization);
    put_double(out, 2, report.mem_utilization);
    put_map(out, 4, &report.request_cost);
    put_map(out, 5, &report.utilization);
    put_double(out, 6, report.rps_fractional);
    put_double(out, 7, report.eps);
    put_map(out, 8, &report.named_metrics);
    put_double(out, 9, report.application_utilization);
}

/// Encodes an `xds.service.orca.v3.OrcaLoadReportRequest`: field 1 `report_interval` (a
/// `google.protobuf.Duration`: 1 `seconds` int64, 2 `nanos` int32), field 2
/// `request_cost_names` (repeated string, which this crate never sends).
pub(crate) fn encode_request(interval: std::time::Duration, out: &mut Vec<u8>) {
    let mut d = Vec::with_capacity(16);
    if interval.as_secs() != 0 {
        put_varint(&mut d, 1 << 3 | u64::from(VARINT));
        put_varint(&mut d, interval.as_secs().min(i64::MAX as u64));
    }
    if interval.subsec_nanos() != 0 {
        put_varint(&mut d, 2 << 3 | u64::from(VARINT));
        put_varint(&mut d, u64::from(interval.subsec_nanos()));
    }
    put_varint(out, 1 << 3 | u64::from(LEN));
    put_varint(out, d.len() as u64);
    out.extend_from_slice(&d);
}

/// Decodes an `OrcaLoadReportRequest`: its `report_interval`, `None` when it is absent, zero,
/// or negative (the server's minimum applies then); `Err` if the message is malformed. The
/// cost names are skipped: the server reports utilization only, as gRFC A51 says of
/// out-of-band reports.
pub(crate) fn decode_request(buf: &[u8]) -> Result<Option<std::time::Duration>, ()> {
    let mut r = Reader::new(buf);
    let mut interval = None;
    while !r.is_empty() {
        match r.key().ok_or(())? {
            (1, LEN) => interval = duration(r.len_delimited().ok_or(())?)?,
            (2, LEN) => {
                std::str::from_utf8(r.len_delimited().ok_or(())?).map_err(|_| ())?;
            }
            (1 | 2, _) => return Err(()),
            (f, w) => r.skip(f, w, 0).ok_or(())?,
        }
    }
    Ok(interval)
}

/// A `google.protobuf.Duration`, if it is above zero.
fn duration(buf: &[u8]) -> Result<Option<std::time::Duration>, ()> {
    let mut r = Reader::new(buf);
    let (mut secs, mut nanos) = (0i64, 0i64);
    while !r.is_empty() {
        match r.key().ok_or(())? {
            // int64 and int32 are varints of the two's complement (negatives are 10 bytes).
            (1, VARINT) => secs = r.varint().ok_or(())? as i64,
            (2, VARINT) => nanos = i64::from(r.varint().ok_or(())? as i32),
            (1 | 2, _) => return Err(()),
            (f, w) => r.skip(f, w, 0).ok_or(())?,
        }
    }
    if secs < 0 || nanos < 0 || (secs == 0 && nanos == 0) || nanos >= 1_000_000_000 {
        return Ok(None);
    }
    Ok(Some(std::time::Duration::new(secs as u64, nanos as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_len_matches_encoding() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), varint_len(v), "{v}");
            assert_eq!(Reader::new(&out).varint(), Some(v));
        }
    }

    fn double(field: u8, v: f64) -> Vec<u8> {
        let mut out = vec![field << 3 | 1];
        out.extend_from_slice(&v.to_le_bytes());
        out
    }

    /// Every field decoded from bytes written out by hand (not by this module's encoder):
    /// the five doubles at their field numbers, the three maps, an entry with its value
    /// before its key, the deprecated integer `rps` skipped.
    #[test]
    fn decodes_each_field_from_hand_made_bytes() {
        let mut b = Vec::new();
        b.extend(double(1, 0.25)); // cpu_utilization
        b.extend(double(2, 0.5)); // mem_utilization
        b.extend([3 << 3, 0x96, 0x01]); // rps = 150 (varint), deprecated
                                        // request_cost {"io": 3.0}: entry = key (0x0a, len 2, "io") + value (0x11, 8 bytes)
        b.extend([4 << 3 | 2, 13, 0x0a, 2, b'i', b'o', 0x11]);
        b.extend(3.0f64.to_le_bytes());
        // utilization {"disk": 0.75}, value first
        b.extend([5 << 3 | 2, 15, 0x11]);
        b.extend(0.75f64.to_le_bytes());
        b.extend([0x0a, 4, b'd', b'i', b's', b'k']);
        b.extend(double(6, 123.5)); // rps_fractional
        b.extend(double(7, 4.0)); // eps
                                  // named_metrics {"calls_in_flight": 7.0}
        b.extend([8 << 3 | 2, 2 + 15 + 9, 0x0a, 15]);
        b.extend(b"calls_in_flight");
        b.push(0x11);
        b.extend(7.0f64.to_le_bytes());
        b.extend(double(9, 0.6)); // application_utilization
        let r = decode(&b).expect("well-formed");
        assert_eq!(r.cpu_utilization, 0.25);
        assert_eq!(r.mem_utilization, 0.5);
        assert_eq!(r.request_cost.get("io"), Some(&3.0));
        assert_eq!(r.utilization.get("disk"), Some(&0.75));
        assert_eq!(r.rps_fractional, 123.5);
        assert_eq!(r.eps, 4.0);
        assert_eq!(r.named_metrics.get("calls_in_flight"), Some(&7.0));
        assert_eq!(r.calls_in_flight(), Some(7.0));
        assert_eq!(r.application_utilization, 0.6);
        assert_eq!(
            r.request_cost.len() + r.utilization.len() + r.named_metrics.len(),
            3
        );
        assert_eq!(
            decode(&[]),
            Some(LoadReport::default()),
            "the empty message"
        );
    }

    /// Unknown fields of every wire type are skipped (varint, fixed64, length-delimited,
    /// fixed32, a group with a nested group), in the message and inside a map entry; a
    /// repeated field's last value wins.
    #[test]
    fn skips_unknown_fields() {
        let mut b = Vec::new();
        b.extend(double(1, 0.1));
        b.extend([10 << 3, 0xff, 0x01]); // varint
        b.extend([11 << 3 | 1, 1, 2, 3, 4, 5, 6, 7, 8]); // fixed64
        b.extend([12 << 3 | 2, 3, 9, 9, 9]); // bytes
        b.extend([13 << 3 | 5, 1, 2, 3, 4]); // fixed32
        b.extend([
            14 << 3 | 3,
            15 << 3 | 3,
            13 << 3,
            1,
            15 << 3 | 4,
            14 << 3 | 4,
        ]); // groups
        b.extend([0xa0, 0x01, 7]); // field 20, a two-byte key
        b.extend([8 << 3 | 2, 4 + 9 + 2, 0x0a, 2, b'a', b'b', 3 << 3, 5]); // entry + unknown
        b.push(0x11);
        b.extend(2.0f64.to_le_bytes());
        b.extend(double(1, 0.9)); // again: last wins
        let r = decode(&b).expect("unknown fields are skipped");
        assert_eq!(r.cpu_utilization, 0.9);
        assert_eq!(r.named_metrics.get("ab"), Some(&2.0));
    }

    /// Malformed reports decode to nothing: truncations, lengths past the end, wrong wire
    /// types for known fields, field 0, a key that is not UTF-8, unmatched or mismatched
    /// groups, a reserved wire type.
    #[test]
    fn refuses_malformed() {
        let cases: &[&[u8]] = &[
            &[0x09, 0, 0, 0],                   // a double cut short
            &[0x0a],                            // a length missing
            &[0x42, 5, 0x0a],                   // a map entry past the end
            &[0x08, 1],                         // cpu_utilization as a varint
            &[0x40, 1],                         // named_metrics as a varint
            &[0x42, 3, 0x08, 1, 0],             // a key as a varint
            &[0x42, 4, 0x0a, 2, 0xff, 0xfe],    // a key that is not UTF-8
            &[0x00, 1],                         // field 0
            &[0xa0],                            // a varint key cut short
            &[0xa3, 0x01],                      // a group never closed
            &[0xa3, 0x01, 0xac, 0x01],          // closed by another field's end
            &[0xa4, 0x01],                      // an end without a start
            &[0xa6, 0x01],                      // wire type 6
            &[0x85, 0x80, 0x80, 0x80, 0x10, 0], // a key above 32 bits
            &[0x18, 0x80],                      // rps cut short
            &[0x19, 0, 0, 0, 0, 0, 0, 0, 0],    // rps as a double
        ];
        for c in cases {
            assert_eq!(decode(c), None, "{c:x?}");
        }
    }

    /// An over-long varint (an eleventh byte, or a tenth byte above 1) is refused rather than
    /// wrapped.
    #[test]
    fn overlong_varint_is_malformed() {
        let mut ten = vec![0xff; 9];
        ten.push(0x02);
        assert_eq!(Reader::new(&ten).varint(), None);
        assert_eq!(Reader::new(&[0x80; 11]).varint(), None);
    }

    /// The out-of-band request, as bytes written by hand: 1.5 s is `0a 08 08 01 10 80 ca b5 ee 01`
    /// (seconds 1, nanos 500,000,000); 2 s has no nanos; decoding reads it back.
    #[test]
    fn request_encoding_by_hand() {
        let mut out = Vec::new();
        encode_request(std::time::Duration::from_millis(1500), &mut out);
        assert_eq!(out, [0x0a, 8, 0x08, 1, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01]);
        assert_eq!(
            decode_request(&out),
            Ok(Some(std::time::Duration::from_millis(1500)))
        );
        let mut out = Vec::new();
        encode_request(std::time::Duration::from_secs(2), &mut out);
        assert_eq!(out, [0x0a, 2, 0x08, 2]);
    }

    /// A request without an interval, with a zero or negative one, asks for the server's
    /// minimum (`None`); cost names and unknown fields are skipped; garbage is refused.
    #[test]
    fn request_decoding_edge_cases() {
        assert_eq!(decode_request(&[]), Ok(None));
        assert_eq!(decode_request(&[0x0a, 0]), Ok(None));
        // seconds = -1: ten bytes of two's complement.
        let mut neg = vec![0x0a, 11, 0x08];
        neg.extend([0xff; 9]);
        neg.push(0x01);
        assert_eq!(decode_request(&neg), Ok(None));
        // request_cost_names "io", an unknown varint field 7, then 3 s.
        let b = [0x12, 2, b'i', b'o', 0x38, 5, 0x0a, 2, 0x08, 3];
        assert_eq!(
            decode_request(&b),
            Ok(Some(std::time::Duration::from_secs(3)))
        );
        for bad in [&[0x0a, 5, 0x08][..], &[0x08, 1], &[0x12, 1, 0xff], &[0xff]] {
            assert_eq!(decode_request(bad), Err(()), "{bad:x?}");
        }
    }
}
