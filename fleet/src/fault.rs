//! Scripted faults for any tonic service: a [`tower::Layer`] that a server puts around its
//! services, and a handle ([`Faults`]) through which a test changes what the layer does while
//! calls run.
//!
//! ```no_run
//! use std::time::Duration;
//! use tonic_balancer_fleet::fault::{Faults, Script};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let faults = Faults::new();
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! let server = tonic::transport::Server::builder()
//!     .layer(faults.layer())
//!     .add_service(health)
//!     .serve("127.0.0.1:50051".parse()?);
//! tokio::spawn(server);
//!
//! // Every call from now on answers 200 ms late, and one in ten fails.
//! faults.set(
//!     Script::new()
//!         .delay(Duration::from_millis(200))
//!         .fail(tonic::Code::Unavailable, "scripted")
//!         .one_in(10),
//! );
//! // ... run the calls under test, then look at what the instance saw:
//! println!("{} calls, at most {} at once", faults.calls(), faults.peak_in_flight());
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//!
//! The layer works on HTTP requests and responses: it knows nothing of the service's
//! messages, so it serves every tonic service, generated or not. For each call it reads the
//! script that applies to the call's path (the most specific of: the method's own, its
//! service's, the one for every method: see [`Faults::set_method`]), decides at once what
//! happens to the call, and then:
//!
//! - [`Script::limit`]: a call beyond the limit is answered at once with its status;
//! - otherwise the waits add up ([`Script::delay`], [`Script::per_call_in_flight`],
//!   [`Script::stall`], [`Script::cold`], [`Script::queue`]), then [`Script::hold`] (until [`Faults::release`])
//!   or [`Script::hang`] (for ever), then the status of [`Script::fail`] (if
//!   [`Script::one_in`] and [`Script::chance`] pick this call), all at the script's [`Point`]
//!   of the call.
//!
//! A script applies to the calls that start after it is set: calls already waiting keep the
//! plan they started with (a held call stays held until released, even after
//! [`Faults::clear`]).
//!
//! Every wait is a `tokio::time` timer, so tests may run on tokio's paused clock. The layer
//! counts every call it sees, faulted or not ([`Faults::calls`], [`Faults::in_flight`],
//! [`Faults::method`]): a call is in flight from the moment the layer is called until its
//! response body ends or is dropped, so a call the client cancels (its deadline, its future
//! dropped) leaves the count when the server drops it.
//!
//! # Deadlines
//!
//! tonic 0.14 enforces a call's `grpc-timeout` on both sides, and on both sides only until the
//! response *headers*: on the server, outside this layer, the timer drops the layer's future
//! and answers `CANCELLED` with the message `Timeout expired` (not `DEADLINE_EXCEEDED`); on the
//! client, tonic's channel gives up at the same moment with the same status. So a call that
//! [`Script::hang`]s or is [`Script::hold`]ed before its headers ([`Point::BeforeCall`],
//! [`Point::AfterRequest`]) ends at its deadline with `CANCELLED`. At [`Point::AtEnd`] the
//! headers are already out: neither side's timer runs any more, and the stream stays open
//! after its messages until the client drops it (or, for a hold, until released).
//!
//! # Body types
//!
//! The inner service receives `http::Request<tonic::body::Body>` (the request body is wrapped
//! with [`tonic::body::Body::new`], which does not box a body that already is one), as
//! tonic's `Routes`, its generated servers and its `Server::layer` stack expect. The response
//! body is the inner one wrapped in a [`FaultBody`], with the same data and error types.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;
use tokio::time::Sleep;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::{Code, Status};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");

/// The keys a status's metadata may not carry: tonic drops them from a status's metadata
/// (`MetadataMap::into_sanitized_headers`), so [`Script::trailer`] refuses them.
const RESERVED: [&str; 5] = [
    "te",
    "content-type",
    "grpc-message",
    "grpc-message-type",
    "grpc-status",
];

/// splitmix64's increment (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

// ---------------------------------------------------------------------------------------------
// The script
// ---------------------------------------------------------------------------------------------

/// Where in a call the waits and the status of a [`Script`] apply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Point {
    /// Before the service is called, so before the response headers: a status is a
    /// trailers-only answer and the service never sees the call.
    #[default]
    BeforeCall,
    /// After the whole request stream has been read: the layer buffers the request body's
    /// frames, waits, and then calls the service with a body that replays them, so that the
    /// service still sees every message. For a client-streaming call, a server that answers
    /// after reading its input. A status is a trailers-only answer; the service is not called.
    AfterRequest,
    /// After the service's response messages, before its trailers: the wait delays the
    /// trailers, a status replaces the trailers' `grpc-status` and `grpc-message` (a stream that
    /// breaks after its messages), a hold keeps the stream open after its messages until
    /// released, a hang until the client goes away. A trailers-only answer of the service
    /// becomes headers and trailers, so that its status can wait too.
    AtEnd,
}

