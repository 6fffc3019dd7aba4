//! [`BalancedChannel`]: the `tower::Service` that generated stubs call, and its future.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Sleep;
use tonic::body::Body;
use tonic::transport::Channel;
use tower::BoxError;

use crate::error::{deadline_exceeded, is_transport, no_usable_instance, sources, unavailable};
use crate::guard::{CallGuard, GuardedBody};
use crate::headers::grpc_status;
use crate::health::{self, Outcome};
use crate::hedge::Hedge;
use crate::instance::Instance;
use crate::observe::CallObs;
use crate::pick::{self, Load, Rng};
use crate::pool::{Members, Pool, Snapshot};
use crate::retry::Replay;
use crate::stats::{EndpointStats, ServedBy};
use crate::target::Target;
use crate::tiebreak::Method;
use crate::Strategy;

/// A tonic channel that spreads calls over a set of instances, sending each call to the one
/// with the fewest calls in flight.
///
/// Use it wherever a [`tonic::transport::Channel`] goes: `FooClient::new(channel)`. Clones are
/// cheap and share one set of instances and one set of counts. See the [crate docs](crate) for
/// the routing rule and the failure handling.
#[derive(Clone)]
pub struct BalancedChannel {
    pub(crate) pool: Arc<Pool>,
}

impl std::fmt::Debug for BalancedChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BalancedChannel")
            .field("strategy", &self.pool.strategy)
            .field("instances", &self.pool.snapshot().len())
            .finish()
    }
}

