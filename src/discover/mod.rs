//! Membership that changes: a [`Resolve`] source (DNS, or any other) polled in the background,
//! its answers turned into inserts and removals of instances; or a source that pushes changes
//! ([`Builder::discover`](crate::Builder::discover): a stream of tonic's
//! [`Change`](crate::Change)s, or tower's).
//!
//! The set follows the source: new addresses are added, vanished ones removed (they drain:
//! no new calls, the calls they have finish). A lookup that fails, or that returns no address,
//! keeps the last good set (a blip in DNS must not empty a working channel). Calls made before
//! the first answer wait for it; if that answer fails, they (and later calls, while the set is
//! empty) fail with UNAVAILABLE, naming the source and its last error. The source is asked again every `interval`, and sooner (at most once per
//! second) when an instance cannot be reached: it may have moved. A lookup that takes longer
//! than the discovery timeout (default 10 s) counts as failed, so that no call waits without
//! bound on a source that hangs.

mod dns;
pub(crate) mod push;

pub(crate) use dns::source as dns_source;
pub use dns::Dns;
#[cfg(feature = "hickory-dns")]
pub use dns::DnsSettings;
pub use push::IntoChange;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tonic::transport::Endpoint;
use tower::BoxError;

use crate::call::shared::Shared;
use crate::target::{Dial, Key, Target};

/// A source of instance addresses: DNS ([`Dns`]), a service registry, a control plane.
///
/// The channel calls [`resolve`](Resolve::resolve) in the background and makes its set of
/// instances follow the answers.
///
/// ```
/// use std::net::SocketAddr;
/// use std::pin::Pin;
/// use std::future::Future;
/// use tonic_balancer::Resolve;
///
/// /// A fixed list, as a stand-in for a registry client.
/// struct Static(Vec<SocketAddr>);
///
/// impl Resolve for Static {
///     fn resolve(
///         &self,
///     ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, tower::BoxError>> + Send + '_>> {
///         Box::pin(async move { Ok(self.0.clone()) })
///     }
///
///     fn name(&self) -> String {
///         "static list".into()
///     }
/// }
/// ```
pub trait Resolve: Send + Sync + 'static {
    /// The current addresses of the instances.
    #[allow(clippy::type_complexity)]
    fn resolve(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, BoxError>> + Send + '_>>;

    /// What to call this source in logs and errors (for DNS, the name and port).
    fn name(&self) -> String;
}

/// How an address becomes an instance's `Endpoint` (TLS, timeouts, keep-alive...).
pub(crate) type Template = Arc<dyn Fn(http::Uri) -> Endpoint + Send + Sync>;

pub(crate) struct Discovery {
    pub(crate) source: Arc<dyn Resolve>,
    pub(crate) interval: Duration,
    /// How long one lookup may take.
    pub(crate) timeout: Duration,
    pub(crate) scheme: &'static str,
    /// The name the source resolves (DNS), if it has one: each instance's endpoint carries it
    /// (`scheme://name:port`: the requests' `:authority` and the TLS server name), while its
    /// connection goes to the address found.
    pub(crate) authority: Option<String>,
    pub(crate) template: Template,
}

impl Discovery {
    /// The instance of one address.
    fn target(&self, addr: SocketAddr) -> Result<Target, http::uri::InvalidUri> {
        address_target(self.scheme, self.authority.as_deref(), &self.template, addr)
    }
}

/// The instance of one address a source found: known by its URI (`scheme://addr`); its
/// endpoint made by `template` from that URI, or, when the source resolved a name
/// (`authority`), from `scheme://name:port` with the connection still going to the address.
pub(crate) fn address_target(
    scheme: &str,
    authority: Option<&str>,
    template: &Template,
    addr: SocketAddr,
) -> Result<Target, http::uri::InvalidUri> {
    let name = uri_of(scheme, addr);
    let key: http::Uri = name.parse()?;
    let (uri, dial) = match authority {
        Some(host) => (
            format!("{scheme}://{host}:{}", addr.port()).parse()?,
            Dial::Addr(addr),
        ),
        None => (key.clone(), Dial::Endpoint),
    };
    Ok(Target {
        name: name.into(),
        key: Key::Uri(key),
        endpoint: template(uri),
        dial,
    })
}