/// What happens to each call, built with chained methods: `Script::default()` (or
/// [`Script::new`]) is no fault at all.
///
/// Calling a method again replaces what it set before, except [`Script::trailer`], which adds
/// an entry. Bad values panic at once, naming the method and the value.
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer_fleet::fault::{Point, Script};
///
/// // An overloaded instance: 10 ms per call already in flight, refuses a 9th concurrent call
/// // with a pushback, and breaks a stream after its messages.
/// let script = Script::new()
///     .per_call_in_flight(Duration::from_millis(10))
///     .limit(8, Code::ResourceExhausted)
///     .trailer("grpc-retry-pushback-ms", "100");
/// let broken = Script::new().fail(Code::Internal, "stream broke").at(Point::AtEnd);
/// # let _ = (script, broken);
/// ```
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct Script {
    delay: Duration,
    per_call_in_flight: Duration,
    stall: Option<(f64, Duration)>,
    cold: Option<(u64, Duration)>,
    queue: Option<Duration>,
    fail: Option<(Code, String)>,
    trailers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
    one_in: Option<NonZeroU64>,
    chance: Option<f64>,
    hang: bool,
    hold: bool,
    limit: Option<(usize, Code)>,
    point: Point,
}

impl Script {
    /// No fault: the same as `Script::default()`.
    pub fn new() -> Script {
        Script::default()
    }

    /// A fixed latency added to every call.
    pub fn delay(mut self, d: Duration) -> Script {
        self.delay = d;
        self
    }

    /// `d` for every other call in flight in the script's scope when the call starts (the
    /// method's calls for [`Faults::set_method`] on a method, its service's for a service, every
    /// call at the layer for [`Faults::set`]): `d × (calls in flight − 1)`, the call itself
    /// included in the count. An instance that slows down with its load.
    pub fn per_call_in_flight(mut self, d: Duration) -> Script {
        self.per_call_in_flight = d;
        self
    }

    /// With probability `p`, `d` more: the occasional stall. The draws come from a
    /// deterministic pseudo-random sequence (splitmix64) of the handle, one draw per call that
    /// this script applies to, seeded with [`Faults::seed`] (0 unless set).
    ///
    /// # Panics
    ///
    /// If `p` is not in `[0, 1]`.
    pub fn stall(mut self, p: f64, d: Duration) -> Script {
        assert!(
            (0.0..=1.0).contains(&p),
            "Script::stall: the probability {p} is not in [0, 1]"
        );
        self.stall = Some((p, d));
        self
    }

    /// A cold start: the next `calls` calls this script applies to, counted from when the
    /// script is set, take `d` more.
    pub fn cold(mut self, calls: u64, d: Duration) -> Script {
        self.cold = Some((calls, d));
        self
    }

    /// A server that serves one call at a time, `service` each, in the order they came: each
    /// call waits for the calls before it in the script's scope, then `service` more (an
    /// M/D/1 queue's server: idle, a call takes `service`; with `k` calls ahead, `(k + 1) ×
    /// service`, less what the first of them has done). A call the client gives up on keeps its
    /// place, as work a server has queued does. Counted from when the script is set.
    pub fn queue(mut self, service: Duration) -> Script {
        self.queue = Some(service);
        self
    }

    /// Answers with this status instead of the service's answer (see [`Point`] for where).
    /// Before the response headers it is a trailers-only response, as
    /// [`tonic::Status::into_http`] makes.
    ///
    /// # Panics
    ///
    /// If `code` is `Code::Ok`: a fault is an error.
    pub fn fail(mut self, code: Code, message: impl Into<String>) -> Script {
        assert!(code != Code::Ok, "Script::fail: the code must not be Ok");
        self.fail = Some((code, message.into()));
        self
    }

    /// Metadata on every status this layer answers with ([`Script::fail`]'s and
    /// [`Script::limit`]'s), for example `("grpc-retry-pushback-ms", "100")`; no effect on calls
    /// that get no status from the layer. Each call adds an entry (one key may repeat).
    ///
    /// # Panics
    ///
    /// If `key` is not a valid ASCII metadata key (lower case; a `-bin` key is binary and not
    /// taken here), is one that tonic reserves (`grpc-status`, `grpc-message`,
    /// `grpc-message-type`, `content-type`, `te`), or `value` is not a valid ASCII metadata
    /// value.
    pub fn trailer(mut self, key: &'static str, value: impl Into<String>) -> Script {
        let value = value.into();
        let Ok(parsed) = AsciiMetadataKey::from_bytes(key.as_bytes()) else {
            panic!("Script::trailer: {key:?} is not a valid ASCII metadata key");
        };
        assert!(
            !RESERVED.contains(&key),
            "Script::trailer: {key:?} is reserved by gRPC (tonic drops it from a status)"
        );
        let Ok(v) = AsciiMetadataValue::try_from(value.as_str()) else {
            panic!("Script::trailer: {value:?} (for {key:?}) is not a valid ASCII metadata value");
        };
        self.trailers.push((parsed, v));
        self
    }

