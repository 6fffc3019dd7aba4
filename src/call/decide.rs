//! A routed call ([`Routed`]): its attempts, polled, and what the end of each means for the
//! call (its answer delivered, the attempt sent again unseen, a retry, a hedge, the call's
//! end); the plan's next attempt is `next.rs`'s.
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Sleep;
use tonic::body::Body;
use tonic::Code;
use tower::BoxError;

use super::attempt::head_status;
use super::attempt::{Attempt, Polled};
use super::next::{self, Next};
use super::outcome::End;
use super::plan::{Attempts, RetryState};
use super::plan::{Plan, MAX_REFUSED_WAITED};
use super::replay::Replay;
use super::CallResult;
use crate::call::attempt::GuardedBody;
use crate::error::{deadline_exceeded, no_usable_instance};
use crate::instance::conns::UNCOUNTED;
use crate::instance::events::AttemptKind;
use crate::instance::Instance;
use crate::observe::CallObs;
use crate::pushback::Pushback;
use crate::stats::ServedBy;

/// A call routed to its first instance: its attempts, what it needs to make another, its
/// deadline and its observation. The [`ResponseFuture`](super::ResponseFuture) drives it.
pub(super) struct Routed {
    attempts: Attempts,
    /// What the call needs to make another attempt; `None` for a call that makes none
    /// (transparent retry off, no policy).
    again: Option<Box<RetryState>>,
    deadline: Option<Pin<Box<Sleep>>>,
    /// The call's span and metrics (moved into the response body with the answer).
    obs: CallObs,
}

impl Routed {
    pub(super) fn new(
        attempts: Attempts,
        again: Option<Box<RetryState>>,
        deadline: Option<Pin<Box<Sleep>>>,
        obs: CallObs,
    ) -> Routed {
        Routed {
            attempts,
            again,
            deadline,
            obs,
        }
    }

    /// A call with no attempt (yet): over before routing, or waiting to be routed.
    pub(super) fn unrouted(deadline: Option<Pin<Box<Sleep>>>, obs: CallObs) -> Routed {
        Routed::new(Attempts::none(), None, deadline, obs)
    }

    /// The call's span, if it is traced.
    pub(super) fn span(&self) -> Option<&tracing::Span> {
        self.obs.span()
    }

    /// Its attempts in flight.
    pub(super) fn attempts(&self) -> usize {
        self.attempts.len()
    }

    /// Whether the call's deadline has come (registering for it if not).
    pub(super) fn deadline_came(&mut self, cx: &mut Context<'_>) -> bool {
        self.deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
    }

    /// What a call waiting to be routed keeps for its routing: its deadline and observation.
    pub(super) fn take_for_routing(&mut self) -> (Option<Pin<Box<Sleep>>>, CallObs) {
        (self.deadline.take(), std::mem::take(&mut self.obs))
    }

    fn replay(&self) -> Option<&Replay> {
        self.again.as_deref().map(|a| &a.replay)
    }

