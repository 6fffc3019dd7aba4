//! The interval rules of outlier ejection ([gRFC A50]): every interval, over the calls of that
//! interval, the success-rate rule and the failure-percentage rule, each with A50's thresholds
//! and one guard of the channel's own: an instance is an outlier only if its failures are more
//! than chance would give at the other instances' failure rate.
//!
//! Why the guard: A50's success-rate rule compares an instance with the spread of the
//! instances' success rates, which chance alone makes; when every instance answers the same
//! share of application errors, one of twenty falls more than 1.9 standard deviations below
//! the mean in more than half of the intervals. The guard asks that the instance's failure
//! rate and the others' differ beyond chance: the likelihood-ratio test of one rate for both
//! rejects it at one in a million. The figures, simulated by
//! `scripts/outlier_false_positives.py`, are in `docs/design.md` ("Outlier ejection").
//!
//! [gRFC A50]: https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md

use std::sync::Arc;

use super::{Ejection, Health};
use crate::instance::{Instance, State};

/// Why an instance was found an outlier by an interval rule (the metrics map these words to
/// their reason label).
const LOW_SUCCESS_RATE: &str = "low success rate";
const HIGH_FAILURE_PERCENTAGE: &str = "high failure percentage";

/// One instance's calls in the interval.
struct Window<'a> {
    inst: &'a Arc<Instance>,
    calls: u64,
    failed: u64,
}

/// One round of the interval rules over `instances` (the set): ejects the outliers, and resets
/// every instance's counts for the next interval.
pub(crate) fn sweep(health: &Health, instances: &[Arc<Instance>]) {
    let cfg = health.rules();
    let windows: Vec<Window<'_>> = instances
        .iter()
        .map(|inst| {
            let (ok, failed) = inst.ejection.take_window();
            Window {
                inst,
                calls: ok + failed,
                failed,
            }
        })
        .collect();
    let total = windows
        .iter()
        .fold((0, 0), |(c, f), w| (c + w.calls, f + w.failed));
    let mut found: Vec<(&Arc<Instance>, &'static str)> = Vec::new();
    for w in success_rate(&cfg, &windows, total) {
        found.push((w.inst, LOW_SUCCESS_RATE));
    }
    for w in failure_percentage(&cfg, &windows, total) {
        if !found.iter().any(|(i, _)| Arc::ptr_eq(i, w.inst)) {
            found.push((w.inst, HIGH_FAILURE_PERCENTAGE));
        }
    }
    for (inst, why) in found {
        let enforcement = if why == LOW_SUCCESS_RATE {
            cfg.success_rate_enforcement
        } else {
            cfg.failure_percentage_enforcement
        };
        // A50: eject with the enforcement percentage's chance.
        if (crate::rng::random_unit() * 100.0) < f64::from(enforcement) {
            super::outlier::eject(health, inst, why);
        } else {
            tracing::debug!(server.address = %inst.target.name, reason = why, "outlier found, not ejected (enforcement percentage)");
            crate::metrics::outlier_detected(&health.totals.metrics, inst, why);
        }
    }
}

/// A new interval starts now, its calls to be judged by new rules: the calls counted so far
/// are forgotten.
pub(crate) fn restart_windows(instances: &[Arc<Instance>]) {
    for inst in instances {
        inst.ejection.take_window();
    }
}

/// A50's success-rate rule: among the instances in service with enough calls (if there are
/// enough of them), those whose success rate is more than the stdev factor's standard
/// deviations below the mean, and below the threshold, and whose failures are beyond chance.
fn success_rate<'a, 'b>(
    cfg: &Ejection,
    windows: &'b [Window<'a>],
    (calls, failed): (u64, u64),
) -> Vec<&'b Window<'a>> {
    let judged: Vec<(&Window<'a>, f64)> = windows
        .iter()
        .filter(|w| w.calls >= cfg.success_rate_min_calls.max(1) && w.inst.state() == State::Ready)
        .map(|w| (w, 1.0 - w.failed as f64 / w.calls as f64))
        .collect();
    if judged.len() < (cfg.success_rate_min_hosts as usize).max(2) {
        return Vec::new();
    }
    let k = judged.len() as f64;
    let mean = judged.iter().map(|j| j.1).sum::<f64>() / k;
    let var = judged.iter().map(|j| (j.1 - mean).powi(2)).sum::<f64>() / k;
    let floor = mean - cfg.success_rate_stdev_factor * var.sqrt();
    judged
        .into_iter()
        .filter(|(w, rate)| {
            let outlier = *rate < floor
                && *rate < cfg.success_rate_threshold
                && beyond_chance(w, calls - w.calls, failed - w.failed);
            if outlier {
                tracing::debug!(server.address = %w.inst.target.name, rate, mean, "success rate far below the others");
            }
            outlier
        })
        .map(|(w, _)| w)
        .collect()
}

/// A50's failure-percentage rule: with enough instances in the set, those in service with
/// enough calls whose failures reach the threshold, and are beyond chance.
fn failure_percentage<'a, 'b>(
    cfg: &Ejection,
    windows: &'b [Window<'a>],
    (calls, failed): (u64, u64),
) -> Vec<&'b Window<'a>> {
    if windows.len() < cfg.failure_percentage_min_hosts as usize {
        return Vec::new();
    }
    windows
        .iter()
        .filter(|w| {
            w.calls >= cfg.failure_percentage_min_calls.max(1)
                && w.inst.state() == State::Ready
                && 100 * w.failed >= u64::from(cfg.failure_percentage_threshold) * w.calls
                && beyond_chance(w, calls - w.calls, failed - w.failed)
        })
        .inspect(|w| {
            let percent = 100.0 * w.failed as f64 / w.calls as f64;
            tracing::debug!(server.address = %w.inst.target.name, percent, "failure percentage over the threshold");
        })
        .collect()
}

