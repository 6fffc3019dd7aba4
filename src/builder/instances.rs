//! The instances of the channel: given one by one, or found by discovery.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Endpoint;

use super::{Builder, DiscoverySource, PushTask, DEFAULT_CONNECT_TIMEOUT};
use crate::discover::{IntoChange as IntoChangeExt, Resolve};
use crate::error::Error;
use crate::target::Target;

impl Builder {
    /// Discovers the instances in DNS: `target` is `host:port` (such as
    /// `my-service.default.svc.cluster.local:50051`, the name of a Kubernetes headless
    /// Service; gRPC's `dns:///host:port` too, see [`target`](Builder::target)), resolved by the
    /// system's resolver into one instance per address (A and AAAA records), again every
    /// [`discovery_interval`](Builder::discovery_interval). DNS answers with the whole set, so
    /// instances given with [`endpoint`](Builder::endpoint) or [`uri`](Builder::uri) as well
    /// are refused by [`build`](Builder::build). See the [`discover`](crate::discover) module
    /// for the behaviour on failures.
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
        if target.starts_with("dns:") {
            // gRPC's spelling (`dns:///host:port`, `dns://server/host:port`).
            return self.target(target);
        }
        self.choose_discovery(
            DiscoverySource::Dns {
                target: target.to_owned(),
                #[cfg(feature = "hickory-dns")]
                settings: None,
            },
            "dns",
        );
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
        self.choose_discovery(
            DiscoverySource::Dns {
                target: target.to_owned(),
                settings: Some(settings),
            },
            "dns_with",
        );
        self
    }

    /// Discovers the instances with a source of your own (a registry, a control plane).
    pub fn resolver(mut self, source: impl Resolve) -> Builder {
        self.choose_discovery(DiscoverySource::Custom(Arc::new(source)), "resolver");
        self
    }

    /// Follows a source that pushes changes: any stream of `Result<Change<K, Endpoint>, E>`,
    /// with tonic's [`Change`](crate::Change) (the type `Channel::balance_channel`'s sender
    /// takes) or tower's [`tower::discover::Change`] (every tower `Discover` is such a stream),
    /// as service registries with watches deliver them (Consul, Kubernetes EndpointSlices,
    /// etcd): each `Insert(key, endpoint)` adds the instance with its own settings (replacing
    /// the URI the key had before); each `Remove(key)` drains the key's instance. An `Insert`
    /// of a URI already in the set changes nothing (registries announce their whole set again
    /// every few seconds): the instance keeps its state, an ejection, its latency history and
    /// its connections, as grpc-go keeps the subchannel of an address its resolver names again.
    /// To give an address in the set new settings (a rotated certificate), use
    /// [`BalancedChannel::insert`](crate::BalancedChannel::insert). Until the first change arrives, calls wait for it, for at most the
    /// [`discovery_timeout`](Builder::discovery_timeout). An error of the source is logged and
    /// the set kept; when the source ends, the set stays as it is.
    ///
    /// ```
    /// use tonic::transport::Endpoint;
    /// use tonic_balancer::{BalancedChannel, Change};
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
    pub fn discover<S, C, E, K>(self, source: S) -> Builder
    where
        S: futures_core::Stream<Item = Result<C, E>> + Send + 'static,
        C: crate::discover::IntoChange<K>,
        E: Into<tower::BoxError>,
        K: std::hash::Hash + Eq + Clone + Send + 'static,
    {
        let mut source = Box::pin(source);
        self.push(
            Box::new(move |cx| {
                source
                    .as_mut()
                    .poll_next(cx)
                    .map(|item| item.map(|r| r.map(IntoChangeExt::into_change).map_err(Into::into)))
            }),
            "discovery stream",
            "discover",
        )
    }

    /// Follows an xDS control plane (feature `xds`): `target` is `xds:///name`, the Listener
    /// the control plane serves for the name; its route's cluster's endpoints become the
    /// instances (see the [`xds`](crate::xds) module for what is read, and what not yet).
    /// The bootstrap is read at [`build`](Builder::build) from `GRPC_XDS_BOOTSTRAP` (a
    /// file) or `GRPC_XDS_BOOTSTRAP_CONFIG` (the JSON), as gRPC reads it, unless given with
    /// [`xds_bootstrap`](Builder::xds_bootstrap). Every channel of the process that names
    /// the same control plane and node shares one ADS stream.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::builder()
    ///     .xds("xds:///billing.prod")
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    #[cfg(feature = "xds")]
    #[cfg_attr(docsrs, doc(cfg(feature = "xds")))]
    pub fn xds(mut self, target: &str) -> Builder {
        self.choose_discovery(
            DiscoverySource::Xds {
                target: target.to_owned(),
            },
            "xds",
        );
        self
    }

    /// The xDS bootstrap for [`xds`](Builder::xds), given in code instead of the
    /// environment's (feature `xds`). Refused at build without [`xds`](Builder::xds).
    #[cfg(feature = "xds")]
    #[cfg_attr(docsrs, doc(cfg(feature = "xds")))]
    pub fn xds_bootstrap(mut self, bootstrap: crate::xds::Bootstrap) -> Builder {
        self.xds_bootstrap = Some(bootstrap);
        self
    }

    /// Follows the changes that `next` yields (see [`discover`](Builder::discover)).
    pub(crate) fn push<K>(
        mut self,
        next: crate::discover::push::PollChange<K>,
        name: &'static str,
        by: &'static str,
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
        self.choose_discovery(
            DiscoverySource::Push(Arc::new(std::sync::Mutex::new(Some(task)))),
            by,
        );
        self
    }

    /// How often discovery asks its source again (default 30 s; sooner, at most once a
    /// second, when an instance cannot be reached).
    pub fn discovery_interval(mut self, every: Duration) -> Builder {
        self.discovery_interval = every;
        self.interval_set = true;
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
    /// connection still goes to the address found; see there); with a
    /// [`resolver`](Builder::resolver)
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
    /// instance is known by that URI). A gRPC target string (`dns:///my-service:50051`,
    /// `ipv4:...`, `ipv6:...`, `xds:///...`) is read as [`target`](Builder::target) reads it.
    /// A malformed URI is reported by [`build`](Builder::build).
    pub fn uri(mut self, uri: &str) -> Builder {
        if ["dns:", "ipv4:", "ipv6:", "xds:"]
            .iter()
            .any(|scheme| uri.starts_with(scheme))
        {
            // A gRPC target string (`from_static(["dns:///my-service:50051"])`).
            return self.target(uri);
        }
        self.add(Target::uri(uri, DEFAULT_CONNECT_TIMEOUT));
        self
    }

    /// Adds an instance reached through a connector of your own, as tonic's
    /// `Endpoint::connect_with_connector` does for one channel: a `tower::Service<Uri>` that
    /// returns the connection's I/O (a Unix socket, an in-memory pipe, a proxy tunnel...). The
    /// endpoint gives the per-connection settings and the URI the requests carry; `name` is what
    /// the instance is known by (in [`EndpointStats`](crate::EndpointStats),
    /// [`ServedBy`](crate::ServedBy) and
    /// [`BalancedChannel::remove`](crate::BalancedChannel::remove)), since connector-reached
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
}
