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
//! by the calls, no allocation: for 50 instances 86-94 ns on one thread, busy or idle, on
//! the machine of docs/benchmarks.md in its quiet spells, and up to twice that in its slow ones
//! (`benches/pick.rs`). Idle, it is as fast as least pending's; busy, with instances gated for
//! slow answers, it takes about a sixth more instructions (its weighted counts: 1,063 against
//! 917, `scripts/instructions.sh pick`).
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

#![forbid(unsafe_code)]
#![warn(missing_docs)]
// docs.rs (`--cfg docsrs`, nightly): each item that a feature brings says which.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod call;

mod channel;
mod checks;
mod deadline;
pub mod discover;
mod error;
mod headers;
mod health;
mod hedge;
mod hooks;
mod instance;
#[cfg(feature = "metrics")]
pub mod metrics;
#[cfg(not(feature = "metrics"))]
mod metrics;
mod observe;
pub mod orca;
mod pick;
/// Load probes (Prequal): an instance's requests in flight and latency estimate, on request.
pub mod probe;
mod protowire;
mod pushback;
mod retry;
mod rng;
#[cfg(feature = "service-config")]
mod service_config;
mod set;
mod shutdown;
mod stats;
mod target;
mod time;

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
pub use hedge::HedgingPolicy;
pub use instance::conns::{
    DEFAULT_CONNECTION_IDLE, DEFAULT_MAX_CONNECTIONS, DEFAULT_STREAMS_PER_CONNECTION,
};
pub use instance::State;
pub use observe::{ChannelStats, DiscoveryState};
pub use probe::ProbeConfig;
pub use retry::{RetryPolicy, DEFAULT_MAX_REPLAY_BODY};
#[cfg(feature = "service-config")]
pub use service_config::ServiceConfig;
pub use stats::{EndpointStats, ServedBy};
/// A change of the instances, as tonic's own `Channel::balance_channel` takes it: what
/// [`BalancedChannel::balance_channel`]'s sender takes, and one of the two shapes
/// [`Builder::discover`] follows. tonic's type, re-exported: a tonic user's
/// `tonic::transport::channel::Change` is this very type.
pub use tonic::transport::channel::Change;

/// Locks a mutex of the channel's rare paths (membership, discovery, replay), going on past a
/// panic in another holder: what they guard stays consistent at every step.
#[inline(always)]
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How the channel chooses the instance for a call. All of them skip instances that are
/// failing, ejected, unhealthy or draining.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Fewest calls in flight first, and among near ties the instance expected to answer
    /// sooner. The default.
    ///
    /// Each call in flight counts one, except on an instance that answered markedly slower
    /// than the rest twice in a row (more than twice its method's usual time, compared on the
    /// same method; one slow answer alone is the tail every instance has): until it is
    /// re-checked, each of its calls counts its slowness, at most 4.5. The lowest
    /// count, with the call to be sent (calls in flight plus one, weighed so), wins, and equal
    /// counts take turns as in [`LeastPending`](Strategy::LeastPending). So among equally fast
    /// instances this is least pending exactly; an instance that has answered twenty times
    /// slower with one, two or three calls fewer than the others loses; and an instance whose
    /// calls in flight plus one are more than 4.5 times the fewest plus one never wins, however
    /// slow the one with the fewest has been. A slow instance is re-checked with one call at a
    /// time, at first after ten times the time its answer was late by; once it is slow again
    /// (a third slow answer in a row, or a slow re-check), after at least two hundred times its
    /// method's usual time (a second where 5 ms is usual),
    /// then twice, four times... as long (at most 10 s) while it stays slow: a bounded number of
    /// calls per second whatever the rate, not a share of the traffic; its first fast answer
    /// counts it as one call again.
    #[default]
    FewestThenFastest,
    /// The instance with the fewest calls in flight; among those, equally fast instances take
    /// turns, and one that answers slower than the rest wins fewer of the ties, the fewer the
    /// slower it is, without ever being shut out (see the crate docs).
    LeastPending,
    /// The next instance in turn, ignoring load: a baseline for comparisons.
    RoundRobin,
    /// The less loaded of two distinct instances chosen at random (as tower's `p2c`).
    PowerOfTwoChoices,
    /// The lowest (calls in flight + 1) × peak-sensitive moving average of latency, as in
    /// Finagle and linkerd. The calls are this channel's own: calls in flight that instances
    /// report ([`orca`]) are not added, since the latency already carries the other clients'
    /// load.
    PeakEwma,
    /// Weighted round robin from the instances' load reports, as gRPC specifies it (gRFC
    /// A58): weights from the reported queries, errors and utilization, an
    /// earliest-deadline-first order; plain round robin until two instances have weights.
    /// Needs servers that report their load (see [`orca`]); set its settings with
    /// [`Builder::weighted_round_robin`].
    WeightedRoundRobin,
}

