//! Where an instance is, what it is called, and how its connections open: the one place that
//! turns an instance into tonic `Channel`s (its own, the eager connect of `Builder::connect`,
//! and the reconnect probes), so that all of them reach the same place the same way.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::HttpConnector;
use tonic::transport::{Channel, Endpoint};
use tower::{BoxError, Service};

use crate::error::{check_endpoint, check_uri, parse_uri, Error};

/// What identifies an instance in the set: two targets with the same key are the same
/// instance (a second insert replaces the first).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    /// An `http(s)://` address (compared as URIs: `http://a:1` and `http://a:1/` are one).
    Uri(http::Uri),
    /// A Unix socket (`unix:/run/app.sock`) or a custom connector's instance, by its name.
    Name(Arc<str>),
}

/// How an instance's connections open.
#[derive(Clone)]
pub(crate) enum Dial {
    /// tonic's own connector for the endpoint: TCP to its URI's host and port, or its Unix
    /// socket.
    Endpoint,
    /// TCP to this address (found by DNS), while the endpoint's URI carries the service's name:
    /// requests' `:authority` and the TLS server name are the name, as for one tonic endpoint.
    Addr(SocketAddr),
    /// A connector of the user's (`Endpoint::connect_with_connector`).
    Custom(Arc<dyn Connect>),
}

/// An instance to add: its name, its settings and how it is reached.
#[derive(Clone)]
pub(crate) struct Target {
    /// Its name in logs, errors, metrics, `EndpointStats` and `ServedBy`: for a URI,
    /// `scheme://host:port` whichever way it came in (see [`name_of`]); a `unix:` URI as given;
    /// a connector instance's name.
    pub(crate) name: Arc<str>,
    pub(crate) key: Key,
    pub(crate) endpoint: Endpoint,
    pub(crate) dial: Dial,
}

impl Target {
    /// An instance given as a tonic `Endpoint`.
    pub(crate) fn endpoint(endpoint: Endpoint) -> Result<Target, Error> {
        let name = name_of(endpoint.uri());
        check_endpoint(&name, endpoint.uri())?;
        Ok(Target {
            key: Key::Uri(endpoint.uri().clone()),
            name: name.into(),
            endpoint,
            dial: Dial::Endpoint,
        })
    }

    /// An instance given by its URI, `http(s)://host:port` or `unix:/path`, with tonic's
    /// default settings and `connect_timeout`.
    pub(crate) fn uri(uri: &str, connect_timeout: std::time::Duration) -> Result<Target, Error> {
        if let Some(path) = unix_path(uri) {
            if path.is_empty() {
                return Err(Error::InvalidUri {
                    uri: uri.to_owned(),
                    reason: "the socket's path is empty".to_owned(),
                    source: None,
                });
            }
            let endpoint =
                Endpoint::from_shared(uri.to_owned()).map_err(|e| Error::InvalidUri {
                    uri: uri.to_owned(),
                    reason: crate::error::chain(&e),
                    source: Some(Arc::new(e)),
                })?;
            return Ok(Target {
                name: uri.into(),
                key: Key::Name(format!("unix:{path}").into()),
                endpoint,
                dial: Dial::Endpoint,
            });
        }
        let parsed = parse_uri(uri)?;
        Ok(Target {
            name: name_of(&parsed).into(),
            key: Key::Uri(parsed.clone()),
            endpoint: Endpoint::from(parsed).connect_timeout(connect_timeout),
            dial: Dial::Endpoint,
        })
    }

    /// An instance reached through a connector of the user's, known by `name`.
    pub(crate) fn with_connector<C>(
        name: &str,
        endpoint: Endpoint,
        connector: C,
    ) -> Result<Target, Error>
    where
        C: Service<http::Uri> + Clone + Send + 'static,
        C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
        C::Future: Send,
        BoxError: From<C::Error> + Send,
    {
        if name.is_empty() {
            return Err(Error::InvalidUri {
                uri: name.to_owned(),
                reason: "an instance with a connector needs a name".to_owned(),
                source: None,
            });
        }
        check_endpoint(name, endpoint.uri())?;
        let name: Arc<str> = name.into();
        Ok(Target {
            key: Key::Name(name.clone()),
            name,
            endpoint,
            dial: Dial::Custom(Arc::new(Connector(Mutex::new(connector)))),
        })
    }

    /// Its channel, connecting on the first call.
    pub(crate) fn connect_lazy(&self) -> Channel {
        match &self.dial {
            Dial::Endpoint => self.endpoint.connect_lazy(),
            Dial::Addr(addr) => self
                .endpoint
                .connect_with_connector_lazy(ToAddr::new(&self.endpoint, *addr)),
            Dial::Custom(c) => c.connect_lazy(&self.endpoint),
        }
    }

