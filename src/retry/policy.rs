//! [`RetryPolicy`]: the builder's retry settings, their checks and the backoff they give (a
//! service config's policy jittered as [gRFC A6] and [grpc-go] jitter it).
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
//! [grpc-go]: https://github.com/grpc/grpc-go/blob/master/stream.go

use std::time::Duration;

use tonic::Code;

use super::budget::DEFAULT_BUDGET;
use crate::checks::Checks;
use crate::error::Error;

/// Retries of calls that failed with given statuses, on other instances (opt-in, see
/// [`Builder::retry`](crate::Builder::retry)), for the methods the policy names.
///
/// # Which calls are retried
///
/// Only calls to the methods a policy covers; every other call is sent once (apart from
/// gRPC's transparent replay of a call that never reached a server, which needs no policy).
///
/// - [`RetryPolicy::new`] covers the methods it names: a full method name,
///   `package.Service/Method` (the path of the call's HTTP/2 request, a leading `/` allowed),
///   or every method of a service, `package.Service`.
/// - [`RetryPolicy::default`] covers every method of the channel (gRPC's default method
///   config, a name with neither service nor method). Use it only when every method the
///   channel carries may run twice, or when the statuses it retries say that the server did
///   not process the call.
/// - Several policies (one [`Builder::retry`](crate::Builder::retry) each) cover different
///   methods, with settings of their own. For a call, the most specific name wins, whole: the
///   method's own, else its service's, else the default. A
///   [`HedgingPolicy`](crate::HedgingPolicy) (and a service config's method config) counts
///   the same: a method whose own name a hedging policy gives is hedged and not retried, even
///   if a retry policy covers its service, and the other way round. A name given twice, or
///   given to both a retry and a hedging policy, is refused by
///   [`build`](crate::Builder::build): a method has one policy or none, as in gRPC.
///
/// A call so covered is retried when it ends, before any response message, with one of the
/// [`codes`](RetryPolicy::codes) (or a transport error, which is UNAVAILABLE), while: it has
/// attempts left; some instance is usable (a retry goes to one the call has not tried if there
/// is one, else to one it tried that is still usable: over one address, a Kubernetes Service or
/// a VIP, every retry goes to it, as in gRPC); its request body was kept (at most
/// [`max_replay_body`](crate::Builder::max_replay_body) bytes); its deadline leaves room for
/// the backoff; and the [retry budget](RetryPolicy::budget_ratio) allows it (or, with a
/// service config's `retryThrottling`, gRPC's token bucket); the budget's token is taken only
/// when the retry goes out. A call whose response has started (headers with messages) is never
/// retried.
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer::{BalancedChannel, RetryPolicy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tonic_balancer::Error> {
/// // Reads are retried; `catalog.v1.Catalog/PutItem` (not named) never is.
/// let reads = RetryPolicy::new(["catalog.v1.Catalog/GetItem", "catalog.v1.Catalog/ListItems"])
///     .max_attempts(3)
///     .codes([Code::Unavailable, Code::ResourceExhausted])
///     .initial_backoff(Duration::from_millis(10));
/// // Every method of another service, with a policy of its own.
/// let search = RetryPolicy::new(["search.v1.Search"]).codes([Code::Unavailable]);
/// let channel = BalancedChannel::builder()
///     .uris(["http://10.0.0.7:50051", "http://10.0.0.8:50051"])
///     .retry(reads)
///     .retry(search)
///     .build()?;
/// # let _ = channel; Ok(()) }
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a policy out of range, a malformed method name or a name given twice with
/// [`Error::InvalidSetting`](crate::Error::InvalidSetting) naming `retry`.
#[derive(Debug, Clone, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct RetryPolicy {
    /// The methods it covers, as the user named them; `None`: every method.
    pub(crate) methods: Option<Vec<String>>,
    pub(crate) max_attempts: u32,
    pub(crate) codes: Vec<Code>,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) multiplier: f64,
    pub(crate) budget_ratio: f64,
    pub(crate) budget_min_per_sec: u32,
    /// Made from a service config's `retryPolicy`: gRFC A6's rules (its jitter; no budget but
    /// `retryThrottling`) rather than the builder's.
    pub(crate) from_config: bool,
}

impl Default for RetryPolicy {
    /// A policy for every method of the channel (see the type's docs for when that is safe),
    /// with the default settings: 3 attempts, UNAVAILABLE and RESOURCE_EXHAUSTED, a backoff of
    /// 25 ms growing ×2 up to 1 s, a budget of 20% of the calls plus 10 per second.
    fn default() -> Self {
        RetryPolicy {
            methods: None,
            max_attempts: 3,
            codes: vec![Code::Unavailable, Code::ResourceExhausted],
            initial_backoff: Duration::from_millis(25),
            max_backoff: Duration::from_secs(1),
            multiplier: 2.0,
            budget_ratio: DEFAULT_BUDGET.0,
            budget_min_per_sec: DEFAULT_BUDGET.1,
            from_config: false,
        }
    }
}

