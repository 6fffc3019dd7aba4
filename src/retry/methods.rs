//! The per-method table: which retry or hedging policy, and which service-config settings, apply
//! to a call, by its path ([gRFC A6]'s rule: the most specific name wins, whole).
//!
//! [gRFC A6]: https://github.com/grpc/proposal/blob/master/A6-client-retries.md

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::budget::{Budget, RetryThrottling, DEFAULT_BUDGET};
use super::hedge::{HedgingPolicies, HedgingPolicy, HEDGING_CHECKS};
use super::name::MethodName;
use super::policy::{RetryPolicy, RETRY_CHECKS};
use crate::checks::Checks;
use crate::error::Error;

/// A retry or a hedging policy.
#[derive(Debug, Clone)]
pub(crate) enum RetryOrHedging {
    Retry(Arc<RetryPolicy>),
    Hedge(Arc<HedgingPolicy>),
}

/// What one entry sets for the methods it names: a policy, a service config's settings, or
/// nothing (which still takes the place of a less specific entry, as in gRPC).
#[derive(Debug, Clone)]
pub(crate) struct MethodConfig {
    pub(crate) names: Vec<MethodName>,
    /// A service config's settings (none for a builder's policy).
    pub(crate) settings: CallSettings,
    pub(crate) policy: Option<RetryOrHedging>,
    /// The builder method that took it, for the refusals (`retry`, `service_config`).
    pub(crate) setting: &'static str,
    /// What it is, for the refusals (`a retry policy`, `methodConfig[2]`).
    pub(crate) origin: String,
}

/// What a service config's method config sets for its calls besides a policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CallSettings {
    /// The deadline of a call that sets none (or a later one).
    pub(crate) timeout: Option<Duration>,
    /// Whether a call waits for a usable instance (gRPC's wait-for-ready), unless it says
    /// itself ([`WaitForReady`](crate::WaitForReady)).
    pub(crate) wait_for_ready: Option<bool>,
    /// The largest request message a call may send, in bytes.
    pub(crate) max_request: Option<u32>,
    /// The largest response message a call may receive, in bytes.
    pub(crate) max_response: Option<u32>,
}

impl CallSettings {
    /// Whether it sets nothing.
    pub(crate) fn is_empty(&self) -> bool {
        *self == CallSettings::default()
    }

    /// Whether it limits the size of the messages.
    #[inline]
    pub(crate) fn limits(&self) -> bool {
        self.max_request.is_some() || self.max_response.is_some()
    }
}

/// What applies to the calls of one method: at most one of a retry and a hedging policy, and
/// a service config's settings.
#[derive(Debug, Default)]
pub(crate) struct MethodPolicy {
    pub(crate) retry: Option<Arc<RetryPolicy>>,
    pub(crate) hedging: Option<Arc<HedgingPolicy>>,
    pub(crate) settings: CallSettings,
    /// Whether a call has matched it (see [`MethodPolicies::unmatched`]).
    matched: AtomicBool,
}

impl MethodPolicy {
    /// A call matched it: written once, read first, so that the calls of a method share the
    /// cache line unwritten.
    #[inline(always)]
    fn hit(&self) -> &MethodPolicy {
        if !self.matched.load(Ordering::Relaxed) {
            self.matched.store(true, Ordering::Relaxed);
        }
        self
    }
}

/// How many paths of calls that matched no named entry are kept, to show in the warning.
const MISSES_KEPT: usize = 8;
/// The calls that matched no named entry whose paths are looked at: the first hundred (the
/// warning that shows them comes after a hundred calls). A channel whose policies cover some
/// of its methods has such calls all its life: with the list not yet full (two other methods),
/// each took the lock.
const MISSES_LOOKED_AT: usize = 100;

/// Every entry of a channel, by the paths it covers: the table a call's path is looked up in.
#[derive(Debug, Default)]
pub(crate) struct MethodPolicies {
    /// By method path, sorted.
    methods: Vec<(Box<str>, MethodPolicy)>,
    /// By service prefix (`/pkg.Svc/`), sorted.
    services: Vec<(Box<str>, MethodPolicy)>,
    /// For every other method.
    default: MethodPolicy,
    /// Some entry sets a service config's settings.
    settings: bool,
    /// Some entry sets a retry or hedging policy.
    policies: bool,
    /// Some entry sets a policy of the builder's (which the crate's budget limits).
    budgeted: bool,
    /// The first paths of calls that matched no named entry, up to [`MISSES_KEPT`], from the
    /// first [`MISSES_LOOKED_AT`] such calls, which `missed_calls` counts (read first: after
    /// them, a call that matches nothing costs a load, never the lock).
    missed: std::sync::Mutex<Vec<Box<str>>>,
    missed_calls: AtomicUsize,
}

