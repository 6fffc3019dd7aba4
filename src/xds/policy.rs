//! What a cluster says of how to pick and when to eject, applied to one channel: its
//! load-balancing policy becomes the channel's strategy, its outlier detection the channel's
//! ejection rules, each only where the builder did not set its own (the user's choice is
//! kept, and the cluster's is logged beside it).
//!
//! - **The policy** ([gRFC A52](https://github.com/grpc/proposal/blob/master/A52-xds-custom-lb-policies.md)):
//!   `round_robin` runs [`Strategy::RoundRobin`], `least_request` [`Strategy::LeastPending`]
//!   (every instance compared, not `choice_count` of them: least request with the most
//!   choices), `client_side_weighted_round_robin` (A58) [`Strategy::WeightedRoundRobin`] with
//!   the builder's [`WrrConfig`](crate::orca::WrrConfig). A cluster that says nothing (no A52
//!   list, the `lb_policy` enum at its default value ROUND_ROBIN) runs the builder's strategy,
//!   by default [`Strategy::FewestThenFastest`], whose ties among idle instances take turns
//!   as round robin does: the enum's default cannot be told from a control plane's silence,
//!   and reading it as round robin would turn this channel's pick off in most meshes.
//! - **Outlier detection** ([gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md)):
//!   mapped by [`Outlier::ejection`]; a cluster without it runs the builder's rules (by
//!   default the channel's: [`Ejection::default`]), where gRPC would eject nothing.

use super::cluster::Outlier;
use crate::call::shared::Shared;
use crate::health::{Ejection, Health};
use crate::pick::Strategy;

/// One channel's side of its cluster's policy: what the builder chose, and what was applied.
pub(crate) struct ClusterPolicy {
    /// The builder's strategy, and the setter that chose it (`None`: the default).
    builder: (Strategy, Option<&'static str>),
    /// The builder's ejection rules, and whether they were set.
    ejection: (Ejection, bool),
    health: Health,
    /// The cluster's policy and outlier detection as last applied.
    applied: Option<(Option<Strategy>, Option<Outlier>)>,
}

impl ClusterPolicy {
    pub(crate) fn new(
        strategy: Strategy,
        strategy_by: Option<&'static str>,
        ejection: Ejection,
        ejection_set: bool,
        health: Health,
    ) -> ClusterPolicy {
        ClusterPolicy {
            builder: (strategy, strategy_by),
            ejection: (ejection, ejection_set),
            health,
            applied: None,
        }
    }

    /// The cluster `cluster` of the channel of `target` asks for `strategy` and `outlier`:
    /// applied where the builder did not choose, if they changed.
    pub(crate) fn apply(
        &mut self,
        p: &Shared,
        target: &str,
        cluster: &str,
        strategy: Option<Strategy>,
        outlier: Option<&Outlier>,
    ) {
        let asked = (strategy, outlier.cloned());
        if self.applied.as_ref() == Some(&asked) {
            return;
        }
        let (builder_strategy, chosen_by) = self.builder;
        match (strategy, chosen_by) {
            (Some(s), Some(by)) if s != builder_strategy => {
                tracing::info!(target, cluster, asked = ?s, kept = ?builder_strategy, "xDS: the cluster's policy is not applied: the builder's `{by}` chose the strategy");
            }
            (_, Some(_)) => {}
            (asked, None) => {
                let now = asked.unwrap_or(builder_strategy);
                if now != p.picker.strategy.get() {
                    tracing::info!(target, cluster, strategy = ?now, "xDS: the cluster's policy applied");
                    if now == Strategy::WeightedRoundRobin {
                        tracing::info!(target, cluster, "xDS: weighted round robin runs with the builder's settings (`Builder::weighted_round_robin`), not the cluster's");
                    }
                }
                p.picker.set_strategy(now);
            }
        }
        let (builder_rules, set) = &self.ejection;
        if *set {
            if outlier.is_some() && self.applied.as_ref().is_none_or(|a| a.1 != asked.1) {
                tracing::info!(target, cluster, "xDS: the cluster's outlier detection is not applied: the builder's `ejection` set the rules");
            }
        } else if self.applied.as_ref().is_none_or(|a| a.1 != asked.1) {
            let rules = outlier.map_or_else(|| builder_rules.clone(), Outlier::ejection);
            match rules.validate() {
                Ok(()) => {
                    if outlier.is_some() {
                        tracing::info!(target, cluster, rules = ?rules, "xDS: the cluster's outlier detection applied");
                    } else if self.applied.is_some() {
                        tracing::info!(
                            target,
                            cluster,
                            "xDS: the cluster has no outlier detection: the builder's rules apply"
                        );
                    }
                    self.health.set_rules(rules.capped());
                }
                // Outlier::ejection keeps every value in range; kept as a guard.
                Err(e) => {
                    tracing::warn!(target, cluster, error = %e, "xDS: the cluster's outlier detection cannot be applied")
                }
            }
        }
        self.applied = Some(asked);
    }
}
