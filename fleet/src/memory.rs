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

use super::{service, Behavior, Shared};

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
    /// Starts an instance called `name` on the current runtime.
    pub fn start(name: &str, behavior: Behavior) -> MemoryInstance {
        let shared = Shared::new(name, behavior);
        let (conns, incoming) = mpsc::unbounded_channel();
        let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(incoming);
        let server = tonic::transport::Server::builder()
            .add_service(service(shared.clone()))
            .serve_with_incoming(incoming);
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
