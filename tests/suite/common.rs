//! What the suite's modules share because the process has one of it, and the layer that
//! records the crate's log events for the modules that check them.

use std::panic::PanicHookInfo;
use std::sync::{Mutex, Once, OnceLock, PoisonError};

use tracing::subscriber::NoSubscriber;
use tracing::Dispatch;

type Listener = Box<dyn Fn(&PanicHookInfo<'_>) + Send + Sync>;

/// Who hears of each panic.
static LISTENERS: Mutex<Vec<Listener>> = Mutex::new(Vec::new());

/// Calls `listener` on every panic of the process from now on (any thread, any task, any
/// test's), before the default hook prints it.
///
/// The process has one panic hook: two tests that each took it and set their own in its place
/// could, running in parallel, both take the default and lose the other's. So the suite's hook
/// is set once, here, and tells every listener.
pub fn on_panic(listener: impl Fn(&PanicHookInfo<'_>) + Send + Sync + 'static) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            for listener in LISTENERS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
            {
                listener(info);
            }
            previous(info);
        }));
    });
    LISTENERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(Box::new(listener));
}

/// Call before each `tracing::subscriber::set_default`: a subscriber set for one thread then
/// sees every callsite it wants, whichever thread hit it first.
///
/// tracing keeps each callsite's interest for the whole process, worked out when the callsite
/// is first hit by asking every subscriber alive; but while a single subscriber was ever made,
/// it asks the default of the thread that hit it instead. A test's subscriber for its own
/// thread, the process's only one, lost every callsite that another test's thread (no
/// subscriber: interested in nothing) hit first while it was alive: the spans and events the
/// test waits for never came. Two silent subscribers alive for the whole process keep tracing
/// asking every subscriber alive; a callsite some test's subscriber wants is then checked at
/// each hit against the hitting thread's own subscriber.
pub fn subscribers_per_thread() {
    static SILENT: OnceLock<[Dispatch; 2]> = OnceLock::new();
    SILENT.get_or_init(|| [(); 2].map(|()| Dispatch::new(NoSubscriber::new())));
}

/// The crate's log events, for the tests that check them (those of optional parts).
#[cfg(any(feature = "orca", feature = "health-check", feature = "xds-tls"))]
pub use events::Events;

#[cfg(any(feature = "orca", feature = "health-check", feature = "xds-tls"))]
mod events {
    use std::sync::Mutex;

    use fleet_service::fields::{Collect, Fields};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    use super::subscribers_per_thread;

    /// A subscriber layer that keeps the fields of every event of the crate.
    #[derive(Clone, Default)]
    pub struct Events(std::sync::Arc<Mutex<Vec<(tracing::Level, Fields)>>>);

    impl<S: tracing::Subscriber> Layer<S> for Events {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Fields::new();
            event.record(&mut Collect(&mut fields));
            let level = *event.metadata().level();
            self.0.lock().unwrap().push((level, fields));
        }
    }

    impl Events {
        /// Installs the layer for this thread (a current-thread runtime: the channel's tasks run
        /// here).
        pub fn install(&self) -> tracing::subscriber::DefaultGuard {
            subscribers_per_thread();
            let subscriber = tracing_subscriber::registry().with(self.clone().with_filter(
                tracing_subscriber::filter::filter_fn(|m| m.target().starts_with("tonic_balancer")),
            ));
            tracing::subscriber::set_default(subscriber)
        }

        /// The events whose message contains `text`.
        pub fn with(&self, text: &str) -> Vec<(tracing::Level, Fields)> {
            let events = self.0.lock().unwrap();
            events
                .iter()
                .filter(|(_, f)| f.get("message").is_some_and(|m| m.contains(text)))
                .cloned()
                .collect()
        }
    }
}
