//! Outlier ejection, after gRPC's (gRFC A50) and Envoy's: an instance whose calls fail several
//! times in a row, or whose success rate falls far below the others', is ejected for a time that
//! doubles with each ejection in a streak, then readmitted on probation.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::instance::{Instance, State};

/// Outlier ejection settings (see [`Builder::ejection`](crate::Builder::ejection)).
///
/// Defaults: 5 failures in a row eject; 30 s the first time, doubling up to 300 s; at most half
/// of the instances ejected at once; the success-rate rule on (every 10 s, instances with at
/// least 20 calls in the interval whose success rate is below 1.9 standard deviations under the
/// mean, and under 95%). Built from [`Ejection::default`] with one setter per setting, or
/// [`Ejection::disabled`]:
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::Ejection;
///
/// let ejection = Ejection::default()
///     .consecutive_failures(3)
///     .base_time(Duration::from_secs(10))
///     .success_rate_interval(None);
/// # let _ = ejection;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
#[derive(Debug, Clone, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct Ejection {
    pub(crate) consecutive_failures: u32,
    pub(crate) base_time: Duration,
    pub(crate) max_time: Duration,
    pub(crate) max_ejected_percent: u32,
    pub(crate) success_rate_interval: Option<Duration>,
    pub(crate) success_rate_min_calls: u64,
    pub(crate) success_rate_stdev_factor: f64,
    pub(crate) success_rate_threshold: f64,
}

impl Default for Ejection {
    fn default() -> Self {
        Ejection {
            consecutive_failures: 5,
            base_time: Duration::from_secs(30),
            max_time: Duration::from_secs(300),
            max_ejected_percent: 50,
            success_rate_interval: Some(Duration::from_secs(10)),
            success_rate_min_calls: 20,
            success_rate_stdev_factor: 1.9,
            success_rate_threshold: 0.95,
        }
    }
}

impl Ejection {
    /// No ejection at all: [`max_ejected_percent`](Self::max_ejected_percent) 0, and the
    /// success-rate rule off ([`success_rate_interval`](Self::success_rate_interval) `None`).
    /// Failing instances are still kept out by their connection state and, if enabled, their
    /// health checks.
    pub fn disabled() -> Self {
        Ejection::default()
            .max_ejected_percent(0)
            .success_rate_interval(None)
    }

    /// Failures in a row that eject an instance: at least 1 (default 5).
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = n;
        self
    }

    /// How long the first ejection lasts: above zero (default 30 s). Each next ejection in a
    /// streak lasts twice as long, up to [`max_time`](Self::max_time).
    pub fn base_time(mut self, d: Duration) -> Self {
        self.base_time = d;
        self
    }

    /// Cap on the ejection time: at least [`base_time`](Self::base_time) (default 300 s).
    pub fn max_time(mut self, d: Duration) -> Self {
        self.max_time = d;
        self
    }

    /// At most this share of the instances (in percent, 0 to 100) is ejected at once; 0 turns
    /// ejection off (default 50). Above 0, one instance may always be ejected when there are
    /// two or more, and one is always left in.
    pub fn max_ejected_percent(mut self, percent: u32) -> Self {
        self.max_ejected_percent = percent;
        self
    }

    /// Interval of the success-rate rule, above zero; `None` turns the rule off (default
    /// `Some(10 s)`).
    pub fn success_rate_interval(mut self, every: Option<Duration>) -> Self {
        self.success_rate_interval = every;
        self
    }

    /// Calls an instance needs in one interval for the success-rate rule to judge it (default
    /// 20).
    pub fn success_rate_min_calls(mut self, n: u64) -> Self {
        self.success_rate_min_calls = n;
        self
    }

    /// An instance more than this many standard deviations below the mean success rate is
    /// ejected (at least 0, default 1.9), provided its success rate is also below
    /// [`success_rate_threshold`](Self::success_rate_threshold).
    pub fn success_rate_stdev_factor(mut self, factor: f64) -> Self {
        self.success_rate_stdev_factor = factor;
        self
    }

    /// The success rate (0 to 1) below which an instance far under the mean is ejected
    /// (default 0.95).
    pub fn success_rate_threshold(mut self, rate: f64) -> Self {
        self.success_rate_threshold = rate;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = crate::checks::Checks::of("ejection");
        c.field("consecutive_failures")
            .at_least_one(u64::from(self.consecutive_failures))?;
        c.field("base_time").above_zero(self.base_time)?;
        c.field("max_time")
            .at_least(self.max_time, self.base_time, "base_time")?;
        c.field("max_ejected_percent")
            .between(self.max_ejected_percent, 0, 100)?;
        if let Some(every) = self.success_rate_interval {
            c.field("success_rate_interval").above_zero(every)?;
        }
        c.field("success_rate_threshold")
            .between(self.success_rate_threshold, 0.0, 1.0)?;
        let factor = self.success_rate_stdev_factor;
        c.field("success_rate_stdev_factor")
            .that(factor >= 0.0, "must be at least 0")
    }

    /// The same settings with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> Ejection {
        self.base_time = crate::time::cap(self.base_time);
        self.max_time = crate::time::cap(self.max_time);
        self.success_rate_interval = self.success_rate_interval.map(crate::time::cap);
        self
    }

    /// How many instances of `members` may be ejected at once.
    pub(crate) fn cap(&self, members: usize) -> usize {
        if members < 2 || self.max_ejected_percent == 0 {
            return 0;
        }
        (members * self.max_ejected_percent as usize / 100).clamp(1, members - 1)
    }
}