impl BalancedChannel {
    /// A channel over these addresses with the default settings: least pending,
    /// a 5 s connect timeout per instance, and tonic's defaults otherwise.
    ///
    /// Each string must be an `http://` or `https://` URI with a host (and an optional port),
    /// such as `"http://10.0.0.7:50051"`. An empty list, a malformed URI or a duplicate is
    /// refused with an [`Error`](crate::Error) that quotes it. Must be called within a tokio
    /// runtime: each instance's connection task is spawned on it (connections open lazily, on
    /// the first call).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let channel = tonic_balancer::BalancedChannel::from_static([
    ///     "http://10.0.0.7:50051",
    ///     "http://10.0.0.8:50051",
    /// ])?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn from_static<I, S>(uris: I) -> Result<BalancedChannel, crate::Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        BalancedChannel::builder().uris(uris).build()
    }

    /// A channel over these endpoints, each with its own settings: the shape of tonic's
    /// `Channel::balance_list`, so that moving from it is one line.
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tonic_balancer::BalancedChannel;
    ///
    /// # async fn demo() -> Result<(), tonic_balancer::Error> {
    /// let endpoints = ["http://10.0.0.7:50051", "http://10.0.0.8:50051"]
    ///     .into_iter()
    ///     .map(Endpoint::from_static);
    /// // Before: let channel = Channel::balance_list(endpoints);
    /// let channel = BalancedChannel::balance_list(endpoints)?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn balance_list(
        endpoints: impl IntoIterator<Item = tonic::transport::Endpoint>,
    ) -> Result<BalancedChannel, crate::Error> {
        BalancedChannel::builder().endpoints(endpoints).build()
    }

    /// A channel whose instances come and go through the returned sender: the shape of tonic's
    /// `Channel::balance_channel`. Send `Change::Insert(key, endpoint)` to add an instance
    /// (replacing one of the same URI) and `Change::Remove(key)` to drain it; see
    /// [`Builder::discover`](crate::Builder::discover). Calls made before the first insert
    /// wait for it (at most 10 s, the default
    /// [`discovery_timeout`](crate::Builder::discovery_timeout)).
    ///
    /// ```no_run
    /// use tonic::transport::Endpoint;
    /// use tower::discover::Change;
    /// use tonic_balancer::BalancedChannel;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // Before: let (channel, tx) = Channel::balance_channel(1024);
    /// let (channel, tx) = BalancedChannel::balance_channel(1024)?;
    /// tx.send(Change::Insert("a", Endpoint::from_static("http://10.0.0.7:50051"))).await?;
    /// tx.send(Change::Remove("a")).await?;
    /// # let _ = channel; Ok(()) }
    /// ```
    #[allow(clippy::type_complexity)]
    pub fn balance_channel<K>(
        capacity: usize,
    ) -> Result<
        (
            BalancedChannel,
            tokio::sync::mpsc::Sender<tower::discover::Change<K, tonic::transport::Endpoint>>,
        ),
        crate::Error,
    >
    where
        K: std::hash::Hash + Eq + Clone + Send + 'static,
    {
        if capacity == 0 {
            return Err(crate::Error::InvalidSetting {
                name: "balance_channel",
                reason: "the capacity must be above zero".into(),
            });
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel(capacity);
        let channel = BalancedChannel::builder()
            .push(
                Box::new(move |cx| rx.poll_recv(cx).map(|c| c.map(Ok))),
                "balance_channel",
            )
            .build()?;
        Ok((channel, tx))
    }

    /// A [`Builder`](crate::Builder) for the instances' `Endpoint`s, the strategy and the
    /// failure-handling settings.
    pub fn builder() -> crate::Builder {
        crate::Builder::new()
    }

    /// A snapshot of every instance: the ones in the set, then the ones draining.
    pub fn endpoints(&self) -> Vec<EndpointStats> {
        let members = self.pool.snapshot();
        let draining = self.pool.draining();
        members
            .iter()
            .chain(draining.iter())
            .map(|i| EndpointStats::of(i))
            .collect()
    }

    /// The strategy this channel routes with.
    pub fn strategy(&self) -> Strategy {
        self.pool.strategy
    }

    /// Adds an instance while calls flow; its connection opens on its first call. An instance
    /// with the same URI in the set is replaced by this one, with its settings (a rotated
    /// certificate, a new timeout): the old one drains (its calls finish on its connection).
    /// Returns `Ok(true)` if the URI was not in the set, `Ok(false)` if an instance was
    /// replaced.
    pub fn insert(&self, endpoint: tonic::transport::Endpoint) -> Result<bool, crate::Error> {
        Ok(self.pool.insert(Target::endpoint(endpoint)?))
    }

    /// Removes the instance with this URI (or, for an instance added with a connector, this
    /// name): it gets no new calls from now on, finishes the calls it has (it shows as
    /// [`State::Draining`](crate::State::Draining) meanwhile), then its connection closes.
    /// Returns `Ok(false)` if there is no such instance.
    pub fn remove(&self, uri: &str) -> Result<bool, crate::Error> {
        Ok(self.pool.remove(&crate::target::key_of(uri)?))
    }

    /// Makes the set exactly these instances: adds the new ones, removes (drains) the ones
    /// not listed, leaves the others and their connections alone. Returns how many were
    /// added and removed. Nothing is changed if an endpoint's URI is invalid.
    pub fn replace_all(
        &self,
        endpoints: impl IntoIterator<Item = tonic::transport::Endpoint>,
    ) -> Result<(usize, usize), crate::Error> {
        let want = endpoints
            .into_iter()
            .map(Target::endpoint)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.pool.sync(want))
    }

    /// Picks the instance for one call (excluding the ones in `tried`).
    #[inline]
    pub(crate) fn pick(
        pool: &Pool,
        snap: &Members,
        tried: &[Arc<Instance>],
        method: Method,
    ) -> Option<usize> {
        if snap.len() == 1 {
            // Nothing to choose: whatever the strategy, the one instance if it is usable.
            return Self::pick_with_one(snap, tried);
        }
        let slow = pool.policy.slow_start_ns;
        if slow > 0 {
            // Slow start may hold back every instance that is warming up; it must never be the
            // reason a call finds nothing.
            if let Some(i) = Self::pick_with(pool, snap, tried, slow, method) {
                return Some(i);
            }
        }
        Self::pick_with(pool, snap, tried, 0, method)
    }

    #[inline]
    fn pick_with_one(snap: &[Arc<Instance>], tried: &[Arc<Instance>]) -> Option<usize> {
        let i = &snap[0];
        (i.is_usable() && !tried.iter().any(|t| Arc::ptr_eq(t, i))).then_some(0)
    }

    #[inline]
    fn pick_with(
        pool: &Pool,
        snap: &Members,
        tried: &[Arc<Instance>],
        slow: u64,
        method: Method,
    ) -> Option<usize> {
        let policy = &pool.policy;
        let now = policy.clock.load(Ordering::Relaxed);
        let expiry = policy.latency_expiry_ns;
        let inv_expiry = policy.inv_latency_expiry;
        // Calls in flight: this channel's, plus the other clients' as of a fresh load report.
        let tick = crate::orca::tick(now);
        let mut rng = Rng::thread();
        // An independent stream for the slow-start draws (the strategy's own draws use `rng`).
        let mut gate =
            (slow > 0).then(|| Rng::seeded(rng.next_u64().wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        // Whether the pick may send calls to `i` at all.
        let mut usable = |i: &Arc<Instance>| -> bool {
            if !i.is_usable() || (!tried.is_empty() && tried.iter().any(|t| Arc::ptr_eq(t, i))) {
                return false;
            }
            if let Some(g) = gate.as_mut() {
                // Slow start: a warming instance takes part in a share of the picks that
                // grows linearly over the window (from 5%).
                let from = i.warm_from.load(Ordering::Relaxed);
                let since = now.saturating_sub(from);
                if from != 0 && since < slow {
                    let ramp = (since as f64 / slow as f64).max(0.05);
                    if g.unit() >= ramp {
                        return false;
                    }
                }
            }
            true
        };
        let picked = match pool.strategy {
            // The common case, a first attempt without slow start: nothing to check but the
            // state, so the scan's loop stays tight.
            Strategy::LeastPending if tried.is_empty() && slow == 0 => {
                let dear = policy.methods.is_dear(method);
                let turn = |i: &Arc<Instance>| i.tie.turn_for(dear, now);
                let chosen = if policy.reports_fresh.any(tick) {
                    tight_least_pending::<true>(snap, &mut rng, tick, turn)
                } else {
                    // No instance has a fresh report (every `others` reads 0): the scan
                    // does not read them.
                    tight_least_pending::<false>(snap, &mut rng, tick, turn)
                };
                chosen.map(|c| took_turn(snap, c, dear))
            }
            Strategy::LeastPending => {
                let dear = policy.methods.is_dear(method);
                pick::least_pending(
                    snap,
                    &mut rng,
                    &snap.strides,
                    |i| usable(i).then(|| counted(i, tick, true)),
                    |i| i.tie.turn_for(dear, now),
                )
                .map(|c| took_turn(snap, c, dear))
            }
            strategy => {
                // Peak EWMA's latency already carries the other clients' load (their calls
                // queue with ours): it weighs this channel's own calls only (see
                // examples/shootout/many_clients.rs for what adding the reported ones did).
                let reports = strategy != Strategy::PeakEwma;
                let mut load = |i: &Arc<Instance>| -> Option<Load> {
                    usable(i).then(|| Load {
                        in_flight: counted(i, tick, reports),
                        latency_ns: i.latency(now, expiry, inv_expiry),
                    })
                };
                match strategy {
                    Strategy::PeakEwma => {
                        pick::peak_ewma(snap, &mut rng, policy.default_latency_ns, load)
                    }
                    Strategy::PowerOfTwoChoices => pick::power_of_two(snap, &mut rng, load),
                    Strategy::WeightedRoundRobin => pool
                        .wrr
                        .pick(snap, &mut rng, |i| load(i).is_some())
                        .or_else(|| {
                            let c = pool.rr.fetch_add(1, Ordering::Relaxed);
                            pick::round_robin(snap, c, load)
                        }),
                    _ => {
                        let c = pool.rr.fetch_add(1, Ordering::Relaxed);
                        pick::round_robin(snap, c, load)
                    }
                }
            }
        };
        rng.store();
        picked
    }
}

/// The calls in flight on `i` that the pick compares: this channel's, plus, with `reports`,
/// the other clients' as of a report still fresh at `tick` (see `orca::Others`).
#[inline(always)]
fn counted(i: &Instance, tick: u64, reports: bool) -> usize {
    i.in_flight.load(Ordering::Relaxed) + if reports { i.others.get(tick) } else { 0 }
}

/// The least-pending pick of a first attempt without slow start: nothing to check but the
/// state, so the scan's loop stays tight; the other clients' calls are read only with
/// `REPORTS` (a loop of its own without them).
#[inline]
fn tight_least_pending<const REPORTS: bool>(
    snap: &Members,
    rng: &mut Rng,
    tick: u64,
    turn: impl FnMut(&Arc<Instance>) -> pick::Turn,
) -> Option<pick::Chosen> {
    pick::least_pending(
        snap,
        rng,
        &snap.strides,
        |i| i.is_usable().then(|| counted(i, tick, REPORTS)),
        turn,
    )
}

/// The least-pending choice's instance takes its turn (its pass advances; and its dear pass,
/// for a call to a dear method).
#[inline]
fn took_turn(snap: &[Arc<Instance>], c: pick::Chosen, dear: bool) -> usize {
    let tie = &snap[c.index].tie;
    if dear {
        tie.advance_dear(c.floor);
    } else {
        tie.advance(c.floor);
    }
    c.index
}

/// Why nothing could be picked, for the UNAVAILABLE message.
fn no_instance_message(pool: &Pool, snap: &[Arc<Instance>]) -> String {
    if snap.is_empty() {
        return match pool.discovery_error() {
            Some(e) => format!("tonic-balancer: no instances in the set (discovery: {e})"),
            None => "tonic-balancer: no instances in the set".to_owned(),
        };
    }
    let mut counts = std::collections::BTreeMap::<&'static str, usize>::new();
    for i in snap {
        *counts.entry(i.state().as_str()).or_default() += 1;
    }
    let states: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    format!(
        "tonic-balancer: no usable instance among {} ({})",
        snap.len(),
        states.join(", ")
    )
}

impl tower::Service<http::Request<Body>> for BalancedChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ResponseFuture;

    /// Always ready: the channel itself queues nothing. Each call waits, within its own future,
    /// for room in its instance's connection.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let deadline = crate::deadline::from_headers(req.headers()).map(|d| {
            // The timer is made on the channel's runtime: the caller may be on any executor.
            let _rt = self.pool.policy.runtime.enter();
            Box::pin(tokio::time::sleep(d))
        });
        let obs = CallObs::new(&self.pool, &req);
        route(&self.pool, req, deadline, obs)
    }
}

