//! The opt-in retry policy, and the budget that retries and hedges share. (Transparent replay
//! of calls that were never processed needs no policy: see `call/`.)

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use tonic::Code;

/// The default cap on the request body kept to replay a call (64 KiB).
pub const DEFAULT_MAX_REPLAY_BODY: usize = 64 * 1024;

/// Retries of calls that failed with given statuses, on other instances (opt-in, see
/// [`Builder::retry`](crate::Builder::retry)).
///
/// A call is retried when it ends, before any response message, with one of the
/// [`codes`](RetryPolicy::codes) (or a transport error, which is UNAVAILABLE), while: it has
/// attempts left; some instance it has not tried is usable; its request body was kept (at most
/// [`max_replay_body`](crate::Builder::max_replay_body) bytes); its deadline leaves room for
/// the backoff; and the [retry budget](RetryPolicy::budget_ratio) allows it. A call whose
/// response has started (headers with messages) is never retried.
///
/// Built from [`RetryPolicy::default`] with one setter per setting:
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .max_attempts(3)
///     .codes([Code::Unavailable, Code::ResourceExhausted])
///     .initial_backoff(Duration::from_millis(10));
/// # let _ = policy;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a policy out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    pub(crate) codes: Vec<Code>,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) multiplier: f64,
    pub(crate) budget_ratio: f64,
    pub(crate) budget_min_per_sec: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            codes: vec![Code::Unavailable, Code::ResourceExhausted],
            initial_backoff: Duration::from_millis(25),
            max_backoff: Duration::from_secs(1),
            multiplier: 2.0,
            budget_ratio: 0.2,
            budget_min_per_sec: 10,
        }
    }
}

impl RetryPolicy {
    /// Attempts in all, the first included: 2 to 10 (default 3).
    #[must_use]
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = n;
        self
    }

    /// The statuses that are retried: at least one, and not OK (default UNAVAILABLE,
    /// RESOURCE_EXHAUSTED). A transport error counts as UNAVAILABLE.
    #[must_use]
    pub fn codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.codes = codes.into_iter().collect();
        self
    }

    /// Backoff before the first retry (default 25 ms); each next one is
    /// [`multiplier`](Self::multiplier) times longer, up to [`max_backoff`](Self::max_backoff),
    /// each drawn at random between zero and that value (gRPC's retry design).
    #[must_use]
    pub fn initial_backoff(mut self, d: Duration) -> Self {
        self.initial_backoff = d;
        self
    }

    /// Cap on the backoff: at least [`initial_backoff`](Self::initial_backoff) (default 1 s).
    #[must_use]
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// Growth of the backoff per retry: a finite number of at least 1 (default 2).
    #[must_use]
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// Retries may add at most this share of the calls (0.2: one retry per five calls), 0 to
    /// 10 (default 0.2), plus [`budget_min_per_sec`](Self::budget_min_per_sec).
    #[must_use]
    pub fn budget_ratio(mut self, ratio: f64) -> Self {
        self.budget_ratio = ratio;
        self
    }

    /// Retries allowed per second on top of [`budget_ratio`](Self::budget_ratio), so that a
    /// quiet channel can still retry (default 10).
    #[must_use]
    pub fn budget_min_per_sec(mut self, n: u32) -> Self {
        self.budget_min_per_sec = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = crate::checks::Checks::of("retry");
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
            .between(self.budget_ratio, 0.0, 10.0)
    }

    /// The backoff before retry number `retry` (1 for the first), with full jitter.
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let cap = (self.initial_backoff.as_secs_f64()
            * self.multiplier.powi(retry.saturating_sub(1).min(64) as i32))
        .min(self.max_backoff.as_secs_f64());
        crate::time::from_secs_f64(cap * crate::rng::random_unit())
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

/// The retry budget: a balance of tokens that each call adds `ratio` to and each retry takes
/// one from, topped up by `min_per_sec` per second, capped so that a long quiet spell does not
/// bank a burst. Lock-free.
#[derive(Debug)]
pub(crate) struct Budget {
    /// Tokens × 1000.
    balance: AtomicI64,
    /// Last top-up, in ms since `epoch`.
    topped_at: AtomicU64,
    epoch: Instant,
    ratio_milli: i64,
    min_per_sec: i64,
    cap_milli: i64,
}

impl Budget {
    pub(crate) fn new(policy: &RetryPolicy) -> Budget {
        Budget::with(policy.budget_ratio, policy.budget_min_per_sec)
    }

    /// A budget of `ratio` of a retry per call plus `min_per_sec` per second.
    pub(crate) fn with(ratio: f64, min_per_sec: u32) -> Budget {
        let min = i64::from(min_per_sec);
        Budget {
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
    pub(crate) fn deposit(&self) {
        let b = self.balance.fetch_add(self.ratio_milli, Ordering::Relaxed);
        if b > self.cap_milli {
            self.balance.fetch_sub(self.ratio_milli, Ordering::Relaxed);
        }
    }

    /// Takes one retry from the budget; false if it is spent.
    pub(crate) fn withdraw(&self) -> bool {
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
}