/// After a failure: eject `inst` if it failed `n` times in a row, or once on probation.
pub(crate) fn eject_check(health: &super::Health, inst: &Arc<Instance>, n: u32) {
    let on_probation = inst.probation.load(Ordering::Relaxed);
    if n >= health.ejection.consecutive_failures || on_probation {
        let why = if on_probation {
            "failed on probation"
        } else {
            "consecutive failures"
        };
        eject(health, inst, why);
    }
}

/// Ejects `inst` if the cap allows it; spawns the timer that readmits it.
pub(crate) fn eject(health: &super::Health, inst: &Arc<Instance>, why: &'static str) -> bool {
    let cfg = &health.ejection;
    let policy = &inst.ctx;
    let cap = cfg.cap(policy.members.load(Ordering::Relaxed));
    // Reserve a slot under the cap first, so that concurrent ejections cannot exceed it.
    let reserved = policy
        .ejected
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            (e < cap).then_some(e + 1)
        })
        .is_ok();
    if !reserved {
        tracing::debug!(server.address = %inst.target.name, cap, "not ejected: ejection cap reached");
        crate::observe::ejection(&health.totals, inst, why, false);
        return false;
    }
    if !inst.transition(State::Ready, State::Ejected)
        && !inst.transition(State::Connecting, State::Ejected)
    {
        policy.ejected.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    let streak = inst.ejection_streak.fetch_add(1, Ordering::Relaxed);
    inst.ejections.fetch_add(1, Ordering::Relaxed);
    crate::observe::ejection(&health.totals, inst, why, true);
    let base = cfg.base_time;
    let time = base
        .checked_mul(1u32 << streak.min(16))
        .unwrap_or(cfg.max_time)
        .min(cfg.max_time);
    let id = start_ejection(inst, time);
    tracing::warn!(
        server.address = %inst.target.name,
        reason = why,
        failures = inst.consecutive_failures.load(Ordering::Relaxed),
        ejection_secs = time.as_secs_f64(),
        "instance ejected"
    );
    let weak = Arc::downgrade(inst);
    inst.spawn(async move {
        tokio::time::sleep(time).await;
        if let Some(inst) = weak.upgrade() {
            readmit(&inst, id);
        }
    });
    true
}

/// Numbers a new ejection of `inst` that lasts `time` from now; returns its number.
fn start_ejection(inst: &Instance, time: std::time::Duration) -> u32 {
    let until = inst.ctx.now_ns().saturating_add(crate::time::nanos(time));
    inst.ejected_until.store(until, Ordering::Relaxed);
    inst.ejection_id
        .fetch_add(1, Ordering::AcqRel)
        .wrapping_add(1)
}

