//! The set of instances: a snapshot that every call loads without a lock, replaced as a whole
//! by the rare writers (membership changes), and subsetting (`subset`), which chooses the
//! instances of the set among the members discovery names.

pub(crate) mod subset;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use arc_swap::ArcSwap;

use crate::instance::Context;
use crate::instance::{Instance, State};
use crate::sync::lock;
use crate::target::{Key, Target};

/// The instances of one moment, and the steps the pick may walk them with (the primes below
/// their number that do not divide it: each visits every instance once).
pub(crate) struct Members {
    list: Vec<Arc<Instance>>,
    pub(crate) strides: Vec<usize>,
}

impl Members {
    fn new(list: Vec<Arc<Instance>>) -> Members {
        let strides = strides_for(list.len());
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

/// An instance a membership change adds.
pub(crate) struct Joining {
    pub(crate) target: Target,
    /// A connection opened already, if any.
    pub(crate) connected: Option<tonic::transport::Channel>,
}

/// Whether a membership change takes back a draining instance of a URI it adds.
#[derive(Clone, Copy)]
pub(crate) enum Reuse {
    /// Yes, with its connection and settings (a discovery answer naming it again).
    Draining,
    /// No: a new instance with the settings given (an explicit insert).
    No,
}

/// The instances of one channel and its clones.
pub(crate) struct Set {
    /// The instances that get calls; readers `load()` it without a lock.
    pub(crate) members: ArcSwap<Members>,
    /// Removed instances that may still have calls in flight; they close when the last call
    /// ends (the calls hold the instance).
    draining: Mutex<Vec<Weak<Instance>>>,
    /// Serialises writers.
    write: Mutex<()>,
    pub(crate) ctx: Arc<Context>,
    /// Whether instances added from now on warm up (slow start); off for the initial set.
    pub(crate) warm_new: std::sync::atomic::AtomicBool,
    /// Wakes the discovery task early (an instance could not be reached).
    pub(crate) discovery_wake: Arc<tokio::sync::Notify>,
    /// With discovery: true once the source answered (or failed) the first time. Calls made
    /// before that wait for it (bounded by the lookup's own timeout and the call's deadline).
    pub(crate) discovered: tokio::sync::watch::Sender<bool>,
    /// The discovery source's last error, for the UNAVAILABLE message.
    discovery_error: Mutex<Option<String>>,
    /// Dropped with the set: discovery and the success-rate sweep end with it.
    closed: crate::shutdown::Closed,
    /// Subsetting, if on: the full member list, of which only the subset becomes instances.
    pub(crate) subset: Option<Box<subset::Subset>>,
}

impl Set {
    pub(crate) fn new(ctx: Arc<Context>) -> Set {
        Set {
            members: ArcSwap::from_pointee(Members::new(Vec::new())),
            draining: Mutex::new(Vec::new()),
            write: Mutex::new(()),
            ctx,
            warm_new: std::sync::atomic::AtomicBool::new(false),
            discovery_wake: Arc::new(tokio::sync::Notify::new()),
            discovered: tokio::sync::watch::Sender::new(true),
            discovery_error: Mutex::new(None),
            closed: crate::shutdown::Closed::new(),
            subset: None,
        }
    }

    /// Spawns a background task of the channel on its runtime; it ends when the channel (every
    /// clone of it) is dropped.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.closed.spawn(&self.ctx.runtime, task);
    }

    fn publish(&self, next: Vec<Arc<Instance>>) {
        self.ctx.live.set_members(next.len());
        self.members.store(Arc::new(Members::new(next)));
    }

    /// Adds an instance with these settings: an instance of the same URI in the set is
    /// replaced (it drains: its calls finish on its connection, with its old settings). True if
    /// the URI was not in the set, false if an instance was replaced.
    pub(crate) fn insert(&self, target: Target) -> bool {
        self.insert_with(target, None)
    }

    /// As [`insert`](Self::insert), with a connection to the instance opened already.
    pub(crate) fn insert_with(
        &self,
        target: Target,
        connected: Option<tonic::transport::Channel>,
    ) -> bool {
        self.insert_in_place_of(target, connected, None)
    }

    /// As [`insert`](Self::insert), removing the instance of `old` in the same change (a
    /// discovery key that named another URI): readers see the set with the old one or with the
    /// new one, never with neither. True if the new URI was not in the set.
    pub(crate) fn insert_in_place_of(
        &self,
        target: Target,
        connected: Option<tonic::transport::Channel>,
        old: Option<&Key>,
    ) -> bool {
        let old = old.filter(|o| **o != target.key);
        if let Some(subset) = &self.subset {
            return subset::insert(self, subset, target, connected, old);
        }
        let key = target.key.clone();
        let joining = Joining { target, connected };
        let mut had = false;
        self.change(
            vec![joining],
            |i| {
                let same = i.target.key == key;
                had |= same;
                same || old == Some(&i.target.key)
            },
            Reuse::No,
        );
        !had
    }

    /// Whether an instance of this URI is a member: in the set, or with subsetting in the full
    /// list the subset is chosen from.
    pub(crate) fn has(&self, key: &Key) -> bool {
        match &self.subset {
            Some(subset) => subset::has(subset, key),
            None => self.members.load().iter().any(|i| i.target.key == *key),
        }
    }

    /// Removes the instance with this URI: no new calls from now on; it finishes the calls it
    /// has, then its connection closes. False if there is none.
    pub(crate) fn remove(&self, key: &Key) -> bool {
        if let Some(subset) = &self.subset {
            return subset::remove(self, subset, key);
        }
        self.change(Vec::new(), |i| i.target.key == *key, Reuse::No)
            .1
            == 1
    }

    /// Makes the set the given one: adds what is new (taking back a draining instance of the
    /// URI, with its connection), removes (drains) what is gone, leaves the rest and their
    /// connections alone. Returns (added, removed).
    pub(crate) fn sync(&self, want: Vec<Target>) -> (usize, usize) {
        if let Some(subset) = &self.subset {
            return subset::sync(self, subset, want);
        }
        let keep: std::collections::HashSet<Key> = want.iter().map(|t| t.key.clone()).collect();
        let want = want
            .into_iter()
            .map(|target| Joining {
                target,
                connected: None,
            })
            .collect();
        self.change(want, |i| !keep.contains(&i.target.key), Reuse::Draining)
    }

    /// One membership change: the instances for which `gone` holds leave, the endpoints in
    /// `add` whose URI is not in the set join (a draining instance of that URI is taken back),
    /// and the result is published as one snapshot, so that a reader sees the set before the
    /// change or after it, never a set in between (such as an empty one during a swap).
    /// Returns (added, removed).
    pub(crate) fn change(
        &self,
        add: Vec<Joining>,
        mut gone: impl FnMut(&Instance) -> bool,
        reuse: Reuse,
    ) -> (usize, usize) {
        let _w = lock(&self.write);
        let cur = self.members.load_full();
        let mut next = Vec::with_capacity(cur.len() + add.len());
        let mut leaving = Vec::new();
        for inst in cur.iter() {
            if gone(inst) {
                leaving.push(inst.clone());
            } else {
                next.push(inst.clone());
            }
        }
        // Where the others' turns are: the instances that join start there (see
        // `TieBreak::join_at`).
        let level = crate::instance::level_in_service(next.iter());
        let mut added = 0;
        let mut revived = Vec::new();
        for joining in add {
            let key = &joining.target.key;
            if next.iter().any(|i| i.target.key == *key) {
                continue;
            }
            let inst = match reuse {
                Reuse::Draining => self.take_back(key),
                Reuse::No => None,
            };
            let inst = match inst {
                Some(inst) => {
                    revived.push(inst.clone());
                    inst
                }
                None => self.create(joining),
            };
            if let Some(level) = level {
                inst.tie.join_at(level);
            }
            next.push(inst);
            added += 1;
        }
        if added == 0 && leaving.is_empty() {
            return (0, 0);
        }
        // Back from draining, to the state it left (see `Events::taken_back`), before the set is
        // published (readers never see it draining in the set), judged against the set it
        // joins (the ejection cap counts the instances in it).
        for inst in &revived {
            self.ctx.events.taken_back(inst, next.len());
            tracing::info!(server.address = %inst.target.name, state = %inst.state(), "instance re-added while draining: reused");
        }
        self.publish(next);
        self.ctx.events.membership(added, leaving.len());
        for inst in &leaving {
            inst.drain();
            tracing::info!(
                server.address = %inst.target.name,
                in_flight = inst.in_flight(),
                "instance removed; draining"
            );
        }
        self.draining_list()
            .extend(leaving.iter().map(Arc::downgrade));
        (added, leaving.len())
    }

    /// The draining instance of this URI, taken off the draining list (with its connection and
    /// its background tasks), if there is one. It is still draining: the change that takes it
    /// back revives it once published.
    fn take_back(&self, key: &Key) -> Option<Arc<Instance>> {
        let mut draining = self.draining_list();
        // The latest to drain: an instance replaced by one with new settings drained before it.
        let pos = draining
            .iter()
            .rposition(|w| w.upgrade().is_some_and(|i| i.target.key == *key))?;
        let inst = draining.remove(pos).upgrade()?;
        (inst.state() == State::Draining).then_some(inst)
    }

    /// A new instance (the channel's events start its health checks, if they are on).
    fn create(&self, joining: Joining) -> Arc<Instance> {
        let Joining { target, connected } = joining;
        tracing::info!(server.address = %target.name, "instance added");
        let inst = Arc::new(Instance::new(target, self.ctx.clone(), connected));
        if self.warm_new.load(Ordering::Relaxed) {
            inst.warm_up();
        }
        self.ctx.events.joined(&inst);
        inst
    }

    /// Records the discovery source's state after a lookup.
    pub(crate) fn discovery_status(&self, error: Option<String>) {
        self.ctx.events.discovery_answer(error.as_deref());
        *lock(&self.discovery_error) = error;
        self.discovered.send_replace(true);
        self.ctx.events.connectivity();
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

/// The steps prime to `n` among the first primes: walking by one visits every index once.
pub fn strides_for(n: usize) -> Vec<usize> {
    const PRIMES: [usize; 16] = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53];
    PRIMES
        .iter()
        .copied()
        .filter(|&p| p < n && !n.is_multiple_of(p))
        .collect()
}
