//! gRPC's target strings (`dns:///my-service:50051`, `ipv4:10.0.0.1:50051,10.0.0.2:50051`,
//! `unix:/run/app.sock`, `xds:///my-service`), as grpc-go's `NewClient` and C-core's channels
//! take them: the scheme says where the instances come from.
//!
//! Source: [gRPC Name Resolution](https://github.com/grpc/grpc/blob/master/doc/naming.md).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{Builder, DiscoverySource};
use crate::error::Error;

/// The port of a target that names none, as gRPC takes it.
const DEFAULT_PORT: u16 = 443;

/// The accepted forms, for the errors.
const FORMS: &str = "accepted: `dns:[//dns-server/]host[:port]`, `host:port`, \
                     `ipv4:address[:port][,address[:port]...]`, \
                     `ipv6:[address]:port[,[address]:port...]`, `unix:path`, `unix:///absolute-path`, \
                     `xds:///name` (feature `xds`)";

/// Where a target string's instances come from.
#[derive(Debug, PartialEq)]
enum Parsed {
    /// DNS: `host:port`, asked of `server` if one is named.
    Dns {
        host_port: String,
        server: Option<SocketAddr>,
    },
    /// A fixed list of instance URIs.
    Uris(Vec<String>),
    /// An xDS target, whole.
    Xds(String),
}

impl Builder {
    /// The instances a gRPC target string names, as grpc-go's `grpc.NewClient(target)` and the
    /// other gRPC clients read it ([gRPC Name
    /// Resolution](https://github.com/grpc/grpc/blob/master/doc/naming.md)):
    ///
    /// | target | instances |
    /// | --- | --- |
    /// | `dns:///my-service:50051`, `my-service:50051` | every address of the name, as [`dns`](Builder::dns) |
    /// | `dns://10.0.0.10:53/my-service:50051` | the same, asking that DNS server (feature `hickory-dns`) |
    /// | `ipv4:10.0.0.1:50051,10.0.0.2:50051` | those addresses |
    /// | `ipv6:[2001:db8::1]:50051,[2001:db8::2]:50051` | those addresses |
    /// | `unix:/run/app.sock`, `unix:///run/app.sock` | that socket, as [`uri`](Builder::uri) |
    /// | `xds:///my-service` | what an xDS control plane says, as `Builder::xds` (feature `xds`) |
    ///
    /// As in gRPC, a target with no scheme or a scheme it does not know is a DNS name, and a
    /// name or address without a port is on port 443. The connections are plaintext (`http`);
    /// for TLS with DNS, see [`dns`](Builder::dns). A malformed target is refused by
    /// [`build`](Builder::build), naming it and the accepted forms; so is `unix-abstract:`
    /// (tonic connects to sockets by path: use
    /// [`endpoint_with_connector`](Builder::endpoint_with_connector)).
    ///
    /// ```
    /// use tonic_balancer::BalancedChannel;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// let channel = BalancedChannel::builder()
    ///     .target("ipv4:127.0.0.1:50051,127.0.0.1:50052")
    ///     .build()?;
    /// assert_eq!(channel.endpoints().len(), 2);
    /// assert!(BalancedChannel::builder().target("dns:///my-service:http").build().is_err());
    /// # Ok(()) }
    /// ```
    pub fn target(mut self, target: &str) -> Builder {
        match parse(target) {
            Ok(Parsed::Uris(uris)) => {
                self.list_targets.push((target.to_owned(), uris.len()));
                self.uris(uris)
            }
            Ok(Parsed::Dns { host_port, server }) => {
                match server {
                    None => self.choose_discovery(
                        DiscoverySource::Dns {
                            target: host_port,
                            #[cfg(feature = "hickory-dns")]
                            settings: None,
                        },
                        "target",
                    ),
                    #[cfg(feature = "hickory-dns")]
                    Some(server) => self.choose_discovery(
                        DiscoverySource::Dns {
                            target: host_port,
                            settings: Some(crate::DnsSettings::name_servers([server])),
                        },
                        "target",
                    ),
                    #[cfg(not(feature = "hickory-dns"))]
                    Some(_) => {
                        self.error.get_or_insert(invalid(
                            target,
                            "a DNS server in the target needs the feature `hickory-dns` (the \
                             system's resolver asks the servers of /etc/resolv.conf); or leave \
                             it out: `dns:///host:port`",
                        ));
                    }
                }
                self
            }
            #[cfg(feature = "xds")]
            Ok(Parsed::Xds(target)) => self.xds(&target),
            #[cfg(not(feature = "xds"))]
            Ok(Parsed::Xds(_)) => {
                self.error
                    .get_or_insert(invalid(target, "an xDS target needs the feature `xds`"));
                self
            }
            Err(e) => {
                self.error.get_or_insert(e);
                self
            }
        }
    }
}

