//! The test fleet: real tonic servers on `127.0.0.1`, each on a tokio runtime of its own (so
//! that stopping one closes its connections for real), each with a scripted behaviour that the
//! test changes while it runs.
//!
//! Shared by every test file (`mod fleet;`) and by the examples (`#[path]`).
#![allow(dead_code)]

pub mod dns;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{oneshot, Semaphore};
use tonic::{Code, Request, Response, Status, Streaming};

pub mod pb {
    tonic::include_proto!("fleet.v1");
}

use pb::fleet_server::{Fleet as FleetService, FleetServer};
use pb::{Reply, Req};

/// What an instance does with each call.
#[derive(Debug, Clone, PartialEq)]
pub enum Behavior {
    /// Answers at once.
    Ok,
    /// Answers after this delay.
    Delay(Duration),
    /// Holds the call until the test releases it ([`Instance::release`]).
    Hold,
    /// Answers at once with this status.
    Fail(Code),
    /// Never answers.
    Hang,
    /// Service time grows with the calls it is serving: `base + per_call × (in flight - 1)`.
    Overload { base: Duration, per_call: Duration },
    /// Answers at once with this status, message and one trailer metadata entry (`key`:
    /// `value`), as a server that says why it refuses.
    FailWith {
        code: Code,
        message: String,
        key: &'static str,
        value: String,
    },
    /// Reads the whole request stream, then answers with this status before any response
    /// message: a trailers-only answer for every kind of call, bidi included (where `Fail`
    /// answers each message first).
    FailAfterInput(Code),
}

/// The shared state of one instance: survives a stop and a restart.
#[derive(Debug)]
pub struct Shared {
    pub name: String,
    behavior: Mutex<Behavior>,
    release: Semaphore,
    /// Calls that reached the handler.
    pub served: AtomicU64,
    /// Calls in the handler now.
    pub active: AtomicUsize,
    /// Calls waiting in `Hold` now.
    pub held: AtomicUsize,
    /// What the instance answers to `grpc.health.v1.Health/Check` (true: SERVING).
    pub serving: std::sync::atomic::AtomicBool,
    /// Health checks answered.
    pub health_checks: AtomicU64,
    /// When set, health checks get no answer (the check pends until the caller gives up).
    pub health_hang: std::sync::atomic::AtomicBool,
}

/// The standard health service, answering from [`Shared::serving`].
struct HealthSvc(Arc<Shared>);

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for HealthSvc {
    async fn check(
        &self,
        _req: Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<Response<tonic_health::pb::HealthCheckResponse>, Status> {
        use tonic_health::pb::health_check_response::ServingStatus;
        self.0.health_checks.fetch_add(1, Ordering::SeqCst);
        if self.0.health_hang.load(Ordering::SeqCst) {
            return std::future::pending().await;
        }
        let status = if self.0.serving.load(Ordering::SeqCst) {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(tonic_health::pb::HealthCheckResponse {
            status: status as i32,
        }))
    }

    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<tonic_health::pb::HealthCheckResponse, Status>> + Send>>;

    async fn watch(
        &self,
        _req: Request<tonic_health::pb::HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("watch"))
    }
}

struct Svc(Arc<Shared>);

struct Active<'a>(&'a Shared);
impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Shared {
    fn enter(&self) -> Active<'_> {
        self.served.fetch_add(1, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
        Active(self)
    }

    /// Applies the behaviour: waits as scripted, then the status to answer with, if not OK.
    async fn behave(&self) -> Result<(), Status> {
        let b = self.behavior.lock().unwrap().clone();
        match b {
            Behavior::Ok => Ok(()),
            Behavior::Delay(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Behavior::Hold => {
                self.held.fetch_add(1, Ordering::SeqCst);
                struct Held<'a>(&'a AtomicUsize);
                impl Drop for Held<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::SeqCst);
                    }
                }
                let _h = Held(&self.held);
                self.release
                    .acquire()
                    .await
                    .expect("semaphore open")
                    .forget();
                Ok(())
            }
            Behavior::Fail(code) | Behavior::FailAfterInput(code) => {
                Err(Status::new(code, format!("{} scripted to fail", self.name)))
            }
            Behavior::FailWith {
                code,
                message,
                key,
                value,
            } => {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert(key, value.parse().expect("ASCII metadata value"));
                Err(Status::with_metadata(code, message, md))
            }
            Behavior::Hang => std::future::pending().await,
            Behavior::Overload { base, per_call } => {
                let n = self.active.load(Ordering::SeqCst).saturating_sub(1) as u32;
                tokio::time::sleep(base + per_call * n).await;
                Ok(())
            }
        }
    }

    fn reply(&self, id: u64, seq: u32) -> Reply {
        Reply {
            instance: self.name.clone(),
            id,
            seq,
            payload: Vec::new(),
        }
    }
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<Reply, Status>> + Send>>;

