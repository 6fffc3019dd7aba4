//! The gRPC headers the channel reads, as constants: a lookup by `HeaderName` skips parsing
//! and validating a string key on every call.

use http::HeaderName;

/// `grpc-status`, in trailers or in a trailers-only response.
pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-timeout`, the call's deadline.
pub(crate) static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

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