impl MethodPolicies {
    /// The table of the builder's retry policies (each checked already), its hedging policies
    /// (`hedged`: as [`HedgingPolicies::new`] checked them, delays capped) and the service config's
    /// method configs. Refuses a malformed name, and a name given two policies or two
    /// deadlines.
    pub(crate) fn new(
        retry: &[RetryPolicy],
        hedging: &[HedgingPolicy],
        hedged: Option<&HedgingPolicies>,
        configs: &[MethodConfig],
    ) -> Result<MethodPolicies, Error> {
        let mut entries = builder_entries(retry, hedging, hedged)?;
        entries.extend(configs.iter().cloned());
        let mut merged: BTreeMap<MethodName, MergedEntry> = BTreeMap::new();
        for config in &entries {
            for name in &config.names {
                merged.entry(name.clone()).or_default().take(name, config)?;
            }
        }
        Ok(MethodPolicies::of_merged(merged))
    }

    /// The table of the entries merged by name: in the map's order, each list sorted by its
    /// paths.
    fn of_merged(merged: BTreeMap<MethodName, MergedEntry>) -> MethodPolicies {
        let mut table = MethodPolicies::default();
        for (name, merged) in merged {
            let e = merged.entry;
            table.settings |= !e.settings.is_empty();
            table.policies |= e.retry.is_some() || e.hedging.is_some();
            table.budgeted |= e.retry.as_ref().is_some_and(|r| !r.from_config)
                || e.hedging.as_ref().is_some_and(|h| !h.from_config);
            match name {
                MethodName::Every => table.default = e,
                MethodName::Service(p) => table.services.push((p, e)),
                MethodName::Method(p) => table.methods.push((p, e)),
            }
        }
        table
    }

    /// What applies to a call to `path` (`/package.Service/Method`): the method's own entry,
    /// else its service's, else the default.
    #[inline(always)]
    pub(crate) fn get(&self, path: &str) -> &MethodPolicy {
        if !self.methods.is_empty() {
            if let Ok(i) = self.methods.binary_search_by(|(p, _)| (**p).cmp(path)) {
                return self.methods[i].1.hit();
            }
        }
        if !self.services.is_empty() {
            // The service's prefix: up to the slash after the leading one.
            let service = path
                .get(1..)
                .and_then(|rest| rest.find('/'))
                .map(|i| &path[..i + 2]);
            if let Some(service) = service {
                if let Ok(i) = self.services.binary_search_by(|(p, _)| (**p).cmp(service)) {
                    return self.services[i].1.hit();
                }
            }
            self.missed(path);
        } else if !self.methods.is_empty() {
            self.missed(path);
        }
        &self.default
    }

    /// A call to `path` matched no named entry: its path is kept if there is room.
    #[cold]
    fn missed(&self, path: &str) {
        if self.missed_calls.load(Ordering::Relaxed) >= MISSES_LOOKED_AT {
            return;
        }
        self.missed_calls.fetch_add(1, Ordering::Relaxed);
        let mut missed = crate::sync::lock(&self.missed);
        if missed.len() < MISSES_KEPT && !missed.iter().any(|p| **p == *path) {
            missed.push(path.into());
        }
    }

    /// The names of the entries (`/package.Service/Method`, `/package.Service/`) that no call
    /// has matched so far, and the first paths of calls that matched none: a policy whose
    /// names no call carries (`GetItem` for `/inventory.v1.Inventory/GetItem`) does nothing.
    pub(crate) fn unmatched(&self) -> (Vec<&str>, Vec<Box<str>>) {
        let names = self
            .methods
            .iter()
            .chain(&self.services)
            .filter(|(_, e)| !e.matched.load(Ordering::Relaxed))
            .map(|(p, _)| &**p)
            .collect();
        (names, crate::sync::lock(&self.missed).clone())
    }

    /// The default deadline of a call to `path`, if an entry sets one (a look-up only when
    /// some entry does).
    #[inline]
    pub(crate) fn timeout(&self, path: &str) -> Option<Duration> {
        if self.settings {
            self.get(path).settings.timeout
        } else {
            None
        }
    }

    /// The channel's budget of retries and hedges, if any policy needs one: gRPC's token
    /// bucket with `throttling` (for every policy, as gRFC A6 says), else, if the builder
    /// gave a policy, the crate's budget for those (`set`: the builder's policies' budget, all
    /// the same; else the default one). A service config's policies without `retryThrottling`
    /// have no budget, as in gRPC.
    pub(crate) fn budget(
        &self,
        set: Option<(f64, u32)>,
        throttling: Option<RetryThrottling>,
    ) -> Option<Budget> {
        if !self.policies {
            return None;
        }
        match throttling {
            Some(t) => Some(Budget::throttled(t)),
            None if self.budgeted => {
                let (ratio, min_per_sec) = set.unwrap_or(DEFAULT_BUDGET);
                Some(Budget::with(ratio, min_per_sec))
            }
            None => None,
        }
    }
}

