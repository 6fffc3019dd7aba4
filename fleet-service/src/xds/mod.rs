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
//! The parts: the control plane and the rules of its cache (`control_plane.rs`), the snapshot
//! spec it serves ([`Snapshot`] and the types it holds, `snapshot.rs`), gRPC's own client
//! (`grpc_client.rs`), and the process plumbing both peers share (`process.rs`).

mod control_plane;
mod grpc_client;
mod process;
mod snapshot;

pub use control_plane::ControlPlane;
pub use grpc_client::GrpcXdsClient;
pub use snapshot::{
    Cluster, ClusterEndpoints, ClusterType, DropOverload, Endpoint, Health, LbPolicy, Listener,
    Locality, OutlierDetection, Policy, RouteConfig, RouteEntry, Snapshot, VirtualHost,
    WeightedCluster,
};