#[cfg(feature = "metrics")]
impl Builder {
    /// The metrics' `grpc.target` of a channel over a fixed list. gRPC's is the target the
    /// channel was made with, and a channel without one may have one made up (gRFC A66,
    /// [`grpc.target`](https://github.com/grpc/proposal/blob/master/A66-otel-stats.md)): the
    /// target string the list was given as (`ipv4:...`, `unix:...`); one instance named by a
    /// host name, `dns:///host:port`, as grpc-go's `NewClient("host:port")` names its channel;
    /// one socket, its `unix:` URI. Other lists are `static`, one label whatever their
    /// addresses: a label made of them would start new series with each deploy's addresses.
    pub(super) fn list_target(&self) -> String {
        if let [(target, n)] = &self.list_targets[..] {
            if *n == self.endpoints.len() {
                return target.clone();
            }
        }
        if let [one] = &self.endpoints[..] {
            if one.name.starts_with("unix:") {
                return one.name.to_string();
            }
            let uri = one.endpoint.uri();
            let host = uri.host().unwrap_or_default();
            let literal = host.trim_start_matches('[').trim_end_matches(']');
            let named = !host.is_empty() && literal.parse::<std::net::IpAddr>().is_err();
            if named && matches!(one.dial, crate::target::Dial::Endpoint) {
                let https = uri.scheme_str() == Some("https");
                let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
                return format!("dns:///{host}:{port}");
            }
        }
        if self.metrics.target.is_none() {
            tracing::info!(
                instances = self.endpoints.len(),
                "this channel's metrics are labelled grpc.target=\"static\", as every channel \
                 over a list of addresses is; name its service with Builder::metrics_target"
            );
        }
        "static".to_owned()
    }
}

fn invalid(target: &str, reason: &str) -> Error {
    Error::InvalidUri {
        uri: target.to_owned(),
        reason: reason.to_owned(),
        source: None,
    }
}

/// Reads a target string (see [`Builder::target`]).
fn parse(target: &str) -> Result<Parsed, Error> {
    let bad = |what: &str| invalid(target, &format!("{what}; {FORMS}"));
    let (scheme, rest) = match target.split_once(':') {
        Some((scheme, rest)) if is_scheme(scheme) => (scheme, rest),
        _ => ("", target),
    };
    match scheme {
        "dns" => {
            let (server, name) = match rest.strip_prefix("//") {
                Some(after) => {
                    let (authority, name) = after
                        .split_once('/')
                        .ok_or_else(|| bad("`dns://` is followed by a DNS server and `/`"))?;
                    let server = match authority {
                        "" => None,
                        a => Some(dns_server(a).ok_or_else(|| {
                            bad(&format!("the DNS server `{a}` is not an IP address[:port]"))
                        })?),
                    };
                    (server, name)
                }
                None => (None, rest),
            };
            Ok(Parsed::Dns {
                host_port: host_port(name).ok_or_else(|| bad("no host to resolve"))?,
                server,
            })
        }
        "ipv4" => addresses(rest, |a| {
            let (ip, port) = split_port(a)?;
            ip.parse::<Ipv4Addr>().ok()?;
            Some(format!("http://{ip}:{port}"))
        })
        .ok_or_else(|| bad("expected IPv4 addresses with their ports, separated by commas")),
        "ipv6" => addresses(rest, |a| {
            let (ip, port) = match a.strip_prefix('[') {
                Some(inner) => {
                    let (ip, after) = inner.split_once(']')?;
                    let port = match after {
                        "" => DEFAULT_PORT,
                        p => port_of(p.strip_prefix(':')?)?,
                    };
                    (ip, port)
                }
                None => (a, DEFAULT_PORT),
            };
            ip.parse::<Ipv6Addr>().ok()?;
            Some(format!("http://[{ip}]:{port}"))
        })
        .ok_or_else(|| {
            bad("expected IPv6 addresses in brackets with their ports, separated by commas")
        }),
        "unix" => Ok(Parsed::Uris(vec![target.to_owned()])),
        "unix-abstract" => Err(invalid(
            target,
            "abstract Unix sockets are not supported (tonic connects to sockets by path): \
             reach one with `endpoint_with_connector`",
        )),
        "xds" => Ok(Parsed::Xds(target.to_owned())),
        "http" | "https" => Ok(Parsed::Dns {
            host_port: target.to_owned(),
            server: None,
        }),
        // No scheme, or one gRPC does not know: a DNS name, as in gRPC.
        _ => Ok(Parsed::Dns {
            host_port: host_port(target).ok_or_else(|| bad("no host to resolve"))?,
            server: None,
        }),
    }
}

/// Whether `s` can be a URI scheme that gRPC knows (an unknown one makes the whole target a DNS
/// name, as `localhost:50051` is).
fn is_scheme(s: &str) -> bool {
    matches!(
        s,
        "dns" | "ipv4" | "ipv6" | "unix" | "unix-abstract" | "xds" | "http" | "https"
    )
}

