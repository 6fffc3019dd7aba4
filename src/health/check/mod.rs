//! Active health checks as gRPC's client-side health checking specifies them ([gRFC A17],
//! "Client-Side Health Checking"), with the standard `grpc.health.v1.Health/Watch` stream
//! (tonic-health's client), over each instance's own connection.
//!
//! The stream is the channel's, not a caller's: it goes straight to the instance's tonic
//! `Channel`, so it is never picked, balanced, retried, or counted in the instance's calls in
//! flight (it does take one of the connection's streams, as A17's "Caveats" say). Its rules,
//! from A17's "Client Workflow" and the `Watch` method's contract in [`health.proto`]:
//!
//! - one `Watch` per instance, opened when it joins (opening its connection if there is none
//!   yet), asking about [`HealthCheck::service`];
//! - the server answers at once and again whenever the status changes; the instance is in
//!   service only while the last status is `SERVING`: any other (`NOT_SERVING`, `UNKNOWN`,
//!   `SERVICE_UNKNOWN`) takes it out ([`State::Unhealthy`](crate::State::Unhealthy)) until
//!   `SERVING` comes;
//! - the stream ending with any status but UNIMPLEMENTED (OK included: "the server ended the
//!   stream") takes the instance out too (A17's TRANSIENT_FAILURE), and the stream is opened
//!   again: at once if it had carried an answer (A17: an answer resets the backoff), else
//!   after an exponential backoff, until an answer says `SERVING`;
//! - UNIMPLEMENTED: the server has no health service. The instance counts as healthy, and is
//!   not asked again on that connection (A17: "act as if health checking is disabled"); one
//!   warning says so (A17 logs it at ERROR: a server without health checks is a choice, not a
//!   fault of this client);
//! - a new connection (the instance went through `Connecting` or `Failing`, or was taken back
//!   after its removal) gets a new stream, with a fresh backoff;
//! - checks pause while the instance drains (the stream is cancelled) and start again if it is
//!   taken back.
//!
//! Where this differs from A17, and why:
//!
//! - A17 keeps a new connection out of service until its first answer. Here an instance
//!   that joins is usable while its first answer is on its way (the option A17 mentions under
//!   "Race Conditions and Subchannel Startup"), for at most [`HealthCheck::timeout`]: the
//!   channel fails a call at once when no instance is usable rather than holding it (invariant
//!   3), so a strict rule would fail the first calls of every new channel. Once an instance has
//!   been out, it comes back only with a `SERVING` answer.
//! - A connection that cannot be opened is the connection's business, as it is without health
//!   checks: the instance is marked [`State::Failing`](crate::State::Failing) and reconnected
//!   with the channel's [`Backoff`](crate::Backoff); the stream opens again once it reconnects.
//! - A `GOAWAY` does not end the stream here (tonic's `Channel` does not show it): a stream on
//!   a connection that the server drains lasts until the server closes it, then opens again on
//!   the new one.
//!
//! One role per file: `settings` ([`HealthCheck`], its validation and its backoff), `task` (the
//! checks of one instance, stream after stream), `stream` (one `Watch` stream), `verdict` (the
//! instance's state follows the last answer).
//!
//! [gRFC A17]: https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md
//! [`health.proto`]: https://github.com/grpc/grpc-proto/blob/master/grpc/health/v1/health.proto

mod settings;
mod stream;
mod task;
mod verdict;

pub use settings::HealthCheck;
pub(crate) use task::spawn;

/// The method, as the crate's logs name it (`rpc.method`).
const WATCH: &str = "grpc.health.v1.Health/Watch";