/// Whether `w`'s failures are more than chance beside those of the other instances, which
/// made `calls` calls of which `failed` failed: its failure rate is the higher, and the
/// likelihood-ratio test of one failure rate for both (the G-test of their 2×2 table, whose
/// statistic is twice the sum of each side's calls times the divergence of its rate from the
/// pooled one) rejects it at one in a million. The test weighs both sides' counts, so that a
/// window in which the others happened to fail little does not make an instance's ordinary
/// share of failures look like an outlier's. True when the others made no call (nothing to
/// compare with: A50's rule alone decides).
fn beyond_chance(w: &Window<'_>, calls: u64, failed: u64) -> bool {
    if calls == 0 {
        return true;
    }
    let q = w.failed as f64 / w.calls as f64;
    let others = failed as f64 / calls as f64;
    let pooled = (w.failed + failed) as f64 / (w.calls + calls) as f64;
    let g = 2.0 * (w.calls as f64 * kl(q, pooled) + calls as f64 * kl(others, pooled));
    q > others && g >= G_ONE_IN_A_MILLION
}

/// The chi-square distribution's (one degree of freedom) quantile of 1 − 10⁻⁶: the G-test's
/// statistic of two equal rates exceeds it once in a million.
const G_ONE_IN_A_MILLION: f64 = 23.93;

/// The Kullback-Leibler divergence of a coin of bias `q` from one of bias `p`.
fn kl(q: f64, p: f64) -> f64 {
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let mut d = 0.0;
    if q > 0.0 {
        d += q * (q / p).ln();
    }
    if q < 1.0 {
        d += (1.0 - q) * ((1.0 - q) / (1.0 - p)).ln();
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(inst: &Arc<Instance>, calls: u64, failed: u64) -> Window<'_> {
        Window {
            inst,
            calls,
            failed,
        }
    }

    /// The guard's numbers: 10 failures in 100 calls beside 0 in 400 are beyond chance (the
    /// G-test's p-value 9e-9), 11 in 32 beside 5 in 121 are not (9e-6: a window in which the
    /// others happened to fail little, seen in the suite on a busy machine), nor is the others'
    /// own rate.
    #[tokio::test]
    async fn beyond_chance_weighs_both_sides_at_one_in_a_million() {
        let ch = crate::BalancedChannel::from_static(["http://127.0.0.1:1"]).unwrap();
        let inst = ch.shared.snapshot()[0].clone();
        assert!(beyond_chance(&window(&inst, 100, 10), 400, 0));
        assert!(!beyond_chance(&window(&inst, 32, 11), 121, 5));
        assert!(!beyond_chance(&window(&inst, 100, 10), 400, 40));
        assert!(
            !beyond_chance(&window(&inst, 100, 5), 400, 40),
            "below the others"
        );
        assert!(beyond_chance(&window(&inst, 100, 60), 400, 120));
        assert!(beyond_chance(&window(&inst, 20, 20), 0, 0), "no others");
    }
}
