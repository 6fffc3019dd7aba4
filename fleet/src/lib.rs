//! A fleet of real tonic servers for the tests of gRPC clients: instances of **your own
//! service** on `127.0.0.1`, each with scripted faults that the test changes while calls run.
//!
//! - [`FaultLayer`] (through its handle, [`Faults`]) is a `tower::Layer` for any tonic server:
//!   added latency (fixed, growing with the calls in flight, stalls with a probability, a cold
//!   start), a status to answer with (message and trailers, such as
//!   `grpc-retry-pushback-ms`), a hang until the caller's deadline, calls held until the test
//!   releases them, a limit of concurrent calls, faults at the end of a stream; scoped to a
//!   method or a service. It counts the calls it sees, by method, with their peak concurrency.
//! - [`Instance`] and [`Fleet`] start your service on free ports of `127.0.0.1`, each on a
//!   runtime of its own, with a [`Faults`] handle each: kill (connections close at once),
//!   restart on the same port, GOAWAY, refused connections, a connection limit, TLS, and load
//!   reports (ORCA, feature `orca`). Everything stops when they are dropped.
//! - [`Tally`], [`StateLog`], [`stats`] and [`wait_until`] check what a `BalancedChannel`
//!   reports: which instance served each call, the instances' states over time.
//! - [`unreachable_uri`] and [`black_hole_uri`]: addresses that refuse every connection, or
//!   never answer one.
//!
//! No protobuf compiler is built for you: bring your service as tonic generated it.
//!
//! # A resilience test
//!
//! ```no_run
//! # fn greeter_server() -> impl tonic_balancer_fleet::GrpcService {
//! #     tonic_health::server::health_reporter().1
//! # }
//! use std::time::Duration;
//! use tonic_balancer::BalancedChannel;
//! use tonic_balancer_fleet::{Fleet, Script, Tally};
//!
//! # async fn doc() {
//! // Three instances of the service under test (`GreeterServer::new(MyGreeter)`, as tonic
//! // generated it); one of them hangs.
//! let fleet = Fleet::start(3, |_| greeter_server());
//! fleet[0].faults().set(Script::new().hang());
//! let channel = BalancedChannel::builder()
//!     .endpoints(fleet.endpoints())
//!     .build()
//!     .unwrap();
//! // ... make calls through `channel` with deadlines, `Tally::record` each outcome, and
//! // check that the hanging instance costs at most the calls it holds ...
//! # let _ = (channel, Tally::new(), Duration::ZERO);
//! # }
//! ```
//!
//! # Features
//!
//! - `orca`: instances report their load (ORCA) per call and out of band, with
//!   tonic-balancer's server side (`ServerOptions::orca`).
//! - `hickory-dns`: a DNS server of the test's own (the `dns` module), answered with the fleet's
//!   addresses, for channels that discover their instances by name.

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "hickory-dns")]
#[cfg_attr(docsrs, doc(cfg(feature = "hickory-dns")))]
pub mod dns;
pub mod fault;
mod instance;
mod observe;

use std::net::SocketAddr;
use std::time::Duration;

pub use fault::{FaultLayer, Faults, MethodCount, Point, Script};
pub use instance::{Fleet, GrpcService, Instance, ServerOptions};
pub use observe::{dump, served_by, stats, total_in_flight, StateChange, StateLog, Tally};

/// An address on 127.0.0.1 that refuses every connection for as long as the test process
/// lives: a socket bound to the port without listening answers each SYN with a reset, and keeps
/// any other socket (a parallel test's server, the next call of this function) from taking the
/// port. A port that was bound and released could be handed out again at once.
pub fn unreachable_uri() -> String {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(&any.into()).expect("bind");
    let addr = socket
        .local_addr()
        .expect("a bound socket's address")
        .as_socket()
        .expect("an IP address");
    // Held for the life of the process: the port stays ours and refusing.
    std::mem::forget(socket);
    format!("http://{addr}")
}

/// An address on 127.0.0.1 where a connection never completes, as on a host that drops SYNs
/// (a black hole): a listener with a backlog of 0 whose queue is already full, so the kernel
/// drops every further SYN. Held for the life of the process.
///
/// # Panics
///
/// If the kernel keeps accepting connections into the queue (64 of them).
pub fn black_hole_uri() -> String {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    socket.bind(&any.into()).expect("bind");
    socket.listen(0).expect("listen");
    let addr = socket
        .local_addr()
        .expect("a bound socket's address")
        .as_socket()
        .expect("an IP address");
    // Fill the accept queue until a connection attempt hangs: from then on SYNs are dropped.
    let mut filled = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(s) => filled.push(s),
            Err(_) => break,
        }
        assert!(filled.len() < 64, "the accept queue of {addr} never filled");
    }
    std::mem::forget(filled);
    std::mem::forget(socket);
    format!("http://{addr}")
}

/// Waits until `cond` holds, looking every millisecond of tokio's clock; panics after `limit`
/// of wall time (be generous: the machine may be loaded), naming `what`.
pub async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