/// The entry of one name while the table is built: what the method configs that name it set,
/// and which of them set its policy and its settings (for the refusals).
#[derive(Default)]
struct MergedEntry {
    entry: MethodPolicy,
    policy_from: Option<String>,
    settings_from: Option<String>,
}

impl MergedEntry {
    /// Takes what `config` sets for `name`, one of the names it gives; refuses a second policy,
    /// or a second method config's settings, at one name.
    fn take(&mut self, name: &MethodName, config: &MethodConfig) -> Result<(), Error> {
        let refuse = |prev: &str, what: &str| {
            Checks::of(config.setting).refusal(format_args!(
                "{name} is named twice, by {prev} and by {}: a method has {what}",
                config.origin
            ))
        };
        if let Some(policy) = &config.policy {
            if let Some(prev) = &self.policy_from {
                return Err(refuse(prev, "one retry or hedging policy at most"));
            }
            match policy {
                RetryOrHedging::Retry(r) => self.entry.retry = Some(r.clone()),
                RetryOrHedging::Hedge(h) => self.entry.hedging = Some(h.clone()),
            }
            self.policy_from = Some(config.origin.clone());
        }
        if !config.settings.is_empty() {
            if let Some(prev) = &self.settings_from {
                return Err(refuse(prev, "one method config at most"));
            }
            self.entry.settings = config.settings;
            self.entry.settings.timeout = config.settings.timeout.map(crate::time::cap);
            self.settings_from = Some(config.origin.clone());
        }
        Ok(())
    }
}

