//! The life of a call: one machine for every call, plain, replayed, retried or hedged.
//!
//! A call is a set of [attempts](attempt) (usually one) and, when it may make more, what that
//! needs: its request kept ([`replay`]), the instances it tried, and a plan: transparent replay
//! only, the [`RetryPolicy`](crate::RetryPolicy), or a [`HedgingPolicy`](crate::HedgingPolicy).
//! Each attempt ends in one of the ways [`outcome`] lists, which says once, for every kind of
//! call, what that end does to the instance and to its connection; the plan then decides what
//! happens to the call:
//!
//! - an answer is delivered, unless its status is one the plan sends again (a retryable status
//!   after a backoff, a non-fatal one at once as a hedge);
//! - an attempt the server did not process (nothing of it went out, or its stream was refused)
//!   is sent again at once, unseen by the caller, if its request can be had whole (gRPC's
//!   transparent retry);
//! - a broken connection or a reset stream counts as its status for the plan;
//! - the caller's own body failing, and the deadline, end the call.
//!
//! The pick runs only for an attempt that is sent: whether a retry or a hedge could go anywhere
//! is asked of the set without moving any pick's state ([`could_take`]).

mod attempt;
pub(crate) mod guard;
mod outcome;
mod replay;
pub(crate) mod shared;

use outcome::head_status;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::Code;
use tower::BoxError;

use self::attempt::{Attempt, Polled};
use self::outcome::End;
use self::replay::{Copied, Replay};
use self::shared::Shared;
use crate::call::guard::GuardedBody;
use crate::error::{deadline_exceeded, no_usable_instance};
use crate::hedge::HedgingPolicy;
use crate::instance::conns::UNCOUNTED;
use crate::instance::events::Kind;
use crate::instance::tie::Method;
use crate::instance::Instance;
use crate::observe::CallObs;
use crate::pick::dispatch::{could_take, no_instance_message, pick_now};
use crate::pushback::Pushback;
use crate::stats::ServedBy;

/// At most this many transparent replays of one call on instances it has tried already (a
/// connection closed before the request was written: the same instance may take the call on a
/// fresh connection). Calls whose instance could not be reached move on to untried instances,
/// and are bounded by the set.
const MAX_SAME_INSTANCE_REPLAYS: u8 = 3;

/// At most this many times one call's stream, refused by the server unprocessed, is sent again
/// unseen by the caller, each time on another connection of the instance where there is one; a
/// further refusal is left to the retry policy. gRFC A6 sends it again once; a server whose
/// count of a connection's streams lags behind its client's (gRPC's C-core) refuses again on
/// the same connection, and a second refusal on another one is no rarity under load: against
/// a test server refusing 25-30% of the streams, one replay left 3% of the calls failed, three
/// left 0.1% (`tests/call_path.rs`). A refused stream costs its server nothing.
const MAX_REFUSED_REPLAYS: u8 = 3;

/// The least wait before a hedge looks again for an instance that no attempt of the call has
/// gone to, when every usable one has been tried (one may be readmitted or added).
const RECHECK: Duration = Duration::from_millis(50);

pub(crate) type CallResult = Result<http::Response<Body>, BoxError>;

/// The future of one call through a [`BalancedChannel`](crate::BalancedChannel).
pub struct ResponseFuture {
    attempts: Attempts,
    /// What the call needs to make another attempt; `None` for a call that makes none
    /// (transparent retry off, no policy).
    again: Option<Box<Again>>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// The call's span and metrics (moved into the response body with the answer).
    obs: CallObs,
    phase: Phase,
}

enum Phase {
    /// Attempts in flight, or a wait for the next one.
    Running,
    /// Waiting for the first answer of discovery (rare: boxed, so that the future of every
    /// other call does not carry room for a request).
    Discovering(Box<Discovering>),
    /// Over: refused before routing (the status to give), or delivered.
    Over(Option<tonic::Status>),
}

/// A call waiting for the first answer of discovery.
struct Discovering {
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    req: Option<http::Request<Body>>,
    shared: Arc<Shared>,
}

