//! One instance: its address, its tonic `Channel`, its state and calls in flight, and the
//! records of the parts that watch it, embedded by value so that the pick reads them without a
//! lock: what is learned of its load (`crate::load`), its outlier-ejection record
//! (`ejection.rs`, `crate::health`'s), its latest probe answer (`crate::probe`).
//!
//! Sources:
//! [gRFC A58](https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use tonic::transport::Channel;

pub(crate) mod backoff;
pub(crate) mod conns;
pub(crate) mod context;
pub(crate) mod ejection;
pub(crate) mod events;
pub(crate) mod standing;

pub use backoff::Backoff;
pub(crate) use context::Context;

use crate::load::reported as load;
use crate::load::tie::{self, TieBreak};
use crate::load::Latency;
use crate::target::Target;
use standing::StateAndCount;

/// The health of an instance, as the channel sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Not connected yet: calls are sent to it, and the first one opens the connection.
    Connecting,
    /// Connected and answering: calls are sent to it.
    Ready,
    /// Its connection could not be opened: no calls, reconnecting in the background with
    /// backoff.
    Failing,
    /// Its calls failed too often: no calls until the ejection ends.
    Ejected,
    /// Taken out by its health check (its last status is not `SERVING`, its Watch stream
    /// ended, or its first answer is late): no calls until it says `SERVING`.
    Unhealthy,
    /// Removed from the set: no new calls; it finishes the calls it has, then closes.
    Draining,
}

impl State {
    pub(crate) const ALL: [State; 6] = [
        State::Connecting,
        State::Ready,
        State::Failing,
        State::Ejected,
        State::Unhealthy,
        State::Draining,
    ];

    fn from_u8(v: u8) -> State {
        Self::ALL[v as usize]
    }

    /// Whether the pick may send calls to an instance in this state.
    pub fn is_usable(self) -> bool {
        matches!(self, State::Connecting | State::Ready)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            State::Connecting => "connecting",
            State::Ready => "ready",
            State::Failing => "failing",
            State::Ejected => "ejected",
            State::Unhealthy => "unhealthy",
            State::Draining => "draining",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One instance of the service.
///
/// The fields the least-pending pick reads on every call (`standing`, the tie-break's record)
/// come first and fill the first cache line; the latency estimate that the other strategies
/// read comes next.
#[repr(C, align(64))]
pub(crate) struct Instance {
    /// Its state and its calls in flight (this channel's), in one word (see `standing.rs`).
    pub(crate) standing: StateAndCount,
    /// The other clients' calls in flight, from its load reports (ORCA).
    pub(crate) others: load::OthersInFlight,
    /// Connection breaks seen under calls: the calls that were on a connection when it broke
    /// count it against the instance once, not once each (see `CallGuard::first_to_see_break`).
    breaks: AtomicU32,
    /// A call waits for room on it (its stream was refused again: see `call::plan`): the next
    /// call to end wakes [`room`](Self::room). In the padding after `breaks`, on the line the
    /// guard's `-1` writes anyway.
    room_wanted: AtomicBool,
    /// The least-pending tie-break's record (see `crate::load::tie`); what the pick reads of it ends
    /// the first cache line.
    pub(crate) tie: TieBreak,
    /// The calls on its own connection (`channel`), counted only when it may have more than one
    /// connection (see `crate::conns`).
    conn_in_flight: AtomicUsize,
    /// Its latency estimates (Peak EWMA's, and its usual latency for the deadline rule).
    pub(crate) latency: Latency,
    /// What it reported of its load (ORCA), as the pick reads it.
    pub(crate) reported: load::Reported,
    /// Its name (in logs, errors, `EndpointStats` and, shared rather than copied, the
    /// `ServedBy` of the responses it serves), identity, settings and how it is reached.
    pub(crate) target: Target,
    pub(crate) channel: Channel,
    /// Its extra connections, if it may have more than one (see `crate::conns`).
    pub(crate) extra: Option<Box<conns::ExtraConnections>>,
    pub(crate) ctx: Arc<Context>,
    pub(crate) started: AtomicU64,
    /// What outlier ejection keeps of it (`health` moves it; see `ejection.rs`).
    pub(crate) ejection: ejection::EjectionRecord,
    /// The state it was in when it was removed (see [`Instance::drain`]): taken back into the
    /// set, it returns to what that state says (see `health::revive`).
    drained_from: AtomicU8,
    /// Slow start: when it joined or was readmitted, in nanoseconds since the channel's epoch
    /// (0: not warming up).
    pub(crate) warm_from: AtomicU64,
    /// When a GOAWAY of its server was last logged at warning level, in nanoseconds since the
    /// channel's epoch (0: never; see `call::outcome`).
    goaway_logged: AtomicU64,
    /// Notified when a call on it ends while [`room_wanted`](Self::room_wanted): calls whose
    /// streams it refused go again.
    pub(crate) room: Arc<tokio::sync::Notify>,
    /// Notified when its connection cannot be opened: calls waiting for it move on.
    pub(crate) unreachable: Arc<tokio::sync::Notify>,
    /// Its latest probe answer (`Builder::probes`).
    pub(crate) probe: crate::probe::Record,
    /// Dropped with the instance: its background tasks (reconnect probes, readmission
    /// timer, health checks) end at once rather than when their timers next fire.
    pub(crate) closed: crate::shutdown::Closed,
}

/// Where the turns of the instances in service among `set` are (the median pass, see
/// `load::tie::Level`): an instance that joins or comes back starts there. Those out of service
/// are left out (their passes stopped where they left); `None` when none is in service.
pub(crate) fn level_in_service<'a>(
    set: impl Iterator<Item = &'a Arc<Instance>>,
) -> Option<tie::Level> {
    tie::Level::of(set.filter(|i| i.is_usable()).map(|i| &i.tie))
}

impl Instance {
    /// Creates an instance whose channel connects on its first call. Needs a tokio runtime.
    /// `connected`: a connection opened already (`Builder::connect`); the instance starts
    /// `Ready` with it.
    pub(crate) fn new(target: Target, ctx: Arc<Context>, connected: Option<Channel>) -> Instance {
        let state = match connected {
            Some(_) => State::Ready,
            None => State::Connecting,
        };
        // The connection's task is spawned on the channel's runtime, whichever thread this is.
        let channel = connected.unwrap_or_else(|| {
            let _in_runtime = ctx.runtime.enter();
            target.connect_lazy()
        });
        let now_ns = ctx.now_ns();
        Instance {
            standing: StateAndCount::new(state),
            others: Default::default(),
            conn_in_flight: AtomicUsize::new(0),
            extra: conns::ExtraConnections::new(&ctx.conns),
            breaks: AtomicU32::new(0),
            room_wanted: AtomicBool::new(false),
            tie: TieBreak::new(),
            latency: Latency::new(now_ns),
            reported: load::Reported::default(),
            target,
            channel,
            ctx,
            started: AtomicU64::new(0),
            ejection: Default::default(),
            drained_from: AtomicU8::new(State::Connecting as u8),
            warm_from: AtomicU64::new(0),
            goaway_logged: AtomicU64::new(0),
            room: Arc::new(tokio::sync::Notify::new()),
            unreachable: Arc::new(tokio::sync::Notify::new()),
            probe: Default::default(),
            closed: crate::shutdown::Closed::new(),
        }
    }

