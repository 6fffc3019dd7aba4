//! A28's weighted clusters on one xDS channel: a channel of its own for each cluster of the
//! route's split (built with the channel's settings, following that cluster's resources as a
//! channel follows its listener's), and the split published for the calls to draw from
//! (`call::split`). The clusters' channels are kept by name while the split changes, so a
//! change of weights keeps their connections, and one that leaves the split is dropped once
//! its calls end. The channel's connectivity is the clusters' together.
//!
//! Sources: [gRFC A28](https://github.com/grpc/proposal/blob/master/A28-xds-traffic-splitting-and-routing.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::call::shared::Shared;
use crate::error::Error;

/// Builds the channel of one cluster (with the xDS channel's settings).
pub(crate) type MakeCluster = Arc<dyn Fn(&str) -> Result<Arc<Shared>, Error> + Send + Sync>;

/// The clusters' channels of an xDS channel's split.
pub(crate) struct Clusters {
    make: MakeCluster,
    channels: BTreeMap<String, Arc<Shared>>,
    /// Notified when a cluster's connectivity changes.
    moved: Arc<Notify>,
}

impl Clusters {
    pub(crate) fn new(make: MakeCluster) -> Clusters {
        Clusters {
            make,
            channels: BTreeMap::new(),
            moved: Arc::new(Notify::new()),
        }
    }

    /// The route splits the calls of `p` (the channel of `target`) among `split` (cluster,
    /// weight): each cluster's channel (built if new), the split published. The channel's own
    /// set empties: its instances drain.
    pub(crate) fn apply(&mut self, p: &Shared, target: &str, split: &[(String, u32)]) {
        self.channels
            .retain(|name, _| split.iter().any(|(c, _)| c == name));
        let mut ways = Vec::with_capacity(split.len());
        for (name, weight) in split {
            let channel = match self.channels.get(name) {
                Some(c) => c.clone(),
                None => match (self.make)(name) {
                    Ok(c) => {
                        self.watch(&c);
                        self.channels.insert(name.clone(), c.clone());
                        c
                    }
                    Err(e) => {
                        tracing::warn!(target, cluster = %name, error = %e, "xDS: the cluster's channel cannot be built; the split leaves it out");
                        continue;
                    }
                },
            };
            ways.push((*weight, channel));
        }
        tracing::info!(target, clusters = ?split, "xDS: the route splits the calls among clusters");
        // The split first: a call that waits for the channel's discovery, woken by the
        // emptied set, finds it.
        if let Some(s) = &p.split {
            s.set(ways);
        }
        p.set().discovery_status(None);
        p.set().sync(Vec::new());
        self.follow(p);
    }

    /// No split (the route names one cluster, or nothing can be routed): the calls go to the
    /// channel's own set; the clusters' channels go once their calls end.
    pub(crate) fn clear(&mut self, p: &Shared) {
        if self.channels.is_empty() {
            return;
        }
        if let Some(s) = &p.split {
            s.clear();
        }
        self.channels.clear();
        p.totals.connectivity.own(p.set());
    }

    /// Resolves when a cluster's connectivity changes (never without a split).
    pub(crate) async fn moved(&self) {
        if self.channels.is_empty() {
            std::future::pending::<()>().await;
        }
        self.moved.notified().await
    }

    /// The channel's connectivity from its clusters' (the best of theirs, as its own is the
    /// best of its instances').
    pub(crate) fn follow(&self, p: &Shared) {
        p.totals
            .connectivity
            .follow(self.channels.values().map(|c| c.totals.connectivity.get()));
    }

    /// Wakes [`moved`](Self::moved) at each change of `channel`'s connectivity, until it is
    /// dropped (its watch then ends).
    fn watch(&self, channel: &Shared) {
        let mut rx = channel.totals.connectivity.watch();
        let moved = self.moved.clone();
        channel.spawn(async move {
            while rx.changed().await.is_ok() {
                moved.notify_one();
            }
        });
    }
}
