//! The opt-in retry policies, which calls each policy covers, and the budget that retries and
//! hedges share. (Transparent replay of calls that were never processed needs no policy: see
//! `call/`.)
//!
//! Which policy covers a call is gRPC's service-config rule (gRFC A6, `doc/service_config.md`
//! of grpc/grpc): every retry policy, hedging policy and method config names methods
//! (`/package.Service/Method`), whole services (`/package.Service/`) or every method; for a
//! call, the most specific name that anything names decides, whole: the method's own entry,
//! else its service's, else the default. [`MethodPolicies`] is that table, built once by
//! `Builder::build` and read by every call: two binary searches over the names at most, no
//! lock, no allocation (none at all when nothing is named).
//!
//! The budget is the crate's own by default (a share of the calls plus a floor per second, as
//! Finagle's retry budget), or gRPC's token bucket (`retryThrottling` of a service config):
//! not the same rule (the first bounds retries by the calls made, the second stops retries
//! while failures outnumber successes by more than the token ratio), so both are kept.

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

/// The default cap on the request body kept to replay a call (64 KiB).
pub const DEFAULT_MAX_REPLAY_BODY: usize = 64 * 1024;
