//! EDS as a client reads it: a ClusterLoadAssignment's localities, each with its priority,
//! weight and endpoints (address, health status, weight), and the drop policy.
//!
//! Field numbers: envoy's `config/endpoint/v3/{endpoint,endpoint_components}.proto`,
//! `config/core/v3/{address,base,health_check}.proto`, `type/v3/percent.proto`.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md)
//! (priorities, locality weights, which health statuses are usable).

use std::net::{IpAddr, SocketAddr};

use super::wire::{fields, wrapped, Invalid};

/// A ClusterLoadAssignment, validated.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Endpoints {
    /// The localities of each priority, from priority 0 (the most preferred) on.
    pub(crate) priorities: Vec<Vec<Locality>>,
    /// (category, calls dropped per million).
    pub(crate) drops: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Locality {
    /// region/zone/sub_zone, for logs.
    pub(crate) name: String,
    pub(crate) weight: u32,
    pub(crate) endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    pub(crate) addr: SocketAddr,
    pub(crate) health: EndpointHealth,
    /// 1 when unset.
    pub(crate) weight: u32,
}

/// `envoy.config.core.v3.HealthStatus`, as A27 uses it: UNKNOWN and HEALTHY take calls,
/// DRAINING finishes the calls it has and takes no new ones, the rest take none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndpointHealth {
    Unknown,
    Healthy,
    Unhealthy,
    Draining,
    Timeout,
    Degraded,
}

impl EndpointHealth {
    fn from_wire(v: u64) -> EndpointHealth {
        match v {
            1 => EndpointHealth::Healthy,
            2 => EndpointHealth::Unhealthy,
            3 => EndpointHealth::Draining,
            4 => EndpointHealth::Timeout,
            5 => EndpointHealth::Degraded,
            _ => EndpointHealth::Unknown,
        }
    }

    /// Whether the endpoint takes new calls.
    pub(crate) fn is_usable(self) -> bool {
        matches!(self, EndpointHealth::Unknown | EndpointHealth::Healthy)
    }
}

impl Endpoints {
    pub(crate) fn decode(buf: &[u8]) -> Result<(String, Endpoints), Invalid> {
        let mut name = String::new();
        let mut by_priority: Vec<(u32, Locality)> = Vec::new();
        let mut drops = Vec::new();
        for f in fields(buf, "ClusterLoadAssignment") {
            match f? {
                (1, v) => name = v.str("cluster_name")?.to_owned(),
                (2, v) => {
                    if let Some(l) = locality(v.message("endpoints")?)? {
                        by_priority.push(l);
                    }
                }
                (4, v) => drops = drop_policy(v.message("policy")?)?,
                _ => {}
            }
        }
        let top = by_priority.iter().map(|(p, _)| *p).max();
        let mut priorities: Vec<Vec<Locality>> = match top {
            Some(top) => vec![Vec::new(); top as usize + 1],
            None => Vec::new(),
        };
        if priorities.len() > by_priority.len() {
            return Err(Invalid::new(format!(
                "endpoints {name:?}: priorities are not contiguous from 0"
            )));
        }
        for (p, l) in by_priority {
            priorities[p as usize].push(l);
        }
        if let Some(p) = priorities.iter().position(Vec::is_empty) {
            return Err(Invalid::new(format!(
                "endpoints {name:?}: priority {p} is missing (priorities must be contiguous from 0)"
            )));
        }
        Ok((name, Endpoints { priorities, drops }))
    }

    /// The usable endpoints of the most preferred priority that has any.
    #[cfg(test)]
    pub(crate) fn usable(&self) -> (usize, Vec<(SocketAddr, f64)>) {
        self.usable_by_priority()
            .into_iter()
            .next()
            .unwrap_or((0, Vec::new()))
    }

