//! The checks a settings type makes of itself in `Builder::build`: each refusal is an
//! [`Error::InvalidSetting`] that names the builder method that took the value and says what
//! is wrong in the same words for every setting (`initial must be above zero`).

use std::fmt::Display;
use std::time::Duration;

use crate::error::Error;

/// The checks of one setting (`backoff`), or of one field of it (`backoff`'s `initial`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Checks {
    name: &'static str,
    field: &'static str,
}

impl Checks {
    /// The checks of the setting that the builder method `name` takes.
    pub(crate) const fn of(name: &'static str) -> Checks {
        Checks { name, field: "" }
    }

    /// The checks of one of its fields (named in the reason).
    pub(crate) const fn field(self, field: &'static str) -> Checks {
        Checks { field, ..self }
    }

    /// Refuses the value unless `ok`: it `must ...` (the reason, after the field's name).
    pub(crate) fn that(self, ok: bool, must: impl Display) -> Result<(), Error> {
        if ok {
            Ok(())
        } else {
            Err(self.refusal(must))
        }
    }

    /// The refusal of the value, for `why` (after the field's name).
    pub(crate) fn refusal(self, why: impl Display) -> Error {
        let reason = match self.field {
            "" => why.to_string(),
            field => format!("{field} {why}"),
        };
        Error::InvalidSetting {
            name: self.name,
            reason,
        }
    }

    /// A duration (an interval, a timeout, a window) above zero.
    pub(crate) fn above_zero(self, d: Duration) -> Result<(), Error> {
        self.that(!d.is_zero(), "must be above zero")
    }

    /// A count above zero.
    pub(crate) fn at_least_one(self, n: u64) -> Result<(), Error> {
        self.that(n >= 1, "must be at least 1")
    }

    /// A maximum at least the minimum it caps, named `floor`.
    pub(crate) fn at_least<T: PartialOrd>(self, max: T, floor: T, name: &str) -> Result<(), Error> {
        self.that(max >= floor, format_args!("must be at least {name}"))
    }

    /// A weight or a penalty: finite and at least 0.
    pub(crate) fn non_negative(self, x: f64) -> Result<(), Error> {
        self.that(
            x >= 0.0 && x.is_finite(),
            format_args!("must be a finite number of at least 0, not {x}"),
        )
    }

    /// A growth factor: finite and at least 1.
    pub(crate) fn factor(self, x: f64) -> Result<(), Error> {
        self.that(
            x >= 1.0 && x.is_finite(),
            "must be a finite number of at least 1",
        )
    }

    /// A number within `lo..=hi` (not NaN).
    pub(crate) fn between<T: PartialOrd + Display>(self, x: T, lo: T, hi: T) -> Result<(), Error> {
        let ok = lo <= x && x <= hi;
        self.that(ok, format_args!("must be between {lo} and {hi}, not {x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<(), Error>) -> String {
        match r {
            Err(Error::InvalidSetting { name, reason }) => format!("{name}: {reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_name_the_setting_and_the_field() {
        let c = Checks::of("backoff");
        assert!(c
            .field("initial")
            .above_zero(Duration::from_millis(1))
            .is_ok());
        assert_eq!(
            reason(c.field("initial").above_zero(Duration::ZERO)),
            "backoff: initial must be above zero"
        );
        assert_eq!(
            reason(Checks::of("latency_expiry").above_zero(Duration::ZERO)),
            "latency_expiry: must be above zero"
        );
        assert_eq!(
            reason(c.field("max").at_least(1, 2, "initial")),
            "backoff: max must be at least initial"
        );
        assert_eq!(
            reason(c.field("multiplier").factor(f64::NAN)),
            "backoff: multiplier must be a finite number of at least 1"
        );
        assert!(c.field("multiplier").factor(1.0).is_ok());
        assert!(c.field("multiplier").factor(f64::INFINITY).is_err());
        assert_eq!(
            reason(c.field("jitter").between(1.5, 0.0, 1.0)),
            "backoff: jitter must be between 0 and 1, not 1.5"
        );
        assert!(c.field("jitter").between(f64::NAN, 0.0, 1.0).is_err());
        assert!(c.field("jitter").between(1.0, 0.0, 1.0).is_ok());
        assert!(c.field("n").at_least_one(0).is_err());
        assert!(c.non_negative(0.0).is_ok());
        assert!(c.non_negative(-0.5).is_err());
        assert!(c.non_negative(f64::NAN).is_err());
    }
}