    /// A channel connected now.
    pub(crate) fn connect(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Channel, tonic::transport::Error>> + Send>> {
        let endpoint = self.endpoint.clone();
        match &self.dial {
            Dial::Endpoint => Box::pin(async move { endpoint.connect().await }),
            Dial::Addr(addr) => {
                let to = ToAddr::new(&endpoint, *addr);
                Box::pin(async move { endpoint.connect_with_connector(to).await })
            }
            Dial::Custom(c) => c.connect(endpoint),
        }
    }
}

/// The name of an instance at `uri`: `scheme://authority`, so that `http://a:1` given as a
/// string, `Endpoint::from_static("http://a:1")` (whose URI prints as `http://a:1/`) and an
/// address found by discovery all read the same in `endpoints()`, `ServedBy`, metrics and logs.
pub(crate) fn name_of(uri: &http::Uri) -> String {
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => match uri.path_and_query().map(|p| p.as_str()) {
            None | Some("") | Some("/") => format!("{scheme}://{authority}"),
            Some(rest) => format!("{scheme}://{authority}{rest}"),
        },
        _ => uri.to_string(),
    }
}

/// The key that [`BalancedChannel::remove`](crate::BalancedChannel::remove) looks for: a
/// `unix:` socket's, else a URI's, else a connector instance's name.
/// A string that is not a URI may be a connector instance's name; one that reads as an address
/// without its scheme (`host:port`) brings the URI's error along, for a caller that finds no
/// instance of that name to report.
pub(crate) fn key_of(s: &str) -> Result<(Key, Option<Error>), Error> {
    if let Some(path) = unix_path(s) {
        return Ok((Key::Name(format!("unix:{path}").into()), None));
    }
    match parse_uri(s) {
        Ok(uri) => Ok((Key::Uri(uri), None)),
        Err(e) if s.contains("://") || s.is_empty() => Err(e),
        Err(e) => {
            let address = format!("http://{s}")
                .parse::<http::Uri>()
                .is_ok_and(|u| u.port().is_some() && check_uri(&u).is_ok());
            Ok((Key::Name(s.into()), address.then_some(e)))
        }
    }
}

/// The path of a `unix:/path` or `unix:///path` URI (tonic's two spellings).
fn unix_path(s: &str) -> Option<&str> {
    s.strip_prefix("unix://")
        .or_else(|| s.strip_prefix("unix:"))
}

/// A user's connector, behind a trait object so that an instance's target is one type.
pub(crate) trait Connect: Send + Sync + 'static {
    fn connect_lazy(&self, endpoint: &Endpoint) -> Channel;
    #[allow(clippy::type_complexity)]
    fn connect(
        &self,
        endpoint: Endpoint,
    ) -> Pin<Box<dyn Future<Output = Result<Channel, tonic::transport::Error>> + Send>>;
}

/// The connector is cloned for each connection (tonic takes it by value); the mutex lets a
/// connector that is `Send` but not `Sync` be shared by the channel's clones.
struct Connector<C>(Mutex<C>);

impl<C> Connect for Connector<C>
where
    C: Service<http::Uri> + Clone + Send + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
    C::Future: Send,
    BoxError: From<C::Error> + Send,
{
    fn connect_lazy(&self, endpoint: &Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(crate::sync::lock(&self.0).clone())
    }

    fn connect(
        &self,
        endpoint: Endpoint,
    ) -> Pin<Box<dyn Future<Output = Result<Channel, tonic::transport::Error>> + Send>> {
        let connector = crate::sync::lock(&self.0).clone();
        Box::pin(async move { endpoint.connect_with_connector(connector).await })
    }
}

/// TCP to one address whatever the URI asked for, with the endpoint's TCP settings (as tonic's
/// own connector applies them; the connect timeout is applied by tonic around any connector).
#[derive(Clone)]
struct ToAddr {
    http: HttpConnector,
    to: http::Uri,
}

impl ToAddr {
    fn new(endpoint: &Endpoint, addr: SocketAddr) -> ToAddr {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(endpoint.get_tcp_nodelay());
        http.set_keepalive(endpoint.get_tcp_keepalive());
        http.set_keepalive_interval(endpoint.get_tcp_keepalive_interval());
        http.set_keepalive_retries(endpoint.get_tcp_keepalive_retries());
        let to = format!("http://{addr}")
            .parse()
            .expect("a socket address makes a valid URI");
        ToAddr { http, to }
    }
}

impl Service<http::Uri> for ToAddr {
    type Response = <HttpConnector as Service<http::Uri>>::Response;
    type Error = <HttpConnector as Service<http::Uri>>::Error;
    type Future = <HttpConnector as Service<http::Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx)
    }

    fn call(&mut self, _name: http::Uri) -> Self::Future {
        self.http.call(self.to.clone())
    }
}
