//! Test peers for xDS (gRFC A27), real and unmodified, as grpc-go's own end-to-end tests use
//! them: an xDS control plane ([`ControlPlane`]: envoyproxy/go-control-plane's snapshot cache
//! behind its ADS server, `peers/xds`), and gRPC's own xDS client ([`GrpcXdsClient`]: C-core
//! through grpcio, `peers/python/xds_client.py`), each a process on 127.0.0.1.
//!
//! ```no_run
//! use fleet_service::xds::{ControlPlane, GrpcXdsClient, Snapshot};
//! # fn t(a: std::net::SocketAddr, b: std::net::SocketAddr) {
//! let Some(mut cp) = ControlPlane::start() else { return }; // skipped: no Go here
//! cp.set(&Snapshot::simple("1", "svc", &[a, b])); // listener svc -> route -> cluster -> a, b
//! let Some(mut grpc) = GrpcXdsClient::start(&cp.bootstrap("node-1"), "xds:///svc") else {
//!     return; // skipped: no Python here
//! };
//! let (by_instance, failed) = grpc.calls(40); // where gRPC's own client sent 40 calls
//! # let _ = (by_instance, failed); }
//! ```
//!
//! **Building**, **a missing toolchain** and **no orphans** are as for the other peers
//! ([`crate::peers`]): `go build` of `peers/xds` into `target/peers/peer-xds` once per process
//! under the build lock (`scripts/build-peers.sh` does it before CI's test run), the grpcio
//! client runs on the peers' venv; a missing Go or Python is a loud message and `None` (a panic
//! with `CI=true`); each process is killed when its handle drops and exits by itself when its
//! stdin closes.
//!
//! **The control plane** serves one snapshot to every client, whatever its node id. What a
//! snapshot holds is written here as Rust ([`Snapshot`] and the types it holds) and sent to the
//! peer as one line of JSON, the same names as the fields below: every optional field left
//! `None` (or an empty list) is not set in the resource either, so that a test can send exactly
//! the resource it means, invalid ones included (the peer does not check a snapshot's
//! consistency). Two rules of go-control-plane's cache, as grpc-go's e2e management server has
//! them by default:
//!
//! - It answers a client's request for a resource type only when the request names **every**
//!   resource of that type in the snapshot (the cache's `ads` mode): a snapshot with listeners
//!   `svc` and `other` sends nothing to a client that asks for `svc` alone. Serve only what the
//!   clients ask for, or start the peer with `--allow-resource-subset`
//!   ([`ControlPlane::start_with`]).
//! - A client hears of a new snapshot only if its version differs from the one it has: the peer
//!   refuses the same version twice in a row, and numbers the snapshots itself when
//!   [`Snapshot::version`] is `None`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::peers::{
    build_go_module, built, keep_tail, peers_source, report_missing, with_build_lock, Kind,
    Missing, START_LIMIT,
};

/// How long the control plane may take to answer a command.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);
/// A call's deadline in [`GrpcXdsClient::calls`].
const CALL_DEADLINE: Duration = Duration::from_secs(5);

// The processes.

