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
use super::wire::{any, duration_ms, fields, wrapped, wrapped_float, Invalid, Value};
use crate::health::Ejection;
use crate::load::weight::WrrConfig;
use crate::pick::Strategy;
use std::time::Duration;

const EDS: u64 = 3;
const POLICY: &str = "type.googleapis.com/envoy.extensions.load_balancing_policies.";

/// A Cluster resource, validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cluster {
    /// The EDS resource to ask for: `eds_cluster_config.service_name`, else the cluster's name.
    pub(crate) eds_name: String,
    /// The policy the cluster asks for, mapped to a strategy; `None`: it says nothing (no A52
    /// list, and the `lb_policy` enum at its default, ROUND_ROBIN; see `xds::policy`).
    pub(crate) strategy: Option<Strategy>,
    /// The settings of client-side weighted round robin, where that is the policy.
    pub(crate) wrr: Option<ClusterWrr>,
    pub(crate) outlier: Option<Box<Outlier>>,
    /// A32: the most calls in flight to the cluster (default 1024).
    pub(crate) max_requests: u32,
}

/// A58's settings of a cluster's client-side weighted round robin, with A58's defaults for
/// what it leaves unset (those of [`WrrConfig::default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClusterWrr {
    pub(crate) config: WrrConfig,
    /// `enable_oob_load_report`, with its `oob_reporting_period` (10 s when unset).
    pub(crate) oob: Option<Duration>,
}

/// A58's validation: `error_utilization_penalty` not negative (else the cluster is NACKed),
/// durations not negative (`duration_ms` refuses them).
fn wrr_settings(buf: &[u8]) -> Result<ClusterWrr, Invalid> {
    let what = "ClientSideWeightedRoundRobin";
    let mut config = WrrConfig::default();
    let (mut oob_on, mut oob_period) = (false, Duration::from_secs(10));
    let ms = |v: Value<'_>, what: &'static str| -> Result<Duration, Invalid> {
        Ok(Duration::from_millis(duration_ms(v.message(what)?, what)?))
    };
    for f in fields(buf, what) {
        match f? {
            (1, v) => {
                oob_on = wrapped(
                    v.message("enable_oob_load_report")?,
                    "enable_oob_load_report",
                )? != 0
            }
            (2, v) => oob_period = ms(v, "oob_reporting_period")?,
            (3, v) => config.blackout_period = ms(v, "blackout_period")?,
            (4, v) => config.weight_expiration_period = ms(v, "weight_expiration_period")?,
            (5, v) => config.weight_update_period = ms(v, "weight_update_period")?,
            (6, v) => {
                let p = wrapped_float(
                    v.message("error_utilization_penalty")?,
                    "error_utilization_penalty",
                )?;
                if !(p >= 0.0 && p.is_finite()) {
                    return Err(Invalid::new(format!(
                        "client_side_weighted_round_robin.error_utilization_penalty {p} is negative"
                    )));
                }
                config.error_utilization_penalty = f64::from(p);
            }
            _ => {}
        }
    }
    // A58: an expiration period of 0 is the default's (this channel refuses 0).
    if config.weight_expiration_period.is_zero() {
        config.weight_expiration_period = WrrConfig::default().weight_expiration_period;
    }
    Ok(ClusterWrr {
        config,
        oob: oob_on.then_some(oob_period),
    })
}

/// A50's outlier detection, with Envoy's failures-in-a-row rule (`consecutive_5xx`), which
/// A50 leaves out and this channel has: each field as sent (`None`: unset, its default
/// applies; see [`Outlier::ejection`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Outlier {
    pub(crate) consecutive_5xx: Option<u64>,
    pub(crate) enforcing_consecutive_5xx: Option<u64>,
    pub(crate) interval_ms: Option<u64>,
    pub(crate) base_ejection_ms: Option<u64>,
    pub(crate) max_ejection_ms: Option<u64>,
    pub(crate) max_ejection_percent: Option<u64>,
    pub(crate) enforcing_success_rate: Option<u64>,
    pub(crate) success_rate_minimum_hosts: Option<u64>,
    pub(crate) success_rate_request_volume: Option<u64>,
    pub(crate) success_rate_stdev_factor: Option<u64>,
    pub(crate) failure_percentage_threshold: Option<u64>,
    pub(crate) enforcing_failure_percentage: Option<u64>,
    pub(crate) failure_percentage_minimum_hosts: Option<u64>,
    pub(crate) failure_percentage_request_volume: Option<u64>,
}

