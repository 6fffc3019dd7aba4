//! The budget that retries and hedges share: the crate's own (a share of the calls, as
//! [Finagle's retry budget]), or gRPC's token bucket ([gRFC A6]'s `retryThrottling`, as
//! grpc/grpc's [`RetryThrottler`]).
//!
//! [Finagle's retry budget]: https://github.com/twitter/finagle/blob/develop/finagle-core/src/main/scala/com/twitter/finagle/service/RetryBudget.scala
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md
//! [`RetryThrottler`]: https://github.com/grpc/grpc/blob/master/src/core/client_channel/retry_throttle.h

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use tokio::time::Instant;

/// The budget of a policy that does not set one: a fifth of the calls, plus 10 per second.
pub(super) const DEFAULT_BUDGET: (f64, u32) = (0.2, 10);

/// gRPC's retry throttling (a service config's `retryThrottling`, gRFC A6): a bucket of
/// `max_tokens` (in thousandths), that each failure takes one from and each success gives
/// `token_ratio` back to; retries and hedges stop while it holds half or less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryThrottling {
    pub(crate) max_milli: i64,
    pub(crate) ratio_milli: i64,
}

/// The budget of retries and hedges: the crate's own, or gRPC's throttle. Lock-free.
#[derive(Debug)]
pub(crate) enum Budget {
    /// A share of the calls plus a floor per second.
    ShareOfCalls(ShareOfCallsBudget),
    /// gRPC's token bucket.
    TokenBucket(TokenBucket),
}

impl Budget {
    /// A budget of `ratio` of a retry per call plus `min_per_sec` per second.
    pub(crate) fn with(ratio: f64, min_per_sec: u32) -> Budget {
        Budget::ShareOfCalls(ShareOfCallsBudget::with(ratio, min_per_sec))
    }

    /// gRPC's token bucket, full.
    pub(crate) fn throttled(t: RetryThrottling) -> Budget {
        Budget::TokenBucket(TokenBucket {
            milli: AtomicI64::new(t.max_milli),
            max: t.max_milli,
            ratio: t.ratio_milli,
        })
    }

    /// A call started (that may be retried or hedged).
    #[inline]
    pub(crate) fn deposit(&self) {
        if let Budget::ShareOfCalls(r) = self {
            r.deposit();
        }
    }

    /// An attempt failed with a status its policy retries (or a non-fatal one, for a hedged
    /// call): gRPC's throttle counts it, whether or not the call goes on.
    #[inline]
    pub(crate) fn failed(&self) {
        if let Budget::TokenBucket(t) = self {
            t.failed();
        }
    }

    /// A call got an answer that is not an error status: gRPC's throttle counts it.
    #[inline]
    pub(crate) fn succeeded(&self) {
        if let Budget::TokenBucket(t) = self {
            t.succeeded();
        }
    }

    /// Whether it is gRPC's throttle (which limits every policy), rather than the crate's
    /// budget (which limits the builder's policies only).
    #[inline]
    pub(crate) fn is_throttle(&self) -> bool {
        matches!(self, Budget::TokenBucket(_))
    }

    /// Whether one more retry or hedge may go now; takes nothing. gRPC's throttle is asked
    /// when a retry is decided (gRFC A6), the crate's budget whether it holds a retry.
    pub(crate) fn allows(&self) -> bool {
        match self {
            Budget::ShareOfCalls(r) => r.allows(),
            Budget::TokenBucket(t) => t.above_threshold(),
        }
    }

    /// What one retry going out costs, taken just before its pick: a token of the crate's
    /// budget (false if it is spent); nothing of gRPC's throttle, asked when the retry was
    /// decided. [`refund`](Self::refund) gives it back if the pick then finds no instance.
    pub(crate) fn take(&self) -> bool {
        match self {
            Budget::ShareOfCalls(r) => r.withdraw(),
            Budget::TokenBucket(_) => true,
        }
    }

    /// Gives back what [`take`](Self::take) took: the retry or hedge did not go out after all.
    pub(crate) fn refund(&self) {
        if let Budget::ShareOfCalls(r) = self {
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
pub(crate) struct ShareOfCallsBudget {
    /// Tokens × 1000.
    balance: AtomicI64,
    /// Last top-up, in ms since `epoch`.
    topped_at: AtomicU64,
    epoch: Instant,
    ratio_milli: i64,
    min_per_sec: i64,
    cap_milli: i64,
}

impl ShareOfCallsBudget {
    fn with(ratio: f64, min_per_sec: u32) -> ShareOfCallsBudget {
        let min = i64::from(min_per_sec);
        ShareOfCallsBudget {
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
pub(crate) struct TokenBucket {
    milli: AtomicI64,
    max: i64,
    ratio: i64,
}

impl TokenBucket {
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
    use std::time::Duration;

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
        let b = Budget::throttled(RetryThrottling {
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
}
