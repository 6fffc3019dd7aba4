//! Hedging ([gRFC A6]'s hedging policy): for the methods that the user names (idempotent ones),
//! a call that has no answer after a delay is sent again to another instance, and the first
//! answer wins.
//!
//! The rules are in [`HedgingPolicy`]'s docs; a hedged call's attempts are driven by the one
//! machine of every call (`crate::call`).
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::sync::Arc;
use std::time::Duration;

use tonic::Code;

use super::name::MethodName;

use super::MAX_ATTEMPTS;

/// Hedging for the methods named (opt-in, see [`Builder::hedging`](crate::Builder::hedging)):
/// a call without an answer after [`delay`](Self::delay) is sent again to another instance,
/// the first answer wins and the other attempts are cancelled.
///
/// A hedged call starts as any call: one attempt on the instance the pick chooses (each
/// attempt takes its place on one of its instance's connections, as any call's does). After
/// [`delay`](HedgingPolicy::delay) without a response, the same request goes to another
/// instance, one that no attempt of the call has gone to, then another after each further
/// delay, up to [`max_attempts`](HedgingPolicy::max_attempts) in all. The first response
/// that is not a [non-fatal status](HedgingPolicy::non_fatal_codes) is the call's: every other
/// attempt is cancelled at once (its stream reset, so that its server sees the cancellation,
/// and its instance's count released). A non-fatal status sends the next attempt at once
/// instead of after the delay. When every attempt has ended with a non-fatal status and no
/// further attempt can be made, the caller gets the last one, unchanged.
///
/// Further attempts are made only while:
/// - the request can be sent again exactly as the caller sent it: the first attempt has sent
///   it whole and it was kept (at most [`max_replay_body`](crate::Builder::max_replay_body)
///   bytes; a larger request is sent once, never hedged);
/// - the budget allows it: hedges and retries share one budget (see
///   [`budget_ratio`](HedgingPolicy::budget_ratio); a service config's hedging has none but
///   its `retryThrottling`, as in gRPC), and a hedge that finds it spent stops
///   the call's hedging;
/// - no server said otherwise: a `grpc-retry-pushback-ms` in a non-fatal answer delays the
///   next attempt by its value in milliseconds, and a negative or malformed one stops the
///   call's hedging;
/// - some usable instance has not been tried by the call (else, while attempts are in flight,
///   the call looks again after one more delay, at least 50 ms, for one readmitted or added;
///   looking moves nothing of the pick);
/// - the call's deadline has not passed: it bounds the whole call, every attempt included.
///
/// Hedging applies to unary and server-streaming methods: a call is committed to an attempt
/// when that attempt's response head arrives, so a stream that has started is never hedged
/// (and a client-streaming call would be hedged only once its whole request stream was sent).
/// A call that a [`RetryPolicy`](crate::RetryPolicy) would retry is not retried when its
/// method is hedged: hedging takes the place of retries for those methods, as in gRPC.
///
/// Hedge only idempotent methods: a hedged call may run on several instances. Name them as
/// the full method name, `package.Service/Method` (the path of the call's HTTP/2 request, a
/// leading `/` allowed), or every method of a service as `package.Service`; a method's own
/// name wins over its service's when two policies name them.
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer::{BalancedChannel, HedgingPolicy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tonic_balancer::Error> {
/// // A second attempt after 20 ms without an answer (near the method's p95), a third after
/// // 40 ms; UNAVAILABLE from one attempt sends the next one at once.
/// let policy = HedgingPolicy::new(
///     ["catalog.v1.Catalog/GetItem", "/catalog.v1.Catalog/ListItems"],
///     Duration::from_millis(20),
/// )
/// .max_attempts(3)
/// .non_fatal_codes([Code::Unavailable]);
/// let channel = BalancedChannel::builder()
///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051", "http://10.0.0.9:50051"])
///     .hedging(policy)
///     // Every method of another service, with its own delay.
///     .hedging(HedgingPolicy::new(["search.v1.Search"], Duration::from_millis(50)))
///     .build()?;
/// # let _ = channel; Ok(()) }
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a policy out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting)
/// naming `hedging`.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct HedgingPolicy {
    pub(crate) methods: Vec<String>,
    pub(crate) delay: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) non_fatal: Vec<Code>,
    pub(crate) budget_ratio: f64,
    pub(crate) budget_min_per_sec: u32,
    /// Made from a service config's `hedgingPolicy`: no budget but `retryThrottling`, as in
    /// gRPC.
    pub(crate) from_config: bool,
}

