//! The ADS client: one stream per control plane and node in the process, shared by every
//! channel that names it (gRFC A27's xDS client), state of the world.
//!
//! - **Watches.** A channel watches a resource by type and name ([`AdsClient::watch`]); the
//!   first watch of a name subscribes (a request with the type's names), the last one dropped
//!   unsubscribes. A watch sees `Pending`, then the resource, `Missing` or `Invalid`.
//! - **ACK and NACK.** Each response is answered: an ACK carries its version and nonce; a
//!   response with an invalid resource is NACKed (the last accepted version, the nonce, and in
//!   `error_detail` why), its valid resources are taken and the invalid ones keep their last
//!   good version (A46's partial acceptance).
//! - **Does not exist.** A Listener or Cluster missing from a response of its type was
//!   deleted (state of the world lists them all); a resource not received within 15 s of its
//!   subscription, on a connected stream, does not exist (A27's timer).
//! - **The control plane lost.** The resources stay as they were (calls go on over them); the
//!   stream reconnects after gRPC's backoff (reset by a response received) and subscribes
//!   again to every watched name with the versions it had.
//!
//! Sources: [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A46](https://github.com/grpc/proposal/blob/master/A46-xds-nack-semantics-improvement.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

mod stream;

use super::bootstrap::Bootstrap;
use super::cluster::Cluster;
use super::creds::ChannelCreds;
use super::endpoints::Endpoints;
use super::listener::{Listener, RouteConfig};
use super::wire::Invalid;
use crate::sync::lock;

/// The four resource types a client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ResourceType {
    Listener,
    Route,
    Cluster,
    Endpoints,
}

impl ResourceType {
    const ALL: [ResourceType; 4] = [
        ResourceType::Listener,
        ResourceType::Route,
        ResourceType::Cluster,
        ResourceType::Endpoints,
    ];

    pub(crate) fn type_url(self) -> &'static str {
        match self {
            ResourceType::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            ResourceType::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            ResourceType::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            ResourceType::Endpoints => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The type's name without the URL's prefix, as A78's label gives it.
    fn type_name(self) -> &'static str {
        let url = self.type_url();
        &url[url.rfind('/').map_or(0, |i| i + 1)..]
    }

    /// Whether a response lists every resource of the type (LDS, CDS): one missing from it
    /// was deleted.
    fn lists_all(self) -> bool {
        matches!(self, ResourceType::Listener | ResourceType::Cluster)
    }

    fn decode(self, bytes: &[u8]) -> Result<(String, Resource), Invalid> {
        Ok(match self {
            ResourceType::Listener => {
                let (n, r) = Listener::decode(bytes)?;
                (n, Resource::Listener(r))
            }
            ResourceType::Route => {
                let (n, r) = RouteConfig::decode(bytes)?;
                (n, Resource::Route(r))
            }
            ResourceType::Cluster => {
                let (n, r) = Cluster::decode(bytes)?;
                (n, Resource::Cluster(r))
            }
            ResourceType::Endpoints => {
                let (n, r) = Endpoints::decode(bytes)?;
                (n, Resource::Endpoints(r))
            }
        })
    }
}

/// A resource, decoded and validated.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Resource {
    Listener(Listener),
    Route(RouteConfig),
    Cluster(Cluster),
    Endpoints(Endpoints),
}

/// What a watch sees of its resource.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Watched {
    /// Asked for, not received yet.
    Pending,
    Found(Arc<Resource>),
    /// Deleted, or never received within the timer.
    Missing,
    /// Received and refused, with no good version to keep: why.
    Invalid(String),
}

/// One watched name: its watchers and its latest state.
struct WatchedName {
    watchers: usize,
    tx: watch::Sender<Watched>,
    /// When it was asked for on the current stream, while it is pending.
    asked_at: Option<Instant>,
}

#[derive(Default)]
struct TypeState {
    /// The last version accepted, and the last nonce received.
    version: String,
    nonce: String,
    entries: HashMap<String, WatchedName>,
    /// The names the current stream was last sent.
    sent: Vec<String>,
    /// What this client adds to the process's gauge of resources by state (A78's
    /// `grpc.xds_client.resources`: requested, does not exist, acked, nacked), which every
    /// client of the process adds to.
    pub(super) reported: [usize; 4],
}

/// The client's state, shared by its stream task and its watches.
struct Inner {
    bootstrap: Bootstrap,
    types: Mutex<[TypeState; 4]>,
    /// The watched names changed, or the client was dropped.
    changed: Notify,
    closed: AtomicBool,
    /// Whether a stream task runs (it may have ended with a runtime that shut down).
    running: AtomicBool,
    pub(crate) connected: AtomicBool,
    /// Why the last stream ended (a connection refused, a certificate not trusted), for the
    /// status of calls that find no instance because of it.
    pub(crate) last_error: Mutex<Option<String>>,
    /// A stream ended (its reason is in `last_error`): the channels that have had no answer
    /// yet say why again.
    pub(crate) stream_down: Notify,
    /// A57's health of the control plane: lost when a connection or a stream fails without a
    /// response, back with the next response (A78's `connected` and `server_failure`).
    healthy: AtomicBool,
}