/// Picks an instance from the current set (excluding `tried`). A pick that finds nothing in a
/// set that was replaced while it read it (its instances draining by then) is made again on
/// the new set, so that a membership change never fails a call: only a pick that finds
/// nothing in the set as it is now does.
pub(crate) fn pick_now(
    pool: &Pool,
    tried: &[Arc<Instance>],
    method: Method,
) -> (arc_swap::Guard<Snapshot>, Option<usize>) {
    let mut snap = pool.snapshot();
    // Each round needs a new publication; a few are plenty even under constant churn.
    for _ in 0..4 {
        if let Some(idx) = BalancedChannel::pick(pool, &snap, tried, method) {
            return (snap, Some(idx));
        }
        let now = pool.snapshot();
        if Arc::ptr_eq(&snap, &now) {
            break;
        }
        snap = now;
    }
    (snap, None)
}

/// At most this many transparent replays of one call on instances it has tried already (a
/// connection closed before the request was written: the same instance may take the call on a
/// fresh connection). Calls whose instance could not be reached move on to untried instances,
/// and are bounded by the set.
const MAX_SAME_INSTANCE_REPLAYS: u32 = 3;

/// Routes one call: picks its instance and makes its future.
fn route(
    pool: &Arc<Pool>,
    mut req: http::Request<Body>,
    deadline: Option<Pin<Box<Sleep>>>,
    mut obs: CallObs,
) -> ResponseFuture {
    let method = Method::of(req.uri().path());
    let (snap, picked) = pick_now(pool, &[], method);
    // Discovery's first answer may have been published between that pick and the read of
    // `discovered` below: look again at the set then (the failure path only).
    let (snap, picked) = match picked {
        None if snap.is_empty() && *pool.discovered.borrow() => pick_now(pool, &[], method),
        _ => (snap, picked),
    };
    let Some(idx) = picked else {
        if snap.is_empty() && !*pool.discovered.borrow() {
            // Discovery has not answered yet: wait for its first answer (bounded by the
            // lookup's timeout, and by the call's deadline).
            let mut rx = pool.discovered.subscribe();
            let wait = Box::pin(async move {
                let _ = rx.wait_for(|done| *done).await;
            });
            return ResponseFuture {
                state: CallState::Discovering {
                    wait,
                    req: Some(req),
                    pool: pool.clone(),
                },
                guard: None,
                deadline,
                again: None,
                unreachable: None,
                obs,
            };
        }
        let msg = no_instance_message(pool, &snap);
        tracing::debug!(reason = %msg, "call refused");
        obs.refused(pool);
        return ResponseFuture::failed(no_usable_instance(msg));
    };
    let inst = &snap[idx];
    obs.attempt(inst);
    tracing::trace!(addr = %inst.target.name, in_flight = inst.in_flight.load(Ordering::Relaxed), "call routed");
    if let Some(hedging) = &pool.hedging {
        if let Some(policy) = hedging.policy(req.uri().path()) {
            // A hedged call's metrics know one attempt: the caller's body counts once, whichever
            // attempt sends it (the hedges send a copy).
            obs.count_sent(&mut req);
            let deadline_at = deadline.as_ref().map(|d| d.deadline());
            let hedge = Hedge::start(pool, policy.clone(), req, inst, method, deadline_at);
            return ResponseFuture {
                state: CallState::Hedged(hedge),
                guard: None,
                deadline,
                again: None,
                unreachable: None,
                obs,
            };
        }
    }
    // Keep what is needed to send the call again if its instance cannot be reached, its
    // connection closes before the request is written, or (with a retry policy) it fails.
    let (mut req, again) = if pool.replay || pool.retry.is_some() {
        if let Some(b) = &pool.budget {
            b.deposit();
        }
        // Recorded with transparent retry too: a stream the server refuses (REFUSED_STREAM)
        // has had its body read already, and is sent again from the copy.
        let (req, replay) = Replay::wrap(
            req,
            pool.retry.is_some() || pool.replay,
            pool.max_replay_body,
        );
        let again = Box::new(Again {
            replay,
            pool: pool.clone(),
            tried: Vec::new(),
            attempts: 1,
            replays: 0,
            refused: false,
            method,
            deadline_at: deadline.as_ref().map(|d| d.deadline()),
        });
        (req, Some(again))
    } else {
        (req, None)
    };
    obs.count_sent(&mut req);
    let mut guard = CallGuard::new(inst.clone(), method);
    let channel = crate::conns::channel(inst, &mut guard);
    let mut fut = ResponseFuture {
        state: CallState::Routed {
            channel,
            req: Some(req),
        },
        guard: Some(guard),
        deadline,
        again,
        unreachable: None,
        obs,
    };
    fut.watch(inst);
    fut
}

