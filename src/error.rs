//! Errors: the ones [`Builder::build`](crate::Builder::build) refuses a configuration with, and
//! the gRPC statuses the channel itself produces for a call.

use std::fmt;
use std::sync::Arc;

/// Why a [`BalancedChannel`](crate::BalancedChannel) could not be built, or why the channel
/// itself ended a call.
///
/// Every build-time variant names the input it refuses, so that the message points at the
/// line of configuration to fix. A status that the channel makes itself (rather than one an
/// instance answered) carries one of the call-time variants as its source, so that a caller
/// can tell them apart:
///
/// ```
/// # fn handle(status: tonic::Status) {
/// use std::error::Error as _;
/// if let Some(e) = status.source().and_then(|s| s.downcast_ref::<tonic_balancer::Error>()) {
///     // Made by the balancer: no usable instance, the deadline, a connection that failed.
///     eprintln!("tonic-balancer ended the call: {e}");
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// No instance was given: a channel needs at least one address.
    NoInstances,
    /// A string that is not an `http://` or `https://` URI with a host (or a `unix:` URI with
    /// a path, or a connector instance's name).
    #[non_exhaustive]
    InvalidUri {
        /// The string as given.
        uri: String,
        /// What is wrong with it.
        reason: String,
        /// The parser's error, where a parser said what is wrong (also
        /// [`source()`](std::error::Error::source)).
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// The same address was given twice.
    #[non_exhaustive]
    DuplicateUri {
        /// The address as given.
        uri: String,
    },
    /// `build()` was called outside a tokio runtime: the channel's connections and timers
    /// run on the runtime it is built in.
    NoRuntime,
    /// A setting whose value is out of its range, or settings that contradict each other.
    #[non_exhaustive]
    InvalidSetting {
        /// The builder method that took the value, such as `max_replay_body`.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A call found no instance to go to: none in the set, none usable, or none left that it
    /// had not tried. The call was not sent. (Status UNAVAILABLE.)
    #[non_exhaustive]
    NoUsableInstance {
        /// Why, with the count of instances per state.
        reason: String,
    },
    /// A call's deadline (its `grpc-timeout`) passed before the call was over. (Status
    /// DEADLINE_EXCEEDED.)
    DeadlineExceeded,
    /// A call the balancing refused to send, as its discovery asked: an xDS endpoint
    /// assignment's `drop_overloads` drew it, or its cluster's `max_requests` calls were in
    /// flight (gRFCs A27, A32). The call was not sent. (Status UNAVAILABLE.)
    #[non_exhaustive]
    Dropped {
        /// Why: the category that dropped it, or the cap that was reached.
        reason: String,
    },
    /// The connection to an instance failed under a call (it could not be opened, broke, or
    /// was closed before the call was written), and the call could not be sent elsewhere.
    /// (Status UNAVAILABLE.)
    #[non_exhaustive]
    Unavailable {
        /// The instance.
        uri: String,
        /// What happened.
        reason: String,
        /// The transport's error, if there was one (also
        /// [`source()`](std::error::Error::source)): the error itself, so that its chain
        /// (tonic's status, hyper's error, h2's or the socket's) can be walked and downcast.
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
}

/// Compares everything but a transport error's source (which has no equality).
impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        use Error::*;
        match (self, other) {
            (NoInstances, NoInstances) | (NoRuntime, NoRuntime) => true,
            (DeadlineExceeded, DeadlineExceeded) => true,
            (
                InvalidUri {
                    uri: a, reason: b, ..
                },
                InvalidUri {
                    uri: c, reason: d, ..
                },
            ) => a == c && b == d,
            (DuplicateUri { uri: a }, DuplicateUri { uri: b }) => a == b,
            (InvalidSetting { name: a, reason: b }, InvalidSetting { name: c, reason: d }) => {
                a == c && b == d
            }
            (NoUsableInstance { reason: a }, NoUsableInstance { reason: b }) => a == b,
            (Dropped { reason: a }, Dropped { reason: b }) => a == b,
            (
                Unavailable {
                    uri: a, reason: b, ..
                },
                Unavailable {
                    uri: c, reason: d, ..
                },
            ) => a == c && b == d,
            _ => false,
        }
    }
}

impl Eq for Error {}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoInstances => {
                f.write_str("no instances: a balanced channel needs at least one URI")
            }
            Error::InvalidUri { uri, reason, .. } => write!(f, "invalid URI {uri:?}: {reason}"),
            Error::DuplicateUri { uri } => {
                write!(f, "duplicate URI {uri:?}: each instance must be given once")
            }
            Error::NoRuntime => {
                f.write_str("no tokio runtime: build the channel within a tokio runtime")
            }
            Error::InvalidSetting { name, reason } => {
                write!(f, "invalid setting `{name}`: {reason}")
            }
            Error::NoUsableInstance { reason }
            | Error::Unavailable { reason, .. }
            | Error::Dropped { reason } => f.write_str(reason),
            Error::DeadlineExceeded => {
                f.write_str("deadline exceeded: the call's grpc-timeout ran out")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Unavailable {
                source: Some(s), ..
            }
            | Error::InvalidUri {
                source: Some(s), ..
            } => Some(&**s),
            _ => None,
        }
    }
}

