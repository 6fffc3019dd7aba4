//! gRPC connection backoff (the `connection-backoff.md` spec of grpc/grpc): the first retry
//! after `initial`, each next one `multiplier` times longer, up to `max`, each randomised by
//! ±`jitter`.

use std::time::Duration;

/// Reconnect backoff for an instance whose connection could not be opened.
///
/// Defaults are gRPC's: 1 s first, ×1.6, ±20% jitter, 120 s cap, 20 s minimum connect timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    /// Delay before the first reconnect attempt.
    pub initial: Duration,
    /// Growth of the delay per failed attempt.
    pub multiplier: f64,
    /// Randomisation of each delay, as a fraction (0.2 = ±20%).
    pub jitter: f64,
    /// Cap on the delay.
    pub max: Duration,
    /// How long one reconnect attempt may take.
    pub min_connect_timeout: Duration,
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
    /// The delay before attempt number `attempt` (0 for the first).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.initial.as_secs_f64() * self.multiplier.powi(attempt.min(1000) as i32);
        let base = base.min(self.max.as_secs_f64());
        let unit = crate::pick::random_unit();
        let jittered = base * (1.0 + self.jitter * (2.0 * unit - 1.0));
        Duration::from_secs_f64(jittered.max(0.0))
    }

    pub(crate) fn min_connect_timeout(&self) -> Duration {
        self.min_connect_timeout
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let bad = |reason: &str| crate::Error::InvalidSetting {
            name: "backoff",
            reason: reason.to_owned(),
        };
        if self.initial.is_zero() {
            return Err(bad("initial must be above zero"));
        }
        if self.max < self.initial {
            return Err(bad("max must be at least initial"));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(bad("multiplier must be a finite number of at least 1"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(bad("jitter must be between 0 and 1"));
        }
        if self.min_connect_timeout.is_zero() {
            return Err(bad("min_connect_timeout must be above zero"));
        }
        Ok(())
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
    fn refuses_bad_values() {
        let b = Backoff {
            multiplier: 0.5,
            ..Backoff::default()
        };
        assert!(b.validate().unwrap_err().to_string().contains("multiplier"));
        let b = Backoff {
            jitter: 1.5,
            ..Backoff::default()
        };
        assert!(b.validate().unwrap_err().to_string().contains("jitter"));
        let b = Backoff {
            initial: Duration::ZERO,
            ..Backoff::default()
        };
        assert!(b.validate().unwrap_err().to_string().contains("backoff"));
    }
}
