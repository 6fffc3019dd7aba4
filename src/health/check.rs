//! Active health checks as gRPC's client-side health checking specifies them (gRFC A17,
//! "Client-Side Health Checking"), with the standard `grpc.health.v1.Health/Watch` stream
//! (tonic-health's client), over each instance's own connection.
//!
//! The stream is the channel's, not a caller's: it goes straight to the instance's tonic
//! `Channel`, so it is never picked, balanced, retried, or counted in the instance's calls in
//! flight (it does take one of the connection's streams, as A17's "Caveats" say). Its rules,
//! from A17's "Client Workflow" and the `Watch` method's contract in `health.proto`:
//!
//! - one `Watch` per instance, opened when it joins (opening its connection if there is none
//!   yet), asking about [`HealthCheck::service`];
//! - the server answers at once and again whenever the status changes; the instance is in
//!   service only while the last status is `SERVING`: any other (`NOT_SERVING`, `UNKNOWN`,
//!   `SERVICE_UNKNOWN`) takes it out ([`State::Unhealthy`]) until `SERVING` comes;
//! - the stream ending with any status but UNIMPLEMENTED (OK included: "the server ended the
//!   stream") takes the instance out too (A17's TRANSIENT_FAILURE), and the stream is opened
//!   again: at once if it had carried an answer (A17: an answer resets the backoff), else
//!   after an exponential backoff, until an answer says `SERVING`;
//! - UNIMPLEMENTED: the server has no health service. The instance counts as healthy, and is
//!   not asked again on that connection (A17: "act as if health checking is disabled"); one
//!   warning says so (A17 logs it at ERROR: a server without health checks is a choice, not a
//!   fault of this client);
//! - a new connection (the instance went through `Connecting` or `Failing`, or was taken back
//!   after its removal) gets a new stream, with a fresh backoff;
//! - checks pause while the instance drains (the stream is cancelled) and start again if it is
//!   taken back.
//!
//! Where this differs from A17, and why:
//!
//! - A17 keeps a new connection out of service until its first answer. Here an instance
//!   that joins is usable while its first answer is on its way (the option A17 mentions under
//!   "Race Conditions and Subchannel Startup"), for at most [`HealthCheck::timeout`]: the
//!   channel fails a call at once when no instance is usable rather than holding it (invariant
//!   3), so a strict rule would fail the first calls of every new channel. Once an instance has
//!   been out, it comes back only with a `SERVING` answer.
//! - A connection that cannot be opened is the connection's business, as it is without health
//!   checks: the instance is marked [`State::Failing`] and reconnected with the channel's
//!   [`Backoff`]; the stream opens again once it reconnects.
//! - A `GOAWAY` does not end the stream here (tonic's `Channel` does not show it): a stream on
//!   a connection that the server drains lasts until the server closes it, then opens again on
//!   the new one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tonic::codec::Streaming;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::instance::{Backoff, Instance, State};

/// The method, as the crate's logs name it (`rpc.method`).
const WATCH: &str = "grpc.health.v1.Health/Watch";

/// Active health checking (opt-in, see [`Builder::health_check`](crate::Builder::health_check)):
/// gRPC's client-side health checks (gRFC A17).
///
/// Each instance is watched with one `grpc.health.v1.Health/Watch` stream over its own
/// connection, asking about [`service`](Self::service). The server sends the status at once
/// and again whenever it changes; the instance gets calls only while the last status is
/// `SERVING`. Any other status takes it out ([`State::Unhealthy`]) until `SERVING` comes. So
/// does the stream ending (with an error, or with OK), which is then opened again: at once if
/// it had carried an answer, else after [`interval`](Self::interval), growing as the
/// channel's [`Backoff`] does. A server that answers UNIMPLEMENTED has no health
/// service: its instance counts as healthy and is not asked again on that connection (logged
/// once, as a warning). Checks pause while an instance drains.
///
/// A new instance is usable while its first answer is on its way, for at most
/// [`timeout`](Self::timeout) (A17 would keep it out until the answer; see the
/// `health::check` module's notes).
///
/// Built from [`HealthCheck::default`] with one setter per setting:
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::{BalancedChannel, HealthCheck};
///
/// let check = HealthCheck::default()
///     .service("helloworld.Greeter")
///     .timeout(Duration::from_secs(2));
/// let builder = BalancedChannel::builder()
///     .uris(["http://10.0.0.1:50051", "http://10.0.0.2:50051"])
///     .health_check(check);
/// # let _ = builder;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting),
/// which names `health_check` and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct HealthCheck {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) service: String,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            service: String::new(),
        }
    }
}

