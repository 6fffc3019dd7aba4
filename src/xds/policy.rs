//! What a cluster says of how to pick and when to eject, applied to one channel: its
//! load-balancing policy becomes the channel's strategy, its outlier detection the channel's
//! ejection rules, each only where the builder did not set its own (the user's choice is
//! kept, and the cluster's is logged beside it).
//!
//! - **The policy** ([gRFC A52](https://github.com/grpc/proposal/blob/master/A52-xds-custom-lb-policies.md)):
//!   `round_robin` runs [`Strategy::RoundRobin`], `least_request` [`Strategy::LeastPending`]
//!   (every instance compared, not `choice_count` of them: least request with the most
//!   choices), `client_side_weighted_round_robin` (A58) [`Strategy::WeightedRoundRobin`] with
//!   the cluster's settings (blackout, expiration and update periods, error penalty; its
//!   out-of-band reports only where the builder turned them on,
//!   [`Builder::load_reports_oob`](crate::Builder::load_reports_oob)). A cluster that says nothing (no A52
//!   list, the `lb_policy` enum at its default value ROUND_ROBIN) runs the builder's strategy,
//!   by default [`Strategy::FewestThenFastest`], whose ties among idle instances take turns
//!   as round robin does: the enum's default cannot be told from a control plane's silence,
//!   and reading it as round robin would turn this channel's pick off in most meshes.
//! - **Outlier detection** ([gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md)):
//!   mapped by [`Outlier::ejection`]; a cluster without it runs the builder's rules (by
//!   default the channel's: [`Ejection::default`]), where gRPC would eject nothing.

use super::cluster::{ClusterWrr, Outlier};
use crate::call::shared::Shared;
use crate::health::{Ejection, Health};
use crate::pick::Strategy;

/// One channel's side of its cluster's policy: what the builder chose, and what was applied.
pub(crate) struct ClusterPolicy {
    /// The builder's strategy, and the setter that chose it (`None`: the default).
    builder: (Strategy, Option<&'static str>),
    /// The builder's ejection rules, and whether they were set.
    ejection: (Ejection, bool),
    /// Whether the builder asked for out-of-band load reports.
    oob: bool,
    health: Health,
    /// The cluster's policy (with weighted round robin's settings) and outlier detection as
    /// last applied.
    applied: Option<Asked>,
}

/// What a cluster asks of the pick and of ejection.
type Asked = (Option<Strategy>, Option<ClusterWrr>, Option<Outlier>);

impl ClusterPolicy {
    pub(crate) fn new(
        strategy: Strategy,
        strategy_by: Option<&'static str>,
        ejection: Ejection,
        ejection_set: bool,
        oob: bool,
        health: Health,
    ) -> ClusterPolicy {
        ClusterPolicy {
            builder: (strategy, strategy_by),
            ejection: (ejection, ejection_set),
            oob,
            health,
            applied: None,
        }
    }

