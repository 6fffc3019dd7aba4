//! The gRPC headers the channel reads, as constants: a lookup by `HeaderName` skips parsing
//! and validating a string key on every call.
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

use http::HeaderName;

/// `grpc-status`, in trailers or in a trailers-only response.
pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-timeout`, the call's deadline.
pub(crate) static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// `grpc-previous-rpc-attempts`: on an attempt after the first, the number of attempts before it
/// (gRFC A6).
pub(crate) static GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");

/// `headers.get(name)`, by a walk over the entries when there are few of them (a gRPC request
/// head or trailers block has a handful): comparing a few names costs less than hashing one.
#[inline]
pub(crate) fn find<'a>(
    headers: &'a http::HeaderMap,
    name: &HeaderName,
) -> Option<&'a http::HeaderValue> {
    if headers.len() <= 8 {
        headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    } else {
        headers.get(name)
    }
}

/// The status in a `grpc-status` header (trailers, or a trailers-only response head); an
/// unreadable value is UNKNOWN.
#[inline]
pub(crate) fn grpc_status(headers: &http::HeaderMap) -> Option<tonic::Code> {
    let v = find(headers, &GRPC_STATUS)?;
    if v.as_bytes() == b"0" {
        return Some(tonic::Code::Ok);
    }
    let code = std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(|s| s.parse::<i32>().ok())
        .map_or(tonic::Code::Unknown, tonic::Code::from_i32);
    Some(code)
}
