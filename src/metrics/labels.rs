//! The labels of one channel's metrics, set when it is built, and the instruments described to
//! the recorder then.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use metrics::{Label, SharedString, Unit};

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

/// What the metrics of one channel need: its labels.
#[derive(Debug)]
pub(crate) struct Config {
    pub(super) target: SharedString,
    /// Registered methods, without their slash, and their label.
    methods: HashMap<Box<str>, SharedString>,
    /// Services all of whose methods are labelled.
    services: HashSet<Box<str>>,
    all_methods: bool,
}

impl Config {
    /// The `grpc.method` label of a request path (`/pkg.Service/Method`).
    pub(super) fn method(&self, path: &str) -> SharedString {
        let name = path.strip_prefix('/').unwrap_or(path);
        if let Some(label) = self.methods.get(name) {
            return label.clone();
        }
        let known = self.all_methods
            || name
                .split_once('/')
                .is_some_and(|(service, _)| self.services.contains(service));
        if known {
            SharedString::from(name.to_owned())
        } else {
            SharedString::const_str("other")
        }
    }
}

/// Sets the metrics' labels of a channel just built and describes its instruments to the
/// recorder. `default_target`: the target label if the builder set none.
pub(crate) fn configure(labels: &Labels, settings: LabelSettings, default_target: String) {
    let mut methods = HashMap::new();
    let mut services = HashSet::new();
    for m in settings.methods {
        let name = m.strip_prefix('/').unwrap_or(&m);
        if name.contains('/') {
            let label: Arc<str> = Arc::from(name);
            methods.insert(name.into(), SharedString::from(label));
        } else {
            services.insert(name.into());
        }
    }
    let target: Arc<str> = Arc::from(settings.target.unwrap_or(default_target));
    let config = Config {
        target: SharedString::from(target),
        methods,
        services,
        all_methods: settings.all_methods,
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
    describe_gauge!(
        INSTANCE_CALLS_IN_FLIGHT,
        Unit::Count,
        "calls in flight on each instance"
    );
    describe_gauge!(
        INSTANCE_STATE,
        Unit::Count,
        "1 for the state each instance is in, 0 for the others"
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
}

pub(super) fn target(labels: &Labels) -> Option<SharedString> {
    labels.get().map(|c| c.target.clone())
}

/// The labels of an instance's metrics.
pub(super) fn instance_labels(labels: &Labels, inst: &Instance) -> Option<Vec<Label>> {
    let target = target(labels)?;
    Some(vec![
        Label::new(LABEL_TARGET, target),
        Label::new(LABEL_INSTANCE, SharedString::from(inst.target.name.clone())),
    ])
}