/// A peer process: commands on its stdin, one answer a line on its stdout, its stderr kept.
/// Killed when dropped.
struct Process {
    /// What it is, for messages.
    what: String,
    child: Child,
    /// Held open: the process exits when it closes.
    stdin: ChildStdin,
    /// Its stdout, line by line (a thread reads it, so that it never blocks on a full pipe).
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    /// The thread that reads stderr: it ends at the pipe's end, after the process exits.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Process {
    fn spawn(what: String, mut cmd: Command) -> Result<Process, String> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("starting {what}: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_reader = keep_tail(child.stderr.take().expect("piped stderr"), stderr.clone());
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // The receiver gone (the handle dropped): keep reading to the pipe's end.
                let _ = tx.send(line);
            }
        });
        Ok(Process {
            what,
            child,
            stdin,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }

    /// The next line it prints, within `limit`.
    fn line(&mut self, limit: Duration) -> Result<String, String> {
        match self.lines.recv_timeout(limit) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(self.failed(&format!("no answer within {limit:?}")))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait();
                self.read_all_stderr();
                Err(self.failed(&format!("it exited ({status:?})")))
            }
        }
    }

    /// Sends one command line and returns the line that answers it.
    fn ask(&mut self, command: &str, limit: Duration) -> Result<String, String> {
        debug_assert!(!command.contains('\n'));
        if let Err(e) = writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush()) {
            let status = self.child.wait();
            self.read_all_stderr();
            return Err(self.failed(&format!("writing a command: {e} (it exited: {status:?})")));
        }
        self.line(limit)
    }

    /// SIGKILL, and waits for it.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Once the process has exited: waits for its stderr reader to reach the pipe's end.
    fn read_all_stderr(&mut self) {
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
    }

    /// An error naming the process, with its stderr.
    fn failed(&self, what: &str) -> String {
        format!(
            "{}: {what}\n--- its stderr ---\n{}",
            self.what,
            self.stderr()
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

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

// The control plane.

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
    /// NACKs it again, a loop of thousands a second without it; `0` for the cache as it is).
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

// The snapshot spec.

fn is_false(b: &bool) -> bool {
    !*b
}

/// What the control plane serves: the resources of every type, each the whole set of its type
/// (state of the world), and a version.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    /// Every resource type's version; `None`: the peer numbers its snapshots itself (1, 2, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<Listener>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<Cluster>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<ClusterEndpoints>,
}

impl Snapshot {
    /// An empty snapshot of this version.
    pub fn new(version: impl Into<String>) -> Snapshot {
        Snapshot {
            version: Some(version.into()),
            ..Snapshot::default()
        }
    }

    /// The whole chain for one listener: listener `listener` by RDS to route configuration
    /// `route-<listener>`, whose one virtual host (domains `*`) sends every call to cluster
    /// `<listener>` (EDS, no policy set), whose endpoints are `endpoints`, all HEALTHY with
    /// weight 1, in one locality (`r1`/`z1`, weight 1).
    pub fn simple(
        version: impl Into<String>,
        listener: &str,
        endpoints: &[SocketAddr],
    ) -> Snapshot {
        let route = format!("route-{listener}");
        let locality = endpoints
            .iter()
            .fold(Locality::new("r1", "z1"), |l, &addr| {
                l.endpoint(addr, Health::Healthy, 1)
            });
        Snapshot::new(version)
            .listener_rds(listener, &route)
            .route(&route, listener)
            .cluster(Cluster::eds(listener))
            .endpoints(ClusterEndpoints::new(listener).locality(locality))
    }

    /// Adds a listener.
    pub fn listener(mut self, listener: Listener) -> Snapshot {
        self.listeners.push(listener);
        self
    }

    /// Adds listener `name`, whose route configuration is `route`, fetched by RDS.
    pub fn listener_rds(self, name: &str, route: &str) -> Snapshot {
        self.listener(Listener::rds(name, route))
    }

    /// Adds listener `name` with its route configuration inline: one virtual host (domains
    /// `*`) sending every call to `cluster`.
    pub fn listener_inline(self, name: &str, cluster: &str) -> Snapshot {
        let config = RouteConfig::new("").virtual_host(VirtualHost::to_cluster(cluster));
        self.listener(Listener::inline(name, config))
    }

    /// Adds a route configuration.
    pub fn route_config(mut self, route: RouteConfig) -> Snapshot {
        self.routes.push(route);
        self
    }

    /// Adds route configuration `name`: one virtual host (domains `*`) sending every call to
    /// `cluster`.
    pub fn route(self, name: &str, cluster: &str) -> Snapshot {
        self.route_config(RouteConfig::new(name).virtual_host(VirtualHost::to_cluster(cluster)))
    }

    /// Adds route configuration `name`: one virtual host (domains `*`) sending every call to
    /// these clusters by weight.
    pub fn weighted_route(self, name: &str, clusters: &[(&str, u32)]) -> Snapshot {
        self.route_config(RouteConfig::new(name).virtual_host(VirtualHost::weighted(clusters)))
    }

    /// Adds a cluster.
    pub fn cluster(mut self, cluster: Cluster) -> Snapshot {
        self.clusters.push(cluster);
        self
    }

    /// Adds a ClusterLoadAssignment (the endpoints of a cluster, by EDS).
    pub fn endpoints(mut self, endpoints: ClusterEndpoints) -> Snapshot {
        self.endpoints.push(endpoints);
        self
    }
}

/// A client-side listener: an `ApiListener` whose `HttpConnectionManager` names its route
/// configuration (`rds`, fetched over ADS) or carries it (`inline`), and whose only HTTP filter
/// is the router (which gRPC clients require, gRFC A39), unless `no_router`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listener {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rds: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inline: Option<RouteConfig>,
    /// No HTTP filter at all: a listener gRPC clients NACK.
    #[serde(skip_serializing_if = "is_false")]
    pub no_router: bool,
}

