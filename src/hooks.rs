//! The channel's [`Events`]: what it does when an instance or the set changes, wiring the
//! parts that watch them (health, health checks, load reports, metrics, the totals) to the
//! layers below, which know nothing of them.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use crate::call::shared::Shared;
#[cfg(feature = "health-check")]
use crate::health::HealthCheck;
use crate::instance::events::Events;
use crate::instance::{Instance, State};

/// The events of one channel.
#[derive(Default)]
pub(crate) struct Hooks {
    /// The channel (set once it is built).
    pub(crate) shared: OnceLock<Weak<Shared>>,
    /// Active health checks of every new instance, if on.
    #[cfg(feature = "health-check")]
    pub(crate) health_check: Option<HealthCheck>,
    /// Out-of-band load reports asked of every new instance at this interval, if on.
    pub(crate) oob: Option<Duration>,
}

impl Hooks {
    fn shared(&self) -> Option<Arc<Shared>> {
        self.shared.get().and_then(Weak::upgrade)
    }
}

impl Events for Hooks {
    /// Its passes start where the rest of the set's turns are (see `Tie::join_at`).
    fn back_in_service(&self, inst: &Instance) {
        let Some(shared) = self.shared() else { return };
        let snap = shared.snapshot();
        let others = snap.iter().filter(|i| !std::ptr::eq(Arc::as_ptr(i), inst));
        if let Some(level) = crate::instance::level_in_service(others) {
            inst.tie.join_at(level);
        }
    }

    fn joined(&self, inst: &Arc<Instance>) {
        if inst.state() == State::Ready {
            crate::metrics::connection_succeeded(inst);
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
        crate::health::revive(inst, members);
    }

    fn membership(&self, added: usize, removed: usize) {
        if let Some(shared) = self.shared() {
            crate::observe::membership(&shared.ctx.observe, added, removed);
        }
    }

    fn discovery_answer(&self, error: Option<&str>) {
        if let Some(shared) = self.shared() {
            crate::observe::discovery_answer(&shared.ctx.observe, error);
        }
    }
}
