//! [`Builder::service_config`]: a gRPC service config applied to the builder's settings
//! (feature `service-config`).

use super::Builder;
use crate::service_config::{Balancing, ServiceConfig};

impl Builder {
    /// Configures the channel as a gRPC service config says (feature `service-config`): the
    /// JSON that grpc-go and grpc-java clients of the same service take, read by
    /// [`ServiceConfig::from_json`]. See [`ServiceConfig`] for what each field sets.
    ///
    /// Like any setter, what the config sets replaces what was set before (the
    /// weighted-round-robin settings, the health checks' service name, the connections per
    /// instance), and a later setter replaces it, except the strategy: a config whose
    /// load-balancing policy chooses another strategy than [`strategy`](Builder::strategy) or
    /// [`weighted_round_robin`](Builder::weighted_round_robin) did is refused by
    /// [`build`](Builder::build) (say it in one place). A second service config replaces the
    /// first's method configs and retry throttling. The builder's own
    /// [`retry`](Builder::retry) and [`hedging`](Builder::hedging) policies stay, and take
    /// part with the config's method configs: for a call, the most specific name wins, and
    /// [`build`](Builder::build) refuses a method name given a policy twice.
    ///
    /// ```
    /// use tonic_balancer::{BalancedChannel, ServiceConfig};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tonic_balancer::Error> {
    /// // Reads of the catalogue are retried and bounded to 2 s; writes are sent once.
    /// let config = ServiceConfig::from_json(
    ///     r#"{
    ///   "methodConfig": [ {
    ///     "name": [ { "service": "catalog.v1.Catalog", "method": "GetItem" },
    ///               { "service": "catalog.v1.Catalog", "method": "ListItems" } ],
    ///     "timeout": "2s",
    ///     "retryPolicy": {
    ///       "maxAttempts": 4, "initialBackoff": "0.05s", "maxBackoff": "0.5s",
    ///       "backoffMultiplier": 2, "retryableStatusCodes": [ "UNAVAILABLE", 8 ]
    ///     }
    ///   } ],
    ///   "loadBalancingConfig": [ { "tonic_balancer": { "strategy": "fewest_then_fastest" } } ]
    /// }"#,
    /// )?;
    /// let channel = BalancedChannel::builder()
    ///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
    ///     .service_config(config)
    ///     .build()?;
    /// # let _ = channel; Ok(()) }
    /// ```
    pub fn service_config(mut self, config: ServiceConfig) -> Builder {
        let ServiceConfig {
            methods,
            throttling,
            balancing,
            health_check,
            max_connections,
            ..
        } = config;
        self.method_configs = methods;
        self.throttling = throttling;
        match balancing {
            None | Some(Balancing::Keep) => {}
            Some(Balancing::Strategy(strategy)) => self.choose_strategy(strategy, "service_config"),
            Some(Balancing::Wrr { config, oob }) => {
                self = self.weighted_round_robin(config);
                if let Some(every) = oob {
                    self.load_reports_oob = Some(every);
                }
            }
        }
        if let Some(service) = health_check {
            #[cfg(feature = "health-check")]
            {
                let check = self.health_check.take().unwrap_or_default();
                self.health_check = Some(check.service(service));
            }
            #[cfg(not(feature = "health-check"))]
            tracing::warn!(
                service = %service,
                "service config: healthCheckConfig ignored (tonic-balancer's `health-check` \
                 feature is off)"
            );
        }
        if let Some(max) = max_connections {
            self.conns.max = max;
        }
        self
    }
}
