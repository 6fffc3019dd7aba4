//! `methodConfig`: the names each entry covers, its `timeout`, and its `retryPolicy` or
//! `hedgingPolicy`, checked as grpc-go, grpc-java and grpc/grpc's core check them (gRFC A6,
//! `grpc/service_config/service_config.proto`).
//!
//! Sources: [gRFC A6](https://github.com/grpc/proposal/blob/master/A6-client-retries.md).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::json::ConfigNode;
use crate::error::Error;
use crate::retry::{
    CallSettings, HedgingPolicy, MethodConfig, MethodName, RetryOrHedging, RetryPolicy,
};

/// gRFC A6's cap on a policy's attempts: a config asking for more gets this many.
const MAX_ATTEMPTS: u64 = crate::retry::MAX_ATTEMPTS as u64;

/// The entries of `methodConfig`. An entry without names is skipped, as gRPC skips it.
pub(super) fn configs(list: &ConfigNode<'_>) -> Result<Vec<MethodConfig>, Error> {
    let mut out = Vec::new();
    // Each name, and where it was given: a name may be given once in a whole config.
    let mut seen: HashMap<MethodName, String> = HashMap::new();
    for (i, entry) in list.items()?.into_iter().enumerate() {
        entry.object()?;
        let Some(names) = entry.field("name")? else {
            continue;
        };
        let names = names.items()?;
        if names.is_empty() {
            continue;
        }
        let mut parsed = Vec::with_capacity(names.len());
        for n in names {
            let name = name(&n)?;
            if let Some(before) = seen.get(&name) {
                return Err(n.refuse(format_args!("{name} is named already, by {before}")));
            }
            seen.insert(name.clone(), n.path.clone());
            parsed.push(name);
        }
        let settings = CallSettings {
            timeout: match entry.field("timeout")? {
                None => None,
                Some(t) => timeout(&t)?,
            },
            wait_for_ready: entry.field("waitForReady")?.map(|w| w.bool()).transpose()?,
            max_request: message_size(&entry, "maxRequestMessageBytes")?,
            max_response: message_size(&entry, "maxResponseMessageBytes")?,
        };
        let policy =
            match (entry.field("retryPolicy")?, entry.field("hedgingPolicy")?) {
                (Some(_), Some(_)) => return Err(entry.refuse(
                    "retryPolicy and hedgingPolicy are both set: a method config has one or the \
                     other",
                )),
                (Some(r), None) => Some(RetryOrHedging::Retry(Arc::new(retry(&r)?))),
                (None, Some(h)) => Some(RetryOrHedging::Hedge(Arc::new(hedging(&h)?))),
                (None, None) => None,
            };
        out.push(MethodConfig {
            names: parsed,
            settings,
            policy,
            setting: "service_config",
            origin: format!("methodConfig[{i}]"),
        });
    }
    Ok(out)
}

/// One `name` entry: `service` and `method`, each absent, null or empty for none.
fn name(n: &ConfigNode<'_>) -> Result<MethodName, Error> {
    let (service, method) = (part(n, "service")?, part(n, "method")?);
    if service.is_empty() && !method.is_empty() {
        return Err(n.refuse(format_args!(
            "method {method:?} has no service: a name with a method needs its service"
        )));
    }
    Ok(MethodName::of_parts(service, method))
}

/// `service` or `method` of a name: a string without `/` or spaces; empty if absent.
fn part<'a>(n: &ConfigNode<'a>, key: &str) -> Result<&'a str, Error> {
    let Some(v) = n.field(key)? else {
        return Ok("");
    };
    let s = v.str()?;
    if s.bytes().any(|b| !b.is_ascii_graphic() || b == b'/') {
        return Err(v.refuse(format_args!(
            "{s:?} is not a gRPC {key} name (no `/`, no spaces)"
        )));
    }
    Ok(s)
}