#[tonic::async_trait]
impl FleetService for Svc {
    async fn unary(&self, req: Request<Req>) -> Result<Response<Reply>, Status> {
        let _a = self.0.enter();
        self.0.behave().await?;
        let req = req.into_inner();
        let mut r = self.0.reply(req.id, 0);
        r.payload = req.payload;
        Ok(Response::new(r))
    }

    type ServerStreamStream = ReplyStream;

    /// Sends `count` replies, then behaves (a held stream has sent everything but its
    /// trailers), then ends.
    async fn server_stream(&self, req: Request<Req>) -> Result<Response<ReplyStream>, Status> {
        let shared = self.0.clone();
        let req = req.into_inner();
        let s = async_stream(move |tx| async move {
            let _a = shared.enter();
            for seq in 0..req.count {
                if tx.send(Ok(shared.reply(req.id, seq))).await.is_err() {
                    return;
                }
            }
            if let Err(status) = shared.behave().await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(s))
    }

    async fn client_stream(&self, req: Request<Streaming<Req>>) -> Result<Response<Reply>, Status> {
        let _a = self.0.enter();
        let mut stream = req.into_inner();
        let mut n = 0u32;
        let mut last = 0;
        while let Some(m) = stream.message().await? {
            n += 1;
            last = m.id;
        }
        self.0.behave().await?;
        Ok(Response::new(self.0.reply(last, n)))
    }

    type BidiStream = ReplyStream;

    async fn bidi(&self, req: Request<Streaming<Req>>) -> Result<Response<ReplyStream>, Status> {
        let shared = self.0.clone();
        let mut input = req.into_inner();
        let scripted = shared.behavior.lock().unwrap().clone();
        if let Behavior::FailAfterInput(_) = scripted {
            // Every message read, then the status instead of a response (trailers-only).
            let _a = shared.enter();
            while input.message().await?.is_some() {}
            shared.behave().await?;
            // The behaviour changed meanwhile to one that answers: no message to answer.
            return Ok(Response::new(Box::pin(futures::stream::empty())));
        }
        let s = async_stream(move |tx| async move {
            let _a = shared.enter();
            let mut seq = 0;
            loop {
                match input.message().await {
                    Ok(Some(m)) => {
                        if tx.send(Ok(shared.reply(m.id, seq))).await.is_err() {
                            return;
                        }
                        seq += 1;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            if let Err(status) = shared.behave().await {
                let _ = tx.send(Err(status)).await;
            }
        });
        Ok(Response::new(s))
    }
}

/// A stream fed by a task: the task gets the sender.
fn async_stream<F, Fut>(f: F) -> ReplyStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Reply, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Server settings of an instance, beyond its behaviour.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Closes each connection (GOAWAY) once it is this old, as servers that rotate their
    /// connections do (gRPC's MAX_CONNECTION_AGE).
    pub max_connection_age: Option<Duration>,
    /// The HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS it announces.
    pub max_concurrent_streams: Option<u32>,
}

/// One instance: a server on its own runtime, on a port that stays its own across restarts.
pub struct Instance {
    pub shared: Arc<Shared>,
    pub addr: SocketAddr,
    options: ServerOptions,
    stop: Option<(oneshot::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Instance {
    /// Starts an instance on a free port of 127.0.0.1.
    pub fn start(name: &str, behavior: Behavior) -> Instance {
        Self::start_at(name, "127.0.0.1:0".parse().unwrap(), behavior)
    }

    /// Starts an instance on this address (any 127.x.y.z works on Linux loopback).
    pub fn start_at(name: &str, at: SocketAddr, behavior: Behavior) -> Instance {
        Self::start_with(name, at, behavior, ServerOptions::default())
    }

    /// Starts an instance on this address with these server settings.
    pub fn start_with(
        name: &str,
        at: SocketAddr,
        behavior: Behavior,
        options: ServerOptions,
    ) -> Instance {
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            behavior: Mutex::new(behavior),
            release: Semaphore::new(0),
            served: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            serving: std::sync::atomic::AtomicBool::new(true),
            health_checks: AtomicU64::new(0),
            health_hang: std::sync::atomic::AtomicBool::new(false),
        });
        let listener = std::net::TcpListener::bind(at).unwrap_or_else(|e| panic!("bind {at}: {e}"));
        let addr = listener.local_addr().unwrap();
        let mut inst = Instance {
            shared,
            addr,
            options,
            stop: None,
        };
        inst.serve(listener);
        inst
    }

    fn serve(&mut self, listener: std::net::TcpListener) {
        listener.set_nonblocking(true).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let shared = self.shared.clone();
        let options = self.options.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fleet-{}", shared.name))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    // TCP_NODELAY, as on a listener tonic opens itself: without it a second
                    // response on a connection waits for the client's delayed ACK (40 ms).
                    let incoming = tonic::transport::server::TcpIncoming::from(listener)
                        .with_nodelay(Some(true));
                    // Tests cancel many calls at once; hyper's default (20 reset streams
                    // pending accept) would close the connection under them.
                    let mut builder = tonic::transport::Server::builder()
                        .http2_max_pending_accept_reset_streams(Some(100_000))
                        .max_concurrent_streams(options.max_concurrent_streams);
                    if let Some(age) = options.max_connection_age {
                        builder = builder.max_connection_age(age);
                    }
                    let server = builder
                        .add_service(FleetServer::new(Svc(shared.clone())))
                        .add_service(tonic_health::pb::health_server::HealthServer::new(
                            HealthSvc(shared),
                        ))
                        .serve_with_incoming(incoming);
                    tokio::select! {
                        _ = server => {}
                        _ = rx => {}
                    }
                });
                // Drops every connection task: the peers see their connections close.
                rt.shutdown_background();
            })
            .unwrap();
        self.stop = Some((tx, thread));
    }

    /// The `http://` URI of this instance.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn set(&self, behavior: Behavior) {
        *self.shared.behavior.lock().unwrap() = behavior;
    }

    /// Sets what the instance answers to health checks.
    pub fn set_serving(&self, serving: bool) {
        self.shared.serving.store(serving, Ordering::SeqCst);
    }

    /// Makes health checks hang (no answer, the connection stays up) or answer again.
    pub fn set_health_hangs(&self, hang: bool) {
        self.shared.health_hang.store(hang, Ordering::SeqCst);
    }

    pub fn health_checks(&self) -> u64 {
        self.shared.health_checks.load(Ordering::SeqCst)
    }

    /// Lets `n` held calls go on.
    pub fn release(&self, n: usize) {
        self.shared.release.add_permits(n);
    }

    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::SeqCst)
    }

    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    pub fn active(&self) -> usize {
        self.shared.active.load(Ordering::SeqCst)
    }

    /// Kills the instance: its runtime shuts down and its connections close.
    pub fn stop(&mut self) {
        if let Some((tx, thread)) = self.stop.take() {
            let _ = tx.send(());
            let _ = thread.join();
        }
    }

    pub fn is_running(&self) -> bool {
        self.stop.is_some()
    }

    /// Starts the instance again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        // The port was ours a moment ago; another process may take it in between, rarely.
        let mut tries = 0;
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("cannot bind {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Several instances.
pub struct Fleet {
    pub instances: Vec<Instance>,
}

impl Fleet {
    pub fn start(n: usize, behavior: Behavior) -> Fleet {
        Fleet {
            instances: (0..n)
                .map(|i| Instance::start(&format!("i{i}"), behavior.clone()))
                .collect(),
        }
    }

    pub fn uris(&self) -> Vec<String> {
        self.instances.iter().map(Instance::uri).collect()
    }

    pub fn served(&self) -> Vec<u64> {
        self.instances.iter().map(Instance::served).collect()
    }

    pub fn held(&self) -> usize {
        self.instances.iter().map(Instance::held).sum()
    }

    pub fn release_all(&self, n: usize) {
        for i in &self.instances {
            i.release(n);
        }
    }

    pub fn by_name(&self, name: &str) -> &Instance {
        self.instances
            .iter()
            .find(|i| i.name() == name)
            .expect("no such instance")
    }
}

/// An address on 127.0.0.1 that refuses every connection for as long as the test process
/// lives: a socket bound to the port without listening answers each SYN with a reset, and keeps
/// any other socket (a parallel test's server, the next call of this function) from taking the
/// port. A port that was bound and released could be handed out again at once.
pub fn unreachable_uri() -> String {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).expect("bind");
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    // Held for the life of the process: the port stays ours and refusing.
    std::mem::forget(socket);
    format!("http://{addr}")
}