#[doc(hidden)]
pub mod __bench {
    //! Internals exposed for `benches/` only; not part of the API.
    pub use crate::pick::{
        least_pending, peak_ewma, power_of_two, round_robin, Chosen, Load, Rng, Turn,
    };
    pub use crate::set::strides_for;
    pub use crate::set::subset::{choose_by as subset_of, id_of as ring_id};

    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// The probes' hot-cold choice (Prequal's rule, as a channel with probes makes it) among
    /// `(index, answer)` pairs (at most 64), with `q` the quantile of the calls in flight above
    /// which an answer is hot: the index of the chosen pair's instance; `None` with fewer than
    /// two answers.
    pub fn hot_cold(answers: &[(u32, crate::probe::ProbeAnswer)], q: f64) -> Option<usize> {
        use crate::probe::Fresh;
        let none = Fresh {
            rif: 0,
            latency_us: 0,
        };
        let mut fresh = [(0u32, none); 64];
        let n = answers.len().min(fresh.len());
        for (slot, (i, a)) in fresh.iter_mut().zip(answers) {
            *slot = (*i, Fresh::of(a));
        }
        crate::pick::probed::hot_cold(&fresh[..n], q)
    }

    /// A deterministic stream of numbers (xorshift), for the benchmarks' fleets.
    pub fn numbers(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The benchmarks' fleet of `n` instances, `(calls in flight, latency, usable)` each, as
    /// the pick meets them under load (`busy`: 0 to 3 calls in flight, latencies of 2 to 10
    /// ms, one instance in twenty unusable) or on an idle fleet (nothing in flight, 2 ms).
    pub fn fleet(n: usize, busy: bool) -> Vec<(usize, Duration, bool)> {
        let mut next = numbers(0x5EED + n as u64);
        (0..n)
            .map(|_| {
                let r = next();
                if busy {
                    let lat = Duration::from_micros(2_000 + (r >> 8) % 8_000);
                    ((r % 4) as usize, lat, r % 20 != 7)
                } else {
                    (0, Duration::from_millis(2), true)
                }
            })
            .collect()
    }

    /// The channel's own pick over real instance records (whose connections are never
    /// opened), to measure the pick as calls make it.
    pub struct Picker {
        channel: crate::BalancedChannel,
    }

    impl Picker {
        /// `n` instances on 127.0.0.1 ports 1..=n (never connected). Needs a tokio runtime.
        pub fn new(n: usize, strategy: crate::Strategy) -> Picker {
            let mut b = crate::BalancedChannel::builder().strategy(strategy);
            if strategy == crate::Strategy::WeightedRoundRobin {
                b = b.weighted_round_robin(
                    crate::instance::load::WrrConfig::default().blackout_period(Duration::ZERO),
                );
            }
            for port in 1..=n {
                b = b.uri(&format!("http://127.0.0.1:{port}"));
            }
            Picker {
                channel: b.build().expect("valid bench set-up"),
            }
        }

        /// A channel over `n` instances as [`new`](Picker::new) makes them, with subsetting:
        /// client `index` of `count` keeps `size` of them (`Builder::subset`).
        pub fn with_subset(
            n: usize,
            strategy: crate::Strategy,
            size: usize,
            index: usize,
            count: usize,
        ) -> Picker {
            let mut b = crate::BalancedChannel::builder()
                .strategy(strategy)
                .subset(size)
                .subset_client(index, count);
            for port in 1..=n {
                b = b.uri(&format!("http://127.0.0.1:{port}"));
            }
            Picker {
                channel: b.build().expect("valid bench set-up"),
            }
        }

        /// The instances the pick chooses among (the subset, with subsetting).
        pub fn len(&self) -> usize {
            self.channel.shared.snapshot().len()
        }

        /// Whether the pick has no instance to choose.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }

        /// Sets one instance's load as the pick will read it: calls in flight, and one answer
        /// in `latency` where the method's reference is 2 ms.
        pub fn set(&self, i: usize, in_flight: usize, latency: Duration, usable: bool) {
            let pool = &self.channel.shared;
            let snap = pool.snapshot();
            let inst = &snap[i];
            inst.standing.set_calls(in_flight);
            let ns = latency.as_nanos() as f64;
            inst.latency_ns.store(ns.to_bits(), Ordering::Relaxed);
            inst.steady_ns.store(ns.to_bits(), Ordering::Relaxed);
            // One second into the channel's life, its previous answer long before: one slow
            // answer gates at once, as where answers come rarely.
            let now = pool.ctx.now_ns() + 1_000_000_000;
            inst.tie.answered_long_before(1);
            pool.ctx.methods.noise.settle_quiet();
            let noise = &pool.ctx.methods.noise;
            let gated = inst
                .tie
                .observe_gated(ns, 2e6, now, now, pool.ctx.gate, noise);
            pool.ctx.gated_until.fetch_max(gated, Ordering::Relaxed);
            inst.latency_at.store(now, Ordering::Relaxed);
            pool.ctx.clock.fetch_max(now, Ordering::Relaxed);
            inst.set_state(if usable {
                crate::State::Ready
            } else {
                crate::State::Ejected
            });
        }

        /// Sets every instance's load as [`fleet`] has it (busy or idle).
        pub fn set_fleet(&self, busy: bool) {
            for (i, (in_flight, latency, usable)) in fleet(self.len(), busy).into_iter().enumerate()
            {
                self.set(i, in_flight, latency, usable);
            }
        }

        /// Gives instance `i` a load report of `others` calls in flight from other clients,
        /// fresh for as long as a report can be (the pick then reads every instance's reported
        /// count, as it does while any instance's report is fresh).
        pub fn report(&self, i: usize, others: u64) {
            let pool = &self.channel.shared;
            let snap = pool.snapshot();
            let now = pool.ctx.now_ns();
            let until = snap[i].others.set(others, now, u32::MAX / 2);
            pool.ctx.reports_fresh.note(until);
        }

        /// Removes the last instance while a call holds it (it drains) and takes it back at
        /// once, as a discovery answer that names it again does: the same instance, last again.
        pub fn remove_and_take_back_last(&self) {
            let snap = self.channel.shared.snapshot();
            let endpoints: Vec<_> = snap.iter().map(|i| i.target.endpoint.clone()).collect();
            // What a call in flight holds: the instance drains rather than closes.
            let held = snap.last().expect("an instance").clone();
            drop(snap);
            assert!(self.channel.shared.set().remove(&held.target.key));
            let (added, _) = self
                .channel
                .replace_all(endpoints)
                .expect("the same endpoints");
            assert_eq!(added, 1);
            let snap = self.channel.shared.snapshot();
            assert!(
                std::sync::Arc::ptr_eq(snap.last().expect("an instance"), &held),
                "taken back, not made anew"
            );
        }

        /// Gives instance `i` a weighted-round-robin weight (a report of `weight` queries per
        /// second at utilization 1), then rebuilds the schedule as the channel's task does.
        /// For a channel built with [`Strategy::WeightedRoundRobin`](crate::Strategy) and no
        /// blackout.
        pub fn set_weights(&self, weights: &[f64]) {
            let pool = &self.channel.shared;
            let snap = pool.snapshot();
            let cfg = pool.ctx.reports.wrr;
            let now = pool.ctx.now_ns();
            for (inst, &w) in snap.iter().zip(weights) {
                let report = crate::instance::load::LoadReport {
                    rps_fractional: w,
                    cpu_utilization: 1.0,
                    ..Default::default()
                };
                inst.reported.wrr.update(&report, now, &cfg);
            }
            pool.picker.wrr.rebuild(&snap, now, &cfg);
        }

        /// One pick, exactly as a call makes it.
        #[inline]
        pub fn pick(&self) -> Option<usize> {
            let pool = &self.channel.shared;
            let snap = pool.snapshot();
            crate::pick::dispatch::pick(
                &pool.picker,
                &snap,
                &[],
                crate::instance::tie::Method::NONE,
            )
        }

        /// Adds `delta` to instance `i`'s count, as a call's guard does.
        #[inline]
        pub fn bump(&self, i: usize, up: bool) {
            let snap = self.channel.shared.snapshot();
            if up {
                snap[i].standing.enter();
            } else {
                snap[i].standing.leave();
            }
        }
    }
}

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
