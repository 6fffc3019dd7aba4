//! What the instances and the set tell the parts that watch them.
//!
//! The layers below the call path (an instance, the set) know nothing of what observes them:
//! health, outlier ejection, load reports, metrics, tracing and the totals attach from above,
//! through this one trait, which the channel's builder implements by wiring them together
//! (`crate::hooks`).

use std::sync::Arc;

use super::Instance;

/// The events of the instances and the set of one channel.
pub(crate) trait Events: Send + Sync + 'static {
    /// `inst` is back in service (reconnected, readmitted after an ejection, healthy again).
    fn back_in_service(&self, inst: &Instance);

    /// `inst` is new in the set (not one taken back).
    fn joined(&self, inst: &Arc<Instance>);

    /// `inst`, draining, was taken back into a set of `members` instances (a discovery answer
    /// named it again); it is still draining, and returns to service as its state when it was
    /// removed says. Called before the set that holds it is published.
    fn taken_back(&self, inst: &Arc<Instance>, members: usize);

    /// A membership change added and removed these many instances.
    fn membership(&self, added: usize, removed: usize);

    /// The discovery source answered (`error`: with a failure).
    fn discovery_answer(&self, error: Option<&str>);
}
