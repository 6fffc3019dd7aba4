//! [`Builder`]: the instances and the settings of a [`BalancedChannel`](crate::BalancedChannel),
//! checked in
//! [`Builder::build`]. By role: the instances and how they are discovered (`instances.rs`),
//! what the channel does with them (`policy.rs`), the checks and the wiring of the parts
//! (`build.rs`), and a build that opens the connections first (`connect.rs`).

mod build;
mod connect;
mod instances;
mod policy;
#[cfg(feature = "service-config")]
mod service_config;
mod target;

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::call::shared::Shared;
use crate::discover::{Resolve, Template};
use crate::error::Error;
use crate::health::Ejection;
#[cfg(feature = "health-check")]
use crate::health::HealthCheck;
use crate::instance::Backoff;
use crate::retry::{RetryPolicy, DEFAULT_MAX_REPLAY_BODY};
use crate::target::Target;
use crate::Strategy;

/// The connect timeout that [`Builder::uri`] and
/// [`BalancedChannel::from_static`](crate::BalancedChannel::from_static) give each
/// instance (tonic has none by default, and a silent address would hold calls for minutes).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one lookup of a discovery source may take unless
/// [`Builder::discovery_timeout`] says otherwise.
pub const DEFAULT_DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`BalancedChannel`](crate::BalancedChannel): instances (as tonic
/// [`Endpoint`](tonic::transport::Endpoint)s, so that TLS, timeouts,
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
#[must_use = "a Builder makes no channel until `build()` or `connect()`"]
pub struct Builder {
    endpoints: Vec<Target>,
    error: Option<Error>,
    strategy: Strategy,
    /// The setter that chose the strategy, if one did: a second that chooses another is a
    /// contradiction `build()` refuses.
    strategy_by: Option<&'static str>,
    /// The setter that chose the discovery source, likewise.
    discovery_by: Option<&'static str>,
    /// The xDS bootstrap given in code.
    #[cfg(feature = "xds")]
    xds_bootstrap: Option<crate::xds::Bootstrap>,
    /// Set on the channel of one cluster of an xDS route's split (`xds::split`): it follows
    /// that cluster rather than the target's listener.
    #[cfg(feature = "xds")]
    xds_cluster: Option<String>,
    /// Whether `discovery_interval` was set (it has no effect without a polled source).
    interval_set: bool,
    backoff: Backoff,
    ejection: Ejection,
    /// Whether `ejection` was set: an xDS cluster's outlier detection applies only where it
    /// was not.
    ejection_set: bool,
    transparent_retry: bool,
    retry: Vec<RetryPolicy>,
    hedging: Vec<crate::HedgingPolicy>,
    /// The method configs of a service config (feature `service-config`).
    method_configs: Vec<crate::retry::MethodConfig>,
    /// gRPC's retry throttling, from a service config, in place of the budget.
    throttling: Option<crate::retry::RetryThrottling>,
    probes: Option<crate::ProbeConfig>,
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
    wrr: crate::load::weight::WrrConfig,
    subset: Option<usize>,
    subset_client: Option<(usize, usize)>,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: crate::metrics::LabelSettings,
    /// The lists given as gRPC target strings (`ipv4:...`, `unix:...`), each with the
    /// instances it named: the metrics' `grpc.target` of a channel made of one of them alone.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    list_targets: Vec<(String, usize)>,
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
    /// An xDS target (its bootstrap: `Builder::xds_bootstrap`, else the environment's).
    #[cfg(feature = "xds")]
    Xds {
        target: String,
    },
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
            #[cfg(feature = "xds")]
            DiscoverySource::Xds { target, .. } => write!(f, "Xds({target})"),
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
            list_targets: Vec::new(),
            error: None,
            strategy: Strategy::default(),
            strategy_by: None,
            discovery_by: None,
            #[cfg(feature = "xds")]
            xds_bootstrap: None,
            #[cfg(feature = "xds")]
            xds_cluster: None,
            interval_set: false,
            backoff: Backoff::default(),
            ejection: Ejection::default(),
            ejection_set: false,
            transparent_retry: true,
            retry: Vec::new(),
            hedging: Vec::new(),
            method_configs: Vec::new(),
            throttling: None,
            probes: None,
            #[cfg(feature = "health-check")]
            health_check: None,
            max_replay_body: DEFAULT_MAX_REPLAY_BODY,
            latency_expiry: Duration::from_secs(5),
            load_report_max_age: crate::load::reported::DEFAULT_LOAD_REPORT_MAX_AGE,
            wrr: crate::load::weight::WrrConfig::default(),
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
}

impl Builder {
    /// `by` chooses `strategy`: refused at `build()` if another setter chose another one.
    fn choose_strategy(&mut self, strategy: Strategy, by: &'static str) {
        if let Some(before) = self.strategy_by {
            if self.strategy != strategy {
                self.error.get_or_insert(Error::InvalidSetting {
                    name: by,
                    reason: format!(
                        "`{before}` chose {:?} and `{by}` chose {strategy:?}: choose one",
                        self.strategy
                    ),
                });
            }
        }
        self.strategy = strategy;
        self.strategy_by = Some(by);
    }

    /// `by` sets the discovery source: refused at `build()` if another setter set one (the
    /// channel follows one source).
    fn choose_discovery(&mut self, source: DiscoverySource, by: &'static str) {
        if let Some(before) = self.discovery_by {
            self.error.get_or_insert(Error::InvalidSetting {
                name: by,
                reason: format!(
                    "`{before}` set the discovery source already: a channel follows one source"
                ),
            });
        }
        self.discovery = Some(source);
        self.discovery_by = Some(by);
    }
}
