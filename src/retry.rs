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

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use tonic::Code;

use crate::checks::Checks;
use crate::error::Error;
use crate::hedge::{Hedging, HedgingPolicy};

/// The default cap on the request body kept to replay a call (64 KiB).
pub const DEFAULT_MAX_REPLAY_BODY: usize = 64 * 1024;

/// The budget of a policy that does not set one: a fifth of the calls, plus 10 per second.
const DEFAULT_BUDGET: (f64, u32) = (0.2, 10);

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

    /// Attempts in all, the first included: 2 to 10 (default 3).
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
        let c = CHECKS;
        c.field("max_attempts").between(self.max_attempts, 2, 10)?;
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
const CHECKS: Checks = Checks::of("retry");

/// What a policy or a method config names, as the path of the calls it covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Name {
    /// Every method (a service config's name with neither service nor method).
    Every,
    /// `/package.Service/`: every method of the service.
    Service(Box<str>),
    /// `/package.Service/Method`.
    Method(Box<str>),
}

impl Name {
    /// `service` and `method` as a service config names them (`method` empty: the whole
    /// service; both empty: every method). The caller checks their characters.
    #[cfg(any(test, feature = "service-config"))]
    pub(crate) fn of_parts(service: &str, method: &str) -> Name {
        match (service, method) {
            ("", _) => Name::Every,
            (s, "") => Name::Service(format!("/{s}/").into()),
            (s, m) => Name::Method(format!("/{s}/{m}").into()),
        }
    }

    /// Reads a method name as the user gives it to a policy: `package.Service/Method` or
    /// `package.Service`, with or without a leading `/` (read as [`HedgingPolicy`]'s names
    /// are).
    pub(crate) fn parse(name: &str, checks: Checks) -> Result<Name, Error> {
        Ok(match crate::hedge::parse_name(name, checks)? {
            crate::hedge::Name::Method(path) => Name::Method(path.into()),
            crate::hedge::Name::Service(path) => Name::Service(path.into()),
        })
    }

    /// The path it matches (`/pkg.Svc/Method`, or the prefix `/pkg.Svc/`; `/` for every
    /// method).
    fn path(&self) -> &str {
        match self {
            Name::Every => "/",
            Name::Service(p) | Name::Method(p) => p,
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Name::Every => f.write_str("every method"),
            Name::Service(p) => write!(f, "{:?}", p.trim_matches('/')),
            Name::Method(p) => write!(f, "{:?}", &p[1..]),
        }
    }
}

/// A retry or a hedging policy.
#[derive(Debug, Clone)]
pub(crate) enum Policy {
    Retry(Arc<RetryPolicy>),
    Hedge(Arc<HedgingPolicy>),
}

/// What one entry sets for the methods it names: a policy, a service config's settings, or
/// nothing (which still takes the place of a less specific entry, as in gRPC).
#[derive(Debug, Clone)]
pub(crate) struct MethodConfig {
    pub(crate) names: Vec<Name>,
    /// A service config's settings (none for a builder's policy).
    pub(crate) settings: CallSettings,
    pub(crate) policy: Option<Policy>,
    /// The builder method that took it, for the refusals (`retry`, `service_config`).
    pub(crate) setting: &'static str,
    /// What it is, for the refusals (`a retry policy`, `methodConfig[2]`).
    pub(crate) origin: String,
}

/// What a service config's method config sets for its calls besides a policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CallSettings {
    /// The deadline of a call that sets none (or a later one).
    pub(crate) timeout: Option<Duration>,
    /// Whether a call waits for a usable instance (gRPC's wait-for-ready), unless it says
    /// itself ([`WaitForReady`](crate::WaitForReady)).
    pub(crate) wait_for_ready: Option<bool>,
    /// The largest request message a call may send, in bytes.
    pub(crate) max_request: Option<u32>,
    /// The largest response message a call may receive, in bytes.
    pub(crate) max_response: Option<u32>,
}

impl CallSettings {
    /// Whether it sets nothing.
    pub(crate) fn is_empty(&self) -> bool {
        *self == CallSettings::default()
    }

    /// Whether it limits the size of the messages.
    #[inline]
    pub(crate) fn limits(&self) -> bool {
        self.max_request.is_some() || self.max_response.is_some()
    }
}

/// What applies to the calls of one method: at most one of a retry and a hedging policy, and
/// a service config's settings.
#[derive(Debug, Default)]
pub(crate) struct MethodPolicy {
    pub(crate) retry: Option<Arc<RetryPolicy>>,
    pub(crate) hedging: Option<Arc<HedgingPolicy>>,
    pub(crate) settings: CallSettings,
}

