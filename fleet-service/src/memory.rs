//! Instances in memory: the fleet's service behind a real tonic server on the caller's
//! runtime, reached over in-process pipes (tokio's duplex streams, real HTTP/2) through a
//! connector, with no socket. On tokio's paused clock, time then moves only when every task
//! waits, straight to the next timer (the instances' scripted delays included), so that the
//! channel's timers (hedging delays, retry backoff, deadlines, reconnect backoff) are tested
//! to the nanosecond, with no margin for a loaded machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;

use super::{health_service, service, Behavior, Shared};

/// One instance in memory. Its server runs on the runtime it was started in; dropped, it
/// accepts no new connection.
pub struct MemoryInstance {
    /// Its behaviour and counters, as an [`Instance`](crate::Instance)'s.
    pub shared: Arc<Shared>,
    /// The connections it gets: each connect of the channel sends one pipe's server end.
    conns: mpsc::UnboundedSender<Result<DuplexStream, std::io::Error>>,
    /// Connections opened to it.
    connects: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl MemoryInstance {
    /// Starts an instance called `name` on the current runtime. It serves the fleet's service
    /// only: a health call gets UNIMPLEMENTED, as from any server without the health service.
    pub fn start(name: &str, behavior: Behavior) -> MemoryInstance {
        let shared = Shared::new(name, behavior);
        let router = tonic::transport::Server::builder().add_service(service(shared.clone()));
        Self::serve(shared, router)
    }

    /// Starts an instance called `name` on the current runtime that also serves the standard
    /// health service, scripted as a TCP [`Instance`](crate::Instance)'s is (the `Shared`
    /// health methods, such as [`Shared::set_serving`]).
    pub fn start_with_health(name: &str, behavior: Behavior) -> MemoryInstance {
        let shared = Shared::new(name, behavior);
        let router = tonic::transport::Server::builder()
            .add_service(service(shared.clone()))
            .add_service(health_service(shared.clone()));
        Self::serve(shared, router)
    }

    /// Starts an instance called `name` on the current runtime that also serves `health`, a
    /// health service of the test's own (tonic-health's `health_reporter()`, say).
    pub fn start_with_health_service<H>(
        name: &str,
        behavior: Behavior,
        health: tonic_health::pb::health_server::HealthServer<H>,
    ) -> MemoryInstance
    where
        H: tonic_health::pb::health_server::Health,
    {
        let shared = Shared::new(name, behavior);
        let router = tonic::transport::Server::builder()
            .add_service(service(shared.clone()))
            .add_service(health);
        Self::serve(shared, router)
    }

    /// Serves `router` on the connections the channel opens to the instance.
    fn serve(shared: Arc<Shared>, router: tonic::transport::server::Router) -> MemoryInstance {
        let (conns, incoming) = mpsc::unbounded_channel();
        let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(incoming);
        let server = router.serve_with_incoming(incoming);
        let server = tokio::spawn(async move {
            let _ = server.await;
        });
        MemoryInstance {
            shared,
            conns,
            connects: Arc::new(AtomicUsize::new(0)),
            server,
        }
    }

    /// `builder` with this instance added (known by its name).
    pub fn add_to(&self, builder: tonic_balancer::Builder) -> tonic_balancer::Builder {
        let conns = self.conns.clone();
        let connects = self.connects.clone();
        let connector = tower::service_fn(move |_: http::Uri| {
            let conns = conns.clone();
            connects.fetch_add(1, Ordering::SeqCst);
            async move {
                let (client, server) = tokio::io::duplex(1 << 16);
                conns.send(Ok(server)).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "stopped")
                })?;
                Ok::<_, std::io::Error>(TokioIo::new(client))
            }
        });
        let endpoint = tonic::transport::Endpoint::from_static("http://memory.local");
        builder.endpoint_with_connector(&self.shared.name, endpoint, connector)
    }

    /// Sets what it does with each call from now on.
    pub fn set(&self, behavior: Behavior) {
        self.shared.set(behavior);
    }

    /// Calls that reached its handler.
    pub fn served(&self) -> u64 {
        self.shared.served()
    }

    /// Connections the channel opened to it.
    pub fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

impl Drop for MemoryInstance {
    fn drop(&mut self) {
        self.server.abort();
    }
}