    /// The status of [`Script::fail`] only for every `n`-th call this script applies to
    /// (the `n`-th, the `2n`-th, ... counted from when the script is set, not counting calls
    /// refused by [`Script::limit`]); the others go through (with the script's waits). An
    /// instance that fails part of its calls.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn one_in(mut self, n: u64) -> Script {
        let Some(n) = NonZeroU64::new(n) else {
            panic!("Script::one_in: n must be at least 1, not 0");
        };
        self.one_in = Some(n);
        self
    }

    /// The status of [`Script::fail`] only with probability `p`, each call drawn on its own
    /// (the pseudo-random sequence of [`Script::stall`], seeded with [`Faults::seed`]): an
    /// instance whose calls fail at random, as many instances of one service answer the same
    /// share of application errors. With [`Script::one_in`] too, a call fails if both pick it.
    ///
    /// # Panics
    ///
    /// If `p` is not in `[0, 1]`.
    pub fn chance(mut self, p: f64) -> Script {
        assert!(
            (0.0..=1.0).contains(&p),
            "Script::chance: the probability {p} is not in [0, 1]"
        );
        self.chance = Some(p);
        self
    }

    /// Never answers (after the waits). The call ends when the client gives up: when it drops
    /// the call, or, before the response headers, at its deadline (`grpc-timeout`), which
    /// tonic 0.14 answers with `CANCELLED` "Timeout expired" on both sides (see the
    /// [module docs](crate::fault#deadlines)). At [`Point::AtEnd`] the deadline no longer applies:
    /// the stream stays open after its messages until the client drops it.
    pub fn hang(mut self) -> Script {
        self.hang = true;
        self
    }

    /// Waits (after the waits) until [`Faults::release`] lets the call go on; then the status,
    /// if any. A held call counts in [`Faults::held`].
    pub fn hold(mut self) -> Script {
        self.hold = true;
        self
    }

    /// A call that would make more than `n` calls in flight in this script's scope (the method
    /// of [`Faults::set_method`], its service, or every call of the layer for [`Faults::set`],
    /// counting calls that started before the script was set) is answered at once with `code`
    /// (message `fault: more than n calls in flight`, and the script's trailers), before any
    /// wait and at any [`Point`].
    ///
    /// # Panics
    ///
    /// If `code` is `Code::Ok`.
    pub fn limit(mut self, n: usize, code: Code) -> Script {
        assert!(code != Code::Ok, "Script::limit: the code must not be Ok");
        self.limit = Some((n, code));
        self
    }

    /// Where in the call the waits, the hold or hang and the status apply: [`Point::BeforeCall`]
    /// unless set.
    pub fn at(mut self, point: Point) -> Script {
        self.point = point;
        self
    }

    fn is_none(&self) -> bool {
        self.delay.is_zero()
            && self.per_call_in_flight.is_zero()
            && self.stall.is_none()
            && self.cold.is_none()
            && self.queue.is_none()
            && self.fail.is_none()
            && !self.hang
            && !self.hold
            && self.limit.is_none()
    }
}

/// A script as set, with the counters that belong to it.
#[derive(Debug)]
struct Armed {
    script: Script,
    scope: Scope,
    /// Calls still cold.
    cold_left: AtomicU64,
    /// Calls seen (not refused by the limit), for `one_in`.
    seen: AtomicU64,
    /// When it was set: the queue's times are counted from here.
    since: tokio::time::Instant,
    /// When the queue's server is free of the calls it has taken, in nanoseconds since
    /// `since`.
    free_at: AtomicU64,
}

impl Armed {
    fn new(script: Script, scope: Scope) -> Arc<Armed> {
        let cold_left = script.cold.map_or(0, |(n, _)| n);
        Arc::new(Armed {
            script,
            scope,
            cold_left: AtomicU64::new(cold_left),
            seen: AtomicU64::new(0),
            since: tokio::time::Instant::now(),
            free_at: AtomicU64::new(0),
        })
    }

    /// A call comes to the queue now: how long it waits for the calls before it and its own
    /// `service`. Each call takes the server from when it is free (or now, if it is idle).
    fn queue_wait(&self, service: Duration) -> Duration {
        let now = self.since.elapsed().as_nanos() as u64;
        let service = service.as_nanos() as u64;
        let took = self
            .free_at
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| {
                Some(free.max(now).saturating_add(service))
            })
            .expect("always Some");
        Duration::from_nanos(took.max(now).saturating_add(service) - now)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Scope {
    All,
    /// `/package.Service/`, with both slashes.
    Service(String),
    /// `/package.Service/Method`.
    Method(String),
}

impl Scope {
    /// A method path or a service prefix, with its leading slash or without (the balancer's
    /// policies name methods `package.Service/Method`): both are the request's `/`-led path.
    fn parse(path: &str) -> Scope {
        let rest = path.strip_prefix('/').unwrap_or(path);
        let parts = rest
            .split_once('/')
            .filter(|(service, method)| !service.is_empty() && !method.contains('/'));
        match parts {
            Some((_, "")) => Scope::Service(format!("/{rest}")),
            Some(_) => Scope::Method(format!("/{rest}")),
            None => panic!(
                "Faults::set_method: {path:?} is neither a method path \
                 (\"/package.Service/Method\" or \"package.Service/Method\") nor a service \
                 prefix (\"/package.Service/\" or \"package.Service/\")"
            ),
        }
    }
}

/// Every script set, replaced as a whole on each change (read without a lock on every call).
#[derive(Clone, Debug, Default)]
struct Table {
    all: Option<Arc<Armed>>,
    services: HashMap<String, Arc<Armed>>,
    methods: HashMap<String, Arc<Armed>>,
}

impl Table {
    /// The most specific script for `path`.
    fn find(&self, path: &str) -> Option<&Arc<Armed>> {
        if let Some(armed) = self.methods.get(path) {
            return Some(armed);
        }
        let service = path.rfind('/').map(|i| &path[..=i]);
        service
            .and_then(|s| self.services.get(s))
            .or(self.all.as_ref())
    }
}

// ---------------------------------------------------------------------------------------------
// The handle
// ---------------------------------------------------------------------------------------------

/// The calls a layer saw, for one method or all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MethodCount {
    /// Calls started (every call the layer saw, faulted or not, refused included).
    pub calls: u64,
    /// Calls whose response has not ended yet (its body ended or was dropped).
    pub in_flight: usize,
    /// The most calls in flight at once.
    pub peak_in_flight: usize,
}

