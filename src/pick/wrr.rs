//! Weighted round robin from server-reported load, as gRPC specifies it (gRFC A58,
//! `weighted_round_robin`).
//!
//! Each instance's weight comes from its load reports
//! ([`LoadReport`](crate::load::report::LoadReport)):
//!
//! ```text
//! utilization = application_utilization if > 0, else cpu_utilization
//! weight      = rps_fractional / (utilization + eps / rps_fractional × error_utilization_penalty)
//! ```
//!
//! A report with a utilization or a query rate of 0 is ignored. A weight counts only after a
//! *blackout period* since the first report of a run of reports (10 s by default: a new
//! instance's first figures are often unrepresentative) and stops counting after an
//! *expiration period* without a report (3 min); the blackout starts again then.
//!
//! Every *weight update period* (1 s, at least 100 ms) a background task of the channel
//! rebuilds the schedule: with fewer than two instances with a weight, plain round robin;
//! otherwise instances without a weight get the mean of the others' weights, and the picks
//! follow an earliest-deadline-first order: each instance's next deadline is its last plus
//! `1 / weight` (the first at a random point of its first period, so that clients do not move
//! in step), and the next pick is the instance with the earliest deadline. The task
//! precomputes a cycle of that order (32 picks per instance), and a pick is one atomic
//! increment and a read of the cycle: no lock, no heap on the call path. The schedule covers
//! the instances that could take calls when it was built (as gRPC's covers its READY ones);
//! where the next entry cannot take the call (ejected since, or already tried by this call),
//! the pick draws a random entry of the cycle instead, which keeps the others' proportions.
//! Until the first schedule exists, and for a moment after a membership change (until the
//! next rebuild), the pick is plain round robin.
//!
//! Each rebuild tells its [`Observe`]r what it found (gRFC A78's figures: the weights, the
//! instances whose weight is not yet usable or stale, a fall back to round robin); the metrics
//! attach one from above.
//!
//! An instance that leaves service (failing, ejected, unhealthy) loses its weight, and its next
//! report starts a new blackout, as gRPC resets an endpoint that leaves READY. Difference from
//! gRPC: the schedule is recomputed on the period only, not also when the set changes.
//!
//! Sources:
//! [gRFC A58](https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md),
//! [gRFC A78](https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use arc_swap::ArcSwap;

use super::Picker;
use super::Rng;
use crate::instance::Instance;
use crate::load::weight::{WeightState, WrrConfig};
use crate::set::Members;

/// Picks per instance in one precomputed cycle of the schedule.
const CYCLE_PER_INSTANCE: usize = 32;
/// The longest cycle (a very large set).
const MAX_CYCLE: usize = 1 << 16;

/// An entry of the earliest-deadline-first queue: the earliest deadline first, then the
/// lowest index.
struct Scheduled {
    deadline: f64,
    index: u32,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        // BinaryHeap is a max-heap: reversed.
        other
            .deadline
            .total_cmp(&self.deadline)
            .then_with(|| other.index.cmp(&self.index))
    }
}

/// The earliest-deadline-first order of `len` picks over instances of these weights (each
/// above 0 and finite): instance `i` is due every `1 / weights[i]`, first at a random point of its
/// first period.
pub(crate) fn edf_cycle(weights: &[f64], len: usize, rng: &mut Rng) -> Vec<u32> {
    let mut heap: BinaryHeap<Scheduled> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| Scheduled {
            deadline: rng.unit() / w,
            index: i as u32,
        })
        .collect();
    let mut out = Vec::with_capacity(len);
    if heap.is_empty() {
        return out;
    }
    for _ in 0..len {
        let mut e = heap.pop().expect("not empty");
        out.push(e.index);
        e.deadline += 1.0 / weights[e.index as usize];
        heap.push(e);
    }
    out
}

/// The weights the schedule uses: `None` with fewer than two weights (round robin); else
/// every missing weight replaced by the mean of the others.
pub(crate) fn schedule_weights(weights: &[f64]) -> Option<Vec<f64>> {
    let known: Vec<f64> = weights.iter().copied().filter(|w| *w > 0.0).collect();
    if known.len() < 2 {
        return None;
    }
    let mean = known.iter().sum::<f64>() / known.len() as f64;
    Some(
        weights
            .iter()
            .map(|&w| if w > 0.0 { w } else { mean })
            .collect(),
    )
}

