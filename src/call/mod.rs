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
//! is asked of the set without moving any pick's state
//! ([`could_take`](crate::pick::dispatch::could_take)).
//!
//! Here: the call's future, its routing and the loop that polls its attempts; in [`plan`],
//! what a call needs for further attempts; in [`decide`], what each end of an attempt means
//! for the call, and the next attempt.

pub(crate) mod admission;
mod attempt;
mod decide;
mod limits;
mod next;
mod outcome;
mod plan;
mod ready;
mod replay;
pub(crate) mod shared;
pub(crate) mod split;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Sleep;
use tonic::body::Body;

use self::attempt::Attempt;
use self::decide::Routed;
use self::plan::{Attempts, Plan, RetryState};
use self::replay::Replay;
use self::shared::Shared;
use crate::error::{deadline_exceeded, no_usable_instance};
use crate::instance::conns::UNCOUNTED;
use crate::instance::events::AttemptKind;
use crate::load::tie::Method;
use crate::observe::CallObs;
use crate::pick::dispatch::{no_instance_message, pick_now};

pub use self::ready::WaitForReady;

pub(crate) use crate::observe::CallResult;

/// The future of one call through a [`BalancedChannel`](crate::BalancedChannel).
pub struct ResponseFuture {
    call: Routed,
    phase: Phase,
}

enum Phase {
    /// Attempts in flight, or a wait for the next one.
    Running,
    /// Waiting, before it is routed, for the first answer of discovery, or (wait-for-ready)
    /// for a usable instance (rare: boxed, so that the future of every other call does not
    /// carry room for a request).
    Waiting(Box<WaitingCall>),
    /// Over: refused before routing (the status to give), or delivered.
    Over(Option<tonic::Status>),
}

/// A call waiting before it is routed: for the first answer of discovery, or for a usable
/// instance.
struct WaitingCall {
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
    req: Option<http::Request<Body>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempts", &self.call.attempts())
            .finish_non_exhaustive()
    }
}

impl ResponseFuture {
    /// A call through the channel whose calls share `shared`.
    #[inline]
    pub(crate) fn new(shared: &Arc<Shared>, mut req: http::Request<Body>) -> ResponseFuture {
        let mut timeout = crate::deadline::from_headers(req.headers());
        // A method's default deadline (a service config's `timeout`): the earlier of it and
        // the caller's, sent on to the server as gRPC does.
        if let Some(t) = shared.methods.timeout(req.uri().path()) {
            if timeout.is_none_or(|d| t < d) {
                timeout = Some(t);
                req.headers_mut().insert(
                    crate::headers::GRPC_TIMEOUT.clone(),
                    crate::deadline::encode(t),
                );
            }
        }
        if timeout.is_some_and(|d| d.is_zero()) {
            // A deadline that has passed already (a service config's `"0s"`): nothing is sent,
            // as in grpc-go.
            let mut obs = CallObs::new(&shared.totals, &req);
            obs.finish(tonic::Code::DeadlineExceeded);
            return ResponseFuture::over(deadline_exceeded(), obs);
        }
        let deadline = timeout.map(|d| {
            // The timer is made on the channel's runtime: the caller may be on any executor.
            let _rt = shared.ctx.runtime.enter();
            Box::pin(tokio::time::sleep_until(crate::time::after(d)))
        });
        let obs = CallObs::new(&shared.totals, &req);
        route(shared, req, deadline, obs)
    }

    fn over(status: tonic::Status, obs: CallObs) -> ResponseFuture {
        ResponseFuture {
            call: Routed::unrouted(None, obs),
            phase: Phase::Over(Some(status)),
        }
    }

    /// The call's result, once it has one: the future is over.
    fn ended(&mut self, result: CallResult) -> Poll<CallResult> {
        self.phase = Phase::Over(None);
        Poll::Ready(result)
    }
}

/// Routes one call: picks its instance and makes its future.
fn route(
    shared: &Arc<Shared>,
    req: http::Request<Body>,
    deadline: Option<Pin<Box<Sleep>>>,
    obs: CallObs,
) -> ResponseFuture {
    // An xDS route table: the call goes through its cluster's channel, whole (its retries
    // and hedges stay in the cluster), or nowhere if no route takes it.
    if let Some(split) = &shared.split {
        match split.draw(req.uri().path()) {
            split::Draw::Own => {}
            split::Draw::To(cluster) => return route(&cluster, req, deadline, obs),
            split::Draw::Refused(why) => {
                let mut obs = obs;
                obs.refused(&shared.totals);
                tracing::debug!(reason = %why, "call refused");
                return ResponseFuture::over(
                    crate::error::no_usable_instance(format!("tonic-balancer: {why}")),
                    CallObs::default(),
                );
            }
        }
    }
    if let Some(admission) = &shared.admission {
        if let Err(status) = admit(shared, admission) {
            let mut obs = obs;
            obs.refused(&shared.totals);
            return ResponseFuture::over(status, CallObs::default());
        }
    }
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
    route_to(shared, req, deadline, obs, method, (snap, picked))
}

/// Whether the discovery lets a new call in (see `admission`).
fn admit(shared: &Shared, admission: &admission::Admission) -> Result<(), tonic::Status> {
    let in_flight = shared
        .ctx
        .attempts
        .as_ref()
        .map_or(0, |n| n.load(std::sync::atomic::Ordering::Relaxed));
    admission.admit(in_flight).inspect_err(|status| {
        tracing::debug!(reason = %status.message(), "call dropped");
    })
}