impl HealthCheck {
    /// The first delay before a stream that ended without an answer is opened again: above
    /// zero (default 1 s, gRPC's first backoff). Each further such end in a row waits longer,
    /// by the channel's [`Backoff`] multiplier and jitter (×1.6, ±20% by
    /// default), up to its `max` (120 s by default) or this interval if it is longer. A stream
    /// that carried an answer is opened again at once. Nothing is polled: a `Watch` stream
    /// carries every change of the status as it happens.
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// How long the first answer on a new stream may take, from when it is sent (opening the
    /// connection included): above zero (default 1 s). Without an answer by then the instance
    /// is taken out until one says `SERVING`; the stream stays open. Later answers have no
    /// deadline: the server sends one only when the status changes (a server that stops
    /// answering at all is for HTTP/2 keep-alives to find, `Endpoint::http2_keep_alive_interval`).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// The service name to ask about; empty for the server as a whole (the default).
    pub fn service(mut self, name: impl Into<String>) -> Self {
        self.service = name.into();
        self
    }

    /// The same settings with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> HealthCheck {
        self.interval = crate::time::cap(self.interval);
        self.timeout = crate::time::cap(self.timeout);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = crate::checks::Checks::of("health_check");
        c.field("interval").above_zero(self.interval)?;
        c.field("timeout").above_zero(self.timeout)
    }

    /// The backoff between streams that end without an answer: the channel's, starting at
    /// `interval`.
    fn backoff(&self, channel: &Backoff) -> Backoff {
        Backoff {
            initial: self.interval,
            max: channel.max.max(self.interval),
            ..channel.clone()
        }
    }
}

/// Starts the checks of `inst`; they pause while it drains (it may be taken back into the set)
/// and stop when it is dropped.
pub(crate) fn spawn(inst: &Arc<Instance>, cfg: HealthCheck) {
    let backoff = cfg.backoff(&inst.ctx.backoff);
    let events = inst.reported.events();
    inst.spawn(run(Arc::downgrade(inst), cfg, backoff, events));
}

/// What the health checks last said of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Nothing yet (a new instance, or a new connection after one could not be opened).
    Pending,
    /// The last answer was `SERVING`, or the server has no health service.
    In,
    /// The last answer was not `SERVING`, the stream ended, or its first answer was late.
    Out,
}

/// Only `SERVING` is healthy (A17): `NOT_SERVING`, `UNKNOWN`, `SERVICE_UNKNOWN` and any value
/// this client does not know are not.
fn verdict_of(status: i32) -> Verdict {
    if status == ServingStatus::Serving as i32 {
        Verdict::In
    } else {
        Verdict::Out
    }
}

/// A status's name for the logs.
fn status_name(status: i32) -> String {
    ServingStatus::try_from(status)
        .map(|s| s.as_str_name().to_owned())
        .unwrap_or_else(|_| format!("status {status}"))
}

/// The delays between streams (A17): exponential backoff while streams end without an answer,
/// reset by an answer.
#[derive(Debug, Default)]
struct Retry {
    /// Streams in a row that ended without an answer.
    attempt: u32,
}

impl Retry {
    /// The delay before the next stream, after one that carried `answers` answers.
    fn after(&mut self, answers: u64, backoff: &Backoff) -> Duration {
        if answers > 0 {
            self.attempt = 0;
            return Duration::ZERO;
        }
        let delay = backoff.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        delay
    }
}

/// Why a stream ended.
enum Ended {
    /// The instance is gone.
    Gone,
    /// The instance is draining.
    Draining,
    /// The server has no health service.
    Unimplemented,
    /// The connection could not be opened.
    Unreachable(Status),
    /// Any other end: a status (OK for the end of the stream) after `answers` answers.
    Broken { status: Status, answers: u64 },
}

/// Why an instance is out, for the logs.
enum Why<'a> {
    /// The server said so.
    Answer(i32),
    /// The stream ended.
    Ended(&'a Status),
    /// No first answer in time.
    Late(Duration),
    /// Back in service (readmitted, reconnected, taken back), but the last answer was not
    /// `SERVING`, or the stream that carried it ended.
    Still,
}

