//! gRPC service configs (feature `service-config`): the JSON that grpc-go and grpc-java
//! clients take (`doc/service_config.md` of grpc/grpc, the schema in grpc-proto's
//! `grpc/service_config/service_config.proto`), read into a [`ServiceConfig`] that
//! `Builder::service_config` applies to the builder's settings.
//!
//! Each field is checked as gRPC checks it (grpc-go's `service_config.go`, grpc-java's
//! `ManagedChannelServiceConfig`, grpc/grpc's `retry_service_config.cc`); where the three
//! differ, as grpc-go does unless said otherwise. The JSON is read as a `serde_json::Value`
//! and walked by hand (`json.rs`), so that every refusal names its path.
//!
//! Sources:
//! [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md),
//! [gRFC A105](https://github.com/grpc/proposal/blob/master/A105-max_concurrent_streams-connection-scaling.md).

mod balancing;
mod json;
mod method;
mod unknown;

use std::str::FromStr;

pub(crate) use self::balancing::Balancing;
use self::json::ConfigNode;
use crate::error::Error;
use crate::retry::{MethodConfig, RetryThrottling};

/// gRPC's client-side cap on the connections per instance (gRFC A105).
const MAX_CONNECTIONS: u64 = 10;

/// A gRPC service config: the JSON a grpc-go or grpc-java client of the same service takes,
/// read and checked (feature `service-config`). Apply it with
/// [`Builder::service_config`](crate::Builder::service_config).
///
/// ```
/// use tonic_balancer::{BalancedChannel, ServiceConfig, Strategy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tonic_balancer::Error> {
/// // The JSON as the service's other clients have it.
/// let config: ServiceConfig = r#"{
///   "loadBalancingConfig": [ { "round_robin": {} } ],
///   "methodConfig": [ {
///     "name": [ { "service": "helloworld.Greeter", "method": "SayHello" } ],
///     "timeout": "1.5s",
///     "retryPolicy": {
///       "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
///       "backoffMultiplier": 2, "retryableStatusCodes": [ "UNAVAILABLE" ]
///     }
///   } ],
///   "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 }
/// }"#
/// .parse()?;
/// let channel = BalancedChannel::builder()
///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
///     .service_config(config)
///     .build()?;
/// assert_eq!(channel.strategy(), Strategy::RoundRobin);
///
/// // A malformed config is refused, naming what is wrong and where.
/// let err = ServiceConfig::from_json(
///     r#"{ "methodConfig": [ { "name": [ {} ], "timeout": "1500ms" } ] }"#,
/// )
/// .unwrap_err();
/// assert!(err.to_string().contains("methodConfig[0].timeout: \"1500ms\" is not a duration"));
/// # Ok(()) }
/// ```
///
/// # The fields, and what they set
///
/// | field | what it sets |
/// | --- | --- |
/// | `methodConfig[].name` | the calls an entry covers: `{"service": "pkg.Svc", "method": "Get"}` one method, `{"service": "pkg.Svc"}` every method of the service, `{}` every method. For a call the most specific entry wins, whole, as in gRPC: a method's own entry, else its service's, else the default. A name given twice in the config is refused; an entry without names is skipped. |
/// | `methodConfig[].timeout` | the deadline of a call to those methods: the earlier of it and the caller's own (`tonic::Request::set_timeout`), sent to the server in `grpc-timeout`, as gRPC does. As grpc-go reads it: `"0s"` fails every call at once with DEADLINE_EXCEEDED, unsent; a negative one sets no deadline. |
/// | `methodConfig[].retryPolicy` | a [`RetryPolicy`](crate::RetryPolicy) for those methods: `maxAttempts` (at least 2; above 5 counts as 5, gRFC A6's cap), `initialBackoff` and `maxBackoff` (above zero), `backoffMultiplier` (above zero: below 1, each backoff is shorter than the one before, as in grpc-go), `retryableStatusCodes` (at least one, not OK). |
/// | `methodConfig[].hedgingPolicy` | a [`HedgingPolicy`](crate::HedgingPolicy) for those methods: `maxAttempts` (at least 2; above 5 counts as 5), `hedgingDelay` (optional, as in gRFC A6: absent or `"0s"` sends every attempt at once), `nonFatalStatusCodes` (none by default; not OK). An entry with both a retry and a hedging policy is refused (the proto's `oneof`). |
/// | `methodConfig[].waitForReady` | gRPC's wait-for-ready for those methods (true or false; false by default): a call that finds no usable instance waits for one, until its deadline, instead of failing at once with UNAVAILABLE, and goes through connection failures; a call's own [`WaitForReady`](crate::WaitForReady) wins. A call made before discovery's first answer waits for it either way. |
/// | `methodConfig[].maxRequestMessageBytes`, `maxResponseMessageBytes` | the largest message a call of those methods may send and receive, in bytes (a whole number; 4 GiB or more limits nothing), checked as grpc-go checks them, on each message's length as sent (compressed if it was), read from gRPC's 5-byte prefixes as the body passes (nothing is buffered). A request message above it fails the call with RESOURCE_EXHAUSTED "trying to send message larger than max (N vs. M)" before any byte of it is sent (the messages before it went), never retried and not counted against the instance; a response message above it fails the call with RESOURCE_EXHAUSTED "grpc: received message larger than max (N vs. M)" and cancels the stream, nothing counted against the instance. The generated client's own limits (`max_encoding_message_size`, `max_decoding_message_size`, on the decoded message) apply as well. |
/// | `retryThrottling` | gRPC's token bucket, in place of the channel's retry budget: `maxTokens` (above 0, at most 1000, as grpc-go), `tokenRatio` (above 0, in thousandths as gRPC counts it). See below. |
/// | `loadBalancingConfig` | the first policy of the list that the channel knows, as in gRPC (unknown ones skipped; a list with none known is refused): `round_robin` → [`Strategy::RoundRobin`](crate::Strategy::RoundRobin); `pick_first` → the channel keeps its strategy (its `shuffleAddressList` is read and ignored): a balanced channel never sends every call to one instance; `least_request_experimental` (`choiceCount`, 2 to 10, more counts as 10) → [`Strategy::PowerOfTwoChoices`](crate::Strategy::PowerOfTwoChoices) for 2, [`Strategy::LeastPending`](crate::Strategy::LeastPending) (a scan of every instance) for more; `weighted_round_robin` → [`Builder::weighted_round_robin`](crate::Builder::weighted_round_robin) with `blackoutPeriod`, `weightExpirationPeriod` (above zero), `weightUpdatePeriod` (below 100 ms counts as 100 ms), `errorUtilizationPenalty` (at least 0), gRPC's defaults for the others, and with `enableOobLoadReport`, [`Builder::load_reports_out_of_band`](crate::Builder::load_reports_out_of_band) every `oobReportingPeriod` (10 s by default); `tonic_balancer` → this crate's own: `{"tonic_balancer": {"strategy": "fewest_then_fastest"}}`, one of `fewest_then_fastest` (the default), `least_pending`, `round_robin`, `power_of_two_choices`, `peak_ewma`, `weighted_round_robin` (with the builder's [`WrrConfig`](crate::orca::WrrConfig)). |
/// | `loadBalancingPolicy` | the older form (`"round_robin"`, any case), read only without `loadBalancingConfig`; a name the channel does not know leaves its strategy. |
/// | `healthCheckConfig.serviceName` | health checks of each instance for that service (`""` or absent: the server as a whole), through `Builder::health_check` (feature `health-check`; the builder's other health-check settings are kept). Without the feature, ignored with a warning and listed in [`unknown_fields`](ServiceConfig::unknown_fields), as grpc-go ignores it (with an error in its log) when its health package is not linked in. |
/// | `connectionScaling.maxConnectionsPerSubchannel` | [`Builder::max_connections_per_instance`](crate::Builder::max_connections_per_instance): at least 1; above 10 counts as 10, gRPC's client-side cap (gRFC A105). |
/// | anything else | ignored, as gRPC ignores the fields it does not know. |
///
/// Durations are protobuf's JSON form, seconds with up to nine decimals and an `s` (`"1.5s"`,
/// `"0.020s"`); status codes are names (`"UNAVAILABLE"`, upper case) or numbers (`14`), as
/// grpc-go and grpc-java accept them. Every refusal is an
/// [`Error::InvalidSetting`](crate::Error::InvalidSetting) naming `service_config`, whose
/// reason starts with the JSON path of what it refuses:
/// `methodConfig[1].retryPolicy.maxAttempts: must be at least 2, not 1`.
///
/// # Retries, hedges and their budget
///
/// The method configs' policies cover the calls of the methods they name, exactly as the
/// builder's own [`RetryPolicy`](crate::RetryPolicy) and [`HedgingPolicy`](crate::HedgingPolicy)
/// do, and take part with them in one table: the most specific name wins, and a name given a
/// policy both by the config and by the builder is refused by
/// [`build`](crate::Builder::build) (a builder's policy and a config's timeout for the same
/// name both apply).
///
/// With `retryThrottling`, retries and hedges are limited by gRPC's token bucket instead of
/// the channel's budget: it starts full, at `maxTokens`; each attempt that fails with a status
/// its policy retries (or a non-fatal one, for a hedged call), or whose server's
/// `grpc-retry-pushback-ms` says not to retry, takes a token, whether or not it is retried;
/// each call answered without an error status gives `tokenRatio` back; while the
/// bucket holds half of `maxTokens` or less, no call is retried and no hedge is sent. gRPC
/// counts a call as a success when it ends OK; the channel counts it when its answer starts
/// without an error status (a stream that fails later has counted as a success). The bucket
/// limits the builder's own policies too. Without `retryThrottling`, nothing limits a config's
/// retries and hedges but their `maxAttempts`, as in gRPC; the builder's own policies keep the
/// crate's budget (`budget_ratio` and `budget_min_per_sec` of
/// [`RetryPolicy`](crate::RetryPolicy)).
///
/// A retry goes to an instance the call has not tried if one is usable, else to one it tried
/// that is still usable (over one address, every retry goes to it, as in gRPC), after a backoff
/// drawn between 0.8 and 1.2 times min(`initialBackoff` × `backoffMultiplier`^(n-1),
/// `maxBackoff`), n counted from the server's last pushback (gRFC A6). Every attempt after the
/// first carries `grpc-previous-rpc-attempts`.
///
/// A config from gRPC's documentation configures the channel as it does a grpc-go client
/// (grpc-go itself ignores `hedgingPolicy`; this channel hedges, as grpc-java does). Where the
/// channel differs from gRPC on purpose is listed in the repository's `docs/design.md`
/// ("Where the channel differs from gRPC").
#[derive(Debug, Clone, Default)]
pub struct ServiceConfig {
    pub(crate) methods: Vec<MethodConfig>,
    pub(crate) throttling: Option<RetryThrottling>,
    /// `None`: the config names no policy, and the channel keeps its strategy.
    pub(crate) balancing: Option<Balancing>,
    /// The service name of `healthCheckConfig`, if it is there.
    pub(crate) health_check: Option<String>,
    pub(crate) max_connections: Option<usize>,
    /// The fields it has that the channel does not read (see [`ServiceConfig::unknown_fields`]).
    unknown: Vec<String>,
}

