//! Outlier ejection, after gRPC's (gRFC A50) and Envoy's: an instance found an outlier (see
//! `ejection.rs` for the rules and `sweep.rs` for the interval rules) is ejected for a time that
//! doubles with each ejection in a streak, then readmitted on probation.
//!
//! Sources: [gRFC A50](https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md).

use std::sync::Arc;

use crate::instance::{Instance, State};

/// After a failure: eject `inst` if it failed `n` times in a row, or once on probation.
pub(crate) fn eject_check(health: &super::Health, inst: &Arc<Instance>, n: u32) {
    let on_probation = inst.ejection.on_probation();
    let rules = health.rules();
    // Envoy's `enforcing_consecutive_5xx`: an outlier so found is ejected with this chance,
    // drawn once, as the run reaches the threshold (Envoy's `Outlier::DetectorImpl`); at
    // 100%, each further failure tries again (an ejection the cap refused).
    let enforced = || {
        rules.consecutive_enforcement >= 100
            || (n == rules.consecutive_failures
                && crate::rng::random_unit() * 100.0 < f64::from(rules.consecutive_enforcement))
    };
    if on_probation || (n >= rules.consecutive_failures && enforced()) {
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
    let cfg = health.rules();
    let policy = &inst.ctx;
    let cap = cfg.cap(policy.live.members());
    // Reserve a slot under the cap first, so that concurrent ejections cannot exceed it.
    let reserved = policy.live.reserve_ejection(cap);
    if !reserved {
        tracing::debug!(server.address = %inst.target.name, cap, "not ejected: ejection cap reached");
        crate::observe::ejection(&health.totals, inst, why, false);
        return false;
    }
    if !inst.transition(State::Ready, State::Ejected)
        && !inst.transition(State::Connecting, State::Ejected)
    {
        policy.live.ejection_over();
        return false;
    }
    let streak = inst.ejection.ejected();
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
        failures = inst.ejection.consecutive_failures(),
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
    inst.ejection.start(until)
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
    let left = inst.ejection.left_ns(policy.now_ns());
    if left == 0 {
        return false;
    }
    let cap = health.rules().cap(members);
    let reserved = policy.live.reserve_ejection(cap);
    if !reserved {
        return false;
    }
    if !inst.transition(State::Draining, State::Ejected) {
        policy.live.ejection_over();
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
    if !inst.ejection.is_current(id) {
        return;
    }
    if inst.transition(State::Ejected, State::Ready) {
        inst.ctx.live.ejection_over();
        inst.ejection.on_probation_again();
        inst.warm_up();
        tracing::info!(server.address = %inst.target.name, "instance readmitted on probation");
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
        let health =
            super::super::Health::new(super::super::Ejection::default(), Default::default());
        assert!(eject(&health, &inst, "test"));
        let first = inst.ejection.ejection_id();
        // Removed, and taken back once its time is over: on probation, then ejected again.
        assert!(ch.remove(uris[0]).unwrap());
        inst.ejection.time_over();
        let endpoints = uris.map(tonic::transport::Endpoint::from_static);
        assert_eq!(ch.replace_all(endpoints).unwrap(), (1, 0));
        assert_eq!(inst.state(), State::Connecting);
        assert!(inst.ejection.on_probation());
        assert!(eject(&health, &inst, "again"));
        // The first ejection's timer fires: nothing happens.
        readmit(&inst, first);
        assert_eq!(
            inst.state(),
            State::Ejected,
            "the old timer ended the new ejection"
        );
        // The new ejection's timer readmits it.
        readmit(&inst, inst.ejection.ejection_id());
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
        let health = super::super::Health::new(
            super::super::Ejection::default().base_time(base),
            Default::default(),
        );
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
        assert!(inst.ejection.on_probation());
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
        super::super::record(
            &health,
            &inst,
            crate::instance::events::Outcome::Answer(tonic::Code::Ok),
        );
        assert!(!inst.ejection.on_probation());
        assert_eq!(inst.ejection.ejections(), 2);
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
}
