//! One channel's way from its target's name to its instances: the Listener of the name, its
//! route configuration (inline or by RDS), the virtual host of the name, the route that takes
//! every call, its cluster, the cluster's endpoints; each step a watch on the shared ADS
//! client, followed again whenever one of them changes ([A27](https://github.com/grpc/proposal/blob/master/A27-xds-global-load-balancing.md)).
//!
//! What the channel does with the answer:
//! - the usable endpoints (HEALTHY or UNKNOWN) of the most preferred priority that has any
//!   become the set, in one swap (those that leave drain: no new call, their calls finish);
//! - a resource that does not exist, or a route the client cannot follow, empties the set
//!   and says why: calls fail UNAVAILABLE with that reason (as gRPC's channel fails them);
//! - while a resource is pending, or refused with a good version kept, nothing changes.

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::ads::{AdsClient, Resource, ResourceType, Watch, Watched};
use super::listener::{Action, Route, Routes};
use super::policy::ClusterPolicy;
use super::split::{Clusters, RouteTo};
use crate::call::shared::Shared;
use crate::call::split::PathMatch;
use crate::discover::Template;
use crate::target::Target;

/// Where the chain stands.
enum Resolution {
    /// A step is pending: nothing to change.
    Pending,
    /// The usable endpoints of each priority that has any, most preferred first, with their
    /// priority's number; and what lets calls in.
    Endpoints(Vec<(usize, Vec<(SocketAddr, f64)>)>, Box<Admit>),
    /// A step failed: the set empties, calls fail with this reason.
    Failed(String),
    /// The calls go by route (A28: routes by path, or weighted clusters): each cluster is a
    /// channel of its own (`split.rs`).
    Routes(Vec<RouteTo>),
}

/// What a channel follows: a listener (an `xds:///name` target), or one cluster (the channel
/// of one cluster of a split).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Root {
    Listener(String),
    Cluster(String),
}

/// What the cluster and its endpoints say of letting calls in: the cluster's name and
/// `max_requests`, the assignment's drops (category, per million).
struct Admit {
    cluster: String,
    max_requests: u32,
    drops: Vec<(String, u32)>,
    /// The cluster's policy and outlier detection (see `policy.rs`).
    strategy: Option<crate::pick::Strategy>,
    wrr: Option<super::cluster::ClusterWrr>,
    outlier: Option<Box<super::cluster::Outlier>>,
}

/// The watches a channel holds beyond its Listener: each one replaced when the step before
/// it names another resource.
#[derive(Default)]
struct Chain {
    route: Option<Watch>,
    cluster: Option<Watch>,
    endpoints: Option<Watch>,
    /// The routes passed over, as last said in the log.
    passed_over: usize,
}

/// Keeps the set in line with what the control plane says of `root` (the listener `name`, or
/// one of its clusters), until the channel is dropped (its task ends with it, and its watches
/// unsubscribe). `clusters` builds the channels of a split.
pub(crate) async fn run(
    pool: Weak<Shared>,
    client: Arc<AdsClient>,
    (name, root): (String, Root),
    template: Template,
    first_within: Duration,
    policy: ClusterPolicy,
    clusters: Clusters,
) {
    let mut f = Follower {
        listener: match &root {
            Root::Listener(l) => Some(client.watch(ResourceType::Listener, l)),
            Root::Cluster(_) => None,
        },
        name,
        root,
        template,
        policy,
        clusters,
        chain: Chain::default(),
        answered: false,
        silent: false,
        priorities: Vec::new(),
        applied: None,
    };
    let first_by = crate::time::after(first_within);
    let Some(wake) = pool.upgrade().map(|p| p.set().discovery_wake.clone()) else {
        return;
    };
    loop {
        let outcome = f.follow(&client);
        let Some(p) = pool.upgrade() else { return };
        let failed_over = f.take(&p, outcome);
        drop(p);
        tokio::select! {
            _ = changed(&mut f.listener) => {}
            // A cluster of the split changed its connectivity.
            _ = f.clusters.moved() => {
                if let Some(p) = pool.upgrade() {
                    f.clusters.follow(&p);
                }
            }
            _ = changed(&mut f.chain.route) => {}
            _ = changed(&mut f.chain.cluster) => {}
            _ = changed(&mut f.chain.endpoints) => {}
            // An instance could not be reached: a priority may have none left.
            _ = wake.notified() => {}
            // Failed over: look again whether a preferred priority is back.
            _ = tokio::time::sleep(FAILBACK_CHECK), if failed_over => {}
            _ = tokio::time::sleep_until(first_by), if !f.answered => {
                f.answered = true;
                f.silent = true;
                let Some(p) = pool.upgrade() else { return };
                no_answer(&p, &client, &f.name, first_within);
            }
            // Still no answer, and the stream failed (again): the status says why now (a
            // handshake may fail only after the wait for the first answer is over).
            _ = client.stream_ended(), if f.silent => {
                let Some(p) = pool.upgrade() else { return };
                no_answer(&p, &client, &f.name, first_within);
            }
        }
    }
}

