//! What the instances and the set tell the parts that watch them.
//!
//! The layers below the call path (an instance, the set) know nothing of what observes them:
//! health, outlier ejection, load reports, metrics, tracing and the totals attach from above,
//! through this one trait, which the channel's builder implements by wiring them together
//! (`crate::hooks`).

use std::sync::Arc;

use tonic::Code;

use super::Instance;

/// How a call ended, as far as its instance is concerned. What an answer counts as (a success,
/// an application error, a fault of the server, an answer the user named ordinary) is for the
/// observers to say (`health::Class`): this layer reports the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The instance answered with this status (OK included). Never CANCELLED or
    /// DEADLINE_EXCEEDED: those are [`Neutral`](Outcome::Neutral).
    Answer(Code),
    /// Not an answer, and the instance's doing: its connection broke under the call, a
    /// response that is not gRPC's (no `grpc-status`), a deadline that passed while it held
    /// the call silent for long.
    Failure,
    /// Says nothing about the instance: the caller gave up (dropped the call or the stream, or
    /// its deadline passed before the instance had held the call long enough to be blamed), a
    /// CANCELLED or DEADLINE_EXCEEDED the server passed on, a stream the server refused or a
    /// connection that was not reached (sent again elsewhere), an extra connection's failure.
    Neutral,
}

/// Classifies a call by the `grpc-status` in its trailers (or in a trailers-only response);
/// trailers without one are not gRPC's answer (a proxy's, a broken server's): a failure of the
/// instance.
#[inline]
pub(crate) fn classify_status(code: Option<Code>) -> Outcome {
    code.map_or(Outcome::Failure, classify_code)
}

/// The outcome of a status the instance answered with. DEADLINE_EXCEEDED and CANCELLED from a
/// server are the caller's deadline or cancellation, propagated: they say nothing of the
/// instance (see `CallGuard::deadline_outcome` for a deadline that passes while the instance
/// has not answered).
#[inline]
pub(crate) fn classify_code(code: Code) -> Outcome {
    match code {
        Code::Cancelled | Code::DeadlineExceeded => Outcome::Neutral,
        code => Outcome::Answer(code),
    }
}

/// Whether a status is one of the server faults that gRPC's and Envoy's outlier detection
/// count against an instance whatever the service (UNKNOWN: a handler that threw; INTERNAL,
/// DATA_LOSS; UNAVAILABLE, RESOURCE_EXHAUSTED: a server that cannot take the call), as opposed
/// to an application's answer (NOT_FOUND, INVALID_ARGUMENT, ...). Envoy maps these to 5xx for
/// `consecutive_5xx`
/// (<https://www.envoyproxy.io/docs/envoy/latest/intro/arch_overview/upstream/outlier>).
#[inline]
pub(crate) fn is_server_fault(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown
            | Code::Internal
            | Code::DataLoss
            | Code::Unavailable
            | Code::ResourceExhausted
    )
}

/// The events of the instances and the set of one channel.
pub(crate) trait Events: Send + Sync + 'static {
    /// An attempt on `inst` ended (its guard dropped) with `outcome`.
    fn outcome(&self, inst: &Arc<Instance>, outcome: Outcome);

    /// A response came from `inst` while it was connecting: its connection works (it moved
    /// `Connecting` -> `Ready`).
    fn connected(&self, inst: &Instance);

    /// The connection of `inst` broke under a call (it moved `Ready` -> `Connecting`).
    fn disconnected(&self, inst: &Instance, error: &(dyn std::error::Error + 'static));

    /// The connection of `inst` could not be opened.
    fn connect_failed(&self, inst: &Arc<Instance>, error: &dyn std::error::Error);

    /// `inst` is gone for good (its last reference dropped).
    fn dropped(&self, inst: &Instance);

    /// `inst` is back in service (reconnected, readmitted after an ejection, healthy again).
    fn back_in_service(&self, inst: &Instance);

    /// `inst` is new in the set (not one taken back).
    fn joined(&self, inst: &Arc<Instance>);

    /// `inst`, draining, was taken back into a set of `members` instances (a discovery answer
    /// named it again); it is still draining, and returns to service as its state when it was
    /// removed says. Called before the set that holds it is published.
    fn taken_back(&self, inst: &Arc<Instance>, members: usize);

    /// A membership change added and removed these many instances.
    fn membership(&self, added: usize, removed: usize);

    /// The discovery source answered (`error`: with a failure).
    fn discovery_answer(&self, error: Option<&str>);

    /// What the channel's connectivity state is made of may have moved: an instance changed
    /// state, an instance never sent a call got its first, or discovery's first answer is in
    /// (called after it is published).
    fn connectivity(&self);
}

/// What an attempt of a call is for (what its metrics and the channel's totals count it as).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptKind {
    /// The call's first attempt.
    First,
    /// Sent again unseen by the caller: the previous attempt was not processed.
    Transparent,
    /// Sent again by the retry policy.
    Retry,
    /// A hedge, alongside the attempts in flight.
    Hedge,
}
