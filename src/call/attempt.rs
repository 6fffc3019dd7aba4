//! One attempt of a call: its place in its instance's count and on one of the instance's
//! connections (the [`CallGuard`]), and its request on its way. Every attempt of every call is
//! one of these, the first, a transparent replay, a retry or a hedge alike.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::transport::Channel;
use tower::BoxError;

use super::replay::{AttemptId, Replay};
use crate::call::guard::CallGuard;
use crate::instance::{Instance, State};
use crate::load::tie::Method;
use crate::observe::AttemptObs;

/// An attempt in flight.
pub(crate) struct Attempt {
    /// Its count and place (taken out only when its answer is delivered).
    guard: Option<CallGuard>,
    channel: Channel,
    step: Step,
    /// Its id in the call's replay slot (meaningless for a call that keeps no replay).
    pub(crate) id: AttemptId,
    /// The attempts of the call's policy before it (its `grpc-previous-rpc-attempts`): 0 for
    /// the first; a transparent replay carries the number of the attempt it replaces.
    pub(crate) previous: u32,
    /// Set while the attempt waits on an instance whose connection is being opened, if the call
    /// could go elsewhere: wakes the call when that connection fails, so that it moves on at
    /// once instead of waiting in the connection's queue for its own connect attempt.
    unreachable: Option<Pin<Box<tokio::sync::futures::OwnedNotified>>>,
    pub(crate) obs: AttemptObs,
}

// The request waits in the attempt until it is sent; boxing it would cost an allocation per
// attempt for nothing.
#[allow(clippy::large_enum_variant)]
enum Step {
    /// Waiting for room in the connection's queue.
    Waiting(Option<http::Request<Body>>),
    /// Sent; waiting for the response head.
    Sent(tonic::transport::channel::ResponseFuture),
}

/// What polling an attempt came to.
pub(crate) enum Polled {
    /// The response head.
    Head(http::Response<Body>),
    /// An error before the response head.
    Failed(BoxError),
    /// Its instance was found unreachable while the attempt had sent nothing.
    Unreachable,
}

impl Attempt {
    /// Sends `req` to `inst`: counts it there, takes its place on one of the instance's
    /// connections (not `avoid` if another will do), and, with `watch`, watches for the
    /// instance being found unreachable meanwhile.
    #[inline]
    pub(crate) fn start(
        inst: &Arc<Instance>,
        method: Method,
        req: http::Request<Body>,
        id: AttemptId,
        watch: bool,
        avoid: u8,
        obs: AttemptObs,
    ) -> Attempt {
        let mut guard = CallGuard::new(inst.clone(), method);
        let channel = crate::instance::conns::channel(inst, &mut guard.held, avoid);
        let unreachable = (watch && guard.routed_connecting())
            .then(|| Box::pin(inst.unreachable.clone().notified_owned()));
        Attempt {
            guard: Some(guard),
            channel,
            step: Step::Waiting(Some(req)),
            id,
            previous: 0,
            unreachable,
            obs,
        }
    }

    #[inline]
    pub(crate) fn guard(&self) -> &CallGuard {
        self.guard.as_ref().expect("held until the attempt is over")
    }

    #[inline]
    pub(crate) fn guard_mut(&mut self) -> &mut CallGuard {
        self.guard.as_mut().expect("held until the attempt is over")
    }

    /// Its guard and its metrics, for the response of the call that delivers its answer: the
    /// rest of it is dropped where it is.
    #[inline]
    pub(crate) fn take_answer(&mut self) -> (CallGuard, AttemptObs) {
        let guard = self.guard.take().expect("delivered once");
        (guard, std::mem::take(&mut self.obs))
    }

    /// Whether its request went to its connection (its answer may be there).
    pub(crate) fn is_sent(&self) -> bool {
        matches!(self.step, Step::Sent(_))
    }

    #[inline]
    pub(crate) fn instance(&self) -> &Arc<Instance> {
        self.guard().instance()
    }

    /// Polls the attempt. `replay`: the call's request, if it keeps one. (Inlined in the call's
    /// loop, where it is hot, and where the deadline looks at answers already there.)
    #[inline(always)]
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, replay: Option<&Replay>) -> Poll<Polled> {
        if self.unreachable.is_some() {
            if let Some(polled) = self.watch(cx, replay) {
                return Poll::Ready(polled);
            }
        }
        loop {
            match &mut self.step {
                Step::Waiting(req) => match tower::Service::poll_ready(&mut self.channel, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Polled::Failed(e.into())),
                    Poll::Ready(Ok(())) => {
                        let req = req.take().expect("request sent once");
                        self.step = Step::Sent(tower::Service::call(&mut self.channel, req));
                    }
                },
                Step::Sent(fut) => {
                    return match Pin::new(fut).poll(cx) {
                        Poll::Pending => Poll::Pending,
                        Poll::Ready(Ok(resp)) => Poll::Ready(Polled::Head(resp)),
                        Poll::Ready(Err(e)) => Poll::Ready(Polled::Failed(e.into())),
                    };
                }
            }
        }
    }

    /// While the attempt waits on an instance whose connection is being opened: whether it
    /// should move on (the instance was found unreachable and nothing of the request went
    /// out). Stops watching once the request went out (the connection works) or the instance
    /// was found unreachable.
    #[cold]
    fn watch(&mut self, cx: &mut Context<'_>, replay: Option<&Replay>) -> Option<Polled> {
        let watch = self.unreachable.as_mut()?;
        let sent = replay.is_some_and(|r| r.was_read(self.id));
        if sent {
            // Its connection read the request: the connection works.
            self.unreachable = None;
            self.instance().connected();
            return None;
        }
        if watch.as_mut().poll(cx).is_pending() && self.instance().state() != State::Failing {
            return None;
        }
        self.unreachable = None;
        replay
            .is_some_and(|r| r.unsent(self.id))
            .then_some(Polled::Unreachable)
    }

    /// Whether the attempt's request went out on a connection (its body was read): then the
    /// instance's connection works, which an attempt given up before its answer (a hedge won)
    /// would otherwise never tell.
    pub(crate) fn note_sent(&self, replay: &Replay) {
        if self.guard().routed_connecting() && replay.was_read(self.id) {
            self.instance().connected();
        }
    }
}
