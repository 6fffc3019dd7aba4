//! The future of one hedged call: its attempts in flight, the timer of the next one, and the
//! rules that end it (see the [module docs](super)).
//!
//! Attempts share the call's [`Replay`]: the first attempt reads the caller's body and keeps a
//! copy of it; every further attempt sends that copy ([`Replay::copy`]), so a hedge goes out
//! only once the first attempt has sent the request whole. Each attempt holds its own
//! [`CallGuard`]; an attempt that is over or cancelled drops it, so its instance's count is
//! released at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::Code;
use tower::BoxError;

use super::HedgingPolicy;
use crate::channel::{
    as_unavailable, classify_error, head_status, not_processed, pick_now, CallResult, ErrorKind,
};
use crate::error::{deadline_exceeded, is_transport, no_usable_instance, refused_by_server};
use crate::guard::CallGuard;
use crate::health::{self, Outcome};
use crate::instance::Instance;
use crate::pool::Pool;
use crate::pushback::{self, Pushback};
use crate::retry::Replay;
use crate::stats::ServedBy;
use crate::tiebreak::Method;

/// The least wait before looking again for what a hedge needs (the request sent whole by the
/// first attempt, an instance not tried yet), so that a zero delay does not spin.
const RECHECK: Duration = Duration::from_millis(1);

/// What a hedged call ends with: the response, with the guard of the attempt that won (to go
/// into its body), or an error.
pub(crate) type Answer = Result<(http::Response<Body>, Option<CallGuard>), BoxError>;

/// A hedged call.
pub(crate) struct Hedge {
    pool: Arc<Pool>,
    policy: Arc<HedgingPolicy>,
    replay: Replay,
    /// The attempts in flight (at most `max_attempts`).
    attempts: Vec<Attempt>,
    /// Every instance an attempt of the call went to: no further attempt goes there.
    tried: Vec<Arc<Instance>>,
    /// Attempts made under the policy (transparent replays of unsent attempts do not count).
    made: u32,
    /// When the next hedge goes out, if `armed`.
    timer: Pin<Box<Sleep>>,
    armed: bool,
    /// No further hedge: a server's pushback, the budget, or a request that was not kept.
    stopped: bool,
    /// The latest answer of an attempt that ended with a non-fatal status: the caller's if no
    /// attempt wins.
    last: Option<CallResult>,
    deadline_at: Option<Instant>,
    /// The call's method (its key in the tie-break's tables).
    method: Method,
}

/// One attempt: its instance's count, and its request on its way.
struct Attempt {
    guard: CallGuard,
    channel: Channel,
    step: Step,
}

// As in `CallState`: the request waits in the attempt until it is sent; boxing it would cost
// an allocation per attempt for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// Waiting for room in the instance's connection.
    Waiting(Option<http::Request<Body>>),
    /// Sent; waiting for the response head.
    Sent(tonic::transport::channel::ResponseFuture),
}

/// What polling one attempt came to.
enum Polled {
    Pending,
    /// The attempt is over (removed or replaced): poll on.
    Over,
    /// The call's answer.
    Done(Answer),
}

impl Hedge {
    /// A hedged call: its first attempt goes to `inst`, the pick's choice.
    pub(crate) fn start(
        pool: &Arc<Pool>,
        policy: Arc<HedgingPolicy>,
        req: http::Request<Body>,
        inst: &Arc<Instance>,
        method: Method,
        deadline_at: Option<Instant>,
    ) -> Box<Hedge> {
        if let Some(b) = &pool.budget {
            b.deposit();
        }
        let (req, replay) = Replay::wrap(req, true, pool.max_replay_body);
        let timer = {
            // The timer is made on the channel's runtime: the caller may be on any executor.
            let _rt = pool.policy.runtime.enter();
            Box::pin(tokio::time::sleep(policy.delay))
        };
        let mut h = Box::new(Hedge {
            pool: pool.clone(),
            replay,
            attempts: Vec::with_capacity(policy.max_attempts as usize),
            tried: Vec::with_capacity(policy.max_attempts as usize),
            made: 1,
            timer,
            armed: true,
            stopped: false,
            last: None,
            deadline_at,
            policy,
            method,
        });
        h.launch(inst, req);
        h
    }

