//! More than one HTTP/2 connection per instance, after gRPC's connection scaling (gRFC A105,
//! "MAX_CONCURRENT_STREAMS Connection Scaling").
//!
//! One HTTP/2 connection carries at most the server's `SETTINGS_MAX_CONCURRENT_STREAMS` calls at
//! once; past that, h2 queues the next streams inside the connection, where the pick cannot see
//! them, behind calls that may be long-lived streams. So an instance may have up to
//! [`Limits::max`] connections: its own (the tonic `Channel` it always has) and extra ones,
//! opened when every connection it has carries [`Limits::streams`] calls, and closed when they
//! have carried none for [`Limits::idle`]. The pick still sees one instance, with the total of
//! its calls in flight.
//!
//! **The limit is a setting, not the server's SETTINGS frame.** tonic's `Channel` owns its hyper
//! connection, and hyper's `SendRequest` does not expose the peer's MAX_CONCURRENT_STREAMS (only
//! hyper's `Connection` does, and tonic keeps that inside its own task); reading it would mean
//! building the HTTP/2 connections here instead of tonic, and with them TLS, the origin, the
//! user agent and every other `Endpoint` setting, which an `Endpoint` does not even let one read.
//! So each connection counts its calls against a limit the user sets
//! ([`Builder::max_streams_per_connection`](crate::Builder::max_streams_per_connection), default
//! 100, the value most servers and proxies announce, and RFC 9113's recommended minimum). A
//! server that allows more only makes an extra connection open sooner than needed; one that
//! allows fewer queues the difference inside the connection, as today.
//!
//! Each call reserves its place on a connection with one atomic add on that connection's count
//! (two calls can never both take a connection's last place), and the call's guard gives it back
//! exactly once when the call is over, with the instance's count. With one connection allowed
//! (`max_connections_per_instance(1)`) nothing of this runs: the call takes the instance's
//! channel as it always did. An extra connection is a lazy tonic `Channel`: the calls sent to it
//! while it connects wait in its buffer, so that a burst does not pile onto the full connection
//! meanwhile. When every connection is full and the cap is reached, the call goes to the least
//! busy connection, where h2 queues it (the behaviour with one connection).
//!
//! Unlike A105, whose default is one connection and which leaves idle connections to the
//! server's MAX_CONNECTION_IDLE, the default here is [`DEFAULT_MAX_CONNECTIONS`], and extra
//! connections close on the client's side once idle.
//!
//! Sources:
//! [gRFC A105](https://github.com/grpc/proposal/blob/master/A105-max_concurrent_streams-connection-scaling.md).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use tonic::transport::Channel;

use super::Instance;

/// The connections an instance may have at most, unless
/// [`Builder::max_connections_per_instance`](crate::Builder::max_connections_per_instance) says
/// otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4;

/// The calls a connection carries before another one opens, unless
/// [`Builder::max_streams_per_connection`](crate::Builder::max_streams_per_connection) says
/// otherwise: the MAX_CONCURRENT_STREAMS most servers announce.
pub const DEFAULT_STREAMS_PER_CONNECTION: usize = 100;

/// How long an extra connection stays open without calls, unless
/// [`Builder::connection_idle_timeout`](crate::Builder::connection_idle_timeout) says otherwise.
pub const DEFAULT_CONNECTION_IDLE: Duration = Duration::from_secs(30);

/// The largest [`Limits::max`] accepted: each instance keeps one slot per connection.
pub(crate) const MAX_CONNECTIONS_CAP: usize = 64;

/// Added to a connection's count while it is being closed: every reservation fails meanwhile.
const CLOSING: usize = usize::MAX / 2;

/// The connection a call counts against, as [`channel`] chose it: kept with the call, and
/// handed back to [`release`] when it is over.
#[derive(Debug, Default)]
pub(crate) struct HeldConnection {
    /// Which: [`UNCOUNTED`], [`FIRST`], or extra slot `k` as `k + 2`.
    pub(crate) conn: u8,
    /// That connection, if it is one of the instance's extra ones: what the call's failure
    /// closes, if it is still the one in its slot.
    pub(crate) extra: Option<Arc<Channel>>,
}

/// [`HeldConnection::conn`] of a call that holds no connection count (one connection allowed).
pub(crate) const UNCOUNTED: u8 = 0;
/// [`HeldConnection::conn`] of a call on the instance's own connection; extra slot `k` is `k + 2`.
pub(crate) const FIRST: u8 = 1;

