//! The plan's next attempt of a call: a hedge, a retry after its backoff, or a parked call sent
//! again (wait-for-ready, or room on an instance that refused its stream). Each decides from
//! the call's [`RetryState`] and starts the attempt beside the call's others; the call
//! (`decide.rs`) goes on, waits, or ends.
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

use std::task::Context;

use super::attempt::Attempt;
use super::plan::{Attempts, Plan, RetryState, RECHECK};
use crate::instance::conns::UNCOUNTED;
use crate::instance::events::AttemptKind;
use crate::observe::CallObs;
use crate::pick::dispatch::{could_take, pick_now};

/// What the plan's next attempt came to.
pub(super) enum Next {
    /// An attempt was started.
    Sent,
    /// None now: the call waits (for its timer, the attempts in flight, or the request).
    Waits,
    /// None ever: the call is over with the last answer it had.
    Ends,
}

/// The plan's next attempt, its timer fired (or a hedge asked for at once), beside the
/// call's `attempts` in flight.
pub(super) fn attempt(
    again: &mut RetryState,
    attempts: &mut Attempts,
    obs: &mut CallObs,
    cx: &mut Context<'_>,
) -> Next {
    match again.plan {
        Plan::Hedge => hedge(again, attempts, obs, cx),
        Plan::Retry => retry(again, attempts, obs),
        Plan::Replay => Next::Waits,
    }
}

/// The hedging policy's next attempt, if it can go now.
fn hedge(
    again: &mut RetryState,
    attempts: &mut Attempts,
    obs: &mut CallObs,
    cx: &mut Context<'_>,
) -> Next {
    let next = again.next.as_mut().expect("a hedged call's state");
    let policy = next.hedging.clone().expect("a hedged call's policy");
    next.hedge_now = false;
    next.hedge_waits = false;
    if next.stopped || next.made >= policy.max_attempts {
        next.armed = false;
        return Next::Waits;
    }
    // The attempts so far, before this hedge.
    let previous = next.made;
    let Some(time_left) = again.time_left() else {
        return Next::Waits;
    };
    let busy = !attempts.is_empty();
    if !could_take(&again.shared.picker, &again.tried) {
        // Every usable instance has been tried: one may come back (readmitted, added)
        // while the attempts in flight go on.
        if busy {
            again.arm(policy.delay.max(RECHECK));
        }
        return Next::Waits;
    }
    let Some((mut req, id)) = again.hedge_request(time_left, previous, busy, cx) else {
        return Next::Waits;
    };
    if again.budget().is_some_and(|b| !b.withdraw()) {
        tracing::debug!("retry budget spent: no further hedge");
        crate::observe::budget_exhausted(&again.shared.totals);
        again.stop();
        return Next::Waits;
    }
    let (snap, picked) = pick_now(&again.shared.picker, &again.tried, again.method);
    let Some(idx) = picked else {
        // The set changed since the look above: the hedge did not go out.
        if let Some(budget) = again.budget() {
            budget.refund();
        }
        again.arm(policy.delay.max(RECHECK));
        return Next::Waits;
    };
    let inst = snap[idx].clone();
    again.tried(&inst);
    again.arm(policy.delay);
    let made = {
        let next = again.next();
        next.made += 1;
        next.made
    };
    tracing::debug!(server.address = %inst.target.name, attempt = made, "hedged attempt sent");
    let a = obs.attempt(&again.shared.totals, &inst, AttemptKind::Hedge);
    a.count_sent(&mut req);
    let watch = again.shared.replay;
    let mut hedge = Attempt::start(&inst, again.method, req, id, watch, UNCOUNTED, a);
    hedge.previous = previous;
    attempts.push(hedge);
    Next::Sent
}