async fn run(
    weak: Weak<Instance>,
    cfg: HealthCheck,
    backoff: Backoff,
    mut events: watch::Receiver<()>,
) {
    let mut verdict = Verdict::Pending;
    let mut retry = Retry::default();
    // The instance's count of connections when its server answered UNIMPLEMENTED.
    let mut unimplemented_at: Option<u32> = None;
    let mut warned = false;
    loop {
        let Some((channel, conn)) = checkable(&weak, &mut events, verdict, unimplemented_at).await
        else {
            return;
        };
        if unimplemented_at.take().is_some() {
            // A new connection: ask again, afresh.
            retry = Retry::default();
        }
        let ended = watch_once(&weak, channel, &cfg, &mut events, &mut verdict).await;
        let Some(inst) = weak.upgrade() else { return };
        let name = inst.target.name.clone();
        let delay = match ended {
            Ended::Gone => return,
            Ended::Draining => {
                tracing::debug!(server.address = %name, rpc.method = WATCH, "health checks paused: instance draining");
                retry = Retry::default();
                continue;
            }
            Ended::Unimplemented => {
                if !warned {
                    warned = true;
                    tracing::warn!(
                        server.address = %name,
                        rpc.method = WATCH,
                        rpc.grpc.status_code = Code::Unimplemented as i32,
                        "the server has no health service (UNIMPLEMENTED): the instance counts as healthy, and is not checked again on this connection"
                    );
                } else {
                    tracing::debug!(server.address = %name, rpc.method = WATCH, rpc.grpc.status_code = Code::Unimplemented as i32, "no health service on this connection either");
                }
                verdict = Verdict::In;
                answered(&inst, verdict, None);
                unimplemented_at = Some(conn);
                retry = Retry::default();
                continue;
            }
            Ended::Unreachable(status) => {
                // A usable instance is the connection's business now: marked failing, it is
                // reconnected with the channel's backoff, and its next connection watched
                // afresh. An instance out already stays out.
                if inst.is_usable() {
                    verdict = Verdict::Pending;
                }
                inst.ctx.events.connect_failed(&inst, &status);
                retry.after(0, &backoff)
            }
            Ended::Broken { status, answers } => {
                verdict = Verdict::Out;
                out(&inst, Why::Ended(&status));
                let delay = retry.after(answers, &backoff);
                tracing::debug!(
                    server.address = %name,
                    rpc.method = WATCH,
                    rpc.grpc.status_code = status.code() as i32,
                    error = %status.message(),
                    answers,
                    ?delay,
                    "health check stream ended; opening it again"
                );
                delay
            }
        };
        drop(inst);
        match pause(&weak, &mut events, delay, conn, verdict).await {
            None => return,
            Some(true) => retry = Retry::default(),
            Some(false) => {}
        }
    }
}

/// Waits until `inst` may be watched: in the set, not failing, and not known to lack the health
/// service on its connection; returns its channel and its count of connections. Its state
/// follows `verdict` meanwhile. `None`: it is gone.
async fn checkable(
    weak: &Weak<Instance>,
    events: &mut watch::Receiver<()>,
    verdict: Verdict,
    unimplemented_at: Option<u32>,
) -> Option<(Channel, u32)> {
    loop {
        events.borrow_and_update();
        let inst = weak.upgrade()?;
        let state = inst.state();
        if state != State::Draining {
            follow(&inst, verdict);
        }
        let conn = inst.reported.reconnects();
        let blocked =
            matches!(state, State::Draining | State::Failing) || unimplemented_at == Some(conn);
        if !blocked {
            return Some((inst.channel.clone(), conn));
        }
        drop(inst);
        events.changed().await.ok()?;
    }
}

/// Waits `delay` before the next stream, the instance's state following `verdict` meanwhile;
/// cut short (`Some(true)`) when the instance has a new connection (its count moved from
/// `conn`). `None`: it is gone.
async fn pause(
    weak: &Weak<Instance>,
    events: &mut watch::Receiver<()>,
    delay: Duration,
    conn: u32,
    verdict: Verdict,
) -> Option<bool> {
    if delay.is_zero() {
        return Some(false);
    }
    let sleep = tokio::time::sleep_until(crate::time::after(delay));
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return Some(false),
            changed = events.changed() => {
                changed.ok()?;
                let inst = weak.upgrade()?;
                if inst.state() != State::Draining {
                    follow(&inst, verdict);
                }
                if inst.reported.reconnects() != conn {
                    return Some(true);
                }
            }
        }
    }
}

