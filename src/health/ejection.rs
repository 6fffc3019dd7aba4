//! The outlier ejection settings, and what each status an instance answers with counts as.
//!
//! The rules follow gRPC's outlier detection ([gRFC A50]) and Envoy's, whose settings and
//! defaults they take where they have one:
//! - failures in a row (Envoy's `consecutive_5xx`): server faults (UNKNOWN, INTERNAL,
//!   DATA_LOSS, UNAVAILABLE, RESOURCE_EXHAUSTED, a broken connection, a hang until the
//!   deadline) in a row eject at once;
//! - every [`interval`](Ejection::interval), over the calls of that interval, A50's
//!   success-rate rule (an instance whose share of successes is far below the others') and
//!   failure-percentage rule (one whose failures are above a threshold). There every status
//!   but OK is a failure, as in A50, so an instance that answers far worse than its peers is
//!   ejected whatever its codes; the [ordinary codes](Ejection::ordinary_codes) excepted.
//!
//! [gRFC A50]: https://github.com/grpc/proposal/blob/master/A50-xds-outlier-detection.md

use crate::instance::context::code_bit;
use std::time::Duration;

use tonic::Code;

use crate::instance::events::is_server_fault;

/// Outlier ejection settings (see [`Builder::ejection`](crate::Builder::ejection)).
///
/// An instance is ejected (no calls for a time, then readmitted on probation) when:
/// - its calls fail with a server fault 5 times in a row ([`consecutive_failures`](Self::consecutive_failures)):
///   UNKNOWN (a handler that threw), INTERNAL, DATA_LOSS, UNAVAILABLE, RESOURCE_EXHAUSTED, a
///   connection that broke under the call, a deadline that passed while it held the call
///   silent; application answers (NOT_FOUND, INVALID_ARGUMENT, ...) do not break the run;
/// - or, every 10 s ([`interval`](Self::interval)), over the calls of that interval (where
///   every status but OK counts as a failure, as in gRPC's outlier detection, gRFC A50):
///   - **success rate**: among the instances with at least 100 calls (at least 5 of them), its
///     share of successes is more than 1.9 standard deviations below the mean, and below 95%;
///   - **failure percentage**: with at least 5 instances, it has at least 50 calls of which at
///     least 85% failed;
///
///   and, for either rule, its failures are more than chance at the other instances' rate
///   (see [`Ejection::interval`]): a service whose every instance answers the same share of
///   NOT_FOUND ejects nobody.
///
/// The first ejection lasts 30 s, each next one in a streak twice as long, up to 300 s; at
/// most half of the instances are ejected at once. Built from [`Ejection::default`] with one
/// setter per setting, or [`Ejection::disabled`]:
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tonic_balancer::Ejection;
///
/// let ejection = Ejection::default()
///     .consecutive_failures(3)
///     .base_time(Duration::from_secs(10))
///     // This service answers NOT_FOUND and FAILED_PRECONDITION as a matter of course.
///     .ordinary_codes([Code::NotFound, Code::FailedPrecondition]);
/// # let _ = ejection;
/// ```
///
/// The setters do not check their values; [`Builder::build`](crate::Builder::build) does, and
/// refuses a value out of range with [`Error::InvalidSetting`](crate::Error::InvalidSetting).
///
/// Where the defaults differ from gRPC's: A50's interval rules are off unless configured
/// (here on), its `max_ejection_percent` is 10% (here 50%, so that one of a few instances can
/// go), and it has no failures-in-a-row rule (Envoy's `consecutive_5xx`, here 5).
#[derive(Debug, Clone, PartialEq)]
#[must_use = "settings do nothing until given to the builder"]
pub struct Ejection {
    pub(crate) consecutive_failures: u32,
    /// The chance, in percent, that failures in a row eject (100 here; an xDS cluster's
    /// `enforcing_consecutive_5xx` sets it, as Envoy reads it).
    pub(crate) consecutive_enforcement: u32,
    pub(crate) base_time: Duration,
    pub(crate) max_time: Duration,
    pub(crate) max_ejected_percent: u32,
    pub(crate) interval: Option<Duration>,
    pub(crate) success_rate_min_hosts: u32,
    pub(crate) success_rate_min_calls: u64,
    pub(crate) success_rate_stdev_factor: f64,
    pub(crate) success_rate_threshold: f64,
    pub(crate) success_rate_enforcement: u32,
    pub(crate) failure_percentage_threshold: u32,
    pub(crate) failure_percentage_min_hosts: u32,
    pub(crate) failure_percentage_min_calls: u64,
    pub(crate) failure_percentage_enforcement: u32,
    /// One bit per status code (`1 << code`): the codes the user named ordinary answers.
    pub(crate) ordinary: u32,
}

