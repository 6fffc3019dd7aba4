//! One attempt of a call, out and back: its place in its instance's count and on one of the
//! instance's connections (the [`CallGuard`]), its request on its way, the status its response
//! head carries, and the response body that carries the count to the call's end
//! ([`GuardedBody`]). Every attempt of every call is one of these, the first, a transparent
//! replay, a retry or a hedge alike.
//!
//! The count is an RAII value: `+1` when the guard is made, `-1` in its `Drop`, so it is
//! released exactly once whatever happens: success, error, timeout, or the caller dropping the
//! future or the response stream at any await point. The guard moves from the response future
//! into the response body; the call is over when the body yields its trailers or an error, or
//! is dropped. On its way out the guard hands what the answer taught to `crate::load` and its
//! outcome to the channel's observers.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::transport::Channel;
use tonic::Code;
use tower::BoxError;

use super::replay::{AttemptId, Replay};
use crate::deadline;
use crate::headers::grpc_status;
use crate::instance::events::{classify_code, classify_status, Outcome};
use crate::instance::{Instance, State};
use crate::load::tie::Method;
use crate::observe::{AttemptObs, CallObs};

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

/// The status that a response head carries on its own, and what it says of the instance: the
/// `grpc-status` of a trailers-only response; for an answer that is not gRPC's (an HTTP error
/// from a proxy, no `grpc-status`), the code gRPC maps its HTTP status to, and a failure of the
/// instance. `None` for a response whose status comes in its trailers.
#[inline]
pub(crate) fn head_status(resp: &http::Response<tonic::body::Body>) -> Option<(Code, Outcome)> {
    let ended = http_body::Body::is_end_stream(resp.body());
    if resp.status() == http::StatusCode::OK && !ended {
        return None;
    }
    Some(match crate::headers::grpc_status(resp.headers()) {
        Some(code) => (code, classify_code(code)),
        None if resp.status() == http::StatusCode::OK => (Code::Unknown, Outcome::Failure),
        None => (from_http_status(resp.status()), Outcome::Failure),
    })
}

/// gRPC's mapping of an HTTP status to a code, for responses without `grpc-status`
/// (`doc/http-grpc-status-mapping.md` of grpc/grpc).
fn from_http_status(status: http::StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// Holds one call's place in its instance's in-flight count.
pub(crate) struct CallGuard {
    inst: Arc<Instance>,
    start: Instant,
    /// Routed while the instance had no connection yet: its latency includes the connection
    /// set-up and says nothing of the service time.
    connecting: bool,
    /// The instance answered (response headers arrived).
    answered: bool,
    /// When its response head came, if that is a latency sample (the call was not routed
    /// while connecting); the sample is taken once the call's status is known (see `Drop`).
    head: Option<Instant>,
    /// The instance's count of connection breaks when the call was routed.
    breaks_at: u32,
    /// The call's method, for the tie-break's per-method reference.
    method: Method,
    /// The connection of its instance it counts against (see `crate::instance::conns`).
    pub(crate) held: crate::instance::conns::HeldConnection,
    outcome: Option<Outcome>,
}

impl CallGuard {
    #[inline]
    pub(crate) fn new(inst: Arc<Instance>, method: Method) -> CallGuard {
        inst.standing.enter();
        if let Some(n) = &inst.ctx.attempts {
            n.fetch_add(1, Ordering::Relaxed);
        }
        let breaks_at = inst.call_started();
        let connecting = inst.state() == crate::instance::State::Connecting;
        CallGuard {
            breaks_at,
            method,
            inst,
            connecting,
            answered: false,
            head: None,
            held: Default::default(),
            start: Instant::now(),
            outcome: None,
        }
    }

    #[inline]
    pub(crate) fn instance(&self) -> &Arc<Instance> {
        &self.inst
    }

    /// The response headers arrived: a latency sample, once the call's status says what kind
    /// of answer it was (see [`sample_answer`](Self::sample_answer)).
    #[inline]
    pub(crate) fn headers_received(&mut self) {
        self.answered = true;
        crate::instance::conns::answered(&self.inst, self.held.conn);
        if !self.connecting {
            self.head = Some(Instant::now());
        }
    }

    /// The call's status came with `map` (its trailers, or a trailers-only head): the load
    /// report it carries, if any, is taken while the guard still counts the call, as the
    /// server counted it when it wrote the report. The one place where a call's load reports
    /// are read.
    #[inline]
    pub(crate) fn take_report(&self, map: &mut http::HeaderMap) {
        let inst = &*self.inst;
        let own = || inst.in_flight();
        let name = &inst.target.name;
        (inst.ctx.load).take_report(map, &inst.others, &inst.reported, own, name);
    }

    /// The latency sample of an answered call (its response head came `at`), by how it ended:
    /// a failed answer is never a fast answer (an instance whose handler throws answers
    /// UNKNOWN at once, and would look the fastest). An OK answer (or one with a code the user
    /// named ordinary) counts as it is, and so does an answer whose end says nothing against
    /// the instance (the caller dropped its stream, a CANCELLED the server passed on); an
    /// answer with another status, or a broken stream, counts for the tie-break as a failure
    /// ([`ChannelLoad::failed`](crate::load::ChannelLoad::failed): a fixed slowness under its own short gates, whatever it
    /// took) and for the latency estimate only if slower than it.
    #[inline]
    fn sample_answer(&self, at: Instant, outcome: Outcome) {
        let took = at.saturating_duration_since(self.start);
        let inst = &*self.inst;
        let (load, tie, latency) = (&inst.ctx.load, &inst.tie, &inst.latency);
        match outcome {
            Outcome::Answer(code) if inst.ctx.is_ordinary(code) => {
                load.answered(tie, latency, self.method, took, at)
            }
            Outcome::Neutral => load.answered(tie, latency, self.method, took, at),
            Outcome::Answer(_) | Outcome::Failure => {
                load.failed(tie, latency, self.method, took, at)
            }
        }
    }

    /// What the call's deadline (at `deadline`, if the channel knows it) passing says of the
    /// instance: a failure only if the instance had not answered and had held the call long
    /// enough (see [`deadline::held_long_enough`]) for the silence to mean something: a hanging instance is found out, a caller's
    /// short deadline ejects nobody.
    pub(crate) fn deadline_outcome(&self, deadline: Option<Instant>) -> Outcome {
        let usual = self.inst.latency.usual_ns();
        if !self.answered && deadline::held_long_enough(self.start, usual, deadline) {
            Outcome::Failure
        } else {
            Outcome::Neutral
        }
    }

    /// The connection broke under this call: whether this call is the first to report that
    /// break (no other break was reported since the call was routed). One break fails every
    /// call on the connection; it counts against the instance once.
    pub(crate) fn first_to_see_break(&self) -> bool {
        self.inst.first_to_see_break(self.breaks_at)
    }

    /// The call is over with this outcome; the count is released when the guard drops.
    #[inline]
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        if self.outcome.is_none() {
            self.outcome = Some(outcome);
        }
    }
}

