//! [`Builder`]: the instances and the settings of a [`BalancedChannel`], checked in
//! [`Builder::build`].

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::time::Instant;

use tonic::transport::Endpoint;

use crate::call::shared::Shared;
use crate::discover::{Resolve, Template};
use crate::error::Error;
use crate::health::Ejection;
#[cfg(feature = "health-check")]
use crate::health::HealthCheck;
use crate::hooks::Hooks;
use crate::instance::{Backoff, Context};
use crate::retry::{Budget, RetryPolicy, DEFAULT_MAX_REPLAY_BODY};
use crate::set::Set;
use crate::target::{Key, Target};
use crate::{BalancedChannel, Strategy};

/// The connect timeout that [`Builder::uri`] and [`BalancedChannel::from_static`] give each
/// instance (tonic has none by default, and a silent address would hold calls for minutes).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one lookup of a discovery source may take unless
/// [`Builder::discovery_timeout`] says otherwise.
pub const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`BalancedChannel`]: instances (as tonic [`Endpoint`]s, so that TLS, timeouts,
/// keep-alive and every other per-connection setting come from tonic), the strategy, and the
/// failure handling.
///
/// ```no_run
/// use std::time::Duration;
/// use tonic::transport::Endpoint;
/// use tonic_balancer::{BalancedChannel, Strategy};
///
/// # async fn demo() -> Result<(), tonic_balancer::Error> {
/// let channel = BalancedChannel::builder()
///     .endpoint(
///         Endpoint::from_static("http://10.0.0.7:50051")
///             .connect_timeout(Duration::from_secs(1))
///             .http2_keep_alive_interval(Duration::from_secs(30)),
///     )
///     .uri("http://10.0.0.8:50051")
///     .strategy(Strategy::LeastPending)
///     .build()?;
/// # let _ = channel; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Builder {
    endpoints: Vec<Target>,
    error: Option<Error>,
    strategy: Strategy,
    backoff: Backoff,
    ejection: Ejection,
    transparent_retry: bool,
    retry: Option<RetryPolicy>,
    hedging: Vec<crate::HedgingPolicy>,
    #[cfg(feature = "health-check")]
    health_check: Option<HealthCheck>,
    max_replay_body: usize,
    latency_expiry: Duration,
    latency_decay: Duration,
    discovery: Option<DiscoverySource>,
    discovery_interval: Duration,
    discovery_timeout: Duration,
    slow_start: Option<Duration>,
    template: Option<Template>,
    conns: crate::instance::conns::Limits,
    load_report_max_age: Duration,
    load_reports_oob: Option<Duration>,
    wrr: crate::instance::load::WrrConfig,
    subset: Option<usize>,
    subset_client: Option<(usize, usize)>,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: crate::metrics::LabelSettings,
}

/// Where discovery gets its addresses: built in `build()` so that errors surface there.
#[derive(Clone)]
enum DiscoverySource {
    Dns {
        target: String,
        #[cfg(feature = "hickory-dns")]
        settings: Option<crate::DnsSettings>,
    },
    Custom(Arc<dyn Resolve>),
    /// A stream of changes (taken by the first `build()`: a stream cannot be cloned).
    Push(Arc<std::sync::Mutex<Option<PushTask>>>),
}

