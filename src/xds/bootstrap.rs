//! The xDS bootstrap: which control plane to ask and who is asking, in the JSON that gRPC's
//! clients read (gRFC A27), from the file `GRPC_XDS_BOOTSTRAP` names, else from the text of
//! `GRPC_XDS_BOOTSTRAP_CONFIG`, or given in code.
//!
//! Read: `xds_servers` (the first: `server_uri`, `channel_creds` of which the first this
//! client supports is used, `server_features`), `node` (`id`, `cluster`, `locality`). Other
//! keys (`authorities`, `certificate_providers`, the server listener templates) are for
//! features this client does not have, and are named in a warning once.
//!
//! The channel credentials are `insecure` or, with the feature `xds-tls`, `tls` (gRFC A65):
//! see `creds.rs` for the choice and `tls.rs` for TLS's files, which are read here too, so that
//! a missing or malformed one is refused with the bootstrap.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A65](https://github.com/grpc/proposal/blob/master/A65-xds-mtls-creds-in-bootstrap.md).

use std::sync::Arc;

use serde_json::Value;

use super::creds::ChannelCreds;
use super::wire::{put_bytes, put_str};
use crate::error::Error;

/// What the bootstrap says, checked: one control plane, how to reach it, and the node's
/// identity.
///
/// The control plane is reached with the first of `channel_creds` this client supports, as
/// gRPC's clients choose: `{"type": "insecure"}` (plaintext), or with the feature `xds-tls`
/// TLS as gRFC A65 gives it, whose files are read (and checked) here and again at each
/// connection:
///
/// ```json
/// {"type": "tls", "config": {
///     "ca_certificate_file": "/etc/xds/ca.pem",
///     "certificate_file": "/etc/xds/client.pem",
///     "private_key_file": "/etc/xds/client.key"
/// }}
/// ```
///
/// Without `ca_certificate_file` the control plane's certificate is checked against the
/// system's roots; `certificate_file` and `private_key_file` (mTLS) come together or not at
/// all; `refresh_interval` is checked, and the files are read at each connection instead.
/// Without the feature, a list whose only usable entry is `tls` is refused, naming it.
///
/// ```
/// # #[cfg(feature = "xds")] {
/// let b = tonic_balancer::xds::Bootstrap::from_json(r#"{
///     "xds_servers": [{"server_uri": "127.0.0.1:18000", "channel_creds": [{"type": "insecure"}]}],
///     "node": {"id": "billing-7f9c", "cluster": "billing"}
/// }"#).unwrap();
/// assert_eq!(b.server_uri(), "127.0.0.1:18000");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub(crate) server_uri: String,
    /// The first of `channel_creds` this client supports.
    pub(crate) creds: ChannelCreds,
    pub(crate) features: Vec<String>,
    pub(crate) node: Node,
}

/// `envoy.config.core.v3.Node`, as far as the bootstrap gives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Node {
    pub(crate) id: String,
    pub(crate) cluster: String,
    pub(crate) locality: [String; 3],
}

/// The variable that names a bootstrap file.
pub const BOOTSTRAP_FILE_ENV: &str = "GRPC_XDS_BOOTSTRAP";
/// The variable whose value is the bootstrap itself.
pub const BOOTSTRAP_CONFIG_ENV: &str = "GRPC_XDS_BOOTSTRAP_CONFIG";

const SETTING: &str = "xds bootstrap";

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidSetting {
        name: SETTING,
        reason: reason.into(),
    }
}

