//! The snapshot spec: what the control plane ([`ControlPlane`](super::ControlPlane)) serves.
//!
//! What a snapshot holds is written here as Rust ([`Snapshot`] and the types it holds) and sent
//! to the peer as one line of JSON, the same names as the fields below: every optional field
//! left `None` (or an empty list) is not set in the resource either, so that a test can send
//! exactly the resource it means, invalid ones included (the peer does not check a snapshot's
//! consistency).

use std::net::SocketAddr;

use serde::Serialize;

fn is_false(b: &bool) -> bool {
    !*b
}

/// What the control plane serves: the resources of every type, each the whole set of its type
/// (state of the world), and a version.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Snapshot {
    /// Every resource type's version; `None`: the peer numbers its snapshots itself (1, 2, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<Listener>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<Cluster>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<ClusterEndpoints>,
}

impl Snapshot {
    /// An empty snapshot of this version.
    pub fn new(version: impl Into<String>) -> Snapshot {
        Snapshot {
            version: Some(version.into()),
            ..Snapshot::default()
        }
    }

    /// The whole chain for one listener: listener `listener` by RDS to route configuration
    /// `route-<listener>`, whose one virtual host (domains `*`) sends every call to cluster
    /// `<listener>` (EDS, no policy set), whose endpoints are `endpoints`, all HEALTHY with
    /// weight 1, in one locality (`r1`/`z1`, weight 1).
    pub fn simple(
        version: impl Into<String>,
        listener: &str,
        endpoints: &[SocketAddr],
    ) -> Snapshot {
        let route = format!("route-{listener}");
        let locality = endpoints
            .iter()
            .fold(Locality::new("r1", "z1"), |l, &addr| {
                l.endpoint(addr, Health::Healthy, 1)
            });
        Snapshot::new(version)
            .listener_rds(listener, &route)
            .route(&route, listener)
            .cluster(Cluster::eds(listener))
            .endpoints(ClusterEndpoints::new(listener).locality(locality))
    }

    /// Adds a listener.
    pub fn listener(mut self, listener: Listener) -> Snapshot {
        self.listeners.push(listener);
        self
    }

    /// Adds listener `name`, whose route configuration is `route`, fetched by RDS.
    pub fn listener_rds(self, name: &str, route: &str) -> Snapshot {
        self.listener(Listener::rds(name, route))
    }

    /// Adds listener `name` with its route configuration inline: one virtual host (domains
    /// `*`) sending every call to `cluster`.
    pub fn listener_inline(self, name: &str, cluster: &str) -> Snapshot {
        let config = RouteConfig::new("").virtual_host(VirtualHost::to_cluster(cluster));
        self.listener(Listener::inline(name, config))
    }

    /// Adds a route configuration.
    pub fn route_config(mut self, route: RouteConfig) -> Snapshot {
        self.routes.push(route);
        self
    }

    /// Adds route configuration `name`: one virtual host (domains `*`) sending every call to
    /// `cluster`.
    pub fn route(self, name: &str, cluster: &str) -> Snapshot {
        self.route_config(RouteConfig::new(name).virtual_host(VirtualHost::to_cluster(cluster)))
    }

    /// Adds route configuration `name`: one virtual host (domains `*`) sending every call to
    /// these clusters by weight.
    pub fn weighted_route(self, name: &str, clusters: &[(&str, u32)]) -> Snapshot {
        self.route_config(RouteConfig::new(name).virtual_host(VirtualHost::weighted(clusters)))
    }

    /// Adds a cluster.
    pub fn cluster(mut self, cluster: Cluster) -> Snapshot {
        self.clusters.push(cluster);
        self
    }

    /// Adds a ClusterLoadAssignment (the endpoints of a cluster, by EDS).
    pub fn endpoints(mut self, endpoints: ClusterEndpoints) -> Snapshot {
        self.endpoints.push(endpoints);
        self
    }
}

/// A client-side listener: an `ApiListener` whose `HttpConnectionManager` names its route
/// configuration (`rds`, fetched over ADS) or carries it (`inline`), and whose only HTTP filter
/// is the router (which gRPC clients require, gRFC A39), unless `no_router`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listener {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rds: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inline: Option<RouteConfig>,
    /// No HTTP filter at all: a listener gRPC clients NACK.
    #[serde(skip_serializing_if = "is_false")]
    pub no_router: bool,
}

impl Listener {
    /// Listener `name` whose route configuration `route` comes by RDS.
    pub fn rds(name: &str, route: &str) -> Listener {
        Listener {
            name: name.to_owned(),
            rds: Some(route.to_owned()),
            inline: None,
            no_router: false,
        }
    }

