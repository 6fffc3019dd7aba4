//! The counters of what happens to a channel's instances and set: connections (gRFC A94),
//! outlier ejection (A91), discovery and membership.
//!
//! Sources:
//! [gRFC A94](https://github.com/grpc/proposal/blob/master/A94-subchannel-otel-metrics.md).

use metrics::Label;

use super::labels::{instance_labels, target, Labels};
use super::names::*;
use crate::instance::Instance;

/// The reason label of an ejection's `why`.
fn reason(why: &'static str) -> &'static str {
    match why {
        // The interval rules' (`health::sweep`).
        "low success rate" => "success_rate",
        "high failure percentage" => "failure_percentage",
        "failed on probation" => "probation",
        _ => "consecutive_failures",
    }
}

/// A91's counters of the outliers an interval rule found (`detected`) and ejected
/// (`enforced`), for the rule of `reason`.
fn interval_rule(reason: &str, labels: &[Label], enforced: bool) {
    let (detected_name, enforced_name) = match reason {
        "success_rate" => (
            EJECTIONS_DETECTED_SUCCESS_RATE,
            EJECTIONS_ENFORCED_SUCCESS_RATE,
        ),
        "failure_percentage" => (
            EJECTIONS_DETECTED_FAILURE_PERCENTAGE,
            EJECTIONS_ENFORCED_FAILURE_PERCENTAGE,
        ),
        _ => return,
    };
    if enforced {
        metrics::counter!(enforced_name, labels.iter()).increment(1);
    }
    metrics::counter!(detected_name, labels.iter()).increment(1);
}

pub(crate) fn ejection(labels: &Labels, inst: &Instance, why: &'static str, enforced: bool) {
    let Some(mut labels) = instance_labels(labels, inst) else {
        return;
    };
    let reason = reason(why);
    interval_rule(reason, &labels, enforced);
    labels.push(Label::new(LABEL_EJECTION_REASON, reason));
    if enforced {
        metrics::counter!(EJECTIONS_ENFORCED, labels).increment(1);
    } else {
        metrics::counter!(EJECTIONS_OVERFLOW, labels).increment(1);
    }
}

/// An interval rule found `inst` an outlier and its enforcement percentage's draw kept it in.
pub(crate) fn outlier_detected(labels: &Labels, inst: &Instance, why: &'static str) {
    if let Some(labels) = instance_labels(labels, inst) {
        interval_rule(reason(why), &labels, false);
    }
}

pub(crate) fn discovery_answer(labels: &Labels, failed: bool) {
    let Some(target) = target(labels) else { return };
    metrics::counter!(DISCOVERY_LOOKUPS, LABEL_TARGET => target.clone()).increment(1);
    if failed {
        metrics::counter!(DISCOVERY_FAILURES, LABEL_TARGET => target).increment(1);
    }
}

pub(crate) fn membership(labels: &Labels, added: usize, removed: usize) {
    let Some(target) = target(labels) else { return };
    metrics::counter!(INSTANCES_ADDED, LABEL_TARGET => target.clone()).increment(added as u64);
    metrics::counter!(INSTANCES_REMOVED, LABEL_TARGET => target).increment(removed as u64);
}

pub(crate) fn connection_succeeded(labels: &Labels, inst: &Instance) {
    if let Some(labels) = instance_labels(labels, inst) {
        metrics::counter!(CONNECTION_ATTEMPTS_SUCCEEDED, labels).increment(1);
    }
}

pub(crate) fn connection_failed(labels: &Labels, inst: &Instance) {
    if let Some(labels) = instance_labels(labels, inst) {
        metrics::counter!(CONNECTION_ATTEMPTS_FAILED, labels).increment(1);
    }
}

pub(crate) fn disconnected(
    labels: &Labels,
    inst: &Instance,
    error: &(dyn std::error::Error + 'static),
) {
    if let Some(mut labels) = instance_labels(labels, inst) {
        labels.push(Label::new(LABEL_DISCONNECT_ERROR, disconnect_error(error)));
        metrics::counter!(DISCONNECTIONS, labels).increment(1);
    }
}

/// A94's `grpc.disconnect_error` for the error that broke a connection: the first reason
/// found in its chain.
fn disconnect_error(error: &(dyn std::error::Error + 'static)) -> &'static str {
    for err in crate::error::sources(error) {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            if h2.is_go_away() {
                return goaway(h2.reason().map_or(u32::MAX, u32::from));
            }
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionReset => "connection reset",
                std::io::ErrorKind::TimedOut => "connection timed out",
                std::io::ErrorKind::ConnectionAborted => "connection aborted",
                _ => "socket error",
            };
        }
    }
    "unknown"
}

fn goaway(code: u32) -> &'static str {
    const NAMES: [&str; 14] = [
        "GOAWAY NO_ERROR",
        "GOAWAY PROTOCOL_ERROR",
        "GOAWAY INTERNAL_ERROR",
        "GOAWAY FLOW_CONTROL_ERROR",
        "GOAWAY SETTINGS_TIMEOUT",
        "GOAWAY STREAM_CLOSED",
        "GOAWAY FRAME_SIZE_ERROR",
        "GOAWAY REFUSED_STREAM",
        "GOAWAY CANCEL",
        "GOAWAY COMPRESSION_ERROR",
        "GOAWAY CONNECT_ERROR",
        "GOAWAY ENHANCE_YOUR_CALM",
        "GOAWAY INADEQUATE_SECURITY",
        "GOAWAY HTTP_1_1_REQUIRED",
    ];
    NAMES.get(code as usize).copied().unwrap_or("unknown")
}
