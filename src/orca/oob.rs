//! Out-of-band load reports ([gRFC A51]): one `OpenRcaService/StreamCoreMetrics` stream per
//! instance, on its own connection, whose reports go where per-call reports go.
//!
//! The stream is the channel's, not a caller's: it goes straight to the instance's tonic
//! `Channel`, so it is never picked, balanced, retried, or counted in the instance's calls in
//! flight. Its lifecycle, as A51 describes it for a subchannel:
//!
//! - it opens when the instance joins (opening the connection if there is none yet) and stays
//!   open; each report is taken in as a per-call report is (see [`super::observe`]);
//! - when it breaks (the connection went, the server ended it), it is opened again after
//!   the channel's [`Backoff`](crate::Backoff), reset by every report received;
//! - a server without the service answers UNIMPLEMENTED: the instance is left alone (logged
//!   once, at INFO) until its connection is opened again (it went through `Connecting` or
//!   `Failing`, or was re-added after removal): A51 forbids asking again on the same connection;
//! - it ends when the instance is removed (draining) or dropped, and opens again if a draining
//!   instance is taken back.
//!
//! The messages are encoded by hand (see `wire`), through tonic's own gRPC framing (the
//! [`tonic::codec::Codec`] of `crate::codec`).
//!
//! [gRFC A51]: https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md

use std::sync::{Arc, Weak};
use std::time::Duration;

use tonic::{Code, Status};

use super::LoadReport;
use crate::codec::{Decode, Encode};
use crate::instance::{Instance, State};

/// The method of the out-of-band reports.
pub(crate) const PATH: &str = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics";

/// An `xds.service.orca.v3.OrcaLoadReportRequest`: the interval asked for (`None`: the
/// server's minimum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ReportRequest {
    pub(crate) interval: Option<Duration>,
}

impl Encode for ReportRequest {
    fn encode_to(&self, out: &mut Vec<u8>) {
        if let Some(d) = self.interval {
            crate::load::wire::encode_request(d, out);
        }
    }
}

impl Decode for ReportRequest {
    fn decode_from(bytes: &[u8]) -> Result<Self, Status> {
        crate::load::wire::decode_request(bytes)
            .map(|interval| ReportRequest { interval })
            .map_err(|()| Status::invalid_argument("malformed OrcaLoadReportRequest"))
    }
}

impl Encode for LoadReport {
    fn encode_to(&self, out: &mut Vec<u8>) {
        crate::load::wire::encode(self, out);
    }
}

/// A report that does not decode is skipped (`None`), as a malformed per-call report is: it
/// changes nothing, and the stream goes on.
impl Decode for Option<LoadReport> {
    fn decode_from(bytes: &[u8]) -> Result<Self, Status> {
        Ok(LoadReport::decode(bytes))
    }
}

/// Starts the out-of-band reports of `inst`, asking for one every `interval`; they end when it
/// is dropped (and pause while it drains).
pub(crate) fn spawn(inst: &Arc<Instance>, interval: Duration) {
    let events = inst.reported.events();
    inst.spawn(run(Arc::downgrade(inst), interval, events));
}

/// Why a stream ended.
enum Ended {
    /// The instance is draining or gone.
    Removed,
    /// The server does not implement the service.
    Unimplemented,
    /// Broken (any other status, or the end of the stream); `reports` received on it.
    Broken { why: Status, reports: u64 },
}

async fn run(
    weak: Weak<Instance>,
    interval: Duration,
    mut events: tokio::sync::watch::Receiver<()>,
) {
    let mut attempt = 0u32;
    // The instance's count of reconnections when its server said UNIMPLEMENTED.
    let mut unimplemented_at: Option<u32> = None;
    let mut told = false;
    loop {
        // Wait until the instance may be asked: in the set, connected or connecting, and not
        // known to lack the service on this connection.
        loop {
            events.borrow_and_update();
            let Some(inst) = weak.upgrade() else { return };
            let state = inst.state();
            let blocked = matches!(state, State::Draining | State::Failing)
                || unimplemented_at == Some(inst.reported.reconnects());
            drop(inst);
            if !blocked {
                break;
            }
            if events.changed().await.is_err() {
                return;
            }
        }
        let Some(inst) = weak.upgrade() else { return };
        let reconnects = inst.reported.reconnects();
        let name = inst.target.name.clone();
        let channel = inst.channel.clone();
        drop(inst);
        match stream(&weak, channel, interval, &mut events).await {
            Ended::Removed => {
                tracing::debug!(server.address = %name, "out-of-band load reports ended: instance removed");
            }
            Ended::Unimplemented => {
                if !told {
                    told = true;
                    tracing::info!(server.address = %name, "instance does not serve out-of-band load reports (UNIMPLEMENTED); not asked again on this connection");
                }
                unimplemented_at = Some(reconnects);
                attempt = 0;
            }
            Ended::Broken { why, reports } => {
                if reports > 0 {
                    attempt = 0;
                }
                let delay = if attempt == 0 && reports > 0 {
                    Duration::ZERO
                } else {
                    let Some(inst) = weak.upgrade() else { return };
                    inst.ctx.backoff.delay(attempt)
                };
                tracing::debug!(server.address = %name, rpc.grpc.status_code = why.code() as i32, error = %why.message(), ?delay, "out-of-band load report stream broke; opening it again");
                attempt = attempt.saturating_add(1);
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One stream, until it ends or the instance is removed.
async fn stream(
    weak: &Weak<Instance>,
    channel: tonic::transport::Channel,
    interval: Duration,
    events: &mut tokio::sync::watch::Receiver<()>,
) -> Ended {
    let mut grpc = tonic::client::Grpc::new(channel);
    let open = async {
        grpc.ready()
            .await
            .map_err(|e| Status::unavailable(crate::error::chain(&e)))?;
        let request = tonic::Request::new(ReportRequest {
            interval: Some(interval),
        });
        let path = http::uri::PathAndQuery::from_static(PATH);
        grpc.server_streaming(
            request,
            path,
            crate::codec::HandCodec::<ReportRequest, Option<LoadReport>>::default(),
        )
        .await
    };
    let removed = async {
        loop {
            if events.changed().await.is_err() {
                return;
            }
            match weak.upgrade() {
                Some(inst) if inst.state() != State::Draining => {}
                _ => return,
            }
        }
    };
    let body = async {
        let mut reports = 0u64;
        let mut messages = match open.await {
            Ok(resp) => resp.into_inner(),
            Err(status) => return (status, reports),
        };
        loop {
            match messages.message().await {
                Ok(Some(report)) => {
                    let Some(inst) = weak.upgrade() else {
                        return (Status::cancelled("instance dropped"), reports);
                    };
                    reports += 1;
                    if let Some(report) = report {
                        take(&inst, report);
                    }
                }
                Ok(None) => return (Status::unavailable("the server ended the stream"), reports),
                Err(status) => return (status, reports),
            }
        }
    };
    tokio::select! {
        () = removed => Ended::Removed,
        (status, reports) = body => {
            if status.code() == Code::Unimplemented {
                Ended::Unimplemented
            } else {
                Ended::Broken { why: status, reports }
            }
        }
    }
}

/// Takes in a report received now from `inst`'s stream.
fn take(inst: &Instance, report: LoadReport) {
    let policy = &inst.ctx;
    let now = policy.now_ns();
    let own = inst.in_flight();
    tracing::trace!(server.address = %inst.target.name, own, in_flight = ?report.calls_in_flight(), "out-of-band load report");
    (policy.load).keep_report(&inst.others, &inst.reported, report, own, now);
}
