//! Instances of any tonic service on `127.0.0.1`: each a real server on a tokio runtime of
//! its own (so that killing one closes its connections for real), with a [`Faults`] handle
//! that scripts what it does, and controls over its connections (kill, restart on the same
//! port, GOAWAY, refusal).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tonic::service::Routes;

use crate::fault::Faults;

/// Server settings of an instance, beyond its service and its faults.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ServerOptions {
    /// Closes each connection (GOAWAY) once it is this old, as servers that rotate their
    /// connections do (gRPC's MAX_CONNECTION_AGE).
    pub max_connection_age: Option<Duration>,
    /// The HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS it announces: streams above it are refused
    /// by the transport.
    pub max_concurrent_streams: Option<u32>,
    /// Closes at once every connection beyond this many open ones, as a server or proxy with a
    /// connection limit does (the peer sees its connection closed before HTTP/2 starts).
    pub max_connections: Option<usize>,
    /// The handle of the faults around its service (a new one without it): give several
    /// instances the same handle to script them together, and count their calls together.
    pub faults: Option<Faults>,
    /// Serves TLS with this identity (certificate and key).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// Reports its load (ORCA) on every response through this handle (tonic-balancer's
    /// `OrcaLayer`, which also answers load probes). The report counts the calls its faults
    /// hold or slow down: they are the instance's calls in flight.
    #[cfg(feature = "orca")]
    #[cfg_attr(docsrs, doc(cfg(feature = "orca")))]
    pub orca: Option<tonic_balancer::orca::OrcaHandle>,
    /// Also streams `orca`'s reports out of band (tonic-balancer's `OobService`, on
    /// `OpenRcaService/StreamCoreMetrics`), at most once per this interval.
    #[cfg(feature = "orca")]
    #[cfg_attr(docsrs, doc(cfg(feature = "orca")))]
    pub orca_oob: Option<Duration>,
}

impl ServerOptions {
    /// No setting beyond tonic's defaults.
    pub fn new() -> ServerOptions {
        ServerOptions::default()
    }

    /// See [`max_connection_age`](ServerOptions::max_connection_age).
    pub fn max_connection_age(mut self, age: Duration) -> ServerOptions {
        self.max_connection_age = Some(age);
        self
    }

    /// See [`max_concurrent_streams`](ServerOptions::max_concurrent_streams).
    pub fn max_concurrent_streams(mut self, n: u32) -> ServerOptions {
        self.max_concurrent_streams = Some(n);
        self
    }

    /// See [`max_connections`](ServerOptions::max_connections).
    pub fn max_connections(mut self, n: usize) -> ServerOptions {
        self.max_connections = Some(n);
        self
    }

    /// See [`faults`](ServerOptions::faults).
    pub fn faults(mut self, faults: Faults) -> ServerOptions {
        self.faults = Some(faults);
        self
    }

    /// See [`tls`](ServerOptions::tls).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls(mut self, tls: tonic::transport::ServerTlsConfig) -> ServerOptions {
        self.tls = Some(tls);
        self
    }

    /// See [`orca`](ServerOptions::orca).
    #[cfg(feature = "orca")]
    #[cfg_attr(docsrs, doc(cfg(feature = "orca")))]
    pub fn orca(mut self, handle: tonic_balancer::orca::OrcaHandle) -> ServerOptions {
        self.orca = Some(handle);
        self
    }

    /// See [`orca_oob`](ServerOptions::orca_oob).
    #[cfg(feature = "orca")]
    #[cfg_attr(docsrs, doc(cfg(feature = "orca")))]
    pub fn orca_oob(mut self, min_interval: Duration) -> ServerOptions {
        self.orca_oob = Some(min_interval);
        self
    }
}

/// A gRPC service as tonic generates it (`GreeterServer<MyGreeter>`), or any service that
/// `tonic::service::Routes::new` takes.
pub trait GrpcService:
    tower::Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + tonic::server::NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> GrpcService for S where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// What an instance counts of its connections: survives a kill and a restart.
#[derive(Debug, Default)]
struct Connections {
    /// TCP connections accepted and served since the instance started.
    accepted: AtomicUsize,
    /// TCP connections open now.
    open: AtomicUsize,
    /// The most TCP connections that were open at once.
    peak: AtomicUsize,
    /// TCP connections closed unserved at once (refusing, or over `max_connections`).
    turned_away: AtomicUsize,
    /// Set: every new connection is closed at once, unserved.
    refusing: AtomicBool,
    /// Set: responses go without their per-call load report (out-of-band reports go on).
    #[cfg(feature = "orca")]
    per_call_reports_off: AtomicBool,
}

