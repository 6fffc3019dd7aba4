//! gRFC A28's routes and weighted clusters: an xDS route table that sends each call, by its
//! path, to a cluster, or splits the calls of a route among clusters by weight. Each cluster is
//! a channel of its own (its endpoints, priorities, policy, outlier detection, drops and
//! `max_requests`, as its resources say), built and kept by the xDS channel's discovery
//! (`xds::split`); each call takes the first route whose path matches, draws its cluster at
//! random with the route's weights, and goes through that cluster's channel whole: its retries
//! and hedges stay in the cluster, as a gRPC call's do (its cluster is chosen once).
//!
//! Sources: [gRFC A28](https://github.com/grpc/proposal/blob/master/A28-xds-traffic-splitting-and-routing.md).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;

/// Where an xDS channel's calls go while its routes send them to clusters (none: to its own
/// set): the channels `C` of its clusters (what every call of a channel shares).
pub(crate) struct Split<C> {
    /// Whether a table is on: read first, so that a channel without one pays a relaxed load.
    on: AtomicBool,
    table: ArcSwapOption<Vec<Route<C>>>,
}

impl<C> Default for Split<C> {
    fn default() -> Split<C> {
        Split {
            on: AtomicBool::new(false),
            table: ArcSwapOption::empty(),
        }
    }
}

/// Which paths a route takes (A28's `prefix` or `path`, with `case_sensitive`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathMatch {
    /// The prefix, or with `exact` the whole path; lower-case if the match ignores case.
    pub(crate) path: Box<str>,
    pub(crate) exact: bool,
    pub(crate) case_sensitive: bool,
}

impl PathMatch {
    /// Whether the call of `path` matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let want = &*self.path;
        match (self.exact, self.case_sensitive) {
            (true, true) => path == want,
            (true, false) => path.eq_ignore_ascii_case(want),
            (false, true) => path.starts_with(want),
            (false, false) => path
                .get(..want.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(want)),
        }
    }
}

/// One route of the table: the paths it takes (`None`: every call), and where its calls go:
/// its clusters' channels after the cumulative weight up to each, or why none can take them.
pub(crate) struct Route<C> {
    pub(crate) paths: Option<PathMatch>,
    pub(crate) to: Result<Ways<C>, String>,
}

/// The clusters of a route, each one's channel after the cumulative weight up to it.
pub(crate) struct Ways<C> {
    total: u64,
    ways: Vec<(u64, Arc<C>)>,
}

impl<C> Ways<C> {
    /// Each of these channels with the chance of its weight among the weights; those of weight
    /// 0 get none; no positive weight: `None`.
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn of(ways: Vec<(u32, Arc<C>)>) -> Option<Ways<C>> {
        let mut total = 0u64;
        let ways: Vec<(u64, Arc<C>)> = ways
            .into_iter()
            .filter(|(w, _)| *w > 0)
            .map(|(w, ch)| {
                total += u64::from(w);
                (total, ch)
            })
            .collect();
        (!ways.is_empty()).then_some(Ways { total, ways })
    }

    fn draw(&self) -> Arc<C> {
        let mut rng = crate::rng::Rng::thread();
        let at = ((u128::from(rng.next_u64()) * u128::from(self.total)) >> 64) as u64;
        rng.store();
        let i = self.ways.partition_point(|(up_to, _)| *up_to <= at);
        self.ways[i.min(self.ways.len() - 1)].1.clone()
    }
}

/// Where one call goes.
pub(crate) enum Draw<C> {
    /// To the channel's own set (no route table).
    Own,
    /// Through this cluster's channel.
    To(Arc<C>),
    /// Nowhere: no route matches it, or its route cannot be followed (why).
    Refused(String),
}

impl<C> Split<C> {
    /// From now on, each call takes the first of these routes that matches it. None: no table.
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn set(&self, routes: Vec<Route<C>>) {
        if routes.is_empty() {
            self.clear();
            return;
        }
        self.table.store(Some(Arc::new(routes)));
        self.on.store(true, Ordering::Release);
    }

    /// No table: the calls go to the channel's own set.
    pub(crate) fn clear(&self) {
        self.on.store(false, Ordering::Release);
        self.table.store(None);
    }

