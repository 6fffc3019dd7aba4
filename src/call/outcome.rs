//! What ended an attempt, in one place: the kinds of end, and what each says of the instance,
//! of the connection the attempt was on, and of the call.
//!
//! | end | the instance | the connection | the call |
//! | --- | --- | --- | --- |
//! | an answer (response head) | connected; its status counts (UNAVAILABLE, RESOURCE_EXHAUSTED: a failure; others: an answer) | works | delivered, or retried / hedged by its status |
//! | could not connect | failing (reconnects with backoff); for an extra connection, nothing | an extra one is dropped, with backoff | sent again at once elsewhere, unseen by the caller |
//! | closed before the request was written | connecting again (until an answer shows a new connection works) | gone | sent again at once, unseen (the same instance may take it) |
//! | found unreachable while waiting for a connection | as recorded by the failed connect | - | sent again at once, unseen |
//! | stream refused (REFUSED_STREAM, a GOAWAY of any code that did not include it) | nothing: a stream-level answer (a GOAWAY's code is logged) | keeps its state | sent again unseen, preferably on another connection; refused again, after room on the instance where the call has a deadline |
//! | stream reset by the server (RST_STREAM) | its status counts, as an answer's would | keeps its state | retried / hedged by that status |
//! | connection broke under the call | a failure (once per break), connecting again | an extra one is dropped | retried / hedged as UNAVAILABLE |
//! | another error (tonic's channel refused the call) | a failure | - | retried / hedged as UNAVAILABLE |
//! | the caller's own request body failed | nothing | keeps its state | over: the caller's error, nothing sent again |
//! | the deadline | a failure only if it held the call silent long enough | - | over: DEADLINE_EXCEEDED |
//! | the caller dropped the call | nothing (a latency sample if it held the call silent) | - | over |
//!
//! "Sent again unseen" (gRPC's transparent retry) needs the request whole: the attempt sent
//! nothing of it, or the server refused it and its recording is whole (see `replay.rs`).

use std::sync::Arc;

use tonic::Code;
use tower::BoxError;

use crate::call::attempt::CallGuard;
use crate::error::{sources, unavailable};
use crate::instance::events::{classify_code, Outcome};

/// What ended an attempt before its response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The connection could not be opened: nothing was sent.
    ConnectFailed,
    /// The connection was closed before the request was written (hyper cancelled it).
    ClosedUnsent,
    /// The instance was found unreachable while the attempt waited for its connection: nothing
    /// was sent (the connect failure is recorded by the call that saw it).
    Unreachable,
    /// The server refused the stream without processing it: REFUSED_STREAM, or a GOAWAY of any
    /// code whose last stream id is below it (RFC 9113 §6.8, §8.7).
    Refused,
    /// The server reset the stream (RST_STREAM), with the status gRPC maps its reason to.
    Reset(Code),
    /// The connection broke (or errored) while the call was on it.
    Broken,
    /// Any other error (not the connection's: tonic's channel refused the call, say).
    Other,
    /// The caller's own request body failed, or this side reset the stream: the caller's error.
    Caller,
    /// tonic's own timer (the endpoint's timeout, or the `grpc-timeout`) ran out.
    Timeout,
}

