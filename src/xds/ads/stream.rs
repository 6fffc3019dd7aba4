//! The ADS stream of one client: opened, fed with the watched names, its responses taken in
//! and answered (ACK or NACK), its pending resources timed, and opened again with gRPC's
//! backoff when it ends, until the client is dropped
//! ([A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md); NACKs as
//! [A46](https://github.com/grpc/proposal/blob/master/A46-xds-nack-semantics-improvement.md), metrics as
//! [A78](https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md)).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Endpoint;

use super::{Inner, ResourceType, TypeState, Watched};
use crate::sync::lock;
use crate::xds::wire::{DiscoveryRequest, DiscoveryResponse};

const PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// A27: a resource not received this long after it was asked for does not exist.
const DOES_NOT_EXIST_AFTER: Duration = Duration::from_secs(15);

/// Sets `running` false when the task ends, however it ends (a runtime shut down drops it).
struct Running(Arc<Inner>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
        self.0.connected.store(false, Ordering::Relaxed);
    }
}

/// The stream, again and again, until the client is dropped.
pub(super) async fn run(inner: Arc<Inner>) {
    let _running = Running(inner.clone());
    let backoff = crate::Backoff::default();
    let mut failures = 0u32;
    let span = tracing::info_span!("xds.ads", server = %inner.bootstrap.server_uri);
    let mut last_good = None;
    loop {
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        let (why, responses) =
            tracing::Instrument::instrument(stream(&inner, &mut last_good), span.clone()).await;
        inner.connected.store(false, Ordering::Relaxed);
        inner.stream_ended(responses);
        if inner.closed.load(Ordering::Acquire) {
            return;
        }
        if responses > 0 {
            failures = 0;
        }
        let delay = backoff.delay(failures);
        failures = failures.saturating_add(1);
        tracing::warn!(server = %inner.bootstrap.server_uri, error = %why, retry_in = ?delay, "xDS stream ended; the resources received are kept");
        *crate::sync::lock(&inner.last_error) = Some(why);
        inner.stream_down.notify_waiters();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = closed(&inner) => return,
        }
    }
}

/// Resolves when the client is dropped.
async fn closed(inner: &Inner) {
    while !inner.closed.load(Ordering::Acquire) {
        inner.changed.notified().await;
    }
    // Another waiter (the stream's loop) may want the wake-up too.
    inner.changed.notify_one();
}

/// The control plane's endpoint for a new connection, its credentials' files read again, so
/// that certificates replaced on disk are used from the next connection on (gRFC A65's
/// refresh, at each connection instead of on a timer); when they cannot be read, the last good
/// endpoint, with a warning (as gRPC's file watcher keeps its last good files).
fn endpoint(inner: &Inner, last_good: &mut Option<Endpoint>) -> Result<Endpoint, String> {
    let bootstrap = &inner.bootstrap;
    let fresh = bootstrap
        .connect_uri()
        .map_err(|e| e.to_string())
        .and_then(|uri| bootstrap.creds.endpoint(uri));
    match (fresh, last_good.as_ref()) {
        (Ok(endpoint), _) => {
            *last_good = Some(endpoint.clone());
            Ok(endpoint)
        }
        (Err(why), Some(endpoint)) => {
            tracing::warn!(server = %bootstrap.server_uri, error = %why, "xDS channel credentials could not be read again; the last good ones are used");
            Ok(endpoint.clone())
        }
        (Err(why), None) => Err(why),
    }
}

