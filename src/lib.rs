//! A client-side load-balancing channel for [tonic]: every call goes to the instance with the
//! fewest calls in flight.
//!
//! [`BalancedChannel`] goes wherever a [`tonic::transport::Channel`] goes: give it to any
//! generated stub (`FooClient::new(channel)`), for unary and streaming calls alike. It holds
//! one tonic `Channel` (one HTTP/2 connection) per instance and routes each call itself.
//!
//! # Quick start
//!
//! ```no_run
//! # mod pb { pub mod greeter_client { #[derive(Clone)] pub struct GreeterClient<T>(T);
//! #   impl<T> GreeterClient<T> { pub fn new(t: T) -> Self { GreeterClient(t) } } } }
//! use tonic_balancer::BalancedChannel;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // Before: let channel = tonic::transport::Channel::from_static("http://10.0.0.7:50051").connect_lazy();
//! let channel = BalancedChannel::from_static([
//!     "http://10.0.0.7:50051",
//!     "http://10.0.0.8:50051",
//!     "http://10.0.0.9:50051",
//! ])?;
//! let client = pb::greeter_client::GreeterClient::new(channel);
//! # let _ = client; Ok(()) }
//! ```
//!
//! # The routing rule
//!
//! Each call goes to the usable instance with the fewest calls in flight; among near ties, to
//! the one expected to answer sooner (the default, [`Strategy::FewestThenFastest`]: a call on
//! an instance that has just answered markedly slower than the rest counts its slowness, at most
//! 4.5; [`Strategy::LeastPending`] is the count alone). A call counts from the moment it is
//! routed until it is completely over: for a response stream, until its trailers are read or
//! the stream is dropped. The count is held by a guard that is released exactly once, whatever ends the call
//! (success, error, deadline, the caller dropping the future or the stream at any point).
//!
//! Why not at random: a random pick (what tonic's `Channel::balance_list` does, since every
//! connection reports load 0 to tower's p2c) lets calls pile up on an instance by chance and
//! keeps sending to an instance that has stalled. Counting calls in flight sees a slow or stuck
//! instance at once: its count rises and it stops winning the pick, with no timer and no
//! tuning. Ties (frequent at low load) go to the instances in turn, so that calls spread
//! evenly; an instance that answers slower than the others (compared on the same method) takes
//! fewer turns, the fewer the slower, and one markedly slower weighs more, and is re-checked
//! one call at a time within a bounded time, so that one slow answer never shuts it out; see
//! [`Strategy`].
//!
//! With many independent clients, a channel's own counts say little of an instance's load:
//! servers can report it (below), and with [`Builder::probes`] the channel asks instances drawn
//! at random how loaded they are (Prequal's probes) and picks among the fresh answers.
//!
//! The pick is a scan over a lock-free snapshot of the instances: atomics only, no lock shared
//! by the calls, no allocation (its time and instructions: `docs/benchmarks.md`, "The pick").
//!
//! # Failures
//!
//! - An instance whose connection cannot be opened is marked [`State::Failing`] and gets no
//!   calls; it is reconnected in the background with gRPC's connection backoff ([`Backoff`]).
//! - A call whose instance could not be reached before any of its request went out (the
//!   connect failed, or the connection closed before the request was written) is sent again,
//!   unseen by the caller (gRPC's transparent retry); so are the calls that were waiting for
//!   that connection, at once. A request reaches each attempt exactly as the caller sent it;
//!   a body that was partly sent is never sent again.
//! - An instance whose calls fail (UNAVAILABLE, RESOURCE_EXHAUSTED, transport error, an answer
//!   that is not gRPC's, a deadline it let pass without answering after holding the call for
//!   4× its usual latency) several times in a row, or far more often than the others', is
//!   ejected for a while and readmitted on probation ([`Ejection`]). Application statuses
//!   (NOT_FOUND, INVALID_ARGUMENT, ...) never count against an instance.
//! - With a [`RetryPolicy`], a failed call is retried after a backoff on an instance it has not
//!   tried, else on one it tried that is still usable (one address: on it, as gRPC does); when
//!   no retry is possible the caller gets the last answer (status, message, trailers)
//!   unchanged.
//! - With a [`HedgingPolicy`] for the idempotent methods that need it, a call without an
//!   answer after a delay is sent again to an instance it has not tried; the first answer wins
//!   and the other attempts are cancelled. A server's `grpc-retry-pushback-ms` delays or stops
//!   retries and hedges.
//! - Membership changes ([`BalancedChannel::replace_all`], discovery) publish the new set in
//!   one step: no call ever sees a set in between.
//! - With no usable instance a call fails at once with UNAVAILABLE and a message that says why,
//!   unless it is a wait-for-ready call ([`WaitForReady`], a service config's `waitForReady`):
//!   that one waits for a usable instance until its deadline (without a deadline, until one is
//!   usable). A call's deadline (`grpc-timeout`, from
//!   `tonic::Request::set_timeout`) bounds the whole call, stream included, and ends it with
//!   DEADLINE_EXCEEDED; an answer that had arrived is still the caller's when it polls late.
//!
//! # Many clients: server-reported load
//!
//! A channel counts only its own calls. Where many clients share the instances, servers can
//! report their load in each response (ORCA, gRFC A51; the `orca` feature's
//! [`OrcaLayer`](orca) does it for tonic servers in one line): the channel reads the reports by
//! itself, and the least-pending pick then counts the calls an instance serves for every
//! client, as long as its report is fresh. [`Strategy::WeightedRoundRobin`] weighs instances by
//! their reported queries, errors and utilization, as gRPC does. A channel that sends an
//! instance few calls can ask for reports out of band, at an interval
//! ([`Builder::load_reports_out_of_band`]; `orca::OobService` serves them). See [`orca`].
//!
//! With thousands of instances and many clients, [`Builder::subset`] makes each client connect
//! to a few of them (deterministic aperture: every instance gets about the same number of
//! clients, given each client's index with [`Builder::subset_client`]; a membership change
//! moves about one instance of a subset); the others get no connection and the pick scans
//! the subset only.
//!
//! # Observability
//!
//! [`BalancedChannel::endpoints`] returns an [`EndpointStats`] per instance and
//! [`BalancedChannel::stats`] the channel's totals ([`ChannelStats`]: calls, attempts, retries,
//! refusals, ejections, discovery); every response carries a [`ServedBy`] extension naming the
//! instance that served it; a status the channel makes itself (no usable instance, the
//! deadline, a connection that failed) has an [`Error`] as its `source()`, so that it can be
//! told from an instance's answer. Each call is a `tracing` span, `tonic_balancer.call` at
//! DEBUG level, with OpenTelemetry's field names: `rpc.method` (`pkg.Service/Method`),
//! `server.address` (the instance that served it), `attempt` and `rpc.grpc.status_code` (the
//! status code's number), recorded as they become known. State changes (`state`,
//! `previous.state`), membership changes and ejections are `tracing` events with a
//! `server.address` field (a call sent again elsewhere names the instance it leaves
//! `previous.server.address`), and each routed call is a `trace` event. With the `metrics`
//! feature, the channel records gRPC's standard client metrics through the `metrics` facade,
//! bounded by default: methods label themselves up to 64, and no instance label unless asked
//! (see the `metrics` module).
//!
//! Sources: [gRFC A51](https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// docs.rs (`--cfg docsrs`, nightly): each item that a feature brings says which.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The module map, from the call's way in to the parts it relies on (docs/design.md, "Layout",
// has the layers).
// The channel a stub calls, and its shared state.
mod channel;
// The life of a call: one machine for every call, plain, replayed, retried or hedged.
mod call;
// The deadline of a call, from its `grpc-timeout`.
mod deadline;
// Opt-in retry and hedging policies, the per-method table, and the budget they share.
mod retry;
// Server pushback (`grpc-retry-pushback-ms`).
mod pushback;
// The pick: the strategies, and the choice over a channel's set.
mod pick;
// The instances' set: a lock-free snapshot, membership changes, subsetting.
mod set;
// One instance: its address, connections, calls in flight and state.
mod instance;
// What is learned of each instance's load: the tie-break, load reports, weights.
mod load;
// Health: the outcome classification, outlier ejection, A17 health checks.
mod health;
// What the channel does when an instance or the set changes.
mod hooks;
// Membership from a registry: DNS, or any [`Resolve`] source.
pub mod discover;
// Server-reported load (ORCA): reports in responses and out of band.
pub mod orca;
/// Load probes (Prequal): an instance's requests in flight and latency estimate, on request.
pub mod probe;
// Membership from an xDS control plane: the ADS client and a channel's resolution.
#[cfg(feature = "xds")]
#[cfg_attr(docsrs, doc(cfg(feature = "xds")))]
pub mod xds;
// The builder: instances, settings, and the checks at build time.
mod builder;
// The checks a settings type makes of itself at build time.
mod checks;
// gRPC service configs, read as grpc-go and grpc-java read them.
#[cfg(feature = "service-config")]
mod service_config;
// gRPC's standard client metrics, through the `metrics` facade.
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
// Tracing spans and the channel's totals.
mod observe;
// Snapshots of one instance: [`EndpointStats`], [`ServedBy`].
mod stats;
// The errors the builder refuses a configuration with, and the channel's own statuses.
mod error;
// The gRPC headers the channel reads.
mod headers;
// The protobuf wire format of the few messages the library reads and writes.
mod protowire;
// tonic's gRPC framing around those messages.
mod codec;
// Where an instance is and how its connections open.
mod target;
// Background tasks that end with what they serve.
mod shutdown;
// The channel's clock.
mod time;
// The random source of the pick and of the timers' jitter.
mod rng;
// Locks of the rare paths.
mod sync;

