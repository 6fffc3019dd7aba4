//! What every call of one channel (and of its clones) shares: the pick, and the call path's
//! own settings (transparent retry, the retry and hedging policies by method, their budget).

use std::sync::Arc;

use crate::instance::Context;
use crate::pick::Picker;
use crate::retry::{Budget, MethodPolicies};
use crate::set::{Set, Snapshot};

/// What every call of one channel shares.
pub(crate) struct Shared {
    /// The set, and the strategy that picks from it.
    pub(crate) picker: Picker,
    /// What the instances share (the clock, the runtime, their settings and counters).
    pub(crate) ctx: Arc<Context>,
    /// Transparent retry on (see `Builder::transparent_retry`).
    pub(crate) replay: bool,
    /// The budget of retries and hedges, if either is on.
    pub(crate) budget: Option<Budget>,
    /// What applies to each method: its retry or hedging policy, its default deadline.
    pub(crate) methods: MethodPolicies,
    /// Cap on the request body kept for another attempt.
    pub(crate) max_replay_body: usize,
    /// The channel's totals and metrics' labels.
    pub(crate) totals: Arc<crate::observe::Totals>,
    /// What the discovery says of letting calls in (an xDS channel's drops and
    /// `max_requests`); `None`: every call goes.
    pub(crate) admission: Option<super::admission::Admission>,
    /// Where the calls go while an xDS route splits them among clusters (xDS channels only).
    pub(crate) split: Option<super::split::Split<Shared>>,
    /// Notified when an instance may have become usable: one came into service, or a
    /// membership change was published (wait-for-ready calls wait on it, see `call::ready`).
    pub(crate) usable: Arc<tokio::sync::Notify>,
}

impl Shared {
    pub(crate) fn new(
        set: Set,
        strategy: crate::Strategy,
        totals: Arc<crate::observe::Totals>,
    ) -> Shared {
        Shared {
            ctx: set.ctx.clone(),
            picker: Picker::new(set, strategy),
            replay: true,
            budget: None,
            methods: MethodPolicies::default(),
            max_replay_body: crate::retry::DEFAULT_MAX_REPLAY_BODY,
            totals,
            admission: None,
            split: None,
            usable: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The set of instances.
    #[inline]
    pub(crate) fn set(&self) -> &Set {
        &self.picker.set
    }

    /// The set as it is now.
    #[inline]
    pub(crate) fn snapshot(&self) -> arc_swap::Guard<Snapshot> {
        self.picker.set.snapshot()
    }

    /// Spawns a background task of the channel; it ends when the channel (every clone of it)
    /// is dropped.
    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.picker.set.spawn(task);
    }
}

/// Every clone of the channel is gone (and every call they made, which hold it too): its
/// connectivity state's watchers see SHUTDOWN.
impl Drop for Shared {
    fn drop(&mut self) {
        self.totals.connectivity.shut_down();
    }
}

impl AsRef<Picker> for Shared {
    fn as_ref(&self) -> &Picker {
        &self.picker
    }
}

impl AsRef<Set> for Shared {
    fn as_ref(&self) -> &Set {
        &self.picker.set
    }
}
