//! [`BalancedChannel`]: the `tower::Service` that generated stubs call (its future is in
//! `call/`).

use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tower::BoxError;

use crate::call::shared::Shared;
use crate::call::split::Split;
use crate::call::ResponseFuture;
use crate::stats::EndpointStats;
use crate::target::Target;
use crate::Strategy;

/// A tonic channel that spreads calls over a set of instances, sending each call to the one
/// with the fewest calls in flight.
///
/// Use it wherever a [`tonic::transport::Channel`] goes: `FooClient::new(channel)`. Clones are
/// cheap and share one set of instances and one set of counts. See the [crate docs](crate) for
/// the routing rule and the failure handling.
#[derive(Clone)]
pub struct BalancedChannel {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for BalancedChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalancedChannel")
            .field("strategy", &self.shared.picker.strategy.get())
            .field("instances", &self.shared.snapshot().len())
            .finish()
    }
}

impl BalancedChannel {
    /// A channel over these addresses with the default settings: least pending,
    /// a 5 s connect timeout per instance, and tonic's defaults otherwise.
    ///
    /// Each string must be an `http://` or `https://` URI with a host (and an optional port),
    /// such as `"http://10.0.0.7:50051"`. An empty list, a malformed URI or a duplicate is
    /// refused with an [`Error`](crate::Error) that quotes it. Must be called within a tokio
    /// runtime: each instance's connection task is spawned on it (connections open lazily, on
    /// the first call).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::from_static([
    ///     "http://10.0.0.7:50051",
    ///     "http://10.0.0.8:50051",
    /// ])?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn from_static<I, S>(uris: I) -> Result<BalancedChannel, crate::Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        BalancedChannel::builder().uris(uris).build()
    }

    /// A channel over these endpoints, each with its own settings: the shape of tonic's
    /// `Channel::balance_list`, so that moving from it is one line.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_balancer::BalancedChannel;
    ///
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let endpoints = ["http://10.0.0.7:50051", "http://10.0.0.8:50051"]
    ///     .into_iter()
    ///     .map(Endpoint::from_static);
    /// // Before: let channel = Channel::balance_list(endpoints);
    /// let channel = BalancedChannel::balance_list(endpoints)?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn balance_list(
        endpoints: impl IntoIterator<Item = tonic::transport::Endpoint>,
    ) -> Result<BalancedChannel, crate::Error> {
        BalancedChannel::builder().endpoints(endpoints).build()
    }

    /// A channel whose instances come and go through the returned sender: the shape of tonic's
    /// `Channel::balance_channel`, with the same sender type (tonic's own
    /// [`Change`](crate::Change), re-exported as `tonic_balancer::Change`), so a tonic user's
    /// code that sends changes compiles unchanged. Send `Change::Insert(key, endpoint)` to add
    /// an instance (one of a URI already in the set stays as it is) and `Change::Remove(key)`
    /// to drain it; see
    /// [`Builder::discover`](crate::Builder::discover). Calls made before the first insert
    /// wait for it (at most 10 s, the default
    /// [`discovery_timeout`](crate::Builder::discovery_timeout)).
    ///
    /// ```no_run
    /// use tonic::transport::channel::Change; // or tonic_balancer::Change: the same type
    /// use tonic::transport::Endpoint;
    /// use tonic_balancer::BalancedChannel;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // Before: let (channel, tx) = Channel::balance_channel(1024);
    /// let (channel, tx) = BalancedChannel::balance_channel(1024)?;
    /// tx.send(Change::Insert("a", Endpoint::from_static("http://10.0.0.7:50051"))).await?;
    /// tx.send(Change::Remove("a")).await?;
    /// # let _ = channel; Ok(()) }
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn balance_channel<K>(
        capacity: usize,
    ) -> Result<
        (
            BalancedChannel,
            tokio::sync::mpsc::Sender<crate::Change<K, tonic::transport::Endpoint>>,
        ),
        crate::Error,
    >
    where
        K: std::hash::Hash + Eq + Clone + Send + 'static,
    {
        if capacity == 0 {
            return Err(crate::Error::InvalidSetting {
                name: "balance_channel",
                reason: "the capacity must be above zero".into(),
            });
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<crate::Change<K, _>>(capacity);
        let channel = BalancedChannel::builder()
            .push(
                Box::new(move |cx| {
                    rx.poll_recv(cx)
                        .map(|c| c.map(|c| Ok(crate::discover::IntoChange::into_change(c))))
                }),
                "balance_channel",
                "balance_channel",
            )
            .build()?;
        Ok((channel, tx))
    }

    /// A channel over the instances a gRPC target string names, as grpc-go's
    /// `grpc.NewClient(target)` takes it: `dns:///my-service:50051`, `my-service:50051`,
    /// `ipv4:10.0.0.1:50051,10.0.0.2:50051`, `unix:/run/app.sock`, `xds:///my-service`; the rest
    /// is the builder's defaults. See [`Builder::target`](crate::Builder::target).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::for_target("dns:///my-service:50051")?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn for_target(target: &str) -> Result<BalancedChannel, crate::Error> {
        crate::Builder::default().target(target).build()
    }

    /// A channel that follows an xDS control plane (feature `xds`): `target` is
    /// `xds:///name`, the bootstrap is the environment's (`GRPC_XDS_BOOTSTRAP` or
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`), and the rest is the builder's defaults. See
    /// [`Builder::xds`](crate::Builder::xds).
    #[cfg(feature = "xds")]
    #[cfg_attr(docsrs, doc(cfg(feature = "xds")))]
    pub fn xds(target: &str) -> Result<BalancedChannel, crate::Error> {
        crate::Builder::default().xds(target).build()
    }

    /// A [`Builder`](crate::Builder) for the instances' `Endpoint`s, the strategy and the
    /// failure-handling settings.
    pub fn builder() -> crate::Builder {
        crate::Builder::new()
    }

    /// A snapshot of every instance: the ones in the set, then the ones draining (on an xDS
    /// channel whose route splits the calls among clusters, then each cluster's). With
    /// [`stats`](Self::stats) and [`connectivity`](Self::connectivity), what grpc-go's channelz
    /// shows of a channel and its subchannels.
    pub fn endpoints(&self) -> Vec<EndpointStats> {
        let mut all = endpoints_of(&self.shared);
        for cluster in self.clusters() {
            all.extend(endpoints_of(&cluster));
        }
        all
    }

    /// The channels of the clusters an xDS route splits the calls among (none without a
    /// split).
    fn clusters(&self) -> Vec<Arc<Shared>> {
        self.shared
            .split
            .as_ref()
            .map(Split::channels)
            .unwrap_or_default()
    }

    /// The strategy this channel routes with now: the builder's, or on an xDS channel the
    /// cluster's policy where the builder chose none (see the `xds` module). On an xDS channel
    /// whose routes send the calls to several clusters, each cluster's channel runs its own
    /// cluster's policy, and this is the builder's.
    pub fn strategy(&self) -> Strategy {
        self.shared.picker.strategy.get()
    }

    /// Adds an instance while calls flow; its connection opens on its first call. An instance
    /// with the same URI in the set is replaced by this one, with its settings (a rotated
    /// certificate, a new timeout): the old one drains (its calls finish on its connection).
    /// Returns `Ok(true)` if the URI was not in the set, `Ok(false)` if an instance was
    /// replaced.
    pub fn insert(&self, endpoint: tonic::transport::Endpoint) -> Result<bool, crate::Error> {
        Ok(self.shared.set().insert(Target::endpoint(endpoint)?))
    }

    /// Removes the instance with this URI (or, for an instance added with a connector, this
    /// name): it gets no new calls from now on, finishes the calls it has (it shows as
    /// [`State::Draining`](crate::State::Draining) meanwhile), then its connection closes.
    /// Returns `Ok(false)` if there is no such instance, and
    /// [`Error::InvalidUri`](crate::Error::InvalidUri) for an address without its scheme
    /// (`127.0.0.1:50051`, which [`Builder::uri`](crate::Builder::uri) refuses alike) that
    /// names no connector instance in the set.
    pub fn remove(&self, uri: &str) -> Result<bool, crate::Error> {
        let (key, not_a_uri) = crate::target::key_of(uri)?;
        let removed = self.shared.set().remove(&key);
        match not_a_uri {
            Some(e) if !removed => Err(e),
            _ => Ok(removed),
        }
    }

    /// Makes the set exactly these instances: adds the new ones, removes (drains) the ones
    /// not listed, leaves the others and their connections alone. Returns how many were
    /// added and removed. Nothing is changed if an endpoint's URI is invalid.
    pub fn replace_all(
        &self,
        endpoints: impl IntoIterator<Item = tonic::transport::Endpoint>,
    ) -> Result<(usize, usize), crate::Error> {
        let want = endpoints
            .into_iter()
            .map(Target::endpoint)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.shared.set().sync(want))
    }

    /// The channel's connectivity state, as gRPC aggregates it over its instances (grpc-go's
    /// `ClientConn.GetState`): READY if one is ready, else CONNECTING if one is connecting (or
    /// discovery has not answered yet), else IDLE if one was never sent a call, else
    /// TRANSIENT_FAILURE (each failing to connect, ejected or unhealthy, or none at all).
    ///
    /// Connections open on the first calls: a channel built with
    /// [`build`](crate::Builder::build) is IDLE until its first call, and one built with
    /// [`connect`](crate::Builder::connect) starts READY (or TRANSIENT_FAILURE).
    pub fn connectivity(&self) -> crate::ConnectivityState {
        self.shared.totals.connectivity.get()
    }

    /// Waits until the connectivity state is other than `from`, and returns it (grpc-go's
    /// `ClientConn.WaitForStateChange`); returns at once if it is already. Bound it with a
    /// timeout of your own (`tokio::time::timeout`), as grpc-go's takes a context: a channel
    /// whose state does not move waits for ever.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tonic_balancer::{BalancedChannel, ConnectivityState};
    ///
    /// # async fn demo(channel: BalancedChannel) {
    /// // A readiness probe: ready once one instance at least is.
    /// let mut state = channel.connectivity();
    /// while state != ConnectivityState::Ready {
    ///     let change = channel.wait_for_state_change(state);
    ///     match tokio::time::timeout(Duration::from_secs(5), change).await {
    ///         Ok(next) => state = next,
    ///         Err(_) => break, // not ready within 5 s
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn wait_for_state_change(
        &self,
        from: crate::ConnectivityState,
    ) -> crate::ConnectivityState {
        let mut rx = self.shared.totals.connectivity.watch();
        // The sender lives as long as this channel (`self` holds it): the wait ends with a
        // change, never with an error.
        let state = rx.wait_for(|now| *now != from).await.map(|s| *s);
        state.unwrap_or(crate::ConnectivityState::Shutdown)
    }

    /// A receiver of the connectivity state's changes, for a task that watches the channel
    /// without holding it (a readiness endpoint, a metric): it reads SHUTDOWN once every clone
    /// of the channel is dropped (and their calls are over). Intermediate states can be
    /// skipped when they change faster than it reads them (a [`tokio::sync::watch`]).
    pub fn watch_connectivity(&self) -> tokio::sync::watch::Receiver<crate::ConnectivityState> {
        self.shared.totals.connectivity.watch()
    }

    /// Totals of this channel since it was built (shared by its clones): calls, attempts,
    /// retries, transparent retries, hedges, refusals, ejections, and the discovery source's state and
    /// last error. Lock-free counters, kept whether or not the `metrics` feature is on; see
    /// [`endpoints`](Self::endpoints) for each instance.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::from_static(["http://10.0.0.7:50051"])?;
    /// // ... calls ...
    /// let stats = channel.stats();
    /// println!("{} calls, {} retried, {} refused", stats.calls(), stats.retries(), stats.refused());
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> crate::ChannelStats {
        let mut stats = crate::ChannelStats::of(self.shared.set(), &self.shared.totals);
        for cluster in self.clusters() {
            stats.add(&crate::ChannelStats::of(cluster.set(), &cluster.totals));
        }
        let metrics = crate::metrics::unmatched_methods(&self.shared.totals.metrics).len();
        stats.unmatched_method_names = (self.shared.methods.unmatched().0.len() + metrics) as u64;
        stats
    }
}

/// The instances of one channel: those in its set, then those draining.
fn endpoints_of(shared: &Shared) -> Vec<EndpointStats> {
    let members = shared.snapshot();
    let draining = shared.set().draining();
    members
        .iter()
        .chain(draining.iter())
        .map(|i| EndpointStats::of(i))
        .collect()
}

impl tower::Service<http::Request<Body>> for BalancedChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    /// Always ready: the channel itself queues nothing. Each call waits, within its own future,
    /// for room in its instance's connection.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        ResponseFuture::new(&self.shared, req)
    }
}