impl Default for Ejection {
    fn default() -> Self {
        Ejection {
            consecutive_failures: 5,
            consecutive_enforcement: 100,
            base_time: Duration::from_secs(30),
            max_time: Duration::from_secs(300),
            max_ejected_percent: 50,
            interval: Some(Duration::from_secs(10)),
            success_rate_min_hosts: 5,
            success_rate_min_calls: 100,
            success_rate_stdev_factor: 1.9,
            success_rate_threshold: 0.95,
            success_rate_enforcement: 100,
            failure_percentage_threshold: 85,
            failure_percentage_min_hosts: 5,
            failure_percentage_min_calls: 50,
            failure_percentage_enforcement: 100,
            ordinary: 0,
        }
    }
}

/// What an answer counts as, for ejection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// OK.
    Success,
    /// A status the user named an ordinary answer of their service: a failed call for the
    /// caller and the totals, a success for ejection.
    Ordinary,
    /// An application's answer (NOT_FOUND, INVALID_ARGUMENT, ...): the instance did its job;
    /// a failure for the interval rules only.
    AppError,
    /// A fault of the server (or its connection): counts against it everywhere.
    Fault,
}

impl Ejection {
    /// No ejection at all: [`max_ejected_percent`](Self::max_ejected_percent) 0, and the
    /// interval rules off ([`interval`](Self::interval) `None`). Failing instances are still
    /// kept out by their connection state and, if enabled, their health checks.
    pub fn disabled() -> Self {
        Ejection::default().max_ejected_percent(0).interval(None)
    }

    /// Server faults in a row that eject an instance: at least 1 (default 5).
    pub fn consecutive_failures(mut self, n: u32) -> Self {
        self.consecutive_failures = n;
        self
    }

    /// How long the first ejection lasts: above zero (default 30 s). Each next ejection in a
    /// streak lasts twice as long, up to [`max_time`](Self::max_time).
    pub fn base_time(mut self, d: Duration) -> Self {
        self.base_time = d;
        self
    }

    /// Cap on the ejection time: at least [`base_time`](Self::base_time) (default 300 s).
    pub fn max_time(mut self, d: Duration) -> Self {
        self.max_time = d;
        self
    }

    /// At most this share of the instances (in percent, 0 to 100) is ejected at once; 0 turns
    /// ejection off (default 50). Above 0, one instance may always be ejected when there are
    /// two or more, and one is always left in.
    pub fn max_ejected_percent(mut self, percent: u32) -> Self {
        self.max_ejected_percent = percent;
        self
    }

    /// How often the success-rate and failure-percentage rules judge the calls of the last
    /// interval, above zero; `None` turns both off (default `Some(10 s)`, gRFC A50's
    /// `interval`).
    ///
    /// Either rule ejects an instance only if its failures in the interval are also more
    /// than chance would give at the failure rate of the other instances (pooled): its
    /// failure rate above theirs by at least 5 points and by 4 standard deviations of its
    /// own count (binomial). A50's rules alone compare an instance with the spread of the
    /// instances' rates, and when every instance answers the same share of application
    /// errors, chance alone puts one of twenty more than 1.9 standard deviations below the
    /// mean in about 40% of the intervals.
    pub fn interval(mut self, every: Option<Duration>) -> Self {
        self.interval = every;
        self
    }