/// One instance: a tonic server for a service of the test's own, on its own runtime and a
/// port of `127.0.0.1` that stays its own across restarts, with [`Faults`] around the service.
///
/// ```no_run
/// # async fn doc() {
/// use tonic_balancer_fleet::{Instance, Script};
/// # let greeter_server = || tonic_health::server::health_reporter().1;
/// // Your service, as tonic generated it: `GreeterServer::new(MyGreeter)`.
/// let mut instance = Instance::start("a", greeter_server());
/// let channel = tonic::transport::Channel::from_shared(instance.uri())
///     .unwrap()
///     .connect_lazy();
/// instance.faults().set(Script::new().delay(std::time::Duration::from_millis(50)));
/// instance.kill(); // connections close, the port refuses
/// instance.restart(); // same port, same service, same faults
/// # drop(channel);
/// # }
/// ```
pub struct Instance {
    name: String,
    addr: SocketAddr,
    routes: Routes,
    faults: Faults,
    options: ServerOptions,
    conns: Arc<Connections>,
    running: Option<Running>,
}

/// A running server: its runtime's thread, and how to reach it.
struct Running {
    control: mpsc::UnboundedSender<Control>,
    thread: std::thread::JoinHandle<()>,
}

enum Control {
    /// Close every open connection gracefully (GOAWAY) and serve new ones.
    GoAway,
    /// Close the listening socket: new connections are refused.
    Close,
    /// Stop: the runtime shuts down, every connection drops.
    Kill,
}

impl Instance {
    /// Starts an instance called `name` serving `service` on a free port of `127.0.0.1`.
    pub fn start(name: impl Into<String>, service: impl GrpcService) -> Instance {
        Self::start_routes(name, Routes::new(service))
    }

    /// Starts an instance called `name` serving `routes` (several services: build them with
    /// `tonic::service::Routes::new(a).add_service(b)`) on a free port of `127.0.0.1`.
    pub fn start_routes(name: impl Into<String>, routes: Routes) -> Instance {
        Self::start_with(name, local(), routes, ServerOptions::default())
    }