impl ServiceConfig {
    /// Reads and checks a service config's JSON (see the type's docs for each field).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] naming `service_config`, with the JSON path of what is wrong
    /// and why (`loadBalancingConfig[0].weighted_round_robin.errorUtilizationPenalty: must
    /// be at least 0, not -1`), or why the text is not JSON.
    pub fn from_json(json: &str) -> Result<ServiceConfig, Error> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| Error::InvalidSetting {
                name: "service_config",
                reason: format!("not JSON: {e}"),
            })?;
        let root = ConfigNode::root(&value);
        root.object()?;
        let mut config = ServiceConfig {
            unknown: unknown::fields(&value),
            ..ServiceConfig::default()
        };
        if let Some(list) = root.field("methodConfig")? {
            config.methods = method::configs(&list)?;
        }
        if let Some(t) = root.field("retryThrottling")? {
            config.throttling = Some(throttling(&t)?);
        }
        if let Some(list) = root.field("loadBalancingConfig")? {
            config.balancing = balancing::from_config(&list)?;
        }
        if config.balancing.is_none() {
            if let Some(name) = root.field("loadBalancingPolicy")? {
                config.balancing = balancing::from_name(&name)?;
            }
        }
        if let Some(h) = root.field("healthCheckConfig")? {
            let service = match h.field("serviceName")? {
                Some(name) => name.str()?.to_owned(),
                None => String::new(),
            };
            config.health_check = Some(service);
        }
        if let Some(scaling) = root.field("connectionScaling")? {
            if let Some(n) = scaling.field("maxConnectionsPerSubchannel")? {
                let max = n.whole()?;
                if max == 0 {
                    return Err(n.refuse("must be at least 1"));
                }
                config.max_connections = Some(max.min(MAX_CONNECTIONS) as usize);
            }
        }
        for field in &config.unknown {
            tracing::warn!(field = %field, "service config: a field the channel does not read");
        }
        Ok(config)
    }

    /// The fields of the config that the channel does not read, each as its JSON path and why:
    /// unknown ones (`methodConfigs: unknown field, ignored (did you mean "methodConfig"?)`)
    /// and gRPC fields it does not use. As in gRPC they are ignored, so that a newer config is
    /// taken; each is also logged as a warning when the config is read. A `loadBalancingConfig`
    /// entry's fields are its policy's, checked by the policy.
    ///
    /// ```
    /// use tonic_balancer::ServiceConfig;
    ///
    /// let config = ServiceConfig::from_json(r#"{"methodConfigs": []}"#)?;
    /// assert_eq!(
    ///     config.unknown_fields(),
    ///     ["methodConfigs: unknown field, ignored (did you mean \"methodConfig\"?)"]
    /// );
    /// # Ok::<(), tonic_balancer::Error>(())
    /// ```
    pub fn unknown_fields(&self) -> &[String] {
        &self.unknown
    }
}