impl Drop for CallGuard {
    #[inline]
    fn drop(&mut self) {
        self.inst.standing.leave();
        if let Some(n) = &self.inst.ctx.attempts {
            n.fetch_sub(1, Ordering::Relaxed);
        }
        // A call whose stream this instance refused may wait for room: there is some now.
        self.inst.room_made();
        if self.held.conn != crate::instance::conns::UNCOUNTED {
            crate::instance::conns::release(&self.inst, self.held.conn);
        }
        if self.outcome.is_none() && !self.answered {
            self.given_up();
        }
        let outcome = self.outcome.unwrap_or(Outcome::Neutral);
        if let Some(at) = self.head {
            self.sample_answer(at, outcome);
        }
        self.inst.ctx.events.outcome(&self.inst, outcome);
    }
}

impl CallGuard {
    /// Dropped unanswered without an outcome: the caller gave up on the call (a timeout of its
    /// own, a tower `Timeout`), or the call gave this attempt up (a hedge answered first). Not
    /// a failure of the instance, but it held the call at least this long: a sample that says
    /// the instance takes at least that long, or what it usually takes if that is more (the
    /// attempt was cut short, not answered faster). Without it, an instance that hangs, or one
    /// whose every attempt a hedge overtakes, would keep its old fast estimate (or none) and
    /// win every tie while callers give up on it.
    #[cold]
    fn given_up(&self) {
        if self.connecting && self.inst.state() != crate::instance::State::Ready {
            // Its connection was being opened and is not known to work: the time says nothing
            // of the service.
            return;
        }
        let held = self.start.elapsed();
        if held < deadline::FLOOR {
            return;
        }
        let usual = self.inst.latency.usual_ns();
        let at_least = held.max(std::time::Duration::from_nanos(usual as u64));
        let inst = &*self.inst;
        let load = &inst.ctx.load;
        let (sent, now) = (load.ns_at(self.start), load.ns_at(Instant::now()));
        load.sample(&inst.tie, &inst.latency, self.method, at_least, sent, now);
    }

    /// Whether the call was routed while its instance had no connection known to work.
    #[inline]
    pub(crate) fn routed_connecting(&self) -> bool {
        self.connecting
    }
}

impl std::fmt::Debug for CallGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallGuard")
            .field("addr", &self.inst.target.name)
            .finish()
    }
}

pin_project_lite::pin_project! {
    #[project = GuardedBodyProj]
    /// A response body that holds its call's [`CallGuard`] until the call is over, and ends the
    /// stream with DEADLINE_EXCEEDED if the call's deadline passes first.
    pub(crate) struct GuardedBody {
        #[pin]
        inner: Body,
        guard: Option<CallGuard>,
        deadline: Option<Pin<Box<Sleep>>>,
        // Bytes of data yielded after the deadline (see `LATE_DATA`).
        late: usize,
        obs: CallObs,
    }
}