    /// The success-rate rule judges an interval only if at least this many instances had
    /// [`success_rate_min_calls`](Self::success_rate_min_calls) calls in it (default 5, A50's
    /// `minimum_hosts`).
    pub fn success_rate_min_hosts(mut self, n: u32) -> Self {
        self.success_rate_min_hosts = n;
        self
    }

    /// Calls an instance needs in one interval for the success-rate rule to judge it (default
    /// 100, A50's `request_volume`).
    pub fn success_rate_min_calls(mut self, n: u64) -> Self {
        self.success_rate_min_calls = n;
        self
    }

    /// An instance more than this many standard deviations below the mean success rate is
    /// ejected (at least 0, default 1.9: A50's `stdev_factor` of 1900), provided its success
    /// rate is also below [`success_rate_threshold`](Self::success_rate_threshold).
    pub fn success_rate_stdev_factor(mut self, factor: f64) -> Self {
        self.success_rate_stdev_factor = factor;
        self
    }

    /// The success rate (0 to 1) below which an instance far under the mean may be ejected
    /// (default 0.95; not in A50: it keeps instances that all do well in).
    pub fn success_rate_threshold(mut self, rate: f64) -> Self {
        self.success_rate_threshold = rate;
        self
    }

    /// The chance, in percent (0 to 100), that an outlier found by the success-rate rule is
    /// ejected (default 100, A50's `enforcement_percentage`); 0 turns the rule's ejections
    /// off while its findings are still counted (metrics: `ejections_detected_success_rate`).
    pub fn success_rate_enforcement_percent(mut self, percent: u32) -> Self {
        self.success_rate_enforcement = percent;
        self
    }

    /// An instance whose calls in one interval failed at least this often, in percent (0 to
    /// 100), is ejected (default 85, A50's `threshold`).
    pub fn failure_percentage_threshold(mut self, percent: u32) -> Self {
        self.failure_percentage_threshold = percent;
        self
    }

    /// The failure-percentage rule judges an interval only if the set has at least this many
    /// instances (default 5, A50's `minimum_hosts`).
    pub fn failure_percentage_min_hosts(mut self, n: u32) -> Self {
        self.failure_percentage_min_hosts = n;
        self
    }

    /// Calls an instance needs in one interval for the failure-percentage rule to judge it
    /// (default 50, A50's `request_volume`).
    pub fn failure_percentage_min_calls(mut self, n: u64) -> Self {
        self.failure_percentage_min_calls = n;
        self
    }

    /// The chance, in percent (0 to 100), that an outlier found by the failure-percentage rule
    /// is ejected (default 100, A50's `enforcement_percentage`); 0 turns the rule's ejections
    /// off while its findings are still counted.
    pub fn failure_percentage_enforcement_percent(mut self, percent: u32) -> Self {
        self.failure_percentage_enforcement = percent;
        self
    }

    /// Status codes that are ordinary answers of your service (a lookup that answers
    /// NOT_FOUND as often as not, a service that says INTERNAL for a caller's bad input): they
    /// never count against an instance, neither as server faults in a row nor as failures in
    /// the interval rules, as Linkerd's and Envoy's response classification lets a service
    /// say. They still count as failed calls (`EndpointStats::failed`, metrics). OK cannot be
    /// named (it is always a success); CANCELLED and DEADLINE_EXCEEDED never count against an
    /// instance anyway. Replaces the codes named before; default none.
    pub fn ordinary_codes(mut self, codes: impl IntoIterator<Item = Code>) -> Self {
        self.ordinary = codes.into_iter().fold(0, |bits, c| bits | code_bit(c));
        self
    }

    /// What an answer with `code` counts as (see [`Class`]), where the codes whose bits
    /// `ordinary` has set are ordinary answers.
    #[inline]
    pub(crate) fn class_of(ordinary: u32, code: Code) -> Class {
        if code == Code::Ok {
            Class::Success
        } else if ordinary & code_bit(code) != 0 {
            Class::Ordinary
        } else if is_server_fault(code) {
            Class::Fault
        } else {
            Class::AppError
        }
    }

