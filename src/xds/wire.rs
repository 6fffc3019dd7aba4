//! The xDS messages on the wire, by hand (as ORCA's and the probes' are): the fields of a
//! message as an iterator, the writers of the request, the reader of the response.
//!
//! Field numbers are envoy's `api/envoy/service/discovery/v3/discovery.proto` and
//! `config/core/v3/base.proto` (checked against go-control-plane's generated code,
//! `envoy@v1.40.0`).

use crate::protowire::{self, Reader, FIXED32, LEN, VARINT};

/// A message that did not parse, or a value the client refuses: the reason, for the NACK's
/// `error_detail` and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid(pub(crate) String);

impl Invalid {
    pub(crate) fn new(why: impl Into<String>) -> Invalid {
        Invalid(why.into())
    }
}

impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One field's value: what this client reads is varints and length-delimited values; the
/// other wire types are skipped.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A `fixed32` (a `float`'s bits).
    Fixed32(u32),
    Other,
}

impl<'a> Value<'a> {
    /// The value as a string (a `string` field), or why not.
    pub(crate) fn str(self, what: &'static str) -> Result<&'a str, Invalid> {
        match self {
            Value::Bytes(b) => {
                std::str::from_utf8(b).map_err(|_| Invalid::new(format!("{what}: not UTF-8")))
            }
            _ => Err(Invalid::new(format!("{what}: not a string"))),
        }
    }

    /// The value as an embedded message's bytes.
    pub(crate) fn message(self, what: &'static str) -> Result<&'a [u8], Invalid> {
        match self {
            Value::Bytes(b) => Ok(b),
            _ => Err(Invalid::new(format!("{what}: not a message"))),
        }
    }

    /// The value as a varint (an integer, a bool or an enum).
    pub(crate) fn varint(self, what: &'static str) -> Result<u64, Invalid> {
        match self {
            Value::Varint(v) => Ok(v),
            _ => Err(Invalid::new(format!("{what}: not a varint"))),
        }
    }
}

/// The fields of a message in order, as (number, value); a malformed message ends the
/// iteration with an error naming `what`.
pub(crate) fn fields<'a>(
    buf: &'a [u8],
    what: &'static str,
) -> impl Iterator<Item = Result<(u32, Value<'a>), Invalid>> + 'a {
    let mut r = Reader::new(buf);
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || r.is_empty() {
            return None;
        }
        let next = (|| {
            let (field, wire) = r.key()?;
            let value = match wire {
                VARINT => Value::Varint(r.varint()?),
                LEN => Value::Bytes(r.len_delimited()?),
                FIXED32 => {
                    let b = r.bytes(4)?;
                    Value::Fixed32(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                }
                _ => {
                    r.skip(field, wire, 0)?;
                    Value::Other
                }
            };
            Some((field, value))
        })();
        if next.is_none() {
            failed = true;
        }
        Some(next.ok_or_else(|| Invalid::new(format!("malformed {what}"))))
    })
}

/// A wrapper message's value (`google.protobuf.UInt32Value`, `BoolValue`: field 1).
pub(crate) fn wrapped(buf: &[u8], what: &'static str) -> Result<u64, Invalid> {
    let mut v = 0;
    for f in fields(buf, what) {
        if let (1, value) = f? {
            v = value.varint(what)?;
        }
    }
    Ok(v)
}

/// A `google.protobuf.FloatValue`'s value (0 when unset, as proto3 reads it).
pub(crate) fn wrapped_float(buf: &[u8], what: &'static str) -> Result<f32, Invalid> {
    let mut v = 0.0;
    for f in fields(buf, what) {
        match f? {
            (1, Value::Fixed32(bits)) => v = f32::from_bits(bits),
            (1, _) => return Err(Invalid::new(format!("{what}: not a float"))),
            _ => {}
        }
    }
    Ok(v)
}

/// A `google.protobuf.Duration`, in milliseconds (negative: invalid).
pub(crate) fn duration_ms(buf: &[u8], what: &'static str) -> Result<u64, Invalid> {
    let (mut secs, mut nanos) = (0i64, 0i64);
    for f in fields(buf, what) {
        match f? {
            (1, v) => secs = v.varint(what)? as i64,
            (2, v) => nanos = i64::from(v.varint(what)? as i32),
            _ => {}
        }
    }
    if secs < 0 || nanos < 0 {
        return Err(Invalid::new(format!("{what}: negative duration")));
    }
    Ok((secs as u64).saturating_mul(1000) + nanos as u64 / 1_000_000)
}

/// A `google.protobuf.Any`: its type URL and its value.
pub(crate) fn any<'a>(buf: &'a [u8], what: &'static str) -> Result<(&'a str, &'a [u8]), Invalid> {
    let (mut url, mut value): (&str, &[u8]) = ("", &[]);
    for f in fields(buf, what) {
        match f? {
            (1, v) => url = v.str(what)?,
            (2, v) => value = v.message(what)?,
            _ => {}
        }
    }
    Ok((url, value))
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    protowire::put_varint(out, u64::from(field) << 3 | u64::from(LEN));
    protowire::put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A string field (proto3: not written when empty).
pub(crate) fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        put_bytes(out, field, s.as_bytes());
    }
}