/// `host[:port]` with the port gRPC gives a target without one; `None` for an empty host.
fn host_port(name: &str) -> Option<String> {
    if name.is_empty() || name.starts_with(':') {
        return None;
    }
    // A port is there if the last colon follows the host: not inside a bracketed IPv6 literal.
    let has_port = match name.rfind(':') {
        Some(i) => !name.starts_with('[') || name[..i].ends_with(']'),
        None => false,
    };
    Some(if has_port {
        name.to_owned()
    } else {
        format!("{name}:{DEFAULT_PORT}")
    })
}

/// `address[:port]` of an IPv4 list: the address and the port (443 when none is given).
fn split_port(a: &str) -> Option<(&str, u16)> {
    match a.split_once(':') {
        Some((ip, port)) => Some((ip, port_of(port)?)),
        None => Some((a, DEFAULT_PORT)),
    }
}

/// A port from 1 to 65535.
fn port_of(p: &str) -> Option<u16> {
    p.parse::<u16>().ok().filter(|p| *p != 0)
}

/// A DNS server as C-core's c-ares resolver takes it: `IP[:port]` (port 53 by default).
fn dns_server(a: &str) -> Option<SocketAddr> {
    a.parse::<SocketAddr>()
        .ok()
        .or_else(|| {
            a.parse::<std::net::IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, 53))
        })
        .or_else(|| {
            let ip = a.strip_prefix('[')?.strip_suffix(']')?;
            Some(SocketAddr::new(ip.parse().ok()?, 53))
        })
}

/// A comma-separated list, each item made a URI by `uri`; `None` if any is malformed or the list
/// is empty.
fn addresses(list: &str, uri: impl Fn(&str) -> Option<String>) -> Option<Parsed> {
    let uris = list
        .split(',')
        .map(|a| uri(a.trim()))
        .collect::<Option<Vec<_>>>()?;
    (!uris.is_empty()).then_some(Parsed::Uris(uris))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(host_port: &str, server: Option<&str>) -> Parsed {
        Parsed::Dns {
            host_port: host_port.to_owned(),
            server: server.map(|s| s.parse().unwrap()),
        }
    }

    fn uris(u: &[&str]) -> Parsed {
        Parsed::Uris(u.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn the_forms_of_grpcs_naming_doc() {
        let cases: &[(&str, Parsed)] = &[
            ("dns:///svc:50051", dns("svc:50051", None)),
            ("dns:svc:50051", dns("svc:50051", None)),
            ("dns:///svc", dns("svc:443", None)),
            ("dns://10.0.0.10/svc:1", dns("svc:1", Some("10.0.0.10:53"))),
            (
                "dns://10.0.0.10:5353/svc:1",
                dns("svc:1", Some("10.0.0.10:5353")),
            ),
            ("dns://[::1]:53/svc:1", dns("svc:1", Some("[::1]:53"))),
            ("dns:///[::1]:50051", dns("[::1]:50051", None)),
            ("dns:///[::1]", dns("[::1]:443", None)),
            (
                "svc.ns.svc.cluster.local:50051",
                dns("svc.ns.svc.cluster.local:50051", None),
            ),
            ("localhost:50051", dns("localhost:50051", None)),
            ("localhost", dns("localhost:443", None)),
            ("https://svc:443", dns("https://svc:443", None)),
            (
                "ipv4:10.0.0.1:50051,10.0.0.2",
                uris(&["http://10.0.0.1:50051", "http://10.0.0.2:443"]),
            ),
            (
                "ipv6:[2001:db8::1]:50051,[::1],::2",
                uris(&[
                    "http://[2001:db8::1]:50051",
                    "http://[::1]:443",
                    "http://[::2]:443",
                ]),
            ),
            ("unix:/run/a.sock", uris(&["unix:/run/a.sock"])),
            ("unix:///run/a.sock", uris(&["unix:///run/a.sock"])),
            ("xds:///svc", Parsed::Xds("xds:///svc".into())),
        ];
        for (target, want) in cases {
            assert_eq!(parse(target).as_ref().ok(), Some(want), "{target}");
        }
    }

    #[test]
    fn malformed_targets_are_refused_with_the_accepted_forms() {
        for target in [
            "dns:///",
            "dns://",
            "dns://not-an-ip/svc:1",
            "ipv4:10.0.0.1:0",
            "ipv4:10.0.0.1:99999",
            "ipv4:10.0.0.300:1",
            "ipv4:",
            "ipv6:[::1]:x",
            "ipv6:[::1",
            "unix-abstract:name",
            "",
        ] {
            let e = parse(target).expect_err(target).to_string();
            assert!(e.contains(target), "{target}: {e}");
        }
        let e = parse("ipv4:1.2.3.4:0").unwrap_err().to_string();
        assert!(e.contains("accepted: `dns:"), "{e}");
    }
}
