//! The control plane: the xDS control plane peer ([`ControlPlane`], `peers/xds`) and its
//! building.
//!
//! **The control plane** serves one snapshot to every client, whatever its node id. Two rules of
//! go-control-plane's cache, as grpc-go's e2e management server has them by default:
//!
//! - It answers a client's request for a resource type only when the request names **every**
//!   resource of that type in the snapshot (the cache's `ads` mode): a snapshot with listeners
//!   `svc` and `other` sends nothing to a client that asks for `svc` alone. Serve only what the
//!   clients ask for, or start the peer with `--allow-resource-subset`
//!   ([`ControlPlane::start_with`]).
//! - A client hears of a new snapshot only if its version differs from the one it has: the peer
//!   refuses the same version twice in a row, and numbers the snapshots itself when
//!   [`Snapshot::version`] is `None`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::process::{Process, COMMAND_LIMIT};
use super::Snapshot;
use crate::peers::{build_go_module, report_missing, with_build_lock, Missing, START_LIMIT};

/// `target/peers/peer-xds`, built once per process; `None` after the loud message when Go is
/// missing (a panic with `CI=true`).
fn built_control_plane() -> Option<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, Missing>> = OnceLock::new();
    match BUILT.get_or_init(|| with_build_lock(|| build_go_module("xds", "peer-xds"))) {
        Ok(path) => Some(path.clone()),
        Err(Missing(what)) => {
            report_missing("xDS control plane (go-control-plane)", what);
            None
        }
    }
}

/// The xDS control plane peer (`peers/xds`): go-control-plane's `SnapshotCache` (ADS, state of
/// the world, xDS v3) on 127.0.0.1, serving the last [`Snapshot`] [`set`](ControlPlane::set) to
/// every client whatever its node id. Killed when dropped.
pub struct ControlPlane {
    program: PathBuf,
    args: Vec<String>,
    addr: SocketAddr,
    process: Process,
}

impl ControlPlane {
    /// A control plane on a free port, with an empty cache (clients get nothing until the first
    /// [`set`](ControlPlane::set)); `None` (after a loud message) when Go is missing, unless
    /// `CI=true`.
    pub fn start() -> Option<ControlPlane> {
        ControlPlane::start_with(&[])
    }

    /// [`start`](ControlPlane::start) with these flags of `peers/xds/main.go`:
    /// `--allow-resource-subset` (answer requests that name only some of a type's resources:
    /// the cache's `ads` mode off), `--verbose` (every request and response on its stderr) and
    /// `--nack-delay <Go duration>` (how long each NACK is held before the cache sees it,
    /// default `100ms`: the cache answers a NACK at once with the same snapshot, and the client
    /// NACKs it again, a loop of thousands a second without it; `0` for the cache as it is),
    /// `--tls-cert <file> --tls-key <file>` (serve over TLS with this certificate: clients
    /// reach it with `tls` channel credentials, [`bootstrap_with_creds`]) and `--client-ca
    /// <file>` (with TLS: require a client certificate this CA signed, mTLS).
    ///
    /// [`bootstrap_with_creds`]: ControlPlane::bootstrap_with_creds
    pub fn start_with(args: &[&str]) -> Option<ControlPlane> {
        let program = built_control_plane()?;
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Some(ControlPlane::spawn(program, args, 0).unwrap_or_else(|e| panic!("{e}")))
    }

    fn spawn(program: PathBuf, args: Vec<String>, port: u16) -> Result<ControlPlane, String> {
        let mut cmd = Command::new(&program);
        cmd.arg("--port").arg(port.to_string()).args(&args);
        let what = format!("xDS control plane {args:?} (port {port})");
        let mut process = Process::spawn(what, cmd)?;
        let line = process.line(START_LIMIT)?;
        let Some(port) = line
            .strip_prefix("LISTENING ")
            .and_then(|p| p.trim().parse::<u16>().ok())
        else {
            return Err(process.failed(&format!("its first line {line:?}, not LISTENING <port>")));
        };
        process.what = format!("xDS control plane {args:?} on port {port}");
        Ok(ControlPlane {
            program,
            args,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            process,
        })
    }

