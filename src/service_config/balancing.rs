//! `loadBalancingConfig` (and the older `loadBalancingPolicy`): the policy, as the channel's
//! [`Strategy`] and its settings.
//!
//! As in gRPC, the list is read in order and the first policy the channel knows is used;
//! those it does not know are skipped, and a list with none it knows is refused. The policies
//! it knows: gRPC's `round_robin`, `pick_first`, `least_request_experimental` (gRFC A48) and
//! `weighted_round_robin` (gRFC A58), and this crate's own, `tonic_balancer`.
//!
//! Sources:
//! [gRFC A48](https://github.com/grpc/proposal/blob/master/A48-xds-least-request-lb-policy.md),
//! [gRFC A58](https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md).

use std::time::Duration;

use super::json::ConfigNode;
use crate::error::Error;
use crate::load::weight::WrrConfig;
use crate::Strategy;

/// The policies the channel knows, in the refusal of a list that names none of them.
const KNOWN: &str = "round_robin, pick_first, least_request_experimental, weighted_round_robin, \
                     tonic_balancer";

/// What a config's policy does to the builder.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Balancing {
    /// `pick_first`: the channel keeps its strategy (it never sends every call to one
    /// instance).
    Keep,
    /// A strategy, the channel's other settings unchanged.
    Strategy(Strategy),
    /// Weighted round robin with these settings, and out-of-band load reports at this
    /// interval if asked for.
    Wrr {
        config: WrrConfig,
        oob: Option<Duration>,
    },
}

/// `loadBalancingConfig`: the first policy the channel knows. `None` for an empty list.
pub(super) fn from_config(list: &ConfigNode<'_>) -> Result<Option<Balancing>, Error> {
    let items = list.items()?;
    if items.is_empty() {
        return Ok(None);
    }
    for item in &items {
        let (name, config) = item.only_field("{\"round_robin\": {}}")?;
        // Names in any case, as grpc-go's registry still takes them.
        if let Some(b) = policy(&name.to_ascii_lowercase(), &config)? {
            return Ok(Some(b));
        }
        tracing::debug!(
            policy = name,
            "service config: load-balancing policy unknown here, skipped"
        );
    }
    Err(list.refuse(format_args!(
        "names no load-balancing policy this channel knows (it knows {KNOWN})"
    )))
}

/// `loadBalancingPolicy`, the older field (read only without `loadBalancingConfig`): a
/// policy's name in any case, with its default settings. An unknown name leaves the channel's
/// strategy (gRPC falls back to its default then).
pub(super) fn from_name(node: &ConfigNode<'_>) -> Result<Option<Balancing>, Error> {
    let name = node.str()?.to_ascii_lowercase();
    let empty = serde_json::Value::Object(Default::default());
    let config = ConfigNode::root(&empty);
    let b = policy(&name, &config)?;
    if b.is_none() {
        tracing::debug!(policy = %name, "service config: loadBalancingPolicy unknown here, ignored");
    }
    Ok(b)
}

/// The policy `name` with its `config`; `None` if the channel does not know it.
fn policy(name: &str, config: &ConfigNode<'_>) -> Result<Option<Balancing>, Error> {
    let b = match name {
        "round_robin" => {
            config.object()?;
            Balancing::Strategy(Strategy::RoundRobin)
        }
        "pick_first" => {
            if let Some(shuffle) = config.field("shuffleAddressList")? {
                shuffle.bool()?;
            }
            tracing::info!(
                "service config: pick_first keeps the channel's strategy (a balanced channel \
                 never sends every call to one instance)"
            );
            Balancing::Keep
        }
        "least_request_experimental" => least_request(config)?,
        "weighted_round_robin" => wrr(config)?,
        "tonic_balancer" => match config.field("strategy")? {
            None => Balancing::Strategy(Strategy::default()),
            Some(s) => {
                let name = s.str()?;
                let strategy = Strategy::NAMES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|&(_, st)| st)
                    .ok_or_else(|| {
                        let names: Vec<&str> = Strategy::NAMES.iter().map(|(n, _)| *n).collect();
                        s.refuse(format_args!(
                            "unknown strategy {name:?} (one of {})",
                            names.join(", ")
                        ))
                    })?;
                Balancing::Strategy(strategy)
            }
        },
        _ => return Ok(None),
    };
    Ok(Some(b))
}

/// `least_request_experimental` (gRFC A48): the least loaded of `choiceCount` instances drawn
/// at random (2 to 10; more counts as 10). Two is the channel's power of two choices; more
/// come closer to a scan of every instance, which is least pending.
fn least_request(config: &ConfigNode<'_>) -> Result<Balancing, Error> {
    let count = match config.field("choiceCount")? {
        None => 2,
        Some(n) => {
            let count = n.whole()?;
            if count < 2 {
                return Err(n.refuse(format_args!("must be at least 2, not {count}")));
            }
            count
        }
    };
    Ok(Balancing::Strategy(if count == 2 {
        Strategy::PowerOfTwoChoices
    } else {
        Strategy::LeastPending
    }))
}

/// `weighted_round_robin` (gRFC A58), with gRPC's defaults for what it does not set.
fn wrr(config: &ConfigNode<'_>) -> Result<Balancing, Error> {
    let duration = |key: &str, default: Duration, above_zero: bool| -> Result<Duration, Error> {
        match config.field(key)? {
            None => Ok(default),
            Some(n) => {
                let d = n.duration()?;
                if above_zero && d.is_zero() {
                    return Err(n.refuse("must be above zero"));
                }
                Ok(d)
            }
        }
    };
    let oob_on = match config.field("enableOobLoadReport")? {
        Some(b) => b.bool()?,
        None => false,
    };
    let oob_every = duration("oobReportingPeriod", Duration::from_secs(10), oob_on)?;
    let penalty = match config.field("errorUtilizationPenalty")? {
        None => 1.0,
        Some(n) => {
            let p = n.number()?;
            if p < 0.0 {
                return Err(n.refuse(format_args!("must be at least 0, not {p}")));
            }
            p
        }
    };
    let wrr = WrrConfig::default()
        .blackout_period(duration("blackoutPeriod", Duration::from_secs(10), false)?)
        .weight_expiration_period(duration(
            "weightExpirationPeriod",
            Duration::from_secs(180),
            true,
        )?)
        // Below 100 ms counts as 100 ms, in WrrConfig as in gRPC.
        .weight_update_period(duration(
            "weightUpdatePeriod",
            Duration::from_secs(1),
            false,
        )?)
        .error_utilization_penalty(penalty);
    Ok(Balancing::Wrr {
        config: wrr,
        oob: oob_on.then_some(oob_every),
    })
}
