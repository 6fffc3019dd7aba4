//! The xDS client's instruments (gRFC A78): whether its stream is up, its servers' failures,
//! the resources it received valid and invalid, and the resources it holds by state. The
//! stream is the process's, shared by every channel that names its control plane, so
//! `grpc.target` is `*`: all of them.
//!
//! Sources: [gRFC A78](https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md).

use metrics::Label;

use super::names::*;

/// What `grpc.target` says of the shared client.
const SHARED: &str = "*";

fn server_labels(server: &str) -> Vec<Label> {
    vec![
        Label::new(LABEL_TARGET, SHARED),
        Label::new(LABEL_XDS_SERVER, server.to_owned()),
    ]
}

/// The stream to `server` is up (a response received on it) or down.
pub(crate) fn xds_connected(server: &str, up: bool) {
    metrics::gauge!(XDS_CONNECTED, server_labels(server)).set(if up { 1.0 } else { 0.0 });
}

/// `server` went from healthy to unhealthy (A57: a connection or stream lost without a
/// response).
pub(crate) fn xds_server_failure(server: &str) {
    metrics::counter!(XDS_SERVER_FAILURE, server_labels(server)).increment(1);
}

/// Resources of `resource_type` received from `server`: `valid` taken, `invalid` refused.
pub(crate) fn xds_updates(server: &str, resource_type: &str, valid: u64, invalid: u64) {
    let count = |name: &'static str, n: u64| {
        if n > 0 {
            let mut l = server_labels(server);
            l.push(Label::new(
                LABEL_XDS_RESOURCE_TYPE,
                resource_type.to_owned(),
            ));
            metrics::counter!(name, l).increment(n);
        }
    };
    count(XDS_UPDATES_VALID, valid);
    count(XDS_UPDATES_INVALID, invalid);
}

/// `delta` more (or fewer) resources of `resource_type` held in `state` (`requested`,
/// `does_not_exist`, `acked`, `nacked`) by the process's xDS clients: each client adds what
/// changed of its own, so that the gauge is their sum.
pub(crate) fn xds_resources(resource_type: &str, state: &'static str, delta: f64) {
    let l = vec![
        Label::new(LABEL_TARGET, SHARED),
        Label::new(LABEL_XDS_AUTHORITY, "#old"),
        Label::new(LABEL_XDS_CACHE_STATE, state),
        Label::new(LABEL_XDS_RESOURCE_TYPE, resource_type.to_owned()),
    ];
    metrics::gauge!(XDS_RESOURCES, l).increment(delta);
}