    /// Where it listens: 127.0.0.1 and its port.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:<port>`, with no scheme: the form a gRPC bootstrap's `server_uri` takes (a
    /// target that gRPC resolves as `dns:///127.0.0.1:<port>`).
    pub fn uri(&self) -> String {
        self.addr.to_string()
    }

    /// Serves `snapshot` to every client from now on: sends it, waits for the peer's `OK`, and
    /// returns the version it applied. Panics, with the peer's stderr, when the peer refuses it
    /// (`ERR`: a field it cannot build, the same version twice in a row) or does not answer.
    pub fn set(&mut self, snapshot: &Snapshot) -> String {
        match self.try_set(snapshot) {
            Ok(version) => version,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`set`](ControlPlane::set), returning the peer's refusal (its `ERR` message, with its
    /// stderr) instead of panicking.
    pub fn try_set(&mut self, snapshot: &Snapshot) -> Result<String, String> {
        let json = serde_json::to_string(snapshot).expect("a snapshot is JSON");
        let answer = self.process.ask(&json, COMMAND_LIMIT)?;
        if let Some(version) = answer.strip_prefix("OK ") {
            Ok(version.to_owned())
        } else {
            Err(self
                .process
                .failed(&format!("snapshot {json}\nanswered: {answer}")))
        }
    }

    /// Kills the process (SIGKILL: the clients' streams break at once, with no GOAWAY) and
    /// waits for it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts it again on the same port with the same arguments (killing it first if it still
    /// runs). The new process's cache is empty until the next [`set`](ControlPlane::set): the
    /// clients that reconnect meanwhile get nothing, and keep what they had.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.addr.port();
        let start = Instant::now();
        // The port is free once the process is gone (Go's listeners set SO_REUSEADDR); a few
        // tries in case the kernel is slow to release it.
        loop {
            match ControlPlane::spawn(self.program.clone(), self.args.clone(), port) {
                Ok(new) => {
                    *self = new;
                    return;
                }
                Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// A gRPC bootstrap (gRFC A27) naming this control plane, as JSON text (for
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`): `xds_servers` [{`server_uri`: [`uri`](ControlPlane::uri),
    /// `channel_creds`: [{`type`: `insecure`}], `server_features`: []}], `node` {`id`}.
    pub fn bootstrap(&self, node_id: &str) -> String {
        self.bootstrap_with(node_id, None, &[])
    }

    /// [`bootstrap`](ControlPlane::bootstrap) with the node's `cluster` and these
    /// `server_features` (`ignore_resource_deletion`, `xds_v3`, ...).
    pub fn bootstrap_with(
        &self,
        node_id: &str,
        cluster: Option<&str>,
        server_features: &[&str],
    ) -> String {
        let mut node = serde_json::json!({ "id": node_id });
        if let Some(cluster) = cluster {
            node["cluster"] = cluster.into();
        }
        serde_json::json!({
            "xds_servers": [{
                "server_uri": self.uri(),
                "channel_creds": [{ "type": "insecure" }],
                "server_features": server_features,
            }],
            "node": node,
        })
        .to_string()
    }

    /// [`bootstrap`](ControlPlane::bootstrap) with these `channel_creds` (a JSON list): for a
    /// control plane started with `--tls-cert`, `[{"type": "tls", "config":
    /// {"ca_certificate_file": ...}}]` (gRFC A65).
    pub fn bootstrap_with_creds(&self, node_id: &str, channel_creds: serde_json::Value) -> String {
        serde_json::json!({
            "xds_servers": [{
                "server_uri": self.uri(),
                "channel_creds": channel_creds,
                "server_features": [],
            }],
            "node": { "id": node_id },
        })
        .to_string()
    }

    /// What the process wrote to stderr so far (the last 64 KiB): the streams that opened and
    /// closed, every NACK with the client's message, the cache's warnings.
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    /// The NACKs it received so far (of what [`stderr`](ControlPlane::stderr) kept): one line
    /// each, `stream <id> NACK <type URL> version "<v>" nonce "<n>": <the client's message>`.
    pub fn nacks(&self) -> Vec<String> {
        self.stderr()
            .lines()
            .filter(|l| l.contains(" NACK "))
            .map(str::to_owned)
            .collect()
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("addr", &self.addr)
            .field("args", &self.args)
            .finish()
    }
}