/// `maxRequestMessageBytes` or `maxResponseMessageBytes`: a whole number of bytes. A message's
/// length is 32 bits: a limit of 4 GiB or more limits nothing (grpc-go caps it at its int).
fn message_size(entry: &ConfigNode<'_>, key: &str) -> Result<Option<u32>, Error> {
    let Some(n) = entry.field(key)? else {
        return Ok(None);
    };
    Ok(Some(n.whole()?.min(u64::from(u32::MAX)) as u32))
}

/// A `timeout`, read as grpc-go reads it: any duration in protobuf's JSON form. `"0s"` is a
/// deadline that has passed when the call starts (grpc-go fails such a call at once with
/// DEADLINE_EXCEEDED); a negative one sets no deadline (grpc-go applies a timeout only if it is
/// at least zero).
fn timeout(t: &ConfigNode<'_>) -> Result<Option<Duration>, Error> {
    if let Some(positive) = t.str().ok().and_then(|s| s.strip_prefix('-')) {
        crate::time::parse_duration(positive).map_err(|_| {
            t.refuse(format_args!(
                "\"-{positive}\" is not a duration: seconds with up to nine decimals, then `s` \
                 (\"1.5s\")"
            ))
        })?;
        tracing::debug!(path = %t.path, "service config: a negative timeout sets no deadline (as in grpc-go)");
        return Ok(None);
    }
    Ok(Some(crate::time::cap(t.duration()?)))
}

/// `maxAttempts` of a retry or hedging policy: at least 2; above 5 counts as 5, as in gRPC.
fn max_attempts(policy: &ConfigNode<'_>) -> Result<u32, Error> {
    let node = policy.required("maxAttempts")?;
    let n = node.whole()?;
    if n < 2 {
        return Err(node.refuse(format_args!("must be at least 2, not {n}")));
    }
    if n > MAX_ATTEMPTS {
        tracing::warn!(path = %node.path, "service config: maxAttempts {n} counts as 5 (gRFC A6's cap, as in gRPC)");
    }
    Ok(n.min(MAX_ATTEMPTS) as u32)
}

/// A `retryPolicy`.
fn retry(node: &ConfigNode<'_>) -> Result<RetryPolicy, Error> {
    let max_attempts = max_attempts(node)?;
    let backoff = |key: &str| {
        let n = node.required(key)?;
        let d = n.duration()?;
        if d.is_zero() {
            return Err(n.refuse("must be above zero (a duration such as \"0.1s\")"));
        }
        Ok(crate::time::cap(d))
    };
    let initial = backoff("initialBackoff")?;
    let max = backoff("maxBackoff")?;
    let m = node.required("backoffMultiplier")?;
    let multiplier = m.number()?;
    if multiplier <= 0.0 {
        return Err(m.refuse(format_args!(
            "must be a number above zero (2, 1.5, 0.5), not {multiplier}"
        )));
    }
    let codes_node = node.required("retryableStatusCodes")?;
    let codes = codes_node.codes()?;
    if codes.is_empty() {
        return Err(codes_node.refuse("must name at least one status"));
    }
    // The backoff before retry n is min(initial × multiplier^(n-1), max): with a max below
    // the initial backoff, every retry waits up to the max.
    let policy = RetryPolicy {
        from_config: true,
        ..RetryPolicy::default()
    };
    Ok(policy
        .max_attempts(max_attempts)
        .codes(codes)
        .initial_backoff(initial.min(max))
        .max_backoff(max)
        .multiplier(multiplier))
}

/// A `hedgingPolicy`.
fn hedging(node: &ConfigNode<'_>) -> Result<HedgingPolicy, Error> {
    let max_attempts = max_attempts(node)?;
    // Optional (gRFC A6); absent or zero: every attempt at once.
    let delay = match node.field("hedgingDelay")? {
        Some(d) => d.duration()?,
        None => Duration::ZERO,
    };
    let non_fatal = match node.field("nonFatalStatusCodes")? {
        Some(codes) => codes.codes()?,
        None => Vec::new(),
    };
    let policy = HedgingPolicy {
        from_config: true,
        ..HedgingPolicy::new(Vec::<String>::new(), crate::time::cap(delay))
    };
    Ok(policy.max_attempts(max_attempts).non_fatal_codes(non_fatal))
}