/// Starts the task that applies a stream of changes to the set.
type PushTask = Box<
    dyn FnOnce(
            Weak<Shared>,
            Duration,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send,
>;

impl std::fmt::Debug for DiscoverySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiscoverySource::Dns { target, .. } => write!(f, "Dns({target})"),
            DiscoverySource::Custom(r) => write!(f, "Custom({})", r.name()),
            DiscoverySource::Push(_) => f.write_str("Push"),
        }
    }
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field(
                "endpoints",
                &self.endpoints.iter().map(|t| &t.name).collect::<Vec<_>>(),
            )
            .field("strategy", &self.strategy)
            .field("discovery", &self.discovery)
            .finish_non_exhaustive()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// A builder with no instances and the default settings.
    pub fn new() -> Builder {
        Builder {
            endpoints: Vec::new(),
            error: None,
            strategy: Strategy::default(),
            backoff: Backoff::default(),
            ejection: Ejection::default(),
            transparent_retry: true,
            retry: None,
            hedging: Vec::new(),
            #[cfg(feature = "health-check")]
            health_check: None,
            max_replay_body: DEFAULT_MAX_REPLAY_BODY,
            latency_expiry: Duration::from_secs(5),
            load_report_max_age: crate::instance::load::DEFAULT_LOAD_REPORT_MAX_AGE,
            wrr: crate::instance::load::WrrConfig::default(),
            load_reports_oob: None,
            latency_decay: Duration::from_secs(1),
            discovery: None,
            slow_start: None,
            discovery_interval: Duration::from_secs(30),
            discovery_timeout: DEFAULT_DISCOVERY_TIMEOUT,
            template: None,
            conns: crate::instance::conns::Limits::default(),
            subset: None,
            subset_client: None,
            #[cfg(feature = "metrics")]
            metrics: Default::default(),
        }
    }

    /// Discovers the instances in DNS: `target` is `host:port` (such as
    /// `my-service.default.svc.cluster.local:50051`, the name of a Kubernetes headless
    /// Service), resolved by the system's resolver into one instance per address (A and AAAA
    /// records), again every [`discovery_interval`](Builder::discovery_interval). Instances
    /// given with [`endpoint`](Builder::endpoint) or [`uri`](Builder::uri) are replaced by the
    /// first answer. See the [`discover`](crate::discover) module for the behaviour on failures.
    ///
    /// Each instance is known by its address (`http://10.0.0.7:50051` in
    /// [`endpoints`](crate::BalancedChannel::endpoints) and [`ServedBy`](crate::ServedBy)) and
    /// its connection goes there, while its `Endpoint` carries the name, as one tonic endpoint
    /// for the name would: requests carry `:authority: host:port`, and with TLS (target
    /// `https://host:port` and an [`endpoint_template`](Builder::endpoint_template) that sets
    /// `tls_config`) the certificate is checked against the name, not the address.
    ///
    /// ```no_run
    /// # async fn demo(ca_pem: &str) -> Result<(), tonic_balancer::Error> {
    /// use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    ///
    /// let ca = Certificate::from_pem(ca_pem);
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .dns("https://my-service.internal:443")
    ///     // `uri` is https://my-service.internal:443: the TLS server name is the service's.
    ///     .endpoint_template(move |uri| {
    ///         Endpoint::from(uri)
    ///             .tls_config(ClientTlsConfig::new().ca_certificate(ca.clone()))
    ///             .expect("valid TLS settings")
    ///     })
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn dns(mut self, target: &str) -> Builder {
        self.discovery = Some(DiscoverySource::Dns {
            target: target.to_owned(),
            #[cfg(feature = "hickory-dns")]
            settings: None,
        });
        self
    }

    /// As [`dns`](Builder::dns), asking the name servers of `settings` (feature
    /// `hickory-dns`): your own name servers, timeout and attempts.
    ///
    /// ```
    /// use tonic_balancer::{BalancedChannel, DnsSettings};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// let channel = BalancedChannel::builder()
    ///     .dns_with(
    ///         "my-service.internal:50051",
    ///         DnsSettings::name_servers(["10.0.0.10:53".parse().unwrap()]),
    ///     )
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    #[cfg(feature = "hickory-dns")]
    pub fn dns_with(mut self, target: &str, settings: crate::DnsSettings) -> Builder {
        self.discovery = Some(DiscoverySource::Dns {
            target: target.to_owned(),
            settings: Some(settings),
        });
        self
    }

    /// Discovers the instances with a source of your own (a registry, a control plane).
    pub fn resolver(mut self, source: impl Resolve) -> Builder {
        self.discovery = Some(DiscoverySource::Custom(Arc::new(source)));
        self
    }

    /// Follows a source that pushes changes (tower's `Discover` shape: any `TryStream` of
    /// [`Change`](tower::discover::Change)`<K, Endpoint>`), as service registries with watches
    /// deliver them (Consul, Kubernetes EndpointSlices, etcd): each `Insert(key, endpoint)`
    /// adds the instance with its own settings (replacing an instance of the same URI, and the
    /// URI the key had before); each `Remove(key)` drains the key's instance. Until the first
    /// change arrives, calls wait for it, for at most the
    /// [`discovery_timeout`](Builder::discovery_timeout). An error of the source is logged and
    /// the set kept; when the source ends, the set stays as it is.
    ///
    /// ```
    /// use tonic::transport::Endpoint;
    /// use tower::discover::Change;
    /// use tonic_balancer::BalancedChannel;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// let (tx, rx) = tokio::sync::mpsc::channel::<Change<&str, Endpoint>>(16);
    /// // Any stream of Result<Change<K, Endpoint>, E>: here, an mpsc receiver's.
    /// let changes = futures::stream::unfold(rx, |mut rx| async move {
    ///     rx.recv().await.map(|c| (Ok::<_, std::convert::Infallible>(c), rx))
    /// });
    /// let channel = BalancedChannel::builder().discover(changes).build()?;
    /// tx.send(Change::Insert("pod-a", Endpoint::from_static("http://10.0.0.7:50051"))).await.ok();
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn discover<D, K>(self, source: D) -> Builder
    where
        D: tower::discover::Discover<Key = K, Service = Endpoint> + Send + 'static,
        D::Error: Into<tower::BoxError>,
        K: std::hash::Hash + Eq + Clone + Send + 'static,
    {
        let mut source = Box::pin(source);
        self.push(
            Box::new(move |cx| {
                source
                    .as_mut()
                    .poll_discover(cx)
                    .map(|item| item.map(|r| r.map_err(Into::into)))
            }),
            "discovery stream",
        )
    }

    /// Follows the changes that `next` yields (see [`discover`](Builder::discover)).
    pub(crate) fn push<K>(
        mut self,
        next: crate::discover::push::Next<K>,
        name: &'static str,
    ) -> Builder
    where
        K: std::hash::Hash + Eq + Clone + Send + 'static,
    {
        let task: PushTask = Box::new(move |pool, first_within| {
            Box::pin(crate::discover::push::run(
                pool,
                next,
                name.to_owned(),
                first_within,
            ))
        });
        self.discovery = Some(DiscoverySource::Push(Arc::new(std::sync::Mutex::new(
            Some(task),
        ))));
        self
    }

    /// How often discovery asks its source again (default 30 s; sooner, at most once a
    /// second, when an instance cannot be reached).
    pub fn discovery_interval(mut self, every: Duration) -> Builder {
        self.discovery_interval = every;
        self
    }

    /// How long one lookup of the discovery source may take (default 10 s); a lookup that
    /// takes longer counts as failed (the last good set is kept, and calls waiting for a first
    /// answer fail with UNAVAILABLE naming the source).
    pub fn discovery_timeout(mut self, timeout: Duration) -> Builder {
        self.discovery_timeout = timeout;
        self
    }

    /// How a discovered instance's `Endpoint` is made (TLS, timeouts, keep-alive...), from the
    /// URI it gets: with [`dns`](Builder::dns), `scheme://host:port` with the DNS name (the
    /// connection still goes to the address found; see there); with a [`resolver`](Builder::resolver)
    /// of your own, `http://address:port`. The default is `Endpoint::from(uri)` with a
    /// [`DEFAULT_CONNECT_TIMEOUT`]. For TLS, set `tls_config` here (tonic's `tls-ring` or
    /// `tls-aws-lc` feature), as for any tonic endpoint.
    pub fn endpoint_template(
        mut self,
        template: impl Fn(http::Uri) -> Endpoint + Send + Sync + 'static,
    ) -> Builder {
        self.template = Some(Arc::new(template));
        self
    }

    /// Adds an instance, with its per-connection settings. An `Endpoint` of a Unix socket does
    /// not tell its path: give such an instance with [`uri`](Builder::uri) instead.
    pub fn endpoint(mut self, endpoint: Endpoint) -> Builder {
        self.add(Target::endpoint(endpoint));
        self
    }

    /// Adds several instances.
    pub fn endpoints(mut self, endpoints: impl IntoIterator<Item = Endpoint>) -> Builder {
        for e in endpoints {
            self = self.endpoint(e);
        }
        self
    }

    /// Adds an instance by URI, with tonic's default settings and a connect timeout of
    /// [`DEFAULT_CONNECT_TIMEOUT`]: `http://host:port`, `https://host:port`, or a Unix
    /// socket as tonic spells it (`unix:/run/app.sock` or `unix:///run/app.sock`; the
    /// instance is known by that URI). A malformed URI is reported by [`build`](Builder::build).
    pub fn uri(mut self, uri: &str) -> Builder {
        self.add(Target::uri(uri, DEFAULT_CONNECT_TIMEOUT));
        self
    }

    /// Adds an instance reached through a connector of your own, as tonic's
    /// `Endpoint::connect_with_connector` does for one channel: a `tower::Service<Uri>` that
    /// returns the connection's I/O (a Unix socket, an in-memory pipe, a proxy tunnel...). The
    /// endpoint gives the per-connection settings and the URI the requests carry; `name` is what
    /// the instance is known by (in [`EndpointStats`](crate::EndpointStats),
    /// [`ServedBy`](crate::ServedBy) and [`BalancedChannel::remove`]), since connector-reached
    /// instances often share one placeholder URI. The connector is cloned for each connection.
    ///
    /// ```no_run
    /// # #[cfg(unix)]
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// use hyper_util::rt::TokioIo;
    /// use tonic::transport::Endpoint;
    ///
    /// let mut builder = tonic_balancer::BalancedChannel::builder();
    /// for path in ["/run/app/a.sock", "/run/app/b.sock"] {
    ///     let connector = tower::service_fn(move |_: http::Uri| async move {
    ///         Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
    ///     });
    ///     let endpoint = Endpoint::from_static("http://app.local");
    ///     builder = builder.endpoint_with_connector(path, endpoint, connector);
    /// }
    /// let channel = builder.build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn endpoint_with_connector<C>(
        mut self,
        name: &str,
        endpoint: Endpoint,
        connector: C,
    ) -> Builder
    where
        C: tower::Service<http::Uri> + Clone + Send + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
        C::Future: Send,
        tower::BoxError: From<C::Error> + Send,
    {
        self.add(Target::with_connector(name, endpoint, connector));
        self
    }

    /// Keeps an instance, or the first error, for `build()`.
    fn add(&mut self, target: Result<Target, Error>) {
        match target {
            Ok(target) => self.endpoints.push(target),
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }

    /// Adds several instances by URI, as [`uri`](Builder::uri) does for one.
    pub fn uris<I, S>(mut self, uris: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        for uri in uris {
            self = self.uri(uri.as_ref());
        }
        self
    }

    /// The selection strategy (default: [`Strategy::LeastPending`]).
    pub fn strategy(mut self, strategy: Strategy) -> Builder {
        self.strategy = strategy;
        self
    }

    /// Reconnect backoff for instances that cannot be reached (default: gRPC's, 1 s first,
    /// ×1.6, ±20% jitter, 120 s cap).
    pub fn backoff(mut self, backoff: Backoff) -> Builder {
        self.backoff = backoff;
        self
    }

    /// Outlier ejection (see [`Ejection`] for the defaults).
    pub fn ejection(mut self, ejection: Ejection) -> Builder {
        self.ejection = ejection;
        self
    }

    /// Whether a call whose instance could not be reached before any of its request went out
    /// is sent to another instance, as gRPC's transparent retry does (default: on).
    pub fn transparent_retry(mut self, on: bool) -> Builder {
        self.transparent_retry = on;
        self
    }

    /// Retries calls that fail with the policy's statuses on other instances (default: off).
    /// See [`RetryPolicy`].
    pub fn retry(mut self, policy: RetryPolicy) -> Builder {
        self.retry = Some(policy);
        self
    }

    /// Hedges the calls of the methods the policy names (default: off): a call without an
    /// answer after the policy's delay is sent again to another instance, and the first answer
    /// wins. Call it once per policy, for methods that need different settings. See
    /// [`HedgingPolicy`](crate::HedgingPolicy).
    pub fn hedging(mut self, policy: crate::HedgingPolicy) -> Builder {
        self.hedging.push(policy);
        self
    }

    /// Checks each instance with the standard `grpc.health.v1` protocol (default: off; feature
    /// `health-check`). See [`HealthCheck`].
    #[cfg(feature = "health-check")]
    pub fn health_check(mut self, check: HealthCheck) -> Builder {
        self.health_check = Some(check);
        self
    }

    /// The largest request body kept so that a call can be sent again (default 64 KiB, at
    /// most 16 MiB). A call whose body is larger is not retried by the retry policy; a call
    /// whose body was never read (its instance could not be reached) is always replayed.
    pub fn max_replay_body(mut self, bytes: usize) -> Builder {
        self.max_replay_body = bytes;
        self
    }

    /// Slow start (default: off): an instance added after the channel was built, or back
    /// from failing, ejection or a failed health check, takes part in a share of the picks
    /// that grows linearly from 5% to all of them over `window`, so that a cold instance is
    /// not flooded the moment it joins. The instances given to the builder start at full share.
    /// Off by default because the least-pending pick already limits a newcomer to its share of
    /// the calls in flight; turn it on for services that need to warm caches or JIT.
    pub fn slow_start(mut self, window: Duration) -> Builder {
        self.slow_start = Some(window);
        self
    }

    /// How long the latency estimate that [`Strategy::PeakEwma`] and
    /// [`Strategy::PowerOfTwoChoices`] compare stays valid without a new sample (default 5 s);
    /// it fades to unknown over that time, so that an instance that was slow once is tried
    /// again. (The default [`Strategy::LeastPending`] re-checks a slow instance on a schedule
    /// of its own, see the crate docs.)
    ///
    /// [`Strategy::PeakEwma`]: crate::Strategy::PeakEwma
    /// [`Strategy::PowerOfTwoChoices`]: crate::Strategy::PowerOfTwoChoices
    /// [`Strategy::LeastPending`]: crate::Strategy::LeastPending
    pub fn latency_expiry(mut self, expiry: Duration) -> Builder {
        self.latency_expiry = expiry;
        self
    }

    /// The most HTTP/2 connections a channel keeps to one instance (default
    /// [`DEFAULT_MAX_CONNECTIONS`](crate::DEFAULT_MAX_CONNECTIONS), 4; at most 64), after gRPC's
    /// connection scaling (gRFC A105). A connection carries at most the server's
    /// MAX_CONCURRENT_STREAMS calls at once (see
    /// [`max_streams_per_connection`](Builder::max_streams_per_connection)); past that, h2 would
    /// queue the next calls inside it, behind long-lived streams and unseen by the pick. Instead,
    /// when each of an instance's connections carries that many calls, the channel opens
    /// another one to the instance, up to this number; the extra connections close when they
    /// have carried no call for the [`connection_idle_timeout`](Builder::connection_idle_timeout).
    /// The pick still sees one instance, with all its calls. When every connection is full and
    /// the cap is reached, a call waits for a stream on the least busy one. `1` keeps one
    /// connection per instance, with no per-connection counting at all; `0` is refused by
    /// [`build`](Builder::build).
    ///
    /// A call that the server refuses before processing it (an HTTP/2 REFUSED_STREAM, as a
    /// server whose limit is lower than the client assumed sends) is sent again transparently,
    /// once, as gRPC's transparent retry does (see [`transparent_retry`](Builder::transparent_retry)):
    /// with it on, request bodies are kept (up to [`max_replay_body`](Builder::max_replay_body))
    /// until the response starts.
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// // Servers that allow 100 concurrent streams per connection; clients that hold up to
    /// // 1,000 long-lived streams to each instance.
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uri("http://10.0.0.7:50051")
    ///     .uri("http://10.0.0.8:50051")
    ///     .max_connections_per_instance(10)
    ///     .max_streams_per_connection(100)
    ///     .connection_idle_timeout(Duration::from_secs(60))
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn max_connections_per_instance(mut self, n: usize) -> Builder {
        self.conns.max = n;
        self
    }

    /// The calls one connection carries before another one to the same instance opens
    /// (default [`DEFAULT_STREAMS_PER_CONNECTION`](crate::DEFAULT_STREAMS_PER_CONNECTION), 100):
    /// set it to your servers' MAX_CONCURRENT_STREAMS. tonic's channel does not tell the value
    /// the server announced, so the channel counts against this one; a server that allows more
    /// only gets an extra connection sooner than needed. Used when
    /// [`max_connections_per_instance`](Builder::max_connections_per_instance) is above 1; `0` is
    /// refused by [`build`](Builder::build).
    pub fn max_streams_per_connection(mut self, n: u32) -> Builder {
        self.conns.streams = n as usize;
        self
    }

    /// How long an extra connection to an instance (see
    /// [`max_connections_per_instance`](Builder::max_connections_per_instance)) stays open with
    /// no call on it (default [`DEFAULT_CONNECTION_IDLE`](crate::DEFAULT_CONNECTION_IDLE), 30 s).
    /// An instance's first connection stays. Zero is refused by [`build`](Builder::build).
    pub fn connection_idle_timeout(mut self, idle: Duration) -> Builder {
        self.conns.idle = idle;
        self
    }

    /// How old a server's load report may be for [`Strategy::LeastPending`] to count the
    /// calls it reports in flight (default 1 s; zero: reports are never used by the pick).
    /// See [`orca`](crate::orca): where an instance reports its calls in flight (the
    /// [`IN_FLIGHT_METRIC`](crate::orca::IN_FLIGHT_METRIC) of an ORCA report, as the
    /// `orca` feature's `OrcaLayer` sends), the pick compares the calls it serves for every
    /// client rather than this channel's alone. An instance without a fresh report is counted
    /// by this channel's calls only.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// use std::time::Duration;
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
    ///     .load_report_max_age(Duration::from_millis(500))
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn load_report_max_age(mut self, max_age: Duration) -> Builder {
        self.load_report_max_age = max_age;
        self
    }

    /// Asks every instance for out-of-band load reports (ORCA, gRFC A51), one every `interval`
    /// (off by default): the channel keeps one `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`
    /// stream open on each instance's connection (opening the connection if need be) and takes
    /// each report in as it takes the report on a response (see [`orca`](crate::orca)), so that
    /// [`Strategy::LeastPending`] and [`Strategy::WeightedRoundRobin`] see an instance's load
    /// also while this channel sends it nothing. The streams are not calls: they are not
    /// counted, picked or retried.
    ///
    /// The server decides how often it sends (a tonic server with the `orca` feature's
    /// `orca::OobService`: never more often than its minimum, 30 s by default). With least pending, ask for reports at least as often as
    /// [`load_report_max_age`](Builder::load_report_max_age) (1 s by default), or they are stale
    /// before the next one. A broken stream is opened again with the channel's
    /// [`Backoff`]; an instance that does not serve the method (UNIMPLEMENTED)
    /// is not asked again until its connection is opened again. The streams end when their
    /// instance is removed. [`build`](Builder::build) refuses a zero interval.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
    ///     .load_reports_out_of_band(Duration::from_secs(1))
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn load_reports_out_of_band(mut self, interval: Duration) -> Builder {
        self.load_reports_oob = Some(interval);
        self
    }

    /// The settings of [`Strategy::WeightedRoundRobin`] (default: gRPC's, see
    /// [`WrrConfig`](crate::instance::load::WrrConfig)); also selects that strategy.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// use std::time::Duration;
    /// use tonic_balancer::orca::WrrConfig;
    ///
    /// let wrr = WrrConfig::default().blackout_period(Duration::from_secs(2));
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
    ///     .weighted_round_robin(wrr)
    ///     .build()?;
    /// assert_eq!(channel.strategy(), tonic_balancer::Strategy::WeightedRoundRobin);
    /// # Ok(()) }
    /// ```
    pub fn weighted_round_robin(mut self, config: crate::instance::load::WrrConfig) -> Builder {
        self.wrr = config;
        self.strategy = Strategy::WeightedRoundRobin;
        self
    }

    /// Subsetting: this client connects to `size` of the instances rather than to all of
    /// them, chosen so that every instance gets about the same number of clients (given the
    /// client's place with [`subset_client`](Builder::subset_client), required), and so that
    /// a membership change moves about one instance of the subset at most. Instances outside
    /// the subset get no connection, no health check and no calls; the pick scans the subset
    /// only. Every change of the set (discovery, [`insert`](BalancedChannel::insert),
    /// [`remove`](BalancedChannel::remove), [`replace_all`](BalancedChannel::replace_all))
    /// recomputes it; [`endpoints`](BalancedChannel::endpoints) lists the subset. With `size`
    /// at or above the number of instances, the subset is all of them. Off by default. See
    /// the README's "Subsetting" for when to turn it on and how to choose `size`; the
    /// algorithm is deterministic aperture (see `src/subset.rs`).
    ///
    /// `build()` refuses a size of 0 (naming `subset`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// // Client 7 of 100, 1,000 instances: it keeps 50 of them.
    /// let mut builder = tonic_balancer::BalancedChannel::builder()
    ///     .subset(50)
    ///     .subset_client(7, 100);
    /// for i in 0..1000 {
    ///     builder = builder.uri(&format!("http://10.0.{}.{}:50051", i / 256, i % 256));
    /// }
    /// let channel = builder.build()?;
    /// assert_eq!(channel.endpoints().len(), 50);
    /// # Ok(()) }
    /// ```
    pub fn subset(mut self, size: usize) -> Builder {
        self.subset = Some(size);
        self
    }

    /// This client's place among the clients that share the instances, for
    /// [`subset`](Builder::subset): its `index`, from 0 to `count - 1`, and the number of
    /// clients, `count` (a StatefulSet's ordinal and its replicas, a shard's number, a
    /// worker's id). Clients with distinct indices of the same count get subsets that cover
    /// every instance evenly: each has `⌊count × size / instances⌋` clients or one more. A
    /// `count` off by a few, or indices that repeat, only make the spread uneven; a client
    /// with no index of its own can draw a random one from a large count, at the price of a
    /// random spread. `build()` refuses `index >= count` and a `count` of 0 (naming
    /// `subset_client`), and subsetting without this.
    pub fn subset_client(mut self, index: usize, count: usize) -> Builder {
        self.subset_client = Some((index, count));
        self
    }

    /// Checks the settings and builds the channel. Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::NoInstances`] for an empty set, [`Error::InvalidUri`] and
    /// [`Error::DuplicateUri`] naming the address, [`Error::InvalidSetting`] naming the
    /// setting, [`Error::NoRuntime`] outside a tokio runtime.
    pub fn build(self) -> Result<BalancedChannel, Error> {
        self.build_with(std::collections::HashMap::new())
    }

    /// Builds the channel and opens a connection to each of its instances now, as tonic's
    /// `Endpoint::connect` does for one: returns once they have all answered or failed, with
    /// the connected ones ready and the others reconnecting in the background ([`Backoff`]).
    /// Fails if none could be reached, naming each instance and why. Each attempt is bounded
    /// by the endpoint's `connect_timeout` (5 s with [`uri`](Builder::uri)) and by
    /// [`Backoff::min_connect_timeout`]. With discovery, waits for the source's first answer
    /// instead (the instances it names connect on their first calls).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uri("http://10.0.0.7:50051")
    ///     .uri("http://10.0.0.8:50051")
    ///     .connect()
    ///     .await?; // Err if neither answers
    /// # let _ = channel; Ok(()) }
    /// ```
    pub async fn connect(self) -> Result<BalancedChannel, Error> {
        let bound = self.backoff.min_connect_timeout;
        let mut attempts = tokio::task::JoinSet::new();
        // With subsetting, the instances of the subset only (bad settings: build() says so).
        let eager = match crate::set::subset::Aperture::new(self.subset, self.subset_client) {
            Ok(Some(s)) => s.choose(&self.endpoints),
            _ => self.endpoints.iter().collect(),
        };
        let statics = eager.len();
        for target in eager {
            let attempt = target.connect();
            let (key, name) = (target.key.clone(), target.name.clone());
            attempts.spawn(async move {
                let result = match tokio::time::timeout(bound, attempt).await {
                    Ok(Ok(channel)) => Ok(channel),
                    Ok(Err(e)) => Err(crate::error::chain(&e)),
                    Err(_) => Err(format!("no connection within {bound:?}")),
                };
                (key, name, result)
            });
        }
        let mut connected = std::collections::HashMap::new();
        let mut failed = Vec::new();
        while let Some(done) = attempts.join_next().await {
            match done {
                Ok((key, _, Ok(channel))) => {
                    connected.insert(key, channel);
                }
                Ok((key, name, Err(why))) => failed.push((Some(key), name, why)),
                Err(e) => failed.push((None, "".into(), e.to_string())),
            }
        }
        let discovery = self.discovery.is_some();
        let channel = self.build_with(connected)?;
        let pool = &channel.shared;
        for (key, _, why) in &failed {
            let key = key.as_ref();
            if let Some(inst) = pool.snapshot().iter().find(|i| Some(&i.target.key) == key) {
                inst.ctx
                    .events
                    .connect_failed(inst, &crate::error::Message(why.clone()));
            }
        }
        if discovery {
            let mut rx = pool.set().discovered.subscribe();
            let _ = rx.wait_for(|done| *done).await;
            if pool.snapshot().is_empty() {
                let why = pool.set().discovery_error().unwrap_or_default();
                return Err(Error::NoUsableInstance {
                    reason: format!("tonic-balancer: discovery found no instance: {why}"),
                });
            }
        } else if statics > 0 && failed.len() == statics {
            let each: Vec<String> = failed
                .iter()
                .map(|(_, name, why)| format!("{name}: {why}"))
                .collect();
            return Err(Error::NoUsableInstance {
                reason: format!(
                    "tonic-balancer: none of the {statics} instances could be reached ({})",
                    each.join("; ")
                ),
            });
        }
        Ok(channel)
    }

    /// Builds the channel, with connections opened already to some of its instances.
    fn build_with(
        mut self,
        mut connected: std::collections::HashMap<Key, tonic::transport::Channel>,
    ) -> Result<BalancedChannel, Error> {
        if let Some(e) = self.error {
            return Err(e);
        }
        if self.endpoints.is_empty() && self.discovery.is_none() {
            return Err(Error::NoInstances);
        }
        for (i, target) in self.endpoints.iter().enumerate() {
            if self.endpoints[..i].iter().any(|t| t.key == target.key) {
                return Err(Error::DuplicateUri {
                    uri: target.name.to_string(),
                });
            }
        }
        self.cap_durations();
        self.backoff.validate()?;
        #[cfg(feature = "metrics")]
        self.metrics.validate()?;
        #[cfg(feature = "metrics")]
        let metrics = (self.metrics.clone(), self.default_target());
        self.ejection.validate()?;
        if let Some(r) = &self.retry {
            r.validate()?;
        }
        let hedging = crate::hedge::Hedging::new(
            self.hedging.clone(),
            self.retry
                .as_ref()
                .map(|r| (r.budget_ratio, r.budget_min_per_sec)),
        )?;
        #[cfg(feature = "health-check")]
        if let Some(h) = &self.health_check {
            h.validate()?;
        }
        if self.max_replay_body > 16 * 1024 * 1024 {
            return Err(Error::InvalidSetting {
                name: "max_replay_body",
                reason: format!("{} bytes is above the 16 MiB cap", self.max_replay_body),
            });
        }
        self.conns.validate()?;
        if self.latency_expiry.is_zero() {
            return Err(Error::InvalidSetting {
                name: "latency_expiry",
                reason: "must be above zero".to_owned(),
            });
        }
        if self.load_reports_oob.is_some_and(|d| d.is_zero()) {
            return Err(Error::InvalidSetting {
                name: "load_reports_out_of_band",
                reason: "the interval must be above zero".to_owned(),
            });
        }
        self.wrr.validate()?;
        let subset = crate::set::subset::Aperture::new(self.subset, self.subset_client)?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::NoRuntime);
        };
        if self.slow_start.is_some_and(|d| d.is_zero()) {
            return Err(Error::InvalidSetting {
                name: "slow_start",
                reason: "the window must be above zero".to_owned(),
            });
        }
        if self.discovery_interval.is_zero() {
            return Err(Error::InvalidSetting {
                name: "discovery_interval",
                reason: "must be above zero".to_owned(),
            });
        }
        if self.discovery_timeout.is_zero() {
            return Err(Error::InvalidSetting {
                name: "discovery_timeout",
                reason: "must be above zero".to_owned(),
            });
        }
        let mut push = None;
        let discovery = match self.discovery.clone() {
            None => None,
            Some(DiscoverySource::Push(task)) => {
                push = Some(crate::lock(&task).take().ok_or(Error::InvalidSetting {
                    name: "discover",
                    reason: "the stream was taken by an earlier build() of this builder".into(),
                })?);
                None
            }
            Some(DiscoverySource::Custom(r)) => Some((r, "http", None)),
            Some(DiscoverySource::Dns {
                target,
                #[cfg(feature = "hickory-dns")]
                settings,
            }) => Some(crate::discover::dns_source(
                &target,
                #[cfg(feature = "hickory-dns")]
                settings,
            )?),
        };
        let totals = Arc::new(crate::observe::Totals::default());
        let health = crate::health::Health {
            ejection: self.ejection.clone(),
            totals: totals.clone(),
        };
        let hooks = Arc::new(Hooks {
            shared: std::sync::OnceLock::new(),
            #[cfg(feature = "health-check")]
            health_check: self.health_check,
            oob: self.load_reports_oob,
            health: health.clone(),
        });
        let policy = Arc::new(Context {
            epoch: Instant::now(),
            runtime,
            clock: AtomicU64::new(0),
            latency_expiry_ns: self.latency_expiry.as_nanos() as u64,
            inv_latency_expiry: 1.0 / self.latency_expiry.as_nanos() as f64,
            latency_decay: self.latency_decay,
            methods: crate::instance::tie::Methods::new(),
            default_latency_ns: 1_000_000.0,
            slow_start_ns: self.slow_start.map_or(0, |d| d.as_nanos() as u64),
            backoff: self.backoff,
            discovery_wake: std::sync::OnceLock::new(),
            ejected: AtomicUsize::new(0),
            members: AtomicUsize::new(0),
            conns: self.conns,
            reports: crate::instance::load::ReportSettings::new(self.load_report_max_age, self.wrr),
            reports_fresh: Default::default(),
            events: hooks.clone(),
        });
        let mut set = Set::new(policy.clone());
        set.subset = subset.map(|s| Box::new(crate::set::subset::Subset::new(s)));
        let mut pool = Shared::new(set, self.strategy, totals.clone());
        pool.replay = self.transparent_retry;
        pool.budget = self.retry.as_ref().map(Budget::new).or_else(|| {
            let (ratio, min_per_sec) = hedging.as_ref()?.budget();
            Some(Budget::with(ratio, min_per_sec))
        });
        pool.hedging = hedging.map(Box::new);
        pool.retry = self.retry;
        pool.max_replay_body = self.max_replay_body;
        let pool = Arc::new(pool);
        let _ = hooks.shared.set(Arc::downgrade(&pool));
        #[cfg(feature = "metrics")]
        crate::metrics::configure(&totals.metrics, metrics.0, metrics.1);
        let set = pool.set();
        if let Some(subset) = &set.subset {
            crate::set::subset::extend(set, subset, self.endpoints, connected);
        } else {
            for target in self.endpoints {
                let channel = connected.remove(&target.key);
                set.insert_with(target, channel);
            }
        }
        set.warm_new
            .store(true, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(instances = pool.snapshot().len(), strategy = ?self.strategy, "balanced channel built");
        if let Some((source, scheme, authority)) = discovery {
            let _ = policy.discovery_wake.set(set.discovery_wake.clone());
            if pool.snapshot().is_empty() {
                set.discovered.send_replace(false);
            }
            let template = self.template.clone().unwrap_or_else(|| {
                Arc::new(|uri: http::Uri| {
                    Endpoint::from(uri).connect_timeout(DEFAULT_CONNECT_TIMEOUT)
                })
            });
            tracing::info!(source = %source.name(), "discovery on");
            totals.set_source(source.name());
            crate::discover::spawn(
                &pool,
                crate::discover::Discovery {
                    source,
                    interval: self.discovery_interval,
                    timeout: self.discovery_timeout,
                    scheme,
                    authority,
                    template,
                },
            );
        }
        if let Some(task) = push {
            totals.set_source("discovery stream".to_owned());
            if pool.snapshot().is_empty() {
                set.discovered.send_replace(false);
            }
            pool.spawn(task(Arc::downgrade(&pool), self.discovery_timeout));
        }
        if let Some(every) = self.ejection.success_rate_interval {
            pool.spawn(success_rate_task(Arc::downgrade(&pool), health, every));
        }
        if self.strategy == Strategy::WeightedRoundRobin {
            pool.spawn(crate::pick::wrr::task(Arc::downgrade(&pool), self.wrr));
        }
        crate::metrics::spawn(&pool, &totals.metrics);
        Ok(BalancedChannel { shared: pool })
    }

    /// Every duration setting at most 30 years: any duration is accepted (`Duration::MAX` for
    /// "never"), and a longer one means the same as 30 years, so that no timer overflows.
    fn cap_durations(&mut self) {
        use crate::time::cap;
        self.backoff = self.backoff.clone().capped();
        self.ejection = self.ejection.clone().capped();
        self.retry = self.retry.take().map(RetryPolicy::capped);
        #[cfg(feature = "health-check")]
        {
            self.health_check = self.health_check.take().map(HealthCheck::capped);
        }
        self.wrr = self.wrr.capped();
        self.latency_expiry = cap(self.latency_expiry);
        self.latency_decay = cap(self.latency_decay);
        self.discovery_interval = cap(self.discovery_interval);
        self.discovery_timeout = cap(self.discovery_timeout);
        self.slow_start = self.slow_start.map(cap);
        self.conns.idle = cap(self.conns.idle);
        self.load_report_max_age = cap(self.load_report_max_age);
        self.load_reports_oob = self.load_reports_oob.map(cap);
    }

    /// What the channel's metrics call it (`grpc.target`) unless told otherwise.
    #[cfg(feature = "metrics")]
    fn default_target(&self) -> String {
        match &self.discovery {
            Some(DiscoverySource::Dns { target, .. }) => {
                let rest = target.split_once("://").map_or(target.as_str(), |(_, r)| r);
                format!("dns:///{rest}")
            }
            Some(DiscoverySource::Custom(r)) => r.name(),
            Some(DiscoverySource::Push(_)) => "discovery stream".to_owned(),
            None => {
                let names: Vec<&str> = self.endpoints.iter().map(|t| &*t.name).collect();
                names.join(",")
            }
        }
    }
}