    /// Starts an instance on `at` (port 0: a free one; any 127.x.y.z works on Linux's
    /// loopback) with these server settings.
    ///
    /// # Panics
    ///
    /// If `at` cannot be bound.
    pub fn start_with(
        name: impl Into<String>,
        at: SocketAddr,
        routes: Routes,
        options: ServerOptions,
    ) -> Instance {
        let listener = std::net::TcpListener::bind(at).unwrap_or_else(|e| panic!("bind {at}: {e}"));
        let addr = listener.local_addr().expect("a bound listener's address");
        let mut instance = Instance {
            name: name.into(),
            addr,
            routes,
            faults: options.faults.clone().unwrap_or_default(),
            options,
            conns: Arc::default(),
            running: None,
        };
        instance.serve(listener);
        instance
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URI: `http://127.0.0.1:port` (`https://` with TLS).
    pub fn uri(&self) -> String {
        #[cfg(feature = "tls")]
        if self.options.tls.is_some() {
            return format!("https://{}", self.addr);
        }
        format!("http://{}", self.addr)
    }

    /// A tonic `Endpoint` for its URI, to hand to a channel (a `BalancedChannel`'s builder,
    /// or tonic's own `Channel`).
    pub fn endpoint(&self) -> tonic::transport::Endpoint {
        tonic::transport::Endpoint::from_shared(self.uri()).expect("a URI of 127.0.0.1")
    }

    /// The handle of the faults around its service: what it does with each call, and what it
    /// saw.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Kills it: its runtime shuts down, every connection closes at once (calls in flight
    /// fail), and its port refuses connections until [`restart`](Instance::restart).
    pub fn kill(&mut self) {
        if let Some(running) = self.running.take() {
            let _ = running.control.send(Control::Kill);
            let _ = running.thread.join();
        }
    }

    /// Whether it is running (not killed).
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Starts it again on the same port (killing it first if it runs), with the same service,
    /// faults and settings.
    ///
    /// # Panics
    ///
    /// If the port cannot be bound again within 2 s: another process took it meanwhile.
    pub fn restart(&mut self) {
        self.kill();
        let mut tries = 0;
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(_) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("cannot bind {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    /// Closes every open connection gracefully, as a server that rotates its connections or
    /// begins to shut down does: each gets an HTTP/2 GOAWAY, its calls in flight finish, then
    /// it closes. New connections are served as before. Returns at once; the GOAWAYs go out
    /// shortly after.
    pub fn goaway(&self) {
        if let Some(running) = &self.running {
            let _ = running.control.send(Control::GoAway);
        }
    }

    /// Stops it as a server that shuts down gracefully does: it closes its listening socket
    /// (new connections are refused), sends GOAWAY on its open connections, lets their calls
    /// in flight finish, and is killed once they have closed, or after `limit` (wall time)
    /// with whatever is left. A [`restart`](Instance::restart) serves again.
    pub async fn stop_gracefully(&mut self, limit: Duration) {
        if let Some(running) = &self.running {
            let _ = running.control.send(Control::Close);
            let _ = running.control.send(Control::GoAway);
        }
        let start = std::time::Instant::now();
        while self.open_connections() > 0 && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.kill();
    }

    /// Turns new connections away (`true`: each is accepted and closed at once, before HTTP/2
    /// starts, as a server or proxy at its connection limit does; the client may have written
    /// its first request already, and sees it fail on a reset connection) or serves them again
    /// (`false`). Open connections go on. To refuse connections at the TCP handshake, stop the
    /// instance ([`kill`](Instance::kill), [`stop_gracefully`](Instance::stop_gracefully)).
    pub fn refuse_connections(&self, refuse: bool) {
        self.conns.refusing.store(refuse, Ordering::SeqCst);
    }

    /// Takes the per-call load reports off its responses (`false`) or puts them back (`true`,
    /// as it starts); out-of-band reports and the counts behind them go on. For
    /// [`ServerOptions::orca`].
    #[cfg(feature = "orca")]
    #[cfg_attr(docsrs, doc(cfg(feature = "orca")))]
    pub fn set_per_call_reports(&self, on: bool) {
        self.conns.per_call_reports_off.store(!on, Ordering::SeqCst);
    }

    /// TCP connections it accepted and served since it started.
    pub fn connections(&self) -> usize {
        self.conns.accepted.load(Ordering::SeqCst)
    }

    /// TCP connections open now.
    pub fn open_connections(&self) -> usize {
        self.conns.open.load(Ordering::SeqCst)
    }

    /// The most TCP connections that were open at once.
    pub fn peak_connections(&self) -> usize {
        self.conns.peak.load(Ordering::SeqCst)
    }

    /// TCP connections closed unserved at once (refused, or over
    /// [`ServerOptions::max_connections`]).
    pub fn turned_away(&self) -> usize {
        self.conns.turned_away.load(Ordering::SeqCst)
    }

    fn serve(&mut self, listener: std::net::TcpListener) {
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let (control, mut controls) = mpsc::unbounded_channel();
        let routes = self.routes.clone();
        let faults = self.faults.clone();
        let options = self.options.clone();
        let conns = self.conns.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fleet-{}", self.name))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the instance");
                rt.block_on(async move {
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                    let generation = Generation::start(&routes, &faults, &options, &conns);
                    let current = Arc::new(Mutex::new(generation));
                    let accepting = current.clone();
                    let conns_of = conns.clone();
                    let max_connections = options.max_connections.unwrap_or(usize::MAX);
                    let accepting = tokio::spawn(async move {
                        while let Ok((io, _)) = listener.accept().await {
                            let refused = conns.refusing.load(Ordering::SeqCst)
                                || conns.open.load(Ordering::SeqCst) >= max_connections;
                            if refused {
                                // Closed unserved.
                                conns.turned_away.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                            // TCP_NODELAY, as on a listener tonic opens itself: without it a
                            // second response on a connection waits for the peer's delayed
                            // ACK (40 ms).
                            let _ = io.set_nodelay(true);
                            let io = Counted::new(io, conns.clone());
                            let lock = accepting.lock().expect("the generation's lock");
                            let _ = lock.conns.send(Ok(io));
                        }
                    });
                    while let Some(control) = controls.recv().await {
                        match control {
                            Control::GoAway => {
                                let next = Generation::start(&routes, &faults, &options, &conns_of);
                                let old = std::mem::replace(
                                    &mut *current.lock().expect("the generation's lock"),
                                    next,
                                );
                                // Its server sends GOAWAY on each connection and ends once
                                // their calls have.
                                let _ = old.goaway.send(());
                            }
                            Control::Close => accepting.abort(),
                            Control::Kill => break,
                        }
                    }
                });
                // Drops every connection task: the peers see their connections close.
                rt.shutdown_background();
            })
            .expect("a thread for the instance");
        self.running = Some(Running { control, thread });
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

/// `127.0.0.1:0`.
fn local() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// One server over the instance's connections from some moment on: a GOAWAY ends it (it
/// drains its connections) and the next one takes the new connections.
struct Generation {
    conns: mpsc::UnboundedSender<std::io::Result<Counted>>,
    goaway: oneshot::Sender<()>,
}

impl Generation {
    fn start(
        routes: &Routes,
        faults: &Faults,
        options: &ServerOptions,
        counts: &Arc<Connections>,
    ) -> Generation {
        let (conns, incoming) = mpsc::unbounded_channel();
        let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(incoming);
        let (goaway, drain) = oneshot::channel::<()>();
        // Tests cancel many calls at once; hyper's default (20 reset streams pending accept)
        // would close the connection under them.
        let mut builder = tonic::transport::Server::builder()
            .http2_max_pending_accept_reset_streams(Some(100_000))
            .max_concurrent_streams(options.max_concurrent_streams);
        if let Some(age) = options.max_connection_age {
            builder = builder.max_connection_age(age);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = options.tls.clone() {
            builder = builder
                .tls_config(tls)
                .expect("the instance's TLS identity");
        }
        // Load reports outside the faults: a call a fault holds is in flight at the instance.
        #[cfg(feature = "orca")]
        let (orca, routes) = orca::layers(options, counts, routes.clone());
        #[cfg(not(feature = "orca"))]
        let (orca, routes) = {
            let _ = counts;
            (tower::layer::util::Identity::new(), routes.clone())
        };
        let server = builder
            .layer(orca)
            .layer(tower::util::MapResponseLayer::new(
                |r: http::Response<crate::fault::FaultBody<tonic::body::Body>>| {
                    r.map(tonic::body::Body::new)
                },
            ))
            .layer(faults.layer())
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = drain.await;
            });
        tokio::spawn(server);
        Generation { conns, goaway }
    }
}

/// Load reports (ORCA) on an instance's responses and out of band.
#[cfg(feature = "orca")]
mod orca {
    use std::pin::Pin;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tonic::service::Routes;
    use tonic_balancer::orca::{OobService, OrcaBody, OrcaLayer};

    use super::{Connections, ServerOptions};

    /// The trailer (and trailers-only header) of per-call load reports.
    const REPORT: &str = "endpoint-load-metrics-bin";

    type Response = http::Response<OrcaBody<tonic::body::Body>>;

    /// The layer that reports the load (none without `options.orca`), its responses' reports
    /// taken off while the instance says so; and `routes` with the out-of-band service added
    /// if `options.orca_oob` asks for it.
    #[allow(clippy::type_complexity)]
    pub(super) fn layers(
        options: &ServerOptions,
        conns: &Arc<Connections>,
        routes: Routes,
    ) -> (
        tower::util::Either<
            tower::layer::util::Stack<
                OrcaLayer,
                tower::layer::util::Stack<
                    tower::util::MapResponseLayer<
                        impl Fn(Response) -> http::Response<tonic::body::Body> + Clone,
                    >,
                    tower::layer::util::Identity,
                >,
            >,
            tower::layer::util::Identity,
        >,
        Routes,
    ) {
        let routes = match (&options.orca, options.orca_oob) {
            (Some(handle), Some(min)) => {
                routes.add_service(OobService::new(handle.clone()).min_interval(min))
            }
            _ => routes,
        };
        let conns = conns.clone();
        let layer = tower::util::option_layer(options.orca.clone().map(|handle| {
            tower::ServiceBuilder::new()
                .map_response(move |r: Response| {
                    if conns.per_call_reports_off.load(Ordering::Relaxed) {
                        let mut r =
                            r.map(|b| tonic::body::Body::new(NoReport(tonic::body::Body::new(b))));
                        r.headers_mut().remove(REPORT);
                        r
                    } else {
                        r.map(tonic::body::Body::new)
                    }
                })
                .layer(OrcaLayer::new(handle))
                .into_inner()
        }));
        (layer, routes)
    }

    /// A response body whose trailers lose their per-call load report.
    struct NoReport(tonic::body::Body);

    impl http_body::Body for NoReport {
        type Data = bytes::Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
            let mut polled = Pin::new(&mut self.0).poll_frame(cx);
            if let Poll::Ready(Some(Ok(frame))) = &mut polled {
                if let Some(t) = frame.trailers_mut() {
                    t.remove(REPORT);
                }
            }
            polled
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_end_stream()
        }
    }
}

/// A server's TCP connection, counted while it is open.
struct Counted {
    io: tokio::net::TcpStream,
    conns: Arc<Connections>,
}

impl Counted {
    fn new(io: tokio::net::TcpStream, conns: Arc<Connections>) -> Counted {
        conns.accepted.fetch_add(1, Ordering::SeqCst);
        let open = conns.open.fetch_add(1, Ordering::SeqCst) + 1;
        conns.peak.fetch_max(open, Ordering::SeqCst);
        Counted { io, conns }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.conns.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Several instances of one service, started together and stopped when dropped.
///
/// ```no_run
/// # async fn doc() {
/// use tonic_balancer_fleet::{Fleet, Script};
/// # let greeter_server = || tonic_health::server::health_reporter().1;
/// let fleet = Fleet::start(3, |_| greeter_server());
/// let channel = tonic_balancer::BalancedChannel::builder()
///     .endpoints(fleet.endpoints())
///     .build()
///     .unwrap();
/// fleet[1].faults().set(Script::new().hang()); // one instance hangs
/// # drop(channel);
/// # }
/// ```
#[derive(Debug)]
pub struct Fleet {
    instances: Vec<Instance>,
}

impl Fleet {
    /// Starts `n` instances, `i0` to `i{n-1}`, each serving what `service(i)` makes, on free
    /// ports of `127.0.0.1`.
    pub fn start<S: GrpcService>(n: usize, mut service: impl FnMut(usize) -> S) -> Fleet {
        Self::start_with(n, |i| (Routes::new(service(i)), ServerOptions::default()))
    }

    /// Starts `n` instances, `i0` to `i{n-1}`, each serving the routes with the settings that
    /// `make(i)` gives (called once per instance, so that what must be an instance's own, such
    /// as a load-report handle, is).
    pub fn start_with(n: usize, mut make: impl FnMut(usize) -> (Routes, ServerOptions)) -> Fleet {
        Fleet {
            instances: (0..n)
                .map(|i| {
                    let (routes, options) = make(i);
                    Instance::start_with(format!("i{i}"), local(), routes, options)
                })
                .collect(),
        }
    }

    /// A fleet of these instances.
    pub fn from_instances(instances: Vec<Instance>) -> Fleet {
        Fleet { instances }
    }

    /// The instances' URIs, in order.
    pub fn uris(&self) -> Vec<String> {
        self.instances.iter().map(Instance::uri).collect()
    }

    /// The instances' endpoints, in order.
    pub fn endpoints(&self) -> Vec<tonic::transport::Endpoint> {
        self.instances.iter().map(Instance::endpoint).collect()
    }

    /// The instance called `name`.
    ///
    /// # Panics
    ///
    /// If there is none, naming it.
    pub fn by_name(&self, name: &str) -> &Instance {
        self.instances
            .iter()
            .find(|i| i.name() == name)
            .unwrap_or_else(|| panic!("no instance called {name}"))
    }

    /// The instance at `uri` (a trailing `/` ignored), if any.
    pub fn by_uri(&self, uri: &str) -> Option<&Instance> {
        let uri = uri.trim_end_matches('/');
        self.instances.iter().find(|i| i.uri() == uri)
    }

    /// The calls each instance's faults layer saw, in order.
    pub fn calls(&self) -> Vec<u64> {
        self.instances.iter().map(|i| i.faults().calls()).collect()
    }

    /// The instances.
    pub fn instances(&self) -> &[Instance] {
        &self.instances
    }

    /// The instances, to kill and restart.
    pub fn instances_mut(&mut self) -> &mut [Instance] {
        &mut self.instances
    }

    /// How many instances.
    pub fn len(&self) -> usize {
        self.instances.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
}

impl std::ops::Index<usize> for Fleet {
    type Output = Instance;

    fn index(&self, i: usize) -> &Instance {
        &self.instances[i]
    }
}

impl std::ops::IndexMut<usize> for Fleet {
    fn index_mut(&mut self, i: usize) -> &mut Instance {
        &mut self.instances[i]
    }
}