/// One channel's side of the chain: what it watches, and what it made of the last answers.
struct Follower {
    name: String,
    root: Root,
    template: Template,
    policy: ClusterPolicy,
    clusters: Clusters,
    listener: Option<Watch>,
    chain: Chain,
    /// Whether the chain has come to an outcome (or the wait for the first one is over).
    answered: bool,
    /// Whether the wait for the first outcome ended without one: calls are told why, and told
    /// again each time the stream fails, until an outcome comes.
    silent: bool,
    /// The usable endpoints of each priority that has any, as last resolved.
    priorities: Vec<(usize, Vec<(SocketAddr, f64)>)>,
    /// The endpoints the set was last given.
    applied: Option<Vec<(SocketAddr, f64)>>,
}

impl Follower {
    /// Where the chain stands now.
    fn follow(&mut self, client: &AdsClient) -> Resolution {
        match (&mut self.listener, &self.root) {
            (Some(l), _) => follow(client, &self.name, l, &mut self.chain),
            (None, Root::Cluster(c)) => {
                follow_cluster(client, c, &mut self.chain).unwrap_or_else(|outcome| outcome)
            }
            (None, Root::Listener(_)) => unreachable!("a listener is watched"),
        }
    }

    /// Applies `outcome` to the channel `p`; whether it failed over to a less preferred
    /// priority.
    fn take(&mut self, p: &Shared, outcome: Resolution) -> bool {
        if !matches!(outcome, Resolution::Routes(_) | Resolution::Pending) {
            self.clusters.clear(p);
        }
        if !matches!(outcome, Resolution::Pending) {
            self.silent = false;
        }
        match outcome {
            Resolution::Pending => {}
            Resolution::Routes(routes) => {
                self.answered = true;
                self.priorities.clear();
                self.applied = None;
                self.clusters.apply(p, &self.name, &routes);
            }
            Resolution::Endpoints(by_priority, admit) => {
                self.answered = true;
                self.priorities = by_priority;
                if let Some(a) = &p.admission {
                    a.set(&admit.cluster, &admit.drops, admit.max_requests);
                }
                self.policy.apply(
                    p,
                    &self.name,
                    &admit.cluster,
                    (admit.strategy, admit.wrr),
                    admit.outlier.as_deref(),
                );
            }
            Resolution::Failed(why) => {
                self.answered = true;
                self.priorities.clear();
                self.applied = None;
                tracing::warn!(target = %self.name, reason = %why, "xDS: no instances");
                // The reason first: a call that finds the set empty names it.
                p.set()
                    .discovery_status(Some(format!("xds:///{}: {why}", self.name)));
                p.set().sync(Vec::new());
            }
        }
        if !self.answered || (self.applied.is_none() && self.priorities.is_empty()) {
            return false;
        }
        let (top, endpoints) = in_use(p, &self.priorities);
        if self.applied.as_ref() != Some(&endpoints) {
            apply(p, &self.name, &self.template, &endpoints, top);
            self.applied = Some(endpoints);
        }
        top > 0
    }
}

/// The control plane has not answered within `first_within`: calls that find the set empty
/// say so, and why its stream is down if it is.
fn no_answer(p: &Shared, client: &AdsClient, name: &str, first_within: Duration) {
    let state = match (client.connected(), client.last_error()) {
        (true, _) => "connected".to_owned(),
        (false, Some(why)) => format!("not connected: {why}"),
        (false, None) => "not connected".to_owned(),
    };
    p.set().discovery_status(Some(format!(
        "xds:///{name}: no answer from the control plane within {first_within:?} \
         (its stream: {state})"
    )));
}

