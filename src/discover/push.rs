//! Discovery that pushes: a stream of [`Change`]s (tower's `Discover` shape, as service
//! registries with watches deliver them: Consul, Kubernetes EndpointSlices, etcd), each
//! `Insert` carrying the instance's own `Endpoint`.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Weak;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::transport::Endpoint;
use tower::discover::Change;
use tower::BoxError;

use crate::call::shared::Shared;
use crate::target::{Key, Target};

/// A change of membership as a pushed source yields it: tonic's own
/// [`Change`](crate::Change) (what `Channel::balance_channel`'s sender takes, so a tonic user's
/// code moves unchanged) or tower's [`tower::discover::Change`] (what tower's `Discover`
/// yields). Sealed: the channel knows these two.
pub trait IntoChange<K>: sealed::Sealed {
    /// The change, as the channel applies it.
    #[doc(hidden)]
    fn into_change(self) -> Change<K, Endpoint>;
}

mod sealed {
    pub trait Sealed {}
    impl<K> Sealed for tonic::transport::channel::Change<K, tonic::transport::Endpoint> {}
    impl<K> Sealed for tower::discover::Change<K, tonic::transport::Endpoint> {}
}

impl<K> IntoChange<K> for tonic::transport::channel::Change<K, Endpoint> {
    fn into_change(self) -> Change<K, Endpoint> {
        match self {
            tonic::transport::channel::Change::Insert(k, e) => Change::Insert(k, e),
            tonic::transport::channel::Change::Remove(k) => Change::Remove(k),
        }
    }
}

impl<K> IntoChange<K> for Change<K, Endpoint> {
    fn into_change(self) -> Change<K, Endpoint> {
        self
    }
}

/// The next change of a source, polled.
pub(crate) type PollChange<K> =
    Box<dyn FnMut(&mut Context<'_>) -> Poll<Option<Result<Change<K, Endpoint>, BoxError>>> + Send>;

/// Applies the changes of `next` to the set until the source ends or the channel is dropped.
/// Keys map to instances: an `Insert` of a key adds its endpoint (replacing an instance of the
/// same URI, so that new settings take effect) and drops the URI the key had before; a `Remove`
/// drains the key's instance (unless another key still names its URI). Until the first change,
/// calls wait for it, for at most `first_within`.
pub(crate) async fn run<K>(
    pool: Weak<Shared>,
    mut next: PollChange<K>,
    name: String,
    first_within: Duration,
) where
    K: Hash + Eq + Clone + Send + 'static,
{
    let mut keys: HashMap<K, Key> = HashMap::new();
    let first_by = crate::time::after(first_within);
    let mut waiting = pool
        .upgrade()
        .is_some_and(|p| !*p.set().discovered.borrow());
    loop {
        let item = if waiting {
            tokio::select! {
                item = std::future::poll_fn(&mut next) => item,
                _ = tokio::time::sleep_until(first_by) => {
                    waiting = false;
                    let Some(p) = pool.upgrade() else { return };
                    tracing::warn!(source = %name, "no instance announced in time");
                    p.set().discovery_status(Some(format!(
                        "{name}: no instance announced within {first_within:?}"
                    )));
                    continue;
                }
            }
        } else {
            std::future::poll_fn(&mut next).await
        };
        let Some(p) = pool.upgrade() else { return };
        match item {
            None => {
                tracing::warn!(source = %name, instances = p.snapshot().len(), "discovery stream ended; keeping the last set");
                p.set()
                    .discovery_status(Some(format!("{name}: the stream ended")));
                return;
            }
            Some(Err(e)) => {
                tracing::warn!(source = %name, error = %e, "discovery error; keeping the set");
                p.set().discovery_status(Some(format!("{name}: {e}")));
            }
            Some(Ok(Change::Insert(key, endpoint))) => {
                let target = match Target::endpoint(endpoint) {
                    Ok(target) => target,
                    Err(e) => {
                        tracing::warn!(source = %name, error = %e, "unusable endpoint ignored");
                        continue;
                    }
                };
                insert(p.set(), &mut keys, key, target);
                waiting = false;
                p.set().discovery_status(None);
            }
            Some(Ok(Change::Remove(key))) => {
                if let Some(uri) = keys.remove(&key) {
                    if !keys.values().any(|u| *u == uri) {
                        p.set().remove(&uri);
                    }
                }
            }
        }
    }
}

/// `key` names `target`: it joins the set, in the same change as the URI the key named before
/// leaves (unless another key still names it), so that no reader sees the set without either.
fn insert<K: Hash + Eq>(set: &crate::set::Set, keys: &mut HashMap<K, Key>, key: K, target: Target) {
    let old = keys
        .insert(key, target.key.clone())
        .filter(|old| *old != target.key && !keys.values().any(|u| u == old));
    if set.has(&target.key) {
        // Named again (a registry's resync: Kubernetes watchers and most registries announce
        // their whole set every few seconds): the instance keeps its state, ejection, history
        // and connections, as grpc-go keeps the subchannel of an address its resolver names
        // again. New settings for an address in the set come through
        // `BalancedChannel::insert`.
        if let Some(old) = old {
            set.remove(&old);
        }
    } else {
        set.insert_in_place_of(target, None, old.as_ref());
    }
}