impl HedgingPolicy {
    /// Hedging for these methods (at least one; see the type's docs for how to name them),
    /// with a further attempt after each `delay` without a response (`Duration::ZERO`: the
    /// attempts go out together, as soon as the request has been sent once). The other
    /// settings have their defaults: 3 attempts in all, UNAVAILABLE non-fatal, the budget of
    /// [`RetryPolicy`](crate::RetryPolicy)'s defaults.
    pub fn new<I, S>(methods: I, delay: Duration) -> HedgingPolicy
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        HedgingPolicy {
            methods: methods.into_iter().map(Into::into).collect(),
            delay,
            max_attempts: 3,
            non_fatal: vec![Code::Unavailable],
            budget_ratio: 0.2,
            budget_min_per_sec: 10,
            from_config: false,
        }
    }

    /// The wait, without a response, before each further attempt.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Attempts in all, the first included: 2 to 5 (gRFC A6's cap; default 3).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The statuses that do not end the call: an attempt answered with one of them is over,
    /// and the next attempt goes out at once (default UNAVAILABLE; may be empty; not OK). Any
    /// other status is the call's answer. A transport error counts as UNAVAILABLE.
    pub fn non_fatal_codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.non_fatal = codes.into_iter().collect();
        self
    }

    /// The budget that hedges and retries share: further attempts may add at most this share
    /// of the calls (0 to 10, default 0.2), plus [`budget_min_per_sec`](Self::budget_min_per_sec).
    /// There is one budget per channel: with a [`RetryPolicy`](crate::RetryPolicy) or other
    /// hedging policies, all must say the same.
    pub fn budget_ratio(mut self, ratio: f64) -> Self {
        self.budget_ratio = ratio;
        self
    }

    /// Further attempts allowed per second on top of [`budget_ratio`](Self::budget_ratio)
    /// (default 10).
    pub fn budget_min_per_sec(mut self, n: u32) -> Self {
        self.budget_min_per_sec = n;
        self
    }

    fn validate(&self) -> Result<(), crate::Error> {
        let c = HEDGING_CHECKS;
        c.field("max_attempts")
            .between(self.max_attempts, 2, MAX_ATTEMPTS)?;
        c.field("non_fatal_codes")
            .that(!self.non_fatal.contains(&Code::Ok), "must not name OK")?;
        c.field("budget_ratio")
            .between(self.budget_ratio, 0.0, 10.0)?;
        c.that(!self.methods.is_empty(), "the policy names no method")
    }

    fn same_budget(&self, ratio: f64, min_per_sec: u32) -> bool {
        self.budget_ratio == ratio && self.budget_min_per_sec == min_per_sec
    }
}

/// The checks of the `hedging` setting.
pub(super) const HEDGING_CHECKS: crate::checks::Checks = crate::checks::Checks::of("hedging");

/// The hedging policies of a channel, by the paths they match.
#[derive(Debug)]
pub(crate) struct HedgingPolicies {
    /// Exact method paths first, then service prefixes; each with its policy.
    methods: Vec<(String, Arc<HedgingPolicy>)>,
    services: Vec<(String, Arc<HedgingPolicy>)>,
}

impl HedgingPolicies {
    /// Checks the policies (each in range, no method named twice, one budget with the retry
    /// policy's `retry_budget` if any) and indexes them by path. `None` for no policy.
    pub(crate) fn new(
        policies: Vec<HedgingPolicy>,
        retry_budget: Option<(f64, u32)>,
    ) -> Result<Option<HedgingPolicies>, crate::Error> {
        let Some(first) = policies.first() else {
            return Ok(None);
        };
        let (ratio, min) = retry_budget.unwrap_or((first.budget_ratio, first.budget_min_per_sec));
        let mut h = HedgingPolicies {
            methods: Vec::new(),
            services: Vec::new(),
        };
        for p in policies {
            let mut p = p;
            p.delay = crate::time::cap(p.delay);
            p.validate()?;
            HEDGING_CHECKS.that(
                p.same_budget(ratio, min),
                "retries and hedges share one budget: every hedging policy's budget_ratio and \
                 budget_min_per_sec must equal the others' and the retry policy's",
            )?;
            let p = Arc::new(p);
            for name in &p.methods {
                let (list, path) = match MethodName::parse(name, HEDGING_CHECKS)? {
                    MethodName::Method(path) => (&mut h.methods, String::from(path)),
                    MethodName::Service(path) => (&mut h.services, String::from(path)),
                    MethodName::Every => {
                        unreachable!("a policy's name is a method's or a service's")
                    }
                };
                HEDGING_CHECKS.that(
                    !list.iter().any(|(q, _)| *q == path),
                    format_args!("{name:?} is named twice"),
                )?;
                list.push((path, p.clone()));
            }
        }
        Ok(Some(h))
    }

