//! LDS and RDS as a client reads them (gRFC A27, A28): the API listener's HTTP connection
//! manager names its route configuration (by RDS name, or inline); the route configuration's
//! virtual host for the target's name gives the cluster.
//!
//! Field numbers: envoy's `config/listener/v3/{listener,api_listener}.proto`,
//! `extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto`,
//! `config/route/v3/{route,route_components}.proto`.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A28](https://github.com/grpc/proposal/blob/master/A28-xds-traffic-splitting-and-routing.md),
//! [gRFC A39](https://github.com/grpc/proposal/blob/master/A39-xds-http-filters.md).

use super::wire::{any, fields, wrapped, Invalid};

const HCM: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";

/// A Listener resource, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Listener {
    pub(crate) routes: Routes,
}

/// Where a listener's routes are.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Routes {
    /// An RDS resource of this name.
    Rds(String),
    Inline(RouteConfig),
}

/// A RouteConfiguration resource, validated: its virtual hosts.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct RouteConfig {
    pub(crate) virtual_hosts: Vec<VirtualHost>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct VirtualHost {
    pub(crate) domains: Vec<String>,
    pub(crate) routes: Vec<Route>,
}

/// A route the client can follow: which calls it matches, and where they go.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Route {
    /// The path prefix it matches (`""`: every call), or the whole path with `exact`.
    pub(crate) path: String,
    pub(crate) exact: bool,
    /// A28's `case_sensitive` (true when unset).
    pub(crate) case_sensitive: bool,
    /// Whether it also asks for what this client does not match on (headers, a runtime
    /// fraction, a regex): such a route is passed over.
    pub(crate) unsupported_match: bool,
    pub(crate) action: Action,
}

/// Where a route sends its calls.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    Cluster(String),
    /// A28's weighted clusters: (name, weight), weights above zero.
    Weighted(Vec<(String, u32)>),
    /// A redirect, a direct response, a cluster from a header or a plugin: calls that match
    /// it fail (A28).
    Unsupported(&'static str),
}

impl Listener {
    pub(crate) fn decode(buf: &[u8]) -> Result<(String, Listener), Invalid> {
        let mut name = String::new();
        let mut api = None;
        for f in fields(buf, "Listener") {
            match f? {
                (1, v) => name = v.str("Listener.name")?.to_owned(),
                (19, v) => api = Some(v.message("Listener.api_listener")?),
                _ => {}
            }
        }
        let api = api.ok_or_else(|| Invalid::new(format!("listener {name:?}: no api_listener")))?;
        let mut hcm = None;
        for f in fields(api, "ApiListener") {
            if let (1, v) = f? {
                hcm = Some(any(v.message("ApiListener.api_listener")?, "ApiListener")?);
            }
        }
        let (url, hcm) = hcm.ok_or_else(|| Invalid::new("api_listener: empty"))?;
        if url != HCM {
            return Err(Invalid::new(format!(
                "listener {name:?}: api_listener is {url}, not an HttpConnectionManager"
            )));
        }
        let routes =
            connection_manager(hcm).map_err(|e| Invalid::new(format!("listener {name:?}: {e}")))?;
        Ok((name, Listener { routes }))
    }
}

/// The HTTP connection manager: its routes, and its filters checked (A39: the router last,
/// every other filter optional, since this client runs none).
fn connection_manager(buf: &[u8]) -> Result<Routes, Invalid> {
    let mut routes = None;
    let mut filters: Vec<(String, String, bool)> = Vec::new();
    for f in fields(buf, "HttpConnectionManager") {
        match f? {
            (3, v) => {
                let mut name = String::new();
                let mut ads = false;
                for f in fields(v.message("rds")?, "Rds") {
                    match f? {
                        (1, v) => ads = config_source_is_ads(v.message("config_source")?)?,
                        (2, v) => name = v.str("route_config_name")?.to_owned(),
                        _ => {}
                    }
                }
                if !ads {
                    return Err(Invalid::new("rds.config_source is neither ads nor self"));
                }
                routes = Some(Routes::Rds(name));
            }
            (4, v) => {
                routes = Some(Routes::Inline(
                    RouteConfig::decode(v.message("route_config")?)?.1,
                ))
            }
            (31, _) => return Err(Invalid::new("scoped_routes are not supported")),
            (5, v) => {
                let (mut name, mut url, mut optional) = (String::new(), String::new(), false);
                for f in fields(v.message("http_filters")?, "HttpFilter") {
                    match f? {
                        (1, v) => name = v.str("HttpFilter.name")?.to_owned(),
                        (4, v) => {
                            url = any(v.message("typed_config")?, "typed_config")?
                                .0
                                .to_owned()
                        }
                        (6, v) => optional = v.varint("is_optional")? != 0,
                        _ => {}
                    }
                }
                filters.push((name, url, optional));
            }
            _ => {}
        }
    }
    match filters.last() {
        Some((_, url, _)) if url == ROUTER => {}
        _ => return Err(Invalid::new("the last http filter is not the router")),
    }
    for (name, url, optional) in &filters[..filters.len() - 1] {
        if !optional {
            return Err(Invalid::new(format!(
                "http filter {name:?} ({url}) is not supported (only the router is)"
            )));
        }
    }
    routes.ok_or_else(|| Invalid::new("neither rds nor route_config"))
}