/// One stream: (why it ended, the responses it received).
async fn stream(inner: &Arc<Inner>, last_good: &mut Option<Endpoint>) -> (String, u64) {
    let endpoint = match endpoint(inner, last_good) {
        Ok(endpoint) => endpoint,
        Err(why) => return (why, 0),
    };
    let channel = match endpoint.connect().await {
        Ok(c) => c,
        Err(e) => return (format!("connect: {}", crate::error::chain(&e)), 0),
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Err(e) = grpc.ready().await {
        return (crate::error::chain(&e), 0);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let mut node = Some(inner.bootstrap.node_bytes());
    // Every watched name, again, with the versions accepted before (A27: a new stream
    // subscribes to all it watches).
    {
        let mut types = lock(&inner.types);
        for kind in ResourceType::ALL {
            let t = &mut types[kind.index()];
            t.nonce.clear();
            t.sent.clear();
            // A27's timer runs while the stream is up: it starts again with the request.
            for e in t.entries.values_mut() {
                e.asked_at = None;
            }
            if let Some(req) = subscription(kind, t, &mut node) {
                let _ = tx.send(req);
            }
        }
    }
    let path = http::uri::PathAndQuery::from_static(PATH);
    let codec = crate::codec::HandCodec::<DiscoveryRequest, DiscoveryResponse>::default();
    // The server answers the call's headers with its first response, which may wait for a
    // subscription: the watches that come meanwhile are sent while the call opens.
    let call = grpc.streaming(tonic::Request::new(Outgoing(rx)), path, codec);
    tokio::pin!(call);
    let mut inbound = loop {
        tokio::select! {
            opened = &mut call => match opened {
                Ok(resp) => break resp.into_inner(),
                Err(status) => return (format!("{status}"), 0),
            },
            _ = inner.changed.notified() => {
                if inner.closed.load(Ordering::Acquire) {
                    return ("the client was dropped".into(), 0);
                }
                send_subscriptions(inner, &tx, &mut node);
            }
        }
    };
    inner.connected.store(true, Ordering::Relaxed);
    tracing::info!(server = %inner.bootstrap.server_uri, creds = %inner.bootstrap.creds.describe(), "xDS stream open");
    let mut responses = 0u64;
    loop {
        let next_expiry = next_expiry(inner);
        tokio::select! {
            msg = inbound.message() => match msg {
                Ok(Some(resp)) => {
                    responses += 1;
                    inner.responded();
                    if let Some(answer) = apply(inner, resp, &mut node) {
                        let _ = tx.send(answer);
                    }
                }
                Ok(None) => return ("the control plane ended the stream".into(), responses),
                Err(status) => return (format!("{status}"), responses),
            },
            _ = inner.changed.notified() => {
                if inner.closed.load(Ordering::Acquire) {
                    return ("the client was dropped".into(), responses);
                }
                send_subscriptions(inner, &tx, &mut node);
            }
            _ = sleep_until(next_expiry) => expire(inner),
        }
    }
}

/// A request for each type whose watched names changed since the stream last sent them.
fn send_subscriptions(
    inner: &Inner,
    tx: &mpsc::UnboundedSender<DiscoveryRequest>,
    node: &mut Option<Arc<Vec<u8>>>,
) {
    let mut types = lock(&inner.types);
    for kind in ResourceType::ALL {
        if let Some(req) = subscription(kind, &mut types[kind.index()], node) {
            let _ = tx.send(req);
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A request for the type's names if they differ from those the stream was last sent; the
/// new pending names' timers start.
fn subscription(
    kind: ResourceType,
    t: &mut TypeState,
    node: &mut Option<Arc<Vec<u8>>>,
) -> Option<DiscoveryRequest> {
    let mut names: Vec<String> = t.entries.keys().cloned().collect();
    names.sort();
    if names == t.sent {
        return None;
    }
    let now = Instant::now();
    for e in t.entries.values_mut() {
        if e.asked_at.is_none() && *e.tx.borrow() == Watched::Pending {
            e.asked_at = Some(now);
        }
    }
    t.sent = names.clone();
    report_resources(kind, t);
    Some(DiscoveryRequest {
        version_info: t.version.clone(),
        node: node.take(),
        resource_names: names,
        type_url: kind.type_url(),
        response_nonce: t.nonce.clone(),
        error_detail: None,
    })
}

/// The earliest does-not-exist deadline of a pending resource.
fn next_expiry(inner: &Inner) -> Option<Instant> {
    let types = lock(&inner.types);
    types
        .iter()
        .flat_map(|t| t.entries.values())
        .filter_map(|e| e.asked_at)
        .min()
        .map(|at| at + DOES_NOT_EXIST_AFTER)
}

/// Pending resources asked for too long ago do not exist.
fn expire(inner: &Inner) {
    let now = Instant::now();
    let mut types = lock(&inner.types);
    for (kind, t) in ResourceType::ALL.iter().zip(types.iter_mut()) {
        for (name, e) in t.entries.iter_mut() {
            if e.asked_at
                .is_some_and(|at| at + DOES_NOT_EXIST_AFTER <= now)
            {
                e.asked_at = None;
                if *e.tx.borrow() == Watched::Pending {
                    tracing::warn!(kind = ?kind, name = %name, "xDS resource does not exist (not received in 15 s)");
                    e.tx.send_replace(Watched::Missing);
                }
            }
        }
        report_resources(*kind, t);
    }
}

/// Takes a response in and returns its ACK or NACK.
fn apply(
    inner: &Inner,
    resp: DiscoveryResponse,
    node: &mut Option<Arc<Vec<u8>>>,
) -> Option<DiscoveryRequest> {
    let Some(kind) = ResourceType::ALL
        .into_iter()
        .find(|k| k.type_url() == resp.type_url)
    else {
        tracing::warn!(type_url = %resp.type_url, "xDS response of a type never asked for, ignored");
        return None;
    };
    let mut types = lock(&inner.types);
    let t = &mut types[kind.index()];
    let (valid, errors) = take_resources(kind, t, &resp.resources);
    t.nonce = resp.nonce.clone();
    let server = &inner.bootstrap.server_uri;
    crate::metrics::xds_updates(server, kind.type_name(), valid, errors.len() as u64);
    report_resources(kind, t);
    let error_detail = if errors.is_empty() {
        t.version = resp.version_info.clone();
        None
    } else {
        let why = errors.join("; ");
        tracing::warn!(kind = ?kind, version = %resp.version_info, error = %why, "xDS update NACKed; the last good resources are kept");
        Some(why)
    };
    let mut names: Vec<String> = t.entries.keys().cloned().collect();
    names.sort();
    t.sent = names.clone();
    Some(DiscoveryRequest {
        version_info: t.version.clone(),
        node: node.take(),
        resource_names: names,
        type_url: kind.type_url(),
        response_nonce: resp.nonce,
        error_detail,
    })
}

/// The resources of a response of `kind`, each decoded and given to its watchers: (how many
/// were valid, why each other one was refused). A refused resource keeps its last good
/// version (A46); one with none says why to its watchers. Of a type whose responses list every
/// resource (LDS, CDS), one watched and not listed was deleted.
fn take_resources(
    kind: ResourceType,
    t: &mut TypeState,
    resources: &[(String, bytes::Bytes)],
) -> (u64, Vec<String>) {
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    let mut valid = 0u64;
    for (url, bytes) in resources {
        if url != kind.type_url() {
            errors.push(format!("a resource of type {url} in a {kind:?} response"));
            continue;
        }
        match kind.decode(bytes) {
            Ok((name, resource)) => {
                valid += 1;
                seen.insert(name.clone());
                if let Some(e) = t.entries.get_mut(&name) {
                    e.asked_at = None;
                    let new = Watched::Found(Arc::new(resource));
                    e.tx.send_if_modified(|w| {
                        let changed = *w != new;
                        if changed {
                            *w = new;
                        }
                        changed
                    });
                }
            }
            Err(why) => {
                // Every resource type has its name in field 1.
                if let Some(name) = resource_name(bytes) {
                    seen.insert(name.clone());
                    if let Some(e) = t.entries.get_mut(&name) {
                        if *e.tx.borrow() == Watched::Pending {
                            e.asked_at = None;
                            e.tx.send_replace(Watched::Invalid(why.0.clone()));
                        }
                    }
                }
                errors.push(why.0);
            }
        }
    }
    if kind.lists_all() {
        for (name, e) in t.entries.iter_mut() {
            if !seen.contains(name) && !matches!(*e.tx.borrow(), Watched::Missing) {
                e.asked_at = None;
                tracing::info!(kind = ?kind, name = %name, "xDS resource deleted");
                e.tx.send_replace(Watched::Missing);
            }
        }
    }
    (valid, errors)
}

/// A78's gauge of the resources of a type the client holds, by state: what changed since this
/// client last reported is added to the process's gauge (other clients, of other control
/// planes, add theirs).
fn report_resources(kind: ResourceType, t: &mut TypeState) {
    let mut counts = [0usize; 4];
    for e in t.entries.values() {
        let i = match *e.tx.borrow() {
            Watched::Pending => 0,
            Watched::Missing => 1,
            Watched::Found(_) => 2,
            Watched::Invalid(_) => 3,
        };
        counts[i] += 1;
    }
    for (i, state) in RESOURCE_STATES.into_iter().enumerate() {
        let delta = counts[i] as f64 - t.reported[i] as f64;
        if delta != 0.0 {
            crate::metrics::xds_resources(kind.type_name(), state, delta);
        }
    }
    t.reported = counts;
}

/// The states of A78's resources gauge, in `TypeState::reported`'s order.
pub(super) const RESOURCE_STATES: [&str; 4] = ["requested", "does_not_exist", "acked", "nacked"];

/// A resource's name, read without validating the rest: field 1 of each of the four types.
fn resource_name(bytes: &[u8]) -> Option<String> {
    crate::xds::wire::fields(bytes, "resource")
        .map_while(Result::ok)
        .find(|(n, _)| *n == 1)
        .and_then(|(_, v)| v.str("name").ok().map(str::to_owned))
}

/// The stream's requests, as tonic takes a request stream.
struct Outgoing(mpsc::UnboundedReceiver<DiscoveryRequest>);

impl futures_core::Stream for Outgoing {
    type Item = DiscoveryRequest;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<DiscoveryRequest>> {
        self.0.poll_recv(cx)
    }
}