    /// Listener `name` carrying its route configuration.
    pub fn inline(name: &str, config: RouteConfig) -> Listener {
        Listener {
            name: name.to_owned(),
            rds: None,
            inline: Some(config),
            no_router: false,
        }
    }

    /// Without the router filter (no HTTP filter at all).
    pub fn no_router(mut self) -> Listener {
        self.no_router = true;
        self
    }
}

/// A route configuration: its virtual hosts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteConfig {
    pub name: String,
    pub virtual_hosts: Vec<VirtualHost>,
}

impl RouteConfig {
    /// Route configuration `name`, with no virtual host yet.
    pub fn new(name: &str) -> RouteConfig {
        RouteConfig {
            name: name.to_owned(),
            virtual_hosts: Vec::new(),
        }
    }

    /// Adds a virtual host.
    pub fn virtual_host(mut self, host: VirtualHost) -> RouteConfig {
        self.virtual_hosts.push(host);
        self
    }
}

/// A virtual host with one route: path prefix `prefix` (`None`: "", every path) to `cluster`,
/// or to `weighted_clusters` (exactly one of the two, or the peer refuses it); and the routes
/// `routes_before`, which come before it in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VirtualHost {
    /// `None`: `vh-<its index>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The `:authority` values it matches (gRPC matches the target's name against them, as
    /// A27 says: `*`, a suffix or prefix wildcard, or the name itself).
    pub domains: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weighted_clusters: Vec<WeightedCluster>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes_before: Vec<RouteEntry>,
}

/// A route of a virtual host before its last one: by path prefix, or by whole path, to one
/// cluster or to weighted clusters.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct RouteEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The path compared without case (`case_sensitive` false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub case_insensitive: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weighted_clusters: Vec<WeightedCluster>,
}

impl RouteEntry {
    /// Calls whose path starts with `prefix`, to `cluster`.
    pub fn prefix(prefix: &str, cluster: &str) -> RouteEntry {
        RouteEntry {
            prefix: Some(prefix.to_owned()),
            cluster: Some(cluster.to_owned()),
            ..RouteEntry::default()
        }
    }

    /// Calls of the path `path` exactly, to `cluster`.
    pub fn path(path: &str, cluster: &str) -> RouteEntry {
        RouteEntry {
            path: Some(path.to_owned()),
            cluster: Some(cluster.to_owned()),
            ..RouteEntry::default()
        }
    }

    /// The path compared without case.
    pub fn case_insensitive(mut self) -> RouteEntry {
        self.case_insensitive = true;
        self
    }
}

impl VirtualHost {
    /// `route` before the routes it has.
    pub fn route_before(mut self, route: RouteEntry) -> VirtualHost {
        self.routes_before.push(route);
        self
    }

    /// Domains `*`, every call to `cluster`.
    pub fn to_cluster(cluster: &str) -> VirtualHost {
        VirtualHost {
            name: None,
            domains: vec!["*".to_owned()],
            prefix: None,
            cluster: Some(cluster.to_owned()),
            weighted_clusters: Vec::new(),
            routes_before: Vec::new(),
        }
    }

    /// Domains `*`, every call to these clusters by weight.
    pub fn weighted(clusters: &[(&str, u32)]) -> VirtualHost {
        VirtualHost {
            name: None,
            domains: vec!["*".to_owned()],
            prefix: None,
            cluster: None,
            weighted_clusters: clusters
                .iter()
                .map(|&(name, weight)| WeightedCluster {
                    name: name.to_owned(),
                    weight: Some(weight),
                })
                .collect(),
            routes_before: Vec::new(),
        }
    }

    /// These domains instead of `*`.
    pub fn domains(mut self, domains: &[&str]) -> VirtualHost {
        self.domains = domains.iter().map(|d| d.to_string()).collect();
        self
    }

    /// This path prefix instead of "".
    pub fn prefix(mut self, prefix: &str) -> VirtualHost {
        self.prefix = Some(prefix.to_owned());
        self
    }
}

/// One cluster of a weighted route.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WeightedCluster {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// How a cluster finds its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClusterType {
    /// By EDS over ADS.
    Eds,
    /// In the cluster itself (`load_assignment`): a type gRPC does not support (A27), for NACK
    /// tests.
    Static,
}

/// `Cluster.lb_policy`, the legacy enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum LbPolicy {
    RoundRobin,
    LeastRequest,
    RingHash,
    Random,
    Maglev,
    ClusterProvided,
    LoadBalancingPolicyConfig,
}