/// Whether a `ConfigSource` says "this same ADS stream": `ads` (3) or `self` (5), the two A27
/// accepts.
pub(crate) fn config_source_is_ads(buf: &[u8]) -> Result<bool, Invalid> {
    let mut ads = false;
    for f in fields(buf, "ConfigSource") {
        if let (3 | 5, _) = f? {
            ads = true;
        }
    }
    Ok(ads)
}

impl RouteConfig {
    pub(crate) fn decode(buf: &[u8]) -> Result<(String, RouteConfig), Invalid> {
        let mut name = String::new();
        let mut rc = RouteConfig::default();
        for f in fields(buf, "RouteConfiguration") {
            match f? {
                (1, v) => name = v.str("RouteConfiguration.name")?.to_owned(),
                (2, v) => rc
                    .virtual_hosts
                    .push(virtual_host(v.message("virtual_hosts")?)?),
                _ => {}
            }
        }
        Ok((name, rc))
    }

    /// The virtual host for `host` (A27: the most specific domain: exact, then the longest
    /// suffix wildcard `*.x`, then the longest prefix wildcard `x.*`, then `*`).
    pub(crate) fn host_for(&self, host: &str) -> Option<&VirtualHost> {
        let host = host.to_ascii_lowercase();
        let rank = |d: &str| -> Option<(u8, usize)> {
            let d = d.to_ascii_lowercase();
            if d == host {
                Some((4, d.len()))
            } else if d == "*" {
                Some((1, 0))
            } else if let Some(suffix) = d.strip_prefix('*') {
                host.ends_with(suffix).then_some((3, d.len()))
            } else if let Some(prefix) = d.strip_suffix('*') {
                host.starts_with(prefix).then_some((2, d.len()))
            } else {
                None
            }
        };
        self.virtual_hosts
            .iter()
            .filter_map(|vh| {
                vh.domains
                    .iter()
                    .filter_map(|d| rank(d))
                    .max()
                    .map(|r| (r, vh))
            })
            .max_by_key(|(r, _)| *r)
            .map(|(_, vh)| vh)
    }
}

impl Route {
    /// Whether the route takes every call (a prefix `""` or `/`, nothing more to match): the
    /// last route a call can reach; where it is the first and names one cluster, the
    /// channel's own set follows that cluster.
    pub(crate) fn takes_every_call(&self) -> bool {
        !self.exact && !self.unsupported_match && (self.path.is_empty() || self.path == "/")
    }
}

fn virtual_host(buf: &[u8]) -> Result<VirtualHost, Invalid> {
    let mut vh = VirtualHost::default();
    for f in fields(buf, "VirtualHost") {
        match f? {
            (2, v) => vh.domains.push(v.str("domains")?.to_owned()),
            (3, v) => {
                if let Some(route) = route(v.message("routes")?)? {
                    vh.routes.push(route);
                }
            }
            _ => {}
        }
    }
    Ok(vh)
}

/// A route; `None` for one without a path match this client knows (A28: skipped).
fn route(buf: &[u8]) -> Result<Option<Route>, Invalid> {
    let mut m = None;
    let mut action = Action::Unsupported("no action");
    for f in fields(buf, "Route") {
        match f? {
            (1, v) => m = route_match(v.message("match")?)?,
            (2, v) => action = route_action(v.message("route")?)?,
            (3, _) => action = Action::Unsupported("redirect"),
            (7, _) => action = Action::Unsupported("direct_response"),
            (18, _) => action = Action::Unsupported("non_forwarding_action"),
            _ => {}
        }
    }
    Ok(m.map(|m| Route {
        path: m.path,
        exact: m.exact,
        case_sensitive: m.case_sensitive,
        unsupported_match: m.more,
        action,
    }))
}

