//! The gauges of a channel's instances (calls in flight, states, latency, open connections),
//! sampled by a background task of the channel, and what the process's channels write into the
//! same series.
//!
//! Two channels of one process may write the same series: two channels with the same target
//! (the default `static` of two fixed sets, two channels over one DNS name), and with the
//! instance label, two channels over one instance. A gauge `set` by each would show whichever
//! sampled last, and a dropped channel's last values would stay. So each channel keeps what it
//! contributes to each series, the process keeps every channel's contribution (a lock taken
//! by the samplers only, twice a second each, never by a call), and each series is set to the
//! sum of the contributions (the mean, for a latency): as an OpenTelemetry up-down counter
//! adds up what each of its writers adds. A channel that is dropped withdraws its
//! contributions: a series it alone wrote drops to 0.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use metrics::{Label, SharedString};

use super::labels::{instance_label, ChannelLabels, Labels};
use super::names::*;
use crate::instance::State;
use crate::set::Set;

/// How often the per-instance gauges are sampled.
const GAUGE_PERIOD: Duration = Duration::from_millis(500);

/// One gauge series: its name and labels.
type Series = (&'static str, Vec<Label>);

/// Each series' contributions: (channel, value).
type Contributions = HashMap<Series, Vec<(u64, f64)>>;

/// Every channel's contribution to each series it writes.
static SERIES: LazyLock<Mutex<Contributions>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The next channel's number, among the channels of the process.
static NEXT_CHANNEL: AtomicU64 = AtomicU64::new(0);

/// Spawns the task that samples the per-instance gauges of the set `owner` holds, until
/// it is dropped.
pub(crate) fn spawn<T: AsRef<Set> + Send + Sync + 'static>(owner: &Arc<T>, labels: &Labels) {
    let set = (**owner).as_ref();
    if labels.get().is_none() {
        return;
    }
    set.spawn(sample(Arc::downgrade(owner), labels.clone()));
}

async fn sample<T: AsRef<Set> + Send + Sync + 'static>(owner: std::sync::Weak<T>, labels: Labels) {
    let Some(config) = labels.get() else { return };
    let mut tick = tokio::time::interval(GAUGE_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Withdrawn when this task ends: its channel dropped, or its runtime shut down.
    let mut written = Written::new();
    // Whether each instance's own connection counted as open at the last sample.
    let mut own: HashMap<Arc<str>, bool> = HashMap::new();
    loop {
        tick.tick().await;
        let Some(owner) = owner.upgrade() else { return };
        let now = contributions(config, (*owner).as_ref(), &mut own);
        drop(owner);
        written.publish(now);
    }
}

/// What one channel's instances add to each series now.
fn contributions(
    config: &ChannelLabels,
    set: &Set,
    own: &mut HashMap<Arc<str>, bool>,
) -> HashMap<Series, f64> {
    let target = Label::new(LABEL_TARGET, config.target.clone());
    let mut out: HashMap<Series, f64> = HashMap::new();
    if !config.per_instance {
        // The target's series, there from the first sample (zeros included).
        out.insert((INSTANCE_CALLS_IN_FLIGHT, vec![target.clone()]), 0.0);
        out.insert((OPEN_CONNECTIONS, vec![target.clone()]), 0.0);
        for s in State::ALL {
            out.insert(
                (
                    INSTANCE_STATE,
                    state_labels(std::slice::from_ref(&target), s),
                ),
                0.0,
            );
        }
    }
    let mut seen = HashMap::new();
    let members = set.snapshot();
    let draining = set.draining();
    for inst in members.iter().chain(draining.iter()) {
        let in_flight = inst.in_flight() as f64;
        let state = inst.state();
        let before = own.get(&inst.target.name).copied().unwrap_or(false);
        let own_open = own_connection_open(state, before);
        seen.insert(inst.target.name.clone(), own_open);
        let extra = inst
            .extra
            .as_deref()
            .map_or(0, crate::instance::conns::ExtraConnections::open);
        let open = (usize::from(own_open) + extra) as f64;
        if config.per_instance {
            let labels = vec![target.clone(), instance_label(inst)];
            for s in State::ALL {
                let v = if s == state { 1.0 } else { 0.0 };
                out.insert((INSTANCE_STATE, state_labels(&labels, s)), v);
            }
            let ns = inst.latency.last_ns();
            if ns > 0.0 {
                out.insert((INSTANCE_LATENCY, labels.clone()), ns * 1e-9);
            }
            out.insert((INSTANCE_CALLS_IN_FLIGHT, labels.clone()), in_flight);
            out.insert((OPEN_CONNECTIONS, labels), open);
        } else {
            let one = [target.clone()];
            *out.entry((INSTANCE_CALLS_IN_FLIGHT, one.to_vec()))
                .or_default() += in_flight;
            *out.entry((OPEN_CONNECTIONS, one.to_vec())).or_default() += open;
            *out.entry((INSTANCE_STATE, state_labels(&one, state)))
                .or_default() += 1.0;
        }
    }
    *own = seen;
    out
}