/// A `Watch` call on its way: the response head, then its stream of answers.
type Opening = Pin<
    Box<
        dyn Future<Output = Result<tonic::Response<Streaming<HealthCheckResponse>>, Status>> + Send,
    >,
>;

/// A `Watch` call: opening, then its answers.
struct WatchCall {
    opening: Option<Opening>,
    answers: Option<Streaming<HealthCheckResponse>>,
}

impl WatchCall {
    fn new(channel: Channel, service: String) -> WatchCall {
        let opening = async move {
            HealthClient::new(channel)
                .watch(HealthCheckRequest { service })
                .await
        };
        WatchCall {
            opening: Some(Box::pin(opening)),
            answers: None,
        }
    }

    /// The next answer; `Ok(None)` when the server ended the stream with OK. Cancel-safe.
    async fn next(&mut self) -> Result<Option<HealthCheckResponse>, Status> {
        if let Some(opening) = &mut self.opening {
            let response = opening.await?;
            self.opening = None;
            self.answers = Some(response.into_inner());
        }
        match &mut self.answers {
            Some(answers) => answers.message().await,
            None => Ok(None),
        }
    }
}

/// One stream, until it ends or the instance drains; the instance's state follows each answer
/// (kept in `verdict`).
async fn watch_once(
    weak: &Weak<Instance>,
    channel: Channel,
    cfg: &HealthCheck,
    events: &mut watch::Receiver<()>,
    verdict: &mut Verdict,
) -> Ended {
    let mut call = WatchCall::new(channel, cfg.service.clone());
    let first = tokio::time::sleep_until(crate::time::after(cfg.timeout));
    tokio::pin!(first);
    let mut answers = 0u64;
    let mut late = false;
    loop {
        tokio::select! {
            biased;
            changed = events.changed() => {
                if changed.is_err() {
                    return Ended::Gone;
                }
                let Some(inst) = weak.upgrade() else { return Ended::Gone };
                if inst.state() == State::Draining {
                    return Ended::Draining;
                }
                follow(&inst, *verdict);
            }
            next = call.next() => {
                let Some(inst) = weak.upgrade() else { return Ended::Gone };
                match next {
                    Ok(Some(answer)) => {
                        answers += 1;
                        *verdict = verdict_of(answer.status);
                        answered(&inst, *verdict, Some(answer.status));
                    }
                    Ok(None) => {
                        let status = Status::new(Code::Ok, "the server ended the stream");
                        return Ended::Broken { status, answers };
                    }
                    Err(status) => return classify(status, answers),
                }
            }
            () = &mut first, if answers == 0 && !late => {
                late = true;
                let Some(inst) = weak.upgrade() else { return Ended::Gone };
                *verdict = Verdict::Out;
                out(&inst, Why::Late(cfg.timeout));
            }
        }
    }
}

/// What a stream's failing status means.
fn classify(status: Status, answers: u64) -> Ended {
    if status.code() == Code::Unimplemented {
        Ended::Unimplemented
    } else if answers == 0 && crate::error::sources(&status).any(|e| e.is::<tonic::ConnectError>())
    {
        Ended::Unreachable(status)
    } else {
        Ended::Broken { status, answers }
    }
}

/// The server answered (`status`; `None` for UNIMPLEMENTED): the instance's state follows.
fn answered(inst: &Instance, verdict: Verdict, status: Option<i32>) {
    match verdict {
        Verdict::In => {
            if inst.transition(State::Unhealthy, State::Ready) {
                inst.warm_up();
                tracing::info!(server.address = %inst.target.name, rpc.method = WATCH, "health check: SERVING, instance back in service");
            } else {
                // An answer came over its connection: a connecting instance is connected.
                inst.connected();
            }
        }
        Verdict::Out => out(inst, Why::Answer(status.unwrap_or_default())),
        Verdict::Pending => {}
    }
}

/// The instance's state changed (or it may be watched again): it follows the last verdict.
/// Back in service with a verdict that says out, it goes out again; a verdict that says in
/// brings it back (taken back into the set after its removal, with `SERVING` the last answer).
fn follow(inst: &Instance, verdict: Verdict) {
    match verdict {
        Verdict::Out => out(inst, Why::Still),
        Verdict::In => {
            if inst.transition(State::Unhealthy, State::Ready) {
                inst.warm_up();
                tracing::info!(server.address = %inst.target.name, rpc.method = WATCH, "health check: SERVING, instance back in service");
            }
        }
        Verdict::Pending => {}
    }
}