/// What a route matches, as read.
struct Match {
    path: String,
    exact: bool,
    case_sensitive: bool,
    /// It asks for more than the path.
    more: bool,
}

fn route_match(buf: &[u8]) -> Result<Option<Match>, Invalid> {
    let (mut path, mut exact, mut more, mut case_sensitive) = (None, false, false, true);
    for f in fields(buf, "RouteMatch") {
        match f? {
            (1, v) => path = Some(v.str("prefix")?.to_owned()),
            (2, v) => {
                path = Some(v.str("path")?.to_owned());
                exact = true;
            }
            (4, v) => {
                case_sensitive = wrapped(v.message("case_sensitive")?, "case_sensitive")? != 0
            }
            // headers, query_parameters, runtime_fraction, safe_regex, path_separated_prefix,
            // path_match_policy
            (6 | 7 | 9 | 10 | 14 | 15, _) => more = true,
            _ => {}
        }
    }
    Ok(path.or_else(|| more.then(String::new)).map(|path| Match {
        path,
        exact,
        case_sensitive,
        more,
    }))
}

fn route_action(buf: &[u8]) -> Result<Action, Invalid> {
    let mut action = Action::Unsupported("no cluster specifier");
    for f in fields(buf, "RouteAction") {
        match f? {
            (1, v) => action = Action::Cluster(v.str("cluster")?.to_owned()),
            (2, _) => action = Action::Unsupported("cluster_header"),
            (3, v) => {
                let mut clusters = Vec::new();
                for f in fields(v.message("weighted_clusters")?, "WeightedCluster") {
                    if let (1, v) = f? {
                        let (mut name, mut weight) = (String::new(), 0u64);
                        for f in fields(v.message("clusters")?, "ClusterWeight") {
                            match f? {
                                (1, v) => name = v.str("ClusterWeight.name")?.to_owned(),
                                (2, v) => weight = wrapped(v.message("weight")?, "weight")?,
                                _ => {}
                            }
                        }
                        if weight > 0 {
                            clusters.push((name, weight as u32));
                        }
                    }
                }
                let total: u64 = clusters.iter().map(|c| u64::from(c.1)).sum();
                if total == 0 || total > u64::from(u32::MAX) {
                    return Err(Invalid::new(
                        "weighted_clusters: total weight 0 or over 2^32",
                    ));
                }
                action = Action::Weighted(clusters);
            }
            (37 | 39, _) => action = Action::Unsupported("cluster_specifier_plugin"),
            _ => {}
        }
    }
    Ok(action)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(domains: &[&str]) -> VirtualHost {
        VirtualHost {
            domains: domains.iter().map(|d| d.to_string()).collect(),
            routes: Vec::new(),
        }
    }

    /// A27's domain order: exact, suffix wildcard, prefix wildcard, any; the longest wins
    /// within a kind.
    #[test]
    fn the_most_specific_domain_wins() {
        let rc = RouteConfig {
            virtual_hosts: vec![
                host(&["*"]),
                host(&["svc.*"]),
                host(&["*.example.com"]),
                host(&["*.b.example.com"]),
                host(&["exact.example.com"]),
            ],
        };
        let pick = |h: &str| rc.host_for(h).map(|vh| vh.domains[0].clone());
        assert_eq!(
            pick("exact.example.com").as_deref(),
            Some("exact.example.com")
        );
        assert_eq!(pick("a.b.example.com").as_deref(), Some("*.b.example.com"));
        assert_eq!(pick("x.example.com").as_deref(), Some("*.example.com"));
        assert_eq!(pick("svc.local").as_deref(), Some("svc.*"));
        assert_eq!(pick("other").as_deref(), Some("*"));
    }

    #[test]
    fn the_route_of_every_call_is_a_bare_prefix() {
        let r = |path: &str, exact, more| Route {
            path: path.into(),
            exact,
            case_sensitive: true,
            unsupported_match: more,
            action: Action::Cluster("c".into()),
        };
        assert!(r("", false, false).takes_every_call());
        assert!(r("/", false, false).takes_every_call());
        assert!(!r("/a.B/", false, false).takes_every_call());
        assert!(!r("/", true, false).takes_every_call());
        assert!(
            !r("", false, true).takes_every_call(),
            "a route matching on headers"
        );
    }
}
