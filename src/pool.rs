//! The shared set of instances: a snapshot that every call loads without a lock, replaced as a
//! whole by the rare writers (membership changes).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;
use tonic::transport::Endpoint;

use crate::health::{self, Policy};
use crate::instance::{Instance, State};
use crate::retry::{Budget, RetryPolicy};
use crate::{lock, Strategy};

/// The instances of one moment, and the steps the pick may walk them with (the primes below
/// their number that do not divide it: each visits every instance once).
pub(crate) struct Members {
    list: Vec<Arc<Instance>>,
    pub(crate) strides: Vec<usize>,
}

impl Members {
    fn new(list: Vec<Arc<Instance>>) -> Members {
        let strides = crate::pick::strides_for(list.len());
        Members { list, strides }
    }
}

impl std::ops::Deref for Members {
    type Target = [Arc<Instance>];

    fn deref(&self) -> &[Arc<Instance>] {
        &self.list
    }
}

pub(crate) type Snapshot = Arc<Members>;

/// The instances of one channel and its clones.
pub(crate) struct Pool {
    /// The instances that get calls; readers `load()` it without a lock.
    pub(crate) members: ArcSwap<Members>,
    /// Removed instances that may still have calls in flight; they close when the last call
    /// ends (the calls hold the instance).
    draining: Mutex<Vec<Weak<Instance>>>,
    /// Serialises writers.
    write: Mutex<()>,
    pub(crate) policy: Arc<Policy>,
    pub(crate) strategy: Strategy,
    pub(crate) rr: AtomicUsize,
    /// Transparent retry on (see `Builder::transparent_retry`).
    pub(crate) replay: bool,
    /// The retry policy, if any, and its budget.
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) budget: Option<Budget>,
    /// Cap on the request body kept for another attempt.
    pub(crate) max_replay_body: usize,
    /// Whether instances added from now on warm up (slow start); off for the initial set.
    pub(crate) warm_new: std::sync::atomic::AtomicBool,
    /// Wakes the discovery task early (an instance could not be reached).
    pub(crate) discovery_wake: Arc<tokio::sync::Notify>,
    /// With discovery: true once the source answered (or failed) the first time. Calls made
    /// before that wait for it (bounded by the lookup's own timeout and the call's deadline).
    pub(crate) discovered: tokio::sync::watch::Sender<bool>,
    /// The discovery source's last error, for the UNAVAILABLE message.
    discovery_error: Mutex<Option<String>>,
}

impl Pool {
    pub(crate) fn new(policy: Arc<Policy>, strategy: Strategy) -> Pool {
        Pool {
            members: ArcSwap::from_pointee(Members::new(Vec::new())),
            draining: Mutex::new(Vec::new()),
            write: Mutex::new(()),
            policy,
            strategy,
            rr: AtomicUsize::new(0),
            replay: true,
            retry: None,
            budget: None,
            max_replay_body: crate::retry::DEFAULT_MAX_REPLAY_BODY,
            warm_new: std::sync::atomic::AtomicBool::new(false),
            discovery_wake: Arc::new(tokio::sync::Notify::new()),
            discovered: tokio::sync::watch::Sender::new(true),
            discovery_error: Mutex::new(None),
        }
    }

    fn publish(&self, next: Vec<Arc<Instance>>) {
        self.policy.members.store(next.len(), Ordering::Relaxed);
        self.members.store(Arc::new(Members::new(next)));
    }

    /// Adds an instance; false if one with the same URI is in the set already. An instance of
    /// that URI that is draining is taken back, with its connection.
    pub(crate) fn insert(&self, name: String, endpoint: Endpoint) -> bool {
        let _w = lock(&self.write);
        let cur = self.members.load_full();
        if cur.iter().any(|i| i.uri == *endpoint.uri()) {
            return false;
        }
        let revived = {
            let mut draining = self.draining_list();
            let pos = draining
                .iter()
                .position(|w| w.upgrade().is_some_and(|i| i.uri == *endpoint.uri()));
            pos.and_then(|p| draining.swap_remove(p).upgrade())
        };
        let inst = match revived {
            Some(inst) if inst.transition(State::Draining, State::Ready) => {
                tracing::info!(addr = %inst.display, "instance re-added while draining: reused");
                inst
            }
            _ => {
                tracing::info!(addr = %name, "instance added");
                let inst = Arc::new(Instance::new(name, endpoint, self.policy.clone()));
                if self.warm_new.load(Ordering::Relaxed) {
                    inst.warm_up();
                }
                if let Some(cfg) = &self.policy.health_check {
                    health::check::spawn(&inst, cfg.clone());
                }
                inst
            }
        };
        let mut next = Vec::with_capacity(cur.len() + 1);
        next.extend(cur.iter().cloned());
        next.push(inst);
        self.publish(next);
        true
    }

    /// Removes the instance with this URI: no new calls from now on; it finishes the calls it
    /// has, then its connection closes. False if there is none.
    pub(crate) fn remove(&self, uri: &http::Uri) -> bool {
        let _w = lock(&self.write);
        let cur = self.members.load_full();
        let Some(pos) = cur.iter().position(|i| i.uri == *uri) else {
            return false;
        };
        let mut next: Vec<Arc<Instance>> = cur.iter().cloned().collect();
        let gone = next.remove(pos);
        self.publish(next);
        health::forget_ejection(&gone);
        gone.set_state(State::Draining);
        tracing::info!(
            addr = %gone.display,
            in_flight = gone.in_flight.load(Ordering::Relaxed),
            "instance removed; draining"
        );
        self.draining_list().push(Arc::downgrade(&gone));
        true
    }

    /// Makes the set the given one: adds what is new, removes (drains) what is gone, leaves the
    /// rest and their connections alone. Returns (added, removed).
    pub(crate) fn sync(&self, want: Vec<(String, Endpoint)>) -> (usize, usize) {
        let cur = self.members.load_full();
        let mut removed = 0;
        for inst in cur.iter() {
            if !want.iter().any(|(_, e)| *e.uri() == inst.uri) && self.remove(&inst.uri) {
                removed += 1;
            }
        }
        let mut added = 0;
        for (name, endpoint) in want {
            if self.insert(name, endpoint) {
                added += 1;
            }
        }
        (added, removed)
    }

    /// Records the discovery source's state after a lookup.
    pub(crate) fn discovery_status(&self, error: Option<String>) {
        *lock(&self.discovery_error) = error;
        self.discovered.send_replace(true);
    }

    pub(crate) fn discovery_error(&self) -> Option<String> {
        lock(&self.discovery_error).clone()
    }

    /// The instances that are draining and still have calls in flight.
    pub(crate) fn draining(&self) -> Vec<Arc<Instance>> {
        self.draining_list()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The list of draining instances, without the ones whose last call has ended.
    fn draining_list(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Instance>>> {
        let mut draining = lock(&self.draining);
        draining.retain(|w| w.strong_count() > 0);
        draining
    }

    #[inline]
    pub(crate) fn snapshot(&self) -> arc_swap::Guard<Snapshot> {
        self.members.load()
    }
}
