//! Wait-for-ready (grpc/grpc `doc/wait-for-ready.md`): a call that finds no usable instance
//! waits for one, up to its deadline, instead of failing at once with UNAVAILABLE.
//!
//! The call waits on [`Shared::usable`](super::shared::Shared::usable), which the channel's
//! events notify when an instance comes into service (reconnected, readmitted, healthy again)
//! and when a membership change is published: a waiting call takes its notification before it
//! looks at the set once more, so that no change between the look and the wait is missed, and
//! it polls nothing meanwhile.

use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// gRPC's wait-for-ready for one call (grpc-go's `grpc.WaitForReady(true)`), as a request
/// extension: `true` makes a call that finds no usable instance wait for one instead of failing
/// at once with UNAVAILABLE; `false` makes it fail at once. It wins over a service config's
/// `waitForReady` for the call's method, as grpc-go's call option does.
///
/// A wait-for-ready call waits, without polling, until an instance is usable (one that was
/// failing reconnects, an ejection ends, a health check says SERVING, discovery or
/// [`insert`](crate::BalancedChannel::insert) adds one), and is then routed as any call. It
/// also goes through transient failures: when its attempt could not reach its instance (the
/// connection could not be opened, or closed before the request was written) and no other
/// instance can take it, it waits the same way and is sent again, unseen, once one can (this
/// needs [`transparent_retry`](crate::Builder::transparent_retry), on by default). Its
/// deadline bounds the wait: at the deadline the call fails with DEADLINE_EXCEEDED. **A call
/// without a deadline waits until an instance is usable, however long that takes**: give
/// wait-for-ready calls a deadline (`tonic::Request::set_timeout`, or a service config's
/// `timeout`).
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::WaitForReady;
///
/// let mut request = tonic::Request::new(());
/// request.set_timeout(Duration::from_secs(5));
/// request.extensions_mut().insert(WaitForReady(true));
/// # let _ = request;
/// ```
///
/// The extension goes with the call through a generated client (`FooClient<BalancedChannel>`)
/// as tonic moves a request's extensions into its HTTP request; a tower layer above the channel
/// can insert it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitForReady(pub bool);

impl WaitForReady {
    /// Whether the call `req` waits for a usable instance: its own [`WaitForReady`], else its
    /// method's `waitForReady` (`method`), else not.
    pub(crate) fn of(extensions: &http::Extensions, method: Option<bool>) -> bool {
        extensions
            .get::<WaitForReady>()
            .map(|w| w.0)
            .or(method)
            .unwrap_or(false)
    }
}

/// A notification that an instance may have become usable, taken now: a change from this
/// moment on wakes it, so the caller looks at the set after taking it.
pub(crate) fn notified(usable: &Arc<Notify>) -> Pin<Box<OwnedNotified>> {
    let mut wait = Box::pin(usable.clone().notified_owned());
    wait.as_mut().enable();
    wait
}