    /// The budget that the policies set (all the same, checked in [`new`](Self::new)).
    pub(crate) fn budget(&self) -> (f64, u32) {
        let p = &self
            .methods
            .first()
            .or(self.services.first())
            .expect("at least one name")
            .1;
        (p.budget_ratio, p.budget_min_per_sec)
    }

    /// The policy for a call to `path`, if its method is hedged.
    pub(crate) fn policy(&self, path: &str) -> Option<&Arc<HedgingPolicy>> {
        self.methods
            .iter()
            .find(|(p, _)| p == path)
            .or_else(|| {
                self.services
                    .iter()
                    .find(|(p, _)| path.starts_with(p.as_str()))
            })
            .map(|(_, policy)| policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(names: &[&str]) -> HedgingPolicy {
        HedgingPolicy::new(names.iter().copied(), Duration::from_millis(10))
    }

    #[test]
    fn names_match_their_methods_and_services() {
        let h = HedgingPolicies::new(
            vec![
                policy(&["pkg.A/Get", "/pkg.A/List"]),
                policy(&["pkg.B", "/pkg.C/"]).max_attempts(4),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.policy("/pkg.A/Get").unwrap().max_attempts, 3);
        assert!(h.policy("/pkg.A/List").is_some());
        assert!(h.policy("/pkg.A/Put").is_none(), "a method not named");
        assert!(h.policy("/pkg.AB/Get").is_none());
        assert_eq!(h.policy("/pkg.B/Any").unwrap().max_attempts, 4);
        assert!(h.policy("/pkg.C/Any").is_some());
        assert!(
            h.policy("/pkg.Bx/Any").is_none(),
            "a service prefix is a whole name"
        );
    }

    #[test]
    fn a_method_wins_over_its_service() {
        let h = HedgingPolicies::new(
            vec![policy(&["pkg.A"]), policy(&["pkg.A/Get"]).max_attempts(5)],
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.policy("/pkg.A/Get").unwrap().max_attempts, 5);
        assert_eq!(h.policy("/pkg.A/Put").unwrap().max_attempts, 3);
    }

    #[test]
    fn bad_policies_are_refused_naming_what() {
        type Case = (Vec<HedgingPolicy>, Option<(f64, u32)>, &'static str);
        let cases: Vec<Case> = vec![
            (
                vec![policy(&["pkg.A/Get"]).max_attempts(6)],
                None,
                "max_attempts",
            ),
            (
                vec![policy(&["pkg.A/Get"]).max_attempts(1)],
                None,
                "max_attempts",
            ),
            (vec![policy(&[])], None, "no method"),
            (vec![policy(&[""])], None, "empty"),
            (vec![policy(&["pkg.A/Get/x"])], None, "pkg.A/Get/x"),
            (vec![policy(&["//Get"])], None, "//Get"),
            (vec![policy(&["pkg A/Get"])], None, "pkg A/Get"),
            (vec![policy(&["pkg.A/Get", "/pkg.A/Get"])], None, "twice"),
            (
                vec![policy(&["pkg.A/Get"]).non_fatal_codes([Code::Ok])],
                None,
                "OK",
            ),
            (
                vec![policy(&["pkg.A/Get"]).budget_ratio(-1.0)],
                None,
                "budget_ratio",
            ),
            (
                vec![policy(&["pkg.A"]), policy(&["pkg.B"]).budget_ratio(0.5)],
                None,
                "one budget",
            ),
            (vec![policy(&["pkg.A"])], Some((0.5, 10)), "one budget"),
        ];
        for (policies, retry, what) in cases {
            let err = HedgingPolicies::new(policies, retry)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("hedging") && err.contains(what),
                "{what}: {err}"
            );
        }
    }
}