/// A cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    pub name: String,
    /// `None`: EDS.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<ClusterType>,
    /// The ClusterLoadAssignment to fetch by EDS; `None`: the cluster's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eds_service_name: Option<String>,
    /// A STATIC cluster's endpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_assignment: Option<ClusterEndpoints>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lb_policy: Option<LbPolicy>,
    /// `Cluster.load_balancing_policy` (gRFC A52): the policies in order of preference (a
    /// client takes the first it supports); empty: not set.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub load_balancing_policy: Vec<Policy>,
    /// `Some` (even all `None` inside) turns outlier detection on (gRFC A50).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// `circuit_breakers.thresholds` [{priority DEFAULT, `max_requests`}] (gRFC A32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u32>,
}

impl Cluster {
    /// EDS cluster `name`, its endpoints fetched under its own name; nothing else set.
    pub fn eds(name: &str) -> Cluster {
        Cluster {
            name: name.to_owned(),
            kind: Some(ClusterType::Eds),
            eds_service_name: None,
            load_assignment: None,
            lb_policy: None,
            load_balancing_policy: Vec::new(),
            outlier_detection: None,
            max_requests: None,
        }
    }

    /// STATIC cluster `name` with these endpoints (gRPC NACKs it).
    pub fn static_(name: &str, endpoints: ClusterEndpoints) -> Cluster {
        Cluster {
            kind: Some(ClusterType::Static),
            load_assignment: Some(endpoints),
            ..Cluster::eds(name)
        }
    }

    /// Fetches the endpoints under this name instead of the cluster's.
    pub fn eds_service_name(mut self, name: &str) -> Cluster {
        self.eds_service_name = Some(name.to_owned());
        self
    }

    pub fn lb_policy(mut self, policy: LbPolicy) -> Cluster {
        self.lb_policy = Some(policy);
        self
    }

    /// Adds a policy to `load_balancing_policy` (after those already there).
    pub fn policy(mut self, policy: Policy) -> Cluster {
        self.load_balancing_policy.push(policy);
        self
    }

    pub fn outlier_detection(mut self, od: OutlierDetection) -> Cluster {
        self.outlier_detection = Some(od);
        self
    }

    pub fn max_requests(mut self, n: u32) -> Cluster {
        self.max_requests = Some(n);
        self
    }
}

/// One policy of `Cluster.load_balancing_policy`: its name and the settings of the policies that
/// have some (`None`: unset). Names: `round_robin`, `least_request`, `wrr`
/// (ClientSideWeightedRoundRobin), `ring_hash`, `pick_first`, `wrr_locality` (with `child`), or
/// a type URL (containing `/`) of a policy no client knows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Policy {
    pub name: String,
    /// least_request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choice_count: Option<u32>,
    /// ring_hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_ring_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ring_size: Option<u64>,
    /// pick_first.
    #[serde(skip_serializing_if = "is_false")]
    pub shuffle_address_list: bool,
    /// wrr.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_oob_load_report: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oob_reporting_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blackout_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_expiration_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_update_period_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_utilization_penalty: Option<f32>,
    /// wrr_locality: its endpoint-picking policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<Box<Policy>>,
}

impl Policy {
    /// A policy of this name with no settings.
    pub fn named(name: &str) -> Policy {
        Policy {
            name: name.to_owned(),
            ..Policy::default()
        }
    }

    pub fn round_robin() -> Policy {
        Policy::named("round_robin")
    }

    pub fn least_request(choice_count: Option<u32>) -> Policy {
        Policy {
            choice_count,
            ..Policy::named("least_request")
        }
    }

    /// ClientSideWeightedRoundRobin, no setting (the wrr fields are pub).
    pub fn wrr() -> Policy {
        Policy::named("wrr")
    }

    pub fn ring_hash(min_ring_size: Option<u64>, max_ring_size: Option<u64>) -> Policy {
        Policy {
            min_ring_size,
            max_ring_size,
            ..Policy::named("ring_hash")
        }
    }

    pub fn pick_first(shuffle_address_list: bool) -> Policy {
        Policy {
            shuffle_address_list,
            ..Policy::named("pick_first")
        }
    }

    /// WrrLocality with this endpoint-picking policy (what Envoy-style control planes send).
    pub fn wrr_locality(child: Policy) -> Policy {
        Policy {
            child: Some(Box::new(child)),
            ..Policy::named("wrr_locality")
        }
    }

    /// A policy no client knows: an `Any` of this type URL with an empty value.
    pub fn unknown(type_url: &str) -> Policy {
        assert!(type_url.contains('/'), "a type URL: {type_url}");
        Policy::named(type_url)
    }
}

