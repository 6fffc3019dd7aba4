//! The credentials of the connection to the control plane. Of the bootstrap's
//! `xds_servers[0].channel_creds`, the first entry whose type this client supports is used, as
//! gRPC's clients choose (gRFC A27; grpc-go's `ServerConfig.UnmarshalJSON` in
//! `internal/xds/bootstrap/bootstrap.go`): `insecure` (plaintext HTTP/2) and, with the cargo
//! feature `xds-tls`, `tls` (gRFC A65, read in `tls.rs`). Entries of other types
//! (`google_default`, ...) are skipped; a list with none this client supports is refused,
//! naming the types it has.
//!
//! Without the feature, `tls` is a type this client does not support: skipped as gRPC skips
//! one, with a warning naming the feature when an `insecure` entry follows (the bootstrap's
//! author allowed plaintext), refused naming the feature when none does.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A65](https://github.com/grpc/proposal/blob/master/A65-xds-mtls-creds-in-bootstrap.md).

use std::time::Duration;

use serde_json::Value;
use tonic::transport::Endpoint;

/// How long a connection to the control plane may take to open (TCP, and the TLS handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the credentials are in the bootstrap, for messages.
const PATH: &str = "xds_servers[0].channel_creds";

/// The credentials chosen from the bootstrap's list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ChannelCreds {
    /// Plaintext HTTP/2 (`http://`).
    Insecure,
    /// TLS (`https://`), its files named in the bootstrap.
    #[cfg(feature = "xds-tls")]
    Tls(super::tls::TlsCreds),
}

impl ChannelCreds {
    /// The first entry of `list` that this client supports; why not, naming the setting and
    /// the types this client supports. An entry is an object with a `type` string (an entry
    /// without one is of no type this client supports, as in grpc-go) and, for `tls`, an
    /// optional `config`.
    pub(crate) fn choose(list: &[Value]) -> Result<ChannelCreds, String> {
        let mut types = Vec::new();
        for (i, entry) in list.iter().enumerate() {
            let entry = entry.as_object().ok_or_else(|| {
                format!("{PATH}[{i}] must be an object such as {{\"type\": \"insecure\"}}")
            })?;
            let kind = match entry.get("type") {
                None => "",
                Some(Value::String(s)) => s.as_str(),
                Some(_) => return Err(format!("{PATH}[{i}].type must be a string")),
            };
            types.push(kind);
            match kind {
                "insecure" => {
                    // Only without the feature can a `tls` entry come before.
                    if types.contains(&"tls") {
                        skipped_tls();
                    }
                    return Ok(ChannelCreds::Insecure);
                }
                #[cfg(feature = "xds-tls")]
                "tls" => {
                    let at = format!("{PATH}[{i}].config");
                    return super::tls::TlsCreds::parse(entry.get("config"), &at)
                        .map(ChannelCreds::Tls);
                }
                _ => {}
            }
        }
        if cfg!(not(feature = "xds-tls")) && types.contains(&"tls") {
            return Err(format!(
                "{PATH} {types:?}: \"tls\" needs tonic-balancer's cargo feature `xds-tls`; \
                 without it this client supports \"insecure\" only"
            ));
        }
        Err(format!(
            "{PATH} {types:?}: none of these types is supported; this client supports {}",
            if cfg!(feature = "xds-tls") {
                "\"insecure\" and \"tls\""
            } else {
                "\"insecure\" (and \"tls\" with the cargo feature `xds-tls`)"
            }
        ))
    }

    /// The scheme of the control plane's URI: tonic opens TLS for `https` only.
    pub(crate) fn scheme(&self) -> &'static str {
        match self {
            ChannelCreds::Insecure => "http",
            #[cfg(feature = "xds-tls")]
            ChannelCreds::Tls(_) => "https",
        }
    }

    /// The endpoint of a connection to the control plane at `uri` (of [`scheme`](Self::scheme)),
    /// its credentials' files read now; why not, naming the file.
    pub(crate) fn endpoint(&self, uri: http::Uri) -> Result<Endpoint, String> {
        let endpoint = Endpoint::from(uri).connect_timeout(CONNECT_TIMEOUT);
        match self {
            ChannelCreds::Insecure => Ok(endpoint),
            #[cfg(feature = "xds-tls")]
            ChannelCreds::Tls(tls) => tls.apply(endpoint, CONNECT_TIMEOUT),
        }
    }

    /// What they are, for logs: `insecure`, or `tls` and its files.
    pub(crate) fn describe(&self) -> String {
        match self {
            ChannelCreds::Insecure => "insecure".into(),
            #[cfg(feature = "xds-tls")]
            ChannelCreds::Tls(tls) => tls.to_string(),
        }
    }
}

/// A `tls` entry skipped for an `insecure` one after it (without the feature `xds-tls`): not
/// silently, since the bootstrap's author preferred TLS.
fn skipped_tls() {
    tracing::warn!(
        "xDS bootstrap: {PATH} prefers \"tls\", which needs tonic-balancer's cargo feature \
         `xds-tls`: the control plane is reached in plaintext (the \"insecure\" entry after it)"
    );
}
