//! DNS discovery with hickory-resolver: one instance per A or AAAA record of a name.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;

use hickory_resolver::config::{ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::Resolver;
use tower::BoxError;

use super::Resolve;

/// A DNS name and port, resolved to one instance per address (A and AAAA records), as a
/// Kubernetes headless Service publishes its ready pods.
pub struct Dns {
    host: String,
    port: u16,
    resolver: Resolver<TokioRuntimeProvider>,
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

impl Dns {
    /// Resolves `host` with the system's resolver configuration (`/etc/resolv.conf`).
    pub fn system(host: &str, port: u16) -> Result<Dns, crate::Error> {
        let builder = Resolver::builder_tokio().map_err(|e| crate::Error::InvalidSetting {
            name: "dns",
            reason: format!("cannot read the system's DNS configuration: {e}"),
        })?;
        let mut builder = builder;
        tune(builder.options_mut());
        Self::with_builder(host, port, builder)
    }

    /// Resolves `host` with this configuration (name servers) and these options.
    pub fn with_config(
        host: &str,
        port: u16,
        config: ResolverConfig,
        mut options: ResolverOpts,
    ) -> Result<Dns, crate::Error> {
        tune(&mut options);
        let builder = Resolver::builder_with_config(config, TokioRuntimeProvider::default())
            .with_options(options);
        Self::with_builder(host, port, builder)
    }

    fn with_builder(
        host: &str,
        port: u16,
        builder: hickory_resolver::ResolverBuilder<TokioRuntimeProvider>,
    ) -> Result<Dns, crate::Error> {
        if host.is_empty() {
            return Err(crate::Error::InvalidSetting {
                name: "dns",
                reason: "the host name is empty".into(),
            });
        }
        let resolver = builder.build().map_err(|e| crate::Error::InvalidSetting {
            name: "dns",
            reason: format!("cannot build the resolver: {e}"),
        })?;
        Ok(Dns {
            host: host.to_owned(),
            port,
            resolver,
        })
    }
}

/// The channel re-resolves on its own schedule: answers must not be served from a cache past
/// that, and both address families are wanted.
fn tune(o: &mut ResolverOpts) {
    o.cache_size = 0;
    o.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
}

impl Resolve for Dns {
    fn resolve(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, BoxError>> + Send + '_>> {
        Box::pin(async move {
            let lookup = self.resolver.lookup_ip(self.host.as_str()).await?;
            let mut addrs: Vec<SocketAddr> = lookup
                .iter()
                .map(|ip| SocketAddr::new(ip, self.port))
                .collect();
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
    };
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| bad("the port must be a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains('/') {
        return Err(bad(
            "expected host:port, such as my-service.default.svc.cluster.local:50051",
        ));
    }
    Ok((host.to_owned(), port))
}