/// The entries of the builder's retry policies (each checked already) and hedging policies
/// (`hedged`: as [`HedgingPolicies::new`] checked them, delays capped), as method configs.
fn builder_entries(
    retry: &[RetryPolicy],
    hedging: &[HedgingPolicy],
    hedged: Option<&HedgingPolicies>,
) -> Result<Vec<MethodConfig>, Error> {
    let mut entries = Vec::with_capacity(retry.len() + hedging.len());
    for p in retry {
        let names = match &p.methods {
            None => vec![MethodName::Every],
            Some(m) => m
                .iter()
                .map(|n| MethodName::parse(n, RETRY_CHECKS))
                .collect::<Result<_, _>>()?,
        };
        entries.push(MethodConfig {
            names,
            settings: CallSettings::default(),
            policy: Some(RetryOrHedging::Retry(Arc::new(p.clone()))),
            setting: "retry",
            origin: "a retry policy".into(),
        });
    }
    if let Some(hedged) = hedged {
        for p in hedging {
            for name in &p.methods {
                let name = MethodName::parse(name, HEDGING_CHECKS)?;
                // The policy as `HedgingPolicies` keeps it: the one a call to that path gets.
                let Some(policy) = hedged.policy(name.path()) else {
                    continue;
                };
                entries.push(MethodConfig {
                    names: vec![name],
                    settings: CallSettings::default(),
                    policy: Some(RetryOrHedging::Hedge(policy.clone())),
                    setting: "hedging",
                    origin: "a hedging policy".into(),
                });
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::shared_budget;

    fn table(retry: &[RetryPolicy], hedging: &[HedgingPolicy]) -> Result<MethodPolicies, Error> {
        let hedged = HedgingPolicies::new(hedging.to_vec(), shared_budget(retry)?)?;
        MethodPolicies::new(retry, hedging, hedged.as_ref(), &[])
    }

    fn attempts(t: &MethodPolicies, path: &str) -> Option<u32> {
        t.get(path).retry.as_ref().map(|p| p.max_attempts)
    }

    #[test]
    fn the_most_specific_name_wins() {
        let t = table(
            &[
                RetryPolicy::new(["pkg.A"]).max_attempts(2),
                RetryPolicy::new(["pkg.A/Get", "/pkg.B/Put"]).max_attempts(4),
                RetryPolicy::default().max_attempts(5),
            ],
            &[HedgingPolicy::new(
                ["pkg.A/Hedged", "pkg.C"],
                Duration::from_millis(5),
            )],
        )
        .unwrap();
        assert_eq!(attempts(&t, "/pkg.A/Get"), Some(4), "the method's own");
        assert_eq!(attempts(&t, "/pkg.A/List"), Some(2), "its service's");
        assert_eq!(attempts(&t, "/pkg.B/Put"), Some(4));
        assert_eq!(attempts(&t, "/pkg.B/Get"), Some(5), "the default");
        assert_eq!(
            attempts(&t, "/pkg.AB/Get"),
            Some(5),
            "a service is a whole name"
        );
        assert_eq!(attempts(&t, "/pkg.A/Get/x"), Some(2));
        let hedged = t.get("/pkg.A/Hedged");
        assert!(hedged.hedging.is_some() && hedged.retry.is_none());
        let c = t.get("/pkg.C/Any");
        assert!(c.hedging.is_some() && c.retry.is_none(), "not retried");
        assert!(t.timeout("/pkg.A/Get").is_none());
    }

    #[test]
    fn without_a_default_other_methods_have_nothing() {
        let t = table(&[RetryPolicy::new(["pkg.A/Get"])], &[]).unwrap();
        assert!(attempts(&t, "/pkg.A/Get").is_some());
        for path in ["/pkg.A/Put", "/pkg.A/", "/", "", "/pkg.A/GetX", "/pkg.A/Ge"] {
            let e = t.get(path);
            assert!(e.retry.is_none() && e.hedging.is_none(), "{path:?}");
        }
        assert!(t.budget(None, None).is_some());
        let none = table(&[], &[]).unwrap();
        assert!(none.budget(None, None).is_none(), "no policy, no budget");
    }

    #[test]
    fn contradictions_are_refused_naming_them() {
        let d = Duration::from_millis(5);
        let cases: Vec<(Vec<RetryPolicy>, Vec<HedgingPolicy>, &str)> = vec![
            (
                vec![
                    RetryPolicy::new(["pkg.A/Get"]),
                    RetryPolicy::new(["/pkg.A/Get"]),
                ],
                vec![],
                "\"pkg.A/Get\" is named twice, by a retry policy and by a retry policy",
            ),
            (
                vec![RetryPolicy::new(["pkg.A"])],
                vec![HedgingPolicy::new(["pkg.A"], d)],
                "\"pkg.A\" is named twice, by a retry policy and by a hedging policy",
            ),
            (
                vec![RetryPolicy::default(), RetryPolicy::default()],
                vec![],
                "every method is named twice",
            ),
            (vec![RetryPolicy::new(["pkg A/Get"])], vec![], "pkg A/Get"),
            (
                vec![RetryPolicy::new(["pkg.A/Get/x"])],
                vec![],
                "pkg.A/Get/x",
            ),
            (vec![RetryPolicy::new([""])], vec![], "empty"),
            (
                vec![
                    RetryPolicy::new(["pkg.A"]),
                    RetryPolicy::new(["pkg.B"]).budget_ratio(0.5),
                ],
                vec![],
                "one budget",
            ),
        ];
        for (retry, hedging, what) in cases {
            let err = table(&retry, &hedging).unwrap_err().to_string();
            assert!(err.contains(what), "{what}: {err}");
        }
        let none: [&str; 0] = [];
        let err = RetryPolicy::new(none).validate().unwrap_err().to_string();
        assert!(
            err.contains("`retry`") && err.contains("names no method"),
            "{err}"
        );
    }

    #[test]
    fn method_configs_take_part_whole() {
        let config =
            |names: Vec<MethodName>, timeout: u64, policy: Option<RetryOrHedging>, at: usize| {
                MethodConfig {
                    names,
                    settings: CallSettings {
                        timeout: (timeout > 0).then(|| Duration::from_millis(timeout)),
                        ..CallSettings::default()
                    },
                    policy,
                    setting: "service_config",
                    origin: format!("methodConfig[{at}]"),
                }
            };
        let retry = Some(RetryOrHedging::Retry(Arc::new(RetryPolicy::default())));
        let configs = [
            config(
                vec![MethodName::of_parts("pkg.A", "")],
                100,
                retry.clone(),
                0,
            ),
            config(vec![MethodName::of_parts("pkg.A", "Get")], 200, None, 1),
            config(vec![MethodName::of_parts("", "")], 300, None, 2),
        ];
        let t = MethodPolicies::new(&[], &[], None, &configs).unwrap();
        assert_eq!(t.timeout("/pkg.A/Put"), Some(Duration::from_millis(100)));
        assert!(t.get("/pkg.A/Put").retry.is_some());
        assert_eq!(t.timeout("/pkg.A/Get"), Some(Duration::from_millis(200)));
        assert!(
            t.get("/pkg.A/Get").retry.is_none(),
            "the method's own entry wins whole, as in gRPC"
        );
        assert_eq!(t.timeout("/other.B/X"), Some(Duration::from_millis(300)));
        // A builder policy and a config's timeout at one name: both apply.
        let t =
            MethodPolicies::new(&[RetryPolicy::new(["pkg.A/Get"])], &[], None, &configs).unwrap();
        assert!(t.get("/pkg.A/Get").retry.is_some());
        assert_eq!(t.timeout("/pkg.A/Get"), Some(Duration::from_millis(200)));
        // Two policies at one name: refused, naming both.
        let err = MethodPolicies::new(&[RetryPolicy::new(["pkg.A"])], &[], None, &configs)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`service_config`")
                && err
                    .contains("\"pkg.A\" is named twice, by a retry policy and by methodConfig[0]"),
            "{err}"
        );
    }
}
