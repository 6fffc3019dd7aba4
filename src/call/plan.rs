//! What a call needs to make attempts after its first: its plan (transparent replays only, the
//! retry policy, or the method's hedging policy), the plan's state in the call, the instances
//! it tried, and its attempts in flight.
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::time::{Instant, Sleep};
use tonic::Code;

use super::attempt::Attempt;
use super::outcome::End;
use super::replay::{AttemptId, Copied, Replay};
use super::shared::Shared;
use super::CallResult;
use crate::instance::events::AttemptKind;
use crate::instance::Instance;
use crate::load::tie::Method;
use crate::pick::dispatch::{could_take, pick_now};
use crate::pushback::Pushback;
use crate::retry::{Budget, HedgingPolicy, MethodPolicy, RetryPolicy};

/// At most this many transparent replays of one call on instances it has tried already (a
/// connection closed before the request was written: the same instance may take the call on a
/// fresh connection). Calls whose instance could not be reached move on to untried instances,
/// and are bounded by the set.
pub(super) const MAX_SAME_INSTANCE_REPLAYS: u8 = 3;

/// At most this many times one call's stream, refused by the server unprocessed, is sent again
/// unseen by the caller, each time on another connection of the instance where there is one; a
/// further refusal is left to the retry policy. gRFC A6 sends it again once; a server whose
/// count of a connection's streams lags behind its client's (gRPC's C-core) refuses again on
/// the same connection, and a second refusal on another one is no rarity under load (what one
/// and three replays leave failed: docs/design.md, "Connections per instance";
/// `tests/suite/call_path.rs`). A refused stream costs its server nothing.
pub(super) const MAX_REFUSED_REPLAYS: u8 = 3;

/// A call with a deadline and no other attempt in flight whose stream was refused again (its
/// second refusal and on) waits for room before it goes again: for a call on the refusing
/// instance to end (or for none to be left on it), so that the server's count of its streams
/// has caught up. It may be refused this many times in all, its deadline bounding the waits.
/// Sent again at once each time, a C-core server that lags behind its client on a busy machine
/// refuses the same call past [`MAX_REFUSED_REPLAYS`] (docs/design.md, "Connections per
/// instance"; `conformance::python::refused_streams_at_the_servers_limit_fail_at_most_one_call_in_a_hundred`).
pub(super) const MAX_REFUSED_WAITED: u8 = 10;

/// The least wait before a hedge looks again for an instance that no attempt of the call has
/// gone to, when every usable one has been tried (one may be readmitted or added).
pub(super) const RECHECK: Duration = Duration::from_millis(50);

/// The plan for attempts after the first.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// Transparent replays only.
    Replay,
    /// The method's retry policy (and transparent replays).
    Retry,
    /// The method's hedging policy (and transparent replays).
    Hedge,
}

impl Plan {
    /// The plan for a call to a method with `policy`; `None` if nothing will send the call
    /// again (no policy, transparent replay off: `replay`).
    #[inline]
    pub(super) fn of(policy: &MethodPolicy, replay: bool) -> Option<Plan> {
        match (&policy.hedging, &policy.retry) {
            (Some(_), _) => Some(Plan::Hedge),
            (None, Some(_)) => Some(Plan::Retry),
            (None, None) if replay => Some(Plan::Replay),
            (None, None) => None,
        }
    }
}

/// What a call needs to make another attempt.
pub(super) struct RetryState {
    pub(super) shared: Arc<Shared>,
    pub(super) replay: Replay,
    pub(super) method: Method,
    pub(super) deadline_at: Option<Instant>,
    pub(super) plan: Plan,
    /// The method's retry policy, for [`Plan::Retry`].
    pub(super) retry: Option<Arc<RetryPolicy>>,
    /// Transparent replays on instances tried already (see [`MAX_SAME_INSTANCE_REPLAYS`]).
    pub(super) same_instance: u8,
    /// Refused streams sent again (see [`MAX_REFUSED_REPLAYS`]).
    pub(super) refusals: u8,
    /// The method's `maxResponseMessageBytes`, if its service config sets one.
    pub(super) max_response: Option<u32>,
    /// The method's `waitForReady`, if its service config sets it.
    pub(super) method_wait_for_ready: Option<bool>,
    /// The instances the call must not go to again: those whose attempt ended without success
    /// and, for a hedged call, every one an attempt went to (empty until then: no allocation on
    /// a call's first attempt).
    pub(super) tried: Vec<Arc<Instance>>,
    /// The call waits to send its request again: for a usable instance (wait-for-ready), or
    /// for room on the instance that refused its stream again.
    pub(super) parked: Option<Parked>,
    /// The retry or hedging policy's state, from when it is first needed (a hedged call's
    /// start, a call's first retry): boxed, so that the calls that never need it (nearly all)
    /// carry a word.
    pub(super) next: Option<Box<PolicyState>>,
}