/// Takes the instance out, if it is in service (an ejected or failing one is left to what
/// owns that state; its verdict takes it out when it is back).
fn out(inst: &Instance, why: Why<'_>) {
    let prev = inst.state();
    if !prev.is_usable() || !inst.transition(prev, State::Unhealthy) {
        return;
    }
    let name = &inst.target.name;
    let msg = "health check failed: instance out until it answers SERVING";
    match why {
        Why::Answer(status) => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, health.status = %status_name(status), "{msg}");
        }
        Why::Ended(status) => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, rpc.grpc.status_code = status.code() as i32, error = %status.message(), "{msg} (stream ended)");
        }
        Why::Late(timeout) => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, ?timeout, "{msg} (no first answer in time)");
        }
        Why::Still => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, "{msg} (its last check said not serving)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only SERVING is healthy: every other status, known or not, takes an instance out.
    #[test]
    fn only_serving_is_healthy() {
        assert_eq!(verdict_of(ServingStatus::Serving as i32), Verdict::In);
        for status in [
            ServingStatus::Unknown as i32,
            ServingStatus::NotServing as i32,
            ServingStatus::ServiceUnknown as i32,
            7,
            -1,
        ] {
            assert_eq!(verdict_of(status), Verdict::Out, "{status}");
        }
        assert_eq!(status_name(3), "SERVICE_UNKNOWN");
        assert_eq!(status_name(7), "status 7");
    }

    /// A17's backoff: streams that end without an answer wait longer each time, from the
    /// interval; an answer resets it, and the next stream opens at once.
    #[test]
    fn an_answer_resets_the_backoff() {
        let channel = Backoff::default().jitter(0.0);
        let backoff = HealthCheck::default()
            .interval(Duration::from_millis(100))
            .backoff(&channel);
        let mut retry = Retry::default();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        assert!((ms(retry.after(0, &backoff)) - 100.0).abs() < 1e-6);
        assert!((ms(retry.after(0, &backoff)) - 160.0).abs() < 1e-6);
        assert!((ms(retry.after(0, &backoff)) - 256.0).abs() < 1e-6);
        assert_eq!(retry.after(3, &backoff), Duration::ZERO);
        assert!((ms(retry.after(0, &backoff)) - 100.0).abs() < 1e-6);
    }

    /// The backoff is capped at the channel's max, or at the interval if that is longer.
    #[test]
    fn the_backoff_stops_growing() {
        let channel = Backoff::default().jitter(0.0).max(Duration::from_secs(2));
        let long = HealthCheck::default().interval(Duration::from_secs(5));
        let mut retry = Retry::default();
        for _ in 0..5 {
            assert_eq!(
                retry.after(0, &long.backoff(&channel)),
                Duration::from_secs(5)
            );
        }
        let short = HealthCheck::default().interval(Duration::from_secs(1));
        let mut retry = Retry::default();
        let delays: Vec<_> = (0..6)
            .map(|_| retry.after(0, &short.backoff(&channel)))
            .collect();
        assert_eq!(delays.last(), Some(&Duration::from_secs(2)), "{delays:?}");
    }

    /// Each setting is refused by name.
    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let e = HealthCheck::default()
            .interval(Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("health_check") && e.contains("interval"), "{e}");
        let e = HealthCheck::default()
            .timeout(Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("health_check") && e.contains("timeout"), "{e}");
        assert!(HealthCheck::default()
            .interval(Duration::MAX)
            .timeout(Duration::MAX)
            .capped()
            .validate()
            .is_ok());
    }

    /// UNIMPLEMENTED turns checks off; a connection that could not be opened is the
    /// connection's business; any other end (OK included) is a broken stream.
    #[test]
    fn ends_are_told_apart() {
        assert!(matches!(
            classify(Status::unimplemented(""), 0),
            Ended::Unimplemented
        ));
        assert!(matches!(
            classify(Status::unavailable("reset"), 2),
            Ended::Broken { answers: 2, .. }
        ));
        assert!(matches!(
            classify(Status::new(Code::Ok, "ended"), 0),
            Ended::Broken { answers: 0, .. }
        ));
    }
}