pub use builder::{Builder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DISCOVERY_TIMEOUT};
pub use call::{ResponseFuture, WaitForReady};
pub use channel::BalancedChannel;
#[cfg(feature = "hickory-dns")]
pub use discover::DnsSettings;
pub use discover::{Dns, Resolve};
pub use error::Error;
#[cfg(feature = "health-check")]
pub use health::HealthCheck;
pub use health::{Backoff, Ejection};
pub use instance::conns::{
    DEFAULT_CONNECTION_IDLE, DEFAULT_MAX_CONNECTIONS, DEFAULT_STREAMS_PER_CONNECTION,
};
pub use instance::State;
pub use observe::{ChannelStats, ConnectivityState, DiscoveryState};
pub use pick::Strategy;
pub use probe::ProbeConfig;
pub use retry::{HedgingPolicy, RetryPolicy, DEFAULT_MAX_REPLAY_BODY};
#[cfg(feature = "service-config")]
pub use service_config::ServiceConfig;
pub use stats::{EndpointStats, ServedBy};
/// A change of the instances, as tonic's own `Channel::balance_channel` takes it: what
/// [`BalancedChannel::balance_channel`]'s sender takes, and one of the two shapes
/// [`Builder::discover`] follows. tonic's type, re-exported: a tonic user's
/// `tonic::transport::channel::Change` is this very type.
pub use tonic::transport::channel::Change;

#[doc(hidden)]
#[path = "bench.rs"]
pub mod __bench;

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// A builder or a settings value whose result is dropped is a warning (`#[must_use]`; denied
/// in these tests), where a setter called for nothing would silently do nothing:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// fn set_up(builder: tonic_balancer::Builder) {
///     builder.uri("http://10.0.0.7:50051"); // dropped
/// }
/// ```
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// fn set_up(backoff: tonic_balancer::Backoff) {
///     backoff.multiplier(2.0); // dropped
/// }
/// ```
///
/// The same code, its results kept, compiles:
///
/// ```
/// #![deny(unused_must_use)]
/// fn set_up(builder: tonic_balancer::Builder, backoff: tonic_balancer::Backoff) {
///     let _ = builder.uri("http://10.0.0.7:50051");
///     let _ = backoff.multiplier(2.0);
/// }
/// ```
#[cfg(doctest)]
pub struct MustUseDoctests;
