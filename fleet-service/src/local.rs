//! Instances served on the test's own runtime, for tests whose premise is "equal instances" on
//! a busy machine.
//!
//! A [`Fleet`](crate::Fleet) runs each instance on a thread of its own. On a machine with more
//! runnable threads than cores, one of those threads can be served the CPU a kernel tick or
//! two later than the others for a few hundred milliseconds: measured beside two spinning
//! processes, its answers took 11.8 ms for 150 ms and more while the others' took 3.9 and
//! 7.8 ms (the kernel's 4 ms ticks). That is a real difference between those servers'
//! answers, which a latency-aware channel rightly acts on; it is not the test's scenario when
//! the test asks for equal instances. Served on the client's runtime, every scheduling delay
//! falls on the client and every instance alike, as a busy client's own delays fall on the
//! answers of instances on other machines. (docs/design.md, "A busy machine is not only a
//! busy client".)

use std::sync::Arc;

use crate::{health_service, service, Behavior, Shared};

/// `n` instances of the fleet's service (and its health service) on free ports of 127.0.0.1,
/// served by tasks of the runtime that starts them. They cannot be killed or restarted (their
/// connections would outlive the server's task); the tasks end when this is dropped or the
/// runtime shuts down.
pub struct LocalFleet {
    pub instances: Vec<Arc<Shared>>,
    uris: Vec<String>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl LocalFleet {
    /// Starts `n` instances named `i0`, `i1`, ... that behave as `behavior` says.
    pub async fn start(n: usize, behavior: Behavior) -> LocalFleet {
        let mut fleet = LocalFleet {
            instances: Vec::new(),
            uris: Vec::new(),
            tasks: Vec::new(),
        };
        for k in 0..n {
            let shared = Shared::new(&format!("i{k}"), behavior.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            // TCP_NODELAY, as the fleet's instances set it: without it a second response on a
            // connection waits for the peer's delayed ACK.
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            let routes = tonic::service::Routes::new(service(shared.clone()))
                .add_service(health_service(shared.clone()));
            let server = tonic::transport::Server::builder()
                // Tests cancel many calls at once (as the fleet's instances allow).
                .http2_max_pending_accept_reset_streams(Some(100_000))
                .add_routes(routes)
                .serve_with_incoming(incoming);
            fleet.tasks.push(tokio::spawn(async move {
                let _ = server.await;
            }));
            fleet.uris.push(format!("http://{addr}"));
            fleet.instances.push(shared);
        }
        fleet
    }

    /// Their `http://` URIs, in order.
    pub fn uris(&self) -> Vec<String> {
        self.uris.clone()
    }

    /// Calls of the fleet's service each instance saw, in order.
    pub fn served(&self) -> Vec<u64> {
        self.instances.iter().map(|s| s.served()).collect()
    }
}

impl Drop for LocalFleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