/// The status for an error the channel ends a call with, carrying it as its source.
pub(crate) fn status(error: Error) -> tonic::Status {
    let code = match error {
        Error::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        _ => tonic::Code::Unavailable,
    };
    let mut status = tonic::Status::new(code, error.to_string());
    status.set_source(Arc::new(error));
    status
}

/// Checks that `s` is an absolute `http://` or `https://` URI with a host, and parses it.
pub(crate) fn parse_uri(s: &str) -> Result<http::Uri, Error> {
    let uri: http::Uri = s
        .parse()
        .map_err(|e: http::uri::InvalidUri| Error::InvalidUri {
            uri: s.to_owned(),
            reason: e.to_string(),
            source: Some(Arc::new(e)),
        })?;
    check_endpoint(s, &uri)?;
    Ok(uri)
}

/// The checks of [`parse_uri`] for a URI that is already parsed (from an `Endpoint`).
pub(crate) fn check_uri(uri: &http::Uri) -> Result<(), &'static str> {
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        Some(_) => return Err("the scheme must be http or https"),
        None => return Err("a scheme (http:// or https://) is required"),
    }
    match uri.host() {
        Some(h) if !h.is_empty() => {}
        _ => return Err("a host is required"),
    }
    // Port 0 is no server's, and a port above 65535 none at all: a connection to either could
    // only fail, call after call.
    // (`http::Uri` keeps a port above 65535 in its authority, and reports none.)
    let port = uri.authority().and_then(|a| {
        let host_port = a.as_str().rsplit('@').next()?;
        let colon = host_port.rfind(':')?;
        (!host_port[colon..].contains(']')).then(|| &host_port[colon + 1..])
    });
    if port.is_some_and(|p| !p.parse::<u16>().is_ok_and(|p| p != 0)) {
        return Err("the port must be a number from 1 to 65535");
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
    {
        return Err("an instance URI has no path or query");
    }
    Ok(())
}

/// UNAVAILABLE, for a call the channel found no instance for.
pub(crate) fn no_usable_instance(reason: impl Into<String>) -> tonic::Status {
    status(Error::NoUsableInstance {
        reason: reason.into(),
    })
}

/// UNAVAILABLE, for a call whose instance's connection failed under it.
pub(crate) fn unavailable(
    uri: &str,
    reason: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
) -> tonic::Status {
    status(Error::Unavailable {
        uri: uri.to_owned(),
        reason,
        source,
    })
}

/// DEADLINE_EXCEEDED, for a call whose `grpc-timeout` ran out.
pub(crate) fn deadline_exceeded() -> tonic::Status {
    status(Error::DeadlineExceeded)
}

/// An error and its sources, outermost first.
pub(crate) fn sources<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e), |err| err.source())
}

/// Whether the error comes from the connection (hyper, h2 or the socket).
pub(crate) fn is_transport(e: &(dyn std::error::Error + 'static)) -> bool {
    sources(e).any(|err| {
        err.is::<hyper::Error>()
            || err.is::<std::io::Error>()
            || err.is::<tonic::transport::Error>()
    })
}

/// UNAVAILABLE for a connection that broke under a call (reset, broken pipe), as gRPC names it;
/// tonic reports it as UNKNOWN "transport error". The status tonic gave is kept as the error's
/// source (its own source is hyper's error, and so on down to the socket's). `Err(status)`, as
/// given, if its source is not a transport error.
pub(crate) fn broken_connection(
    addr: &str,
    status: tonic::Status,
) -> Result<tonic::Status, tonic::Status> {
    let Some(e) = std::error::Error::source(&status) else {
        return Err(status);
    };
    if !is_transport(e) {
        return Err(status);
    }
    let reason = format!("connection to {addr} broke during the call: {}", chain(e));
    Ok(unavailable(addr, reason, Some(Arc::new(status))))
}

/// An error's text, standing for an error that cannot be kept itself (it is borrowed).
#[derive(Debug)]
pub(crate) struct Message(pub(crate) String);

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Message {}

/// An error and its sources, as one line (each message once).
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    for err in sources(e) {
        let s = err.to_string();
        if !line.contains(&s) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&s);
        }
    }
    line
}

/// Checks an instance's URI (from an `Endpoint`) as [`parse_uri`] does, naming it as `display`.
pub(crate) fn check_endpoint(display: &str, uri: &http::Uri) -> Result<(), Error> {
    check_uri(uri).map_err(|reason| Error::InvalidUri {
        uri: display.to_owned(),
        reason: reason.to_owned(),
        source: None,
    })
}

/// The name of a status code, as gRPC writes it (`OK`, `UNAVAILABLE`, ...).
#[cfg(feature = "metrics")]
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