/// The metrics settings (feature `metrics`).
#[cfg(feature = "metrics")]
impl Builder {
    /// The `grpc.target` label of this channel's metrics (feature `metrics`). The default
    /// is `dns:///host:port` with [`dns`](crate::Builder::dns) discovery, the source's
    /// name with another one, and the instances' URIs joined by `,` for a fixed set.
    pub fn metrics_target(mut self, target: impl Into<String>) -> Builder {
        self.metrics.target = Some(target.into());
        self
    }

    /// The methods whose names label the metrics (`grpc.method`; feature `metrics`): each
    /// `pkg.Service/Method`, or `pkg.Service` for all the methods of a service (those of
    /// your generated stubs). Other methods are labelled `other`, as gRPC's metrics design
    /// (A66) asks, so that a caller of arbitrary method names cannot grow the label
    /// without bound. A malformed name is refused by [`build`](crate::Builder::build).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uri("http://10.0.0.7:50051")
    ///     .metrics_methods(["helloworld.Greeter", "fleet.Fleet/Unary"])
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn metrics_methods<I, S>(mut self, methods: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.metrics
            .methods
            .extend(methods.into_iter().map(Into::into));
        self
    }

    /// Labels every method with its own name (feature `metrics`), instead of only the ones
    /// registered with [`metrics_methods`](crate::Builder::metrics_methods): for a client
    /// that calls only the methods of its generated stubs (off by default).
    pub fn metrics_all_methods(mut self, on: bool) -> Builder {
        self.metrics.all_methods = on;
        self
    }
}

async fn success_rate_task(pool: Weak<Shared>, health: crate::health::Health, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        crate::health::success_rate_sweep(&health, &pool.snapshot());
    }
}