/// Every entry of a channel, by the paths it covers: the table a call's path is looked up in.
#[derive(Debug, Default)]
pub(crate) struct MethodPolicies {
    /// By method path, sorted.
    methods: Vec<(Box<str>, MethodPolicy)>,
    /// By service prefix (`/pkg.Svc/`), sorted.
    services: Vec<(Box<str>, MethodPolicy)>,
    /// For every other method.
    default: MethodPolicy,
    /// Some entry sets a service config's settings.
    settings: bool,
    /// Some entry sets a retry or hedging policy.
    policies: bool,
    /// Some entry sets a policy of the builder's (which the crate's budget limits).
    budgeted: bool,
}

impl MethodPolicies {
    /// The table of the builder's retry policies (each checked already), its hedging policies
    /// (`hedged`: as [`Hedging::new`] checked them, delays capped) and the service config's
    /// method configs. Refuses a malformed name, and a name given two policies or two
    /// deadlines.
    pub(crate) fn new(
        retry: &[RetryPolicy],
        hedging: &[HedgingPolicy],
        hedged: Option<&Hedging>,
        configs: &[MethodConfig],
    ) -> Result<MethodPolicies, Error> {
        let mut entries = builder_entries(retry, hedging, hedged)?;
        entries.extend(configs.iter().cloned());

        #[derive(Default)]
        struct Slot {
            entry: MethodPolicy,
            policy_from: Option<String>,
            settings_from: Option<String>,
        }
        let mut slots: BTreeMap<Name, Slot> = BTreeMap::new();
        for c in &entries {
            for name in &c.names {
                let slot = slots.entry(name.clone()).or_default();
                let refuse = |prev: &str, what: &str| {
                    Checks::of(c.setting).refusal(format_args!(
                        "{name} is named twice, by {prev} and by {}: a method has {what}",
                        c.origin
                    ))
                };
                if let Some(policy) = &c.policy {
                    if let Some(prev) = &slot.policy_from {
                        return Err(refuse(prev, "one retry or hedging policy at most"));
                    }
                    match policy {
                        Policy::Retry(r) => slot.entry.retry = Some(r.clone()),
                        Policy::Hedge(h) => slot.entry.hedging = Some(h.clone()),
                    }
                    slot.policy_from = Some(c.origin.clone());
                }
                if !c.settings.is_empty() {
                    if let Some(prev) = &slot.settings_from {
                        return Err(refuse(prev, "one method config at most"));
                    }
                    slot.entry.settings = c.settings;
                    slot.entry.settings.timeout = c.settings.timeout.map(crate::time::cap);
                    slot.settings_from = Some(c.origin.clone());
                }
            }
        }
        let mut table = MethodPolicies::default();
        // In the map's order: each list sorted by its paths.
        for (name, slot) in slots {
            let e = slot.entry;
            table.settings |= !e.settings.is_empty();
            table.policies |= e.retry.is_some() || e.hedging.is_some();
            table.budgeted |= e.retry.as_ref().is_some_and(|r| !r.from_config)
                || e.hedging.as_ref().is_some_and(|h| !h.from_config);
            match name {
                Name::Every => table.default = e,
                Name::Service(p) => table.services.push((p, e)),
                Name::Method(p) => table.methods.push((p, e)),
            }
        }
        Ok(table)
    }

    /// What applies to a call to `path` (`/package.Service/Method`): the method's own entry,
    /// else its service's, else the default.
    #[inline(always)]
    pub(crate) fn get(&self, path: &str) -> &MethodPolicy {
        if !self.methods.is_empty() {
            if let Ok(i) = self.methods.binary_search_by(|(p, _)| (**p).cmp(path)) {
                return &self.methods[i].1;
            }
        }
        if !self.services.is_empty() {
            // The service's prefix: up to the slash after the leading one.
            let service = path
                .get(1..)
                .and_then(|rest| rest.find('/'))
                .map(|i| &path[..i + 2]);
            if let Some(service) = service {
                if let Ok(i) = self.services.binary_search_by(|(p, _)| (**p).cmp(service)) {
                    return &self.services[i].1;
                }
            }
        }
        &self.default
    }

    /// The default deadline of a call to `path`, if an entry sets one (a look-up only when
    /// some entry does).
    #[inline]
    pub(crate) fn timeout(&self, path: &str) -> Option<Duration> {
        if self.settings {
            self.get(path).settings.timeout
        } else {
            None
        }
    }

