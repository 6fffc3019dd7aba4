//! How a policy or a method config names the methods it covers.

use std::fmt;

use crate::checks::Checks;
use crate::error::Error;

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
        Ok(match super::hedge::parse_name(name, checks)? {
            super::hedge::Name::Method(path) => Name::Method(path.into()),
            super::hedge::Name::Service(path) => Name::Service(path.into()),
        })
    }

    /// The path it matches (`/pkg.Svc/Method`, or the prefix `/pkg.Svc/`; `/` for every
    /// method).
    pub(super) fn path(&self) -> &str {
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