/// One schedule: the set it was made for and its cycle (empty: round robin).
struct Schedule {
    /// A weak pointer keeps the address from being reused while it is compared.
    members: Weak<Members>,
    cycle: Vec<u32>,
}

/// What one schedule update found, for whatever observes weighted round robin (gRFC A78's
/// instruments, which `crate::metrics` records): one update per weight update period, over the
/// instances that could take calls then.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Update<'a> {
    /// The weight of each instance the update covered (0: none usable).
    pub(crate) weights: &'a [f64],
    /// Instances without a usable weight yet: no report, or in the blackout period.
    pub(crate) not_yet_usable: usize,
    /// Instances whose last report is older than the expiration period.
    pub(crate) stale: usize,
    /// Fewer than two instances had a weight: the schedule is plain round robin.
    pub(crate) round_robin: bool,
}

/// An observer of the schedule updates, attached from above.
pub(crate) trait Observe: Send + Sync + 'static {
    /// A schedule update over at least one instance.
    fn update(&self, update: &Update<'_>);
}

/// The weighted round robin state of a channel.
pub(crate) struct Wrr {
    schedule: ArcSwap<Schedule>,
    next: AtomicUsize,
    /// What observes the schedule updates, if anything does.
    observer: OnceLock<Box<dyn Observe>>,
}

impl Default for Wrr {
    fn default() -> Wrr {
        Wrr {
            schedule: ArcSwap::from_pointee(Schedule {
                members: Weak::new(),
                cycle: Vec::new(),
            }),
            next: AtomicUsize::new(0),
            observer: OnceLock::new(),
        }
    }
}

impl Wrr {
    /// Attaches the observer of the schedule updates (the first one attached stays).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn observe(&self, observer: Box<dyn Observe>) {
        let _ = self.observer.set(observer);
    }

    /// Rebuilds the schedule for this set from the weights that count at `now_ns`, over the
    /// instances that can take calls now (as gRPC's schedule covers its READY ones).
    pub(crate) fn rebuild(&self, members: &Arc<Members>, now_ns: u64, cfg: &WrrConfig) {
        let usable: Vec<u32> = (0..members.len() as u32)
            .filter(|&i| members[i as usize].is_usable())
            .collect();
        let (mut not_yet_usable, mut stale) = (0, 0);
        let weights: Vec<f64> = usable
            .iter()
            .map(|&i| {
                let (w, state) = members[i as usize].reported.wrr.read(now_ns, cfg);
                match state {
                    WeightState::Usable => {}
                    WeightState::NotYetUsable => not_yet_usable += 1,
                    WeightState::Stale => stale += 1,
                }
                w
            })
            .collect();
        let scheduled = schedule_weights(&weights);
        if let (Some(observer), false) = (self.observer.get(), weights.is_empty()) {
            observer.update(&Update {
                weights: &weights,
                not_yet_usable,
                stale,
                round_robin: scheduled.is_none(),
            });
        }
        let cycle = match scheduled {
            Some(w) => {
                let len = (w.len() * CYCLE_PER_INSTANCE).min(MAX_CYCLE);
                let mut rng = Rng::thread();
                let mut cycle = edf_cycle(&w, len, &mut rng);
                rng.store();
                for i in &mut cycle {
                    *i = usable[*i as usize];
                }
                cycle
            }
            None => Vec::new(),
        };
        tracing::trace!(
            instances = members.len(),
            weighted = !cycle.is_empty(),
            "weighted round robin schedule rebuilt"
        );
        self.schedule.store(Arc::new(Schedule {
            members: Arc::downgrade(members),
            cycle,
        }));
    }

    /// The next instance of the schedule, if `usable` accepts it; else the instance at a
    /// random place of the cycle (the entry after a skipped one would get its share too),
    /// a few times. `None` when there is no schedule for this set (the caller goes round
    /// robin) or nothing usable was met.
    #[inline]
    pub(crate) fn pick(
        &self,
        members: &Members,
        rng: &mut Rng,
        mut usable: impl FnMut(&Arc<Instance>) -> bool,
    ) -> Option<usize> {
        let s = self.schedule.load();
        let len = s.cycle.len();
        if len == 0 || !std::ptr::eq(s.members.as_ptr(), members) {
            return None;
        }
        let at = self.next.fetch_add(1, Ordering::Relaxed) % len;
        let i = s.cycle[at] as usize;
        if usable(&members[i]) {
            return Some(i);
        }
        // Bounded: with most instances unusable, round robin finds the rest.
        for _ in 0..16 {
            let i = s.cycle[rng.below(len)] as usize;
            if usable(&members[i]) {
                return Some(i);
            }
        }
        None
    }
}

