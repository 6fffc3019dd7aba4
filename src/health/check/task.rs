//! The health checks of one instance, as a task: stream after stream ([gRFC A17]'s "Client
//! Workflow"), each opened once the instance may be watched, and after a stream's end the
//! delay its end asks for: none after an answer, an exponential backoff while streams end
//! without one, none and no new stream on the same connection after UNIMPLEMENTED.
//!
//! [gRFC A17]: https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::stream::{watch_once, WatchEnd};
use super::verdict::{answered, follow, out, OutReason, Verdict};
use super::{HealthCheck, WATCH};
use crate::instance::{Backoff, Instance, State};

/// Starts the checks of `inst`; they pause while it drains (it may be taken back into the set)
/// and stop when it is dropped.
pub(crate) fn spawn(inst: &Arc<Instance>, cfg: HealthCheck) {
    let backoff = cfg.backoff(&inst.ctx.backoff);
    let events = inst.reported.events();
    inst.spawn(run(Arc::downgrade(inst), cfg, backoff, events));
}

/// The delays between streams (A17): exponential backoff while streams end without an answer,
/// reset by an answer.
#[derive(Debug, Default)]
struct ReopenBackoff {
    /// Streams in a row that ended without an answer.
    attempt: u32,
}

impl ReopenBackoff {
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

/// What follows the end of a stream.
enum AfterStream {
    /// The instance is gone: the checks stop.
    Stop,
    /// The next stream, once the instance may be watched (no delay).
    WatchAgain,
    /// The next stream after this delay, cut short by a new connection.
    Wait(Duration),
}

/// What the checks of one instance carry from one stream to the next.
struct HealthWatcher {
    weak: Weak<Instance>,
    cfg: HealthCheck,
    backoff: Backoff,
    events: watch::Receiver<()>,
    verdict: Verdict,
    reopen: ReopenBackoff,
    /// The instance's count of connections when its server answered UNIMPLEMENTED.
    unimplemented_at: Option<u32>,
    /// Whether the warning that the server has no health service was logged.
    warned: bool,
}

/// The checks of one instance, until it is dropped.
async fn run(
    weak: Weak<Instance>,
    cfg: HealthCheck,
    backoff: Backoff,
    events: watch::Receiver<()>,
) {
    let mut watcher = HealthWatcher {
        weak,
        cfg,
        backoff,
        events,
        verdict: Verdict::Pending,
        reopen: ReopenBackoff::default(),
        unimplemented_at: None,
        warned: false,
    };
    while watcher.next_stream().await.is_some() {}
}

impl HealthWatcher {
    /// Waits until the instance may be watched, watches it with one stream, and waits as long
    /// as the stream's end asks before the next. `None`: the instance is gone.
    async fn next_stream(&mut self) -> Option<()> {
        let (channel, conn) = checkable(
            &self.weak,
            &mut self.events,
            self.verdict,
            self.unimplemented_at,
        )
        .await?;
        if self.unimplemented_at.take().is_some() {
            // A new connection: ask again, afresh.
            self.reopen = ReopenBackoff::default();
        }
        let ended = watch_once(
            &self.weak,
            channel,
            &self.cfg,
            &mut self.events,
            &mut self.verdict,
        )
        .await;
        let inst = self.weak.upgrade()?;
        let delay = match self.after_stream(&inst, ended, conn) {
            AfterStream::Stop => return None,
            AfterStream::WatchAgain => return Some(()),
            AfterStream::Wait(delay) => delay,
        };
        drop(inst);
        if pause(&self.weak, &mut self.events, delay, conn, self.verdict).await? {
            self.reopen = ReopenBackoff::default();
        }
        Some(())
    }

    /// What a stream's end does to the instance, and what comes next.
    fn after_stream(&mut self, inst: &Arc<Instance>, ended: WatchEnd, conn: u32) -> AfterStream {
        match ended {
            WatchEnd::Gone => AfterStream::Stop,
            WatchEnd::Draining => {
                tracing::debug!(server.address = %inst.target.name, rpc.method = WATCH, "health checks paused: instance draining");
                self.reopen = ReopenBackoff::default();
                AfterStream::WatchAgain
            }
            WatchEnd::Unimplemented => {
                self.no_health_service(inst, conn);
                AfterStream::WatchAgain
            }
            WatchEnd::Unreachable(status) => {
                // A usable instance is the connection's business now: marked failing, it is
                // reconnected with the channel's backoff, and its next connection watched
                // afresh. An instance out already stays out.
                if inst.is_usable() {
                    self.verdict = Verdict::Pending;
                }
                inst.ctx.events.connect_failed(inst, &status);
                AfterStream::Wait(self.reopen.after(0, &self.backoff))
            }
            WatchEnd::Broken { status, answers } => {
                AfterStream::Wait(self.broken(inst, &status, answers))
            }
        }
    }

    /// The server answered UNIMPLEMENTED: the instance counts as healthy and is not asked again
    /// on connection `conn` (warned once; A17 logs it at ERROR).
    fn no_health_service(&mut self, inst: &Instance, conn: u32) {
        let name = &inst.target.name;
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                server.address = %name,
                rpc.method = WATCH,
                rpc.grpc.status_code = Code::Unimplemented as i32,
                "the server has no health service (UNIMPLEMENTED): the instance counts as healthy, and is not checked again on this connection"
            );
        } else {
            tracing::debug!(server.address = %name, rpc.method = WATCH, rpc.grpc.status_code = Code::Unimplemented as i32, "no health service on this connection either");
        }
        self.verdict = Verdict::In;
        answered(inst, self.verdict, None);
        self.unimplemented_at = Some(conn);
        self.reopen = ReopenBackoff::default();
    }

    /// The stream broke (or the server ended it) after `answers` answers: the instance is out,
    /// and the next stream waits as the backoff says.
    fn broken(&mut self, inst: &Instance, status: &Status, answers: u64) -> Duration {
        self.verdict = Verdict::Out;
        out(inst, OutReason::Ended(status));
        let delay = self.reopen.after(answers, &self.backoff);
        tracing::debug!(
            server.address = %inst.target.name,
            rpc.method = WATCH,
            rpc.grpc.status_code = status.code() as i32,
            error = %status.message(),
            answers,
            ?delay,
            "health check stream ended; opening it again"
        );
        delay
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A17's backoff: streams that end without an answer wait longer each time, from the
    /// interval; an answer resets it, and the next stream opens at once.
    #[test]
    fn an_answer_resets_the_backoff() {
        let channel = Backoff::default().jitter(0.0);
        let backoff = HealthCheck::default()
            .interval(Duration::from_millis(100))
            .backoff(&channel);
        let mut retry = ReopenBackoff::default();
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
        let mut retry = ReopenBackoff::default();
        for _ in 0..5 {
            assert_eq!(
                retry.after(0, &long.backoff(&channel)),
                Duration::from_secs(5)
            );
        }
        let short = HealthCheck::default().interval(Duration::from_secs(1));
        let mut retry = ReopenBackoff::default();
        let delays: Vec<_> = (0..6)
            .map(|_| retry.after(0, &short.backoff(&channel)))
            .collect();
        assert_eq!(delays.last(), Some(&Duration::from_secs(2)), "{delays:?}");
    }
}