// The request lives in the future until it is sent; boxing it would cost an allocation per
// call for nothing.
#[allow(clippy::large_enum_variant)]
enum CallState {
    /// Routed to an instance; waiting for room in its connection.
    Routed {
        channel: Channel,
        req: Option<http::Request<Body>>,
    },
    /// Sent; waiting for the response head.
    Sent(tonic::transport::channel::ResponseFuture),
    /// Waiting for the first answer of discovery.
    Discovering {
        wait: Pin<Box<dyn Future<Output = ()> + Send>>,
        req: Option<http::Request<Body>>,
        pool: Arc<Pool>,
    },
    /// Between two attempts of the retry policy.
    Backoff(Box<Backoff>),
    /// A hedged call: its attempts run within.
    Hedged(Box<Hedge>),
    /// Refused before routing, or over.
    Failed(Option<tonic::Status>),
}

/// The wait before a retry, and the answer the caller gets if the retry finds nowhere to go
/// after all (the set changed meanwhile).
struct Backoff {
    sleep: Pin<Box<Sleep>>,
    last: CallResult,
}

/// What a call needs to go to another instance.
struct Again {
    replay: Replay,
    pool: Arc<Pool>,
    /// The instances whose attempt ended without success (empty until one does: no
    /// allocation on a call's first attempt).
    tried: Vec<Arc<Instance>>,
    /// Attempts made under the retry policy (transparent replays do not count).
    attempts: u32,
    /// Transparent replays on instances already tried (see [`MAX_SAME_INSTANCE_REPLAYS`]).
    replays: u32,
    /// A stream of the call was refused (REFUSED_STREAM) and sent again: a second refusal is
    /// left to the retry policy, as gRPC's transparent retry does (gRFC A6).
    refused: bool,
    /// When the call's deadline passes, if it has one.
    deadline_at: Option<tokio::time::Instant>,
    /// The call's method, for the pick of a next attempt.
    method: Method,
}

