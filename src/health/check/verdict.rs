//! What the health checks last said of an instance ([`Verdict`]), and the instance's state
//! following it: only `SERVING` keeps an instance in service ([gRFC A17]); any other answer, a
//! stream that ended, or a first answer late takes it out, with a warning that says why.
//!
//! [gRFC A17]: https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md

use std::time::Duration;

use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;

use super::WATCH;
use crate::instance::{Instance, State};

/// What the health checks last said of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing yet (a new instance, or a new connection after one could not be opened).
    Pending,
    /// The last answer was `SERVING`, or the server has no health service.
    In,
    /// The last answer was not `SERVING`, the stream ended, or its first answer was late.
    Out,
}

/// Only `SERVING` is healthy (A17): `NOT_SERVING`, `UNKNOWN`, `SERVICE_UNKNOWN` and any value
/// this client does not know are not.
pub(super) fn verdict_of(status: i32) -> Verdict {
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

/// Why an instance is out, for the logs.
pub(super) enum OutReason<'a> {
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

/// The server answered (`status`; `None` for UNIMPLEMENTED): the instance's state follows.
pub(super) fn answered(inst: &Instance, verdict: Verdict, status: Option<i32>) {
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
        Verdict::Out => out(inst, OutReason::Answer(status.unwrap_or_default())),
        Verdict::Pending => {}
    }
}

/// The instance's state changed (or it may be watched again): it follows the last verdict.
/// Back in service with a verdict that says out, it goes out again; a verdict that says in
/// brings it back (taken back into the set after its removal, with `SERVING` the last answer).
pub(super) fn follow(inst: &Instance, verdict: Verdict) {
    match verdict {
        Verdict::Out => out(inst, OutReason::Still),
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
pub(super) fn out(inst: &Instance, why: OutReason<'_>) {
    let prev = inst.state();
    if !prev.is_usable() || !inst.transition(prev, State::Unhealthy) {
        return;
    }
    let name = &inst.target.name;
    let msg = "health check failed: instance out until it answers SERVING";
    match why {
        OutReason::Answer(status) => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, health.status = %status_name(status), "{msg}");
        }
        OutReason::Ended(status) => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, rpc.grpc.status_code = status.code() as i32, error = %status.message(), "{msg} (stream ended)");
        }
        OutReason::Late(timeout) => {
            tracing::warn!(server.address = %name, rpc.method = WATCH, ?timeout, "{msg} (no first answer in time)");
        }
        OutReason::Still => {
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
}