    pub(crate) fn validate(&self) -> Result<(), crate::Error> {
        let c = crate::checks::Checks::of("ejection");
        c.field("consecutive_failures")
            .at_least_one(u64::from(self.consecutive_failures))?;
        c.field("base_time").above_zero(self.base_time)?;
        c.field("max_time")
            .at_least(self.max_time, self.base_time, "base_time")?;
        c.field("max_ejected_percent")
            .between(self.max_ejected_percent, 0, 100)?;
        if let Some(every) = self.interval {
            c.field("interval").above_zero(every)?;
        }
        c.field("success_rate_threshold")
            .between(self.success_rate_threshold, 0.0, 1.0)?;
        let factor = self.success_rate_stdev_factor;
        c.field("success_rate_stdev_factor")
            .that(factor >= 0.0, "must be at least 0")?;
        c.field("success_rate_enforcement_percent").between(
            self.success_rate_enforcement,
            0,
            100,
        )?;
        c.field("failure_percentage_threshold").between(
            self.failure_percentage_threshold,
            0,
            100,
        )?;
        c.field("failure_percentage_enforcement_percent").between(
            self.failure_percentage_enforcement,
            0,
            100,
        )?;
        c.field("ordinary_codes").that(
            self.ordinary & code_bit(Code::Ok) == 0,
            "must not name OK (an OK answer is always a success)",
        )
    }

    /// The same settings with every duration at most 30 years (longer ones mean "never").
    pub(crate) fn capped(mut self) -> Ejection {
        self.base_time = crate::time::cap(self.base_time);
        self.max_time = crate::time::cap(self.max_time);
        self.interval = self.interval.map(crate::time::cap);
        self
    }

    /// How many instances of `members` may be ejected at once.
    pub(crate) fn cap(&self, members: usize) -> usize {
        if members < 2 || self.max_ejected_percent == 0 {
            return 0;
        }
        (members * self.max_ejected_percent as usize / 100).clamp(1, members - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_leaves_one_and_allows_one() {
        let e = Ejection::default();
        assert_eq!(e.cap(0), 0);
        assert_eq!(e.cap(1), 0);
        assert_eq!(e.cap(2), 1);
        assert_eq!(e.cap(5), 2);
        assert_eq!(e.cap(20), 10);
        let all = Ejection::default().max_ejected_percent(100);
        assert_eq!(all.cap(4), 3);
        let none = Ejection::default().max_ejected_percent(0);
        assert_eq!(none.cap(4), 0);
        assert_eq!(Ejection::disabled().cap(4), 0);
    }

    /// Server faults count against an instance, application answers do not, and the codes
    /// a user names ordinary never do, whatever they are.
    #[test]
    fn answers_are_classed_as_grpc_and_envoy_class_them() {
        let e = Ejection::default();
        for code in [Code::Unknown, Code::Internal, Code::DataLoss] {
            assert_eq!(
                Ejection::class_of(e.ordinary, code),
                Class::Fault,
                "{code:?}"
            );
        }
        for code in [Code::Unavailable, Code::ResourceExhausted] {
            assert_eq!(
                Ejection::class_of(e.ordinary, code),
                Class::Fault,
                "{code:?}"
            );
        }
        for code in [
            Code::NotFound,
            Code::InvalidArgument,
            Code::FailedPrecondition,
        ] {
            assert_eq!(
                Ejection::class_of(e.ordinary, code),
                Class::AppError,
                "{code:?}"
            );
        }
        assert_eq!(Ejection::class_of(e.ordinary, Code::Ok), Class::Success);
        let e = e.ordinary_codes([Code::Internal, Code::NotFound]);
        assert_eq!(
            Ejection::class_of(e.ordinary, Code::Internal),
            Class::Ordinary
        );
        assert_eq!(
            Ejection::class_of(e.ordinary, Code::NotFound),
            Class::Ordinary
        );
        assert_eq!(Ejection::class_of(e.ordinary, Code::Unknown), Class::Fault);
        let named_ok = Ejection::default().ordinary_codes([Code::Ok]).validate();
        assert!(
            matches!(&named_ok, Err(crate::Error::InvalidSetting { reason, .. }) if reason.contains("ordinary_codes")),
            "{named_ok:?}"
        );
    }
}
