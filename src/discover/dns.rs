//! DNS discovery: one instance per address of a name.
//!
//! By default the system's resolver answers (`getaddrinfo`, through tokio): `/etc/hosts`,
//! `/etc/resolv.conf` and search domains as every other program on the host sees them, both
//! address families, no extra crate. With the `hickory-dns` feature, [`DnsSettings`] asks name
//! servers of your own with hickory-resolver (A and AAAA records), with their own timeout and
//! attempts; hickory's types stay behind [`DnsSettings`], so a release of hickory is not a
//! breaking release of this crate.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
#[cfg(feature = "hickory-dns")]
use std::time::Duration;

use tower::BoxError;

use super::Resolve;

/// A DNS name and port, resolved to one instance per address (A and AAAA records), as a
/// Kubernetes headless Service publishes its ready pods.
pub struct Dns {
    host: String,
    port: u16,
    resolver: Resolver,
}

enum Resolver {
    /// The system's resolver (`getaddrinfo`).
    System,
    /// hickory-resolver, asking the name servers of a [`DnsSettings`].
    #[cfg(feature = "hickory-dns")]
    Hickory(Box<hickory_resolver::Resolver<hickory_resolver::net::runtime::TokioRuntimeProvider>>),
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let resolver = match self.resolver {
            Resolver::System => "system",
            #[cfg(feature = "hickory-dns")]
            Resolver::Hickory(_) => "hickory",
        };
        f.debug_struct("Dns")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("resolver", &resolver)
            .finish()
    }
}

impl Dns {
    /// Resolves `host` with the system's resolver, as every other program on the host does.
    ///
    /// ```
    /// let dns = tonic_balancer::Dns::system("my-service.default.svc.cluster.local", 50051)?;
    /// # let _ = dns; Ok::<(), tonic_balancer::Error>(())
    /// ```
    pub fn system(host: &str, port: u16) -> Result<Dns, crate::Error> {
        Self::new(host, port, Resolver::System)
    }

    /// Resolves `host` by asking the name servers of `settings` (hickory-resolver).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic_balancer::{Dns, DnsSettings};
    ///
    /// let settings = DnsSettings::name_servers(["10.0.0.10:53".parse().unwrap()])
    ///     .timeout(Duration::from_secs(1))
    ///     .attempts(2);
    /// let dns = Dns::with_settings("my-service.internal", 50051, settings)?;
    /// # let _ = dns; Ok::<(), tonic_balancer::Error>(())
    /// ```
    #[cfg(feature = "hickory-dns")]
    pub fn with_settings(
        host: &str,
        port: u16,
        settings: DnsSettings,
    ) -> Result<Dns, crate::Error> {
        use hickory_resolver::config::{
            LookupIpStrategy, NameServerConfig, ResolverConfig, ResolverOpts,
        };
        let bad = |reason: String| crate::Error::InvalidSetting {
            name: "dns",
            reason,
        };
        if settings.attempts == 0 {
            return Err(bad("attempts must be at least 1".into()));
        }
        if settings.timeout.is_zero() {
            return Err(bad("the timeout must be above zero".into()));
        }
        let mut opts = ResolverOpts::default();
        opts.timeout = crate::time::cap(settings.timeout);
        opts.attempts = settings.attempts;
        // The channel re-resolves on its own schedule: answers must not be served from a cache
        // past that, and both address families are wanted.
        opts.cache_size = 0;
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        let builder = match &settings.servers {
            Some(servers) => {
                if servers.is_empty() {
                    return Err(bad("no name server given".into()));
                }
                let servers = servers
                    .iter()
                    .map(|s| {
                        let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                        for c in &mut ns.connections {
                            c.port = s.port();
                        }
                        ns
                    })
                    .collect();
                let config = ResolverConfig::from_parts(None, vec![], servers);
                hickory_resolver::Resolver::builder_with_config(config, Default::default())
            }
            None => hickory_resolver::Resolver::builder_tokio()
                .map_err(|e| bad(format!("cannot read the system's DNS configuration: {e}")))?,
        };
        let resolver = builder
            .with_options(opts)
            .build()
            .map_err(|e| bad(format!("cannot build the resolver: {e}")))?;
        Self::new(host, port, Resolver::Hickory(Box::new(resolver)))
    }

    fn new(host: &str, port: u16, resolver: Resolver) -> Result<Dns, crate::Error> {
        if host.is_empty() {
            return Err(crate::Error::InvalidSetting {
                name: "dns",
                reason: "the host name is empty".into(),
            });
        }
        Ok(Dns {
            host: host.to_owned(),
            port,
            resolver,
        })
    }
}