/// The connection settings of a channel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections per instance, at least 1.
    pub(crate) max: usize,
    /// Calls per connection before another one opens, at least 1.
    pub(crate) streams: usize,
    /// How long an extra connection stays open without calls.
    pub(crate) idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max: DEFAULT_MAX_CONNECTIONS,
            streams: DEFAULT_STREAMS_PER_CONNECTION,
            idle: DEFAULT_CONNECTION_IDLE,
        }
    }
}

impl Limits {
    /// Refuses limits out of range, naming the setting.
    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        use crate::checks::Checks;
        Checks::of("max_connections_per_instance").between(self.max, 1, MAX_CONNECTIONS_CAP)?;
        Checks::of("max_streams_per_connection").at_least_one(self.streams as u64)?;
        Checks::of("connection_idle_timeout").above_zero(self.idle)
    }
}

/// An instance's extra connections (none with one connection allowed).
pub(crate) struct ExtraConnections {
    slots: Box<[ExtraConn]>,
    /// Extra connections open now.
    open: AtomicUsize,
    /// Whether the task that closes idle connections runs.
    sweeping: AtomicBool,
    /// No extra connection opens before this (nanoseconds since the channel's epoch): set when one
    /// failed to connect, with the channel's connection backoff.
    hold_until: AtomicU64,
    /// Extra connections that failed to connect since one last carried a call.
    failures: AtomicU32,
}

/// One extra connection's place.
struct ExtraConn {
    /// Calls on it (plus [`CLOSING`] while it closes).
    in_flight: AtomicUsize,
    channel: ArcSwapOption<Channel>,
    /// When its last call ended (or it opened), in nanoseconds since the channel's epoch.
    idle_since: AtomicU64,
}

impl ExtraConnections {
    /// The extra slots for `settings`, if more than one connection is allowed.
    pub(crate) fn new(settings: &Limits) -> Option<Box<ExtraConnections>> {
        (settings.max > 1).then(|| {
            Box::new(ExtraConnections {
                slots: (1..settings.max)
                    .map(|_| ExtraConn {
                        in_flight: AtomicUsize::new(0),
                        channel: ArcSwapOption::empty(),
                        idle_since: AtomicU64::new(0),
                    })
                    .collect(),
                open: AtomicUsize::new(0),
                sweeping: AtomicBool::new(false),
                hold_until: AtomicU64::new(0),
                failures: AtomicU32::new(0),
            })
        })
    }