/// How often a channel that failed over to a less preferred priority looks whether a
/// preferred one can be reached again.
const FAILBACK_CHECK: Duration = Duration::from_secs(1);

/// The endpoints the set should have, and the least preferred priority among them: every
/// priority down to the first that has an instance not known to be unreachable (A27's
/// priority policy: a priority whose endpoints all fail to connect hands over to the next,
/// and takes the calls back once one of them connects). The unreachable ones stay in the set,
/// out of the pick, reconnecting in the background, so that their return is seen.
fn in_use(
    p: &Shared,
    priorities: &[(usize, Vec<(SocketAddr, f64)>)],
) -> (usize, Vec<(SocketAddr, f64)>) {
    let snap = p.snapshot();
    let unreachable = |addr: &SocketAddr| {
        let uri = crate::discover::uri_of("http", *addr);
        snap.iter()
            .any(|i| *i.target.name == *uri && i.state() == crate::instance::State::Failing)
    };
    let mut out = Vec::new();
    let mut top = 0;
    for (priority, endpoints) in priorities {
        out.extend(endpoints.iter().copied());
        top = *priority;
        if !endpoints.iter().all(|(a, _)| unreachable(a)) {
            break;
        }
    }
    (top, out)
}

/// Resolves when the watch's resource changes; never when there is no watch (or its client
/// is gone).
async fn changed(watch: &mut Option<Watch>) {
    if let Some(w) = watch {
        if w.rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// The watch of `name` in `slot`, replacing a watch of another name.
fn watch_of<'a>(
    client: &AdsClient,
    slot: &'a mut Option<Watch>,
    kind: ResourceType,
    name: &str,
) -> &'a mut Watch {
    if slot.as_ref().is_none_or(|w| w.name != name) {
        *slot = Some(client.watch(kind, name));
    }
    slot.as_mut().expect("set above")
}

/// The state of a watched resource: the resource, or the outcome that stops the chain.
fn current(w: &mut Watch, what: &str) -> Result<Arc<Resource>, Resolution> {
    match &*w.rx.borrow_and_update() {
        Watched::Pending => Err(Resolution::Pending),
        Watched::Found(r) => Ok(r.clone()),
        Watched::Missing => Err(Resolution::Failed(format!(
            "{what} {:?} does not exist",
            w.name
        ))),
        Watched::Invalid(why) => Err(Resolution::Failed(format!(
            "{what} {:?} is invalid: {why}",
            w.name
        ))),
    }
}

/// Follows the chain from the Listener to the endpoints.
fn follow(client: &AdsClient, name: &str, listener: &mut Watch, chain: &mut Chain) -> Resolution {
    match follow_steps(client, name, listener, chain) {
        Ok(outcome) | Err(outcome) => outcome,
    }
}

fn follow_steps(
    client: &AdsClient,
    name: &str,
    listener: &mut Watch,
    chain: &mut Chain,
) -> Result<Resolution, Resolution> {
    let l = current(listener, "listener")?;
    let Resource::Listener(l) = &*l else {
        unreachable!("a listener watch")
    };
    let routes = match &l.routes {
        Routes::Inline(rc) => {
            chain.route = None;
            Arc::new(Resource::Route(rc.clone()))
        }
        Routes::Rds(route_name) => current(
            watch_of(client, &mut chain.route, ResourceType::Route, route_name),
            "route configuration",
        )?,
    };
    let Resource::Route(rc) = &*routes else {
        unreachable!("a route watch")
    };
    let host = rc
        .host_for(name)
        .ok_or_else(|| Resolution::Failed(format!("no virtual host matches {name:?}")))?;
    // Routes that ask for more than the path (headers, a runtime fraction, a regex) are
    // passed over: this client does not match on those.
    let usable: Vec<&Route> = host
        .routes
        .iter()
        .filter(|r| !r.unsupported_match)
        .collect();
    let passed_over = host.routes.len() - usable.len();
    if passed_over != chain.passed_over {
        chain.passed_over = passed_over;
        if passed_over > 0 {
            tracing::warn!(target = %name, routes = passed_over, "xDS: routes that match on headers, a runtime fraction, a regex or query parameters are passed over (this client matches on the path alone)");
        }
    }
    let Some(first) = usable.first() else {
        return Err(Resolution::Failed(format!(
            "no route of {name:?} matches on the path alone"
        )));
    };
    if !first.takes_every_call() {
        // Routes by path, up to the first that takes every call (those after it take none).
        let mut table = Vec::new();
        for r in usable {
            table.push(route_to(r));
            if r.takes_every_call() {
                break;
            }
        }
        chain.cluster = None;
        chain.endpoints = None;
        return Ok(Resolution::Routes(table));
    }
    let every_call = route_to(first);
    let cluster_name = match &every_call.to {
        Ok(ways) if ways.len() == 1 => ways[0].0.clone(),
        Ok(_) => {
            // Weighted clusters: the calls split among the clusters' own channels.
            chain.cluster = None;
            chain.endpoints = None;
            return Ok(Resolution::Routes(vec![every_call]));
        }
        Err(why) => return Err(Resolution::Failed(why.clone())),
    };
    follow_cluster(client, &cluster_name, chain)
}

