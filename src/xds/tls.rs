//! The bootstrap's `tls` channel credentials (feature `xds-tls`): TLS to the control plane, and
//! mTLS with a client certificate, as gRPC's clients read them (gRFC A65):
//!
//! ```json
//! {"type": "tls", "config": {
//!     "ca_certificate_file": "/etc/xds/ca.pem",
//!     "certificate_file": "/etc/xds/client.pem",
//!     "private_key_file": "/etc/xds/client.key",
//!     "refresh_interval": "600s"
//! }}
//! ```
//!
//! The rules, A65's and those of grpc-go, which reads the config as its file watcher
//! certificate provider's (`internal/xds/bootstrap/tlscreds/bundle.go`,
//! `credentials/tls/certprovider/pemfile/builder.go` and `watcher.go`):
//!
//! - `config` may be absent, `null` or empty: TLS, the control plane's certificate checked
//!   against the system's roots, no client certificate.
//! - `ca_certificate_file`: the roots the control plane's certificate must chain to (PEM);
//!   without it, the system's (the OS's store, as rustls-native-certs finds it).
//! - `certificate_file` and `private_key_file` (PEM) come together or not at all: with them the
//!   client presents the certificate (mTLS).
//! - A key whose value is `""` is not set, as in grpc-go (its fields are plain strings).
//! - `refresh_interval`: a protobuf JSON duration (`"600s"`), how often gRPC's file watcher reads
//!   the files again (10 minutes when unset). Checked, and not used as a period: this client
//!   reads the files when the bootstrap is read (a missing or malformed file is refused at
//!   build, naming it) and again at each connection to the control plane, so that a connection
//!   uses the files as they are when it opens; an open connection keeps its certificates, as in
//!   gRPC, whose certificates apply at the handshake too. A reading that fails at a reconnection
//!   keeps the last good credentials, as gRPC's watcher keeps its last good files
//!   (`ads/stream.rs`). A bootstrap that sets it is told so in the log (INFO).
//!
//! Where this client differs from gRPC's:
//!
//! - **Unknown keys are refused**, naming the four; grpc-go ignores them. A misspelt
//!   `ca_certificate_file` would otherwise trust the system's roots instead of the file,
//!   silently. `spiffe_trust_bundle_map_file` (gRFC A87, behind an environment variable in
//!   grpc-go) is refused as not supported, for the same reason.
//! - **A file is read at build**: gRPC's watcher reads them in the background and a missing
//!   one fails the handshakes, not the bootstrap; here bad input is refused when the channel is
//!   built.
//! - grpc-go (not grpc-java) also requires the certificate and the key in one directory, so
//!   that C-core's watcher reads a pair that belongs together; this client does not.
//!
//! Sources: [gRFC A65](https://github.com/grpc/proposal/blob/master/A65-xds-mtls-creds-in-bootstrap.md),
//! [grpc-go's tlscreds](https://github.com/grpc/grpc-go/blob/master/internal/xds/bootstrap/tlscreds/bundle.go),
//! [grpc-go's pemfile](https://github.com/grpc/grpc-go/blob/master/credentials/tls/certprovider/pemfile/builder.go).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// The keys of `config` (A65).
const KEYS: [&str; 4] = [
    "ca_certificate_file",
    "certificate_file",
    "private_key_file",
    "refresh_interval",
];

/// The `tls` credentials: the files they name, read at each connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TlsCreds {
    /// The roots; `None`: the system's.
    pub(crate) ca_certificate_file: Option<PathBuf>,
    /// The client's certificate and its private key (mTLS).
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
    /// Checked, not used as a period (see the module's docs).
    pub(crate) refresh_interval: Option<Duration>,
}