#[derive(Debug, Default)]
struct Counter {
    calls: AtomicU64,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl Counter {
    fn read(&self) -> MethodCount {
        MethodCount {
            calls: self.calls.load(Ordering::SeqCst),
            in_flight: self.in_flight.load(Ordering::SeqCst),
            peak_in_flight: self.peak.load(Ordering::SeqCst),
        }
    }

    /// One more call; returns the calls in flight now, this one included.
    fn enter(&self) -> usize {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        now
    }

    fn reset(&self) {
        self.calls.store(0, Ordering::SeqCst);
        self.peak
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct Shared {
    scripts: ArcSwap<Table>,
    total: Counter,
    // A test tool: one short lock per call for the per-method counts (and for the limit's
    // scope, which must be counted together with the call's own increment) costs nothing
    // next to a gRPC call. The counters themselves are atomics that a call's guard releases
    // without the lock.
    methods: Mutex<HashMap<String, Arc<Counter>>>,
    /// splitmix64's state.
    rng: AtomicU64,
    /// Set: the request messages of every new call are kept ([`Faults::record_messages`]).
    recording: AtomicBool,
    /// The request messages kept, by method path, in the order they arrived.
    messages: Mutex<HashMap<String, Vec<Bytes>>>,
    /// The calls held now, and the releases made ahead of them.
    held: Mutex<Held>,
}

/// The handle to a fault layer: cheap to clone, shared by the layer ([`Faults::layer`]) and
/// the test, which changes the script and reads the counts while calls run.
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer_fleet::fault::{Faults, Script};
///
/// let faults = Faults::new();
/// let layer = faults.layer(); // for `Server::builder().layer(..)`
/// faults.set(Script::new().delay(Duration::from_millis(5)));
/// faults.set_method("/fleet.v1.Fleet/Unary", Script::new().hold());
/// faults.clear();
/// assert_eq!(faults.calls(), 0);
/// # let _ = layer;
/// ```
#[derive(Clone, Debug)]
pub struct Faults {
    shared: Arc<Shared>,
}

impl Default for Faults {
    fn default() -> Faults {
        Faults::new()
    }
}

impl Faults {
    /// A handle with no fault and no count, its pseudo-random sequence seeded with 0.
    pub fn new() -> Faults {
        Faults {
            shared: Arc::new(Shared {
                scripts: ArcSwap::from_pointee(Table::default()),
                total: Counter::default(),
                methods: Mutex::new(HashMap::new()),
                rng: AtomicU64::new(0),
                recording: AtomicBool::new(false),
                messages: Mutex::new(HashMap::new()),
                held: Mutex::new(Held::default()),
            }),
        }
    }

    /// Restarts the pseudo-random sequence of [`Script::stall`] from `seed`.
    pub fn seed(&self, seed: u64) {
        self.shared.rng.store(seed, Ordering::SeqCst);
    }

    /// The layer to put around a service; every layer of one handle shares its scripts and
    /// counts.
    ///
    /// ```no_run
    /// use tonic_balancer_fleet::fault::Faults;
    ///
    /// # async fn run() -> Result<(), tonic::transport::Error> {
    /// let faults = Faults::new();
    /// let (_reporter, health) = tonic_health::server::health_reporter();
    /// tonic::transport::Server::builder()
    ///     .layer(faults.layer())
    ///     .add_service(health)
    ///     .serve("127.0.0.1:50051".parse().unwrap())
    ///     .await
    /// # }
    /// ```
    pub fn layer(&self) -> FaultLayer {
        FaultLayer {
            shared: self.shared.clone(),
        }
    }

    /// `script` for every method from now on, except those with a script of their own or of
    /// their service ([`Faults::set_method`]).
    pub fn set(&self, script: Script) {
        self.shared.scripts.rcu(|table| {
            let mut table = Table::clone(table);
            table.all = (!script.is_none()).then(|| Armed::new(script.clone(), Scope::All));
            table
        });
    }

    /// `script` for one method (`"/package.Service/Method"`, or `"package.Service/Method"` as
    /// the balancer's policies name it) or for every method of a service
    /// (`"/package.Service/"`, with its final slash; the leading one may be left out) from now
    /// on. The most specific script
    /// wins: the method's, then its service's, then the one of [`Faults::set`];
    /// `Script::default()` here exempts the method or service from a less specific script.
    ///
    /// ```
    /// use tonic::Code;
    /// use tonic_balancer_fleet::fault::{Faults, Script};
    ///
    /// let faults = Faults::new();
    /// faults.set_method("/fleet.v1.Fleet/", Script::new().fail(Code::Unavailable, "down"));
    /// faults.set_method("/fleet.v1.Fleet/Unary", Script::new()); // unary calls go through
    /// faults.set_method("fleet.v1.Fleet/Stream", Script::new()); // the balancer's form: the same
    /// ```
    ///
    /// # Panics
    ///
    /// If `path` is neither of these forms (it names the path).
    pub fn set_method(&self, path: &str, script: Script) {
        let scope = Scope::parse(path);
        self.shared.scripts.rcu(|table| {
            let mut table = Table::clone(table);
            let armed = Armed::new(script.clone(), scope.clone());
            match &scope {
                Scope::Service(p) => table.services.insert(p.clone(), armed),
                Scope::Method(p) => table.methods.insert(p.clone(), armed),
                Scope::All => unreachable!("Scope::parse makes no Scope::All"),
            };
            table
        });
    }

    /// No fault anywhere from now on (calls already held stay held until released).
    pub fn clear(&self) {
        self.shared.scripts.store(Arc::new(Table::default()));
    }

    /// Lets `n` held calls go on: those held now first, oldest first; what is left of `n`
    /// lets the next calls to be held go on at once (as permits of a semaphore would), so that
    /// a release made before the calls arrive is not lost. Returns how many held calls it let
    /// go now.
    pub fn release(&self, n: usize) -> usize {
        let mut held = self.shared.held.lock().unwrap();
        let mut released = 0;
        while released < n {
            let Some(call) = held.calls.pop_front() else {
                break;
            };
            if call.send(()).is_ok() {
                released += 1;
            }
        }
        held.credit = held.credit.saturating_add(n - released);
        released
    }

    /// The calls held now ([`Script::hold`]), not counting those whose client went away.
    pub fn held(&self) -> usize {
        let mut held = self.shared.held.lock().unwrap();
        held.calls.retain(|call| !call.is_closed());
        held.calls.len()
    }

    /// Keeps (`true`) or stops keeping (`false`) the request messages of the calls that start
    /// from now on, for [`Faults::messages`]: each gRPC message as it arrives (the bytes
    /// after its 5-byte prefix, compressed if the client compressed it), once it is whole. A
    /// message arrives when the service reads it, or when the layer reads the request before
    /// its fault ([`Point::AfterRequest`]); a call answered by a fault before it reads its
    /// request ([`Point::BeforeCall`]) leaves none.
    pub fn record_messages(&self, on: bool) {
        self.shared.recording.store(on, Ordering::SeqCst);
    }

    /// The request messages kept on the method `path` (`"/package.Service/Method"`), in the
    /// order they arrived ([`Faults::record_messages`]); decode them with the method's type
    /// (`prost::Message::decode`).
    pub fn messages(&self, path: &str) -> Vec<Bytes> {
        let messages = self.shared.messages.lock().unwrap();
        messages.get(path).cloned().unwrap_or_default()
    }

    /// Calls started, on every method (faulted or not, refused included).
    pub fn calls(&self) -> u64 {
        self.shared.total.calls.load(Ordering::SeqCst)
    }

    /// Calls whose response has not ended (body ended, or dropped), on every method.
    pub fn in_flight(&self) -> usize {
        self.shared.total.in_flight.load(Ordering::SeqCst)
    }

    /// The most calls in flight at once, on every method.
    pub fn peak_in_flight(&self) -> usize {
        self.shared.total.peak.load(Ordering::SeqCst)
    }

    /// The counts of one method path (`"/package.Service/Method"`); all zero if the layer
    /// never saw it.
    pub fn method(&self, path: &str) -> MethodCount {
        let methods = self.shared.methods.lock().unwrap();
        methods.get(path).map(|c| c.read()).unwrap_or_default()
    }

    /// The counts of every method path the layer saw (since [`Faults::reset_counts`]), sorted
    /// by path.
    pub fn methods(&self) -> Vec<(String, MethodCount)> {
        let methods = self.shared.methods.lock().unwrap();
        let mut all: Vec<_> = methods.iter().map(|(p, c)| (p.clone(), c.read())).collect();
        drop(methods);
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Zeroes the counts of calls, and brings the peaks down to the calls in flight now. The
    /// calls in flight stay counted (they leave the count when they end); a method with none
    /// is forgotten. The scripts' own counters (cold calls, `one_in`) and the pseudo-random
    /// sequence are not reset.
    pub fn reset_counts(&self) {
        let mut methods = self.shared.methods.lock().unwrap();
        self.shared.total.reset();
        methods.retain(|_, c| c.in_flight.load(Ordering::SeqCst) > 0);
        for c in methods.values() {
            c.reset();
        }
    }
}

impl Shared {
    /// Counts a new call on `path`; returns its guard and the calls in flight in `scope` (at
    /// the layer without one), this one included.
    fn enter(self: &Arc<Self>, path: &str, scope: Option<&Scope>) -> (CallGuard, usize) {
        let mut methods = self.methods.lock().unwrap();
        let method = match methods.get(path) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(Counter::default());
                methods.insert(path.to_owned(), c.clone());
                c
            }
        };
        let in_method = method.enter();
        let total = self.total.enter();
        let in_scope = match scope {
            None | Some(Scope::All) => total,
            Some(Scope::Method(_)) => in_method,
            Some(Scope::Service(prefix)) => methods
                .iter()
                .filter(|(p, _)| p.starts_with(prefix.as_str()))
                .map(|(_, c)| c.in_flight.load(Ordering::SeqCst))
                .sum(),
        };
        drop(methods);
        let guard = CallGuard {
            shared: self.clone(),
            method,
        };
        (guard, in_scope)
    }

    /// A uniform draw in `[0, 1)`: splitmix64.
    fn draw(&self) -> f64 {
        let mut z = self
            .rng
            .fetch_add(GOLDEN_GAMMA, Ordering::SeqCst)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Registers a held call; it goes on when the receiver completes.
    fn hold(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        let mut held = self.held.lock().unwrap();
        if held.credit > 0 {
            held.credit -= 1;
            let _ = tx.send(());
            return rx;
        }
        held.calls.retain(|call| !call.is_closed());
        held.calls.push_back(tx);
        rx
    }
}

impl Shared {
    /// The request with its body as the layer passes it on: its messages kept as they pass
    /// while [`Faults::record_messages`] says so.
    fn recorded<B>(self: &Arc<Self>, req: Request<B>) -> Request<tonic::body::Body>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if !self.recording.load(Ordering::Relaxed) {
            return req.map(tonic::body::Body::new);
        }
        let path = req.uri().path().to_owned();
        let shared = self.clone();
        req.map(|body| {
            tonic::body::Body::new(Recording {
                body: tonic::body::Body::new(body),
                shared,
                path,
                buf: bytes::BytesMut::new(),
            })
        })
    }
}

/// A request body that keeps each whole gRPC message that passes through it.
struct Recording {
    body: tonic::body::Body,
    shared: Arc<Shared>,
    path: String,
    /// What arrived of the message not yet whole.
    buf: bytes::BytesMut,
}

impl Body for Recording {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                this.buf.extend_from_slice(data);
                let mut whole = Vec::new();
                while this.buf.len() >= 5 {
                    let len =
                        u32::from_be_bytes([this.buf[1], this.buf[2], this.buf[3], this.buf[4]])
                            as usize;
                    if this.buf.len() < 5 + len {
                        break;
                    }
                    let mut message = this.buf.split_to(5 + len);
                    whole.push(message.split_off(5).freeze());
                }
                if !whole.is_empty() {
                    let mut messages = this.shared.messages.lock().unwrap();
                    messages.entry(this.path.clone()).or_default().extend(whole);
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The held calls ([`Script::hold`]) and the releases made ahead of them.
#[derive(Debug, Default)]
struct Held {
    /// One sender per held call, oldest first; a cancelled call's sender is closed.
    calls: VecDeque<oneshot::Sender<()>>,
    /// Releases not used yet: the next calls to be held go on at once.
    credit: usize,
}

/// A call in flight: released when dropped (with the response body, or with the future of a
/// call cancelled before its response).
struct CallGuard {
    shared: Arc<Shared>,
    method: Arc<Counter>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.method.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.shared.total.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl fmt::Debug for CallGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallGuard").finish_non_exhaustive()
    }
}

/// What the layer does to one call, decided when it starts.
#[derive(Debug, Default)]
struct Plan {
    wait: Duration,
    hold: bool,
    hang: bool,
    status: Option<(Code, String)>,
    trailers: Vec<(AsciiMetadataKey, AsciiMetadataValue)>,
}

impl Plan {
    fn is_none(&self) -> bool {
        self.wait.is_zero() && !self.hold && !self.hang && self.status.is_none()
    }

    fn status(&mut self) -> Option<Status> {
        let (code, message) = self.status.take()?;
        Some(make_status(code, message, &self.trailers))
    }
}

fn make_status(
    code: Code,
    message: String,
    trailers: &[(AsciiMetadataKey, AsciiMetadataValue)],
) -> Status {
    let mut metadata = MetadataMap::new();
    for (k, v) in trailers {
        metadata.append(k.clone(), v.clone());
    }
    Status::with_metadata(code, message, metadata)
}

// ---------------------------------------------------------------------------------------------
// The layer and its service
// ---------------------------------------------------------------------------------------------

/// The [`tower::Layer`] of a [`Faults`] handle: wraps a service in a [`FaultService`].
#[derive(Clone, Debug)]
pub struct FaultLayer {
    shared: Arc<Shared>,
}

impl<S> tower::Layer<S> for FaultLayer {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> FaultService<S> {
        FaultService {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// A service under a [`FaultLayer`]: does to each call what its handle's script says, and
/// counts it.
#[derive(Clone)]
pub struct FaultService<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for FaultService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for FaultService<S>
where
    S: tower::Service<Request<tonic::body::Body>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Send + 'static,
{
    type Response = Response<FaultBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let req = self.shared.recorded(req);
        let table = self.shared.scripts.load();
        let armed = table
            .find(req.uri().path())
            .filter(|a| !a.script.is_none())
            .cloned();
        drop(table);
        let counted_scope = armed
            .as_ref()
            .filter(|a| a.script.limit.is_some() || !a.script.per_call_in_flight.is_zero())
            .map(|a| &a.scope);
        let (guard, in_scope) = self.shared.enter(req.uri().path(), counted_scope);

        let Some(armed) = armed else {
            return ResponseFuture::direct(
                self.inner.call(req.map(tonic::body::Body::new)),
                guard,
                None,
            );
        };
        let script = &armed.script;

        if let Some((n, code)) = script.limit {
            if in_scope > n {
                let message = format!("fault: more than {n} calls in flight");
                let status = make_status(code, message, &script.trailers);
                return ResponseFuture::ready(status_response(status, guard));
            }
        }

        let mut plan = Plan {
            wait: script.delay,
            hold: script.hold,
            hang: script.hang,
            status: None,
            trailers: script.trailers.clone(),
        };
        let others = u32::try_from(in_scope.saturating_sub(1)).unwrap_or(u32::MAX);
        plan.wait = plan
            .wait
            .saturating_add(script.per_call_in_flight.saturating_mul(others));
        if let Some((p, d)) = script.stall {
            if self.shared.draw() < p {
                plan.wait = plan.wait.saturating_add(d);
            }
        }
        if let Some(service) = script.queue {
            plan.wait = plan.wait.saturating_add(armed.queue_wait(service));
        }
        if let Some((_, d)) = script.cold {
            let cold = armed
                .cold_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if cold {
                plan.wait = plan.wait.saturating_add(d);
            }
        }
        let seen = armed.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if script.one_in.is_none_or(|n| seen % n.get() == 0)
            && script.chance.is_none_or(|p| self.shared.draw() < p)
        {
            plan.status = script.fail.clone();
        }

        if plan.is_none() {
            return ResponseFuture::direct(
                self.inner.call(req.map(tonic::body::Body::new)),
                guard,
                None,
            );
        }
        let point = script.point;
        if point == Point::AtEnd {
            let end = EndStage::new(plan, self.shared.clone());
            return ResponseFuture::direct(
                self.inner.call(req.map(tonic::body::Body::new)),
                guard,
                Some(Box::new(end)),
            );
        }

        // The service readied by `poll_ready` goes into the future; this one keeps a clone.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        ResponseFuture::boxed(Box::pin(async move {
            let req = if point == Point::AfterRequest {
                buffer(req).await
            } else {
                req.map(tonic::body::Body::new)
            };
            if !plan.wait.is_zero() {
                tokio::time::sleep(plan.wait).await;
            }
            if plan.hold {
                let _ = shared.hold().await;
            }
            if plan.hang {
                std::future::pending::<()>().await;
            }
            if let Some(status) = plan.status() {
                return Ok(status_response(status, guard));
            }
            let response = inner.call(req).await?;
            Ok(response.map(|body| FaultBody::new(body, Some(guard), None)))
        }))
    }
}

/// A trailers-only answer with `status`, carrying the call's guard.
fn status_response<B>(status: Status, guard: CallGuard) -> Response<FaultBody<B>> {
    let mut response = status.into_http::<FaultBody<B>>();
    response.body_mut().guard = Some(guard);
    response
}

/// Reads the whole request body; returns the request with a body that replays it.
async fn buffer<B>(req: Request<B>) -> Request<tonic::body::Body>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let mut body = std::pin::pin!(body);
    let mut replay = Replay::default();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        match frame {
            Ok(frame) => replay.frames.push_back(frame),
            Err(e) => {
                replay.error = Some(e.into());
                break;
            }
        }
    }
    Request::from_parts(parts, tonic::body::Body::new(replay))
}