impl Again {
    /// The time left before the deadline (`Some(None)`: no deadline); `None` if it has passed.
    fn time_left(&self) -> Option<Option<Duration>> {
        match self.deadline_at {
            None => Some(None),
            Some(at) => {
                let left = at.checked_duration_since(tokio::time::Instant::now())?;
                (!left.is_zero()).then_some(Some(left))
            }
        }
    }
}

/// The future of one call through a [`BalancedChannel`].
pub struct ResponseFuture {
    state: CallState,
    guard: Option<CallGuard>,
    deadline: Option<Pin<Box<Sleep>>>,
    again: Option<Box<Again>>,
    /// Set while the call waits on an instance whose connection is being opened: wakes the
    /// call when that fails, so that it moves on at once instead of waiting in the
    /// connection's queue for its own connect attempt.
    unreachable: Option<Pin<Box<tokio::sync::futures::OwnedNotified>>>,
    /// The call's span and metrics (moved into the response body with the guard).
    obs: CallObs,
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

pub(crate) type CallResult = Result<http::Response<Body>, BoxError>;

impl ResponseFuture {
    fn failed(status: tonic::Status) -> ResponseFuture {
        ResponseFuture {
            state: CallState::Failed(Some(status)),
            guard: None,
            deadline: None,
            again: None,
            unreachable: None,
            obs: CallObs::default(),
        }
    }

    fn fail(&mut self, outcome: Outcome, error: BoxError) -> Poll<CallResult> {
        if let Some(mut guard) = self.guard.take() {
            guard.finish(outcome);
        }
        self.unreachable = None;
        self.state = CallState::Failed(None);
        self.obs.finish(crate::observe::code_of(&*error));
        Poll::Ready(Err(error))
    }

    /// The call's deadline passed before its response head.
    fn fail_deadline(&mut self) -> Poll<CallResult> {
        if let CallState::Hedged(h) = &mut self.state {
            h.deadline_passed();
        }
        let outcome = self
            .guard
            .as_ref()
            .map_or(Outcome::Cancelled, CallGuard::deadline_outcome);
        self.fail(outcome, deadline_exceeded().into())
    }

    /// Watches for `inst`'s connection failing while the call waits for it, if the instance
    /// is not known to be connected and the call may be sent elsewhere transparently.
    fn watch(&mut self, inst: &Arc<Instance>) {
        let transparent = self.again.as_ref().is_some_and(|a| a.pool.replay);
        self.unreachable = (transparent && inst.state() == crate::State::Connecting)
            .then(|| Box::pin(inst.unreachable.clone().notified_owned()));
    }

    /// Whether the instance the call waits on was found unreachable while the call's request
    /// had not gone out; if so, the call has moved on (or failed) and the state is set.
    fn moved_on(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(watch) = self.unreachable.as_mut() else {
            return false;
        };
        let Some(guard) = self.guard.as_ref() else {
            return false;
        };
        if watch.as_mut().poll(cx).is_pending() && guard.instance().state() != crate::State::Failing
        {
            return false;
        }
        self.unreachable = None;
        if !self.again.as_ref().is_some_and(|a| a.replay.unsent()) {
            // Its request is being written on a connection after all: let the attempt run.
            return false;
        }
        let guard = self.guard.take().expect("checked above");
        self.tried(guard.instance());
        let why = format_args!("{} could not be reached", guard.instance().target.name);
        if self.reroute(&why) {
            // Released without an outcome: the connect failure is recorded already.
            drop(guard);
        } else {
            let addr = &guard.instance().target.name;
            let status = unavailable(
                addr,
                format!(
                    "tonic-balancer: {addr} could not be reached and no other instance is usable"
                ),
                None,
            );
            drop(guard);
            self.state = CallState::Failed(Some(status));
        }
        true
    }