    /// Extra connections open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// The channel for a call just routed to `inst`: the instance's own connection if it has room,
/// else an extra one with room, opened if need be. `held` records the connection the call
/// counts against. `avoid` names a connection not to use if another will do
/// (one that just refused the call's stream; [`UNCOUNTED`]: none).
#[inline]
pub(crate) fn channel(inst: &Arc<Instance>, held: &mut HeldConnection, avoid: u8) -> Channel {
    let Some(extra) = inst.extra.as_deref() else {
        return inst.channel.clone();
    };
    let limit = inst.ctx.conns.streams;
    if avoid != FIRST {
        if inst.conn_in_flight.fetch_add(1, Ordering::AcqRel) < limit {
            held.conn = FIRST;
            return inst.channel.clone();
        }
        inst.conn_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
    spill(inst, extra, limit, held, avoid)
}

/// The instance's own connection is full (or to be avoided): an extra one.
#[cold]
#[inline(never)]
fn spill(
    inst: &Arc<Instance>,
    extra: &ExtraConnections,
    limit: usize,
    held: &mut HeldConnection,
    avoid: u8,
) -> Channel {
    // Each round either finds room, or opens a connection (at most one per free slot), or
    // finds every slot full.
    for _ in 0..=extra.slots.len() {
        let mut free = None;
        for (k, slot) in extra.slots.iter().enumerate() {
            if k as u8 + 2 == avoid {
                continue;
            }
            let Some(ch) = slot.channel.load_full() else {
                free.get_or_insert(k);
                continue;
            };
            if slot.in_flight.fetch_add(1, Ordering::AcqRel) < limit {
                // Still the connection it counted on (not closed and replaced meanwhile)?
                let now = slot.channel.load();
                if (*now).as_ref().is_some_and(|n| Arc::ptr_eq(n, &ch)) {
                    held.conn = k as u8 + 2;
                    let channel = (*ch).clone();
                    held.extra = Some(ch);
                    return channel;
                }
            }
            release_slot(inst, extra, k);
        }
        let Some(k) = free else { break };
        if inst.ctx.now_ns() < extra.hold_until.load(Ordering::SeqCst) {
            // One failed to connect a moment ago: no other before its backoff is over.
            break;
        }
        open(inst, extra, k);
    }
    // Every connection is full and the cap is reached: the least busy one, where the call
    // waits for a stream as it would with one connection.
    let mut best = (inst.conn_in_flight.load(Ordering::Relaxed), None);
    for (k, slot) in extra.slots.iter().enumerate() {
        let n = slot.in_flight.load(Ordering::Relaxed);
        if n < best.0 && slot.channel.load().is_some() {
            best = (n, Some(k));
        }
    }
    if let Some(k) = best.1 {
        let slot = &extra.slots[k];
        slot.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Some(ch) = slot.channel.load_full() {
            held.conn = k as u8 + 2;
            let channel = (*ch).clone();
            held.extra = Some(ch);
            return channel;
        }
        release_slot(inst, extra, k);
    }
    inst.conn_in_flight.fetch_add(1, Ordering::AcqRel);
    held.conn = FIRST;
    inst.channel.clone()
}

/// Opens an extra connection in free slot `k` (unless another call did meanwhile).
fn open(inst: &Arc<Instance>, extra: &ExtraConnections, k: usize) {
    let channel = {
        let _rt = inst.ctx.runtime.enter();
        Arc::new(inst.target.connect_lazy())
    };
    let slot = &extra.slots[k];
    slot.idle_since.store(inst.ctx.now_ns(), Ordering::Relaxed);
    let prev = slot
        .channel
        .compare_and_swap(&None::<Arc<Channel>>, Some(channel));
    if prev.is_some() {
        // Another call opened it first; this channel never connected.
        return;
    }
    let open = extra.open.fetch_add(1, Ordering::SeqCst) + 2;
    tracing::debug!(server.address = %inst.target.name, connections = open, "connection opened: the others are at their stream limit");
    if !extra.sweeping.swap(true, Ordering::SeqCst) {
        let weak = Arc::downgrade(inst);
        inst.spawn(sweep(weak, inst.ctx.conns.idle));
    }
}

/// The connection `held` of a call to `inst` failed (could not connect, or broke): if it was an extra
/// connection, it is dropped (if it is still the one in its slot: a call that was queued on a
/// connection dropped already must not close the one that took its place), no other opens
/// before the channel's connection backoff has passed, and `true` says so. The instance keeps
/// its state (gRFC A105: a connection beyond the first that fails leaves the instance READY):
/// its own connection is not this one, and a server that turns away connections beyond some
/// number of its own still serves those it has; a server that is gone breaks the instance's own
/// connection too. False for a call on the instance's own connection, whose failure is the
/// instance's.
pub(crate) fn extra_failed(
    inst: &Instance,
    held: &HeldConnection,
    error: &dyn std::error::Error,
) -> bool {
    let (Some(extra), Some(k), Some(mine)) = (
        inst.extra.as_deref(),
        extra_slot(held.conn),
        held.extra.as_ref(),
    ) else {
        return false;
    };
    // The calls queued on it fail together: the first of them closes it and sets the backoff.
    let slot = &extra.slots[k];
    let current = slot.channel.load();
    if !(*current).as_ref().is_some_and(|c| Arc::ptr_eq(c, mine)) {
        // Closed already (and its slot maybe taken by a new connection): nothing to do.
        return true;
    }
    drop(current);
    // The hold first, then the slot freed: a call that finds the slot free finds the hold.
    let failures = extra.failures.load(Ordering::Relaxed);
    let wait = inst.ctx.backoff.delay(failures);
    extra.hold_until.fetch_max(
        inst.ctx.now_ns().saturating_add(crate::time::nanos(wait)),
        Ordering::SeqCst,
    );
    let prev = slot.channel.compare_and_swap(mine, None::<Arc<Channel>>);
    if (*prev).as_ref().is_some_and(|p| Arc::ptr_eq(p, mine)) {
        extra.open.fetch_sub(1, Ordering::Relaxed);
        extra.failures.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(server.address = %inst.target.name, error = %error, retry_in = ?wait, "extra connection failed; the instance stays ready on its own");
    }
    true
}

/// A call on connection `conn` got its response head: an extra connection that carries calls
/// ends the backoff of those that failed before it.
#[inline]
pub(crate) fn answered(inst: &Instance, conn: u8) {
    if extra_slot(conn).is_some() {
        if let Some(extra) = inst.extra.as_deref() {
            if extra.failures.load(Ordering::Relaxed) != 0 {
                extra.failures.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// The extra slot a guard's `conn` names, if any.
fn extra_slot(conn: u8) -> Option<usize> {
    (conn > FIRST).then(|| usize::from(conn - 2))
}

/// A call on connection `conn` (a guard's) is over.
#[inline]
pub(crate) fn release(inst: &Instance, conn: u8) {
    if conn == FIRST {
        inst.conn_in_flight.fetch_sub(1, Ordering::AcqRel);
    } else if let Some(extra) = inst.extra.as_deref() {
        release_slot(inst, extra, usize::from(conn - 2));
    }
}

fn release_slot(inst: &Instance, extra: &ExtraConnections, k: usize) {
    let slot = &extra.slots[k];
    if slot.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
        slot.idle_since.store(inst.ctx.now_ns(), Ordering::Relaxed);
    }
}

/// Closes the extra connections that carried no call for `idle`; ends when none is open (the
/// next one to open starts it again) or the instance is gone.
async fn sweep(inst: Weak<Instance>, idle: Duration) {
    let idle_ns = crate::time::nanos(idle);
    let tick = (idle / 4).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(tick).await;
        let Some(inst) = inst.upgrade() else { return };
        let Some(extra) = inst.extra.as_deref() else {
            return;
        };
        for (k, slot) in extra.slots.iter().enumerate() {
            if slot.in_flight.load(Ordering::Acquire) != 0 || slot.channel.load().is_none() {
                continue;
            }
            let now = inst.ctx.now_ns();
            if now.saturating_sub(slot.idle_since.load(Ordering::Relaxed)) < idle_ns {
                continue;
            }
            // No call may take it while it closes.
            if slot
                .in_flight
                .compare_exchange(0, CLOSING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // A call may have come and gone between the two looks.
            if now.saturating_sub(slot.idle_since.load(Ordering::Relaxed)) >= idle_ns
                && slot.channel.swap(None).is_some()
            {
                let left = extra.open.fetch_sub(1, Ordering::Relaxed);
                tracing::debug!(server.address = %inst.target.name, connections = left, slot = k, "idle connection closed");
            }
            slot.in_flight.fetch_sub(CLOSING, Ordering::AcqRel);
        }
        if extra.open.load(Ordering::Relaxed) == 0 {
            extra.sweeping.store(false, Ordering::SeqCst);
            // A connection that opened as this task decided to end found it running.
            if extra.open.load(Ordering::SeqCst) == 0 || extra.sweeping.swap(true, Ordering::SeqCst)
            {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's place on a connection, given back when it is dropped (as a call's guard does).
    struct Taken {
        inst: Arc<Instance>,
        held: HeldConnection,
    }

    impl Drop for Taken {
        fn drop(&mut self) {
            if self.held.conn != UNCOUNTED {
                release(&self.inst, self.held.conn);
            }
        }
    }

    /// A call queued on an extra connection that was dropped already fails late: that failure
    /// must not close the connection that took the slot since.
    #[tokio::test]
    async fn a_late_failure_closes_only_its_own_connection() {
        let ch = crate::BalancedChannel::builder()
            .uri("http://127.0.0.1:1")
            .max_connections_per_instance(2)
            .max_streams_per_connection(2)
            .build()
            .unwrap();
        let inst = ch.shared.snapshot()[0].clone();
        let extra = inst.extra.as_deref().unwrap();
        let take = || {
            let mut held = HeldConnection::default();
            let _ = channel(&inst, &mut held, UNCOUNTED);
            Taken {
                inst: inst.clone(),
                held,
            }
        };
        // Two calls fill the instance's own connection; two more share the first extra one.
        let own = [take(), take()];
        assert!(own.iter().all(|g| g.held.conn == FIRST));
        let (first, late) = (take(), take());
        assert!(first.held.conn > FIRST && late.held.conn == first.held.conn);
        assert_eq!(extra.open(), 1);
        // It fails for the first call: dropped, with the backoff armed.
        let e = crate::error::Message("connection refused".into());
        assert!(extra_failed(&inst, &first.held, &e));
        assert_eq!(extra.open(), 0);
        drop(first);
        // The backoff over, the slot takes a new connection.
        extra.hold_until.store(0, Ordering::Relaxed);
        let next = take();
        assert_eq!(
            next.held.conn, late.held.conn,
            "the new connection takes the same slot"
        );
        assert_eq!(extra.open(), 1);
        // The late failure of the call queued on the old connection leaves the new one.
        assert!(
            extra_failed(&inst, &late.held, &e),
            "still an extra connection's failure"
        );
        assert_eq!(
            extra.open(),
            1,
            "the late failure closed the new connection"
        );
        let slot = &extra.slots[usize::from(next.held.conn - 2)];
        assert!(slot
            .channel
            .load()
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, next.held.extra.as_ref().unwrap())));
    }
}