/// A request body read in full, replayed: its frames, then its error if it ended with one.
#[derive(Default)]
struct Replay {
    frames: VecDeque<Frame<Bytes>>,
    error: Option<BoxError>,
}

impl Body for Replay {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        Poll::Ready(self.error.take().map(Err))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.error.is_none()
    }
}

// ---------------------------------------------------------------------------------------------
// The response future
// ---------------------------------------------------------------------------------------------

pin_project_lite::pin_project! {
    /// The response future of a [`FaultService`].
    pub struct ResponseFuture<F, B, E> {
        #[pin]
        kind: Kind<F, B, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, B, E> {
        // The service's own future (no fault before the headers).
        Direct {
            #[pin]
            future: F,
            guard: Option<CallGuard>,
            end: Option<Box<EndStage>>,
        },
        // Waits, then the status or the service.
        Boxed {
            future: BoxFuture<Result<Response<FaultBody<B>>, E>>,
        },
        // Refused at once.
        Ready {
            response: Option<Response<FaultBody<B>>>,
        },
    }
}

impl<F, B, E> ResponseFuture<F, B, E> {
    fn direct(future: F, guard: CallGuard, end: Option<Box<EndStage>>) -> Self {
        ResponseFuture {
            kind: Kind::Direct {
                future,
                guard: Some(guard),
                end,
            },
        }
    }

    fn boxed(future: BoxFuture<Result<Response<FaultBody<B>>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }

    fn ready(response: Response<FaultBody<B>>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> fmt::Debug for ResponseFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F, B, E> Future for ResponseFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<FaultBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Direct { future, guard, end } => {
                let response = ready!(future.poll(cx))?;
                let (mut parts, body) = response.into_parts();
                let mut end = end.take();
                if let Some(end) = &mut end {
                    end.take_trailers_only(&mut parts.headers);
                }
                let body = FaultBody::new(body, guard.take(), end);
                Poll::Ready(Ok(Response::from_parts(parts, body)))
            }
            KindProj::Boxed { future } => future.as_mut().poll(cx),
            KindProj::Ready { response } => Poll::Ready(Ok(response
                .take()
                .expect("ResponseFuture polled after it completed"))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The response body
// ---------------------------------------------------------------------------------------------

/// What happens at the end of a response ([`Point::AtEnd`]).
struct EndStage {
    plan: Plan,
    shared: Arc<Shared>,
    /// The service's messages are over.
    reached: bool,
    /// Its trailers (or a trailers-only answer's status), if it had any.
    trailers: Option<HeaderMap>,
    sleep: Option<Pin<Box<Sleep>>>,
    held: Option<oneshot::Receiver<()>>,
}

impl EndStage {
    fn new(plan: Plan, shared: Arc<Shared>) -> EndStage {
        EndStage {
            plan,
            shared,
            reached: false,
            trailers: None,
            sleep: None,
            held: None,
        }
    }

    /// A trailers-only answer (the status in the headers) becomes headers and trailers: its
    /// status moves to the trailers, which the end stage then delays or replaces.
    fn take_trailers_only(&mut self, headers: &mut HeaderMap) {
        if !headers.contains_key(GRPC_STATUS) {
            return;
        }
        let mut trailers = HeaderMap::new();
        for name in [GRPC_STATUS, GRPC_MESSAGE, GRPC_STATUS_DETAILS] {
            if let Some(value) = headers.remove(&name) {
                trailers.insert(name, value);
            }
        }
        self.reach(Some(trailers));
    }

    /// The service's messages are over; `trailers` are its trailers.
    fn reach(&mut self, trailers: Option<HeaderMap>) {
        self.reached = true;
        self.trailers = trailers;
        if !self.plan.wait.is_zero() {
            self.sleep = Some(Box::pin(tokio::time::sleep(self.plan.wait)));
        }
    }

    /// Waits, holds or hangs; then the trailers to send, if any.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<Option<HeaderMap>> {
        if let Some(sleep) = &mut self.sleep {
            ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
        }
        if self.plan.hold {
            let held = self.held.get_or_insert_with(|| self.shared.hold());
            let _ = ready!(Pin::new(held).poll(cx));
            self.held = None;
            self.plan.hold = false;
        }
        if self.plan.hang {
            // Until the client goes away: hyper drops the body when the stream is reset.
            return Poll::Pending;
        }
        let mut trailers = self.trailers.take();
        if let Some(status) = self.plan.status() {
            let trailers = trailers.get_or_insert_with(HeaderMap::new);
            for name in [GRPC_STATUS, GRPC_MESSAGE, GRPC_STATUS_DETAILS] {
                trailers.remove(name);
            }
            // Only fails on a message that is not a valid header value once percent-encoded,
            // which cannot happen.
            let _ = status.add_header(trailers);
        }
        Poll::Ready(trailers)
    }
}

pin_project_lite::pin_project! {
    /// The response body of a [`FaultService`]: the service's body (or none, for the layer's
    /// own trailers-only answers), with the same data and error types, plus what happens at
    /// its end ([`Point::AtEnd`]). Carries the call's place in the counts until it ends or is
    /// dropped.
    pub struct FaultBody<B> {
        #[pin]
        inner: Option<B>,
        end: Option<Box<EndStage>>,
        guard: Option<CallGuard>,
    }
}

impl<B> FaultBody<B> {
    fn new(inner: B, guard: Option<CallGuard>, end: Option<Box<EndStage>>) -> FaultBody<B> {
        FaultBody {
            inner: Some(inner),
            end,
            guard,
        }
    }
}

/// An empty body: what a trailers-only answer has.
impl<B> Default for FaultBody<B> {
    fn default() -> FaultBody<B> {
        FaultBody {
            inner: None,
            end: None,
            guard: None,
        }
    }
}

impl<B> fmt::Debug for FaultBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultBody")
            .field("empty", &self.inner.is_none())
            .field("at_end", &self.end.is_some())
            .finish_non_exhaustive()
    }
}

impl<B: Body> Body for FaultBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let mut this = self.project();
        loop {
            if let Some(end) = this.end.as_mut().filter(|end| end.reached) {
                let trailers = ready!(end.poll_end(cx));
                *this.end = None;
                this.inner.set(None);
                this.guard.take();
                return Poll::Ready(trailers.map(|t| Ok(Frame::trailers(t))));
            }
            let Some(inner) = this.inner.as_mut().as_pin_mut() else {
                this.guard.take();
                return Poll::Ready(None);
            };
            match ready!(inner.poll_frame(cx)) {
                Some(Ok(frame)) if frame.is_trailers() => match this.end.as_mut() {
                    Some(end) => end.reach(frame.into_trailers().ok()),
                    None => {
                        this.guard.take();
                        return Poll::Ready(Some(Ok(frame)));
                    }
                },
                Some(Ok(frame)) => return Poll::Ready(Some(Ok(frame))),
                Some(Err(e)) => {
                    this.guard.take();
                    return Poll::Ready(Some(Err(e)));
                }
                None => match this.end.as_mut() {
                    Some(end) => end.reach(None),
                    None => {
                        this.guard.take();
                        return Poll::Ready(None);
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            None => true,
            Some(_) if self.end.is_some() => false,
            Some(inner) => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            None => SizeHint::with_exact(0),
            // Unknown: no `content-length` from an exact hint while the end may still change.
            Some(_) if self.end.is_some() => SizeHint::default(),
            Some(inner) => inner.size_hint(),
        }
    }
}