/// Where and how [`Dns`] asks (feature `hickory-dns`): name servers, the timeout of one query
/// and how many times it is tried. Built with [`name_servers`](DnsSettings::name_servers) or
/// [`system`](DnsSettings::system), then its setters.
#[cfg(feature = "hickory-dns")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct DnsSettings {
    /// `None`: the system's (`/etc/resolv.conf`).
    servers: Option<Vec<SocketAddr>>,
    timeout: Duration,
    attempts: usize,
}

#[cfg(feature = "hickory-dns")]
impl DnsSettings {
    /// Asks these name servers (UDP, and TCP for answers too large for UDP); a query times
    /// out after 5 s and is tried twice, unless set otherwise.
    pub fn name_servers(servers: impl IntoIterator<Item = SocketAddr>) -> DnsSettings {
        DnsSettings {
            servers: Some(servers.into_iter().collect()),
            timeout: Duration::from_secs(5),
            attempts: 2,
        }
    }

    /// Asks the name servers of the system's configuration (`/etc/resolv.conf`), bypassing
    /// `getaddrinfo` (and so `/etc/hosts`).
    pub fn system() -> DnsSettings {
        DnsSettings {
            servers: None,
            ..DnsSettings::name_servers([])
        }
    }

    /// How long one query may take (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> DnsSettings {
        self.timeout = timeout;
        self
    }

    /// How many times a query is tried (default 2).
    pub fn attempts(mut self, attempts: usize) -> DnsSettings {
        self.attempts = attempts;
        self
    }
}

impl Resolve for Dns {
    fn resolve(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, BoxError>> + Send + '_>> {
        Box::pin(async move {
            let mut addrs: Vec<SocketAddr> = match &self.resolver {
                Resolver::System => tokio::net::lookup_host((self.host.as_str(), self.port))
                    .await?
                    .collect(),
                #[cfg(feature = "hickory-dns")]
                Resolver::Hickory(r) => r
                    .lookup_ip(self.host.as_str())
                    .await?
                    .iter()
                    .map(|ip| SocketAddr::new(ip, self.port))
                    .collect(),
            };
            addrs.sort();
            addrs.dedup();
            Ok(addrs)
        })
    }

    fn name(&self) -> String {
        format!("dns {}:{}", self.host, self.port)
    }
}

/// Splits `host:port` (a bracketed IPv6 literal is allowed) for [`Builder::dns`](crate::Builder::dns).
pub(crate) fn split_target(target: &str) -> Result<(String, u16), crate::Error> {
    let bad = |reason: &str| crate::Error::InvalidUri {
        uri: target.to_owned(),
        reason: reason.to_owned(),
        source: None,
    };
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port"))?;
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('/') {
        return Err(bad(
            "expected host:port, such as my-service.default.svc.cluster.local:50051",
        ));
    }
    Ok((host.to_owned(), port))
}

/// A discovery source with what its instances' URIs need: the resolver, their scheme, and the
/// name their connections present (none: reached as given).
pub(crate) type Source = (
    std::sync::Arc<dyn super::Resolve>,
    &'static str,
    Option<String>,
);

/// The discovery source of [`Builder::dns`](crate::Builder::dns) for `target`
/// (`[http[s]://]host:port`): the resolver, the scheme of the instances' URIs, and the name
/// their connections present (none for an address literal: the instances are reached as given).
pub(crate) fn source(
    target: &str,
    #[cfg(feature = "hickory-dns")] settings: Option<crate::DnsSettings>,
) -> Result<Source, crate::Error> {
    use crate::Error;
    let (scheme, rest) = match target.split_once("://") {
        Some(("http", rest)) => ("http", rest),
        Some(("https", rest)) => ("https", rest),
        Some(_) => {
            return Err(Error::InvalidUri {
                uri: target.to_owned(),
                reason: "the scheme must be http or https".to_owned(),
                source: None,
            })
        }
        None => ("http", target),
    };
    let (host, port) = split_target(rest).map_err(|e| match e {
        Error::InvalidUri { reason, source, .. } => Error::InvalidUri {
            uri: target.to_owned(),
            reason,
            source,
        },
        other => other,
    })?;
    #[cfg(feature = "hickory-dns")]
    let dns = match settings {
        Some(s) => Dns::with_settings(&host, port, s)?,
        None => Dns::system(&host, port)?,
    };
    #[cfg(not(feature = "hickory-dns"))]
    let dns = Dns::system(&host, port)?;
    let authority = host.parse::<std::net::IpAddr>().is_err().then_some(host);
    Ok((std::sync::Arc::new(dns), scheme, authority))
}
