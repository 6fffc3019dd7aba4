//! What the discovery says of letting calls in at all: an xDS endpoint assignment's
//! `drop_overloads` (a share of the calls dropped, by category) and its cluster's circuit
//! breaker, `max_requests` (the most calls in flight). A call that either refuses fails at
//! once with UNAVAILABLE ([`Error::Dropped`](crate::Error::Dropped)), unsent and not retried,
//! as gRPC's `xds_cluster_impl` policy drops it.
//!
//! Checked when a call is routed; the attempts in flight (each attempt of a call counts, from
//! its pick to its end, as each of gRPC's picks does) are counted in the instances' context
//! (`Context::attempts`). A retry or a hedge of a call already let in is not refused (gRPC's
//! picks refuse them too): the retry budget bounds them.
//!
//! Sources:
//! [gRFC A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md),
//! [gRFC A32](https://github.com/grpc/proposal/blob/master/A32-xds-circuit-breaking.md),
//! grpc-go's [`clusterimpl` picker](https://github.com/grpc/grpc-go/blob/master/xds/internal/balancer/clusterimpl/picker.go).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::error::{status, Error};

/// A32's default when a cluster sets no `max_requests`.
pub(crate) const DEFAULT_MAX_REQUESTS: u32 = 1024;

/// What lets a channel's calls in, as its discovery last said.
#[derive(Debug)]
pub(crate) struct Admission {
    /// (category, calls dropped per million), in the assignment's order.
    drops: ArcSwap<Vec<(Arc<str>, u32)>>,
    /// The most attempts in flight.
    max_requests: AtomicU32,
    /// The cluster's name, for the refusal's message.
    cluster: ArcSwap<String>,
}

impl Default for Admission {
    fn default() -> Admission {
        Admission {
            drops: ArcSwap::from_pointee(Vec::new()),
            max_requests: AtomicU32::new(DEFAULT_MAX_REQUESTS),
            cluster: ArcSwap::from_pointee(String::new()),
        }
    }
}

impl Admission {
    /// From now on: `drops` (category, per million), at most `max_requests` attempts in flight
    /// to `cluster`.
    #[cfg(any(feature = "xds", test))]
    pub(crate) fn set(&self, cluster: &str, drops: &[(String, u32)], max_requests: u32) {
        let drops: Vec<(Arc<str>, u32)> = drops
            .iter()
            .filter(|(_, per_million)| *per_million > 0)
            .map(|(c, p)| (Arc::from(c.as_str()), *p))
            .collect();
        if **self.drops.load() != drops {
            self.drops.store(Arc::new(drops));
        }
        self.max_requests.store(max_requests, Ordering::Relaxed);
        if **self.cluster.load() != cluster {
            self.cluster.store(Arc::new(cluster.to_owned()));
        }
    }

    /// Whether a new call may go, with `in_flight` attempts in flight now: each drop category
    /// draws in turn (the first that draws drops it), then the cap.
    pub(crate) fn admit(&self, in_flight: u32) -> Result<(), tonic::Status> {
        let drops = self.drops.load();
        if !drops.is_empty() {
            let mut rng = crate::rng::Rng::thread();
            let dropped = drops
                .iter()
                .find(|(_, per_million)| rng.below(1_000_000) < *per_million as usize);
            rng.store();
            if let Some((category, _)) = dropped {
                return Err(status(Error::Dropped {
                    reason: format!(
                        "dropped by the control plane's drop_overloads (category {category:?})"
                    ),
                }));
            }
        }
        let max = self.max_requests.load(Ordering::Relaxed);
        if in_flight >= max {
            return Err(status(Error::Dropped {
                reason: format!(
                    "max_requests ({max}) of cluster {:?} reached: {in_flight} calls in flight",
                    self.cluster.load()
                ),
            }));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A category drops its share of the calls, drawn per call; none drops none; the cap
    /// refuses a call at `max_requests` in flight and lets one in below it.
    #[test]
    fn drops_its_share_and_caps_the_calls_in_flight() {
        let a = Admission::default();
        assert!(a.admit(0).is_ok());
        assert!(a.admit(DEFAULT_MAX_REQUESTS - 1).is_ok());
        assert!(a.admit(DEFAULT_MAX_REQUESTS).is_err());
        a.set("c", &[("lb".to_owned(), 250_000)], 4);
        let dropped = (0..10_000).filter(|_| a.admit(0).is_err()).count();
        // Binomial(10,000, 0.25): sd 43; six of them either way.
        assert!(
            (2_240..=2_760).contains(&dropped),
            "{dropped} of 10,000 dropped"
        );
        a.set("c", &[], 4);
        assert!((0..1_000).all(|_| a.admit(3).is_ok()));
        let refused = a.admit(4).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(
            refused.message().contains("max_requests (4)"),
            "{refused:?}"
        );
        a.set("c", &[("all".to_owned(), 1_000_000)], 4);
        assert!(a.admit(0).unwrap_err().message().contains("\"all\""));
    }
}