    /// The channel's budget of retries and hedges, if any policy needs one: gRPC's token
    /// bucket with `throttling` (for every policy, as gRFC A6 says), else, if the builder
    /// gave a policy, the crate's budget for those (`set`: the builder's policies' budget, all
    /// the same; else the default one). A service config's policies without `retryThrottling`
    /// have no budget, as in gRPC.
    pub(crate) fn budget(
        &self,
        set: Option<(f64, u32)>,
        throttling: Option<Throttling>,
    ) -> Option<Budget> {
        if !self.policies {
            return None;
        }
        match throttling {
            Some(t) => Some(Budget::throttled(t)),
            None if self.budgeted => {
                let (ratio, min_per_sec) = set.unwrap_or(DEFAULT_BUDGET);
                Some(Budget::with(ratio, min_per_sec))
            }
            None => None,
        }
    }
}

/// The entries of the builder's retry policies (each checked already) and hedging policies
/// (`hedged`: as [`Hedging::new`] checked them, delays capped), as method configs.
fn builder_entries(
    retry: &[RetryPolicy],
    hedging: &[HedgingPolicy],
    hedged: Option<&Hedging>,
) -> Result<Vec<MethodConfig>, Error> {
    let mut entries = Vec::with_capacity(retry.len() + hedging.len());
    for p in retry {
        let names = match &p.methods {
            None => vec![Name::Every],
            Some(m) => m
                .iter()
                .map(|n| Name::parse(n, CHECKS))
                .collect::<Result<_, _>>()?,
        };
        entries.push(MethodConfig {
            names,
            settings: CallSettings::default(),
            policy: Some(Policy::Retry(Arc::new(p.clone()))),
            setting: "retry",
            origin: "a retry policy".into(),
        });
    }
    if let Some(hedged) = hedged {
        for p in hedging {
            for name in &p.methods {
                let name = Name::parse(name, Checks::of("hedging"))?;
                // The policy as `Hedging` keeps it: the one a call to that path gets.
                let Some(policy) = hedged.policy(name.path()) else {
                    continue;
                };
                entries.push(MethodConfig {
                    names: vec![name],
                    settings: CallSettings::default(),
                    policy: Some(Policy::Hedge(policy.clone())),
                    setting: "hedging",
                    origin: "a hedging policy".into(),
                });
            }
        }
    }
    Ok(entries)
}

/// The one budget that the builder's retry policies set (they must all set the same), if
/// there is any policy.
pub(crate) fn shared_budget(policies: &[RetryPolicy]) -> Result<Option<(f64, u32)>, Error> {
    let Some(first) = policies.first() else {
        return Ok(None);
    };
    for p in &policies[1..] {
        CHECKS.that(
            p.budget_ratio == first.budget_ratio
                && p.budget_min_per_sec == first.budget_min_per_sec,
            "retries and hedges share one budget: every retry policy's budget_ratio and \
             budget_min_per_sec must equal the others'",
        )?;
    }
    Ok(Some((first.budget_ratio, first.budget_min_per_sec)))
}

/// gRPC's retry throttling (a service config's `retryThrottling`, gRFC A6): a bucket of
/// `max_tokens` (in thousandths), that each failure takes one from and each success gives
/// `token_ratio` back to; retries and hedges stop while it holds half or less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Throttling {
    pub(crate) max_milli: i64,
    pub(crate) ratio_milli: i64,
}

/// The budget of retries and hedges: the crate's own, or gRPC's throttle. Lock-free.
#[derive(Debug)]
pub(crate) enum Budget {
    /// A share of the calls plus a floor per second.
    Ratio(Ratio),
    /// gRPC's token bucket.
    Tokens(Tokens),
}

impl Budget {
    /// A budget of `ratio` of a retry per call plus `min_per_sec` per second.
    pub(crate) fn with(ratio: f64, min_per_sec: u32) -> Budget {
        Budget::Ratio(Ratio::with(ratio, min_per_sec))
    }

    /// gRPC's token bucket, full.
    pub(crate) fn throttled(t: Throttling) -> Budget {
        Budget::Tokens(Tokens {
            milli: AtomicI64::new(t.max_milli),
            max: t.max_milli,
            ratio: t.ratio_milli,
        })
    }

    /// A call started (that may be retried or hedged).
    #[inline]
    pub(crate) fn deposit(&self) {
        if let Budget::Ratio(r) = self {
            r.deposit();
        }
    }