impl Listener {
    /// Listener `name` whose route configuration `route` comes by RDS.
    pub fn rds(name: &str, route: &str) -> Listener {
        Listener {
            name: name.to_owned(),
            rds: Some(route.to_owned()),
            inline: None,
            no_router: false,
        }
    }

    /// Listener `name` carrying its route configuration.
    pub fn inline(name: &str, config: RouteConfig) -> Listener {
        Listener {
            name: name.to_owned(),
            rds: None,
            inline: Some(config),
            no_router: false,
        }
    }

    /// Without the router filter (no HTTP filter at all).
    pub fn no_router(mut self) -> Listener {
        self.no_router = true;
        self
    }
}

/// A route configuration: its virtual hosts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteConfig {
    pub name: String,
    pub virtual_hosts: Vec<VirtualHost>,
}

impl RouteConfig {
    /// Route configuration `name`, with no virtual host yet.
    pub fn new(name: &str) -> RouteConfig {
        RouteConfig {
            name: name.to_owned(),
            virtual_hosts: Vec::new(),
        }
    }

    /// Adds a virtual host.
    pub fn virtual_host(mut self, host: VirtualHost) -> RouteConfig {
        self.virtual_hosts.push(host);
        self
    }
}

/// A virtual host with one route: path prefix `prefix` (`None`: "", every path) to `cluster`,
/// or to `weighted_clusters` (exactly one of the two, or the peer refuses it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VirtualHost {
    /// `None`: `vh-<its index>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The `:authority` values it matches (gRPC matches the target's name against them, as
    /// A27 says: `*`, a suffix or prefix wildcard, or the name itself).
    pub domains: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weighted_clusters: Vec<WeightedCluster>,
}

impl VirtualHost {
    /// Domains `*`, every call to `cluster`.
    pub fn to_cluster(cluster: &str) -> VirtualHost {
        VirtualHost {
            name: None,
            domains: vec!["*".to_owned()],
            prefix: None,
            cluster: Some(cluster.to_owned()),
            weighted_clusters: Vec::new(),
        }
    }

    /// Domains `*`, every call to these clusters by weight.
    pub fn weighted(clusters: &[(&str, u32)]) -> VirtualHost {
        VirtualHost {
            name: None,
            domains: vec!["*".to_owned()],
            prefix: None,
            cluster: None,
            weighted_clusters: clusters
                .iter()
                .map(|&(name, weight)| WeightedCluster {
                    name: name.to_owned(),
                    weight: Some(weight),
                })
                .collect(),
        }
    }

    /// These domains instead of `*`.
    pub fn domains(mut self, domains: &[&str]) -> VirtualHost {
        self.domains = domains.iter().map(|d| d.to_string()).collect();
        self
    }

    /// This path prefix instead of "".
    pub fn prefix(mut self, prefix: &str) -> VirtualHost {
        self.prefix = Some(prefix.to_owned());
        self
    }
}

/// One cluster of a weighted route.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightedCluster {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// How a cluster finds its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClusterType {
    /// By EDS over ADS.
    Eds,
    /// In the cluster itself (`load_assignment`): a type gRPC does not support (A27), for NACK
    /// tests.
    Static,
}

/// `Cluster.lb_policy`, the legacy enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LbPolicy {
    RoundRobin,
    LeastRequest,
    RingHash,
    Random,
    Maglev,
    ClusterProvided,
    LoadBalancingPolicyConfig,
}

/// A cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    pub name: String,
    /// `None`: EDS.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ClusterType>,
    /// The ClusterLoadAssignment to fetch by EDS; `None`: the cluster's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eds_service_name: Option<String>,
    /// A STATIC cluster's endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_assignment: Option<ClusterEndpoints>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lb_policy: Option<LbPolicy>,
    /// `Cluster.load_balancing_policy` (gRFC A52): the policies in order of preference (a
    /// client takes the first it supports); empty: not set.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load_balancing_policy: Vec<Policy>,
    /// `Some` (even all `None` inside) turns outlier detection on (gRFC A50).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// `circuit_breakers.thresholds` [{priority DEFAULT, `max_requests`}] (gRFC A32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u32>,
}

