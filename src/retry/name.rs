//! How a policy or a method config names the methods it covers: one type, [`MethodName`], for
//! retry policies, hedging policies and a service config's method configs alike.

use std::fmt;

use crate::checks::Checks;
use crate::error::Error;

/// What a policy or a method config names, as the path of the calls it covers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum MethodName {
    /// Every method (a service config's name with neither service nor method).
    Every,
    /// `/package.Service/`: every method of the service.
    Service(Box<str>),
    /// `/package.Service/Method`.
    Method(Box<str>),
}

impl MethodName {
    /// `service` and `method` as a service config names them (`method` empty: the whole
    /// service; both empty: every method). The caller checks their characters.
    #[cfg(any(test, feature = "service-config"))]
    pub(crate) fn of_parts(service: &str, method: &str) -> MethodName {
        match (service, method) {
            ("", _) => MethodName::Every,
            (s, "") => MethodName::Service(format!("/{s}/").into()),
            (s, m) => MethodName::Method(format!("/{s}/{m}").into()),
        }
    }

    /// Reads a method name as the user gives it to a retry or a hedging policy:
    /// `package.Service/Method` or `package.Service`, with or without a leading `/` (never
    /// [`MethodName::Every`]); a refusal names the setting of `checks`.
    pub(crate) fn parse(name: &str, checks: Checks) -> Result<MethodName, Error> {
        let refuse = |why: &str| checks.refusal(format_args!("method name {name:?}: {why}"));
        let rest = name.strip_prefix('/').unwrap_or(name);
        if rest.is_empty() {
            return Err(refuse("empty"));
        }
        if rest
            .bytes()
            .any(|b| !b.is_ascii_graphic() || matches!(b, b'?' | b'#' | b'%'))
        {
            return Err(refuse("not a gRPC method name (`package.Service/Method`)"));
        }
        match rest.split_once('/') {
            None => Ok(MethodName::Service(format!("/{rest}/").into())),
            Some((service, "")) if !service.is_empty() => {
                Ok(MethodName::Service(format!("/{rest}").into()))
            }
            Some((service, method)) if !service.is_empty() && !method.contains('/') => {
                Ok(MethodName::Method(format!("/{rest}").into()))
            }
            _ => Err(refuse(
                "expected `package.Service/Method` or `package.Service`",
            )),
        }
    }

    /// The path it matches (`/pkg.Svc/Method`, or the prefix `/pkg.Svc/`; `/` for every
    /// method).
    pub(super) fn path(&self) -> &str {
        match self {
            MethodName::Every => "/",
            MethodName::Service(p) | MethodName::Method(p) => p,
        }
    }
}

impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MethodName::Every => f.write_str("every method"),
            MethodName::Service(p) => write!(f, "{:?}", p.trim_matches('/')),
            MethodName::Method(p) => write!(f, "{:?}", &p[1..]),
        }
    }
}