impl TlsCreds {
    /// The `config` of a `tls` entry (at `at` in the bootstrap, for messages); why not, naming
    /// the key and the form it takes. The files are not read here: see [`apply`](Self::apply).
    pub(crate) fn parse(config: Option<&Value>, at: &str) -> Result<TlsCreds, String> {
        let empty = serde_json::Map::new();
        let config = match config {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(config)) => config,
            Some(_) => {
                return Err(format!(
                    "{at} must be an object (gRFC A65), such as {{\"ca_certificate_file\": \
                     \"/etc/xds/ca.pem\"}}"
                ))
            }
        };
        for key in config.keys() {
            if key == "spiffe_trust_bundle_map_file" {
                return Err(format!(
                    "{at}.{key}: SPIFFE trust bundles (gRFC A87) are not supported by this \
                     client; give the roots in ca_certificate_file"
                ));
            }
            if !KEYS.contains(&key.as_str()) {
                return Err(format!(
                    "{at}.{key}: not a key of the tls credentials; they are {KEYS:?} (gRFC A65)"
                ));
            }
        }
        let file = |key: &str| match config.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(PathBuf::from(s))),
            Some(_) => Err(format!("{at}.{key} must be a file's path (a string)")),
        };
        let ca_certificate_file = file("ca_certificate_file")?;
        let identity = match (file("certificate_file")?, file("private_key_file")?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (cert, _) => {
                let (given, missing) = if cert.is_some() {
                    ("certificate_file", "private_key_file")
                } else {
                    ("private_key_file", "certificate_file")
                };
                return Err(format!(
                    "{at}: {given} without {missing}; a client certificate and its private key \
                     come together (mTLS) or not at all (gRFC A65)"
                ));
            }
        };
        let refresh_interval = match config.get("refresh_interval") {
            None => None,
            Some(Value::String(s)) => Some(
                crate::time::parse_duration(s)
                    .map_err(|why| format!("{at}.refresh_interval: {why}"))?,
            ),
            Some(_) => {
                return Err(format!(
                    "{at}.refresh_interval must be a duration such as \"600s\""
                ))
            }
        };
        if let Some(every) = refresh_interval {
            tracing::info!(
                refresh_interval = ?every,
                "xDS bootstrap: the tls credentials' files are read again at each connection to \
                 the control plane, not every refresh_interval"
            );
        }
        Ok(TlsCreds {
            ca_certificate_file,
            identity,
            refresh_interval,
        })
    }

    /// `endpoint` with TLS of these credentials, the files read now; why not, naming the file.
    /// The handshake may take `timeout`.
    pub(crate) fn apply(&self, endpoint: Endpoint, timeout: Duration) -> Result<Endpoint, String> {
        let mut tls = ClientTlsConfig::new().timeout(timeout);
        tls = match &self.ca_certificate_file {
            Some(path) => tls.ca_certificate(Certificate::from_pem(read_pem(
                path,
                "ca_certificate_file",
                Pem::Certificate,
            )?)),
            // A65: without a CA file, the system's roots.
            None => tls.with_native_roots(),
        };
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(
                read_pem(cert, "certificate_file", Pem::Certificate)?,
                read_pem(key, "private_key_file", Pem::PrivateKey)?,
            ));
        }
        // tonic parses the PEM and builds rustls's settings here (a certificate that does not
        // go with its key is refused here too).
        endpoint
            .tls_config(tls)
            .map_err(|e| format!("{self}: {}", crate::error::chain(&e)))
    }
}

/// What a file must hold.
#[derive(Clone, Copy)]
enum Pem {
    Certificate,
    PrivateKey,
}

/// The file, if it can be read and holds a PEM block of the kind (tonic would take a file with
/// none as no certificate at all: every handshake would fail, saying less).
fn read_pem(path: &Path, key: &str, kind: Pem) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{key} {}: {e}", path.display()))?;
    let (marker, what) = match kind {
        Pem::Certificate => ("-----BEGIN CERTIFICATE-----", "certificate"),
        // PKCS#8 (`BEGIN PRIVATE KEY`), PKCS#1 (`BEGIN RSA PRIVATE KEY`), SEC1 (`BEGIN EC ...`).
        Pem::PrivateKey => (" PRIVATE KEY-----", "private key"),
    };
    if !pem.windows(marker.len()).any(|w| w == marker.as_bytes()) {
        return Err(format!(
            "{key} {}: no PEM {what} in it (a block such as `-----BEGIN {}-----`)",
            path.display(),
            what.to_uppercase()
        ));
    }
    Ok(pem)
}

/// `tls (ca_certificate_file "/etc/xds/ca.pem", certificate_file "...", private_key_file
/// "...")`, for messages and logs.
impl fmt::Display for TlsCreds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ca_certificate_file {
            Some(ca) => write!(f, "tls (ca_certificate_file {:?}", ca.display().to_string())?,
            None => write!(f, "tls (the system's roots")?,
        }
        if let Some((cert, key)) = &self.identity {
            write!(
                f,
                ", certificate_file {:?}, private_key_file {:?}",
                cert.display().to_string(),
                key.display().to_string()
            )?;
        }
        f.write_str(")")
    }
}