impl Cluster {
    /// EDS cluster `name`, its endpoints fetched under its own name; nothing else set.
    pub fn eds(name: &str) -> Cluster {
        Cluster {
            name: name.to_owned(),
            kind: Some(ClusterType::Eds),
            eds_service_name: None,
            load_assignment: None,
            lb_policy: None,
            load_balancing_policy: Vec::new(),
            outlier_detection: None,
            max_requests: None,
        }
    }

    /// STATIC cluster `name` with these endpoints (gRPC NACKs it).
    pub fn static_(name: &str, endpoints: ClusterEndpoints) -> Cluster {
        Cluster {
            kind: Some(ClusterType::Static),
            load_assignment: Some(endpoints),
            ..Cluster::eds(name)
        }
    }

    /// Fetches the endpoints under this name instead of the cluster's.
    pub fn eds_service_name(mut self, name: &str) -> Cluster {
        self.eds_service_name = Some(name.to_owned());
        self
    }

    pub fn lb_policy(mut self, policy: LbPolicy) -> Cluster {
        self.lb_policy = Some(policy);
        self
    }

    /// Adds a policy to `load_balancing_policy` (after those already there).
    pub fn policy(mut self, policy: Policy) -> Cluster {
        self.load_balancing_policy.push(policy);
        self
    }

    pub fn outlier_detection(mut self, od: OutlierDetection) -> Cluster {
        self.outlier_detection = Some(od);
        self
    }

    pub fn max_requests(mut self, n: u32) -> Cluster {
        self.max_requests = Some(n);
        self
    }
}

/// One policy of `Cluster.load_balancing_policy`: its name and the settings of the policies that
/// have some (`None`: unset). Names: `round_robin`, `least_request`, `wrr`
/// (ClientSideWeightedRoundRobin), `ring_hash`, `pick_first`, `wrr_locality` (with `child`), or
/// a type URL (containing `/`) of a policy no client knows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Policy {
    pub name: String,
    /// least_request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice_count: Option<u32>,
    /// ring_hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_ring_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ring_size: Option<u64>,
    /// pick_first.
    #[serde(skip_serializing_if = "is_false")]
    pub shuffle_address_list: bool,
    /// wrr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_oob_load_report: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oob_reporting_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blackout_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_expiration_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_update_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_utilization_penalty: Option<f32>,
    /// wrr_locality: its endpoint-picking policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<Box<Policy>>,
}

impl Policy {
    /// A policy of this name with no settings.
    pub fn named(name: &str) -> Policy {
        Policy {
            name: name.to_owned(),
            ..Policy::default()
        }
    }

    pub fn round_robin() -> Policy {
        Policy::named("round_robin")
    }

    pub fn least_request(choice_count: Option<u32>) -> Policy {
        Policy {
            choice_count,
            ..Policy::named("least_request")
        }
    }

    /// ClientSideWeightedRoundRobin, no setting (the wrr fields are pub).
    pub fn wrr() -> Policy {
        Policy::named("wrr")
    }

    pub fn ring_hash(min_ring_size: Option<u64>, max_ring_size: Option<u64>) -> Policy {
        Policy {
            min_ring_size,
            max_ring_size,
            ..Policy::named("ring_hash")
        }
    }

    pub fn pick_first(shuffle_address_list: bool) -> Policy {
        Policy {
            shuffle_address_list,
            ..Policy::named("pick_first")
        }
    }

    /// WrrLocality with this endpoint-picking policy (what Envoy-style control planes send).
    pub fn wrr_locality(child: Policy) -> Policy {
        Policy {
            child: Some(Box::new(child)),
            ..Policy::named("wrr_locality")
        }
    }

    /// A policy no client knows: an `Any` of this type URL with an empty value.
    pub fn unknown(type_url: &str) -> Policy {
        assert!(type_url.contains('/'), "a type URL: {type_url}");
        Policy::named(type_url)
    }
}

/// `Cluster.outlier_detection`: each field `None` is unset; durations in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutlierDetection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_5xx: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_consecutive_5xx: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_failure: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_consecutive_gateway_failure: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_ejection_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejection_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate_stdev_factor: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_success_rate: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate_minimum_hosts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate_request_volume: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_failure_percentage: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage_minimum_hosts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage_request_volume: Option<u32>,
}

/// A ClusterLoadAssignment: a cluster's endpoints by locality, and its drop policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterEndpoints {
    /// The cluster's name (or its `eds_service_name`).
    pub cluster_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub localities: Vec<Locality>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drop_overloads: Vec<DropOverload>,
}