impl FromStr for ServiceConfig {
    type Err = Error;

    /// [`ServiceConfig::from_json`].
    fn from_str(json: &str) -> Result<ServiceConfig, Error> {
        ServiceConfig::from_json(json)
    }
}

/// `retryThrottling`: `maxTokens` in (0, 1000] (grpc-go's range), `tokenRatio` above 0 in
/// thousandths (grpc/grpc keeps three decimals).
fn throttling(node: &ConfigNode<'_>) -> Result<RetryThrottling, Error> {
    let max = node.required("maxTokens")?;
    let max_tokens = max.number()?;
    if !(max_tokens > 0.0 && max_tokens <= 1000.0) {
        return Err(max.refuse(format_args!(
            "must be above 0 and at most 1000, not {max_tokens}"
        )));
    }
    let ratio = node.required("tokenRatio")?;
    let token_ratio = ratio.number()?;
    // Three decimals, as grpc/grpc reads it (the small term keeps 0.57 from reading 0.569).
    let ratio_milli = (token_ratio * 1000.0 + 1e-6).floor();
    if ratio_milli < 1.0 {
        return Err(ratio.refuse(format_args!(
            "must be at least 0.001 (gRPC counts thousandths of a token), not {token_ratio}"
        )));
    }
    Ok(RetryThrottling {
        max_milli: (max_tokens * 1000.0).round() as i64,
        ratio_milli: ratio_milli.min(1e12) as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Strategy;

    fn refusal(json: &str) -> String {
        match ServiceConfig::from_json(json) {
            Err(Error::InvalidSetting { name, reason }) => {
                assert_eq!(name, "service_config");
                reason
            }
            other => panic!("{json}: {other:?}"),
        }
    }

    #[test]
    fn the_example_of_grpc_notes_reads_whole() {
        let c = ServiceConfig::from_json(
            r#"{ "loadBalancingConfig": [ { "round_robin": {} } ],
              "methodConfig": [ { "name": [ { "service": "pkg.Svc", "method": "Get" } ],
                  "timeout": "1.5s", "waitForReady": false,
                  "retryPolicy": { "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
                                   "backoffMultiplier": 2, "retryableStatusCodes": [ "UNAVAILABLE" ] } },
                { "name": [ { "service": "pkg.Svc", "method": "List" } ],
                  "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.02s",
                                     "nonFatalStatusCodes": [ "UNAVAILABLE" ] } } ],
              "retryThrottling": { "maxTokens": 10, "tokenRatio": 0.1 },
              "healthCheckConfig": { "serviceName": "" } }"#,
        )
        .unwrap();
        assert_eq!(c.balancing, Some(Balancing::Strategy(Strategy::RoundRobin)));
        // Every field is read; without the `health-check` feature, `healthCheckConfig` is said
        // to be unused.
        let unused = c.unknown_fields();
        let health = usize::from(cfg!(not(feature = "health-check")));
        assert_eq!(unused.len(), health, "{unused:?}");
        assert_eq!(c.methods.len(), 2);
        assert_eq!(
            c.methods[0].settings.timeout,
            Some(std::time::Duration::from_millis(1500))
        );
        assert_eq!(
            c.throttling,
            Some(RetryThrottling {
                max_milli: 10_000,
                ratio_milli: 100
            })
        );
        assert_eq!(c.health_check.as_deref(), Some(""));
    }

    #[test]
    fn refusals_name_their_path() {
        let cases = [
            ("[]", "must be an object, not a list"),
            ("{", "not JSON"),
            (
                r#"{"methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 1, "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#,
                "methodConfig[0].retryPolicy.maxAttempts: must be at least 2, not 1",
            ),
            (
                r#"{"methodConfig": [{"name": [{}]}, {"name": [{"service": "a.B"}, {}]}]}"#,
                "methodConfig[1].name[1]: every method is named already, by methodConfig[0].name[0]",
            ),
            (
                r#"{"methodConfig": [{"name": [{"method": "Get"}]}]}"#,
                "methodConfig[0].name[0]: method \"Get\" has no service",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "a/B"}]}]}"#,
                "methodConfig[0].name[0].service: \"a/B\" is not a gRPC service name",
            ),
            (
                r#"{"retryThrottling": {"maxTokens": 0, "tokenRatio": 0.1}}"#,
                "retryThrottling.maxTokens: must be above 0 and at most 1000, not 0",
            ),
            (
                r#"{"retryThrottling": {"maxTokens": 10}}"#,
                "retryThrottling.tokenRatio: required",
            ),
            (
                r#"{"loadBalancingConfig": [{"grpclb": {}}, {"xds_experimental": {}}]}"#,
                "loadBalancingConfig: names no load-balancing policy this channel knows",
            ),
            (
                r#"{"loadBalancingConfig": [{"round_robin": {}, "pick_first": {}}]}"#,
                "loadBalancingConfig[0]: must hold exactly one policy",
            ),
            (
                r#"{"loadBalancingConfig": [{"tonic_balancer": {"strategy": "fastest"}}]}"#,
                "loadBalancingConfig[0].tonic_balancer.strategy: unknown strategy \"fastest\"",
            ),
            (
                r#"{"healthCheckConfig": {"serviceName": 7}}"#,
                "healthCheckConfig.serviceName: must be a string, not a number",
            ),
            (
                r#"{"connectionScaling": {"maxConnectionsPerSubchannel": 0}}"#,
                "connectionScaling.maxConnectionsPerSubchannel: must be at least 1",
            ),
        ];
        for (json, want) in cases {
            let got = refusal(json);
            assert!(got.contains(want), "{json}\n  got: {got}\n want: {want}");
        }
    }

    #[test]
    fn the_first_known_policy_is_used() {
        let read = |json: &str| ServiceConfig::from_json(json).unwrap().balancing;
        assert_eq!(
            read(
                r#"{"loadBalancingConfig": [{"grpclb": {"x": 1}}, {"weighted_round_robin": {"enableOobLoadReport": true}}, {"round_robin": {}}]}"#
            ),
            Some(Balancing::Wrr {
                config: crate::load::weight::WrrConfig::default(),
                oob: Some(std::time::Duration::from_secs(10)),
            })
        );
        assert_eq!(
            read(
                r#"{"loadBalancingConfig": [{"least_request_experimental": {"choiceCount": 3}}]}"#
            ),
            Some(Balancing::Strategy(Strategy::LeastPending))
        );
        assert_eq!(
            read(r#"{"loadBalancingConfig": [{"least_request_experimental": {}}]}"#),
            Some(Balancing::Strategy(Strategy::PowerOfTwoChoices))
        );
        assert_eq!(
            read(r#"{"loadBalancingConfig": [{"pick_first": {"shuffleAddressList": true}}]}"#),
            Some(Balancing::Keep)
        );
        assert_eq!(
            read(r#"{"loadBalancingPolicy": "ROUND_ROBIN"}"#),
            Some(Balancing::Strategy(Strategy::RoundRobin))
        );
        assert_eq!(read(r#"{"loadBalancingPolicy": "grpclb"}"#), None);
        assert_eq!(
            read(r#"{"loadBalancingConfig": [], "loadBalancingPolicy": "round_robin"}"#),
            Some(Balancing::Strategy(Strategy::RoundRobin))
        );
        assert_eq!(
            read(r#"{"loadBalancingConfig": [{"tonic_balancer": {}}]}"#),
            Some(Balancing::Strategy(Strategy::FewestThenFastest))
        );
        assert_eq!(read("{}"), None);
    }
}
