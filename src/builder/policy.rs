//! What the channel does with its instances: the pick, failure handling, retries and hedges,
//! connections, load reports, subsetting, and (feature `metrics`) how its metrics are labelled.
//!
//! Sources:
//! [gRFC A51](https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md),
//! [gRFC A105](https://github.com/grpc/proposal/blob/master/A105-max_concurrent_streams-connection-scaling.md).

use std::time::Duration;

use super::Builder;
use crate::health::Ejection;
#[cfg(feature = "health-check")]
use crate::health::HealthCheck;
use crate::instance::Backoff;
use crate::retry::RetryPolicy;
use crate::Strategy;

impl Builder {
    /// The selection strategy (default: [`Strategy::FewestThenFastest`]).
    pub fn strategy(mut self, strategy: Strategy) -> Builder {
        self.choose_strategy(strategy, "strategy");
        self
    }

    /// Probes (off by default): for a channel that shares its instances with many other
    /// clients, it asks instances drawn at random how many calls they serve for every client
    /// and how long a call takes them now, and picks among the fresh answers (Prequal's
    /// hot-cold rule); with fewer than two fresh answers, by the strategy. The instances must
    /// answer probes (the `orca` feature's `OrcaLayer` does); those that answer UNIMPLEMENTED
    /// are left to the strategy. See [`ProbeConfig`](crate::ProbeConfig).
    pub fn probes(mut self, config: crate::ProbeConfig) -> Builder {
        self.probes = Some(config);
        self
    }

    /// Reconnect backoff for instances that cannot be reached (default: gRPC's, 1 s first,
    /// ×1.6, ±20% jitter, 120 s cap).
    pub fn backoff(mut self, backoff: Backoff) -> Builder {
        self.backoff = backoff;
        self
    }

    /// Outlier ejection (see [`Ejection`] for the defaults). On an xDS channel, set here it
    /// is kept whatever the cluster's outlier detection says; not set, the cluster's applies
    /// (see the `xds` module).
    pub fn ejection(mut self, ejection: Ejection) -> Builder {
        self.ejection = ejection;
        self.ejection_set = true;
        self
    }

    /// Whether a call whose instance could not be reached before any of its request went out
    /// is sent to another instance, as gRPC's transparent retry does (default: on).
    pub fn transparent_retry(mut self, on: bool) -> Builder {
        self.transparent_retry = on;
        self
    }