/// An instance removed while ejected is taken back into the set: it stays ejected for what was
/// left of its ejection, if the cap allows it in the set it joins (of `members` instances).
/// False (nothing done) if no time was left or the cap is full.
pub(crate) fn resume_ejection(
    health: &super::Health,
    inst: &Arc<Instance>,
    members: usize,
) -> bool {
    let policy = &inst.ctx;
    let left = inst
        .ejected_until
        .load(Ordering::Relaxed)
        .saturating_sub(policy.now_ns());
    if left == 0 {
        return false;
    }
    let cap = health.ejection.cap(members);
    let reserved = policy
        .ejected
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
            (e < cap).then_some(e + 1)
        })
        .is_ok();
    if !reserved {
        return false;
    }
    if !inst.transition(State::Draining, State::Ejected) {
        policy.ejected.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    let time = std::time::Duration::from_nanos(left);
    let id = start_ejection(inst, time);
    tracing::info!(server.address = %inst.target.name, ejection_secs = time.as_secs_f64(), "instance taken back while ejected: it stays out until its ejection ends");
    let weak = Arc::downgrade(inst);
    inst.spawn(async move {
        tokio::time::sleep(time).await;
        if let Some(inst) = weak.upgrade() {
            readmit(&inst, id);
        }
    });
    true
}

/// The ejection numbered `id` is over: the instance is readmitted on probation, unless that
/// ejection ended already (the instance was removed, then taken back and ejected anew).
fn readmit(inst: &Instance, id: u32) {
    if inst.ejection_id.load(Ordering::Acquire) != id {
        return;
    }
    if inst.transition(State::Ejected, State::Ready) {
        inst.ctx.ejected.fetch_sub(1, Ordering::AcqRel);
        inst.consecutive_failures.store(0, Ordering::Relaxed);
        inst.consecutive_successes.store(0, Ordering::Relaxed);
        inst.probation.store(true, Ordering::Relaxed);
        inst.warm_up();
        tracing::info!(server.address = %inst.target.name, "instance readmitted on probation");
    }
}