    /// Routes the call to an instance it has not tried; false if there is none or the request
    /// cannot be had again.
    fn reroute(&mut self, why: &dyn std::fmt::Display) -> bool {
        let Some(again) = self.again.as_mut() else {
            return false;
        };
        let pool = again.pool.clone();
        let (snap, picked) = pick_now(&pool, &again.tried, again.method);
        let Some(idx) = picked else {
            tracing::debug!(reason = %why, "no other instance to send the call to");
            return false;
        };
        let Some(time_left) = again.time_left() else {
            return false;
        };
        let Some(mut req) = again.replay.request(time_left) else {
            tracing::debug!(reason = %why, "call cannot be sent again: its request body is gone");
            return false;
        };
        let inst = &snap[idx];
        self.obs.attempt(inst);
        self.obs.count_sent(&mut req);
        tracing::debug!(to = %inst.target.name, reason = %why, "call sent again");
        let mut guard = CallGuard::new(inst.clone(), again.method);
        let channel = crate::conns::channel(inst, &mut guard);
        self.guard = Some(guard);
        self.state = CallState::Routed {
            channel,
            req: Some(req),
        };
        self.watch(inst);
        true
    }

    /// The attempt on `inst` is over without success: the call must not go there again.
    fn tried(&mut self, inst: &Arc<Instance>) {
        if let Some(again) = self.again.as_mut() {
            again.tried.push(inst.clone());
        }
    }

    /// Whether the retry policy sends this failure again, and if so the backoff to wait first
    /// (or the server's pushback instead: a wait it asks for, or no retry).
    /// Everything that could make the retry impossible is checked before a token of the
    /// budget is taken, so that a call with nowhere to go keeps the answer it has.
    fn retry_after(
        &mut self,
        code: tonic::Code,
        pushback: Option<crate::pushback::Pushback>,
    ) -> Option<Duration> {
        let again = self.again.as_mut()?;
        let policy = again.pool.retry.as_ref()?;
        if !policy.retries(code) || again.attempts >= policy.max_attempts {
            return None;
        }
        if !again.replay.replayable() {
            return None;
        }
        let delay = match pushback {
            None => policy.backoff(again.attempts),
            Some(crate::pushback::Pushback::After(wait)) => wait,
            Some(crate::pushback::Pushback::Stop) => {
                tracing::debug!(?code, "the server's pushback says not to retry");
                return None;
            }
        };
        if again
            .deadline_at
            .is_some_and(|d| tokio::time::Instant::now() + delay >= d)
        {
            return None;
        }
        pick_now(&again.pool, &again.tried, again.method).1?;
        let budget = again.pool.budget.as_ref()?;
        if !budget.withdraw() {
            tracing::debug!("retry budget spent: not retrying");
            crate::observe::budget_exhausted(&again.pool);
            return None;
        }
        again.attempts += 1;
        self.obs.retrying(code, delay);
        Some(delay)
    }

    /// Waits `delay`, then sends the call again; `last` is what the caller gets if, by then,
    /// there is nowhere to send it.
    fn backoff(&mut self, delay: Duration, last: CallResult) {
        let sleep = {
            let pool = &self.again.as_ref().expect("retrying").pool;
            let _rt = pool.policy.runtime.enter();
            Box::pin(tokio::time::sleep(delay))
        };
        self.unreachable = None;
        self.state = CallState::Backoff(Box::new(Backoff { sleep, last }));
    }

    /// The response head arrived.
    fn answered(&mut self, mut resp: http::Response<Body>) -> Option<CallResult> {
        let mut guard = self.guard.take().expect("guard held until the response");
        self.unreachable = None;
        guard.headers_received();
        if self
            .deadline
            .as_deref()
            .is_some_and(crate::deadline::passed)
        {
            // The deadline passed as the answer came (often the server's own timer answering
            // CANCELLED "Timeout expired"): report it as what it is. The instance answered.
            guard.finish(guard.deadline_outcome());
            self.state = CallState::Failed(None);
            self.obs.finish(tonic::Code::DeadlineExceeded);
            return Some(Err(deadline_exceeded().into()));
        }
        health::connected(guard.instance());
        resp.extensions_mut()
            .insert(ServedBy::new(guard.instance().target.name.clone()));
        if let Some((code, outcome)) = head_status(&resp) {
            // A trailers-only response carries its load report in its head.
            crate::orca::take_report(guard.instance(), resp.headers_mut());
            self.obs.head(code);
            guard.finish(outcome);
            if code != tonic::Code::Ok {
                self.tried(guard.instance());
                let pushback = crate::pushback::read(resp.headers());
                if let Some(delay) = self.retry_after(code, pushback) {
                    tracing::debug!(?code, ?delay, addr = %guard.instance().target.name, "retrying call");
                    drop(guard);
                    self.backoff(delay, Ok(resp));
                    return None;
                }
            }
        }
        if let Some(again) = self.again.take() {
            // The response has started: no other attempt will be made.
            again.replay.commit();
        }
        let deadline = self.deadline.take();
        self.state = CallState::Failed(None);
        Some(Ok(resp.map(|body| {
            Body::new(GuardedBody::new(
                body,
                guard,
                deadline,
                std::mem::take(&mut self.obs),
            ))
        })))
    }