    /// Spawns a background task of this instance on the channel's runtime; it ends when the
    /// instance is dropped.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.closed.spawn(&self.ctx.runtime, task);
    }

    /// Takes the instance out of the set's rotation for good (removed): from whatever state,
    /// to `Draining`; returns the state it left. Releases its ejection slot if it was ejected,
    /// in the same atomic step that ends the ejection, so that the readmission timer (which
    /// releases the slot only by moving it out of `Ejected` itself) can never release it too.
    pub(crate) fn drain(&self) -> State {
        let from = match self.standing.swap(State::Draining) {
            State::Draining => return State::Draining,
            from => from,
        };
        self.drained_from.store(from as u8, Ordering::Release);
        if from == State::Ejected {
            self.ctx.live.ejection_over();
        }
        self.reported.state_changed(State::Draining);
        // Out of service: its weighted-round-robin weight must earn its blackout again.
        self.reported.wrr.reset();
        tracing::debug!(server.address = %self.target.name, state = "draining", previous.state = %from, "instance state changed");
        from
    }

    /// The state it was in when it was last removed.
    pub(crate) fn drained_from(&self) -> State {
        State::from_u8(self.drained_from.load(Ordering::Acquire))
    }

    /// Whether the pick may send calls to it.
    #[inline]
    pub(crate) fn is_usable(&self) -> bool {
        self.standing.is_usable()
    }

    #[inline]
    pub(crate) fn state(&self) -> State {
        self.standing.state()
    }