/// A route as the channel follows it (see [`RouteTo`]).
fn route_to(r: &Route) -> RouteTo {
    let paths = (!r.takes_every_call()).then(|| PathMatch {
        path: if r.case_sensitive {
            r.path.as_str().into()
        } else {
            r.path.to_ascii_lowercase().into()
        },
        exact: r.exact,
        case_sensitive: r.case_sensitive,
    });
    let to = match &r.action {
        Action::Cluster(c) => Ok(vec![(c.clone(), 1)]),
        Action::Weighted(list) => {
            let weighted: Vec<(String, u32)> =
                list.iter().filter(|(_, w)| *w > 0).cloned().collect();
            if weighted.is_empty() {
                Err("the route's weighted clusters all weigh 0".to_owned())
            } else {
                Ok(weighted)
            }
        }
        Action::Unsupported(what) => Err(format!("the route's action ({what}) is not supported")),
    };
    RouteTo { paths, to }
}

/// Follows the chain from the cluster `cluster_name` to its endpoints.
fn follow_cluster(
    client: &AdsClient,
    cluster_name: &str,
    chain: &mut Chain,
) -> Result<Resolution, Resolution> {
    let cluster = current(
        watch_of(
            client,
            &mut chain.cluster,
            ResourceType::Cluster,
            cluster_name,
        ),
        "cluster",
    )?;
    let Resource::Cluster(cluster) = &*cluster else {
        unreachable!("a cluster watch")
    };
    let eds = current(
        watch_of(
            client,
            &mut chain.endpoints,
            ResourceType::Endpoints,
            &cluster.eds_name,
        ),
        "endpoints",
    )?;
    let Resource::Endpoints(eds) = &*eds else {
        unreachable!("an endpoints watch")
    };
    let admit = Admit {
        cluster: cluster_name.to_owned(),
        max_requests: cluster.max_requests,
        drops: eds.drops.clone(),
        strategy: cluster.strategy,
        wrr: cluster.wrr,
        outlier: cluster.outlier.clone(),
    };
    Ok(Resolution::Endpoints(
        eds.usable_by_priority(),
        Box::new(admit),
    ))
}

/// The set becomes these endpoints, in one swap.
fn apply(
    p: &Shared,
    name: &str,
    template: &Template,
    endpoints: &[(SocketAddr, f64)],
    priority: usize,
) {
    let mut want: Vec<Target> = Vec::with_capacity(endpoints.len());
    for (addr, _share) in endpoints {
        match crate::discover::address_target("http", None, template, *addr) {
            Ok(t) => want.push(t),
            Err(e) => {
                tracing::warn!(target = %name, server.address = %addr, error = %e, "unusable address")
            }
        }
    }
    if endpoints.is_empty() {
        // The reason first: a call that finds the set empty names it.
        p.set()
            .discovery_status(Some(format!("xds:///{name}: no usable endpoint")));
    }
    let (added, removed) = p.set().sync(want);
    // Each instance's share against the heaviest's: it wins that share of the ties.
    let heaviest = endpoints.iter().map(|(_, w)| *w).fold(0.0, f64::max);
    if heaviest > 0.0 {
        for inst in p.snapshot().iter() {
            if let Some((_, w)) = endpoints
                .iter()
                .find(|(a, _)| crate::discover::uri_of("http", *a) == *inst.target.name)
            {
                inst.set_weight(w / heaviest);
            }
        }
    }
    tracing::info!(target = %name, priority, added, removed, instances = endpoints.len(), "xDS changed the set");
    if !endpoints.is_empty() {
        p.set().discovery_status(None);
    }
}
