//! The labels of one channel's metrics, set when it is built, and the instruments described to
//! the recorder then.

use std::collections::HashSet;
use std::sync::Arc;

use metrics::{Label, SharedString, Unit};

use super::methods::{full_name, Table};
use super::names::*;
use super::settings::LabelSettings;
use crate::instance::Instance;

/// The labels of one channel's metrics, once it is built (none: its metrics are off).
#[derive(Debug, Clone, Default)]
pub(crate) struct Labels(Arc<std::sync::OnceLock<Config>>);

impl Labels {
    pub(super) fn get(&self) -> Option<&Config> {
        self.0.get()
    }
}

/// Which methods label themselves.
#[derive(Debug)]
enum Rule {
    /// The first [`METHOD_LIMIT`](super::METHOD_LIMIT) full names seen (the default).
    FirstSeen,
    /// Those pinned with `metrics_methods` (already in the table), and the methods of the
    /// services pinned, up to the limit.
    Pinned(HashSet<Box<str>>),
    /// Every one (`metrics_all_methods`).
    All,
}

/// What the metrics of one channel need: its labels.
#[derive(Debug)]
pub(crate) struct Config {
    pub(super) target: SharedString,
    /// The instance label on the per-instance instruments.
    pub(super) per_instance: bool,
    /// The method labels interned so far.
    methods: Table,
    rule: Rule,
}

impl Config {
    /// The `grpc.method` label of a request path (`/pkg.Service/Method`).
    #[inline]
    pub(super) fn method(&self, path: &str) -> SharedString {
        let name = path.strip_prefix('/').unwrap_or(path);
        let add = match &self.rule {
            Rule::FirstSeen => full_name(name),
            Rule::Pinned(services) => name
                .split_once('/')
                .is_some_and(|(service, _)| services.contains(service) && full_name(name)),
            Rule::All => true,
        };
        match self.methods.get(name, add) {
            Some(label) => label,
            // Past the table's room, every method still labels itself, as asked.
            None if matches!(self.rule, Rule::All) => SharedString::from(name.to_owned()),
            None => SharedString::const_str("other"),
        }
    }
}