    /// Its calls in flight (this channel's).
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        self.standing.calls()
    }

    /// Starts this instance's slow start (if on): its share ramps up from now.
    pub(crate) fn warm_up(&self) {
        if self.ctx.slow_start_ns > 0 {
            let now = self.ctx.now_ns();
            self.ctx.load.advance_clock(now);
            self.warm_from.store(now.max(1), Ordering::Relaxed);
        }
    }

    /// For the virtual clock's tests: it starts warming up at `at` (the channel's clock).
    #[cfg(test)]
    pub(crate) fn warm_up_at(&self, at: u64) {
        self.warm_from.store(at, Ordering::Relaxed);
    }

    /// Whether a GOAWAY of its server may be logged at warning level at `now_ns` (the
    /// channel's clock): once in 10 s at most, by one call of those it catches.
    pub(crate) fn goaway_log_due(&self, now_ns: u64) -> bool {
        let last = self.goaway_logged.load(Ordering::Relaxed);
        (last == 0 || now_ns.saturating_sub(last) >= 10_000_000_000)
            && self
                .goaway_logged
                .compare_exchange(last, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Moves from `from` to `to`; false if the state was not `from`.
    pub(crate) fn transition(&self, from: State, to: State) -> bool {
        let ok = self.standing.compare_exchange(from, to).is_ok();
        if ok {
            tracing::debug!(server.address = %self.target.name, state = %to, previous.state = %from, "instance state changed");
            self.changed_service(from, to);
        }
        ok
    }

    /// Sets the state whatever it was; returns the previous one.
    pub(crate) fn set_state(&self, to: State) -> State {
        let from = self.standing.swap(to);
        if from != to {
            tracing::debug!(server.address = %self.target.name, state = %to, previous.state = %from, "instance state changed");
            self.changed_service(from, to);
        }
        from
    }

    /// A change of state: its out-of-band reports hear of it; out of service (failing,
    /// ejected, unhealthy, draining) its weighted-round-robin weight must earn its blackout
    /// again when it is back (gRFC A58); back in service, it rejoins the set's turns.
    fn changed_service(&self, from: State, to: State) {
        self.reported.state_changed(to);
        self.ctx.events.connectivity();
        if !to.is_usable() {
            self.reported.wrr.reset();
        } else if !from.is_usable() {
            self.rejoin();
        }
    }

    /// Back in service (reconnected, readmitted after an ejection, healthy again): its passes
    /// are to start where the rest of the set's turns are, as a newcomer's do (see
    /// `TieBreak::join_at`; the set is above this layer: the channel's events do it). It kept its
    /// passes while out and the others moved on: without this, every client would give it
    /// [`CREDIT`](tie::CREDIT) turns in a row at once (with 50 clients, a burst of 400 calls on
    /// an instance just back from trouble).
    fn rejoin(&self) {
        self.ctx.events.back_in_service(self);
    }

    /// For the virtual clock's tests: a call to `method`, sent at `sent` (nanoseconds since
    /// the channel's epoch), taken at `now`, counts as having taken `sample`.
    #[cfg(test)]
    pub(crate) fn sample(
        &self,
        method: tie::Method,
        sample: std::time::Duration,
        sent: u64,
        now: u64,
    ) {
        (self.ctx.load).sample(&self.tie, &self.latency, method, sample, sent, now);
    }

    /// Its weight against the heaviest instance's, in (0, 1], as the membership gives it (an
    /// xDS endpoint's share): it wins that share of the ties the heaviest wins.
    #[cfg(feature = "xds")]
    pub(crate) fn set_weight(&self, weight: f64) {
        self.tie.set_weight(weight);
    }

    /// A call is routed to it: one more started (the count in flight is `standing`'s).
    /// Returns the connection breaks seen so far, for [`first_to_see_break`](Self::first_to_see_break).
    /// Its first call ends its idleness (the channel's connectivity state may move from IDLE
    /// to CONNECTING): one branch on the count the add returns, taken once per instance.
    #[inline]
    pub(crate) fn call_started(&self) -> u32 {
        if self.started.fetch_add(1, Ordering::Relaxed) == 0 {
            self.ctx.events.connectivity();
        }
        self.breaks.load(Ordering::Relaxed)
    }

    /// A connection broke under a call routed when `seen` breaks had been seen: whether this
    /// call is the first to report that break. One break fails every call on the connection;
    /// it counts against the instance once.
    pub(crate) fn first_to_see_break(&self, seen: u32) -> bool {
        self.breaks
            .compare_exchange(
                seen,
                seen.wrapping_add(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// A call whose stream it refused again waits for room on it: the next call to end wakes
    /// [`room`](Self::room).
    pub(crate) fn want_room(&self) {
        self.room_wanted.store(true, Ordering::Release);
    }

    /// A call on it ended: if a call waits for room, it goes again now.
    #[inline]
    pub(crate) fn room_made(&self) {
        if self.room_wanted.load(Ordering::Relaxed)
            && self.room_wanted.swap(false, Ordering::AcqRel)
        {
            self.room.notify_waiters();
        }
    }

    /// A response arrived: its connection works.
    #[inline]
    pub(crate) fn connected(&self) {
        if self.state() == State::Connecting && self.transition(State::Connecting, State::Ready) {
            // A new connection may answer probes that the old one did not.
            self.probe.reconnected();
            self.ctx.events.connected(self);
        }
    }

    /// Its connection broke under a call: until a response shows a new one works, calls routed
    /// to it wait for a connection to be opened (and move on if that fails).
    pub(crate) fn disconnected(&self, error: &(dyn std::error::Error + 'static)) {
        if self.transition(State::Ready, State::Connecting) {
            self.ctx.events.disconnected(self, error);
        }
    }
}

/// An instance leaves for good: what watches it hears of it.
impl Drop for Instance {
    fn drop(&mut self) {
        self.ctx.events.dropped(self);
    }
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("uri", &self.target.name)
            .field("state", &self.state())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}
