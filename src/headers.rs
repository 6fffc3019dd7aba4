//! The gRPC headers the channel reads, as constants: a lookup by `HeaderName` skips parsing
//! and validating a string key on every call.

use http::HeaderName;

/// `grpc-status`, in trailers or in a trailers-only response.
pub(crate) static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// `grpc-timeout`, the call's deadline.
pub(crate) static GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");