/// `Cluster.outlier_detection`: each field `None` is unset; durations in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutlierDetection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_5xx: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_consecutive_5xx: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_failure: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_consecutive_gateway_failure: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_ejection_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejection_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate_stdev_factor: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_success_rate: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate_minimum_hosts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub success_rate_request_volume: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage_threshold: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforcing_failure_percentage: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage_minimum_hosts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_percentage_request_volume: Option<u32>,
}

/// A ClusterLoadAssignment: a cluster's endpoints by locality, and its drop policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterEndpoints {
    /// The cluster's name (or its `eds_service_name`).
    pub cluster_name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub localities: Vec<Locality>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drop_overloads: Vec<DropOverload>,
}

impl ClusterEndpoints {
    /// The endpoints of `cluster`, no locality yet.
    pub fn new(cluster: &str) -> ClusterEndpoints {
        ClusterEndpoints {
            cluster_name: cluster.to_owned(),
            localities: Vec::new(),
            drop_overloads: Vec::new(),
        }
    }

    pub fn locality(mut self, locality: Locality) -> ClusterEndpoints {
        self.localities.push(locality);
        self
    }

    /// Drops this share of the calls (in millionths) in `category`.
    pub fn drop_overload(mut self, category: &str, per_million: u32) -> ClusterEndpoints {
        self.drop_overloads.push(DropOverload {
            category: category.to_owned(),
            per_million,
        });
        self
    }
}

/// `ClusterLoadAssignment.policy.drop_overloads[]`: a FractionalPercent per million.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DropOverload {
    pub category: String,
    pub per_million: u32,
}

/// A locality's endpoints (`LocalityLbEndpoints`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub sub_zone: String,
    /// `load_balancing_weight`. gRPC ignores a locality whose weight is unset or 0 (A27), so
    /// [`Locality::new`] sets 1; `None` leaves it unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    pub priority: u32,
    pub endpoints: Vec<Endpoint>,
}

impl Locality {
    /// Locality `region`/`zone`, weight 1, priority 0, no endpoint yet.
    pub fn new(region: &str, zone: &str) -> Locality {
        Locality {
            region: region.to_owned(),
            zone: zone.to_owned(),
            sub_zone: String::new(),
            weight: Some(1),
            priority: 0,
            endpoints: Vec::new(),
        }
    }

    pub fn sub_zone(mut self, sub_zone: &str) -> Locality {
        self.sub_zone = sub_zone.to_owned();
        self
    }

    pub fn weight(mut self, weight: u32) -> Locality {
        self.weight = Some(weight);
        self
    }

    pub fn priority(mut self, priority: u32) -> Locality {
        self.priority = priority;
        self
    }

    /// Adds an endpoint with this health status and weight.
    pub fn endpoint(mut self, addr: SocketAddr, health: Health, weight: u32) -> Locality {
        self.endpoints.push(Endpoint {
            health: Some(health),
            weight: Some(weight),
            ..Endpoint::new(addr)
        });
        self
    }

    /// Adds an endpoint as it is (its health and weight may be unset).
    pub fn push(mut self, endpoint: Endpoint) -> Locality {
        self.endpoints.push(endpoint);
        self
    }
}

/// An `LbEndpoint`: a TCP address, its health status and weight (`None`: unset).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Endpoint {
    pub address: String,
    pub port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

impl Endpoint {
    /// This address, health and weight unset.
    pub fn new(addr: SocketAddr) -> Endpoint {
        Endpoint {
            address: addr.ip().to_string(),
            port: addr.port(),
            health: None,
            weight: None,
        }
    }
}

/// An endpoint's `health_status` (gRPC uses the HEALTHY, UNKNOWN and DEGRADED ones, A27).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Health {
    Unknown,
    Healthy,
    Unhealthy,
    Draining,
    Timeout,
    Degraded,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simple_snapshot_as_json() {
        let addr: SocketAddr = "127.0.0.1:1234".parse().unwrap();
        let json = serde_json::to_value(Snapshot::simple("3", "svc", &[addr])).unwrap();
        let want = serde_json::json!({
            "version": "3",
            "listeners": [{"name": "svc", "rds": "route-svc"}],
            "routes": [{"name": "route-svc", "virtual_hosts": [{"domains": ["*"], "cluster": "svc"}]}],
            "clusters": [{"name": "svc", "type": "EDS"}],
            "endpoints": [{"cluster_name": "svc", "localities": [{
                "region": "r1", "zone": "z1", "weight": 1, "priority": 0,
                "endpoints": [{"address": "127.0.0.1", "port": 1234, "health": "HEALTHY", "weight": 1}],
            }]}],
        });
        assert_eq!(json, want);
    }
}