impl ClusterEndpoints {
    /// The endpoints of `cluster`, no locality yet.
    pub fn new(cluster: &str) -> ClusterEndpoints {
        ClusterEndpoints {
            cluster_name: cluster.to_owned(),
            localities: Vec::new(),
            drop_overloads: Vec::new(),
        }
    }

    pub fn locality(mut self, locality: Locality) -> ClusterEndpoints {
        self.localities.push(locality);
        self
    }

    /// Drops this share of the calls (in millionths) in `category`.
    pub fn drop_overload(mut self, category: &str, per_million: u32) -> ClusterEndpoints {
        self.drop_overloads.push(DropOverload {
            category: category.to_owned(),
            per_million,
        });
        self
    }
}

/// `ClusterLoadAssignment.policy.drop_overloads[]`: a FractionalPercent per million.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DropOverload {
    pub category: String,
    pub per_million: u32,
}

/// A locality's endpoints (`LocalityLbEndpoints`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sub_zone: String,
    /// `load_balancing_weight`. gRPC ignores a locality whose weight is unset or 0 (A27), so
    /// [`Locality::new`] sets 1; `None` leaves it unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    pub priority: u32,
    pub endpoints: Vec<Endpoint>,
}

impl Locality {
    /// Locality `region`/`zone`, weight 1, priority 0, no endpoint yet.
    pub fn new(region: &str, zone: &str) -> Locality {
        Locality {
            region: region.to_owned(),
            zone: zone.to_owned(),
            sub_zone: String::new(),
            weight: Some(1),
            priority: 0,
            endpoints: Vec::new(),
        }
    }

    pub fn sub_zone(mut self, sub_zone: &str) -> Locality {
        self.sub_zone = sub_zone.to_owned();
        self
    }

    pub fn weight(mut self, weight: u32) -> Locality {
        self.weight = Some(weight);
        self
    }

    pub fn priority(mut self, priority: u32) -> Locality {
        self.priority = priority;
        self
    }

    /// Adds an endpoint with this health status and weight.
    pub fn endpoint(mut self, addr: SocketAddr, health: Health, weight: u32) -> Locality {
        self.endpoints.push(Endpoint {
            health: Some(health),
            weight: Some(weight),
            ..Endpoint::new(addr)
        });
        self
    }

    /// Adds an endpoint as it is (its health and weight may be unset).
    pub fn push(mut self, endpoint: Endpoint) -> Locality {
        self.endpoints.push(endpoint);
        self
    }
}

/// An `LbEndpoint`: a TCP address, its health status and weight (`None`: unset).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Endpoint {
    pub address: String,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl Endpoint {
    /// This address, health and weight unset.
    pub fn new(addr: SocketAddr) -> Endpoint {
        Endpoint {
            address: addr.ip().to_string(),
            port: addr.port(),
            health: None,
            weight: None,
        }
    }
}

/// An endpoint's `health_status` (gRPC uses the HEALTHY, UNKNOWN and DEGRADED ones, A27).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
    Draining,
    Timeout,
    Degraded,
}

// gRPC's own client.

/// gRPC's own xDS client (C-core through grpcio, `peers/python/xds_client.py`): a channel to an
/// `xds:` target, calling the fleet's `fleet.v1.Fleet/Unary` on command. Killed when dropped.
pub struct GrpcXdsClient {
    target: String,
    process: Process,
}