/// A call waiting to send its request again: for a usable instance (wait-for-ready: its attempt
/// could not reach its instance, or its retry found none, and no other could take it), or for
/// room on the instance that refused its stream again.
pub(super) struct Parked {
    /// Woken when an instance may have become usable (or has room); `None`: look now.
    wait: Option<Pin<Box<OwnedNotified>>>,
    /// The attempt that goes once one is usable: sent again unseen, or a retry.
    pub(super) kind: AttemptKind,
    /// Its `grpc-previous-rpc-attempts`.
    pub(super) previous: u32,
}

impl Parked {
    /// Whether an instance may be usable now.
    pub(super) fn ready(&mut self, cx: &mut Context<'_>) -> bool {
        match &mut self.wait {
            None => true,
            Some(w) => w.as_mut().poll(cx).is_ready(),
        }
    }

    /// Whether it waits for a notification (rather than looking at once).
    pub(super) fn notified(&self) -> bool {
        self.wait.is_some()
    }
}

/// The state of a retry or hedging policy in one call.
pub(super) struct PolicyState {
    /// The hedging policy of a hedged call.
    pub(super) hedging: Option<Arc<HedgingPolicy>>,
    /// Attempts made under the policy, the first included (transparent replays do not count).
    pub(super) made: u32,
    /// Retries since the server's last pushback (or since the first attempt): the next
    /// backoff is the policy's for retry number `since_pushback + 1`, so that after a pushback
    /// it starts again from the initial backoff (gRFC A6).
    pub(super) since_pushback: u32,
    /// The latest answer that did not end the call (a status retried or non-fatal): the
    /// caller's if no further attempt answers.
    pub(super) last: Option<CallResult>,
    /// When the next attempt goes (the retry's backoff, the next hedge), if `armed`.
    pub(super) timer: Option<Pin<Box<Sleep>>>,
    pub(super) armed: bool,
    /// A hedge goes out at the next turn of the loop (a non-fatal answer came).
    pub(super) hedge_now: bool,
    /// A hedge waits for the request to be sent whole by the first attempt (the replay slot
    /// wakes the call then).
    pub(super) hedge_waits: bool,
    /// No further attempt of the policy: a server's pushback, the budget, or a request that
    /// was not kept.
    pub(super) stopped: bool,
}

impl PolicyState {
    pub(super) fn new(hedging: Option<Arc<HedgingPolicy>>) -> Box<PolicyState> {
        Box::new(PolicyState {
            hedging,
            made: 1,
            since_pushback: 0,
            last: None,
            timer: None,
            armed: false,
            hedge_now: false,
            hedge_waits: false,
            stopped: false,
        })
    }

    /// The next attempt goes in `after` (the timer is made on `runtime`: the caller may be on
    /// any executor).
    pub(super) fn arm(&mut self, after: Duration, runtime: &tokio::runtime::Handle) {
        let at = crate::time::after(after);
        match self.timer.as_mut() {
            Some(t) => t.as_mut().reset(at),
            None => {
                let _rt = runtime.enter();
                self.timer = Some(Box::pin(tokio::time::sleep_until(at)));
            }
        }
        self.armed = true;
    }

    /// Whether the timer for the next attempt has fired (it is disarmed then).
    pub(super) fn fired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.armed {
            return false;
        }
        let t = self.timer.as_mut().expect("armed");
        if t.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.armed = false;
        true
    }

    /// Whether the call waits for a next attempt of its policy.
    pub(super) fn waiting(&self) -> bool {
        self.armed || self.hedge_now || self.hedge_waits
    }

    /// No further attempt of the policy.
    pub(super) fn stop(&mut self) {
        self.stopped = true;
        self.armed = false;
        self.hedge_now = false;
        self.hedge_waits = false;
    }
}

