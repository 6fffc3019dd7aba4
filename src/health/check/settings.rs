//! The settings of the health checks ([`HealthCheck`], [gRFC A17]): one setter each, their
//! validation, and the backoff between streams they make of the channel's.
//!
//! [gRFC A17]: https://github.com/grpc/proposal/blob/master/A17-client-side-health-checking.md

use std::time::Duration;

use crate::instance::Backoff;

/// Active health checking (opt-in, see [`Builder::health_check`](crate::Builder::health_check)):
/// gRPC's client-side health checks (gRFC A17).
///
/// Each instance is watched with one `grpc.health.v1.Health/Watch` stream over its own
/// connection, asking about [`service`](Self::service). The server sends the status at once
/// and again whenever it changes; the instance gets calls only while the last status is
/// `SERVING`. Any other status takes it out ([`State::Unhealthy`](crate::State::Unhealthy))
/// until `SERVING` comes. So does the stream ending (with an error, or with OK), which is then
/// opened again: at once if it had carried an answer, else after [`interval`](Self::interval),
/// growing as the channel's [`Backoff`] does. A server that answers UNIMPLEMENTED has no health
/// service: its instance counts as healthy and is not asked again on that connection (logged
/// once, as a warning). Checks pause while an instance drains.
///
/// A new instance is usable while its first answer is on its way, for at most
/// [`timeout`](Self::timeout) (A17 would keep it out until the answer; see the
/// `health::check` module's notes).
///
/// Built from [`HealthCheck::default`] with one setter per setting:
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::{BalancedChannel, HealthCheck};
///
/// let check = HealthCheck::default()
///     .service("helloworld.Greeter")
///     .timeout(Duration::from_secs(2));
/// let builder = BalancedChannel::builder()
///     .uris(["http://10.0.0.1:50051", "http://10.0.0.2:50051"])
///     .health_check(check);
/// # let _ = builder;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting),
/// which names `health_check` and the field.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct HealthCheck {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) service: String,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            service: String::new(),
        }
    }
}

impl HealthCheck {
    /// The first delay before a stream that ended without an answer is opened again: above
    /// zero (default 1 s, gRPC's first backoff). Each further such end in a row waits longer,
    /// by the channel's [`Backoff`] multiplier and jitter (×1.6, ±20% by
    /// default), up to its `max` (120 s by default) or this interval if it is longer. A stream
    /// that carried an answer is opened again at once. Nothing is polled: a `Watch` stream
    /// carries every change of the status as it happens.
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// How long the first answer on a new stream may take, from when it is sent (opening the
    /// connection included): above zero (default 1 s). Without an answer by then the instance
    /// is taken out until one says `SERVING`; the stream stays open. Later answers have no
    /// deadline: the server sends one only when the status changes (a server that stops
    /// answering at all is for HTTP/2 keep-alives to find, `Endpoint::http2_keep_alive_interval`).
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// The service name to ask about; empty for the server as a whole (the default).
    pub fn service(mut self, name: impl Into<String>) -> Self {
        self.service = name.into();
        self
    }

    /// The same settings with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> HealthCheck {
        self.interval = crate::time::cap(self.interval);
        self.timeout = crate::time::cap(self.timeout);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = crate::checks::Checks::of("health_check");
        c.field("interval").above_zero(self.interval)?;
        c.field("timeout").above_zero(self.timeout)
    }

    /// The backoff between streams that end without an answer: the channel's, starting at
    /// `interval`.
    pub(super) fn backoff(&self, channel: &Backoff) -> Backoff {
        Backoff {
            initial: self.interval,
            max: channel.max.max(self.interval),
            ..channel.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each setting is refused by name.
    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let e = HealthCheck::default()
            .interval(Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("health_check") && e.contains("interval"), "{e}");
        let e = HealthCheck::default()
            .timeout(Duration::ZERO)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("health_check") && e.contains("timeout"), "{e}");
        assert!(HealthCheck::default()
            .interval(Duration::MAX)
            .timeout(Duration::MAX)
            .capped()
            .validate()
            .is_ok());
    }
}
