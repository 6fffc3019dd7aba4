//! gRPC connection backoff (the `connection-backoff.md` spec of grpc/grpc): the first retry
//! after `initial`, each next one `multiplier` times longer, up to `max`, each randomised by
//! ±`jitter`.

use std::time::Duration;

/// Reconnect backoff for an instance whose connection could not be opened (see
/// [`Builder::backoff`](crate::Builder::backoff)).
///
/// Defaults are gRPC's: 1 s first, ×1.6, ±20% jitter, 120 s cap, 20 s minimum connect timeout.
/// Built from [`Backoff::default`] with one setter per setting:
///
/// ```
/// use std::time::Duration;
/// use tonic_balancer::Backoff;
///
/// let backoff = Backoff::default()
///     .initial(Duration::from_millis(200))
///     .max(Duration::from_secs(10));
/// # let _ = backoff;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
#[derive(Debug, Clone, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct Backoff {
    pub(crate) initial: Duration,
    pub(crate) multiplier: f64,
    pub(crate) jitter: f64,
    pub(crate) max: Duration,
    pub(crate) min_connect_timeout: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            multiplier: 1.6,
            jitter: 0.2,
            max: Duration::from_secs(120),
            min_connect_timeout: Duration::from_secs(20),
        }
    }
}

impl Backoff {
    /// The delay before attempt number `attempt` (0 for the first). Total for any settings:
    /// what [`build`](crate::Builder::build) would refuse (a NaN, a jitter above 1) still gives
    /// a delay, between zero and [`max`](Self::max) plus its jitter, capped at 30 years.
    pub fn delay(&self, attempt: u32) -> Duration {
        let max = crate::time::cap(self.max).as_secs_f64();
        let base = crate::time::cap(self.initial).as_secs_f64()
            * self.multiplier.powi(attempt.min(1000) as i32);
        let base = if base.is_nan() { max } else { base.min(max) };
        let jitter = if self.jitter.is_nan() {
            0.0
        } else {
            self.jitter.clamp(0.0, 1.0)
        };
        let unit = crate::rng::random_unit();
        crate::time::from_secs_f64(base * (1.0 + jitter * (2.0 * unit - 1.0)))
    }

    /// The same settings with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> Backoff {
        self.initial = crate::time::cap(self.initial);
        self.max = crate::time::cap(self.max);
        self.min_connect_timeout = crate::time::cap(self.min_connect_timeout);
        self
    }

    /// Delay before the first reconnect attempt: above zero (default 1 s).
    pub fn initial(mut self, d: Duration) -> Self {
        self.initial = d;
        self
    }

    /// Growth of the delay per failed attempt: a finite number of at least 1 (default 1.6).
    pub fn multiplier(mut self, m: f64) -> Self {
        self.multiplier = m;
        self
    }

    /// Randomisation of each delay, as a fraction from 0 to 1 (default 0.2, that is ±20%).
    pub fn jitter(mut self, j: f64) -> Self {
        self.jitter = j;
        self
    }

    /// Cap on the delay: at least [`initial`](Self::initial) (default 120 s).
    pub fn max(mut self, d: Duration) -> Self {
        self.max = d;
        self
    }

    /// How long one reconnect attempt may take: above zero (default 20 s).
    pub fn min_connect_timeout(mut self, d: Duration) -> Self {
        self.min_connect_timeout = d;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = crate::checks::Checks::of("backoff");
        c.field("initial").above_zero(self.initial)?;
        c.field("max").at_least(self.max, self.initial, "initial")?;
        c.field("multiplier").factor(self.multiplier)?;
        c.field("jitter").between(self.jitter, 0.0, 1.0)?;
        c.field("min_connect_timeout")
            .above_zero(self.min_connect_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_and_caps() {
        let b = Backoff::default();
        for attempt in 0..40 {
            let want = (1.6f64.powi(attempt as i32)).min(120.0);
            for _ in 0..50 {
                let d = b.delay(attempt).as_secs_f64();
                assert!(
                    d >= want * 0.8 - 1e-9 && d <= want * 1.2 + 1e-9,
                    "attempt {attempt}: {d} vs {want}"
                );
            }
        }
    }

    #[test]
    fn no_setting_makes_a_delay_panic() {
        let huge = [
            Backoff::default().initial(Duration::MAX).max(Duration::MAX),
            Backoff::default().jitter(f64::INFINITY),
            Backoff::default().jitter(f64::NAN).multiplier(f64::NAN),
            Backoff::default()
                .multiplier(f64::INFINITY)
                .max(Duration::MAX),
            Backoff::default().multiplier(f64::MAX).jitter(1.0),
        ];
        for b in huge {
            for attempt in [0, 1, 10, u32::MAX] {
                assert!(b.delay(attempt) <= crate::time::FOREVER, "{b:?}");
            }
        }
    }

    #[test]
    fn refuses_bad_values() {
        let b = Backoff::default().multiplier(0.5);
        assert!(b.validate().unwrap_err().to_string().contains("multiplier"));
        let b = Backoff::default().jitter(1.5);
        assert!(b.validate().unwrap_err().to_string().contains("jitter"));
        let b = Backoff::default().initial(Duration::ZERO);
        assert!(b.validate().unwrap_err().to_string().contains("backoff"));
    }
}