impl End {
    /// Classifies an attempt's error. `caller_failed`: the caller's body failed (its error is
    /// in the call's replay slot).
    pub(crate) fn of(e: &(dyn std::error::Error + 'static), caller_failed: bool) -> End {
        if caller_failed {
            return End::Caller;
        }
        for err in sources(e) {
            if err.is::<tonic::TimeoutExpired>() {
                return End::Timeout;
            }
            if err.is::<tonic::ConnectError>() {
                return End::ConnectFailed;
            }
            if let Some(h2) = err.downcast_ref::<h2::Error>() {
                return End::of_h2(h2);
            }
            if let Some(h) = err.downcast_ref::<hyper::Error>() {
                if h.is_canceled() || h.is_closed() {
                    return End::ClosedUnsent;
                }
            }
        }
        if crate::error::is_transport(e) {
            End::Broken
        } else {
            End::Other
        }
    }

    fn of_h2(h2: &h2::Error) -> End {
        if h2.is_reset() {
            let reason = h2.reason().unwrap_or(h2::Reason::INTERNAL_ERROR);
            return if !h2.is_remote() && !h2.is_library() {
                // Reset by this side's user: the request body failed.
                End::Caller
            } else if reason == h2::Reason::REFUSED_STREAM {
                End::Refused
            } else {
                // Reset by the server, or by h2 for what the server sent on the stream.
                End::Reset(code_of_reset(reason))
            };
        }
        if h2.is_go_away() && h2.is_remote() {
            // h2 fails a stream with the server's GOAWAY only when the server did not process
            // it, whatever the GOAWAY's code: its id is above the GOAWAY's last stream id
            // (`Streams::recv_go_away`), or it was opened after the GOAWAY came
            // (`ensure_no_conn_error`). A stream the server included and then lost to the
            // connection's close ends with an I/O error instead (`State::recv_eof`). So the
            // code (NO_ERROR for a graceful shutdown, ENHANCE_YOUR_CALM for a client that pings
            // too often, an error of the server's) says nothing of this stream: RFC 9113 §6.8.
            return End::Refused;
        }
        End::Broken
    }

    /// Whether the server cannot have processed anything of the call.
    pub(crate) fn unprocessed(self) -> bool {
        matches!(
            self,
            End::ConnectFailed | End::ClosedUnsent | End::Unreachable | End::Refused
        )
    }

    /// Records what this end says of the attempt's instance and of its connection, and
    /// returns what it counts as for the instance (the guard's outcome). `deadline`: the
    /// call's, if the channel knows it.
    pub(crate) fn settle(
        self,
        guard: &CallGuard,
        e: &(dyn std::error::Error + 'static),
        deadline: Option<tokio::time::Instant>,
    ) -> Outcome {
        let inst = guard.instance();
        match self {
            End::ConnectFailed => {
                // An extra connection that could not connect says nothing of the instance.
                if !crate::instance::conns::extra_failed(guard.instance(), &guard.held, e) {
                    inst.ctx.events.connect_failed(inst, e);
                }
                Outcome::Neutral
            }
            End::ClosedUnsent => {
                if !crate::instance::conns::extra_failed(guard.instance(), &guard.held, e) {
                    inst.disconnected(e);
                }
                Outcome::Neutral
            }
            End::Broken => {
                if crate::instance::conns::extra_failed(guard.instance(), &guard.held, e) {
                    return Outcome::Neutral;
                }
                inst.disconnected(e);
                // A broken connection counts once, whatever number of calls it broke.
                if guard.first_to_see_break() {
                    Outcome::Failure
                } else {
                    Outcome::Neutral
                }
            }
            End::Reset(code) => classify_code(code),
            End::Other => Outcome::Failure,
            End::Refused => {
                log_go_away(inst, e);
                Outcome::Neutral
            }
            End::Unreachable | End::Caller => Outcome::Neutral,
            End::Timeout => guard.deadline_outcome(deadline),
        }
    }

    /// The status the caller gets if this end is the call's last word. `e` is the attempt's
    /// error; `addr` its instance.
    pub(crate) fn status(self, addr: &str, e: BoxError, caller: Option<tonic::Status>) -> BoxError {
        match self {
            End::Caller => match caller {
                Some(status) => status.into(),
                None => {
                    let reason = format!(
                        "tonic-balancer: the call's request could not be sent: {}",
                        crate::error::chain(&*e)
                    );
                    let mut status = tonic::Status::new(Code::Internal, reason);
                    status.set_source(Arc::from(e));
                    status.into()
                }
            },
            End::Timeout => crate::error::deadline_exceeded().into(),
            End::ConnectFailed => as_unavailable(e, addr, "could not be opened"),
            End::ClosedUnsent | End::Unreachable | End::Refused => not_processed(addr, e).into(),
            End::Reset(code) => {
                let reason = format!(
                    "tonic-balancer: {addr} reset the call's stream: {}",
                    crate::error::chain(&*e)
                );
                let mut status = tonic::Status::new(code, reason);
                status.set_source(Arc::from(e));
                status.into()
            }
            End::Broken | End::Other => as_unavailable(e, addr, "broke during the call"),
        }
    }

    /// The status code this end counts as for the retry and hedging policies.
    pub(crate) fn code(self) -> Code {
        match self {
            End::Reset(code) => code,
            End::Timeout => Code::DeadlineExceeded,
            End::Caller => Code::Internal,
            _ => Code::Unavailable,
        }
    }
}

/// Says what a GOAWAY that refused a stream of `inst` means, once per instance every 10 s (a
/// GOAWAY refuses the streams in flight above its last id all at once): its code decides only
/// what is logged. ENHANCE_YOUR_CALM is how grpc-go, grpc-java and C-core servers close the
/// connection of a client whose keep-alive pings come more often than their policy allows
/// (grpc-go's `keepalive.EnforcementPolicy`, 5 minutes by default); the channel's pings are
/// the `Endpoint`'s `http2_keep_alive_interval`.
#[cold]
fn log_go_away(inst: &crate::instance::Instance, e: &(dyn std::error::Error + 'static)) {
    let Some(reason) = sources(e)
        .filter_map(|err| err.downcast_ref::<h2::Error>())
        .find_map(|h2| h2.is_go_away().then(|| h2.reason()).flatten())
    else {
        return;
    };
    let quiet = reason == h2::Reason::NO_ERROR || !inst.goaway_log_due(inst.ctx.now_ns());
    let name = &inst.target.name;
    if quiet {
        tracing::debug!(server.address = %name, reason = %reason, "GOAWAY: the call is sent again");
    } else if reason == h2::Reason::ENHANCE_YOUR_CALM {
        tracing::warn!(server.address = %name, reason = %reason, "the server closed a connection because it was pinged too often (GOAWAY ENHANCE_YOUR_CALM): set the Endpoint's http2_keep_alive_interval to at least the server's keepalive enforcement (grpc-go: 5 minutes by default); the calls it refused are sent again");
    } else {
        tracing::warn!(server.address = %name, reason = %reason, "the server closed a connection with an error (GOAWAY); the calls it refused are sent again");
    }
}

/// The gRPC status of an HTTP/2 RST_STREAM reason (gRPC's PROTOCOL-HTTP2.md).
fn code_of_reset(reason: h2::Reason) -> Code {
    match reason {
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Internal,
    }
}

/// A connection that could not be opened or broke under a call (`what` says which) is
/// UNAVAILABLE (see [`broken_connection`](crate::error::broken_connection)); errors that carry a
/// status keep it.
pub(crate) fn as_unavailable(e: BoxError, addr: &str, what: &str) -> BoxError {
    if sources(&*e).any(|err| err.is::<tonic::Status>()) || !crate::error::is_transport(&*e) {
        return e;
    }
    let reason = format!("connection to {addr} {what}: {}", crate::error::chain(&*e));
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