impl RetryPolicy {
    /// Retries for these methods only (at least one): each `package.Service/Method` (a leading
    /// `/` allowed) or `package.Service` for every method of the service. The other settings
    /// have their defaults (see [`RetryPolicy::default`]).
    ///
    /// ```
    /// use tonic_balancer::RetryPolicy;
    ///
    /// let policy = RetryPolicy::new(["helloworld.Greeter/SayHello", "/health.v1.Probe"]);
    /// # let _ = policy;
    /// ```
    pub fn new<I, S>(methods: I) -> RetryPolicy
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RetryPolicy {
            methods: Some(methods.into_iter().map(Into::into).collect()),
            ..RetryPolicy::default()
        }
    }

    /// Attempts in all, the first included: 2 to 5 (default 3); 5 is gRPC's cap (gRFC A6), which
    /// a service config's `maxAttempts` is held to as well.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The statuses that are retried: at least one, and not OK (default UNAVAILABLE,
    /// RESOURCE_EXHAUSTED). A transport error counts as UNAVAILABLE.
    pub fn codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.codes = codes.into_iter().collect();
        self
    }

    /// Backoff before the first retry (default 25 ms); each next one is
    /// [`multiplier`](Self::multiplier) times longer, up to [`max_backoff`](Self::max_backoff),
    /// each drawn at random between zero and that value ("full jitter"; a service config's
    /// `retryPolicy` draws between 0.8 and 1.2 times it, as gRFC A6 says). After a server's
    /// `grpc-retry-pushback-ms`, the backoff starts again from this one (gRFC A6).
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }

    /// Cap on the backoff: at least [`initial_backoff`](Self::initial_backoff) (default 1 s).
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// Growth of the backoff per retry: a finite number of at least 1 (default 2).
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// Retries may add at most this share of the calls (0.2: one retry per five calls), 0 to
    /// 10 (default 0.2), plus [`budget_min_per_sec`](Self::budget_min_per_sec). There is one
    /// budget per channel: with other retry policies or hedging policies, all must say the
    /// same. It is the crate's own: it limits the builder's policies only; a service config's
    /// retries and hedges are limited by its `retryThrottling` alone, as in gRPC (which, when
    /// given, replaces this budget for every policy).
    pub fn budget_ratio(mut self, ratio: f64) -> Self {
        self.budget_ratio = ratio;
        self
    }

    /// Retries allowed per second on top of [`budget_ratio`](Self::budget_ratio), so that a
    /// quiet channel can still retry (default 10).
    pub fn budget_min_per_sec(mut self, n: u32) -> Self {
        self.budget_min_per_sec = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = RETRY_CHECKS;
        c.field("max_attempts")
            .between(self.max_attempts, 2, crate::retry::MAX_ATTEMPTS)?;
        c.field("codes").that(
            !self.codes.is_empty() && !self.codes.contains(&Code::Ok),
            "must name at least one status, and not OK",
        )?;
        c.field("max_backoff").at_least(
            self.max_backoff,
            self.initial_backoff,
            "initial_backoff",
        )?;
        c.field("multiplier").factor(self.multiplier)?;
        c.field("budget_ratio")
            .between(self.budget_ratio, 0.0, 10.0)?;
        c.that(
            self.methods.as_ref().is_none_or(|m| !m.is_empty()),
            "the policy names no method (RetryPolicy::default() covers every method)",
        )
    }

    /// The backoff before retry number `retry` (1 for the first; counted from the server's
    /// last pushback, if any): min(initial × multiplier^(retry - 1), max), jittered. A service
    /// config's policy draws it between 0.8 and 1.2 times that (gRFC A6, grpc-go); the
    /// builder's between zero and that (full jitter).
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let exp = retry.saturating_sub(1).min(1024) as i32;
        let cap = (self.initial_backoff.as_secs_f64() * self.multiplier.powi(exp))
            .min(self.max_backoff.as_secs_f64());
        let jitter = if self.from_config {
            0.8 + 0.4 * crate::rng::random_unit()
        } else {
            crate::rng::random_unit()
        };
        crate::time::from_secs_f64(cap * jitter)
    }

    /// The same policy with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> RetryPolicy {
        self.initial_backoff = crate::time::cap(self.initial_backoff);
        self.max_backoff = crate::time::cap(self.max_backoff);
        self
    }

    pub(crate) fn retries(&self, code: Code) -> bool {
        self.codes.contains(&code)
    }
}

/// The checks of the `retry` setting.
pub(super) const RETRY_CHECKS: Checks = Checks::of("retry");

/// The one budget that the builder's retry policies set (they must all set the same), if
/// there is any policy.
pub(crate) fn shared_budget(policies: &[RetryPolicy]) -> Result<Option<(f64, u32)>, Error> {
    let Some(first) = policies.first() else {
        return Ok(None);
    };
    for p in &policies[1..] {
        RETRY_CHECKS.that(
            p.budget_ratio == first.budget_ratio
                && p.budget_min_per_sec == first.budget_min_per_sec,
            "retries and hedges share one budget: every retry policy's budget_ratio and \
             budget_min_per_sec must equal the others'",
        )?;
    }
    Ok(Some((first.budget_ratio, first.budget_min_per_sec)))
}
