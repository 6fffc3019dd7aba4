//! The labels of one channel's metrics, set when it is built (its instruments are described to
//! the recorder then, by `describe`).

use std::collections::HashSet;
use std::sync::Arc;

use metrics::{Label, SharedString};

use super::methods::{full_name, Table};
use super::names::*;
use super::settings::LabelSettings;
use crate::instance::Instance;

/// The labels of one channel's metrics, once it is built (none: its metrics are off).
#[derive(Debug, Clone, Default)]
pub(crate) struct Labels(Arc<std::sync::OnceLock<ChannelLabels>>);

impl Labels {
    pub(super) fn get(&self) -> Option<&ChannelLabels> {
        self.0.get()
    }
}

/// Which methods label themselves.
#[derive(Debug)]
enum MethodRule {
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
pub(crate) struct ChannelLabels {
    pub(super) target: SharedString,
    /// The instance label on the per-instance instruments.
    pub(super) per_instance: bool,
    /// The method labels interned so far.
    methods: Table,
    rule: MethodRule,
}

impl ChannelLabels {
    /// The `grpc.method` label of a request path (`/pkg.Service/Method`).
    #[inline]
    pub(super) fn method(&self, path: &str) -> SharedString {
        let name = path.strip_prefix('/').unwrap_or(path);
        let add = match &self.rule {
            MethodRule::FirstSeen => full_name(name),
            MethodRule::Pinned(services) => name
                .split_once('/')
                .is_some_and(|(service, _)| services.contains(service) && full_name(name)),
            MethodRule::All => true,
        };
        match self.methods.get(name, add) {
            Some(label) => label,
            // Past the table's room, every method still labels itself, as asked.
            None if matches!(self.rule, MethodRule::All) => SharedString::from(name.to_owned()),
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
        methods.pin(name);
    }
    let rule = if settings.all_methods {
        MethodRule::All
    } else if settings.methods.is_empty() {
        MethodRule::FirstSeen
    } else {
        MethodRule::Pinned(services)
    };
    let target: Arc<str> = Arc::from(settings.target.unwrap_or(default_target));
    let config = ChannelLabels {
        target: SharedString::from(target),
        per_instance: settings.per_instance,
        methods,
        rule,
    };
    let _ = labels.0.set(config);
    super::describe::describe();
}

/// The names pinned with `metrics_methods` that no call has had so far: a method no call has
/// had, a service none of whose methods a call has had (a name no call carries labels nothing,
/// as a policy's names retry nothing).
pub(crate) fn unmatched_methods(labels: &Labels) -> Vec<String> {
    let Some(config) = labels.get() else {
        return Vec::new();
    };
    let MethodRule::Pinned(services) = &config.rule else {
        return Vec::new();
    };
    let mut names = config.methods.uncalled();
    let called = config.methods.names(true);
    names.extend(
        services
            .iter()
            .filter(|s| {
                !called
                    .iter()
                    .any(|m| m.split_once('/').is_some_and(|(c, _)| c == &***s))
            })
            .map(|s| s.to_string()),
    );
    names.sort();
    names
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
