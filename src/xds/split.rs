//! A28's routes and weighted clusters on one xDS channel: a channel of its own for each
//! cluster the routes name (built with the channel's settings, following that cluster's
//! resources as a channel follows its listener's), and the route table published for the
//! calls to draw from (`call::split`). The clusters' channels are kept by name while the
//! routes change, so a change of weights keeps their connections, and one that no route names
//! any more is dropped once its calls end. The channel's connectivity is the clusters'
//! together.
//!
//! Sources: [gRFC A28](https://github.com/grpc/proposal/blob/master/A28-xds-traffic-splitting-and-routing.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::call::shared::Shared;
use crate::call::split::{PathMatch, Route, Ways};
use crate::error::Error;

/// One route as the channel follows it: the paths it takes (`None`: every call), and its
/// clusters with their weights, or why its calls cannot be sent.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RouteTo {
    pub(crate) paths: Option<PathMatch>,
    pub(crate) to: Result<Vec<(String, u32)>, String>,
}

/// Builds the channel of one cluster (with the xDS channel's settings).
pub(crate) type MakeCluster = Arc<dyn Fn(&str) -> Result<Arc<Shared>, Error> + Send + Sync>;

/// The clusters' channels of an xDS channel's split.
pub(crate) struct Clusters {
    make: MakeCluster,
    channels: BTreeMap<String, Arc<Shared>>,
    /// The routes of the table published (`None`: no table).
    published: Option<Vec<RouteTo>>,
    /// Notified when a cluster's connectivity changes.
    moved: Arc<Notify>,
}

impl Clusters {
    pub(crate) fn new(make: MakeCluster) -> Clusters {
        Clusters {
            make,
            channels: BTreeMap::new(),
            published: None,
            moved: Arc::new(Notify::new()),
        }
    }

    /// The calls of `p` (the channel of `target`) go by `routes`: each cluster's channel
    /// (built if new), the table published. The channel's own set empties: its instances
    /// drain.
    pub(crate) fn apply(&mut self, p: &Shared, target: &str, routes: &[RouteTo]) {
        if self.published.as_deref() == Some(routes) {
            return;
        }
        let named = |name: &String| {
            routes
                .iter()
                .filter_map(|r| r.to.as_ref().ok())
                .any(|ways| ways.iter().any(|(c, _)| c == name))
        };
        self.channels.retain(|name, _| named(name));
        let mut table = Vec::with_capacity(routes.len());
        for r in routes {
            let to = match &r.to {
                Ok(ways) => {
                    let ways: Vec<(u32, Arc<Shared>)> = ways
                        .iter()
                        .filter_map(|(name, weight)| Some((*weight, self.channel(target, name)?)))
                        .collect();
                    Ways::of(ways).ok_or_else(|| {
                        "none of the route's clusters has a channel (see the log)".to_owned()
                    })
                }
                Err(why) => Err(why.clone()),
            };
            table.push(Route {
                paths: r.paths.clone(),
                to,
            });
        }
        tracing::info!(target, routes = ?routes, "xDS: the calls go by route to the clusters' channels");
        // The table first: a call that waits for the channel's discovery, woken by the
        // emptied set, finds it.
        if let Some(s) = &p.split {
            s.set(table);
        }
        self.published = Some(routes.to_vec());
        p.set().discovery_status(None);
        p.set().sync(Vec::new());
        self.follow(p);
    }

    /// The channel of cluster `name`, built if new (`None`, logged, if it cannot be).
    fn channel(&mut self, target: &str, name: &str) -> Option<Arc<Shared>> {
        if let Some(c) = self.channels.get(name) {
            return Some(c.clone());
        }
        match (self.make)(name) {
            Ok(c) => {
                self.watch(&c);
                self.channels.insert(name.to_owned(), c.clone());
                Some(c)
            }
            Err(e) => {
                tracing::warn!(target, cluster = %name, error = %e, "xDS: the cluster's channel cannot be built; its routes leave it out");
                None
            }
        }
    }

    /// No split (the route names one cluster, or nothing can be routed): the calls go to the
    /// channel's own set; the clusters' channels go once their calls end.
    pub(crate) fn clear(&mut self, p: &Shared) {
        if self.published.take().is_none() {
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