/// The channel's background task that rebuilds the schedule every update period, until the
/// channel is dropped.
/// `owner`: what holds the channel's pick.
///
/// The settings are the channel's as they are at each rebuild (a control plane may change
/// them).
pub(crate) async fn task<T>(owner: Weak<T>)
where
    T: AsRef<Picker> + Send + Sync + 'static,
{
    let mut period = std::time::Duration::ZERO;
    loop {
        tokio::time::sleep(period).await;
        let Some(owner) = owner.upgrade() else { return };
        let picker = (*owner).as_ref();
        let cfg = picker.set.ctx.load.reports.wrr.get();
        period = cfg.update_period();
        // A channel whose strategy a control plane may change keeps the task, idle while
        // another strategy picks.
        if picker.strategy.get() != crate::Strategy::WeightedRoundRobin {
            continue;
        }
        let members = picker.snapshot();
        picker.wrr.rebuild(&members, picker.set.ctx.now_ns(), &cfg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::report::LoadReport;
    use crate::load::weight::{weight_of, EndpointWeight};
    use crate::pick::Rng;
    use proptest::prelude::*;
    use std::time::Duration;

    fn report(qps: f64, eps: f64, cpu: f64, app: f64) -> LoadReport {
        LoadReport {
            rps_fractional: qps,
            eps,
            cpu_utilization: cpu,
            application_utilization: app,
            ..LoadReport::default()
        }
    }

    /// The weight is gRPC's formula: qps / (utilization + eps / qps × penalty), with the
    /// application utilization preferred to the CPU's when above 0; a report without queries
    /// or utilization gives no weight.
    #[test]
    fn weight_is_grpcs_formula() {
        assert_eq!(weight_of(&report(100.0, 0.0, 0.5, 0.0), 1.0), 200.0);
        assert_eq!(weight_of(&report(100.0, 0.0, 0.5, 0.25), 1.0), 400.0);
        // 100 / (0.5 + 10/100 × 2) = 100 / 0.7
        let w = weight_of(&report(100.0, 10.0, 0.5, 0.0), 2.0);
        assert!((w - 100.0 / 0.7).abs() < 1e-9, "{w}");
        assert_eq!(weight_of(&report(100.0, 10.0, 0.5, 0.0), 0.0), 200.0);
        assert_eq!(weight_of(&report(0.0, 0.0, 0.5, 0.0), 1.0), 0.0);
        assert_eq!(weight_of(&report(100.0, 0.0, 0.0, 0.0), 1.0), 0.0);
        assert_eq!(weight_of(&report(f64::NAN, 0.0, 0.5, 0.0), 1.0), 0.0);
    }

    /// The settings of the weights' tests: a 10 s blackout, weights stale after 180 s.
    fn blackout_10s_expiry_180s() -> WrrConfig {
        WrrConfig {
            blackout_period: Duration::from_secs(10),
            weight_expiration_period: Duration::from_secs(180),
            ..WrrConfig::default()
        }
    }

    /// A weight counts only after the blackout since the first report, stops counting after
    /// the expiration period without reports, and the next report starts a new blackout.
    #[test]
    fn blackout_and_expiry() {
        let cfg = blackout_10s_expiry_180s();
        let s = 1_000_000_000u64;
        let e = EndpointWeight::default();
        assert_eq!(e.get(s, &cfg), 0.0);
        e.update(&report(100.0, 0.0, 0.5, 0.0), s, &cfg);
        assert_eq!(e.get(5 * s, &cfg), 0.0, "in the blackout");
        e.update(&report(100.0, 0.0, 0.25, 0.0), 9 * s, &cfg);
        assert_eq!(
            e.get(12 * s, &cfg),
            400.0,
            "after the blackout, the last weight"
        );
        // An ignored report (no utilization) does not refresh it.
        e.update(&report(100.0, 0.0, 0.0, 0.0), 100 * s, &cfg);
        assert_eq!(e.get(189 * s, &cfg), 0.0, "expired");
        e.update(&report(100.0, 0.0, 0.5, 0.0), 190 * s, &cfg);
        assert_eq!(e.get(195 * s, &cfg), 0.0, "a new blackout");
        assert_eq!(e.get(200 * s, &cfg), 200.0);
        let none = WrrConfig {
            blackout_period: Duration::ZERO,
            ..cfg
        };
        let f = EndpointWeight::default();
        f.update(&report(50.0, 0.0, 0.5, 0.0), s, &none);
        assert_eq!(f.get(s, &none), 100.0, "no blackout");
        e.reset();
        assert_eq!(e.get(201 * s, &cfg), 0.0, "reset: no weight");
        e.update(&report(100.0, 0.0, 0.5, 0.0), 202 * s, &cfg);
        assert_eq!(e.get(205 * s, &cfg), 0.0, "reset: a new blackout");
        assert_eq!(e.get(213 * s, &cfg), 200.0);
    }

    /// What gRFC A78 counts of a weight at an update: not yet usable without a report and in
    /// the blackout, usable after it; stale once the last report is older than the expiration
    /// period, and at every update after that until a report comes; not yet usable again once
    /// the instance left service and has not reported since.
    #[test]
    fn weight_states() {
        use crate::load::weight::WeightState::{NotYetUsable, Stale, Usable};
        let cfg = blackout_10s_expiry_180s();
        let s = 1_000_000_000u64;
        let e = EndpointWeight::default();
        assert_eq!(e.read(s, &cfg), (0.0, NotYetUsable));
        e.update(&report(100.0, 0.0, 0.5, 0.0), s, &cfg);
        assert_eq!(e.read(5 * s, &cfg), (0.0, NotYetUsable));
        assert_eq!(e.read(12 * s, &cfg), (200.0, Usable));
        assert_eq!(e.read(181 * s, &cfg), (0.0, Stale));
        assert_eq!(e.read(182 * s, &cfg), (0.0, Stale), "until a report");
        e.update(&report(100.0, 0.0, 0.5, 0.0), 190 * s, &cfg);
        assert_eq!(e.read(195 * s, &cfg), (0.0, NotYetUsable), "a new blackout");
        assert_eq!(e.read(201 * s, &cfg), (200.0, Usable));
        e.reset();
        assert_eq!(e.read(202 * s, &cfg), (0.0, NotYetUsable), "left service");
    }

    /// With fewer than two weights there is no schedule; missing weights get the mean.
    #[test]
    fn schedule_weights_fill_with_mean() {
        assert_eq!(schedule_weights(&[0.0, 5.0, 0.0]), None);
        assert_eq!(
            schedule_weights(&[0.0, 2.0, 4.0]),
            Some(vec![3.0, 2.0, 4.0])
        );
    }

    proptest! {
        /// The earliest-deadline-first cycle gives each instance its share of picks in
        /// proportion to its weight: within about one pick per instance of the exact share.
        #[test]
        fn edf_respects_weights(
            weights in prop::collection::vec(0.01f64..1000.0, 1..40),
            per in 8usize..64,
            seed: u64,
        ) {
            let len = weights.len() * per;
            let mut rng = Rng::seeded(seed);
            let cycle = edf_cycle(&weights, len, &mut rng);
            prop_assert_eq!(cycle.len(), len);
            let total: f64 = weights.iter().sum();
            let n = weights.len() as f64;
            let mut counts = vec![0usize; weights.len()];
            for &i in &cycle {
                counts[i as usize] += 1;
            }
            for (i, &w) in weights.iter().enumerate() {
                let share = w / total;
                let expected = len as f64 * share;
                let slack = 1.0 + n * share + 1e-9;
                prop_assert!(
                    (counts[i] as f64 - expected).abs() <= slack,
                    "instance {} weight {} got {} picks, expected {:.2} (±{:.2})",
                    i, w, counts[i], expected, slack
                );
            }
        }

        /// Equal weights: a cycle is a sequence of rounds that each visit every instance
        /// once (no instance twice before all the others once).
        #[test]
        fn equal_weights_are_round_robin(n in 1usize..30, seed: u64) {
            let mut rng = Rng::seeded(seed);
            let cycle = edf_cycle(&vec![3.0; n], n * 4, &mut rng);
            for round in cycle.chunks(n) {
                let mut seen = vec![false; n];
                for &i in round {
                    prop_assert!(!seen[i as usize], "{:?}", cycle);
                    seen[i as usize] = true;
                }
            }
        }
    }
}