fn state_labels(labels: &[Label], state: State) -> Vec<Label> {
    let mut l = labels.to_vec();
    l.push(Label::new(
        LABEL_STATE,
        SharedString::const_str(state.as_str()),
    ));
    l
}

/// What one channel writes into the process's series, withdrawn when it is dropped.
struct Written {
    channel: u64,
    last: HashMap<Series, f64>,
}

impl Written {
    fn new() -> Written {
        Written {
            channel: NEXT_CHANNEL.fetch_add(1, Ordering::Relaxed),
            last: HashMap::new(),
        }
    }

    /// This channel's contributions are `now`: each series it writes (or wrote, and no
    /// longer does) is set to what every channel's contributions make.
    fn publish(&mut self, now: HashMap<Series, f64>) {
        let mut all = crate::sync::lock(&SERIES);
        for (series, &v) in &now {
            if !all.contains_key(series) {
                all.insert(series.clone(), Vec::new());
            }
            let values = all.get_mut(series).expect("just made");
            match values.iter_mut().find(|(c, _)| *c == self.channel) {
                Some(mine) => mine.1 = v,
                None => values.push((self.channel, v)),
            }
            let total = combined(series.0, values);
            metrics::gauge!(series.0, series.1.iter()).set(total);
        }
        for series in self.last.keys().filter(|s| !now.contains_key(*s)) {
            let Some(values) = all.get_mut(series) else {
                continue;
            };
            values.retain(|(c, _)| *c != self.channel);
            let total = if values.is_empty() {
                all.remove(series);
                0.0
            } else {
                combined(series.0, values)
            };
            metrics::gauge!(series.0, series.1.iter()).set(total);
        }
        self.last = now;
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        self.publish(HashMap::new());
    }
}

/// A series' value from every channel's contribution: their sum; for a latency, their mean.
fn combined(name: &str, values: &[(u64, f64)]) -> f64 {
    let sum: f64 = values.iter().map(|(_, v)| v).sum();
    if name == INSTANCE_LATENCY {
        sum / values.len().max(1) as f64
    } else {
        sum
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Two channels writing one series: it shows their sum; the one dropped withdraws its
    /// part; a series only the dropped one wrote falls to 0 and is forgotten.
    #[test]
    fn channels_add_up_and_a_dropped_one_withdraws() {
        let target = Label::new(LABEL_TARGET, "gauges.unit");
        let shared: Series = (INSTANCE_CALLS_IN_FLIGHT, vec![target.clone()]);
        let alone: Series = (OPEN_CONNECTIONS, vec![target]);
        let value = |s: &Series| crate::sync::lock(&SERIES).get(s).map(|v| combined(s.0, v));
        let mut a = Written::new();
        let mut b = Written::new();
        a.publish(HashMap::from([(shared.clone(), 3.0), (alone.clone(), 1.0)]));
        b.publish(HashMap::from([(shared.clone(), 2.0)]));
        assert_eq!(value(&shared), Some(5.0));
        b.publish(HashMap::from([(shared.clone(), 4.0)]));
        assert_eq!(value(&shared), Some(7.0));
        drop(a);
        assert_eq!(value(&shared), Some(4.0));
        assert_eq!(value(&alone), None, "forgotten once no channel writes it");
        drop(b);
        assert_eq!(value(&shared), None);
    }

    /// A latency written by two channels is their mean.
    #[test]
    fn latencies_are_averaged() {
        assert_eq!(combined(INSTANCE_LATENCY, &[(1, 0.002), (2, 0.004)]), 0.003);
        assert_eq!(combined(INSTANCE_STATE, &[(1, 1.0), (2, 1.0)]), 2.0);
    }
}
