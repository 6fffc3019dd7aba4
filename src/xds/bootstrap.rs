//! The xDS bootstrap: which control plane to ask and who is asking, in the JSON that gRPC's
//! clients read (gRFC A27), from the file `GRPC_XDS_BOOTSTRAP` names, else from the text of
//! `GRPC_XDS_BOOTSTRAP_CONFIG`, or given in code.
//!
//! Read: `xds_servers` (the first: `server_uri`, `channel_creds` of which the first this
//! client supports is used, `server_features`), `node` (`id`, `cluster`, `locality`). Other
//! keys (`authorities`, `certificate_providers`, the server listener templates) are for
//! features this client does not have, and are named in a warning once.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md).

use std::sync::Arc;

use serde_json::Value;

use super::wire::{put_bytes, put_str};
use crate::error::Error;

/// What the bootstrap says, checked: one control plane and the node's identity.
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
        let types: Vec<&str> = creds
            .iter()
            .filter_map(|c| c.get("type").and_then(Value::as_str))
            .collect();
        if !types.contains(&"insecure") {
            return Err(invalid(format!(
                "xds_servers[0].channel_creds {types:?}: none supported (\"insecure\")"
            )));
        }
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
        Ok(Bootstrap {
            server_uri,
            features,
            node,
        })
    }

    /// The control plane's address, as the bootstrap gives it.
    pub fn server_uri(&self) -> &str {
        &self.server_uri
    }

    /// The URI the client connects to: `http://host:port` (a `dns:///` prefix dropped).
    pub(crate) fn connect_uri(&self) -> Result<http::Uri, Error> {
        let bare = self
            .server_uri
            .strip_prefix("dns:///")
            .unwrap_or(&self.server_uri);
        format!("http://{bare}")
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
                r#"{"xds_servers":[{"server_uri":"a:1","channel_creds":[{"type":"tls"}]}]}"#,
                "none supported",
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
}