    /// An attempt failed with a status its policy retries (or a non-fatal one, for a hedged
    /// call): gRPC's throttle counts it, whether or not the call goes on.
    #[inline]
    pub(crate) fn failed(&self) {
        if let Budget::Tokens(t) = self {
            t.failed();
        }
    }

    /// A call got an answer that is not an error status: gRPC's throttle counts it.
    #[inline]
    pub(crate) fn succeeded(&self) {
        if let Budget::Tokens(t) = self {
            t.succeeded();
        }
    }

    /// Whether it is gRPC's throttle (which limits every policy), rather than the crate's
    /// budget (which limits the builder's policies only).
    #[inline]
    pub(crate) fn is_throttle(&self) -> bool {
        matches!(self, Budget::Tokens(_))
    }

    /// Whether one more retry or hedge may go now; takes nothing. gRPC's throttle is asked
    /// when a retry is decided (gRFC A6), the crate's budget whether it holds a retry.
    pub(crate) fn allows(&self) -> bool {
        match self {
            Budget::Ratio(r) => r.allows(),
            Budget::Tokens(t) => t.above_threshold(),
        }
    }

    /// What one retry going out costs, taken just before its pick: a token of the crate's
    /// budget (false if it is spent); nothing of gRPC's throttle, asked when the retry was
    /// decided. [`refund`](Self::refund) gives it back if the pick then finds no instance.
    pub(crate) fn take(&self) -> bool {
        match self {
            Budget::Ratio(r) => r.withdraw(),
            Budget::Tokens(_) => true,
        }
    }

    /// Gives back what [`take`](Self::take) took: the retry or hedge did not go out after all.
    pub(crate) fn refund(&self) {
        if let Budget::Ratio(r) = self {
            r.balance.fetch_add(1000, Ordering::Relaxed);
        }
    }

    /// Asks for one hedge going out now and takes what it costs: false if the crate's budget
    /// is spent, or gRPC's throttle holds half its tokens or fewer (gRFC A6 asks it for each
    /// hedge).
    pub(crate) fn withdraw(&self) -> bool {
        self.allows() && self.take()
    }
}

/// The crate's budget: a balance of tokens that each call adds `ratio` to and each retry takes
/// one from, topped up by `min_per_sec` per second, capped so that a long quiet spell does not
/// bank a burst.
#[derive(Debug)]
pub(crate) struct Ratio {
    /// Tokens × 1000.
    balance: AtomicI64,
    /// Last top-up, in ms since `epoch`.
    topped_at: AtomicU64,
    epoch: Instant,
    ratio_milli: i64,
    min_per_sec: i64,
    cap_milli: i64,
}

impl Ratio {
    fn with(ratio: f64, min_per_sec: u32) -> Ratio {
        let min = i64::from(min_per_sec);
        Ratio {
            balance: AtomicI64::new(min * 1000),
            topped_at: AtomicU64::new(0),
            epoch: Instant::now(),
            ratio_milli: (ratio * 1000.0) as i64,
            min_per_sec: min,
            cap_milli: (min * 1000).max(10_000) + 100_000,
        }
    }

    /// A call started: it earns `ratio` of a retry.
    #[inline]
    fn deposit(&self) {
        let b = self.balance.fetch_add(self.ratio_milli, Ordering::Relaxed);
        if b > self.cap_milli {
            self.balance.fetch_sub(self.ratio_milli, Ordering::Relaxed);
        }
    }

    /// Whether a retry could be taken now (the top-up due since the last one counted), without
    /// taking it.
    fn allows(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.topped_at.load(Ordering::Relaxed);
        let refill = (now.saturating_sub(last) as i64).saturating_mul(self.min_per_sec);
        let b = self.balance.load(Ordering::Acquire);
        b.saturating_add(refill).min(self.cap_milli.max(b)) >= 1000
    }

    fn withdraw(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        let last = self.topped_at.swap(now, Ordering::Relaxed);
        let refill = (now.saturating_sub(last) as i64).saturating_mul(self.min_per_sec);
        if refill > 0 {
            let b = self.balance.fetch_add(refill, Ordering::Relaxed) + refill;
            if b > self.cap_milli {
                self.balance
                    .fetch_sub(b - self.cap_milli, Ordering::Relaxed);
            }
        }
        self.balance
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b >= 1000).then_some(b - 1000)
            })
            .is_ok()
    }
}

