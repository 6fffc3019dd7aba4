//! What a test asserts over what a `BalancedChannel` reports: the instance that served each
//! call ([`Tally`], from `ServedBy`), and the instances' states over time ([`StateLog`], from
//! `endpoints()`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic_balancer::{BalancedChannel, EndpointStats, ServedBy, State};

/// Calls counted by the instance that served them, as each response's `ServedBy` names it.
///
/// ```
/// use tonic_balancer_fleet::Tally;
///
/// let tally = Tally::new();
/// let answer: Result<tonic::Response<()>, tonic::Status> =
///     Err(tonic::Status::unavailable("down"));
/// tally.record(&answer);
/// assert_eq!(tally.failed(), 1);
/// assert_eq!(tally.total(), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Tally(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
struct Counts {
    served: BTreeMap<String, u64>,
    failed: u64,
    /// The failures by status code and message.
    failures: BTreeMap<(i32, String), u64>,
}

impl Tally {
    /// An empty tally. Clones count into the same one (for calls made by several tasks).
    pub fn new() -> Tally {
        Tally::default()
    }

    /// Counts one call's outcome: a response for the instance its `ServedBy` names (or
    /// `"?"` if it has none: a response that did not come through a `BalancedChannel`), a
    /// status as failed.
    pub fn record<T>(&self, outcome: &Result<tonic::Response<T>, tonic::Status>) {
        let mut counts = self.0.lock().expect("the tally's lock");
        match outcome {
            Ok(response) => {
                let name = served_by(response).unwrap_or("?");
                *counts.served.entry(name.to_owned()).or_default() += 1;
            }
            Err(status) => {
                counts.failed += 1;
                let key = (status.code() as i32, status.message().to_owned());
                *counts.failures.entry(key).or_default() += 1;
            }
        }
    }

    /// Calls answered by the instance at `uri` (a trailing `/` on either side ignored).
    pub fn served(&self, uri: &str) -> u64 {
        let counts = self.0.lock().expect("the tally's lock");
        counts
            .served
            .iter()
            .filter(|(name, _)| same_uri(name, uri))
            .map(|(_, n)| n)
            .sum()
    }

    /// Calls answered, by instance (its URI or connector name, as the channel knows it).
    pub fn by_instance(&self) -> BTreeMap<String, u64> {
        self.0.lock().expect("the tally's lock").served.clone()
    }

    /// Calls that failed.
    pub fn failed(&self) -> u64 {
        self.0.lock().expect("the tally's lock").failed
    }

    /// The calls that failed, by status: `(code, message, how many)`, in the order of their
    /// codes.
    pub fn failures(&self) -> Vec<(tonic::Code, String, u64)> {
        let counts = self.0.lock().expect("the tally's lock");
        counts
            .failures
            .iter()
            .map(|((code, message), n)| (tonic::Code::from_i32(*code), message.clone(), *n))
            .collect()
    }

    /// Calls counted, answered or failed.
    pub fn total(&self) -> u64 {
        let counts = self.0.lock().expect("the tally's lock");
        counts.served.values().sum::<u64>() + counts.failed
    }

    /// The share of the calls counted that the instance at `uri` answered (0 with none
    /// counted).
    pub fn share(&self, uri: &str) -> f64 {
        match self.total() {
            0 => 0.0,
            total => self.served(uri) as f64 / total as f64,
        }
    }
}

/// The instance that served a response of a `BalancedChannel`: its URI (or connector name).
pub fn served_by<T>(response: &tonic::Response<T>) -> Option<&str> {
    response.extensions().get::<ServedBy>().map(ServedBy::uri)
}

