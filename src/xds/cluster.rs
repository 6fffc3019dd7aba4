//! CDS as a client reads it: a cluster of type EDS, its load-balancing policy (the `lb_policy`
//! enum, or A52's `load_balancing_policy` list, the first entry this client supports), its
//! outlier detection (A50) and its circuit breaker's `max_requests` (A32).
//!
//! Field numbers: envoy's `config/cluster/v3/{cluster,outlier_detection,circuit_breaker}.proto`.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A52](https://github.com/grpc/proposal/blob/master/A52-xds-custom-lb-policies.md),
//! [gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md),
//! [gRFC A32](https://github.com/grpc/proposal/blob/master/A32-xds-circuit-breaking.md).

use super::listener::config_source_is_ads;
use super::wire::{any, duration_ms, fields, wrapped, Invalid};
use crate::pick::Strategy;

const EDS: u64 = 3;
const POLICY: &str = "type.googleapis.com/envoy.extensions.load_balancing_policies.";

/// A Cluster resource, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cluster {
    /// The EDS resource to ask for: `eds_cluster_config.service_name`, else the cluster's name.
    pub(crate) eds_name: String,
    pub(crate) strategy: Strategy,
    pub(crate) outlier: Option<Outlier>,
    /// A32: the most calls in flight to the cluster (default 1024).
    pub(crate) max_requests: u32,
}

/// A50's outlier detection, as far as this client maps it onto its ejection: consecutive
/// failures, the ejection time and its cap, the most instances out at once.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Outlier {
    pub(crate) interval_ms: Option<u64>,
    pub(crate) base_ejection_ms: Option<u64>,
    pub(crate) max_ejection_ms: Option<u64>,
    pub(crate) max_ejection_percent: Option<u64>,
    pub(crate) consecutive_5xx: Option<u64>,
}

impl Cluster {
    pub(crate) fn decode(buf: &[u8]) -> Result<(String, Cluster), Invalid> {
        let mut name = String::new();
        let mut kind = 0; // STATIC, proto3's default
        let mut eds = None;
        let mut lb_policy = 0;
        let mut policies = None;
        let mut outlier = None;
        let mut max_requests = 1024;
        for f in fields(buf, "Cluster") {
            match f? {
                (1, v) => name = v.str("Cluster.name")?.to_owned(),
                (2, v) => kind = v.varint("Cluster.type")?,
                (38, _) => kind = u64::MAX, // a custom cluster type (aggregate, ...)
                (3, v) => eds = Some(eds_config(v.message("eds_cluster_config")?)?),
                (6, v) => lb_policy = v.varint("lb_policy")?,
                (41, v) => policies = Some(v.message("load_balancing_policy")?),
                (19, v) => outlier = Some(outlier_detection(v.message("outlier_detection")?)?),
                (10, v) => max_requests = circuit_breakers(v.message("circuit_breakers")?)?,
                _ => {}
            }
        }
        let fail = |why: String| Invalid::new(format!("cluster {name:?}: {why}"));
        if kind != EDS {
            return Err(fail(format!(
                "type {} is not supported (only EDS)",
                if kind == u64::MAX {
                    "custom".to_owned()
                } else {
                    kind.to_string()
                }
            )));
        }
        let eds_name = match eds {
            Some((false, _)) => return Err(fail("eds_config is neither ads nor self".into())),
            Some((true, service)) if !service.is_empty() => service,
            _ => name.clone(),
        };
        let strategy = match policies {
            Some(list) => policy_list(list, 0).map_err(|e| fail(e.0))?,
            None => match lb_policy {
                0 => Strategy::RoundRobin,
                1 => Strategy::LeastPending,
                other => return Err(fail(format!("lb_policy {other} is not supported"))),
            },
        };
        let cluster = Cluster {
            eds_name,
            strategy,
            outlier,
            max_requests,
        };
        Ok((name, cluster))
    }
}