impl Bootstrap {
    /// The bootstrap as gRPC finds it: the file `GRPC_XDS_BOOTSTRAP` names, else the text of
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`; an error naming both when neither is set.
    pub fn from_env() -> Result<Bootstrap, Error> {
        if let Some(path) = std::env::var_os(BOOTSTRAP_FILE_ENV) {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                invalid(format!(
                    "{BOOTSTRAP_FILE_ENV}={}: {e}",
                    path.to_string_lossy()
                ))
            })?;
            return Bootstrap::from_json(&text);
        }
        match std::env::var(BOOTSTRAP_CONFIG_ENV) {
            Ok(text) => Bootstrap::from_json(&text),
            Err(_) => Err(invalid(format!(
                "no bootstrap: set {BOOTSTRAP_FILE_ENV} (a file) or {BOOTSTRAP_CONFIG_ENV} (the \
                 JSON), or give one with Builder::xds_bootstrap"
            ))),
        }
    }

    /// A bootstrap from its JSON text.
    pub fn from_json(text: &str) -> Result<Bootstrap, Error> {
        let v: Value = serde_json::from_str(text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| invalid("not a JSON object"))?;
        let known = ["xds_servers", "node"];
        let unused: Vec<&String> = obj
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .collect();
        if !unused.is_empty() {
            tracing::warn!(keys = ?unused, "xDS bootstrap: keys this client does not use");
        }
        let servers = obj
            .get("xds_servers")
            .and_then(Value::as_array)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid("\"xds_servers\" must be a non-empty list"))?;
        let server = &servers[0];
        let server_uri = server
            .get("server_uri")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid("xds_servers[0].server_uri must be a non-empty string"))?
            .to_owned();
        let creds = server
            .get("channel_creds")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid("xds_servers[0].channel_creds must be a list"))?;
        let creds = ChannelCreds::choose(creds).map_err(invalid)?;
        let features = match server.get("server_features") {
            None => Vec::new(),
            Some(Value::Array(list)) => list
                .iter()
                .map(|f| f.as_str().map(str::to_owned))
                .collect::<Option<_>>()
                .ok_or_else(|| invalid("xds_servers[0].server_features must be strings"))?,
            Some(_) => return Err(invalid("xds_servers[0].server_features must be a list")),
        };
        let node = node(obj.get("node"))?;
        let bootstrap = Bootstrap {
            server_uri,
            creds,
            features,
            node,
        };
        // TLS's files read now: a missing or malformed one is refused with the bootstrap, not
        // found out by a stream that never opens.
        if !matches!(bootstrap.creds, ChannelCreds::Insecure) {
            let uri = bootstrap.connect_uri()?;
            bootstrap
                .creds
                .endpoint(uri)
                .map_err(|why| invalid(format!("xds_servers[0].channel_creds: {why}")))?;
        }
        Ok(bootstrap)
    }

    /// The control plane's address, as the bootstrap gives it.
    pub fn server_uri(&self) -> &str {
        &self.server_uri
    }

    /// The URI the client connects to: `http://host:port`, `https://` over TLS (a `dns:///`
    /// prefix dropped). Over TLS the control plane's certificate is checked against `host`.
    pub(crate) fn connect_uri(&self) -> Result<http::Uri, Error> {
        let bare = self
            .server_uri
            .strip_prefix("dns:///")
            .unwrap_or(&self.server_uri);
        format!("{}://{bare}", self.creds.scheme())
            .parse()
            .map_err(|e| invalid(format!("server_uri {:?}: {e}", self.server_uri)))
    }

    /// The node, encoded for the stream's first request.
    pub(crate) fn node_bytes(&self) -> Arc<Vec<u8>> {
        let n = &self.node;
        let mut out = Vec::new();
        put_str(&mut out, 1, &n.id);
        put_str(&mut out, 2, &n.cluster);
        if n.locality.iter().any(|s| !s.is_empty()) {
            let mut l = Vec::new();
            for (i, part) in n.locality.iter().enumerate() {
                put_str(&mut l, i as u32 + 1, part);
            }
            put_bytes(&mut out, 4, &l);
        }
        put_str(&mut out, 6, "tonic-balancer");
        put_str(&mut out, 7, env!("CARGO_PKG_VERSION"));
        // What the client can take: one resource per SotW response entry as-is.
        for feature in [
            "envoy.lb.does_not_support_overprovisioning",
            "xds.config.resource-in-sotw",
        ] {
            put_str(&mut out, 10, feature);
        }
        Arc::new(out)
    }
}

