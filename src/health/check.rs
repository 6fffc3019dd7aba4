//! Active health checks with the standard `grpc.health.v1` protocol (tonic-health's client),
//! over each instance's own connection.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use crate::instance::{Instance, State};

/// Active health checking (opt-in, see [`Builder::health_check`](crate::Builder::health_check)).
///
/// Every `interval`, each instance is asked `grpc.health.v1.Health/Check` for `service` over its
/// own connection. An answer other than `SERVING`, an error, or no answer within `timeout` takes
/// the instance out ([`State::Unhealthy`]) until it answers `SERVING`
/// again. The first check runs as soon as the instance joins.
///
/// Built from [`HealthCheck::default`] with one setter per setting:
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::HealthCheck;
///
/// let check = HealthCheck::default()
///     .interval(Duration::from_secs(2))
///     .service("helloworld.Greeter");
/// # let _ = check;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub(crate) interval: Duration,
    pub(crate) timeout: Duration,
    pub(crate) service: String,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            service: String::new(),
        }
    }
}

impl HealthCheck {
    /// Time between two checks of one instance: above zero (default 5 s).
    #[must_use]
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// How long a check may take: above zero (default 1 s).
    #[must_use]
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = d;
        self
    }

    /// The service name to ask about; empty for the server as a whole (the default).
    #[must_use]
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
}

/// Starts the checks of `inst`; they pause while it drains (it may be taken back into the set)
/// and stop when it is dropped.
pub(crate) fn spawn(inst: &Arc<Instance>, cfg: HealthCheck) {
    inst.spawn(run(Arc::downgrade(inst), cfg));
}

async fn run(weak: Weak<Instance>, cfg: HealthCheck) {
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inst) = weak.upgrade() else { return };
        if inst.state() == State::Draining {
            continue;
        }
        let mut client = HealthClient::new(inst.channel.clone());
        drop(inst);
        let req = HealthCheckRequest {
            service: cfg.service.clone(),
        };
        let answer = tokio::time::timeout(cfg.timeout, client.check(req)).await;
        let Some(inst) = weak.upgrade() else { return };
        let verdict = match answer {
            Ok(Ok(resp)) => match resp.into_inner().status() {
                ServingStatus::Serving => Ok(()),
                other => Err(format!("status {}", other.as_str_name())),
            },
            Ok(Err(status)) => Err(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => Err(format!("no answer within {:?}", cfg.timeout)),
        };
        match verdict {
            Ok(()) => {
                if inst.transition(State::Unhealthy, State::Ready) {
                    inst.warm_up();
                    tracing::info!(addr = %inst.target.name, "health check passed: instance back in");
                }
            }
            Err(why) => {
                let prev = inst.state();
                if matches!(prev, State::Ready | State::Connecting)
                    && inst.transition(prev, State::Unhealthy)
                {
                    tracing::warn!(addr = %inst.target.name, reason = %why, "health check failed: instance out");
                }
            }
        }
    }
}
