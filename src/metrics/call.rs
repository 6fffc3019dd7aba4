//! The metrics of one call and of each of its attempts (gRFC A66, A96).
//!
//! Sources: [gRFC A66](https://github.com/grpc/proposal/blob/master/A66-otel-stats.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics::{Label, SharedString};
use tokio::time::Instant;

use super::framing::{CountedBody, Messages};
use super::labels::{target, Labels};
use super::names::*;
use crate::error::code_name;
use crate::instance::events::AttemptKind;

/// The metrics of one call (its attempts have their own, [`AttemptMetrics`]).
pub(crate) struct Call {
    start: Instant,
    retries: u32,
    transparent: u32,
    hedges: u32,
    delay: Duration,
    method: SharedString,
    target: SharedString,
}

impl Call {
    pub(crate) fn new(labels: &Labels, path: &str) -> Option<Call> {
        let config = labels.get()?;
        Some(Call {
            start: Instant::now(),
            retries: 0,
            transparent: 0,
            hedges: 0,
            delay: Duration::ZERO,
            method: config.method(path),
            target: config.target.clone(),
        })
    }

    fn labels(&self) -> [Label; 2] {
        [
            Label::new(LABEL_METHOD, self.method.clone()),
            Label::new(LABEL_TARGET, self.target.clone()),
        ]
    }

    fn labels_with(&self, code: tonic::Code) -> [Label; 3] {
        [
            Label::new(LABEL_METHOD, self.method.clone()),
            Label::new(LABEL_TARGET, self.target.clone()),
            Label::new(LABEL_STATUS, code_name(code)),
        ]
    }

    /// An attempt of the call starts.
    pub(crate) fn attempt(&mut self, kind: AttemptKind) -> AttemptMetrics {
        match kind {
            AttemptKind::First => {}
            AttemptKind::Transparent => self.transparent += 1,
            AttemptKind::Retry => self.retries += 1,
            AttemptKind::Hedge => self.hedges += 1,
        }
        metrics::counter!(ATTEMPT_STARTED, self.labels().iter()).increment(1);
        AttemptMetrics {
            start: Instant::now(),
            sent: Arc::new(AtomicU64::new(0)),
            rcvd: 0,
            rcvd_messages: Messages::default(),
            method: self.method.clone(),
            target: self.target.clone(),
            recorded: false,
        }
    }

    /// The call waits `delay` before its next attempt.
    pub(crate) fn retrying(&mut self, delay: Duration) {
        self.delay += delay;
    }

    pub(crate) fn finish(&mut self, code: tonic::Code) {
        let took = self.start.elapsed().as_secs_f64();
        metrics::histogram!(CALL_DURATION, self.labels_with(code).iter()).record(took);
        let labels = self.labels();
        metrics::histogram!(CALL_RETRIES, labels.iter()).record(f64::from(self.retries));
        metrics::histogram!(CALL_TRANSPARENT_RETRIES, labels.iter())
            .record(f64::from(self.transparent));
        metrics::histogram!(CALL_HEDGES, labels.iter()).record(f64::from(self.hedges));
        metrics::histogram!(CALL_RETRY_DELAY, labels.iter()).record(self.delay.as_secs_f64());
    }
}

/// The metrics of one attempt: recorded when it ends, with its status, or when it is
/// dropped before (CANCELLED: the call gave it up, or its caller did).
pub(crate) struct AttemptMetrics {
    start: Instant,
    /// Message bytes its request body yielded (written by that body, wherever its
    /// connection polls it).
    sent: Arc<AtomicU64>,
    /// Message bytes of its response, and where its frames stand.
    rcvd: u64,
    rcvd_messages: Messages,
    method: SharedString,
    target: SharedString,
    recorded: bool,
}

impl AttemptMetrics {
    /// Counts the message bytes that this attempt's request body yields.
    pub(crate) fn count_sent(&self, req: &mut http::Request<tonic::body::Body>) {
        let inner = std::mem::take(req.body_mut());
        *req.body_mut() = tonic::body::Body::new(CountedBody {
            inner,
            sent: self.sent.clone(),
            messages: Messages::default(),
        });
    }

    /// A data frame of the attempt's response body.
    #[inline]
    pub(crate) fn received(&mut self, data: &[u8]) {
        self.rcvd += self.rcvd_messages.payload(data);
    }

    /// The attempt ended with this status: recorded now (once).
    pub(crate) fn ended(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        let took = self.start.elapsed().as_secs_f64();
        let labels = [
            Label::new(LABEL_METHOD, self.method.clone()),
            Label::new(LABEL_TARGET, self.target.clone()),
            Label::new(LABEL_STATUS, code_name(code)),
        ];
        metrics::histogram!(ATTEMPT_DURATION, labels.iter()).record(took);
        let sent = self.sent.load(Ordering::Relaxed);
        metrics::histogram!(ATTEMPT_SENT_SIZE, labels.iter()).record(sent as f64);
        metrics::histogram!(ATTEMPT_RCVD_SIZE, labels.iter()).record(self.rcvd as f64);
    }
}

impl Drop for AttemptMetrics {
    fn drop(&mut self) {
        self.ended(tonic::Code::Cancelled);
    }
}

pub(crate) fn refused(call: Option<&Call>) {
    if let Some(call) = call {
        metrics::counter!(CALL_REFUSED, call.labels().iter()).increment(1);
    }
}

pub(crate) fn budget_exhausted(labels: &Labels) {
    if let Some(target) = target(labels) {
        metrics::counter!(RETRY_BUDGET_EXHAUSTED, LABEL_TARGET => target).increment(1);
    }
}