/// The plan for attempts after the first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Transparent replays only.
    Replay,
    /// The channel's retry policy (and transparent replays).
    Retry,
    /// The method's hedging policy (and transparent replays).
    Hedge,
}

/// What a call needs to make another attempt.
struct Again {
    shared: Arc<Shared>,
    replay: Replay,
    method: Method,
    deadline_at: Option<Instant>,
    plan: Plan,
    /// Transparent replays on instances tried already (see [`MAX_SAME_INSTANCE_REPLAYS`]).
    same_instance: u8,
    /// Refused streams sent again (see [`MAX_REFUSED_REPLAYS`]).
    refusals: u8,
    /// The instances the call must not go to again: those whose attempt ended without success
    /// and, for a hedged call, every one an attempt went to (empty until then: no allocation on
    /// a call's first attempt).
    tried: Vec<Arc<Instance>>,
    /// The retry or hedging policy's state, from when it is first needed (a hedged call's
    /// start, a call's first retry): boxed, so that the calls that never need it (nearly all)
    /// carry a word.
    next: Option<Box<Next>>,
}

/// The state of a retry or hedging policy in one call.
struct Next {
    /// The hedging policy of a hedged call.
    hedging: Option<Arc<HedgingPolicy>>,
    /// Attempts made under the policy, the first included (transparent replays do not count).
    made: u32,
    /// The latest answer that did not end the call (a status retried or non-fatal): the
    /// caller's if no further attempt answers.
    last: Option<CallResult>,
    /// When the next attempt goes (the retry's backoff, the next hedge), if `armed`.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
    /// A hedge goes out at the next turn of the loop (a non-fatal answer came).
    hedge_now: bool,
    /// A hedge waits for the request to be sent whole by the first attempt (the replay slot
    /// wakes the call then).
    hedge_waits: bool,
    /// No further attempt of the policy: a server's pushback, the budget, or a request that
    /// was not kept.
    stopped: bool,
}

