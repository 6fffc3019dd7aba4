//! The per-instance gauges, sampled by a background task of the channel.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use metrics::Label;

use super::labels::{instance_labels, Labels};
use super::names::*;
use crate::instance::State;
use crate::set::Set;

/// How often the per-instance gauges are sampled.
const GAUGE_PERIOD: Duration = Duration::from_millis(500);

/// Spawns the task that samples the per-instance gauges of the set `owner` holds, until
/// it is dropped.
pub(crate) fn spawn<T: AsRef<Set> + Send + Sync + 'static>(owner: &Arc<T>, labels: &Labels) {
    let set = (**owner).as_ref();
    if labels.get().is_none() {
        return;
    }
    set.spawn(sample(Arc::downgrade(owner), labels.clone()));
}

async fn sample<T: AsRef<Set> + Send + Sync + 'static>(owner: std::sync::Weak<T>, config: Labels) {
    let mut tick = tokio::time::interval(GAUGE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The instances reported at the last tick: their labels, and whether their own
    // connection was counted as open.
    let mut seen: HashMap<Arc<str>, (Vec<Label>, bool)> = HashMap::new();
    loop {
        tick.tick().await;
        let Some(owner) = owner.upgrade() else { return };
        let set = (*owner).as_ref();
        let mut now: HashMap<Arc<str>, (Vec<Label>, bool)> = HashMap::new();
        let members = set.snapshot();
        let draining = set.draining();
        for inst in members.iter().chain(draining.iter()) {
            let Some(labels) = instance_labels(&config, inst) else {
                return;
            };
            let in_flight = inst.in_flight.load(Ordering::Relaxed);
            metrics::gauge!(INSTANCE_CALLS_IN_FLIGHT, labels.iter()).set(in_flight as f64);
            let state = inst.state();
            set_states(&labels, Some(state));
            let ns = f64::from_bits(inst.latency_ns.load(Ordering::Relaxed));
            if ns > 0.0 {
                metrics::gauge!(INSTANCE_LATENCY, labels.iter()).set(ns * 1e-9);
            }
            let before = seen.get(&inst.target.name).is_some_and(|(_, own)| *own);
            let own = own_connection_open(state, before);
            let extra = inst
                .extra
                .as_deref()
                .map_or(0, crate::instance::conns::Extra::open);
            metrics::gauge!(OPEN_CONNECTIONS, labels.iter()).set((usize::from(own) + extra) as f64);
            now.insert(inst.target.name.clone(), (labels, own));
        }
        for (name, (labels, _)) in seen.drain() {
            if !now.contains_key(&name) {
                // Gone: nothing in flight, in no state, its connections closed.
                metrics::gauge!(INSTANCE_CALLS_IN_FLIGHT, labels.iter()).set(0.0);
                metrics::gauge!(OPEN_CONNECTIONS, labels.iter()).set(0.0);
                set_states(&labels, None);
            }
        }
        seen = now;
    }
}

/// Whether an instance's own connection (the one of its tonic `Channel`) counts as open,
/// from its state (`before`: whether it counted at the last sample). tonic's `Channel`
/// does not tell its connection's state; the instance's state does, from what its calls
/// and connection attempts showed: `Ready` once a call was answered on the connection,
/// back to `Connecting` when the connection broke, `Failing` when it could not be opened.
/// An instance out of service (ejected, unhealthy, draining) keeps its connection as it
/// was: nothing closes it, and no call reports on it meanwhile.
pub(crate) fn own_connection_open(state: State, before: bool) -> bool {
    match state {
        State::Ready => true,
        State::Connecting | State::Failing => false,
        State::Ejected | State::Unhealthy | State::Draining => before,
    }
}

fn set_states(labels: &[Label], current: Option<State>) {
    for s in State::ALL {
        let mut l = labels.to_vec();
        l.push(Label::new(LABEL_STATE, s.as_str()));
        let v = if Some(s) == current { 1.0 } else { 0.0 };
        metrics::gauge!(INSTANCE_STATE, l).set(v);
    }
}