    /// The usable endpoints (HEALTHY or UNKNOWN) of each priority that has any, most preferred
    /// first (A27: a priority is used while the ones above it have none), each with its share
    /// of its priority's calls as gRPC gives them: its locality's share of the localities'
    /// weights (of those with a usable endpoint) times its share of its locality's usable
    /// endpoints' weights (A27's weighted target over localities, weighted round robin within
    /// one).
    pub(crate) fn usable_by_priority(&self) -> Vec<(usize, Vec<(SocketAddr, f64)>)> {
        let mut by_priority = Vec::new();
        for (p, localities) in self.priorities.iter().enumerate() {
            let usable: Vec<(u64, Vec<&Endpoint>)> = localities
                .iter()
                .map(|l| {
                    let eps: Vec<&Endpoint> = l
                        .endpoints
                        .iter()
                        .filter(|e| e.health.is_usable())
                        .collect();
                    (u64::from(l.weight), eps)
                })
                .filter(|(_, eps)| !eps.is_empty())
                .collect();
            let total: u64 = usable.iter().map(|(w, _)| w).sum();
            let mut out: Vec<(SocketAddr, f64)> = Vec::new();
            for (lw, eps) in &usable {
                let sum: u64 = eps.iter().map(|e| u64::from(e.weight)).sum();
                for e in eps {
                    let share = (*lw as f64 / total as f64) * (f64::from(e.weight) / sum as f64);
                    match out.iter_mut().find(|(a, _)| *a == e.addr) {
                        Some(same) => same.1 += share,
                        None => out.push((e.addr, share)),
                    }
                }
            }
            if !out.is_empty() {
                by_priority.push((p, out));
            }
        }
        by_priority
    }
}

/// A locality and its priority; `None` for a locality of weight 0 or unset, which A27 ignores.
fn locality(buf: &[u8]) -> Result<Option<(u32, Locality)>, Invalid> {
    let (mut name, mut weight, mut priority) = (String::new(), 0u64, 0u64);
    let mut endpoints = Vec::new();
    for f in fields(buf, "LocalityLbEndpoints") {
        match f? {
            (1, v) => {
                let mut parts = [""; 3];
                for f in fields(v.message("locality")?, "Locality") {
                    if let (n @ 1..=3, v) = f? {
                        parts[n as usize - 1] = v.str("locality")?;
                    }
                }
                name = parts.join("/");
            }
            (2, v) => endpoints.push(endpoint(v.message("lb_endpoints")?)?),
            (3, v) => weight = wrapped(v.message("load_balancing_weight")?, "locality weight")?,
            (5, v) => priority = v.varint("priority")?,
            _ => {}
        }
    }
    if weight == 0 {
        return Ok(None);
    }
    if weight > u64::from(u32::MAX) || priority > 1024 {
        return Err(Invalid::new(format!(
            "locality {name:?}: weight or priority out of range"
        )));
    }
    let l = Locality {
        name,
        weight: weight as u32,
        endpoints,
    };
    Ok(Some((priority as u32, l)))
}

fn endpoint(buf: &[u8]) -> Result<Endpoint, Invalid> {
    let (mut addr, mut health, mut weight) = (None, EndpointHealth::Unknown, 1u64);
    for f in fields(buf, "LbEndpoint") {
        match f? {
            (1, v) => addr = endpoint_address(v.message("endpoint")?)?,
            (2, v) => health = EndpointHealth::from_wire(v.varint("health_status")?),
            (4, v) => weight = wrapped(v.message("load_balancing_weight")?, "endpoint weight")?,
            _ => {}
        }
    }
    let addr = addr.ok_or_else(|| Invalid::new("an endpoint without a socket address"))?;
    if weight == 0 || weight > u64::from(u32::MAX) {
        return Err(Invalid::new(format!(
            "endpoint {addr}: weight {weight} (1 to 2^32 - 1)"
        )));
    }
    Ok(Endpoint {
        addr,
        health,
        weight: weight as u32,
    })
}