impl Inner {
    /// A response came: the control plane is healthy (again).
    fn responded(&self) {
        if !self.healthy.swap(true, Ordering::Relaxed) {
            crate::metrics::xds_connected(&self.bootstrap.server_uri, true);
        }
    }

    /// A stream ended after `responses` responses: without one, the control plane is unhealthy.
    fn stream_ended(&self, responses: u64) {
        if responses == 0 && self.healthy.swap(false, Ordering::Relaxed) {
            crate::metrics::xds_connected(&self.bootstrap.server_uri, false);
            crate::metrics::xds_server_failure(&self.bootstrap.server_uri);
        }
    }
}

/// The ADS client of one control plane and node: held by the channels that use it; the
/// stream ends when the last one is dropped.
pub(crate) struct AdsClient {
    inner: Arc<Inner>,
}

impl Drop for AdsClient {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.changed.notify_one();
    }
}

/// The client is gone: what it added to the process's gauge of resources by state is taken
/// back.
impl Drop for Inner {
    fn drop(&mut self) {
        let types = match self.types.get_mut() {
            Ok(types) => types,
            Err(poisoned) => poisoned.into_inner(),
        };
        for (kind, t) in ResourceType::ALL.into_iter().zip(types.iter()) {
            for (state, n) in stream::RESOURCE_STATES.into_iter().zip(t.reported) {
                if n > 0 {
                    crate::metrics::xds_resources(kind.type_name(), state, -(n as f64));
                }
            }
        }
    }
}

/// The process's clients, by control plane, its credentials and the encoded node: a bootstrap
/// that reaches the same control plane with other credentials (TLS, another client
/// certificate) gets a stream of its own, as grpc-go keys its transports by server config.
type Clients = Mutex<HashMap<(String, ChannelCreds, Vec<u8>), Weak<AdsClient>>>;

fn registry() -> &'static Clients {
    static CLIENTS: OnceLock<Clients> = OnceLock::new();
    CLIENTS.get_or_init(Default::default)
}

/// The client of this bootstrap's control plane and node: the one the process has, or a new
/// one whose stream starts on the current tokio runtime.
pub(crate) fn client(bootstrap: &Bootstrap) -> Arc<AdsClient> {
    let key = (
        bootstrap.server_uri.clone(),
        bootstrap.creds.clone(),
        bootstrap.node_bytes().to_vec(),
    );
    let mut clients = lock(registry());
    clients.retain(|_, c| c.strong_count() > 0);
    let client = match clients.get(&key).and_then(Weak::upgrade) {
        Some(c) => c,
        None => {
            let c = Arc::new(AdsClient {
                inner: Arc::new(Inner {
                    bootstrap: bootstrap.clone(),
                    types: Mutex::default(),
                    changed: Notify::new(),
                    closed: AtomicBool::new(false),
                    running: AtomicBool::new(false),
                    connected: AtomicBool::new(false),
                    last_error: Mutex::default(),
                    stream_down: Notify::new(),
                    healthy: AtomicBool::new(true),
                }),
            });
            clients.insert(key, Arc::downgrade(&c));
            crate::metrics::xds_connected(&bootstrap.server_uri, true);
            c
        }
    };
    if !client.inner.running.swap(true, Ordering::AcqRel) {
        tokio::spawn(stream::run(client.inner.clone()));
    }
    client
}

/// A watch of one resource: `rx` sees its states; dropping it unsubscribes when it was the
/// last watch of the name.
pub(crate) struct Watch {
    inner: Arc<Inner>,
    kind: ResourceType,
    pub(crate) name: String,
    pub(crate) rx: watch::Receiver<Watched>,
}

impl AdsClient {
    pub(crate) fn watch(&self, kind: ResourceType, name: &str) -> Watch {
        let rx = {
            let mut types = lock(&self.inner.types);
            let entry = types[kind.index()]
                .entries
                .entry(name.to_owned())
                .or_insert_with(|| WatchedName {
                    watchers: 0,
                    tx: watch::channel(Watched::Pending).0,
                    asked_at: None,
                });
            entry.watchers += 1;
            entry.tx.subscribe()
        };
        self.inner.changed.notify_one();
        Watch {
            inner: self.inner.clone(),
            kind,
            name: name.to_owned(),
            rx,
        }
    }

    /// Why the last stream ended, if one did.
    pub(crate) fn last_error(&self) -> Option<String> {
        crate::sync::lock(&self.inner.last_error).clone()
    }

    /// Resolves when a stream ends after this is first polled (the reason is then
    /// [`last_error`](Self::last_error)).
    pub(crate) async fn stream_ended(&self) {
        self.inner.stream_down.notified().await;
    }

    /// Whether the stream is up (A78's `grpc.xds_client.connected`).
    pub(crate) fn connected(&self) -> bool {
        self.inner.connected.load(Ordering::Relaxed)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut types = lock(&self.inner.types);
        let entries = &mut types[self.kind.index()].entries;
        if let Some(e) = entries.get_mut(&self.name) {
            e.watchers -= 1;
            if e.watchers == 0 {
                entries.remove(&self.name);
                drop(types);
                self.inner.changed.notify_one();
            }
        }
    }
}