impl Outlier {
    /// The channel's ejection rules for this outlier detection, with A50's defaults for what
    /// it leaves unset (Envoy's for `consecutive_5xx`: 5, enforced every time):
    /// - the interval rules every `interval` (10 s; 0: the interval rules are off);
    /// - ejections of `base_ejection_time` (30 s; at least 1 ms here), doubling, at most
    ///   `max_ejection_time` (300 s) or the base time if longer, as A50 caps them;
    /// - at most `max_ejection_percent` (10%) of the instances out;
    /// - the success-rate rule unless `enforcing_success_rate` is 0 (A50: on, 100%), with its
    ///   `stdev_factor` in thousandths (1900), minimum hosts (5) and request volume (100);
    /// - the failure-percentage rule only if `enforcing_failure_percentage` is above 0 (A50:
    ///   off), with its threshold (85%), minimum hosts (5) and request volume (50);
    /// - failures in a row: `consecutive_5xx` (5; 0 turns the rule off) with the chance
    ///   `enforcing_consecutive_5xx` (100%).
    ///
    /// The channel's own guards stay: an instance is an outlier of the interval rules only if
    /// its failures are beyond chance, and the success-rate rule also asks a rate below 95%
    /// (see [`Ejection`]).
    pub(crate) fn ejection(&self) -> Ejection {
        let ms = |v: u64| Duration::from_millis(v);
        let pct = |v: Option<u64>, default: u32| v.map_or(default, |v| v.min(100) as u32);
        let count = |v: Option<u64>, default: u64| v.unwrap_or(default);
        let base = ms(self.base_ejection_ms.unwrap_or(30_000).max(1));
        let max = ms(self.max_ejection_ms.unwrap_or(300_000)).max(base);
        let consecutive = count(self.consecutive_5xx, 5);
        let mut e = Ejection::default()
            .interval(match self.interval_ms.unwrap_or(10_000) {
                0 => None,
                v => Some(ms(v)),
            })
            .base_time(base)
            .max_time(max)
            .max_ejected_percent(pct(self.max_ejection_percent, 10))
            .success_rate_enforcement_percent(pct(self.enforcing_success_rate, 100))
            .success_rate_min_hosts(
                count(self.success_rate_minimum_hosts, 5).min(u64::from(u32::MAX)) as u32,
            )
            .success_rate_min_calls(count(self.success_rate_request_volume, 100))
            .success_rate_stdev_factor(count(self.success_rate_stdev_factor, 1900) as f64 / 1000.0)
            .failure_percentage_threshold(pct(self.failure_percentage_threshold, 85))
            .failure_percentage_enforcement_percent(pct(self.enforcing_failure_percentage, 0))
            .failure_percentage_min_hosts(
                count(self.failure_percentage_minimum_hosts, 5).min(u64::from(u32::MAX)) as u32,
            )
            .failure_percentage_min_calls(count(self.failure_percentage_request_volume, 50))
            .consecutive_failures(consecutive.clamp(1, u64::from(u32::MAX)) as u32);
        e.consecutive_enforcement = if consecutive == 0 {
            0
        } else {
            pct(self.enforcing_consecutive_5xx, 100)
        };
        e
    }
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
                (19, v) => {
                    outlier = Some(Box::new(outlier_detection(
                        v.message("outlier_detection")?,
                    )?))
                }
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
        let (strategy, wrr) = match policies {
            Some(list) => {
                let (s, wrr) = policy_list(list, 0).map_err(|e| fail(e.0))?;
                (Some(s), wrr)
            }
            // ROUND_ROBIN is the enum's default: what a cluster that says nothing sends.
            None => match lb_policy {
                0 => (None, None),
                1 => (Some(Strategy::LeastPending), None),
                other => return Err(fail(format!("lb_policy {other} is not supported"))),
            },
        };
        let cluster = Cluster {
            eds_name,
            strategy,
            wrr,
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

/// A52: the first policy of the list that this client runs, with weighted round robin's
/// settings; none: invalid. `wrr_locality` (what a control plane sends for locality weights)
/// is read through to its endpoint policy.
fn policy_list(buf: &[u8], depth: u32) -> Result<(Strategy, Option<ClusterWrr>), Invalid> {
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
                    "round_robin.v3.RoundRobin" => return Ok((Strategy::RoundRobin, None)),
                    "least_request.v3.LeastRequest" => return Ok((Strategy::LeastPending, None)),
                    "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin" => {
                        return Ok((Strategy::WeightedRoundRobin, Some(wrr_settings(value)?)))
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

/// A50's validation: percentages at most 100 (else the cluster is NACKed), durations not
/// negative (`duration_ms` refuses them).
fn outlier_detection(buf: &[u8]) -> Result<Outlier, Invalid> {
    let mut o = Outlier::default();
    let percent = |v: Value<'_>, what: &'static str| -> Result<Option<u64>, Invalid> {
        let p = wrapped(v.message(what)?, what)?;
        if p > 100 {
            return Err(Invalid::new(format!(
                "outlier_detection.{what} {p} is over 100"
            )));
        }
        Ok(Some(p))
    };
    let number = |v: Value<'_>, what: &'static str| -> Result<Option<u64>, Invalid> {
        Ok(Some(wrapped(v.message(what)?, what)?))
    };
    for f in fields(buf, "OutlierDetection") {
        match f? {
            (1, v) => o.consecutive_5xx = number(v, "consecutive_5xx")?,
            (2, v) => o.interval_ms = Some(duration_ms(v.message("interval")?, "interval")?),
            (3, v) => {
                o.base_ejection_ms = Some(duration_ms(
                    v.message("base_ejection_time")?,
                    "base_ejection_time",
                )?)
            }
            (4, v) => o.max_ejection_percent = percent(v, "max_ejection_percent")?,
            (5, v) => o.enforcing_consecutive_5xx = percent(v, "enforcing_consecutive_5xx")?,
            (6, v) => o.enforcing_success_rate = percent(v, "enforcing_success_rate")?,
            (7, v) => o.success_rate_minimum_hosts = number(v, "success_rate_minimum_hosts")?,
            (8, v) => o.success_rate_request_volume = number(v, "success_rate_request_volume")?,
            (9, v) => o.success_rate_stdev_factor = number(v, "success_rate_stdev_factor")?,
            (16, v) => o.failure_percentage_threshold = percent(v, "failure_percentage_threshold")?,
            (17, v) => o.enforcing_failure_percentage = percent(v, "enforcing_failure_percentage")?,
            (19, v) => {
                o.failure_percentage_minimum_hosts = number(v, "failure_percentage_minimum_hosts")?
            }
            (20, v) => {
                o.failure_percentage_request_volume =
                    number(v, "failure_percentage_request_volume")?
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::wire::{put_bytes, put_str, put_uint};

    /// A Cluster of type EDS (from ADS) whose A52 list has client-side weighted round robin
    /// with these settings (already encoded).
    fn wrr_cluster(settings: &[u8]) -> Vec<u8> {
        let mut any = Vec::new();
        put_str(
            &mut any,
            1,
            &format!("{POLICY}client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin"),
        );
        put_bytes(&mut any, 2, settings);
        let mut typed = Vec::new();
        put_str(&mut typed, 1, "wrr");
        put_bytes(&mut typed, 2, &any);
        let mut policy = Vec::new();
        put_bytes(&mut policy, 4, &typed);
        let mut list = Vec::new();
        put_bytes(&mut list, 1, &policy);
        let mut source = Vec::new();
        put_bytes(&mut source, 3, &[]);
        let mut eds = Vec::new();
        put_bytes(&mut eds, 1, &source);
        let mut cluster = Vec::new();
        put_str(&mut cluster, 1, "svc");
        put_uint(&mut cluster, 2, EDS);
        put_bytes(&mut cluster, 3, &eds);
        put_bytes(&mut cluster, 41, &list);
        cluster
    }

    fn duration(field: u32, secs: u64, out: &mut Vec<u8>) {
        let mut d = Vec::new();
        put_uint(&mut d, 1, secs);
        put_bytes(out, field, &d);
    }

    fn penalty(p: f32, out: &mut Vec<u8>) {
        let mut f = vec![0x0d];
        f.extend_from_slice(&p.to_le_bytes());
        put_bytes(out, 6, &f);
    }

    /// A58's settings are read, with its defaults for what is unset; a negative error penalty
    /// is refused (the cluster NACKed).
    #[test]
    fn weighted_round_robins_settings_are_read() {
        let mut settings = Vec::new();
        let mut on = Vec::new();
        put_uint(&mut on, 1, 1);
        put_bytes(&mut settings, 1, &on);
        duration(3, 2, &mut settings);
        duration(5, 3, &mut settings);
        penalty(2.5, &mut settings);
        let (_, c) = Cluster::decode(&wrr_cluster(&settings)).unwrap();
        assert_eq!(c.strategy, Some(Strategy::WeightedRoundRobin));
        let wrr = c.wrr.expect("the settings");
        assert_eq!(
            wrr.config,
            WrrConfig::default()
                .blackout_period(Duration::from_secs(2))
                .weight_update_period(Duration::from_secs(3))
                .error_utilization_penalty(2.5)
        );
        assert_eq!(
            wrr.oob,
            Some(Duration::from_secs(10)),
            "A58's default period"
        );
        let (_, plain) = Cluster::decode(&wrr_cluster(&[])).unwrap();
        assert_eq!(
            plain.wrr,
            Some(ClusterWrr {
                config: WrrConfig::default(),
                oob: None
            })
        );
        let mut negative = Vec::new();
        penalty(-1.0, &mut negative);
        let e = Cluster::decode(&wrr_cluster(&negative)).unwrap_err();
        assert!(e.0.contains("error_utilization_penalty -1"), "{e:?}");
    }

    /// Unset fields take A50's defaults (Envoy's for failures in a row), and the mapped rules
    /// pass the builder's checks.
    #[test]
    fn an_empty_outlier_detection_is_a50s_defaults() {
        let e = Outlier::default().ejection();
        assert_eq!(e.interval, Some(Duration::from_secs(10)));
        assert_eq!(
            (e.base_time, e.max_time),
            (Duration::from_secs(30), Duration::from_secs(300))
        );
        assert_eq!(e.max_ejected_percent, 10);
        assert_eq!(e.success_rate_enforcement, 100);
        assert_eq!(e.success_rate_stdev_factor, 1.9);
        assert_eq!(
            (e.success_rate_min_hosts, e.success_rate_min_calls),
            (5, 100)
        );
        assert_eq!(
            e.failure_percentage_enforcement, 0,
            "A50: off unless enforced"
        );
        assert_eq!(e.failure_percentage_threshold, 85);
        assert_eq!(
            (
                e.failure_percentage_min_hosts,
                e.failure_percentage_min_calls
            ),
            (5, 50)
        );
        assert_eq!(
            (e.consecutive_failures, e.consecutive_enforcement),
            (5, 100)
        );
        e.validate().unwrap();
    }

    /// Each field lands on its setting; the edges are kept in range: an interval of 0 turns
    /// the interval rules off, a base time of 0 is 1 ms, a maximum below the base is the base
    /// (A50), `consecutive_5xx` 0 or its enforcement 0 turn failures in a row off.
    #[test]
    fn each_field_of_outlier_detection_is_mapped() {
        let o = Outlier {
            consecutive_5xx: Some(3),
            enforcing_consecutive_5xx: Some(40),
            interval_ms: Some(250),
            base_ejection_ms: Some(2_000),
            max_ejection_ms: Some(1_000),
            max_ejection_percent: Some(30),
            enforcing_success_rate: Some(0),
            success_rate_minimum_hosts: Some(3),
            success_rate_request_volume: Some(20),
            success_rate_stdev_factor: Some(2_500),
            failure_percentage_threshold: Some(60),
            enforcing_failure_percentage: Some(100),
            failure_percentage_minimum_hosts: Some(2),
            failure_percentage_request_volume: Some(10),
        };
        let e = o.ejection();
        assert_eq!((e.consecutive_failures, e.consecutive_enforcement), (3, 40));
        assert_eq!(e.interval, Some(Duration::from_millis(250)));
        assert_eq!(e.base_time, Duration::from_secs(2));
        assert_eq!(e.max_time, Duration::from_secs(2), "at least the base");
        assert_eq!(e.max_ejected_percent, 30);
        assert_eq!(e.success_rate_enforcement, 0);
        assert_eq!(
            (e.success_rate_min_hosts, e.success_rate_min_calls),
            (3, 20)
        );
        assert_eq!(e.success_rate_stdev_factor, 2.5);
        assert_eq!(
            (
                e.failure_percentage_threshold,
                e.failure_percentage_enforcement
            ),
            (60, 100)
        );
        assert_eq!(
            (
                e.failure_percentage_min_hosts,
                e.failure_percentage_min_calls
            ),
            (2, 10)
        );
        e.validate().unwrap();
        let edges = Outlier {
            consecutive_5xx: Some(0),
            interval_ms: Some(0),
            base_ejection_ms: Some(0),
            ..Outlier::default()
        }
        .ejection();
        assert_eq!(edges.interval, None);
        assert_eq!(edges.base_time, Duration::from_millis(1));
        assert_eq!(edges.consecutive_enforcement, 0);
        edges.validate().unwrap();
        let unenforced = Outlier {
            enforcing_consecutive_5xx: Some(0),
            ..Outlier::default()
        };
        assert_eq!(unenforced.ejection().consecutive_enforcement, 0);
    }
}