/// One round of the success-rate rule over `instances`: ejects the ones far below the mean.
/// Resets the interval's counters.
pub(crate) fn success_rate_sweep(health: &super::Health, instances: &[Arc<Instance>]) {
    let cfg = &health.ejection;
    let mut rates = Vec::with_capacity(instances.len());
    for inst in instances {
        let ok = inst.window_ok.swap(0, Ordering::Relaxed);
        let err = inst.window_err.swap(0, Ordering::Relaxed);
        let total = ok + err;
        if total >= cfg.success_rate_min_calls && inst.state() == State::Ready {
            rates.push((inst, ok as f64 / total as f64));
        }
    }
    if rates.len() < 2 {
        return;
    }
    let mean = rates.iter().map(|r| r.1).sum::<f64>() / rates.len() as f64;
    let var = rates.iter().map(|r| (r.1 - mean).powi(2)).sum::<f64>() / rates.len() as f64;
    let floor = mean - cfg.success_rate_stdev_factor * var.sqrt();
    for (inst, rate) in rates {
        if rate < floor && rate < cfg.success_rate_threshold {
            tracing::debug!(server.address = %inst.target.name, rate, mean, "success rate far below the others");
            eject(health, inst, "low success rate");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The timer of an ejection readmits that ejection only: an instance removed, taken back
    /// and ejected anew stays out for its new ejection when the old timer fires.
    #[tokio::test]
    async fn an_old_readmission_timer_does_not_end_a_new_ejection() {
        let uris = ["http://127.0.0.1:1", "http://127.0.0.1:2"];
        let ch = crate::BalancedChannel::from_static(uris).unwrap();
        let inst = ch.shared.snapshot()[0].clone();
        let health = super::super::Health {
            ejection: Ejection::default(),
            totals: Default::default(),
        };
        assert!(eject(&health, &inst, "test"));
        let first = inst.ejection_id.load(Ordering::Acquire);
        // Removed, and taken back once its time is over: on probation, then ejected again.
        assert!(ch.remove(uris[0]).unwrap());
        inst.ejected_until.store(0, Ordering::Relaxed);
        let endpoints = uris.map(tonic::transport::Endpoint::from_static);
        assert_eq!(ch.replace_all(endpoints).unwrap(), (1, 0));
        assert_eq!(inst.state(), State::Connecting);
        assert!(inst.probation.load(Ordering::Relaxed));
        assert!(eject(&health, &inst, "again"));
        // The first ejection's timer fires: nothing happens.
        readmit(&inst, first);
        assert_eq!(
            inst.state(),
            State::Ejected,
            "the old timer ended the new ejection"
        );
        // The new ejection's timer readmits it.
        readmit(&inst, inst.ejection_id.load(Ordering::Acquire));
        assert_eq!(inst.state(), State::Ready);
    }

    const URIS: [&str; 2] = ["http://127.0.0.1:1", "http://127.0.0.1:2"];

    /// A channel over two instances never connected, its first instance, and health with
    /// ejections of 30 s.
    fn two_instances() -> (
        crate::BalancedChannel,
        Arc<Instance>,
        super::super::Health,
        std::time::Duration,
    ) {
        let ch = crate::BalancedChannel::from_static(URIS).unwrap();
        let inst = ch.shared.snapshot()[0].clone();
        let base = std::time::Duration::from_secs(30);
        let health = super::super::Health {
            ejection: Ejection::default().base_time(base),
            totals: Default::default(),
        };
        (ch, inst, health, base)
    }

    /// On tokio's paused clock: an ejection lasts its base time, the instance comes back on
    /// probation, one failure then ejects it for twice as long, and a call answered in
    /// between ends the probation.
    #[tokio::test(start_paused = true)]
    async fn ejections_last_their_time_and_double_in_a_streak() {
        let (_ch, inst, health, base) = two_instances();
        assert!(eject(&health, &inst, "test"));
        assert_eq!(inst.state(), State::Ejected);
        tokio::time::sleep(base - std::time::Duration::from_millis(1)).await;
        assert_eq!(inst.state(), State::Ejected, "readmitted before its time");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        assert_eq!(inst.state(), State::Ready, "not readmitted after its time");
        assert!(inst.probation.load(Ordering::Relaxed));
        // One failure on probation: ejected again, for twice the base time.
        super::super::record(&health, &inst, crate::instance::events::Outcome::Failure);
        assert_eq!(inst.state(), State::Ejected);
        tokio::time::sleep(2 * base - std::time::Duration::from_millis(1)).await;
        assert_eq!(
            inst.state(),
            State::Ejected,
            "the second ejection was not longer"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        assert_eq!(inst.state(), State::Ready);
        // An answer ends the probation; the ejection count says two.
        super::super::record(&health, &inst, crate::instance::events::Outcome::Success);
        assert!(!inst.probation.load(Ordering::Relaxed));
        assert_eq!(inst.ejections.load(Ordering::Relaxed), 2);
    }

    /// On tokio's paused clock: an instance removed while ejected and taken back half way
    /// through its ejection stays out for the half that is left, not for a whole new one.
    #[tokio::test(start_paused = true)]
    async fn taken_back_while_ejected_it_stays_out_for_what_is_left() {
        let (ch, inst, health, base) = two_instances();
        assert!(eject(&health, &inst, "test"));
        tokio::time::sleep(base / 2).await;
        assert!(ch.remove(URIS[0]).unwrap());
        assert_eq!(inst.state(), State::Draining);
        assert!(super::super::revive(&health, &inst, 2));
        assert_eq!(
            inst.state(),
            State::Ejected,
            "taken back into service at once"
        );
        tokio::time::sleep(base / 2 - std::time::Duration::from_millis(1)).await;
        assert_eq!(inst.state(), State::Ejected);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        assert_eq!(
            inst.state(),
            State::Ready,
            "out for longer than what was left of its ejection"
        );
    }

    #[test]
    fn cap_leaves_one_and_allows_one() {
        let e = Ejection::default();
        assert_eq!(e.cap(0), 0);
        assert_eq!(e.cap(1), 0);
        assert_eq!(e.cap(2), 1);
        assert_eq!(e.cap(5), 2);
        assert_eq!(e.cap(20), 10);
        let all = Ejection::default().max_ejected_percent(100);
        assert_eq!(all.cap(4), 3);
        let none = Ejection::default().max_ejected_percent(0);
        assert_eq!(none.cap(4), 0);
        assert_eq!(Ejection::disabled().cap(4), 0);
    }
}
