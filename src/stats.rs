//! [`EndpointStats`]: what the channel knows of one instance, at one moment.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::instance::{Instance, State};

/// Which instance answered a call: in the extensions of every response the channel returns
/// (for a generated stub, `response.extensions().get::<ServedBy>()`, on unary and streaming
/// responses alike).
///
/// ```no_run
/// # async fn demo(mut client: tonic::client::Grpc<tonic_balancer::BalancedChannel>) {
/// # let response: tonic::Response<()> = todo!();
/// if let Some(served_by) = response.extensions().get::<tonic_balancer::ServedBy>() {
///     println!("answered by {}", served_by.uri());
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServedBy(std::sync::Arc<str>);

impl ServedBy {
    pub(crate) fn new(uri: std::sync::Arc<str>) -> ServedBy {
        ServedBy(uri)
    }

    /// The instance's URI (or connector name), as in [`EndpointStats::uri`].
    pub fn uri(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ServedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A snapshot of one instance, from [`BalancedChannel::endpoints`](crate::BalancedChannel::endpoints).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointStats {
    uri: String,
    state: State,
    in_flight: usize,
    connections: usize,
    started: u64,
    failed: u64,
    consecutive_failures: u32,
    ejections: u32,
    latency: Option<Duration>,
    slowness: Option<f64>,
    load_report: Option<std::sync::Arc<crate::load::report::LoadReport>>,
}

impl EndpointStats {
    pub(crate) fn of(i: &Instance) -> EndpointStats {
        let lat = i.latency.last_ns();
        EndpointStats {
            uri: i.target.name.to_string(),
            state: i.state(),
            in_flight: i.in_flight(),
            connections: 1 + i
                .extra
                .as_deref()
                .map_or(0, crate::instance::conns::ExtraConnections::open),
            started: i.started.load(Ordering::Relaxed),
            failed: i.ejection.failed(),
            consecutive_failures: i.ejection.consecutive_failures(),
            ejections: i.ejection.ejections(),
            latency: (lat > 0.0).then(|| Duration::from_nanos(lat as u64)),
            slowness: i.tie.slowness(),
            load_report: i.reported.last(),
        }
    }

    /// The instance's URI as configured (for an instance found by discovery, its address's
    /// URI; for one added with
    /// [`endpoint_with_connector`](crate::Builder::endpoint_with_connector), its name).
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Its state: connecting, ready, failing, ejected, unhealthy or draining.
    pub fn state(&self) -> State {
        self.state
    }

    /// Calls in flight on it now: routed to it and not over yet (a streaming call counts until
    /// its stream ends or is dropped).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The HTTP/2 connections the channel keeps to it now: its own, and the extra ones opened
    /// because the others were at their stream limit (see
    /// [`Builder::max_connections_per_instance`](crate::Builder::max_connections_per_instance)).
    /// Its own counts even before it connects.
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// Calls routed to it since it joined (a call replayed elsewhere counts on each instance it
    /// was routed to).
    pub fn started(&self) -> u64 {
        self.started
    }

    /// Calls on it that ended in an error: a transport error, a deadline, or any status other
    /// than OK (application statuses included; cancellations by the caller excluded).
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// Calls in a row that failed in a way that counts against the instance (a server fault:
    /// UNKNOWN, INTERNAL, DATA_LOSS, UNAVAILABLE, RESOURCE_EXHAUSTED; a deadline it held the
    /// call silent to; a transport error), unless named ordinary
    /// ([`Ejection::ordinary_codes`](crate::Ejection::ordinary_codes)); reset by any other
    /// answer.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// How many times it was ejected since it joined.
    pub fn ejections(&self) -> u32 {
        self.ejections
    }

    /// Its latency estimate (peak-sensitive moving average of the time to response headers),
    /// if it answered at least once.
    pub fn latency(&self) -> Option<Duration> {
        self.latency
    }

    /// How much slower than the fast instances it answers, as the least-pending tie-break
    /// weighs it: its recent answers' times over the usual time of the same methods on the
    /// fast instances (1.0: as fast as they are; 3.0: three times slower), if it answered at
    /// least once.
    pub fn slowness(&self) -> Option<f64> {
        self.slowness
    }

    /// The last load report it sent (ORCA, see [`orca`](crate::orca)), if any.
    pub fn load_report(&self) -> Option<&crate::load::report::LoadReport> {
        self.load_report.as_deref()
    }
}

impl std::fmt::Display for EndpointStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} in_flight={} started={} failed={} ejections={}",
            self.uri, self.state, self.in_flight, self.started, self.failed, self.ejections
        )
    }
}