    /// The cluster `cluster` of the channel of `target` asks for `strategy` (with `wrr`, its
    /// settings if weighted round robin) and `outlier`: applied where the builder did not
    /// choose, if they changed.
    pub(crate) fn apply(
        &mut self,
        p: &Shared,
        target: &str,
        cluster: &str,
        (strategy, wrr): (Option<Strategy>, Option<ClusterWrr>),
        outlier: Option<&Outlier>,
    ) {
        let asked = (strategy, wrr, outlier.cloned());
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
                }
                if let Some(w) = wrr {
                    self.apply_wrr(p, target, cluster, w);
                }
                p.picker.set_strategy(now);
            }
        }
        let (builder_rules, set) = &self.ejection;
        let outlier_changed = self.applied.as_ref().is_none_or(|a| a.2 != asked.2);
        if *set {
            if outlier.is_some() && outlier_changed {
                tracing::info!(target, cluster, "xDS: the cluster's outlier detection is not applied: the builder's `ejection` set the rules");
            }
        } else if outlier_changed {
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

    /// Weighted round robin's settings from the cluster (the builder chose no strategy).
    fn apply_wrr(&self, p: &Shared, target: &str, cluster: &str, wrr: ClusterWrr) {
        match wrr.config.validate() {
            Ok(()) => {
                tracing::info!(target, cluster, settings = ?wrr.config, "xDS: the cluster's weighted round robin settings applied");
                p.ctx.load.reports.wrr.set(wrr.config.capped());
            }
            // The decoder refuses what validate would; kept as a guard.
            Err(e) => {
                tracing::warn!(target, cluster, error = %e, "xDS: the cluster's weighted round robin settings cannot be applied")
            }
        }
        if let (Some(period), false) = (wrr.oob, self.oob) {
            tracing::info!(target, cluster, ?period, "xDS: the cluster asks for out-of-band load reports; this channel asks for them only where the builder turned them on (`Builder::load_reports_oob`), and uses the reports of its calls");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::weight::WrrConfig;
    use std::time::Duration;

    fn cluster_wrr(blackout: u64) -> ClusterWrr {
        ClusterWrr {
            config: WrrConfig::default().blackout_period(Duration::from_secs(blackout)),
            oob: None,
        }
    }

    /// Where the builder chose nothing, the cluster's strategy, weighted round robin's
    /// settings and outlier detection apply, and change with it; a cluster that says nothing
    /// brings back the builder's.
    #[tokio::test]
    async fn the_clusters_choices_apply_where_the_builders_do_not() {
        let ch = crate::BalancedChannel::from_static(["http://127.0.0.1:1"]).unwrap();
        let p = &ch.shared;
        let health = Health::new(Ejection::default(), Default::default());
        let mut policy = ClusterPolicy::new(
            Strategy::default(),
            None,
            Ejection::default(),
            false,
            false,
            health.clone(),
        );
        let wrr = (Some(Strategy::WeightedRoundRobin), Some(cluster_wrr(2)));
        let outlier = Outlier {
            consecutive_5xx: Some(2),
            ..Outlier::default()
        };
        policy.apply(p, "svc", "c", wrr, Some(&outlier));
        assert_eq!(p.picker.strategy.get(), Strategy::WeightedRoundRobin);
        assert_eq!(p.ctx.load.gate(), crate::load::tie::GateRule::LEAST_PENDING);
        assert_eq!(p.ctx.load.reports.wrr.get(), cluster_wrr(2).config);
        assert_eq!(health.rules().consecutive_failures, 2);
        policy.apply(p, "svc", "c", (None, None), None);
        assert_eq!(p.picker.strategy.get(), Strategy::FewestThenFastest);
        assert_eq!(
            p.ctx.load.gate(),
            crate::load::tie::GateRule::FEWEST_THEN_FASTEST
        );
        assert_eq!(*health.rules(), Ejection::default());
    }

    /// What the builder chose stays: its strategy (and so weighted round robin's settings)
    /// and its ejection rules, whatever the cluster asks.
    #[tokio::test]
    async fn the_builders_choices_are_kept() {
        let ch = crate::BalancedChannel::from_static(["http://127.0.0.1:1"]).unwrap();
        let p = &ch.shared;
        let mine = Ejection::default().consecutive_failures(9);
        let health = Health::new(mine.clone(), Default::default());
        let mut policy = ClusterPolicy::new(
            Strategy::PeakEwma,
            Some("strategy"),
            mine.clone(),
            true,
            false,
            health.clone(),
        );
        p.picker.set_strategy(Strategy::PeakEwma);
        let outlier = Outlier {
            consecutive_5xx: Some(2),
            ..Outlier::default()
        };
        let wrr = (Some(Strategy::WeightedRoundRobin), Some(cluster_wrr(2)));
        policy.apply(p, "svc", "c", wrr, Some(&outlier));
        assert_eq!(p.picker.strategy.get(), Strategy::PeakEwma);
        assert_eq!(p.ctx.load.reports.wrr.get(), WrrConfig::default());
        assert_eq!(*health.rules(), mine);
    }
}