/// Whether two URIs name the same instance (`Endpoint::from_shared` adds a trailing `/`).
fn same_uri(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The channel's record of the instance at `uri` (a trailing `/` on either side ignored).
///
/// # Panics
///
/// If the channel has no such instance, listing the ones it has.
pub fn stats(channel: &BalancedChannel, uri: &str) -> EndpointStats {
    channel
        .endpoints()
        .into_iter()
        .find(|e| same_uri(e.uri(), uri))
        .unwrap_or_else(|| panic!("no endpoint {uri} in {}", dump(channel)))
}

/// Every instance of the channel, one per line, for assertion messages.
pub fn dump(channel: &BalancedChannel) -> String {
    channel
        .endpoints()
        .iter()
        .map(|e| {
            format!(
                "\n  {e} consecutive_failures={} latency={:?} slowness={:?}",
                e.consecutive_failures(),
                e.latency(),
                e.slowness()
            )
        })
        .collect()
}

/// The sum of the channel's calls in flight over its instances.
pub fn total_in_flight(channel: &BalancedChannel) -> usize {
    channel.endpoints().iter().map(|e| e.in_flight()).sum()
}

/// The states of a channel's instances over time: a task samples `endpoints()` every
/// `period` (on tokio's clock, paused or not) and records each change, until the log is
/// dropped.
///
/// ```no_run
/// # async fn doc(channel: tonic_balancer::BalancedChannel, uri: &str) {
/// use std::time::Duration;
/// use tonic_balancer::State;
/// use tonic_balancer_fleet::StateLog;
///
/// let log = StateLog::start(channel.clone(), Duration::from_millis(5));
/// // ... kill the instance at `uri`, call, restart it ...
/// assert!(log.went_through(uri, &[State::Ready, State::Failing, State::Ready]));
/// # }
/// ```
#[derive(Debug)]
pub struct StateLog {
    changes: Arc<Mutex<Vec<StateChange>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One change of an instance's state, as a [`StateLog`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// When, since the log started.
    pub at: Duration,
    /// The instance's URI (or connector name).
    pub uri: String,
    /// Its new state; `None`: it left the channel's set.
    pub state: Option<State>,
}

impl StateLog {
    /// Starts sampling `channel` every `period` on the current runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, or if `period` is zero.
    pub fn start(channel: BalancedChannel, period: Duration) -> StateLog {
        assert!(!period.is_zero(), "StateLog::start: a period of zero");
        let changes = Arc::new(Mutex::new(Vec::new()));
        let log = changes.clone();
        let task = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            let mut last: BTreeMap<String, State> = BTreeMap::new();
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let now: BTreeMap<String, State> = channel
                    .endpoints()
                    .iter()
                    .map(|e| (e.uri().to_owned(), e.state()))
                    .collect();
                let at = start.elapsed();
                let mut seen = log.lock().expect("the log's lock");
                for (uri, state) in &now {
                    if last.get(uri) != Some(state) {
                        seen.push(StateChange {
                            at,
                            uri: uri.clone(),
                            state: Some(*state),
                        });
                    }
                }
                for uri in last.keys().filter(|u| !now.contains_key(*u)) {
                    seen.push(StateChange {
                        at,
                        uri: uri.clone(),
                        state: None,
                    });
                }
                drop(seen);
                last = now;
            }
        });
        StateLog { changes, task }
    }

    /// Every change seen so far, in order.
    pub fn changes(&self) -> Vec<StateChange> {
        self.changes.lock().expect("the log's lock").clone()
    }

    /// The states the instance at `uri` went through, in order (`None`: out of the set).
    pub fn states(&self, uri: &str) -> Vec<Option<State>> {
        self.changes()
            .into_iter()
            .filter(|c| same_uri(&c.uri, uri))
            .map(|c| c.state)
            .collect()
    }

    /// Whether the instance at `uri` went through these states in this order (others may
    /// come between them).
    pub fn went_through(&self, uri: &str, states: &[State]) -> bool {
        let mut wanted = states.iter().peekable();
        for state in self.states(uri).into_iter().flatten() {
            if wanted.peek() == Some(&&state) {
                wanted.next();
            }
        }
        wanted.peek().is_none()
    }
}

impl Drop for StateLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}