    /// Where the call of `path` goes.
    #[inline]
    pub(crate) fn draw(&self, path: &str) -> Draw<C> {
        if !self.on.load(Ordering::Acquire) {
            return Draw::Own;
        }
        self.draw_slow(path)
    }

    #[cold]
    fn draw_slow(&self, path: &str) -> Draw<C> {
        let table = self.table.load();
        let Some(routes) = table.as_ref() else {
            return Draw::Own;
        };
        let route = routes
            .iter()
            .find(|r| r.paths.as_ref().is_none_or(|m| m.matches(path)));
        match route.map(|r| &r.to) {
            Some(Ok(ways)) => Draw::To(ways.draw()),
            Some(Err(why)) => Draw::Refused(why.clone()),
            None => Draw::Refused(format!("no route matches the call's path {path:?}")),
        }
    }

    /// The channels of the table now, each once (none without one).
    #[cfg_attr(not(feature = "xds"), allow(dead_code))]
    pub(crate) fn channels(&self) -> Vec<Arc<C>> {
        let mut out: Vec<Arc<C>> = Vec::new();
        if let Some(routes) = self.table.load().as_ref() {
            for way in routes.iter().filter_map(|r| r.to.as_ref().ok()) {
                for (_, ch) in &way.ways {
                    if !out.iter().any(|c| Arc::ptr_eq(c, ch)) {
                        out.push(ch.clone());
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: &str, exact: bool, case_sensitive: bool) -> PathMatch {
        PathMatch {
            path: path.into(),
            exact,
            case_sensitive,
        }
    }

    /// A28's path matches: a prefix, a whole path, each with or without case.
    #[test]
    fn paths_match_as_a28_says() {
        assert!(m("/pkg.Svc/", false, true).matches("/pkg.Svc/Get"));
        assert!(!m("/pkg.Svc/", false, true).matches("/pkg.svc/Get"));
        assert!(m("/pkg.svc/", false, false).matches("/PKG.Svc/Get"));
        assert!(!m("/pkg.Svc/Get/", false, false).matches("/pkg.Svc/Get"));
        assert!(m("/pkg.Svc/Get", true, true).matches("/pkg.Svc/Get"));
        assert!(!m("/pkg.Svc/Get", true, true).matches("/pkg.Svc/GetAll"));
        assert!(m("/pkg.svc/get", true, false).matches("/Pkg.Svc/Get"));
        assert!(m("", false, true).matches("/anything"));
    }

    /// The first matching route takes the call; weights 0 take none; a path no route matches
    /// is refused, naming it; a route that cannot be followed refuses its calls, saying why.
    #[test]
    fn the_first_matching_route_takes_the_call() {
        let (a, b) = (Arc::new("a"), Arc::new("b"));
        let split: Split<&str> = Split::default();
        assert!(matches!(split.draw("/x"), Draw::Own));
        split.set(vec![
            Route {
                paths: Some(m("/pkg.A/", false, true)),
                to: Ok(Ways::of(vec![(1, a.clone()), (0, b.clone())]).unwrap()),
            },
            Route {
                paths: Some(m("/pkg.R/", false, true)),
                to: Err("the route's action (redirect) is not supported".into()),
            },
            Route {
                paths: Some(m("/pkg.", false, true)),
                to: Ok(Ways::of(vec![(1, b.clone())]).unwrap()),
            },
        ]);
        for _ in 0..100 {
            assert!(matches!(split.draw("/pkg.A/Get"), Draw::To(c) if *c == "a"));
            assert!(matches!(split.draw("/pkg.B/Get"), Draw::To(c) if *c == "b"));
        }
        assert!(matches!(split.draw("/pkg.R/Get"), Draw::Refused(why) if why.contains("redirect")));
        assert!(
            matches!(split.draw("/other.C/Get"), Draw::Refused(why) if why.contains("/other.C/Get"))
        );
        assert_eq!(split.channels().len(), 2);
        assert!(Ways::<&str>::of(vec![(0, a)]).is_none());
        split.clear();
        assert!(matches!(split.draw("/pkg.A/Get"), Draw::Own));
    }
}