    /// The attempt failed before a response head.
    fn errored(&mut self, e: BoxError) -> Option<CallResult> {
        let kind = classify_error(&*e);
        if let ErrorKind::Timeout = kind {
            return match self.fail_deadline() {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            };
        }
        let guard = self.guard.take().expect("guard held until the response");
        let inst = guard.instance().clone();
        let connect = matches!(kind, ErrorKind::Unsent { connect: true });
        // An extra connection that could not connect, or broke, says nothing of the instance.
        let extra =
            (connect || crate::error::is_transport(&*e)) && crate::conns::extra_failed(&guard, &*e);
        if connect && !extra {
            health::connect_failed(&inst, &*e);
        } else if crate::error::is_transport(&*e) && !extra {
            health::disconnected(&inst, &*e);
        }
        // The connection failed the attempt before it read any of the request's body (a
        // connect error, a connection closed or refused by a GOAWAY before the request was
        // written, a stream refused): the server cannot have seen the call, so it is sent
        // again unseen by the caller (gRPC's transparent retry) and says nothing of the
        // instance beyond its connection.
        // So is a call the server refused before processing it (a stream its GOAWAY did not
        // include, REFUSED_STREAM), if the request can be had again whole.
        let unsent = matches!(kind, ErrorKind::Unsent { .. }) || crate::error::is_transport(&*e);
        let refused = crate::error::refused_by_server(&*e);
        let refused_stream = refused && crate::conns::is_refused_stream(&*e);
        let transparent = self.again.as_ref().is_some_and(|a| {
            a.pool.replay
                && ((unsent && a.replay.unsent())
                    || (refused && a.replay.replayable() && !(refused_stream && a.refused)))
        });
        if transparent {
            let again = self.again.as_mut().expect("checked above");
            again.refused |= refused_stream;
            if (connect && !extra) || again.replays >= MAX_SAME_INSTANCE_REPLAYS {
                again.tried.push(inst.clone());
            } else {
                // The same instance may take it again, on a fresh connection.
                again.replays += 1;
            }
            if self.reroute(&e) {
                // Released without an outcome: a connect failure is recorded above.
                drop(guard);
                return None;
            }
            let (status, outcome) = if connect && !extra {
                (as_unavailable(e, &inst.target.name), Outcome::Failure)
            } else {
                (
                    not_processed(&inst.target.name, e).into(),
                    Outcome::Cancelled,
                )
            };
            self.guard = Some(guard);
            return match self.fail(outcome, status) {
                Poll::Ready(r) => Some(r),
                Poll::Pending => None,
            };
        }
        // A failure of the attempt on its instance (or, with transparent retry off, a
        // connection that could not be used): the retry policy may send it again.
        self.tried(&inst);
        // A call the server did not process says nothing against it; a broken connection
        // counts once, whatever number of calls it broke.
        let (e, outcome) = if refused || matches!(kind, ErrorKind::Unsent { connect: false }) {
            (
                not_processed(&inst.target.name, e).into(),
                Outcome::Cancelled,
            )
        } else if extra || (crate::error::is_transport(&*e) && !guard.first_to_see_break()) {
            (as_unavailable(e, &inst.target.name), Outcome::Cancelled)
        } else {
            (as_unavailable(e, &inst.target.name), Outcome::Failure)
        };
        let mut guard = guard;
        if let Some(delay) = self.retry_after(tonic::Code::Unavailable, None) {
            guard.finish(outcome);
            drop(guard);
            self.backoff(delay, Err(e));
            return None;
        }
        self.guard = Some(guard);
        match self.fail(outcome, e) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }
}

impl Future for ResponseFuture {
    type Output = CallResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let _in_span = this.obs.span().map(|s| s.clone().entered());
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                return this.fail_deadline();
            }
        }
        loop {
            if matches!(this.state, CallState::Routed { .. } | CallState::Sent(_))
                && this.moved_on(cx)
            {
                continue;
            }
            match &mut this.state {
                CallState::Failed(status) => {
                    let status = status
                        .take()
                        .unwrap_or_else(|| tonic::Status::unknown("call polled after it ended"));
                    this.obs.finish(status.code());
                    return Poll::Ready(Err(status.into()));
                }
                CallState::Discovering { wait, req, pool } => {
                    if wait.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let (pool, req) = (pool.clone(), req.take().expect("routed once"));
                    let obs = std::mem::take(&mut this.obs);
                    *this = route(&pool, req, this.deadline.take(), obs);
                    return Pin::new(this).poll(cx);
                }
                CallState::Backoff(b) => {
                    if b.sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    let CallState::Backoff(b) =
                        std::mem::replace(&mut this.state, CallState::Failed(None))
                    else {
                        unreachable!("matched above")
                    };
                    if !this.reroute(&"retry policy") {
                        // The set changed while the call waited: the caller gets the last
                        // answer as it was.
                        this.obs.ended(&b.last);
                        return Poll::Ready(b.last);
                    }
                }
                CallState::Hedged(h) => {
                    let Poll::Ready(answer) = h.poll(cx) else {
                        return Poll::Pending;
                    };
                    this.state = CallState::Failed(None);
                    let deadline = this.deadline.take();
                    let mut obs = std::mem::take(&mut this.obs);
                    return Poll::Ready(match answer {
                        Ok((resp, Some(guard))) => {
                            Ok(resp.map(|b| Body::new(GuardedBody::new(b, guard, deadline, obs))))
                        }
                        Ok((resp, None)) => {
                            let result = Ok(resp);
                            obs.ended(&result);
                            result
                        }
                        Err(e) => {
                            let result = Err(e);
                            obs.ended(&result);
                            result
                        }
                    });
                }
                CallState::Routed { channel, req } => match tower::Service::poll_ready(channel, cx)
                {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return this.fail(Outcome::Failure, e.into()),
                    Poll::Ready(Ok(())) => {
                        let req = req.take().expect("request sent once");
                        let fut = tower::Service::call(channel, req);
                        this.state = CallState::Sent(fut);
                    }
                },
                CallState::Sent(fut) => {
                    let result = match Pin::new(fut).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(resp)) => this.answered(resp),
                        Poll::Ready(Err(e)) => this.errored(e.into()),
                    };
                    if let Some(result) = result {
                        return Poll::Ready(result);
                    }
                }
            }
        }
    }
}