/// (the config source is ADS, the service name).
fn eds_config(buf: &[u8]) -> Result<(bool, String), Invalid> {
    let (mut ads, mut service) = (false, String::new());
    for f in fields(buf, "EdsClusterConfig") {
        match f? {
            (1, v) => ads = config_source_is_ads(v.message("eds_config")?)?,
            (2, v) => service = v.str("service_name")?.to_owned(),
            _ => {}
        }
    }
    Ok((ads, service))
}

/// A52: the first policy of the list that this client runs; none: invalid. `wrr_locality`
/// (what a control plane sends for locality weights) is read through to its endpoint
/// policy.
fn policy_list(buf: &[u8], depth: u32) -> Result<Strategy, Invalid> {
    if depth > 4 {
        return Err(Invalid::new("load_balancing_policy nested too deep"));
    }
    let mut seen = Vec::new();
    for f in fields(buf, "LoadBalancingPolicy") {
        let (1, v) = f? else { continue };
        for f in fields(v.message("policies")?, "Policy") {
            let (4, v) = f? else { continue };
            for f in fields(v.message("typed_extension_config")?, "TypedExtensionConfig") {
                let (2, v) = f? else { continue };
                let (url, value) = any(v.message("typed_config")?, "typed_config")?;
                let kind = url.strip_prefix(POLICY).unwrap_or(url);
                match kind {
                    "round_robin.v3.RoundRobin" => return Ok(Strategy::RoundRobin),
                    "least_request.v3.LeastRequest" => return Ok(Strategy::LeastPending),
                    "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin" => {
                        return Ok(Strategy::WeightedRoundRobin)
                    }
                    "wrr_locality.v3.WrrLocality" => {
                        for f in fields(value, "WrrLocality") {
                            if let (1, v) = f? {
                                return policy_list(
                                    v.message("endpoint_picking_policy")?,
                                    depth + 1,
                                );
                            }
                        }
                    }
                    _ => {}
                }
                seen.push(kind.to_owned());
            }
        }
    }
    Err(Invalid::new(format!(
        "no supported load_balancing_policy (round_robin, least_request, \
         client_side_weighted_round_robin, wrr_locality of those) in {seen:?}"
    )))
}

fn outlier_detection(buf: &[u8]) -> Result<Outlier, Invalid> {
    let mut o = Outlier::default();
    for f in fields(buf, "OutlierDetection") {
        match f? {
            (1, v) => {
                o.consecutive_5xx = Some(wrapped(v.message("consecutive_5xx")?, "consecutive_5xx")?)
            }
            (2, v) => o.interval_ms = Some(duration_ms(v.message("interval")?, "interval")?),
            (3, v) => {
                o.base_ejection_ms = Some(duration_ms(
                    v.message("base_ejection_time")?,
                    "base_ejection_time",
                )?)
            }
            (4, v) => {
                let p = wrapped(v.message("max_ejection_percent")?, "max_ejection_percent")?;
                if p > 100 {
                    return Err(Invalid::new(format!(
                        "max_ejection_percent {p} is over 100"
                    )));
                }
                o.max_ejection_percent = Some(p);
            }
            (21, v) => {
                o.max_ejection_ms = Some(duration_ms(
                    v.message("max_ejection_time")?,
                    "max_ejection_time",
                )?)
            }
            _ => {}
        }
    }
    Ok(o)
}

/// The DEFAULT priority's `max_requests` (A32), 1024 when unset.
fn circuit_breakers(buf: &[u8]) -> Result<u32, Invalid> {
    let mut max = 1024;
    for f in fields(buf, "CircuitBreakers") {
        let (1, v) = f? else { continue };
        let (mut priority, mut requests) = (0, None);
        for f in fields(v.message("thresholds")?, "Thresholds") {
            match f? {
                (1, v) => priority = v.varint("priority")?,
                (4, v) => requests = Some(wrapped(v.message("max_requests")?, "max_requests")?),
                _ => {}
            }
        }
        if let (0, Some(n)) = (priority, requests) {
            max = n.min(u64::from(u32::MAX)) as u32;
        }
    }
    Ok(max)
}
