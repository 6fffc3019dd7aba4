//! Background tasks that end with what they serve.
//!
//! The channel's background tasks (reconnect probes, readmission timers, health checks,
//! discovery, the success-rate sweep) hold only a weak reference to their instance or channel, so
//! that they never keep it alive; each is spawned under its owner's [`Closed`] signal, and ends
//! the moment the owner is dropped instead of sleeping on until its timer fires.

use std::future::Future;

/// Fires when it is dropped, with the value that owns it.
#[derive(Debug)]
pub(crate) struct Closed(tokio::sync::watch::Sender<()>);

impl Closed {
    pub(crate) fn new() -> Closed {
        Closed(tokio::sync::watch::Sender::new(()))
    }

    /// Spawns `task` on `runtime`; it is dropped (ends) when this signal's owner is dropped.
    pub(crate) fn spawn(
        &self,
        runtime: &tokio::runtime::Handle,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn_boxed(runtime, Box::pin(task));
    }

    /// The one place that spawns: every background task goes through one instantiation of
    /// tokio's task machinery (about 130 functions), not one per kind of task, which is what
    /// this crate's users would otherwise compile eight times over. A task is spawned when an
    /// instance or a channel changes, never per call, so the box costs nothing that matters.
    fn spawn_boxed(
        &self,
        runtime: &tokio::runtime::Handle,
        task: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    ) {
        let mut rx = self.0.subscribe();
        runtime.spawn(async move {
            tokio::select! {
                // Nothing is ever sent: this ends when the sender is dropped.
                _ = async { while rx.changed().await.is_ok() {} } => {}
                _ = task => {}
            }
        });
    }
}
