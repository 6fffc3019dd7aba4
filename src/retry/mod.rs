//! The opt-in retry and hedging policies ([gRFC A6]), which calls each policy covers, and the
//! budget that retries and hedges share. (Transparent replay of calls that were never processed
//! needs no policy: see `call/`.)
//!
//! One role per file, each importing only the ones before it: `name.rs` (how a policy or a
//! method config names methods), `budget.rs` (the shared budget), `policy.rs`
//! ([`RetryPolicy`]), `hedge.rs` ([`HedgingPolicy`], and the channel's hedging policies by
//! path), `methods.rs` (the per-method table, made of all of them).
//!
//! Which policy covers a call is gRPC's service-config rule ([gRFC A6], grpc/grpc's
//! [`doc/service_config.md`]): every retry policy, hedging policy and method config names
//! methods (`/package.Service/Method`), whole services (`/package.Service/`) or every method;
//! for a call, the most specific name that anything names decides, whole: the method's own
//! entry, else its service's, else the default. [`MethodPolicies`] is that table, built once by
//! `Builder::build` and read by every call: two binary searches over the names at most, no
//! lock, no allocation (none at all when nothing is named).
//!
//! The budget is the crate's own by default (a share of the calls plus a floor per second, as
//! [Finagle's retry budget]), or gRPC's token bucket (`retryThrottling` of a service config, as
//! grpc/grpc's [`RetryThrottler`]): not the same rule (the first bounds retries by the calls
//! made, the second stops retries while failures outnumber successes by more than the token
//! ratio), so both are kept. A service config's backoff is jittered as gRFC A6 and [grpc-go]
//! jitter it, the builder's with full jitter.
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
//! [`doc/service_config.md`]: https://github.com/grpc/grpc/blob/master/doc/service_config.md
//! [Finagle's retry budget]: https://github.com/twitter/finagle/blob/develop/finagle-core/src/main/scala/com/twitter/finagle/service/RetryBudget.scala
//! [`RetryThrottler`]: https://github.com/grpc/grpc/blob/master/src/core/client_channel/retry_throttle.h
//! [grpc-go]: https://github.com/grpc/grpc-go/blob/master/stream.go

mod budget;
mod hedge;
mod methods;
mod name;
mod policy;

pub(crate) use budget::{Budget, RetryThrottling};
pub(crate) use hedge::HedgingPolicies;
pub use hedge::HedgingPolicy;
pub(crate) use methods::{MethodConfig, MethodPolicies, MethodPolicy};
// What a service config's method configs are made of.
#[cfg(feature = "service-config")]
pub(crate) use methods::{CallSettings, RetryOrHedging};
#[cfg(feature = "service-config")]
pub(crate) use name::MethodName;
pub(crate) use policy::shared_budget;
pub use policy::RetryPolicy;

/// gRFC A6's client-side cap on the attempts of a call (the first included), for the builder's
/// policies and a service config's alike.
pub(crate) const MAX_ATTEMPTS: u32 = 5;

/// The default cap on the request body kept to replay a call (64 KiB).
pub const DEFAULT_MAX_REPLAY_BODY: usize = 64 * 1024;