fn node(v: Option<&Value>) -> Result<Node, Error> {
    let Some(v) = v else {
        return Ok(Node::default());
    };
    let obj = v
        .as_object()
        .ok_or_else(|| invalid("\"node\" must be an object"))?;
    let text = |key: &str| -> Result<String, Error> {
        match obj.get(key) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(invalid(format!("node.{key} must be a string"))),
        }
    };
    let mut locality: [String; 3] = Default::default();
    if let Some(l) = obj.get("locality") {
        let l = l
            .as_object()
            .ok_or_else(|| invalid("node.locality must be an object"))?;
        for (i, key) in ["region", "zone", "sub_zone"].iter().enumerate() {
            if let Some(s) = l.get(*key) {
                locality[i] = s
                    .as_str()
                    .ok_or_else(|| invalid(format!("node.locality.{key} must be a string")))?
                    .to_owned();
            }
        }
    }
    Ok(Node {
        id: text("id")?,
        cluster: text("cluster")?,
        locality,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_is_read_as_grpc_reads_it_and_refused_with_its_path() {
        let b = Bootstrap::from_json(
            r#"{"xds_servers":[{"server_uri":"dns:///cp:18000",
                 "channel_creds":[{"type":"google_default"},{"type":"insecure"}],
                 "server_features":["xds_v3"]}],
                "node":{"id":"n1","cluster":"c","locality":{"zone":"z"}}}"#,
        )
        .unwrap();
        assert_eq!(b.connect_uri().unwrap().to_string(), "http://cp:18000/");
        assert_eq!(b.features, ["xds_v3"]);
        assert_eq!(b.node.locality[1], "z");
        for (text, says) in [
            ("[]", "not a JSON object"),
            (r#"{"xds_servers":[]}"#, "xds_servers"),
            (
                r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[{"type":"google_default"}]}]}"#,
                "none of these types is supported",
            ),
            (
                r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[3]}]}"#,
                "channel_creds[0] must be an object",
            ),
            (
                r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[{"type":1}]}]}"#,
                "channel_creds[0].type must be a string",
            ),
            (
                r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[{"type":"insecure"}]}],"node":{"id":3}}"#,
                "node.id",
            ),
        ] {
            let e = Bootstrap::from_json(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    /// Without the feature `xds-tls`, `tls` is a type this client does not support: skipped
    /// for an `insecure` entry after it, else refused naming the feature.
    #[cfg(not(feature = "xds-tls"))]
    #[test]
    fn tls_without_its_feature_is_skipped_or_refused_naming_the_feature() {
        let creds = |list: &str| {
            Bootstrap::from_json(&format!(
                r#"{{"xds_servers":[{{"server_uri":"cp:1","channel_creds":{list}}}]}}"#
            ))
        };
        let b = creds(r#"[{"type":"tls"},{"type":"insecure"}]"#).unwrap();
        assert_eq!(b.creds, ChannelCreds::Insecure);
        let e = creds(r#"[{"type":"tls","config":{"ca_certificate_file":"ca.pem"}}]"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`xds-tls`") && e.contains("\"tls\""), "{e}");
    }

    /// gRFC A65's `tls` credentials, with the feature `xds-tls`.
    #[cfg(feature = "xds-tls")]
    mod tls {
        use std::path::PathBuf;
        use std::time::Duration;

        use super::super::*;

        /// A CA certificate (test data: tests/data/tls/xds-ca.pem; the unit tests run from
        /// the package, which has no tests/).
        const CA: &str = "-----BEGIN CERTIFICATE-----
MIIBsTCCAVegAwIBAgIUC3T5uQ2HMJYhC48NpMFKpfqwze8wCgYIKoZIzj0EAwIw
JTEjMCEGA1UEAwwadG9uaWMtYmFsYW5jZXIgeERTIHRlc3QgQ0EwIBcNMjYxMjA3
MjExNDQ0WhgPMjEyNjExMTMyMTE0NDRaMCUxIzAhBgNVBAMMGnRvbmljLWJhbGFu
Y2VyIHhEUyB0ZXN0IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE1Inu6sTM
TMm2ZC6RTjXJ+K88NkrmZgW9iSAFwslpNu9bHS+GsZlU40VjFMLipbspPninGrbm
/4V9FmKjuKYBi6NjMGEwHQYDVR0OBBYEFEvB6GLN9nUtmAqWTP0q7QUnSkdrMB8G
A1UdIwQYMBaAFEvB6GLN9nUtmAqWTP0q7QUnSkdrMA8GA1UdEwEB/wQFMAMBAf8w
DgYDVR0PAQH/BAQDAgEGMAoGCCqGSM49BAMCA0gAMEUCIQC8k+06SGG7mAxIJPeO
8pYIyUd//pg3Gx9lOkmUKLpn8wIgVit40oFbH7lKiga9RmBxHpvzyRx9JcGHIJMu
cZ3nzG0=
-----END CERTIFICATE-----
";
        /// A private key that goes with no certificate here (made for this test only).
        const OTHER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgU8KwDY+FmHkwtVtL
/yFaVr+Ci0m6bfb93eInQTES2omhRANCAAQTDIMgtrMlS4RKOabqklgrXcrK3+IT
LYkNQ6KwPLxG+ih7kYDJIiLtprBTxj0LAKhNeNu49aVMo3e9OLSLOOwk
-----END PRIVATE KEY-----
";

        /// Files for one test, removed when it ends.
        struct Files(PathBuf);

        impl Files {
            fn new(test: &str) -> Files {
                let dir = std::env::temp_dir()
                    .join(format!("tonic-balancer-{test}-{}", std::process::id()));
                std::fs::create_dir_all(&dir).unwrap();
                Files(dir)
            }

            /// A file of this text: its path, as a JSON string.
            fn file(&self, name: &str, text: &str) -> String {
                let path = self.0.join(name);
                std::fs::write(&path, text).unwrap();
                serde_json::to_string(path.to_str().unwrap()).unwrap()
            }
        }

        impl Drop for Files {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }

        fn with_creds(list: &str) -> Result<Bootstrap, String> {
            Bootstrap::from_json(&format!(
                r#"{{"xds_servers":[{{"server_uri":"127.0.0.1:18000","channel_creds":{list}}}]}}"#
            ))
            .map_err(|e| e.to_string())
        }

        fn tls_of(b: &Bootstrap) -> &super::super::super::tls::TlsCreds {
            match &b.creds {
                ChannelCreds::Tls(tls) => tls,
                other => panic!("not tls: {other:?}"),
            }
        }

        #[test]
        fn tls_credentials_are_read_as_grpc_reads_them() {
            let files = Files::new("tls-read");
            let ca = files.file("ca.pem", CA);
            // The first type this client supports, whatever follows; https, checked against
            // the server_uri's host.
            let b = with_creds(&format!(
                r#"[{{"type":"google_default"}},
                    {{"type":"tls","config":{{"ca_certificate_file":{ca},"refresh_interval":"600s"}}}},
                    {{"type":"insecure"}}]"#
            ))
            .unwrap();
            assert_eq!(
                b.connect_uri().unwrap().to_string(),
                "https://127.0.0.1:18000/"
            );
            let tls = tls_of(&b);
            assert!(tls
                .ca_certificate_file
                .as_ref()
                .unwrap()
                .ends_with("ca.pem"));
            assert_eq!(tls.identity, None);
            assert_eq!(tls.refresh_interval, Some(Duration::from_secs(600)));
            // `insecure` first: the `tls` after it is not even read (its config is not one).
            let b = with_creds(r#"[{"type":"insecure"},{"type":"tls","config":7}]"#).unwrap();
            assert_eq!(b.creds, ChannelCreds::Insecure);
            assert_eq!(b.connect_uri().unwrap().scheme_str(), Some("http"));
            // Empty strings are unset keys; no config, or an empty one: the system's roots.
            let b = with_creds(&format!(
                r#"[{{"type":"tls","config":{{"ca_certificate_file":{ca},
                    "certificate_file":"","private_key_file":""}}}}]"#
            ))
            .unwrap();
            assert_eq!(tls_of(&b).identity, None);
            for list in [r#"[{"type":"tls"}]"#, r#"[{"type":"tls","config":{}}]"#] {
                let list: Vec<Value> = serde_json::from_str(list).unwrap();
                let creds = ChannelCreds::choose(&list).unwrap();
                assert!(creds.describe().contains("the system's roots"), "{creds:?}");
            }
        }

        #[test]
        fn tls_credentials_are_refused_naming_the_key_and_the_form() {
            let files = Files::new("tls-refused");
            let ca = files.file("ca.pem", CA);
            let key = files.file("other.key", OTHER_KEY);
            let not_pem = files.file("not.pem", "not a certificate\n");
            let missing =
                serde_json::to_string(files.0.join("missing.pem").to_str().unwrap()).unwrap();
            let config = |c: &str| format!(r#"[{{"type":"tls","config":{c}}}]"#);
            for (list, says) in [
                (
                    config(&format!(r#"{{"certificate_file":{ca}}}"#)),
                    "certificate_file without private_key_file",
                ),
                (
                    config(&format!(
                        r#"{{"ca_certificate_file":{ca},"private_key_file":{key}}}"#
                    )),
                    "private_key_file without certificate_file",
                ),
                (
                    config(&format!(r#"{{"ca_certificate_file":{missing}}}"#)),
                    "ca_certificate_file ",
                ),
                (
                    config(&format!(r#"{{"ca_certificate_file":{not_pem}}}"#)),
                    "no PEM certificate in it",
                ),
                (
                    config(&format!(
                        r#"{{"ca_certificate_file":{ca},"certificate_file":{ca},"private_key_file":{ca}}}"#
                    )),
                    "private_key_file",
                ),
                // A certificate whose key is another: refused by rustls when it is read.
                (
                    config(&format!(
                        r#"{{"ca_certificate_file":{ca},"certificate_file":{ca},"private_key_file":{key}}}"#
                    )),
                    "certificate_file",
                ),
                (
                    config(&format!(r#"{{"ca_cert_file":{ca}}}"#)),
                    r#"config.ca_cert_file: not a key of the tls credentials; they are ["ca_certificate_file""#,
                ),
                (
                    config(r#"{"spiffe_trust_bundle_map_file":"map.json"}"#),
                    "A87",
                ),
                (
                    config(&format!(
                        r#"{{"ca_certificate_file":{ca},"refresh_interval":"10m"}}"#
                    )),
                    "config.refresh_interval: \"10m\" is not a duration",
                ),
                (
                    config(&format!(
                        r#"{{"ca_certificate_file":{ca},"refresh_interval":600}}"#
                    )),
                    "refresh_interval must be a duration such as \"600s\"",
                ),
                (
                    config(r#"{"ca_certificate_file":3}"#),
                    "ca_certificate_file must be a file's path",
                ),
                (
                    config(r#""ca.pem""#),
                    "channel_creds[0].config must be an object",
                ),
            ] {
                let e = with_creds(&list).unwrap_err();
                assert!(e.contains(says), "{list}: {e}");
                assert!(e.contains("xds_servers[0].channel_creds"), "{list}: {e}");
            }
            // The file that cannot be read is named, with why.
            let e = with_creds(&config(&format!(r#"{{"ca_certificate_file":{missing}}}"#)))
                .unwrap_err();
            assert!(
                e.contains("missing.pem") && e.contains("No such file"),
                "{e}"
            );
        }
    }
}