/// A varint field (proto3: not written when zero).
pub(crate) fn put_uint(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        protowire::put_varint(out, u64::from(field) << 3 | u64::from(VARINT));
        protowire::put_varint(out, v);
    }
}

/// An `envoy.service.discovery.v3.DiscoveryRequest` (state of the world).
#[derive(Debug, Clone, Default)]
pub(crate) struct DiscoveryRequest {
    /// The last version of this type the client accepted (empty: none yet).
    pub(crate) version_info: String,
    /// The encoded `envoy.config.core.v3.Node`: sent in the stream's first request only.
    pub(crate) node: Option<std::sync::Arc<Vec<u8>>>,
    pub(crate) resource_names: Vec<String>,
    pub(crate) type_url: &'static str,
    /// The nonce of the response this request answers (empty on a subscription).
    pub(crate) response_nonce: String,
    /// A NACK's reason (`google.rpc.Status` with INVALID_ARGUMENT).
    pub(crate) error_detail: Option<String>,
}

impl crate::codec::Encode for DiscoveryRequest {
    fn encode_to(&self, out: &mut Vec<u8>) {
        put_str(out, 1, &self.version_info);
        if let Some(node) = &self.node {
            put_bytes(out, 2, node);
        }
        for name in &self.resource_names {
            put_bytes(out, 3, name.as_bytes());
        }
        put_str(out, 4, self.type_url);
        put_str(out, 5, &self.response_nonce);
        if let Some(why) = &self.error_detail {
            let mut status = Vec::with_capacity(why.len() + 4);
            put_uint(&mut status, 1, tonic::Code::InvalidArgument as u64);
            put_str(&mut status, 2, why);
            put_bytes(out, 6, &status);
        }
    }
}

/// An `envoy.service.discovery.v3.DiscoveryResponse`: its resources still encoded, each with
/// its type URL.
#[derive(Debug, Clone, Default)]
pub(crate) struct DiscoveryResponse {
    pub(crate) version_info: String,
    pub(crate) resources: Vec<(String, bytes::Bytes)>,
    pub(crate) type_url: String,
    pub(crate) nonce: String,
}

impl crate::codec::Decode for DiscoveryResponse {
    fn decode_from(bytes: &[u8]) -> Result<Self, tonic::Status> {
        let bad = |e: Invalid| tonic::Status::internal(format!("xDS response: {e}"));
        let mut r = DiscoveryResponse::default();
        for f in fields(bytes, "DiscoveryResponse") {
            match f.map_err(bad)? {
                (1, v) => r.version_info = v.str("version_info").map_err(bad)?.to_owned(),
                (2, v) => {
                    let (url, value) =
                        any(v.message("resources").map_err(bad)?, "resources").map_err(bad)?;
                    r.resources
                        .push((url.to_owned(), bytes::Bytes::copy_from_slice(value)));
                }
                (4, v) => r.type_url = v.str("type_url").map_err(bad)?.to_owned(),
                (5, v) => r.nonce = v.str("nonce").map_err(bad)?.to_owned(),
                _ => {}
            }
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Decode, Encode};

    /// A request as envoy's generated code reads it: every field at its number, the NACK's
    /// status nested; a response's resources come out with their type URLs.
    #[test]
    fn a_request_and_a_response_round_trip_by_field_number() {
        let req = DiscoveryRequest {
            version_info: "3".into(),
            node: Some(std::sync::Arc::new(vec![0x0a, 0x01, b'n'])),
            resource_names: vec!["a".into(), "b".into()],
            type_url: "t",
            response_nonce: "7".into(),
            error_detail: Some("bad".into()),
        };
        let mut out = Vec::new();
        req.encode_to(&mut out);
        let got: Vec<(u32, Vec<u8>)> = fields(&out, "req")
            .map(|f| match f.unwrap() {
                (n, Value::Bytes(b)) => (n, b.to_vec()),
                (n, _) => (n, Vec::new()),
            })
            .collect();
        let want: Vec<(u32, Vec<u8>)> = vec![
            (1, b"3".to_vec()),
            (2, vec![0x0a, 0x01, b'n']),
            (3, b"a".to_vec()),
            (3, b"b".to_vec()),
            (4, b"t".to_vec()),
            (5, b"7".to_vec()),
            (6, vec![0x08, 3, 0x12, 3, b'b', b'a', b'd']),
        ];
        assert_eq!(got, want);

        let mut any = Vec::new();
        put_str(&mut any, 1, "type.googleapis.com/x");
        put_bytes(&mut any, 2, &[1, 2, 3]);
        let mut resp = Vec::new();
        put_str(&mut resp, 1, "v9");
        put_bytes(&mut resp, 2, &any);
        put_str(&mut resp, 4, "type.googleapis.com/x");
        put_str(&mut resp, 5, "n1");
        put_uint(&mut resp, 3, 1); // canary: skipped
        let r = DiscoveryResponse::decode_from(&resp).unwrap();
        assert_eq!(r.version_info, "v9");
        assert_eq!(r.nonce, "n1");
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].0, "type.googleapis.com/x");
        assert_eq!(&r.resources[0].1[..], &[1, 2, 3]);
        assert!(
            DiscoveryResponse::decode_from(&[0x12, 0x05, 1]).is_err(),
            "truncated"
        );
    }
}