/// The retry policy's next attempt, its backoff over.
fn retry(again: &mut RetryState, attempts: &mut Attempts, obs: &mut CallObs) -> Next {
    // `made` counts this retry already.
    let previous = again.next().made - 1;
    // The budget's token, taken as the retry goes out (given back if it does not).
    let shared = again.shared.clone();
    let budget = shared
        .budget
        .as_ref()
        .filter(|b| again.budgeted() || b.is_throttle());
    if budget.is_some_and(|b| !b.take()) {
        tracing::debug!("retry budget spent: not retrying");
        crate::observe::budget_exhausted(&shared.totals);
        return Next::Ends;
    }
    let inst = again.retry_pick();
    if inst.is_none() && again.wait_for_ready() && again.replay.replayable() {
        // Wait-for-ready: the retry waits for a usable instance.
        if let Some(budget) = budget {
            budget.refund();
        }
        again.park(AttemptKind::Retry, previous);
        return Next::Waits;
    }
    let sent = again.time_left().and_then(|time_left| {
        let (req, id) = again.replay.request(time_left, previous)?;
        Some((inst?, req, id))
    });
    let Some((inst, mut req, id)) = sent else {
        // The set changed while the call waited: the caller gets the last answer as it was.
        if let Some(budget) = budget {
            budget.refund();
        }
        return Next::Ends;
    };
    tracing::debug!(server.address = %inst.target.name, attempt = again.next().made, "call retried");
    let a = obs.attempt(&shared.totals, &inst, AttemptKind::Retry);
    a.count_sent(&mut req);
    let mut retry = Attempt::start(&inst, again.method, req, id, shared.replay, UNCOUNTED, a);
    retry.previous = previous;
    attempts.push(retry);
    Next::Sent
}

/// Wait-for-ready, or room on an instance that refused the call's stream: an instance may
/// take it now. The parked attempt goes to one (a retry through the retry policy), or the
/// call waits again.
pub(super) fn resume(
    again: &mut RetryState,
    attempts: &mut Attempts,
    obs: &mut CallObs,
    cx: &mut Context<'_>,
) -> Next {
    let Some(parked) = again.parked.take() else {
        return Next::Waits;
    };
    let made = match parked.kind {
        AttemptKind::Retry => retry(again, attempts, obs),
        _ => send_unseen(again, attempts, obs, parked.previous),
    };
    if again.parked.as_ref().is_some_and(|p| !p.notified()) {
        // An instance is usable, but the pick just found none (the set changed between the
        // two looks): look again at the next poll.
        cx.waker().wake_by_ref();
    }
    made
}

/// Sends the parked call again, unseen by the caller, to a usable instance (the request
/// whole, with `previous` attempts before it); with none, a wait-for-ready call parks again
/// and any other is over.
fn send_unseen(
    again: &mut RetryState,
    attempts: &mut Attempts,
    obs: &mut CallObs,
    previous: u32,
) -> Next {
    let Some(time_left) = again.time_left() else {
        // The deadline ends the call.
        again.park(AttemptKind::Transparent, previous);
        return Next::Waits;
    };
    let (snap, picked) = pick_now(&again.shared.picker, &[], again.method);
    let Some(idx) = picked else {
        if !again.wait_for_ready() {
            // Waited for room on an instance that left service meanwhile.
            return Next::Ends;
        }
        again.park(AttemptKind::Transparent, previous);
        return Next::Waits;
    };
    let Some((mut req, id)) = again.replay.request(time_left, previous) else {
        return Next::Ends;
    };
    let inst = snap[idx].clone();
    if again.plan == Plan::Hedge {
        again.tried(&inst);
    }
    tracing::debug!(server.address = %inst.target.name, "call sent again: an instance is usable (wait-for-ready)");
    let a = obs.attempt(&again.shared.totals, &inst, AttemptKind::Transparent);
    a.count_sent(&mut req);
    let mut attempt = Attempt::start(&inst, again.method, req, id, true, UNCOUNTED, a);
    attempt.previous = previous;
    attempts.push(attempt);
    Next::Sent
}