/// The status that a response head carries on its own, and what it says of the instance: the
/// `grpc-status` of a trailers-only response; for an answer that is not gRPC's (an HTTP error
/// from a proxy, no `grpc-status`), the code gRPC maps its HTTP status to, and a failure of the
/// instance. `None` for a response whose status comes in its trailers.
#[inline]
pub(crate) fn head_status(resp: &http::Response<Body>) -> Option<(tonic::Code, Outcome)> {
    let ended = http_body::Body::is_end_stream(resp.body());
    if resp.status() == http::StatusCode::OK && !ended {
        return None;
    }
    Some(match grpc_status(resp.headers()) {
        Some(code) => (code, health::classify_code(code)),
        None if resp.status() == http::StatusCode::OK => (tonic::Code::Unknown, Outcome::Failure),
        None => (from_http_status(resp.status()), Outcome::Failure),
    })
}

/// gRPC's mapping of an HTTP status to a code, for responses without `grpc-status`
/// (`doc/http-grpc-status-mapping.md` of grpc/grpc).
fn from_http_status(status: http::StatusCode) -> tonic::Code {
    use tonic::Code;
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// A connection that broke under a call is UNAVAILABLE (see
/// [`broken_connection`](crate::error::broken_connection)); errors that carry a status keep it.
pub(crate) fn as_unavailable(e: BoxError, addr: &str) -> BoxError {
    if sources(&*e).any(|err| err.is::<tonic::Status>()) || !is_transport(&*e) {
        return e;
    }
    let reason = format!(
        "connection to {addr} broke during the call: {}",
        crate::error::chain(&*e)
    );
    unavailable(addr, reason, Some(Arc::from(e))).into()
}

/// UNAVAILABLE for a call that the instance did not process: its connection closed before the
/// request was written (hyper reports it as canceled, which tonic would turn into CANCELLED: the
/// caller cancelled nothing), or the server refused it (GOAWAY, REFUSED_STREAM).
pub(crate) fn not_processed(addr: &str, e: BoxError) -> tonic::Status {
    let reason = format!(
        "tonic-balancer: {addr} did not process the call (its connection closed or refused it): {}",
        crate::error::chain(&*e)
    );
    unavailable(addr, reason, Some(Arc::from(e)))
}

pub(crate) enum ErrorKind {
    /// tonic's own timer (an `Endpoint::timeout` or the `grpc-timeout`) ran out.
    Timeout,
    /// The request did not go out: a connect error, or a connection that was closed before the
    /// request was written.
    Unsent {
        connect: bool,
    },
    Other,
}

pub(crate) fn classify_error(e: &(dyn std::error::Error + 'static)) -> ErrorKind {
    for err in sources(e) {
        if err.is::<tonic::TimeoutExpired>() {
            return ErrorKind::Timeout;
        }
        if err.is::<tonic::ConnectError>() {
            return ErrorKind::Unsent { connect: true };
        }
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            if h.is_canceled() || h.is_closed() {
                return ErrorKind::Unsent { connect: false };
            }
        }
    }
    ErrorKind::Other
}