/// gRPC's token bucket, in thousandths of a token (as grpc/grpc's `RetryThrottler`).
#[derive(Debug)]
pub(crate) struct Tokens {
    milli: AtomicI64,
    max: i64,
    ratio: i64,
}

impl Tokens {
    fn failed(&self) {
        let _ = self
            .milli
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some((t - 1000).max(0))
            });
    }

    /// A plain load first: with no failures the bucket stays full, and a success per call
    /// then writes nothing.
    #[inline]
    fn succeeded(&self) {
        if self.milli.load(Ordering::Relaxed) < self.max {
            let _ = self
                .milli
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                    (t < self.max).then(|| (t + self.ratio).min(self.max))
                });
        }
    }

    fn above_threshold(&self) -> bool {
        self.milli.load(Ordering::Acquire) > self.max / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On tokio's paused clock: a spent budget is topped up by `min_per_sec` per second of
    /// the clock, and a call's deposit is worth `ratio` of a retry.
    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_is_topped_up_with_time() {
        let budget = Budget::with(0.5, 2);
        assert!(budget.withdraw() && budget.withdraw());
        assert!(!budget.withdraw(), "more than the initial balance");
        tokio::time::sleep(Duration::from_millis(499)).await;
        assert!(!budget.withdraw(), "topped up before its time");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(
            budget.withdraw(),
            "not topped up after half a second at 2 per second"
        );
        assert!(!budget.withdraw());
        budget.deposit();
        budget.deposit();
        assert!(budget.withdraw(), "two calls at 0.5 earn one retry");
    }

    /// gRPC's bucket: 10 tokens, 0.5 per success. Each failure takes one; retries stop at 5
    /// or fewer (half), and successes bring them back, never above the maximum.
    #[test]
    fn the_token_bucket_counts_failures_and_successes() {
        let b = Budget::throttled(Throttling {
            max_milli: 10_000,
            ratio_milli: 500,
        });
        for _ in 0..10 {
            b.succeeded();
        }
        assert!(b.withdraw(), "full");
        for _ in 0..4 {
            b.failed();
        }
        assert!(b.withdraw(), "6 tokens: above half");
        b.failed();
        assert!(!b.withdraw(), "5 tokens: half, throttled");
        let asked = (b.withdraw(), b.withdraw());
        assert_eq!(asked, (false, false), "asking takes nothing");
        b.succeeded();
        assert!(b.withdraw(), "5.5 tokens");
        for _ in 0..20 {
            b.failed();
        }
        b.succeeded();
        assert!(!b.withdraw(), "never below zero: 0.5 after 20 failures");
        b.deposit();
        assert!(!b.withdraw(), "a call started is not a success");
    }

    fn table(retry: &[RetryPolicy], hedging: &[HedgingPolicy]) -> Result<MethodPolicies, Error> {
        let hedged = Hedging::new(hedging.to_vec(), shared_budget(retry)?)?;
        MethodPolicies::new(retry, hedging, hedged.as_ref(), &[])
    }

    fn attempts(t: &MethodPolicies, path: &str) -> Option<u32> {
        t.get(path).retry.as_ref().map(|p| p.max_attempts)
    }

    #[test]
    fn the_most_specific_name_wins() {
        let t = table(
            &[
                RetryPolicy::new(["pkg.A"]).max_attempts(2),
                RetryPolicy::new(["pkg.A/Get", "/pkg.B/Put"]).max_attempts(4),
                RetryPolicy::default().max_attempts(5),
            ],
            &[HedgingPolicy::new(
                ["pkg.A/Hedged", "pkg.C"],
                Duration::from_millis(5),
            )],
        )
        .unwrap();
        assert_eq!(attempts(&t, "/pkg.A/Get"), Some(4), "the method's own");
        assert_eq!(attempts(&t, "/pkg.A/List"), Some(2), "its service's");
        assert_eq!(attempts(&t, "/pkg.B/Put"), Some(4));
        assert_eq!(attempts(&t, "/pkg.B/Get"), Some(5), "the default");
        assert_eq!(
            attempts(&t, "/pkg.AB/Get"),
            Some(5),
            "a service is a whole name"
        );
        assert_eq!(attempts(&t, "/pkg.A/Get/x"), Some(2));
        let hedged = t.get("/pkg.A/Hedged");
        assert!(hedged.hedging.is_some() && hedged.retry.is_none());
        let c = t.get("/pkg.C/Any");
        assert!(c.hedging.is_some() && c.retry.is_none(), "not retried");
        assert!(t.timeout("/pkg.A/Get").is_none());
    }

    #[test]
    fn without_a_default_other_methods_have_nothing() {
        let t = table(&[RetryPolicy::new(["pkg.A/Get"])], &[]).unwrap();
        assert!(attempts(&t, "/pkg.A/Get").is_some());
        for path in ["/pkg.A/Put", "/pkg.A/", "/", "", "/pkg.A/GetX", "/pkg.A/Ge"] {
            let e = t.get(path);
            assert!(e.retry.is_none() && e.hedging.is_none(), "{path:?}");
        }
        assert!(t.budget(None, None).is_some());
        let none = table(&[], &[]).unwrap();
        assert!(none.budget(None, None).is_none(), "no policy, no budget");
    }

    #[test]
    fn contradictions_are_refused_naming_them() {
        let d = Duration::from_millis(5);
        let cases: Vec<(Vec<RetryPolicy>, Vec<HedgingPolicy>, &str)> = vec![
            (
                vec![
                    RetryPolicy::new(["pkg.A/Get"]),
                    RetryPolicy::new(["/pkg.A/Get"]),
                ],
                vec![],
                "\"pkg.A/Get\" is named twice, by a retry policy and by a retry policy",
            ),
            (
                vec![RetryPolicy::new(["pkg.A"])],
                vec![HedgingPolicy::new(["pkg.A"], d)],
                "\"pkg.A\" is named twice, by a retry policy and by a hedging policy",
            ),
            (
                vec![RetryPolicy::default(), RetryPolicy::default()],
                vec![],
                "every method is named twice",
            ),
            (vec![RetryPolicy::new(["pkg A/Get"])], vec![], "pkg A/Get"),
            (
                vec![RetryPolicy::new(["pkg.A/Get/x"])],
                vec![],
                "pkg.A/Get/x",
            ),
            (vec![RetryPolicy::new([""])], vec![], "empty"),
            (
                vec![
                    RetryPolicy::new(["pkg.A"]),
                    RetryPolicy::new(["pkg.B"]).budget_ratio(0.5),
                ],
                vec![],
                "one budget",
            ),
        ];
        for (retry, hedging, what) in cases {
            let err = table(&retry, &hedging).unwrap_err().to_string();
            assert!(err.contains(what), "{what}: {err}");
        }
        let none: [&str; 0] = [];
        let err = RetryPolicy::new(none).validate().unwrap_err().to_string();
        assert!(
            err.contains("`retry`") && err.contains("names no method"),
            "{err}"
        );
    }

    #[test]
    fn method_configs_take_part_whole() {
        let config =
            |names: Vec<Name>, timeout: u64, policy: Option<Policy>, at: usize| MethodConfig {
                names,
                settings: CallSettings {
                    timeout: (timeout > 0).then(|| Duration::from_millis(timeout)),
                    ..CallSettings::default()
                },
                policy,
                setting: "service_config",
                origin: format!("methodConfig[{at}]"),
            };
        let retry = Some(Policy::Retry(Arc::new(RetryPolicy::default())));
        let configs = [
            config(vec![Name::of_parts("pkg.A", "")], 100, retry.clone(), 0),
            config(vec![Name::of_parts("pkg.A", "Get")], 200, None, 1),
            config(vec![Name::of_parts("", "")], 300, None, 2),
        ];
        let t = MethodPolicies::new(&[], &[], None, &configs).unwrap();
        assert_eq!(t.timeout("/pkg.A/Put"), Some(Duration::from_millis(100)));
        assert!(t.get("/pkg.A/Put").retry.is_some());
        assert_eq!(t.timeout("/pkg.A/Get"), Some(Duration::from_millis(200)));
        assert!(
            t.get("/pkg.A/Get").retry.is_none(),
            "the method's own entry wins whole, as in gRPC"
        );
        assert_eq!(t.timeout("/other.B/X"), Some(Duration::from_millis(300)));
        // A builder policy and a config's timeout at one name: both apply.
        let t =
            MethodPolicies::new(&[RetryPolicy::new(["pkg.A/Get"])], &[], None, &configs).unwrap();
        assert!(t.get("/pkg.A/Get").retry.is_some());
        assert_eq!(t.timeout("/pkg.A/Get"), Some(Duration::from_millis(200)));
        // Two policies at one name: refused, naming both.
        let err = MethodPolicies::new(&[RetryPolicy::new(["pkg.A"])], &[], None, &configs)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`service_config`")
                && err
                    .contains("\"pkg.A\" is named twice, by a retry policy and by methodConfig[0]"),
            "{err}"
        );
    }
}