/// `Endpoint.address.socket_address`: an IP address and a port (A27: no names).
fn endpoint_address(buf: &[u8]) -> Result<Option<SocketAddr>, Invalid> {
    let mut out = None;
    for f in fields(buf, "Endpoint") {
        let (1, v) = f? else { continue };
        for f in fields(v.message("address")?, "Address") {
            let (1, v) = f? else { continue };
            let (mut ip, mut port) = (None, 0u64);
            for f in fields(v.message("socket_address")?, "SocketAddress") {
                match f? {
                    (2, v) => {
                        let s = v.str("address")?;
                        ip = Some(s.parse::<IpAddr>().map_err(|_| {
                            Invalid::new(format!("endpoint address {s:?} is not an IP address"))
                        })?);
                    }
                    (3, v) => port = v.varint("port_value")?,
                    (4, _) => return Err(Invalid::new("named_port is not supported")),
                    _ => {}
                }
            }
            let ip = ip.ok_or_else(|| Invalid::new("socket_address without an address"))?;
            if port == 0 || port > 65535 {
                return Err(Invalid::new(format!(
                    "endpoint {ip}: port {port} (1 to 65535)"
                )));
            }
            out = Some(SocketAddr::new(ip, port as u16));
        }
    }
    Ok(out)
}

/// The drop policy's categories, as calls per million.
fn drop_policy(buf: &[u8]) -> Result<Vec<(String, u32)>, Invalid> {
    let mut drops = Vec::new();
    for f in fields(buf, "Policy") {
        let (2, v) = f? else { continue };
        let (mut category, mut per_million) = (String::new(), 0u64);
        for f in fields(v.message("drop_overloads")?, "DropOverload") {
            match f? {
                (1, v) => category = v.str("category")?.to_owned(),
                (2, v) => {
                    let (mut numerator, mut denominator) = (0u64, 0u64);
                    for f in fields(v.message("drop_percentage")?, "FractionalPercent") {
                        match f? {
                            (1, v) => numerator = v.varint("numerator")?,
                            (2, v) => denominator = v.varint("denominator")?,
                            _ => {}
                        }
                    }
                    let scale = match denominator {
                        0 => 10_000, // HUNDRED
                        1 => 100,    // TEN_THOUSAND
                        _ => 1,      // MILLION
                    };
                    per_million = numerator.saturating_mul(scale).min(1_000_000);
                }
                _ => {}
            }
        }
        drops.push((category, per_million as u32));
    }
    Ok(drops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16, health: EndpointHealth) -> Endpoint {
        Endpoint {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            health,
            weight: 1,
        }
    }

    /// A27: the most preferred priority with a usable endpoint serves; DRAINING and
    /// UNHEALTHY endpoints do not count as usable.
    #[test]
    fn the_first_priority_with_a_usable_endpoint_serves() {
        let e = Endpoints {
            priorities: vec![
                vec![Locality {
                    name: "a".into(),
                    weight: 3,
                    endpoints: vec![
                        ep(1, EndpointHealth::Draining),
                        ep(2, EndpointHealth::Unhealthy),
                    ],
                }],
                vec![Locality {
                    name: "b".into(),
                    weight: 2,
                    endpoints: vec![
                        ep(3, EndpointHealth::Healthy),
                        ep(4, EndpointHealth::Unknown),
                    ],
                }],
            ],
            drops: Vec::new(),
        };
        let (p, usable) = e.usable();
        assert_eq!(p, 1);
        let ports: Vec<(u16, f64)> = usable.iter().map(|(a, w)| (a.port(), *w)).collect();
        assert_eq!(ports, [(3, 0.5), (4, 0.5)]);
    }

    /// gRPC's two levels: a locality's share of the weights, then the endpoint's share of its
    /// locality's: a locality of weight 1 with one endpoint and one of weight 1 with three
    /// give the lone endpoint half the calls.
    #[test]
    fn shares_are_the_locality_s_times_the_endpoint_s() {
        let e = Endpoints {
            priorities: vec![vec![
                Locality {
                    name: "a".into(),
                    weight: 1,
                    endpoints: vec![ep(1, EndpointHealth::Healthy)],
                },
                Locality {
                    name: "b".into(),
                    weight: 1,
                    endpoints: vec![
                        ep(2, EndpointHealth::Healthy),
                        Endpoint {
                            weight: 2,
                            ..ep(3, EndpointHealth::Healthy)
                        },
                        ep(4, EndpointHealth::Unhealthy),
                    ],
                },
            ]],
            drops: Vec::new(),
        };
        let shares: Vec<(u16, f64)> = e.usable().1.iter().map(|(a, w)| (a.port(), *w)).collect();
        assert_eq!(shares, [(1, 0.5), (2, 0.5 / 3.0), (3, 1.0 / 3.0)]);
    }
}