impl GrpcXdsClient {
    /// A client of `target` (`xds:///svc`) whose bootstrap is `bootstrap_json` (given as
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`; `GRPC_XDS_BOOTSTRAP`, which C-core would read first, is
    /// removed from its environment). `None` (after a loud message) when Python is missing,
    /// unless `CI=true`. Returns once the process has made its channel (its xDS resources may
    /// still be on their way: the first calls wait for them, up to their deadline).
    pub fn start(bootstrap_json: &str, target: &str) -> Option<GrpcXdsClient> {
        let python = built(Kind::Python)?;
        let mut cmd = Command::new(python);
        cmd.arg("-u")
            .arg(peers_source().join("python/xds_client.py"))
            .arg("--target")
            .arg(target)
            .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap_json)
            .env_remove("GRPC_XDS_BOOTSTRAP");
        let what = format!("grpcio xDS client of {target}");
        let mut process = Process::spawn(what, cmd).unwrap_or_else(|e| panic!("{e}"));
        match process.line(START_LIMIT) {
            Ok(line) if line == "READY" => {}
            Ok(line) => panic!(
                "{}",
                process.failed(&format!("its first line {line:?}, not READY"))
            ),
            Err(e) => panic!("{e}"),
        }
        Some(GrpcXdsClient {
            target: target.to_owned(),
            process,
        })
    }

    /// Makes `n` sequential unary calls to `fleet.v1.Fleet/Unary`, each with a deadline of 5 s,
    /// and returns how many each instance answered (by the name in its reply) and how many
    /// failed (each failure's status is on the client's stderr). Blocking: from async code, use
    /// `spawn_blocking` or `block_in_place`.
    pub fn calls(&mut self, n: usize) -> (BTreeMap<String, u64>, u64) {
        self.calls_within(n, CALL_DEADLINE)
    }

    /// [`calls`](GrpcXdsClient::calls) with this deadline for each call.
    pub fn calls_within(&mut self, n: usize, deadline: Duration) -> (BTreeMap<String, u64>, u64) {
        let limit = deadline * n as u32 + COMMAND_LIMIT;
        let command = format!("calls {n} deadline_ms={}", deadline.as_millis().max(1));
        let answer = self
            .process
            .ask(&command, limit)
            .unwrap_or_else(|e| panic!("{e}"));
        match parse_counts(&answer) {
            Some(counts) => counts,
            None => panic!(
                "{}",
                self.process
                    .failed(&format!("{command:?} answered {answer:?}"))
            ),
        }
    }

    /// The channel's connectivity state as grpcio sees it: `IDLE`, `CONNECTING`, `READY`,
    /// `TRANSIENT_FAILURE`, `SHUTDOWN` (`UNKNOWN` before the first report).
    pub fn state(&mut self) -> String {
        let answer = self
            .process
            .ask("state", COMMAND_LIMIT)
            .unwrap_or_else(|e| panic!("{e}"));
        match answer.strip_prefix("STATE ") {
            Some(state) => state.to_owned(),
            None => panic!("{}", self.process.failed(&format!("state: {answer:?}"))),
        }
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// What the process wrote to stderr so far (the last 64 KiB): each failed call's status,
    /// and C-core's logs (more with `GRPC_TRACE=xds_client,...` and `GRPC_VERBOSITY=debug` in
    /// the test's environment, which it inherits).
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }
}

impl std::fmt::Debug for GrpcXdsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcXdsClient")
            .field("target", &self.target)
            .finish()
    }
}

/// `COUNTS a=3 b%20c=2 failed=1` as ({a: 3, "b c": 2}, 1): names percent-escaped, `failed` the
/// last pair.
fn parse_counts(line: &str) -> Option<(BTreeMap<String, u64>, u64)> {
    let mut pairs: Vec<&str> = line.strip_prefix("COUNTS ")?.split(' ').collect();
    let failed = pairs.pop()?.strip_prefix("failed=")?.parse().ok()?;
    let mut counts = BTreeMap::new();
    for pair in pairs {
        let (name, n) = pair.rsplit_once('=')?;
        counts.insert(percent_decode(name)?, n.parse().ok()?);
    }
    Some((counts, failed))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lines_parse() {
        let (counts, failed) = parse_counts("COUNTS a=3 b%20c%3D=2 failed=1").unwrap();
        assert_eq!(failed, 1);
        assert_eq!(counts["a"], 3);
        assert_eq!(counts["b c="], 2);
        assert_eq!(
            parse_counts("COUNTS failed=0").unwrap(),
            (BTreeMap::new(), 0)
        );
        assert_eq!(parse_counts("COUNTS a=1"), None);
    }

    #[test]
    fn the_simple_snapshot_as_json() {
        let addr: SocketAddr = "127.0.0.1:1234".parse().unwrap();
        let json = serde_json::to_value(Snapshot::simple("3", "svc", &[addr])).unwrap();
        let want = serde_json::json!({
            "version": "3",
            "listeners": [{"name": "svc", "rds": "route-svc"}],
            "routes": [{"name": "route-svc", "virtual_hosts": [{"domains": ["*"], "cluster": "svc"}]}],
            "clusters": [{"name": "svc", "type": "EDS"}],
            "endpoints": [{"cluster_name": "svc", "localities": [{
                "region": "r1", "zone": "z1", "weight": 1, "priority": 0,
                "endpoints": [{"address": "127.0.0.1", "port": 1234, "health": "HEALTHY", "weight": 1}],
            }]}],
        });
        assert_eq!(json, want);
    }
}