impl Next {
    fn new(hedging: Option<Arc<HedgingPolicy>>) -> Box<Next> {
        Box::new(Next {
            hedging,
            made: 1,
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
    fn arm(&mut self, after: Duration, runtime: &tokio::runtime::Handle) {
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
    fn fired(&mut self, cx: &mut Context<'_>) -> bool {
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
    fn waiting(&self) -> bool {
        self.armed || self.hedge_now || self.hedge_waits
    }

    /// No further attempt of the policy.
    fn stop(&mut self) {
        self.stopped = true;
        self.armed = false;
        self.hedge_now = false;
        self.hedge_waits = false;
    }
}

impl Again {
    /// The time left before the deadline (`Some(None)`: no deadline); `None` if it has passed.
    fn time_left(&self) -> Option<Option<Duration>> {
        match self.deadline_at {
            None => Some(None),
            Some(at) => {
                let left = at.checked_duration_since(Instant::now())?;
                (!left.is_zero()).then_some(Some(left))
            }
        }
    }

    /// The policy's state, made now if it was not needed before.
    fn next(&mut self) -> &mut Next {
        self.next.get_or_insert_with(|| Next::new(None))
    }

    /// The next attempt of the policy goes in `after`.
    fn arm(&mut self, after: Duration) {
        let runtime = &self.shared.ctx.runtime;
        self.next
            .get_or_insert_with(|| Next::new(None))
            .arm(after, runtime);
    }

    /// Whether the call waits for a next attempt of its policy.
    fn waiting(&self) -> bool {
        self.next.as_ref().is_some_and(|n| n.waiting())
    }

    /// No further attempt of the policy.
    fn stop(&mut self) {
        if let Some(n) = self.next.as_mut() {
            n.stop();
        }
    }

    fn tried(&mut self, inst: &Arc<Instance>) {
        if !self.tried.iter().any(|t| Arc::ptr_eq(t, inst)) {
            self.tried.push(inst.clone());
        }
    }

    /// Whether the retry policy sends this failure again, and if so the backoff to wait first
    /// (or the server's pushback instead: a wait it asks for, or no retry). Everything that
    /// could make the retry impossible is checked before a token of the budget is taken, so
    /// that a call with nowhere to go keeps the answer it has; nothing of the pick moves.
    fn retry_after(&mut self, code: Code, pushback: Option<Pushback>) -> Option<Duration> {
        let policy = self.shared.retry.as_ref()?;
        let made = self.next.as_ref().map_or(1, |n| n.made);
        if !policy.retries(code) || made >= policy.max_attempts {
            return None;
        }
        if !self.replay.replayable() {
            return None;
        }
        let delay = match pushback {
            None => policy.backoff(made),
            Some(Pushback::After(wait)) => wait,
            Some(Pushback::Stop) => {
                tracing::debug!(?code, "the server's pushback says not to retry");
                return None;
            }
        };
        if self
            .deadline_at
            .is_some_and(|d| crate::time::after(delay) >= d)
        {
            return None;
        }
        if !could_take(&self.shared.picker, &self.tried) {
            return None;
        }
        let budget = self.shared.budget.as_ref()?;
        if !budget.withdraw() {
            tracing::debug!("retry budget spent: not retrying");
            crate::observe::budget_exhausted(&self.shared.totals);
            return None;
        }
        self.next().made += 1;
        Some(delay)
    }
}

/// The attempts of a call in flight: the first inline (a call that is not hedged never has
/// more), hedges beside it.
struct Attempts {
    head: Option<Attempt>,
    rest: Vec<Attempt>,
}

impl Attempts {
    fn none() -> Attempts {
        Attempts {
            head: None,
            rest: Vec::new(),
        }
    }

    #[inline]
    fn one(a: Attempt) -> Attempts {
        Attempts {
            head: Some(a),
            rest: Vec::new(),
        }
    }

    #[inline]
    fn len(&self) -> usize {
        usize::from(self.head.is_some()) + self.rest.len()
    }

    fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    fn get_mut(&mut self, i: usize) -> &mut Attempt {
        match i {
            0 => self.head.as_mut().expect("in range"),
            _ => &mut self.rest[i - 1],
        }
    }

    fn push(&mut self, a: Attempt) {
        if self.head.is_none() {
            self.head = Some(a);
        } else {
            self.rest.push(a);
        }
    }

    /// Takes attempt `i` out (the last one takes its place).
    #[inline]
    fn remove(&mut self, i: usize) -> Attempt {
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

    fn iter(&self) -> impl Iterator<Item = &Attempt> {
        self.head.iter().chain(self.rest.iter())
    }

    /// Cancels every attempt: dropping one resets its stream (its server sees the
    /// cancellation) and releases its counts.
    fn clear(&mut self) {
        self.head = None;
        self.rest.clear();
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.attempts.len())
            .finish_non_exhaustive()
    }
}

impl ResponseFuture {
    /// A call through the channel whose calls share `shared`.
    #[inline]
    pub(crate) fn new(shared: &Arc<Shared>, req: http::Request<Body>) -> ResponseFuture {
        let deadline = crate::deadline::from_headers(req.headers()).map(|d| {
            // The timer is made on the channel's runtime: the caller may be on any executor.
            let _rt = shared.ctx.runtime.enter();
            Box::pin(tokio::time::sleep_until(crate::time::after(d)))
        });
        let obs = CallObs::new(&shared.totals, &req);
        route(shared, req, deadline, obs)
    }

    fn over(status: tonic::Status, obs: CallObs) -> ResponseFuture {
        ResponseFuture {
            attempts: Attempts::none(),
            again: None,
            deadline: None,
            obs,
            phase: Phase::Over(Some(status)),
        }
    }

    fn replay(&self) -> Option<&Replay> {
        self.again.as_deref().map(|a| &a.replay)
    }

    /// Polls the attempts and the plan's timer until the call has its answer or waits.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<CallResult> {
        loop {
            let mut moved = false;
            let mut i = 0;
            while i < self.attempts.len() {
                let replay = self.again.as_deref().map(|a| &a.replay);
                match self.attempts.get_mut(i).poll(cx, replay) {
                    Poll::Pending => i += 1,
                    Poll::Ready(polled) => {
                        if let Some(result) = self.ended(i, polled) {
                            return Poll::Ready(result);
                        }
                        // Attempt `i` is another one now (or none): poll it too.
                        moved = true;
                    }
                }
            }
            if let Some(again) = self.again.as_mut() {
                if again
                    .next
                    .as_mut()
                    .is_some_and(|n| n.fired(cx) || n.hedge_now || n.hedge_waits)
                {
                    match self.next_attempt(cx) {
                        Made::Sent => moved = true,
                        Made::Waits => {}
                        Made::Over(result) => return Poll::Ready(result),
                    }
                }
            }
            if self.attempts.is_empty() && !self.again.as_ref().is_some_and(|a| a.waiting()) {
                return Poll::Ready(self.last_word());
            }
            if !moved {
                return Poll::Pending;
            }
        }
    }

    /// Attempt `i` ended: what that says, and what the call does next. `Some`: the call's
    /// answer.
    #[inline]
    fn ended(&mut self, i: usize, polled: Polled) -> Option<CallResult> {
        match polled {
            Polled::Head(resp) => self.answered(i, resp),
            Polled::Failed(e) => {
                let a = self.attempts.remove(i);
                self.failed(a, e)
            }
            Polled::Unreachable => {
                let a = self.attempts.remove(i);
                let e: BoxError =
                    format!("{} could not be reached", a.instance().target.name).into();
                self.failed_as(a, End::Unreachable, e)
            }
        }
    }

    /// Attempt `i`'s response head arrived.
    #[inline]
    fn answered(&mut self, i: usize, mut resp: http::Response<Body>) -> Option<CallResult> {
        let a = self.attempts.get_mut(i);
        a.guard_mut().headers_received();
        if self
            .deadline
            .as_deref()
            .is_some_and(crate::deadline::passed)
        {
            // The deadline passed as the answer came (often the server's own timer answering
            // CANCELLED "Timeout expired"): report it as what it is. The instance answered.
            let outcome = a.guard().deadline_outcome();
            a.guard_mut().finish(outcome);
            a.obs.ended(Code::DeadlineExceeded);
            return Some(self.end_with(deadline_exceeded().into()));
        }
        let inst = a.guard().instance();
        inst.connected();
        resp.extensions_mut()
            .insert(ServedBy::new(inst.target.name.clone()));
        if let Some((code, outcome)) = head_status(&resp) {
            // A trailers-only response carries its load report in its head.
            crate::orca::take_report(inst, resp.headers_mut());
            a.guard_mut().finish(outcome);
            if code != Code::Ok && self.answer_goes_on(i, code, &resp) {
                self.again.as_mut().expect("goes on").next().last = Some(Ok(resp));
                return None;
            }
            self.obs.head(code);
        }
        Some(self.deliver(i, resp))
    }

    /// Whether attempt `i`, answered with a status that is not OK (a trailers-only answer),
    /// is over with the call going on; if so, it is dropped.
    #[cold]
    fn answer_goes_on(&mut self, i: usize, code: Code, resp: &http::Response<Body>) -> bool {
        let inst = self.attempts.get_mut(i).instance().clone();
        let pushback = crate::pushback::read(resp.headers());
        if !self.goes_on(&inst, code, pushback) {
            return false;
        }
        tracing::debug!(?code, addr = %inst.target.name, "attempt answered; the call goes on");
        let mut a = self.attempts.remove(i);
        a.obs.ended(code);
        true
    }

    /// An attempt failed before its response head.
    fn failed(&mut self, a: Attempt, e: BoxError) -> Option<CallResult> {
        let caller = self.replay().is_some_and(|r| r.caller_error().is_some());
        let end = End::of(&*e, caller);
        self.failed_as(a, end, e)
    }

    fn failed_as(&mut self, mut a: Attempt, end: End, e: BoxError) -> Option<CallResult> {
        let outcome = end.settle(a.guard(), &*e);
        a.guard_mut().finish(outcome);
        let inst = a.instance().clone();
        if end == End::Timeout {
            a.obs.ended(Code::DeadlineExceeded);
            return Some(self.end_with(deadline_exceeded().into()));
        }
        if end.unprocessed() && self.unseen_again(&a, end, &*e) {
            a.obs.ended(Code::Unavailable);
            return None;
        }
        let caller = self.replay().and_then(Replay::caller_error);
        let status = end.status(&inst.target.name, e, caller);
        a.obs.ended(crate::observe::code_of(&*status));
        drop(a);
        if end != End::Caller && self.goes_on(&inst, end.code(), None) {
            tracing::debug!(error = %status, addr = %inst.target.name, "attempt failed; the call goes on");
            self.again.as_mut().expect("goes on").next().last = Some(Err(status));
            return None;
        }
        Some(self.end_with(status))
    }

    /// After an attempt on `inst` ended with `code` (and the server's `pushback`), whether the
    /// plan makes another attempt (now, later, or beside the ones in flight).
    fn goes_on(&mut self, inst: &Arc<Instance>, code: Code, pushback: Option<Pushback>) -> bool {
        let Some(again) = self.again.as_mut() else {
            return false;
        };
        match again.plan {
            Plan::Replay => false,
            Plan::Retry => {
                again.tried(inst);
                let Some(delay) = again.retry_after(code, pushback) else {
                    return false;
                };
                self.obs.retrying(delay);
                again.arm(delay);
                true
            }
            Plan::Hedge => {
                let runtime = &again.shared.ctx.runtime;
                let next = again.next.as_mut().expect("a hedged call's state");
                let policy = next.hedging.as_ref().expect("a hedged call's policy");
                if !policy.non_fatal.contains(&code) {
                    return false;
                }
                // A non-fatal answer: the next hedge at once, or when the server says.
                match pushback {
                    None => next.hedge_now = true,
                    Some(Pushback::After(wait)) => {
                        next.hedge_now = false;
                        next.arm(wait, runtime);
                    }
                    Some(Pushback::Stop) => {
                        tracing::debug!(
                            "the server's pushback says not to retry: no further hedge"
                        );
                        next.stop();
                    }
                }
                true
            }
        }
    }

    /// After attempt `a`, which the server did not process (`end`), sends the call again at
    /// once, unseen by the caller, if its request can be had whole: false if it cannot be sent
    /// again that way.
    fn unseen_again(
        &mut self,
        a: &Attempt,
        end: End,
        e: &(dyn std::error::Error + 'static),
    ) -> bool {
        let Some(again) = self.again.as_mut() else {
            return false;
        };
        if !again.shared.replay {
            return false;
        }
        let Some(time_left) = again.time_left() else {
            return false;
        };
        let inst = a.instance();
        // May the same instance take it again?
        let same_ok = match end {
            End::Refused => {
                if again.refusals >= MAX_REFUSED_REPLAYS {
                    return false;
                }
                true
            }
            End::ClosedUnsent | End::ConnectFailed
                if again.same_instance < MAX_SAME_INSTANCE_REPLAYS
                    && (end == End::ClosedUnsent || a.guard().held.extra.is_some()) =>
            {
                true
            }
            _ => false,
        };
        if end != End::Refused && again.replay.was_read(a.id) {
            // Something of it may have gone out.
            return false;
        }
        if !same_ok {
            again.tried(inst);
        }
        let (snap, picked) = pick_now(&again.shared.picker, &again.tried, again.method);
        let to = match picked {
            Some(idx) => snap[idx].clone(),
            None if same_ok && inst.is_usable() => inst.clone(),
            None => {
                tracing::debug!(addr = %inst.target.name, reason = %e, "no other instance to send the call to");
                return false;
            }
        };
        let Some((mut req, id)) = again.replay.instead_of(a.id, time_left) else {
            tracing::debug!(reason = %e, "call cannot be sent again: its request body is gone");
            return false;
        };
        if end == End::Refused {
            again.refusals += 1;
        } else if same_ok {
            again.same_instance += 1;
        }
        if again.plan == Plan::Hedge {
            again.tried(&to);
        }
        let avoid = if end == End::Refused && Arc::ptr_eq(&to, inst) {
            a.guard().held.conn
        } else {
            UNCOUNTED
        };
        tracing::debug!(addr = %to.target.name, from = %inst.target.name, reason = %e, "call sent again: its attempt was not processed");
        let obs = self
            .obs
            .attempt(&again.shared.totals, &to, Kind::Transparent);
        obs.count_sent(&mut req);
        let method = again.method;
        self.attempts
            .push(Attempt::start(&to, method, req, id, true, avoid, obs));
        true
    }

    /// The plan's next attempt: a retry after its backoff, or a hedge.
    fn next_attempt(&mut self, cx: &mut Context<'_>) -> Made {
        let again = self.again.as_mut().expect("a plan");
        match again.plan {
            Plan::Hedge => {}
            Plan::Retry => return self.retry(),
            Plan::Replay => return Made::Waits,
        }
        let next = again.next.as_mut().expect("a hedged call's state");
        let policy = next.hedging.clone().expect("a hedged call's policy");
        next.hedge_now = false;
        next.hedge_waits = false;
        if next.stopped || next.made >= policy.max_attempts {
            next.armed = false;
            return Made::Waits;
        }
        let Some(time_left) = again.time_left() else {
            return Made::Waits;
        };
        let busy = !self.attempts.is_empty();
        if !could_take(&again.shared.picker, &again.tried) {
            // Every usable instance has been tried: one may come back (readmitted, added)
            // while the attempts in flight go on.
            if busy {
                again.arm(policy.delay.max(RECHECK));
            }
            return Made::Waits;
        }
        let (mut req, id) = match again.replay.copy(time_left, cx) {
            Copied::Ready(req, id) => (req, id),
            Copied::Later if busy => {
                // The first attempt has not sent the whole request yet: the hedge waits for it.
                again.next().hedge_waits = true;
                return Made::Waits;
            }
            Copied::Later | Copied::Unread if !busy => match again.replay.request(time_left) {
                // No attempt in flight has the request: this one takes it.
                Some(r) => r,
                None => {
                    again.stop();
                    return Made::Waits;
                }
            },
            Copied::Unread => {
                again.next().hedge_waits = true;
                return Made::Waits;
            }
            Copied::Never | Copied::Later => {
                tracing::debug!("request not kept (larger than max_replay_body): not hedged");
                again.stop();
                return Made::Waits;
            }
        };
        if let Some(budget) = &again.shared.budget {
            if !budget.withdraw() {
                tracing::debug!("retry budget spent: no further hedge");
                crate::observe::budget_exhausted(&again.shared.totals);
                again.stop();
                return Made::Waits;
            }
        }
        let (snap, picked) = pick_now(&again.shared.picker, &again.tried, again.method);
        let Some(idx) = picked else {
            // The set changed since the look above.
            again.arm(policy.delay.max(RECHECK));
            return Made::Waits;
        };
        let inst = snap[idx].clone();
        again.tried(&inst);
        again.arm(policy.delay);
        let made = {
            let next = again.next();
            next.made += 1;
            next.made
        };
        tracing::debug!(addr = %inst.target.name, attempt = made, "hedged attempt sent");
        let method = again.method;
        let obs = self.obs.attempt(&again.shared.totals, &inst, Kind::Hedge);
        obs.count_sent(&mut req);
        let watch = again.shared.replay;
        self.attempts.push(Attempt::start(
            &inst, method, req, id, watch, UNCOUNTED, obs,
        ));
        Made::Sent
    }

    /// The retry policy's next attempt, its backoff over.
    fn retry(&mut self) -> Made {
        let again = self.again.as_mut().expect("a plan");
        let sent = again.time_left().and_then(|time_left| {
            let (snap, picked) = pick_now(&again.shared.picker, &again.tried, again.method);
            let inst = snap[picked?].clone();
            let (req, id) = again.replay.request(time_left)?;
            Some((inst, req, id))
        });
        let Some((inst, mut req, id)) = sent else {
            // The set changed while the call waited: the caller gets the last answer as it was.
            return Made::Over(self.last_word());
        };
        tracing::debug!(addr = %inst.target.name, attempt = again.next().made, "call retried");
        let method = again.method;
        let watch = again.shared.replay;
        let obs = self.obs.attempt(&again.shared.totals, &inst, Kind::Retry);
        obs.count_sent(&mut req);
        self.attempts.push(Attempt::start(
            &inst, method, req, id, watch, UNCOUNTED, obs,
        ));
        Made::Sent
    }

    /// The attempts are over and no other will be made: the last answer, as it was.
    fn last_word(&mut self) -> CallResult {
        let last = self
            .again
            .as_mut()
            .and_then(|a| a.next.as_mut())
            .and_then(|n| n.last.take());
        self.phase = Phase::Over(None);
        let result = last.unwrap_or_else(|| {
            Err(no_usable_instance("tonic-balancer: no instance left to send the call to").into())
        });
        self.obs.ended(&result);
        result
    }

    /// The call's answer is attempt `i`'s response: every other attempt is cancelled, no
    /// further one is made, and the response body carries the attempt's count until the call
    /// is over.
    #[inline]
    fn deliver(&mut self, i: usize, resp: http::Response<Body>) -> CallResult {
        let (guard, obs) = self.attempts.get_mut(i).take_answer();
        if let Some(again) = self.again.as_mut() {
            again.replay.commit();
            again.stop();
            if self.attempts.len() > 1 {
                for (k, other) in self.attempts.iter().enumerate() {
                    if k != i {
                        other.note_sent(&again.replay);
                    }
                }
            }
        }
        // The delivered attempt (what is left of it) and the others, cancelled.
        self.attempts.clear();
        self.obs.deliver(obs);
        let deadline = self.deadline.take();
        self.phase = Phase::Over(None);
        let obs = std::mem::take(&mut self.obs);
        Ok(resp.map(|body| Body::new(GuardedBody::new(body, guard, deadline, obs))))
    }

    /// The call ends with this error: every attempt left is cancelled.
    fn end_with(&mut self, error: BoxError) -> CallResult {
        if let Some(again) = self.again.as_mut() {
            again.stop();
            for other in self.attempts.iter() {
                other.note_sent(&again.replay);
            }
        }
        self.attempts.clear();
        self.phase = Phase::Over(None);
        self.obs.finish(crate::observe::code_of(&*error));
        Err(error)
    }

    /// The call's deadline passed before its answer: each attempt is over, with what that
    /// says of its instance.
    fn deadline_passed(&mut self) -> CallResult {
        let replay = self.again.as_deref().map(|a| &a.replay);
        while !self.attempts.is_empty() {
            let mut a = self.attempts.remove(0);
            if let Some(replay) = replay {
                a.note_sent(replay);
            }
            let outcome = a.guard().deadline_outcome();
            a.guard_mut().finish(outcome);
            a.obs.ended(Code::DeadlineExceeded);
        }
        self.end_with(deadline_exceeded().into())
    }
}

/// What the plan's next attempt came to.
enum Made {
    /// An attempt was sent.
    Sent,
    /// None now: the call waits (for its timer, the attempts in flight, or the request).
    Waits,
    /// The call is over with this.
    Over(CallResult),
}

/// Routes one call: picks its instance and makes its future.
fn route(
    shared: &Arc<Shared>,
    req: http::Request<Body>,
    deadline: Option<Pin<Box<Sleep>>>,
    mut obs: CallObs,
) -> ResponseFuture {
    let method = Method::of(req.uri().path());
    let (snap, picked) = pick_now(&shared.picker, &[], method);
    // Discovery's first answer may have been published between that pick and the read of
    // `discovered` below: look again at the set then (the failure path only).
    let (snap, picked) = match picked {
        None if snap.is_empty() && *shared.set().discovered.borrow() => {
            pick_now(&shared.picker, &[], method)
        }
        _ => (snap, picked),
    };
    let Some(idx) = picked else {
        if snap.is_empty() && !*shared.set().discovered.borrow() {
            // Discovery has not answered yet: wait for its first answer (bounded by the
            // lookup's timeout, and by the call's deadline).
            let mut rx = shared.set().discovered.subscribe();
            let wait = Box::pin(async move {
                let _ = rx.wait_for(|done| *done).await;
            });
            return ResponseFuture {
                attempts: Attempts::none(),
                again: None,
                deadline,
                obs,
                phase: Phase::Discovering(Box::new(Discovering {
                    wait,
                    req: Some(req),
                    shared: shared.clone(),
                })),
            };
        }
        let msg = no_instance_message(&shared.picker, &snap);
        tracing::debug!(reason = %msg, "call refused");
        obs.refused(&shared.totals);
        return ResponseFuture::over(no_usable_instance(msg), CallObs::default());
    };
    let inst = &snap[idx];
    tracing::trace!(addr = %inst.target.name, in_flight = inst.in_flight.load(Ordering::Relaxed), "call routed");
    let hedging = shared
        .hedging
        .as_ref()
        .and_then(|h| h.policy(req.uri().path()))
        .cloned();
    let plan = match hedging {
        Some(_) => Some(Plan::Hedge),
        None if shared.retry.is_some() => Some(Plan::Retry),
        None if shared.replay => Some(Plan::Replay),
        None => None,
    };
    let Some(plan) = plan else {
        // Nothing will send it again: the request goes as it is.
        let mut req = req;
        let a = obs.attempt(&shared.totals, inst, Kind::First);
        a.count_sent(&mut req);
        return ResponseFuture {
            attempts: Attempts::one(Attempt::start(inst, method, req, 0, false, UNCOUNTED, a)),
            again: None,
            deadline,
            obs,
            phase: Phase::Running,
        };
    };
    if let Some(b) = &shared.budget {
        b.deposit();
    }
    // The request is recorded (up to `max_replay_body`) whatever the plan: a stream the server
    // refuses has had its body read already, and is sent again from the copy.
    let (mut req, replay) = Replay::wrap(req, true, shared.max_replay_body);
    let a = obs.attempt(&shared.totals, inst, Kind::First);
    a.count_sent(&mut req);
    let attempts = Attempts::one(Attempt::start(
        inst,
        method,
        req,
        0,
        shared.replay,
        UNCOUNTED,
        a,
    ));
    let mut again = Box::new(Again {
        shared: shared.clone(),
        replay,
        method,
        deadline_at: deadline.as_ref().map(|d| d.deadline()),
        plan,
        same_instance: 0,
        refusals: 0,
        tried: Vec::new(),
        next: None,
    });
    if let Some(policy) = hedging {
        let delay = policy.delay;
        again.next = Some(Next::new(Some(policy)));
        again.tried(inst);
        again.arm(delay);
    }
    ResponseFuture {
        attempts,
        again: Some(again),
        deadline,
        obs,
        phase: Phase::Running,
    }
}

impl Future for ResponseFuture {
    type Output = CallResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let _in_span = this.obs.span().map(|s| s.clone().entered());
        match &mut this.phase {
            Phase::Running => {}
            Phase::Over(status) => {
                let status = status
                    .take()
                    .unwrap_or_else(|| tonic::Status::unknown("call polled after it ended"));
                return Poll::Ready(Err(status.into()));
            }
            Phase::Discovering(d) => {
                let Discovering { wait, req, shared } = &mut **d;
                if let Some(deadline) = this.deadline.as_mut() {
                    if deadline.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(this.end_with(deadline_exceeded().into()));
                    }
                }
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let (shared, req) = (shared.clone(), req.take().expect("routed once"));
                let obs = std::mem::take(&mut this.obs);
                *this = route(&shared, req, this.deadline.take(), obs);
                return Pin::new(this).poll(cx);
            }
        }
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(this.deadline_passed());
            }
        }
        this.drive(cx)
    }
}