/// An address on 127.0.0.1 where a connection never completes, as on a host that drops SYNs
/// (a black hole): a listener with a backlog of 0 whose queue is already full, so the kernel
/// drops every further SYN. Held for the life of the process.
pub fn black_hole_uri() -> String {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&any.into()).expect("bind");
    socket.listen(0).expect("listen");
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
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

/// Waits until `cond` holds, polling every millisecond; panics after `limit` (generous: the
/// machine may be loaded) naming `what`.
pub async fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The sum of the channel's in-flight counts.
pub fn total_in_flight(ch: &tonic_balancer::BalancedChannel) -> usize {
    ch.endpoints().iter().map(|e| e.in_flight()).sum()
}

/// Sends `n` unary calls one after the other; each must succeed with its own reply. Returns
/// the names of the instances that answered, in order.
pub async fn calls(
    client: &mut pb::fleet_client::FleetClient<tonic_balancer::BalancedChannel>,
    n: u64,
) -> Vec<String> {
    let mut names = Vec::with_capacity(n as usize);
    for id in 0..n {
        let reply = client
            .unary(Req {
                id,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("call {id} failed: {e:?}"))
            .into_inner();
        assert_eq!(reply.id, id, "the reply of another call");
        names.push(reply.instance);
    }
    names
}