    /// Polls the attempts and the plan's timer until the call has its answer or waits.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) -> Poll<CallResult> {
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
                        Next::Sent => moved = true,
                        Next::Waits => {}
                        Next::Ends => return Poll::Ready(self.last_word()),
                    }
                }
            }
            // Wait-for-ready: an instance may be usable now.
            let parked = self.again.as_mut().and_then(|a| a.parked.as_mut());
            if parked.is_some_and(|p| p.ready(cx)) {
                match self.resume(cx) {
                    Next::Sent => moved = true,
                    Next::Waits => {}
                    Next::Ends => return Poll::Ready(self.last_word()),
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
    #[inline(always)]
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

    /// The call's deadline, if it has one.
    fn deadline_at(&self) -> Option<tokio::time::Instant> {
        self.deadline.as_deref().map(tokio::time::Sleep::deadline)
    }

    /// Attempt `i`'s response head arrived.
    #[inline(always)]
    fn answered(&mut self, i: usize, mut resp: http::Response<Body>) -> Option<CallResult> {
        if self
            .deadline
            .as_deref()
            .is_some_and(crate::deadline::passed)
            && timed_out(&resp)
        {
            return Some(self.timed_out(i));
        }
        let a = self.attempts.get_mut(i);
        a.guard_mut().headers_received();
        let inst = a.guard().instance();
        inst.connected();
        resp.extensions_mut()
            .insert(ServedBy::new(inst.target.name.clone()));
        let mut error = false;
        if let Some((code, outcome)) = head_status(&resp) {
            // A trailers-only response carries its load report in its head.
            a.guard().take_report(resp.headers_mut());
            a.guard_mut().finish(outcome);
            if code != Code::Ok && self.answer_goes_on(i, code, &resp) {
                self.again.as_mut().expect("goes on").next().last = Some(Ok(resp));
                return None;
            }
            self.obs.head(code);
            error = code != Code::Ok;
        }
        // gRPC's throttle counts an answer that is not an error status as a success.
        if !error {
            if let Some(budget) = self.again.as_ref().and_then(|a| a.shared.budget.as_ref()) {
                budget.succeeded();
            }
        }
        Some(self.deliver(i, resp))
    }

    /// Attempt `i` was answered after the deadline by the server's own timer (CANCELLED
    /// "Timeout expired", DEADLINE_EXCEEDED): the call ends with DEADLINE_EXCEEDED, as what it
    /// is. The service never answered the call: for the instance, a deadline it let pass (no
    /// latency sample). (Any other answer already there is the call's, however late the caller
    /// polls.)
    #[cold]
    fn timed_out(&mut self, i: usize) -> CallResult {
        let deadline_at = self.deadline_at();
        let a = self.attempts.get_mut(i);
        let outcome = a.guard().deadline_outcome(deadline_at);
        a.guard_mut().finish(outcome);
        a.obs.ended(Code::DeadlineExceeded);
        self.end_with(deadline_exceeded().into())
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
        tracing::debug!(rpc.grpc.status_code = code as i32, server.address = %inst.target.name, "attempt answered; the call goes on");
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
        if matches!(end, End::Reset(Code::Cancelled | Code::DeadlineExceeded))
            && self
                .deadline
                .as_deref()
                .is_some_and(crate::deadline::passed)
        {
            // The server's own timer reset the stream at the call's deadline (grpc-go resets a
            // call whose deadline it enforces with RST_STREAM CANCEL): a deadline the instance
            // let pass, as `timed_out` says of such an answer in a head.
            let outcome = a.guard().deadline_outcome(self.deadline_at());
            a.guard_mut().finish(outcome);
            a.obs.ended(Code::DeadlineExceeded);
            return Some(self.end_with(deadline_exceeded().into()));
        }
        let outcome = end.settle(a.guard(), &*e, self.deadline_at());
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
            tracing::debug!(error = %status, server.address = %inst.target.name, "attempt failed; the call goes on");
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
                let non_fatal = again
                    .next
                    .as_ref()
                    .and_then(|n| n.hedging.as_ref())
                    .expect("a hedged call's policy")
                    .non_fatal
                    .contains(&code);
                let stop = pushback == Some(Pushback::Stop);
                if stop || non_fatal {
                    // gRPC's throttle counts a non-fatal status, and an answer whose pushback
                    // says not to retry, whatever its status (gRFC A6).
                    if let Some(budget) = again.budget() {
                        budget.failed();
                    }
                }
                if !non_fatal {
                    return false;
                }
                let runtime = &again.shared.ctx.runtime;
                let next = again.next.as_mut().expect("a hedged call's state");
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
        if end == End::Refused
            && again.refusals >= 1
            && self.attempts.is_empty()
            && self.deadline.is_some()
            && again.replay.replayable()
        {
            if again.refusals >= MAX_REFUSED_WAITED {
                return false;
            }
            tracing::debug!(server.address = %inst.target.name, reason = %e, "stream refused again: the call waits for room");
            again.park_for_room(inst, a.previous);
            return true;
        }
        let Some(same_ok) = again.same_instance_may_take(a, end) else {
            return false;
        };
        if end != End::Refused && again.replay.was_read(a.id) {
            // Something of it may have gone out.
            return false;
        }
        if !same_ok {
            again.tried(inst);
        }
        let to = match again.where_again(a, same_ok, e) {
            Ok(to) => to,
            Err(parked) => return parked,
        };
        let Some((mut req, id)) = again.replay.instead_of(a.id, time_left, a.previous) else {
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
        tracing::debug!(server.address = %to.target.name, previous.server.address = %inst.target.name, reason = %e, "call sent again: its attempt was not processed");
        let obs = self
            .obs
            .attempt(&again.shared.totals, &to, AttemptKind::Transparent);
        obs.count_sent(&mut req);
        let method = again.method;
        let mut replayed = Attempt::start(&to, method, req, id, true, avoid, obs);
        replayed.previous = a.previous;
        self.attempts.push(replayed);
        true
    }

    /// The plan's next attempt, its timer fired (or a hedge asked for at once): it joins the
    /// attempts in flight, or the call waits, or it ends ([`Next::Ends`]: with
    /// [`last_word`](Self::last_word)).
    fn next_attempt(&mut self, cx: &mut Context<'_>) -> Next {
        let again = self.again.as_mut().expect("a plan");
        next::attempt(again, &mut self.attempts, &mut self.obs, cx)
    }

    /// Wait-for-ready, or room on an instance that refused the call's stream: an instance may
    /// take the parked attempt now.
    fn resume(&mut self, cx: &mut Context<'_>) -> Next {
        let again = self.again.as_mut().expect("a plan");
        next::resume(again, &mut self.attempts, &mut self.obs, cx)
    }

    /// The attempts are over and no other will be made: the last answer, as it was.
    fn last_word(&mut self) -> CallResult {
        let last = self
            .again
            .as_mut()
            .and_then(|a| a.next.as_mut())
            .and_then(|n| n.last.take());
        let result = last.unwrap_or_else(|| {
            Err(no_usable_instance("tonic-balancer: no instance left to send the call to").into())
        });
        self.obs.ended(&result);
        result
    }

    /// The call's answer is attempt `i`'s response: every other attempt is cancelled, no
    /// further one is made, and the response body carries the attempt's count until the call
    /// is over.
    #[inline(always)]
    fn deliver(&mut self, i: usize, resp: http::Response<Body>) -> CallResult {
        let (guard, obs) = self.attempts.get_mut(i).take_answer();
        let mut max_response = None;
        if let Some(again) = self.again.as_mut() {
            max_response = again.max_response;
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
        let obs = std::mem::take(&mut self.obs);
        Ok(resp.map(|body| {
            let body = GuardedBody::new(body, guard, deadline, obs);
            match max_response {
                None => Body::new(body),
                Some(max) => Body::new(super::limits::LimitedResponse::new(body, max)),
            }
        }))
    }

    /// The call ends with this error: every attempt left is cancelled.
    pub(super) fn end_with(&mut self, error: BoxError) -> CallResult {
        if let Some(again) = self.again.as_mut() {
            again.stop();
            for other in self.attempts.iter() {
                other.note_sent(&again.replay);
            }
        }
        self.attempts.clear();
        self.obs.finish(crate::observe::code_of(&*error));
        Err(error)
    }

    /// The call's deadline has come: an answer already there wins over it (the response head
    /// an attempt has received, a caller who polls late); else the call ends with
    /// DEADLINE_EXCEEDED. Nothing new is sent: no attempt goes after the deadline.
    pub(super) fn at_deadline(&mut self, cx: &mut Context<'_>) -> CallResult {
        let mut i = 0;
        while i < self.attempts.len() {
            let replay = self.again.as_deref().map(|a| &a.replay);
            let a = self.attempts.get_mut(i);
            if !a.is_sent() {
                i += 1;
                continue;
            }
            match a.poll(cx, replay) {
                Poll::Pending => i += 1,
                Poll::Ready(polled) => {
                    if let Some(result) = self.ended(i, polled) {
                        return result;
                    }
                    // Attempt `i` is another one now (or none).
                }
            }
        }
        self.deadline_passed()
    }

    /// The call's deadline passed before its answer: each attempt is over, with what that
    /// says of its instance.
    fn deadline_passed(&mut self) -> CallResult {
        let deadline_at = self.deadline_at();
        let replay = self.again.as_deref().map(|a| &a.replay);
        while !self.attempts.is_empty() {
            let mut a = self.attempts.remove(0);
            if let Some(replay) = replay {
                a.note_sent(replay);
            }
            let outcome = a.guard().deadline_outcome(deadline_at);
            a.guard_mut().finish(outcome);
            a.obs.ended(Code::DeadlineExceeded);
        }
        self.end_with(deadline_exceeded().into())
    }
}

/// Whether a response head is the answer of the server's own timer to the call's deadline
/// (its `grpc-timeout`): a trailers-only DEADLINE_EXCEEDED, or CANCELLED as tonic's servers
/// answer ("Timeout expired").
fn timed_out(resp: &http::Response<Body>) -> bool {
    matches!(
        head_status(resp),
        Some((Code::DeadlineExceeded | Code::Cancelled, _))
    )
}