    /// Polls every attempt, and sends the next one when its time has come.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Answer> {
        loop {
            let mut again = false;
            let mut i = 0;
            while i < self.attempts.len() {
                match self.poll_attempt(i, cx) {
                    Polled::Pending => i += 1,
                    // Attempt `i` is another one now (or none): poll it too.
                    Polled::Over => again = true,
                    Polled::Done(answer) => {
                        self.commit();
                        return Poll::Ready(answer);
                    }
                }
            }
            if self.armed && self.timer.as_mut().poll(cx).is_ready() {
                self.armed = false;
                self.hedge();
                again = true;
            }
            if !again {
                break;
            }
        }
        if self.attempts.is_empty() && !self.armed {
            // Every attempt ended with a non-fatal status and no further one can be made.
            return Poll::Ready(match self.last.take() {
                Some(Ok(resp)) => Ok((resp, None)),
                Some(Err(e)) => Err(e),
                None => {
                    Err(no_usable_instance("tonic-balancer: no instance left to hedge to").into())
                }
            });
        }
        Poll::Pending
    }

    /// The call's deadline passed: every attempt is over, with what that says of its instance.
    pub(crate) fn deadline_passed(&mut self) {
        for a in &mut self.attempts {
            let outcome = a.guard.deadline_outcome();
            a.guard.finish(outcome);
        }
        self.attempts.clear();
        self.armed = false;
    }

    /// The call has its answer: every other attempt is cancelled (dropping its response future
    /// resets its stream; dropping its guard releases its count), and no hedge follows.
    fn commit(&mut self) {
        self.replay.commit();
        self.attempts.clear();
        self.armed = false;
    }

    /// Sends `req` to `inst`: an attempt in flight.
    fn launch(&mut self, inst: &Arc<Instance>, req: http::Request<Body>) {
        self.tried.push(inst.clone());
        self.attempts.push(Attempt {
            guard: CallGuard::new(inst.clone(), self.method),
            channel: inst.channel.clone(),
            step: Step::Waiting(Some(req)),
        });
    }

    /// The next hedge goes out in `after`, if one may still go out.
    fn arm(&mut self, after: Duration) {
        if self.stopped || self.made >= self.policy.max_attempts {
            self.armed = false;
            return;
        }
        self.timer.as_mut().reset(Instant::now() + after);
        self.armed = true;
    }

    /// No further hedge for this call.
    fn stop(&mut self) {
        self.stopped = true;
        self.armed = false;
    }

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

    /// Sends the next hedge if everything it needs is there; otherwise looks again after a
    /// delay (while attempts are in flight), or stops hedging.
    fn hedge(&mut self) {
        if self.stopped || self.made >= self.policy.max_attempts {
            return;
        }
        let Some(time_left) = self.time_left() else {
            return;
        };
        let busy = !self.attempts.is_empty();
        let (snap, picked) = pick_now(&self.pool, &self.tried, self.method);
        let Some(idx) = picked else {
            // Every usable instance has been tried: one may come back (readmitted, added)
            // while the attempts in flight go on.
            if busy {
                self.arm(self.policy.delay.max(RECHECK));
            } else {
                self.armed = false;
            }
            return;
        };
        let req = match self.replay.copy(time_left) {
            Some(req) => req,
            // The first attempt has not sent the whole request yet: the hedge waits for it.
            None if busy && (self.replay.recording() || self.replay.unsent()) => {
                self.arm(self.policy.delay.max(RECHECK));
                return;
            }
            // The only attempt ended before reading the request: it is still whole.
            None if !busy => match self.replay.request(time_left) {
                Some(req) => req,
                None => {
                    self.stop();
                    return;
                }
            },
            None => {
                tracing::debug!("request not kept (larger than max_replay_body): not hedged");
                self.stop();
                return;
            }
        };
        if let Some(budget) = &self.pool.budget {
            if !budget.withdraw() {
                tracing::debug!("retry budget spent: no further hedge");
                self.stop();
                return;
            }
        }
        self.made += 1;
        let inst = snap[idx].clone();
        tracing::debug!(addr = %inst.target.name, attempt = self.made, "hedged attempt sent");
        self.launch(&inst, req);
        self.arm(self.policy.delay);
    }

    /// After an attempt that ended with a non-fatal status: what the server's pushback says,
    /// or else the next hedge at once.
    fn next_after(&mut self, pushback: Option<Pushback>) {
        match pushback {
            None => self.hedge(),
            Some(Pushback::After(wait)) => self.arm(wait),
            Some(Pushback::Stop) => {
                tracing::debug!("the server's pushback says not to retry: no further hedge");
                self.stop();
            }
        }
    }

    fn poll_attempt(&mut self, i: usize, cx: &mut Context<'_>) -> Polled {
        loop {
            let a = &mut self.attempts[i];
            match &mut a.step {
                Step::Waiting(req) => match tower::Service::poll_ready(&mut a.channel, cx) {
                    Poll::Pending => return Polled::Pending,
                    Poll::Ready(Err(e)) => return self.errored(i, e.into()),
                    Poll::Ready(Ok(())) => {
                        let req = req.take().expect("request sent once");
                        a.step = Step::Sent(tower::Service::call(&mut a.channel, req));
                    }
                },
                Step::Sent(fut) => {
                    return match Pin::new(fut).poll(cx) {
                        Poll::Pending => Polled::Pending,
                        Poll::Ready(Ok(resp)) => self.answered(i, resp),
                        Poll::Ready(Err(e)) => self.errored(i, e.into()),
                    }
                }
            }
        }
    }

    /// Attempt `i`'s response head arrived.
    fn answered(&mut self, i: usize, mut resp: http::Response<Body>) -> Polled {
        let mut a = self.attempts.swap_remove(i);
        a.guard.headers_received();
        let inst = a.guard.instance().clone();
        health::connected(&inst);
        resp.extensions_mut()
            .insert(ServedBy::new(inst.target.name.clone()));
        let Some((code, outcome)) = head_status(&resp) else {
            // A response that has started: the call's.
            return Polled::Done(Ok((resp, Some(a.guard))));
        };
        a.guard.finish(outcome);
        if code == Code::Ok || !self.policy.non_fatal.contains(&code) {
            return Polled::Done(Ok((resp, Some(a.guard))));
        }
        tracing::debug!(?code, addr = %inst.target.name, "hedged attempt answered a non-fatal status");
        let pushback = pushback::read(resp.headers());
        drop(a);
        self.last = Some(Ok(resp));
        self.next_after(pushback);
        Polled::Over
    }

    /// Attempt `i` failed before a response head.
    fn errored(&mut self, i: usize, e: BoxError) -> Polled {
        let kind = classify_error(&*e);
        let mut a = self.attempts.swap_remove(i);
        if let ErrorKind::Timeout = kind {
            // tonic's own timer (the call's `grpc-timeout` or the endpoint's timeout).
            let outcome = a.guard.deadline_outcome();
            a.guard.finish(outcome);
            return Polled::Done(Err(deadline_exceeded().into()));
        }
        let inst = a.guard.instance().clone();
        let connect = matches!(kind, ErrorKind::Unsent { connect: true });
        // An extra connection that could not connect, or broke, says nothing of the instance.
        let extra = (connect || is_transport(&*e)) && crate::conns::extra_failed(&a.guard, &*e);
        if connect && !extra {
            health::connect_failed(&inst, &*e);
        } else if is_transport(&*e) && !extra {
            health::disconnected(&inst, &*e);
        }
        let unsent = matches!(kind, ErrorKind::Unsent { .. }) || is_transport(&*e);
        let refused = refused_by_server(&*e);
        // The server did not process the attempt: it goes to another instance, unseen by the
        // caller and not counted (gRPC's transparent retry).
        if let Some(req) = self.resend(connect, unsent, refused) {
            let (snap, picked) = pick_now(&self.pool, &self.tried, self.method);
            if let Some(idx) = picked {
                let to = snap[idx].clone();
                tracing::debug!(from = %inst.target.name, to = %to.target.name, "hedged attempt sent again: its instance did not process it");
                // Released without an outcome: a connect failure is recorded above.
                drop(a);
                self.launch(&to, req);
                return Polled::Over;
            }
        }
        let (e, outcome) = if refused || matches!(kind, ErrorKind::Unsent { connect: false }) {
            (
                not_processed(&inst.target.name, e).into(),
                Outcome::Cancelled,
            )
        } else if extra || (is_transport(&*e) && !a.guard.first_to_see_break()) {
            (as_unavailable(e, &inst.target.name), Outcome::Cancelled)
        } else {
            (as_unavailable(e, &inst.target.name), Outcome::Failure)
        };
        a.guard.finish(outcome);
        drop(a);
        // A transport error counts as UNAVAILABLE.
        if self.policy.non_fatal.contains(&Code::Unavailable) {
            self.last = Some(Err(e));
            self.next_after(None);
            return Polled::Over;
        }
        Polled::Done(Err(e))
    }

    /// The request again for an attempt that the server did not process, if it can be had
    /// whole: the caller's body if that attempt never read it, else the copy, if that attempt
    /// cannot have sent anything (it never connected) or the server refused it unseen.
    fn resend(&self, connect: bool, unsent: bool, refused: bool) -> Option<http::Request<Body>> {
        if !self.pool.replay {
            return None;
        }
        let time_left = self.time_left()?;
        if (unsent || refused) && self.replay.unsent() {
            return self.replay.request(time_left);
        }
        if connect || refused {
            return self.replay.copy(time_left);
        }
        None
    }
}