    /// Retries the calls of the methods the policy covers that fail with its statuses, on
    /// other instances (default: off; no method is retried). Call it once per policy, for
    /// methods that need different settings; the most specific name covering a method wins.
    /// See [`RetryPolicy`] for which calls are retried.
    pub fn retry(mut self, policy: RetryPolicy) -> Builder {
        self.retry.push(policy);
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
    /// from failing, ejection or a failed health check, gets a share of what it would get that
    /// grows linearly from 5% to all of it over `window` (with least pending, a tie won costs
    /// it 1/share turns; with every strategy, it takes part in that share of the picks), so
    /// that a cold instance is not flooded the moment it joins. The instances given to the builder start at full share.
    /// Off by default because the least-pending pick already limits a newcomer to its share of
    /// the calls in flight; turn it on for services that need to warm caches or JIT.
    pub fn slow_start(mut self, window: Duration) -> Builder {
        self.slow_start = Some(window);
        self
    }

    /// How long the latency estimate that [`Strategy::PeakEwma`] and
    /// [`Strategy::PowerOfTwoChoices`] compare stays valid without a new sample (default 5 s);
    /// it fades to unknown over that time, so that an instance that was slow once is tried
    /// again; [`endpoints`](crate::BalancedChannel::endpoints) shows it. (The default,
    /// [`Strategy::FewestThenFastest`], and [`Strategy::LeastPending`] re-check a slow
    /// instance on a schedule of their own, see [`Strategy`].)
    ///
    /// [`Strategy::PeakEwma`]: crate::Strategy::PeakEwma
    /// [`Strategy::PowerOfTwoChoices`]: crate::Strategy::PowerOfTwoChoices
    /// [`Strategy::FewestThenFastest`]: crate::Strategy::FewestThenFastest
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
    /// once, as gRPC's transparent retry does (see
    /// [`transparent_retry`](Builder::transparent_retry)):
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
    /// (off by default): the channel keeps one
    /// `xds.service.orca.v3.OpenRcaService/StreamCoreMetrics`
    /// stream open on each instance's connection (opening the connection if need be) and takes
    /// each report in as it takes the report on a response (see [`orca`](crate::orca)), so that
    /// [`Strategy::LeastPending`] and [`Strategy::WeightedRoundRobin`] see an instance's load
    /// also while this channel sends it nothing. The streams are not calls: they are not
    /// counted, picked or retried.
    ///
    /// The server decides how often it sends (a tonic server with the `orca` feature's
    /// `orca::OobService`: never more often than its minimum, 30 s by default). With least
    /// pending, ask for reports at least as often as
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
    /// [`WrrConfig`](crate::load::weight::WrrConfig)); also selects that strategy.
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
    pub fn weighted_round_robin(mut self, config: crate::load::weight::WrrConfig) -> Builder {
        self.wrr = config;
        self.choose_strategy(Strategy::WeightedRoundRobin, "weighted_round_robin");
        self
    }

    /// Subsetting: this client connects to `size` of the instances rather than to all of
    /// them, chosen so that every instance gets about the same number of clients (given the
    /// client's place with [`subset_client`](Builder::subset_client), required), and so that
    /// a membership change moves about one instance of the subset at most. Instances outside
    /// the subset get no connection, no health check and no calls; the pick scans the subset
    /// only. Every change of the set (discovery, [`insert`](crate::BalancedChannel::insert),
    /// [`remove`](crate::BalancedChannel::remove),
    /// [`replace_all`](crate::BalancedChannel::replace_all))
    /// recomputes it; [`endpoints`](crate::BalancedChannel::endpoints) lists the subset. With
    /// `size`
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
}

#[cfg(feature = "metrics")]
impl Builder {
    /// The `grpc.target` label of this channel's metrics (feature `metrics`): name the service
    /// it calls. The default is gRPC's target where there is one: `dns:///host:port` with
    /// [`dns`](crate::Builder::dns) discovery, the source's name with another one, the target
    /// string a list was given as ([`target`](crate::Builder::target)), `dns:///host:port` for
    /// one instance named by a host name; another list of URIs has none, and is `static` (the
    /// same for every such channel, set at build and unchanged by
    /// [`insert`](crate::BalancedChannel::insert) and
    /// [`remove`](crate::BalancedChannel::remove)). An empty target is refused by
    /// [`build`](crate::Builder::build). See the [`metrics`](crate::metrics#labels) module.
    pub fn metrics_target(mut self, target: impl Into<String>) -> Builder {
        self.metrics.target = Some(target.into());
        self
    }

    /// Pins the methods whose names label the metrics (`grpc.method`; feature `metrics`): each
    /// `pkg.Service/Method`, or `pkg.Service` for all the methods of a service; every other
    /// method is labelled `other`. Without it, the first
    /// [`METHOD_LIMIT`](crate::metrics::METHOD_LIMIT) (64) methods the channel calls label
    /// themselves and further ones are `other` (see the [`metrics`](crate::metrics#labels)
    /// module): pin them to choose which, or to keep the label to an exact set. A malformed
    /// name is refused by [`build`](crate::Builder::build); a well-formed one that no call
    /// has (`GetItem` for `/inventory.v1.Inventory/GetItem`) is counted in
    /// [`ChannelStats::unmatched_method_names`](crate::ChannelStats::unmatched_method_names)
    /// and, after 100 calls, named in a warning.
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

    /// Labels every method with its own name, without the limit of
    /// [`METHOD_LIMIT`](crate::metrics::METHOD_LIMIT) distinct names (feature `metrics`; off by
    /// default): only for a channel whose callers cannot send arbitrary method names, since
    /// each name adds series to every per-call instrument.
    pub fn metrics_all_methods(mut self, on: bool) -> Builder {
        self.metrics.all_methods = on;
        self
    }

    /// Labels the per-instance instruments with the instance (`tonic_balancer.instance`, its
    /// URI; feature `metrics`; off by default): A94's connection counters and gauge, A91's
    /// ejection counters and the balancer's instance gauges, which are otherwise per target.
    /// gRPC's own instruments have no per-address label: where instances come and go (pods),
    /// every address ever seen adds its series, and they stay as long as the exporter keeps
    /// series that no longer change; turn it on with an exporter that forgets idle series
    /// (metrics-exporter-prometheus's `idle_timeout`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
    ///     .metrics_target("inventory")
    ///     .metrics_per_instance(true)
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn metrics_per_instance(mut self, on: bool) -> Builder {
        self.metrics.per_instance = on;
        self
    }
}