/// Sets the metrics' labels of a channel just built and describes its instruments to the
/// recorder. `default_target`: the target label if the builder set none.
pub(crate) fn configure(labels: &Labels, settings: LabelSettings, default_target: String) {
    let mut exact = Vec::new();
    let mut services = HashSet::new();
    for m in &settings.methods {
        let name = m.strip_prefix('/').unwrap_or(m);
        if name.contains('/') {
            exact.push(name);
        } else {
            services.insert(Box::from(name));
        }
    }
    let limit = super::METHOD_LIMIT + exact.len();
    let methods = Table::new(limit);
    for name in exact {
        methods.get(name, true);
    }
    let rule = if settings.all_methods {
        Rule::All
    } else if settings.methods.is_empty() {
        Rule::FirstSeen
    } else {
        Rule::Pinned(services)
    };
    let target: Arc<str> = Arc::from(settings.target.unwrap_or(default_target));
    let config = Config {
        target: SharedString::from(target),
        per_instance: settings.per_instance,
        methods,
        rule,
    };
    let _ = labels.0.set(config);
    describe();
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(ATTEMPT_STARTED, Unit::Count, "RPC attempts started");
    describe_histogram!(
        ATTEMPT_DURATION,
        Unit::Seconds,
        "time of each RPC attempt, from its pick to its end"
    );
    describe_histogram!(
        ATTEMPT_SENT_SIZE,
        Unit::Bytes,
        "bytes of the request messages each RPC attempt sent"
    );
    describe_histogram!(
        ATTEMPT_RCVD_SIZE,
        Unit::Bytes,
        "bytes of the response messages each RPC attempt received"
    );
    describe_histogram!(
        CALL_DURATION,
        Unit::Seconds,
        "time of each RPC as its caller sees it"
    );
    describe_histogram!(CALL_RETRIES, Unit::Count, "retries per call");
    describe_histogram!(
        CALL_TRANSPARENT_RETRIES,
        Unit::Count,
        "transparent retries per call"
    );
    describe_histogram!(CALL_HEDGES, Unit::Count, "hedges per call");
    describe_histogram!(
        CALL_RETRY_DELAY,
        Unit::Seconds,
        "time per call spent waiting between attempts"
    );
    describe_counter!(
        CALL_REFUSED,
        Unit::Count,
        "calls refused because no instance was usable"
    );
    describe_counter!(
        RETRY_BUDGET_EXHAUSTED,
        Unit::Count,
        "retries not made because the retry budget was spent"
    );
    describe_counter!(
        CONNECTION_ATTEMPTS_SUCCEEDED,
        Unit::Count,
        "connections opened to an instance"
    );
    describe_counter!(
        CONNECTION_ATTEMPTS_FAILED,
        Unit::Count,
        "connections to an instance that could not be opened"
    );
    describe_gauge!(
        OPEN_CONNECTIONS,
        Unit::Count,
        "connections open to an instance"
    );
    describe_counter!(
        DISCONNECTIONS,
        Unit::Count,
        "connections to an instance that broke"
    );
    describe_counter!(EJECTIONS_ENFORCED, Unit::Count, "ejections of instances");
    describe_counter!(
        EJECTIONS_OVERFLOW,
        Unit::Count,
        "outliers not ejected because of the cap on ejected instances"
    );
    describe_counter!(
        EJECTIONS_ENFORCED_SUCCESS_RATE,
        Unit::Count,
        "ejections by the success-rate rule"
    );
    describe_counter!(
        EJECTIONS_DETECTED_SUCCESS_RATE,
        Unit::Count,
        "outliers found by the success-rate rule, ejected or not"
    );
    describe_counter!(
        EJECTIONS_ENFORCED_FAILURE_PERCENTAGE,
        Unit::Count,
        "ejections by the failure-percentage rule"
    );
    describe_counter!(
        EJECTIONS_DETECTED_FAILURE_PERCENTAGE,
        Unit::Count,
        "outliers found by the failure-percentage rule, ejected or not"
    );
    describe_gauge!(
        INSTANCE_CALLS_IN_FLIGHT,
        Unit::Count,
        "calls in flight on each instance"
    );
    describe_gauge!(
        INSTANCE_STATE,
        Unit::Count,
        "instances in each state (with the instance label: 1 for its state, 0 for the others)"
    );
    describe_gauge!(
        INSTANCE_LATENCY,
        Unit::Seconds,
        "each instance's latency estimate"
    );
    describe_counter!(
        DISCOVERY_LOOKUPS,
        Unit::Count,
        "answers of the discovery source"
    );
    describe_counter!(
        DISCOVERY_FAILURES,
        Unit::Count,
        "failed answers of the discovery source"
    );
    describe_counter!(INSTANCES_ADDED, Unit::Count, "instances added to the set");
    describe_counter!(
        INSTANCES_REMOVED,
        Unit::Count,
        "instances removed from the set"
    );
    describe_counter!(
        WRR_RR_FALLBACK,
        Unit::Count,
        "weighted round robin schedule updates that fell back to round robin"
    );
    describe_counter!(
        WRR_ENDPOINT_WEIGHT_NOT_YET_USABLE,
        Unit::Count,
        "instances without a usable weight yet, at each weighted round robin schedule update"
    );
    describe_counter!(
        WRR_ENDPOINT_WEIGHT_STALE,
        Unit::Count,
        "instances whose weight is stale, at each weighted round robin schedule update"
    );
    describe_histogram!(
        WRR_ENDPOINT_WEIGHTS,
        Unit::Count,
        "the weight of each instance at each weighted round robin schedule update"
    );
}

pub(super) fn target(labels: &Labels) -> Option<SharedString> {
    labels.get().map(|c| c.target.clone())
}

/// The labels of an instance's metrics: its channel's target, and the instance if the channel
/// labels its instances.
pub(super) fn instance_labels(labels: &Labels, inst: &Instance) -> Option<Vec<Label>> {
    let config = labels.get()?;
    let mut out = vec![Label::new(LABEL_TARGET, config.target.clone())];
    if config.per_instance {
        out.push(instance_label(inst));
    }
    Some(out)
}

/// The instance label of `inst`.
pub(super) fn instance_label(inst: &Instance) -> Label {
    Label::new(LABEL_INSTANCE, SharedString::from(inst.target.name.clone()))
}
