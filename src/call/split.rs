//! gRFC A28's weighted clusters: an xDS route that splits the calls among clusters by weight.
//! Each cluster is a channel of its own (its endpoints, priorities, policy, outlier detection,
//! drops and `max_requests`, as its resources say), built and kept by the xDS channel's
//! discovery (`xds::resolve`); each call draws its cluster at random with the clusters'
//! weights, and goes through that cluster's channel whole: its retries and hedges stay in
//! the cluster, as a gRPC call's do (its cluster is chosen once, by the route).
//!
//! Sources: [gRFC A28](https://github.com/grpc/proposal/blob/master/A28-xds-traffic-splitting-and-routing.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

/// Where an xDS channel's calls go while its route splits them (none: to its own set): the
/// channels `C` of its clusters (what every call of a channel shares).
pub(crate) struct Split<C> {
    /// Whether a split is on: read first, so that a channel without one pays a relaxed load.
    on: AtomicBool,
    ways: ArcSwapOption<Ways<C>>,
}

impl<C> Default for Split<C> {
    fn default() -> Split<C> {
        Split {
            on: AtomicBool::new(false),
            ways: ArcSwapOption::empty(),
        }
    }
}

/// The clusters of a split: each one's channel after the cumulative weight up to it.
struct Ways<C> {
    total: u64,
    ways: Vec<(u64, Arc<C>)>,
}

impl<C> Split<C> {
    /// From now on, each call goes to one of these channels with the chance of its weight
    /// among the weights; those of weight 0 get none. No positive weight: no split.
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn set(&self, ways: Vec<(u32, Arc<C>)>) {
        let mut total = 0u64;
        let ways: Vec<(u64, Arc<C>)> = ways
            .into_iter()
            .filter(|(w, _)| *w > 0)
            .map(|(w, ch)| {
                total += u64::from(w);
                (total, ch)
            })
            .collect();
        if ways.is_empty() {
            self.clear();
            return;
        }
        self.ways.store(Some(Arc::new(Ways { total, ways })));
        self.on.store(true, Ordering::Release);
    }

    /// No split: the calls go to the channel's own set.
    pub(crate) fn clear(&self) {
        self.on.store(false, Ordering::Release);
        self.ways.store(None);
    }

    /// The channel this call goes to, if a split is on.
    #[inline]
    pub(crate) fn draw(&self) -> Option<Arc<C>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.draw_slow()
    }

    #[cold]
    fn draw_slow(&self) -> Option<Arc<C>> {
        let ways = self.ways.load();
        let ways = ways.as_ref()?;
        let mut rng = crate::rng::Rng::thread();
        let at = ((u128::from(rng.next_u64()) * u128::from(ways.total)) >> 64) as u64;
        rng.store();
        let i = ways.ways.partition_point(|(up_to, _)| *up_to <= at);
        ways.ways.get(i).map(|(_, ch)| ch.clone())
    }

    /// The channels of the split now (none without one).
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn channels(&self) -> Vec<Arc<C>> {
        self.ways
            .load()
            .as_ref()
            .map(|w| w.ways.iter().map(|(_, ch)| ch.clone()).collect())
            .unwrap_or_default()
    }
}
