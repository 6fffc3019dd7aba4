//! One `grpc.health.v1.Health/Watch` stream ([gRFC A17]) of an instance, from its opening to
//! its end: each answer sets the verdict, and the instance's state follows it; the end says
//! why it came ([`WatchEnd`]), for the task to decide what next.
//!
//! [gRFC A17]: https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md

use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;

use tokio::sync::watch;
use tonic::codec::Streaming;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::verdict::{answered, follow, out, verdict_of, OutReason, Verdict};
use super::HealthCheck;
use crate::instance::{Instance, State};

/// Why a stream ended.
pub(super) enum WatchEnd {
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

/// A `Watch` call on its way: the response head, then its stream of answers.
type OpeningWatch = Pin<
    Box<
        dyn Future<Output = Result<tonic::Response<Streaming<HealthCheckResponse>>, Status>> + Send,
    >,
>;

/// A `Watch` call: opening, then its answers.
struct WatchCall {
    opening: Option<OpeningWatch>,
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
pub(super) async fn watch_once(
    weak: &Weak<Instance>,
    channel: Channel,
    cfg: &HealthCheck,
    events: &mut watch::Receiver<()>,
    verdict: &mut Verdict,
) -> WatchEnd {
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
                    return WatchEnd::Gone;
                }
                let Some(inst) = weak.upgrade() else { return WatchEnd::Gone };
                if inst.state() == State::Draining {
                    return WatchEnd::Draining;
                }
                follow(&inst, *verdict);
            }
            next = call.next() => {
                let Some(inst) = weak.upgrade() else { return WatchEnd::Gone };
                match next {
                    Ok(Some(answer)) => {
                        answers += 1;
                        *verdict = verdict_of(answer.status);
                        answered(&inst, *verdict, Some(answer.status));
                    }
                    Ok(None) => {
                        let status = Status::new(Code::Ok, "the server ended the stream");
                        return WatchEnd::Broken { status, answers };
                    }
                    Err(status) => return classify(status, answers),
                }
            }
            () = &mut first, if answers == 0 && !late => {
                late = true;
                let Some(inst) = weak.upgrade() else { return WatchEnd::Gone };
                *verdict = Verdict::Out;
                out(&inst, OutReason::Late(cfg.timeout));
            }
        }
    }
}

/// What a stream's failing status means.
fn classify(status: Status, answers: u64) -> WatchEnd {
    if status.code() == Code::Unimplemented {
        WatchEnd::Unimplemented
    } else if answers == 0 && crate::error::sources(&status).any(|e| e.is::<tonic::ConnectError>())
    {
        WatchEnd::Unreachable(status)
    } else {
        WatchEnd::Broken { status, answers }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// UNIMPLEMENTED turns checks off; a connection that could not be opened is the
    /// connection's business; any other end (OK included) is a broken stream.
    #[test]
    fn ends_are_told_apart() {
        assert!(matches!(
            classify(Status::unimplemented(""), 0),
            WatchEnd::Unimplemented
        ));
        assert!(matches!(
            classify(Status::unavailable("reset"), 2),
            WatchEnd::Broken { answers: 2, .. }
        ));
        assert!(matches!(
            classify(Status::new(Code::Ok, "ended"), 0),
            WatchEnd::Broken { answers: 0, .. }
        ));
    }
}