/// Routes one call to `method` to the instance the pick chose (`picked` of `snap`), if any.
#[inline(always)]
fn route_to(
    shared: &Arc<Shared>,
    req: http::Request<Body>,
    deadline: Option<Pin<Box<Sleep>>>,
    mut obs: CallObs,
    method: Method,
    (snap, picked): (arc_swap::Guard<crate::set::Snapshot>, Option<usize>),
) -> ResponseFuture {
    let Some(idx) = picked else {
        return unrouted(shared, req, deadline, obs, &snap);
    };
    let inst = &snap[idx];
    tracing::trace!(server.address = %inst.target.name, in_flight = inst.in_flight(), "call routed");
    // The method's policy, looked up once per call (at most one of the two).
    let policy = shared.methods.get(req.uri().path());
    // A call with a message size limit goes through the replay slot, which keeps a failed
    // limit as the caller's error.
    let Some(plan) = Plan::of(policy, shared.replay || policy.settings.limits()) else {
        // Nothing will send it again: the request goes as it is.
        let mut req = req;
        let a = obs.attempt(&shared.totals, inst, AttemptKind::First);
        a.count_sent(&mut req);
        let attempt = Attempt::start(inst, method, req, 0, false, UNCOUNTED, a);
        return ResponseFuture {
            call: Routed::new(Attempts::one(attempt), None, deadline, obs),
            phase: Phase::Running,
        };
    };
    if let Some(b) = &shared.budget {
        b.deposit();
    }
    // The request is recorded (up to `max_replay_body`) whatever the plan: a stream the server
    // refuses has had its body read already, and is sent again from the copy.
    let req = match policy.settings.max_request {
        None => req,
        Some(max) => req.map(|body| Body::new(limits::LimitedRequest::new(body, max))),
    };
    let (mut req, replay) = Replay::wrap(req, true, shared.max_replay_body);
    let a = obs.attempt(&shared.totals, inst, AttemptKind::First);
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
    let deadline_at = deadline.as_ref().map(|d| d.deadline());
    let mut again = RetryState::new(shared, replay, method, deadline_at, plan, policy);
    if let Some(hedging) = &policy.hedging {
        again.start_hedging(hedging, inst);
    }
    ResponseFuture {
        call: Routed::new(attempts, Some(again), deadline, obs),
        phase: Phase::Running,
    }
}

/// A call that found no instance to take it: it waits for discovery's first answer if there
/// has been none, or, wait-for-ready, for a usable instance; else it is refused.
#[cold]
fn unrouted(
    shared: &Arc<Shared>,
    req: http::Request<Body>,
    deadline: Option<Pin<Box<Sleep>>>,
    mut obs: CallObs,
    snap: &crate::set::Snapshot,
) -> ResponseFuture {
    if snap.is_empty() && !*shared.set().discovered.borrow() {
        // Discovery has not answered yet: wait for its first answer (bounded by the
        // lookup's timeout, and by the call's deadline).
        let mut rx = shared.set().discovered.subscribe();
        let wait = Box::pin(async move {
            let _ = rx.wait_for(|done| *done).await;
        });
        return held(shared, req, deadline, obs, wait);
    }
    let path = req.uri().path();
    let method_says = shared.methods.get(path).settings.wait_for_ready;
    if ready::WaitForReady::of(req.extensions(), method_says) {
        // Wait for a usable instance: the notification first, then one more look at the set,
        // so that an instance back in the meantime is not missed.
        let wait = ready::notified(&shared.usable);
        let method = Method::of(path);
        let (snap, picked) = pick_now(&shared.picker, &[], method);
        if picked.is_some() {
            return route_to(shared, req, deadline, obs, method, (snap, picked));
        }
        tracing::debug!("no usable instance: the call waits for one (wait-for-ready)");
        return held(shared, req, deadline, obs, wait);
    }
    let msg = no_instance_message(&shared.picker, snap);
    tracing::debug!(reason = %msg, "call refused");
    obs.refused(&shared.totals);
    ResponseFuture::over(no_usable_instance(msg), CallObs::default())
}

/// A call that waits for `wait` before it is routed.
fn held(
    shared: &Arc<Shared>,
    req: http::Request<Body>,
    deadline: Option<Pin<Box<Sleep>>>,
    obs: CallObs,
    wait: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> ResponseFuture {
    ResponseFuture {
        call: Routed::unrouted(deadline, obs),
        phase: Phase::Waiting(Box::new(WaitingCall {
            wait,
            req: Some(req),
            shared: shared.clone(),
        })),
    }
}

impl Future for ResponseFuture {
    type Output = CallResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let _in_span = this.call.span().map(|s| s.clone().entered());
        match &mut this.phase {
            Phase::Running => {}
            Phase::Over(status) => {
                let status = status
                    .take()
                    .unwrap_or_else(|| tonic::Status::unknown("call polled after it ended"));
                return Poll::Ready(Err(status.into()));
            }
            Phase::Waiting(d) => {
                let WaitingCall { wait, req, shared } = &mut **d;
                if this.call.deadline_came(cx) {
                    let result = this.call.end_with(deadline_exceeded().into());
                    return this.ended(result);
                }
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let (shared, req) = (shared.clone(), req.take().expect("routed once"));
                let (deadline, obs) = this.call.take_for_routing();
                *this = route(&shared, req, deadline, obs);
                return Pin::new(this).poll(cx);
            }
        }
        if this.call.deadline_came(cx) {
            let result = this.call.at_deadline(cx);
            return this.ended(result);
        }
        match this.call.drive(cx) {
            Poll::Ready(result) => this.ended(result),
            Poll::Pending => Poll::Pending,
        }
    }
}
