//! What a channel that probes does: [`ProbeConfig`], for
//! [`Builder::probes`](crate::Builder::probes).

use std::time::Duration;

use crate::checks::Checks;

/// Probes for channels that share their instances with many other clients (opt-in, with
/// [`Builder::probes`](crate::Builder::probes)), as in Prequal (Wydrowski et al., NSDI 2024):
/// besides its calls, the channel asks instances drawn at random how many calls they serve
/// (for every client) and how long a call takes them now, and picks among the fresh answers
/// by the hot-cold rule: the instances whose calls in flight are at most the `hot_quantile`
/// of the answers' are *cold*, and the cold one with the lowest latency wins; its answer then
/// counts one call more. With fewer than two fresh answers, the channel picks by its
/// strategy alone. Instances answer probes with the `orca` feature's `OrcaLayer` (or any
/// server that implements `proto/tonic_balancer/probe/v1/probe.proto`); an instance that
/// answers UNIMPLEMENTED is not probed again until its connection is opened again.
///
/// The defaults are the paper's: 3 probes per call at most (here: per call, `per_call`, which
/// may be below 1), answers kept for at most 1 s and used for at most 2 calls each, at most
/// 16 kept, hot above the 0.84 quantile (2^-0.25); each probe waits at most 100 ms.
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::{BalancedChannel, ProbeConfig};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let channel = BalancedChannel::builder()
///     .uri("http://10.0.0.7:50051")
///     .uri("http://10.0.0.8:50051")
///     .probes(ProbeConfig::default().per_call(2.0).max_age(Duration::from_millis(500)))
///     .build()?;
/// # let _ = channel; Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct ProbeConfig {
    pub(crate) per_call: f64,
    pub(crate) pool: usize,
    pub(crate) max_age: Duration,
    pub(crate) reuse: u32,
    pub(crate) hot_quantile: f64,
    pub(crate) timeout: Duration,
}

impl Default for ProbeConfig {
    fn default() -> ProbeConfig {
        ProbeConfig {
            per_call: 3.0,
            pool: 16,
            max_age: Duration::from_secs(1),
            reuse: 2,
            hot_quantile: 0.84,
            timeout: Duration::from_millis(100),
        }
    }
}

const CHECKS: Checks = Checks::of("probes");

impl ProbeConfig {
    /// Probes sent per call, on average (default 3; between 0 and 16; 0.5: one every other
    /// call): each to an instance drawn at random, as long as fewer than `pool` answers are
    /// fresh or on their way.
    pub fn per_call(mut self, probes: f64) -> ProbeConfig {
        self.per_call = probes;
        self
    }

    /// The most answers kept, fresh or awaited (default 16; 2 to 64).
    pub fn pool(mut self, answers: usize) -> ProbeConfig {
        self.pool = answers;
        self
    }

    /// How long an answer is used for (default 1 s).
    pub fn max_age(mut self, age: Duration) -> ProbeConfig {
        self.max_age = age;
        self
    }

    /// How many calls one answer may pick (default 2; at least 1).
    pub fn reuse(mut self, calls: u32) -> ProbeConfig {
        self.reuse = calls;
        self
    }

    /// The quantile of the answers' calls in flight above which an instance is hot (default
    /// 0.84; between 0 and 1).
    pub fn hot_quantile(mut self, q: f64) -> ProbeConfig {
        self.hot_quantile = q;
        self
    }

    /// How long a probe waits for its answer (default 100 ms).
    pub fn timeout(mut self, timeout: Duration) -> ProbeConfig {
        self.timeout = timeout;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = CHECKS;
        c.field("per_call").between(self.per_call, 0.0, 16.0)?;
        c.field("pool").between(self.pool, 2, 64)?;
        c.field("max_age").above_zero(self.max_age)?;
        c.field("reuse").at_least_one(u64::from(self.reuse))?;
        c.field("hot_quantile")
            .between(self.hot_quantile, 0.0, 1.0)?;
        c.field("timeout").above_zero(self.timeout)
    }
}