impl RetryState {
    /// Where a call whose attempt `a` was not processed goes again: the pick's choice among the
    /// instances it has not tried, else the same instance if it may take it again (`same_ok`).
    /// `Err(true)`: none now, and the call waits for one (wait-for-ready); `Err(false)`: none.
    pub(super) fn where_again(
        &mut self,
        a: &Attempt,
        same_ok: bool,
        e: &(dyn std::error::Error + 'static),
    ) -> Result<Arc<Instance>, bool> {
        let inst = a.instance();
        let (snap, picked) = pick_now(&self.shared.picker, &self.tried, self.method);
        match picked {
            Some(idx) => Ok(snap[idx].clone()),
            None if same_ok && inst.is_usable() => Ok(inst.clone()),
            None if self.wait_for_ready() && self.replay.replayable() => {
                // Wait-for-ready goes through transient failures: the call waits for an instance
                // to come back, then is sent again.
                tracing::debug!(server.address = %inst.target.name, reason = %e, "no instance can take the call: it waits for one (wait-for-ready)");
                self.park(AttemptKind::Transparent, a.previous);
                Err(true)
            }
            None => {
                tracing::debug!(server.address = %inst.target.name, reason = %e, "no other instance to send the call to");
                Err(false)
            }
        }
    }

    /// What a call to `method` routed with `plan` (for its method's `policy`) needs for its
    /// attempts after the first: its request in `replay`, its deadline.
    #[inline(always)]
    pub(super) fn new(
        shared: &Arc<Shared>,
        replay: Replay,
        method: Method,
        deadline_at: Option<Instant>,
        plan: Plan,
        policy: &MethodPolicy,
    ) -> Box<RetryState> {
        Box::new(RetryState {
            shared: shared.clone(),
            replay,
            method,
            deadline_at,
            plan,
            max_response: policy.settings.max_response,
            method_wait_for_ready: policy.settings.wait_for_ready,
            retry: policy.retry.clone(),
            same_instance: 0,
            refusals: 0,
            tried: Vec::new(),
            parked: None,
            next: None,
        })
    }

    /// A hedged call's first attempt went to `first`: the next goes after the policy's delay.
    pub(super) fn start_hedging(&mut self, policy: &Arc<HedgingPolicy>, first: &Arc<Instance>) {
        self.next = Some(PolicyState::new(Some(policy.clone())));
        self.tried(first);
        self.arm(policy.delay);
    }

    /// The time left before the deadline (`Some(None)`: no deadline); `None` if it has passed.
    pub(super) fn time_left(&self) -> Option<Option<Duration>> {
        match self.deadline_at {
            None => Some(None),
            Some(at) => {
                let left = at.checked_duration_since(Instant::now())?;
                (!left.is_zero()).then_some(Some(left))
            }
        }
    }

    /// What limits this call's retries and hedges: gRPC's throttle, or the crate's budget for a
    /// builder's policy; `None` for a service config's policy without `retryThrottling`.
    pub(super) fn budget(&self) -> Option<&Budget> {
        self.shared
            .budget
            .as_ref()
            .filter(|b| self.budgeted() || b.is_throttle())
    }

    /// Whether the crate's budget limits this call's policy: a builder's policy (gRPC's
    /// throttle, if the channel has one, limits every policy).
    pub(super) fn budgeted(&self) -> bool {
        let hedging = self.next.as_ref().and_then(|n| n.hedging.as_ref());
        match (hedging, &self.retry) {
            (Some(h), _) => !h.from_config,
            (None, Some(r)) => !r.from_config,
            (None, None) => false,
        }
    }

    /// The policy's state, made now if it was not needed before.
    pub(super) fn next(&mut self) -> &mut PolicyState {
        self.next.get_or_insert_with(|| PolicyState::new(None))
    }

    /// The next attempt of the policy goes in `after`.
    pub(super) fn arm(&mut self, after: Duration) {
        let runtime = &self.shared.ctx.runtime;
        self.next
            .get_or_insert_with(|| PolicyState::new(None))
            .arm(after, runtime);
    }

    /// Whether the call waits for a next attempt of its policy, or for a usable instance.
    pub(super) fn waiting(&self) -> bool {
        self.parked.is_some() || self.next.as_ref().is_some_and(|n| n.waiting())
    }

    /// No further attempt of the policy, nor any wait for a usable instance.
    pub(super) fn stop(&mut self) {
        self.parked = None;
        if let Some(n) = self.next.as_mut() {
            n.stop();
        }
    }

    /// After attempt `a`, which the server did not process (`end`): whether the instance it
    /// went to may take the call again, sent unseen (`None`: the call may not be sent again
    /// that way at all, its refused streams spent).
    pub(super) fn same_instance_may_take(&self, a: &Attempt, end: End) -> Option<bool> {
        Some(match end {
            End::Refused => {
                if self.refusals >= MAX_REFUSED_REPLAYS {
                    return None;
                }
                true
            }
            End::ClosedUnsent | End::ConnectFailed
                if self.same_instance < MAX_SAME_INSTANCE_REPLAYS
                    && (end == End::ClosedUnsent || a.guard().held.extra.is_some()) =>
            {
                true
            }
            _ => false,
        })
    }

    /// Whether the call waits for a usable instance rather than fail when none can take it: its
    /// own [`WaitForReady`](super::WaitForReady), else its method's `waitForReady`.
    pub(super) fn wait_for_ready(&self) -> bool {
        super::ready::WaitForReady::of(self.replay.extensions(), self.method_wait_for_ready)
    }

    /// Parks the call until an instance may be usable; then its request goes again as `kind`
    /// (sent again unseen, or a retry), with `previous` attempts before it.
    pub(super) fn park(&mut self, kind: AttemptKind, previous: u32) {
        // The notification first, then a look at the set: a change in between is not missed.
        let wait = super::ready::notified(&self.shared.usable);
        let now = could_take(&self.shared.picker, &[]);
        self.parked = Some(Parked {
            wait: (!now).then_some(wait),
            kind,
            previous,
        });
    }

    /// Parks the call until `inst`, which refused its stream again, has room (a call on it
    /// ends); then its request goes again, unseen, with `previous` attempts before it. The
    /// notification first, then a look at the instance: with no call left on it, it goes at
    /// once.
    pub(super) fn park_for_room(&mut self, inst: &Instance, previous: u32) {
        let wait = super::ready::notified(&inst.room);
        inst.want_room();
        let now = inst.in_flight() == 0;
        self.refusals += 1;
        self.parked = Some(Parked {
            wait: (!now).then_some(wait),
            kind: AttemptKind::Transparent,
            previous,
        });
    }

    pub(super) fn tried(&mut self, inst: &Arc<Instance>) {
        if !self.tried.iter().any(|t| Arc::ptr_eq(t, inst)) {
            self.tried.push(inst.clone());
        }
    }

    /// The request for a hedge with `previous` attempts before it, if it can go now (`busy`:
    /// attempts are in flight); else the call waits for it (the first attempt has not sent the
    /// request whole yet: the replay slot wakes the call then) or hedging stops (the request
    /// was not kept).
    pub(super) fn hedge_request(
        &mut self,
        time_left: Option<Duration>,
        previous: u32,
        busy: bool,
        cx: &mut Context<'_>,
    ) -> Option<(http::Request<tonic::body::Body>, AttemptId)> {
        match self.replay.copy(time_left, previous, cx) {
            Copied::Ready(req, id) => Some((req, id)),
            Copied::Later | Copied::Unread if !busy => {
                // No attempt in flight has the request: this one takes it.
                let request = self.replay.request(time_left, previous);
                if request.is_none() {
                    self.stop();
                }
                request
            }
            Copied::Later | Copied::Unread => {
                // The first attempt has not sent the whole request yet: the hedge waits for it.
                self.next().hedge_waits = true;
                None
            }
            Copied::Never => {
                tracing::debug!("request not kept (larger than max_replay_body): not hedged");
                self.stop();
                None
            }
        }
    }

    /// Whether the retry policy sends this failure again, and if so the backoff to wait first
    /// (or the server's pushback instead: a wait it asks for, or no retry). Everything that
    /// could make the retry impossible is checked first, and the budget only asked (its token
    /// is taken when the retry goes out), so that a call with nowhere to go keeps the answer
    /// it has and the budget its token; nothing of the pick moves. A
    /// retry may go to an instance the call tried (see [`retry_pick`](Self::retry_pick)).
    pub(super) fn retry_after(
        &mut self,
        code: Code,
        pushback: Option<Pushback>,
    ) -> Option<Duration> {
        let policy = self.retry.as_deref()?;
        let stop = pushback == Some(Pushback::Stop);
        if !policy.retries(code) && !stop {
            return None;
        }
        // gRPC's throttle counts every failure with a retryable status, retried or not, and
        // every answer whose pushback says not to retry, whatever its status (gRFC A6).
        if let Some(budget) = self.budget() {
            budget.failed();
        }
        if stop {
            tracing::debug!(
                rpc.grpc.status_code = code as i32,
                "the server's pushback says not to retry"
            );
            return None;
        }
        let (made, since_pushback) = self
            .next
            .as_ref()
            .map_or((1, 0), |n| (n.made, n.since_pushback));
        if made >= policy.max_attempts {
            return None;
        }
        if !self.replay.replayable() {
            return None;
        }
        let delay = match pushback {
            Some(Pushback::After(wait)) => wait,
            _ => policy.backoff(since_pushback + 1),
        };
        if self
            .deadline_at
            .is_some_and(|d| crate::time::after(delay) >= d)
        {
            return None;
        }
        // Any usable instance will do, one the call tried included (see `retry_pick`).
        if !could_take(&self.shared.picker, &[]) {
            return None;
        }
        // Asked now; the crate's budget gives its token when the retry goes out (`retry`).
        if self.budget().is_some_and(|b| !b.allows()) {
            tracing::debug!("retry budget spent: not retrying");
            crate::observe::budget_exhausted(&self.shared.totals);
            return None;
        }
        let next = self.next();
        next.made += 1;
        next.since_pushback = match pushback {
            None => since_pushback + 1,
            Some(_) => 0,
        };
        Some(delay)
    }
}

impl RetryState {
    /// The instance for a retry: one the call has not tried if one is usable, else one it
    /// tried that is still usable (gRFC A6 picks a retry's instance afresh, and the pick may
    /// choose the same one: with one address, a Kubernetes Service or a VIP, there is no
    /// other). `None` if no instance is usable.
    pub(super) fn retry_pick(&self) -> Option<Arc<Instance>> {
        let picker = &self.shared.picker;
        let (snap, picked) = match pick_now(picker, &self.tried, self.method) {
            (snap, Some(idx)) => (snap, Some(idx)),
            _ => pick_now(picker, &[], self.method),
        };
        picked.map(|idx| snap[idx].clone())
    }
}

/// The attempts of a call in flight: the first inline (a call that is not hedged never has
/// more), hedges beside it.
pub(super) struct Attempts {
    pub(super) head: Option<Attempt>,
    pub(super) rest: Vec<Attempt>,
}

impl Attempts {
    pub(super) fn none() -> Attempts {
        Attempts {
            head: None,
            rest: Vec::new(),
        }
    }

    #[inline]
    pub(super) fn one(a: Attempt) -> Attempts {
        Attempts {
            head: Some(a),
            rest: Vec::new(),
        }
    }

    #[inline]
    pub(super) fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    pub(super) fn get_mut(&mut self, i: usize) -> &mut Attempt {
        match i {
            0 => self.head.as_mut().expect("in range"),
            _ => &mut self.rest[i - 1],
        }
    }

    pub(super) fn push(&mut self, a: Attempt) {
        if self.head.is_none() {
            self.head = Some(a);
        } else {
            self.rest.push(a);
        }
    }

    /// Takes attempt `i` out (the last one takes its place).
    #[inline]
    pub(super) fn remove(&mut self, i: usize) -> Attempt {
        if i == 0 {
            let a = self.head.take().expect("in range");
            if !self.rest.is_empty() {
                self.head = self.rest.pop();
            }
            a
        } else {
            self.rest.swap_remove(i - 1)
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Attempt> {
        self.head.iter().chain(self.rest.iter())
    }

    /// Cancels every attempt: dropping one resets its stream (its server sees the
    /// cancellation) and releases its counts.
    pub(super) fn clear(&mut self) {
        self.head = None;
        self.rest.clear();
    }
}