/// Once the call's deadline has passed, the body still yields what has already arrived (an
/// answer already there wins over a caller who reads late), without waiting for more, up to
/// this many bytes of data: an HTTP/2 stream's default window, which bounds what a server
/// can have sent that the caller had not read; past that, or as soon as it would wait, the
/// call ends with DEADLINE_EXCEEDED.
const LATE_DATA: usize = 65_535;

impl GuardedBody {
    pub(crate) fn new(
        inner: Body,
        guard: CallGuard,
        deadline: Option<Pin<Box<Sleep>>>,
        obs: CallObs,
    ) -> Self {
        GuardedBody {
            inner,
            guard: Some(guard),
            deadline,
            late: 0,
            obs,
        }
    }
}

impl GuardedBody {
    /// Ends the call here, before its stream did, with `outcome` for its instance and `code`
    /// for its caller: a check of the channel's own failed it (a response message above the
    /// method's limit, see `call::limits`). The count is released; dropping the body then
    /// cancels the stream.
    pub(crate) fn end_here(&mut self, outcome: Outcome, code: tonic::Code) {
        if let Some(mut guard) = self.guard.take() {
            guard.finish(outcome);
        }
        self.deadline = None;
        self.obs.finish(code);
    }
}

/// The call is over with this outcome, and this status for its caller: the guard (and with it
/// the count) goes, and the deadline with it.
fn end(this: &mut GuardedBodyProj<'_>, outcome: Outcome, code: tonic::Code) {
    if let Some(mut guard) = this.guard.take() {
        guard.finish(outcome);
    }
    *this.deadline = None;
    this.obs.finish(code);
}

/// After the deadline: whether what the body yielded is an answer that was already there (a
/// frame ready at once, within [`LATE_DATA`] bytes of data since the deadline, counted in
/// `late`), rather than a wait, an error or the stream's end without trailers.
fn arrived_in_time(
    polled: &Poll<Option<Result<Frame<Bytes>, tonic::Status>>>,
    late: &mut usize,
) -> bool {
    let Poll::Ready(Some(Ok(frame))) = polled else {
        return false;
    };
    *late += frame.data_ref().map_or(0, Bytes::len);
    *late <= LATE_DATA
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let mut this = self.project();
        let Some(guard) = this.guard.as_mut() else {
            // Over: trailers were read, an error was returned, or the deadline passed.
            return Poll::Ready(None);
        };
        let late = this
            .deadline
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready());
        let polled = this.inner.as_mut().poll_frame(cx);
        if late && !arrived_in_time(&polled, this.late) {
            // The instance had answered (this is its response): nothing against it.
            end(&mut this, Outcome::Neutral, tonic::Code::DeadlineExceeded);
            return Poll::Ready(Some(Err(crate::error::deadline_exceeded())));
        }
        match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(mut frame))) => {
                this.obs.received(&frame);
                if let Some(trailers) = frame.trailers_mut() {
                    guard.take_report(trailers);
                    let code = grpc_status(trailers);
                    let late = this.deadline.as_deref().is_some_and(deadline::passed);
                    if late
                        && code.is_some_and(|c| {
                            matches!(c, tonic::Code::Cancelled | tonic::Code::DeadlineExceeded)
                        })
                    {
                        // The deadline passed as the stream ended with the server's own
                        // timer's answer (CANCELLED "Timeout expired", DEADLINE_EXCEEDED):
                        // report it as what it is. (Any other status already there is the
                        // call's.) The instance had answered: nothing against it.
                        end(&mut this, Outcome::Neutral, tonic::Code::DeadlineExceeded);
                        return Poll::Ready(Some(Err(crate::error::deadline_exceeded())));
                    }
                    let status = code.unwrap_or(tonic::Code::Unknown);
                    end(&mut this, classify_status(code), status);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(status))) => {
                let (status, broken) = if status.code() == tonic::Code::Unknown {
                    match crate::error::broken_connection(&guard.instance().target.name, status) {
                        Ok(unavailable) => (unavailable, true),
                        Err(status) => (status, false),
                    }
                } else {
                    (status, false)
                };
                // A broken connection counts once, whatever number of calls it broke.
                let outcome = if broken && !guard.first_to_see_break() {
                    Outcome::Neutral
                } else {
                    Outcome::Failure
                };
                end(&mut this, outcome, status.code());
                Poll::Ready(Some(Err(status)))
            }
            Poll::Ready(None) => {
                // Ended without trailers (a trailers-only response's outcome is set already):
                // not a gRPC answer.
                end(&mut this, Outcome::Failure, tonic::Code::Unknown);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.guard.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