/// The URI of an address: `http://10.0.0.7:50051`, `http://[::1]:50051`.
pub(crate) fn uri_of(scheme: &str, addr: SocketAddr) -> String {
    format!("{scheme}://{addr}")
}

/// Polls the source and keeps the set in line with it, until the channel is dropped.
pub(crate) async fn run(pool: Weak<Shared>, d: Discovery) {
    let name = d.source.name();
    let min_gap = Duration::from_secs(1).min(d.interval);
    loop {
        let started = tokio::time::Instant::now();
        let answer = match tokio::time::timeout(d.timeout, d.source.resolve()).await {
            Ok(answer) => answer,
            Err(_) => Err(format!("no answer within {:?}", d.timeout).into()),
        };
        let Some(p) = pool.upgrade() else { return };
        match answer {
            Ok(addrs) if !addrs.is_empty() => {
                let mut want: Vec<Target> = Vec::with_capacity(addrs.len());
                for a in addrs {
                    match d.target(a) {
                        Ok(t) if want.iter().any(|w| w.key == t.key) => {}
                        Ok(t) => want.push(t),
                        Err(e) => {
                            tracing::warn!(source = %name, server.address = %a, error = %e, "unusable address")
                        }
                    }
                }
                let (added, removed) = p.set().sync(want);
                if added + removed > 0 {
                    tracing::info!(source = %name, added, removed, instances = p.snapshot().len(), "discovery changed the set");
                }
                p.set().discovery_status(None);
            }
            Ok(_) => {
                tracing::warn!(source = %name, kept = p.snapshot().len(), "lookup returned no address; keeping the last set");
                p.set()
                    .discovery_status(Some(format!("{name}: no address")));
            }
            Err(e) => {
                tracing::warn!(source = %name, error = %e, kept = p.snapshot().len(), "lookup failed; keeping the last set");
                p.set().discovery_status(Some(format!("{name}: {e}")));
            }
        }
        let wake = p.set().discovery_wake.clone();
        drop(p);
        let next = started + crate::time::cap(d.interval);
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = wake.notified() => {
                // An instance could not be reached: look again soon, but not in a loop.
                tokio::time::sleep_until((started + min_gap).max(tokio::time::Instant::now())).await;
            }
        }
    }
}

/// Spawns the discovery task of a channel.
pub(crate) fn spawn(pool: &Arc<Shared>, d: Discovery) {
    pool.spawn(run(Arc::downgrade(pool), d));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::time::Instant;

    /// A source that notes when it is asked, and never answers its third lookup.
    struct Noting {
        asked: Arc<Mutex<Vec<Instant>>>,
    }

    impl Resolve for Noting {
        fn resolve(
            &self,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, BoxError>> + Send + '_>> {
            let n = {
                let mut asked = crate::sync::lock(&self.asked);
                asked.push(Instant::now());
                asked.len()
            };
            Box::pin(async move {
                if n == 3 {
                    std::future::pending::<()>().await;
                }
                Ok(vec![SocketAddr::from(([127, 0, 0, 1], 1))])
            })
        }

        fn name(&self) -> String {
            "noting".into()
        }
    }

    /// On tokio's paused clock: the source is asked at once, then every `discovery_interval`
    /// from the start of the previous lookup; a lookup that does not answer within
    /// `discovery_timeout` fails (the set stays as it was) and the next one comes on time.
    #[tokio::test(start_paused = true)]
    async fn the_source_is_asked_every_interval_and_a_silent_one_times_out() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let ch = crate::BalancedChannel::builder()
            .resolver(Noting {
                asked: asked.clone(),
            })
            .discovery_interval(Duration::from_secs(30))
            .discovery_timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        tokio::time::sleep(Duration::from_secs(69)).await;
        assert_eq!(ch.stats().discovery_failures(), 0, "{}", ch.stats());
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The third lookup (at 60 s) had no answer by 70 s.
        assert_eq!(ch.stats().discovery_failures(), 1, "{}", ch.stats());
        assert_eq!(ch.endpoints().len(), 1, "the set stays as it was");
        tokio::time::sleep(Duration::from_secs(30)).await;
        let at: Vec<u64> = crate::sync::lock(&asked)
            .iter()
            .map(|t| t.duration_since(start).as_secs())
            .collect();
        assert_eq!(at, [0, 30, 60, 90]);
    }
}
