//! The channel's [`Events`]: what it does when an instance or the set changes, wiring the
//! parts that watch them (health, health checks, load reports, metrics, the totals) to the
//! layers below, which know nothing of them.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use crate::call::shared::Shared;
use crate::health::Health;
#[cfg(feature = "health-check")]
use crate::health::HealthCheck;
use crate::instance::events::{Events, Outcome};
use crate::instance::{Instance, State};

/// The events of one channel.
pub(crate) struct Hooks {
    /// The channel (set once it is built).
    pub(crate) shared: OnceLock<Weak<Shared>>,
    /// Active health checks of every new instance, if on.
    #[cfg(feature = "health-check")]
    pub(crate) health_check: Option<HealthCheck>,
    /// Out-of-band load reports asked of every new instance at this interval, if on.
    pub(crate) oob: Option<Duration>,
    /// Outlier ejection, and the totals and metrics health counts in.
    pub(crate) health: Health,
}

impl Hooks {
    fn shared(&self) -> Option<Arc<Shared>> {
        self.shared.get().and_then(Weak::upgrade)
    }
}

impl Events for Hooks {
    #[inline]
    fn outcome(&self, inst: &Arc<Instance>, outcome: Outcome) {
        crate::health::record(&self.health, inst, outcome);
    }

    fn connected(&self, inst: &Instance) {
        crate::metrics::connection_succeeded(&self.health.totals.metrics, inst);
    }

    fn disconnected(&self, inst: &Instance, error: &(dyn std::error::Error + 'static)) {
        crate::metrics::disconnected(&self.health.totals.metrics, inst, error);
    }

    fn connect_failed(&self, inst: &Arc<Instance>, error: &dyn std::error::Error) {
        crate::health::connect_failed(&self.health, inst, error);
    }

    fn dropped(&self, inst: &Instance) {
        crate::observe::retired(&self.health.totals, inst);
    }

    /// Its passes start where the rest of the set's turns are (see `TieBreak::join_at`); calls that
    /// wait for a usable instance look again.
    fn back_in_service(&self, inst: &Instance) {
        let Some(shared) = self.shared() else { return };
        let snap = shared.snapshot();
        let others = snap.iter().filter(|i| !std::ptr::eq(Arc::as_ptr(i), inst));
        if let Some(level) = crate::instance::level_in_service(others) {
            inst.tie.join_at(level);
        }
        shared.usable.notify_waiters();
    }

    fn joined(&self, inst: &Arc<Instance>) {
        if inst.state() == State::Ready {
            crate::metrics::connection_succeeded(&self.health.totals.metrics, inst);
        }
        #[cfg(feature = "health-check")]
        if let Some(cfg) = &self.health_check {
            crate::health::check::spawn(inst, cfg.clone());
        }
        if let Some(every) = self.oob {
            crate::orca::oob::spawn(inst, every);
        }
    }

    fn taken_back(&self, inst: &Arc<Instance>, members: usize) {
        crate::health::revive(&self.health, inst, members);
    }

    /// Called once the change is published: calls that wait for a usable instance look again.
    fn membership(&self, added: usize, removed: usize) {
        crate::observe::membership(&self.health.totals, added, removed);
        if let Some(shared) = self.shared() {
            shared.usable.notify_waiters();
            shared.totals.connectivity.update(shared.set());
        }
    }

    fn discovery_answer(&self, error: Option<&str>) {
        crate::observe::discovery_answer(&self.health.totals, error);
    }

    fn connectivity(&self) {
        if let Some(shared) = self.shared() {
            shared.totals.connectivity.update(shared.set());
        }
    }
}
