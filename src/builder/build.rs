//! The checks of the settings, and the wiring of the parts: the instances' shared context,
//! the set, the call path's shared state, the observers and the background tasks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Endpoint;

use super::{Builder, DiscoverySource, PushTask, DEFAULT_CONNECT_TIMEOUT};
use crate::call::shared::Shared;
use crate::error::Error;
#[cfg(feature = "health-check")]
use crate::health::HealthCheck;
use crate::hooks::Hooks;
use crate::instance::Context;
use crate::load::reported::ReportSettings;
use crate::load::ChannelLoad;
use crate::retry::RetryPolicy;
use crate::set::Set;
use crate::target::Key;
use crate::BalancedChannel;

/// A source the channel asks for the membership: the source, the scheme of the instances'
/// URIs, the name it resolves (see [`crate::discover::Discovery`]).
type DnsOrCustom = (
    Arc<dyn crate::discover::Resolve>,
    &'static str,
    Option<String>,
);

/// The builder's instances join the set (a subset of them, with subsetting), each with its
/// connection if one is open already; those that come later are warmed up as they join.
fn add_instances(
    set: &Set,
    endpoints: Vec<crate::target::Target>,
    mut connected: std::collections::HashMap<Key, tonic::transport::Channel>,
) {
    if let Some(subset) = &set.subset {
        crate::set::subset::extend(set, subset, endpoints, connected);
    } else {
        for target in endpoints {
            let channel = connected.remove(&target.key);
            set.insert_with(target, channel);
        }
    }
    set.warm_new
        .store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The largest [`Builder::max_replay_body`].
const MAX_REPLAY_BODY_CAP: usize = 16 * 1024 * 1024;

impl Builder {
    /// Checks the settings and builds the channel. Must be called within a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::NoInstances`] for an empty set, [`Error::InvalidUri`] and
    /// [`Error::DuplicateUri`] naming the address, [`Error::InvalidSetting`] naming the
    /// setting, [`Error::NoRuntime`] outside a tokio runtime.
    pub fn build(self) -> Result<BalancedChannel, Error> {
        self.build_with(std::collections::HashMap::new())
    }

    /// Builds the channel, with connections opened already to some of its instances: the
    /// settings checked, the shared parts made, the instances added, the tasks started.
    pub(super) fn build_with(
        mut self,
        connected: std::collections::HashMap<Key, tonic::transport::Channel>,
    ) -> Result<BalancedChannel, Error> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.cap_durations();
        self.check()?;
        #[cfg(feature = "metrics")]
        let metrics = (self.metrics.clone(), self.default_target());
        let retry_budget = crate::retry::shared_budget(&self.retry)?;
        let hedging = crate::retry::HedgingPolicies::new(self.hedging.clone(), retry_budget)?;
        let methods = crate::retry::MethodPolicies::new(
            &self.retry,
            &self.hedging,
            hedging.as_ref(),
            &self.method_configs,
        )?;
        let subset = crate::set::subset::Aperture::new(self.subset, self.subset_client)?;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::NoRuntime);
        };
        let totals = Arc::new(crate::observe::Totals::default());
        let health = crate::health::Health::new(self.ejection.clone(), totals.clone());
        let (discovery, push) = self.discovery_sources(&health)?;
        let hooks = Arc::new(Hooks {
            shared: std::sync::OnceLock::new(),
            #[cfg(feature = "health-check")]
            health_check: self.health_check.take(),
            oob: self.load_reports_oob,
            health: health.clone(),
        });
        let policy = Arc::new(self.context(runtime, hooks.clone()));
        let mut set = Set::new(policy.clone());
        set.subset = subset.map(|s| Box::new(crate::set::subset::Subset::new(s)));
        let mut pool = Shared::new(set, self.strategy, totals.clone());
        pool.replay = self.transparent_retry;
        pool.budget = methods.budget(
            retry_budget.or_else(|| Some(hedging.as_ref()?.budget())),
            self.throttling,
        );
        pool.methods = methods;
        pool.max_replay_body = self.max_replay_body;
        if self.xds_target() {
            pool.admission = Some(Default::default());
            pool.split = Some(Default::default());
        }
        let pool = Arc::new(pool);
        let _ = hooks.shared.set(Arc::downgrade(&pool));
        #[cfg(feature = "metrics")]
        crate::metrics::configure(&totals.metrics, metrics.0, metrics.1);
        let set = pool.set();
        add_instances(set, std::mem::take(&mut self.endpoints), connected);
        tracing::info!(instances = pool.snapshot().len(), strategy = ?self.strategy, "balanced channel built");
        if let Some(source) = discovery {
            let _ = policy.discovery_wake.set(set.discovery_wake.clone());
            self.start_discovery(&pool, source);
        }
        if let Some(task) = push {
            // A source that pushes may want to know when an instance cannot be reached (xDS:
            // a priority with none left hands over to the next).
            let _ = policy.discovery_wake.set(set.discovery_wake.clone());
            totals.set_source(self.push_source_name());
            if pool.snapshot().is_empty() {
                set.discovered.send_replace(false);
            }
            pool.spawn(task(Arc::downgrade(&pool), self.discovery_timeout));
        }
        self.start_tasks(&pool, health);
        // Its instances are in, and a source to wait for is known: IDLE, CONNECTING (discovery
        // is to answer) or READY (`Builder::connect`'s connections).
        pool.totals.connectivity.update(pool.set());
        Ok(BalancedChannel { shared: pool })
    }

    /// The tasks every channel runs as its settings say: the interval rules of outlier
    /// ejection, the metrics' observers, weighted round robin's weights.
    fn start_tasks(&self, pool: &Arc<Shared>, health: crate::health::Health) {
        // A control plane may turn the rules on or change their interval, and the strategy.
        let xds = self.xds_target();
        if self.ejection.interval.is_some() || xds {
            pool.spawn(interval_rules_task(Arc::downgrade(pool), health));
        }
        // The metrics first: weighted round robin's first schedule update is recorded.
        crate::metrics::spawn(pool, &pool.totals.metrics);
        if self.strategy.keeps_weights() || xds {
            pool.spawn(crate::pick::wrr::task(Arc::downgrade(pool)));
        }
        let pinned = !crate::metrics::unmatched_methods(&pool.totals.metrics).is_empty();
        if !pool.methods.unmatched().0.is_empty() || pinned {
            pool.spawn(unmatched_names_task(Arc::downgrade(pool)));
        }
    }

    /// Where the membership comes from, if not only from the builder's list: a source the
    /// channel asks (DNS, a [`Resolve`](crate::discover::Resolve)), or a stream of changes
    /// pushed to it (taken from the builder: a stream cannot be cloned).
    #[cfg_attr(not(feature = "xds"), allow(unused_variables))]
    fn discovery_sources(
        &self,
        health: &crate::health::Health,
    ) -> Result<(Option<DnsOrCustom>, Option<PushTask>), Error> {
        Ok(match self.discovery.clone() {
            None => (None, None),
            Some(DiscoverySource::Push(task)) => {
                let task = crate::sync::lock(&task)
                    .take()
                    .ok_or(Error::InvalidSetting {
                        name: "discover",
                        reason: "the stream was taken by an earlier build() of this builder".into(),
                    })?;
                (None, Some(task))
            }
            Some(DiscoverySource::Custom(r)) => (Some((r, "http", None)), None),
            #[cfg(feature = "xds")]
            Some(DiscoverySource::Xds { target }) => (None, Some(self.xds_task(&target, health)?)),
            Some(DiscoverySource::Dns {
                target,
                #[cfg(feature = "hickory-dns")]
                settings,
            }) => {
                let source = crate::discover::dns_source(
                    &target,
                    #[cfg(feature = "hickory-dns")]
                    settings,
                )?;
                (Some(source), None)
            }
        })
    }

    /// The task that follows an xDS target: its name checked, the bootstrap read (from the
    /// environment unless given), the process's ADS client of that control plane shared.
    #[cfg(feature = "xds")]
    fn xds_task(&self, target: &str, health: &crate::health::Health) -> Result<PushTask, Error> {
        let name = crate::xds::target_name(target)?;
        let bootstrap = match &self.xds_bootstrap {
            Some(b) => b.clone(),
            None => crate::xds::Bootstrap::from_env()?,
        };
        bootstrap.connect_uri()?;
        let template = self.template.clone().unwrap_or_else(|| {
            Arc::new(|uri: http::Uri| Endpoint::from(uri).connect_timeout(DEFAULT_CONNECT_TIMEOUT))
        });
        let policy = crate::xds::policy::ClusterPolicy::new(
            self.strategy,
            self.strategy_by,
            self.ejection.clone(),
            self.ejection_set,
            self.load_reports_oob.is_some(),
            health.clone(),
        );
        let root = match &self.xds_cluster {
            Some(cluster) => crate::xds::resolve::Root::Cluster(cluster.clone()),
            None => crate::xds::resolve::Root::Listener(name.clone()),
        };
        // The channel of each cluster of a split: these settings, following that cluster.
        let mut each = self.clone();
        each.xds_bootstrap = Some(bootstrap.clone());
        let clusters = crate::xds::split::Clusters::new(Arc::new(move |cluster: &str| {
            let mut b = each.clone();
            b.xds_cluster = Some(cluster.to_owned());
            b.build().map(|channel| channel.shared)
        }));
        Ok(Box::new(move |pool, first_within| {
            let client = crate::xds::ads::client(&bootstrap);
            Box::pin(crate::xds::resolve::run(
                pool,
                client,
                (name, root),
                template,
                first_within,
                policy,
                clusters,
            ))
        }))
    }

    /// The instances' shared context, from the settings.
    fn context(&self, runtime: tokio::runtime::Handle, hooks: Arc<Hooks>) -> Context {
        let epoch = Instant::now();
        let reports = ReportSettings::new(self.load_report_max_age, self.wrr);
        Context {
            epoch,
            runtime,
            live: Default::default(),
            load: ChannelLoad::new(
                epoch,
                self.latency_expiry,
                self.latency_decay,
                self.strategy.gate_rule(),
                reports,
            ),
            ordinary_codes: self.ejection.ordinary,
            slow_start_ns: self.slow_start.map_or(0, |d| d.as_nanos() as u64),
            probes: self.probes,
            attempts: self
                .xds_target()
                .then(|| std::sync::atomic::AtomicU32::new(0)),
            backoff: self.backoff.clone(),
            discovery_wake: std::sync::OnceLock::new(),
            conns: self.conns,
            events: hooks,
        }
    }

    /// Starts asking `source` for the membership, every [`Builder::discovery_interval`].
    fn start_discovery(&self, pool: &Arc<Shared>, (source, scheme, authority): DnsOrCustom) {
        let set = pool.set();
        if pool.snapshot().is_empty() {
            set.discovered.send_replace(false);
        }
        let template = self.template.clone().unwrap_or_else(|| {
            Arc::new(|uri: http::Uri| Endpoint::from(uri).connect_timeout(DEFAULT_CONNECT_TIMEOUT))
        });
        tracing::info!(source = %source.name(), "discovery on");
        pool.totals.set_source(source.name());
        crate::discover::spawn(
            pool,
            crate::discover::Discovery {
                source,
                interval: self.discovery_interval,
                timeout: self.discovery_timeout,
                scheme,
                authority,
                template,
            },
        );
    }

    /// The checks of the instances and of every setting, each settings type checking itself;
    /// the few settings that are one number each are checked here.
    fn check(&self) -> Result<(), Error> {
        use crate::checks::Checks;
        if self.endpoints.is_empty() && self.discovery.is_none() {
            return Err(Error::NoInstances);
        }
        #[cfg(feature = "xds")]
        if self.xds_bootstrap.is_some()
            && !matches!(self.discovery, Some(DiscoverySource::Xds { .. }))
        {
            return Err(Error::InvalidSetting {
                name: "xds_bootstrap",
                reason: "a bootstrap is for an xDS target: set one with `xds(\"xds:///name\")`"
                    .into(),
            });
        }
        for (i, target) in self.endpoints.iter().enumerate() {
            if self.endpoints[..i].iter().any(|t| t.key == target.key) {
                return Err(Error::DuplicateUri {
                    uri: target.name.to_string(),
                });
            }
        }
        self.backoff.validate()?;
        #[cfg(feature = "metrics")]
        self.metrics.validate()?;
        self.ejection.validate()?;
        for r in &self.retry {
            r.validate()?;
        }
        #[cfg(feature = "health-check")]
        if let Some(h) = &self.health_check {
            h.validate()?;
        }
        self.conns.validate()?;
        self.wrr.validate()?;
        if let Some(p) = &self.probes {
            p.validate()?;
        }
        Checks::of("max_replay_body").that(
            self.max_replay_body <= MAX_REPLAY_BODY_CAP,
            format_args!("{} bytes is above the 16 MiB cap", self.max_replay_body),
        )?;
        Checks::of("latency_expiry").above_zero(self.latency_expiry)?;
        if let Some(every) = self.load_reports_oob {
            Checks::of("load_reports_out_of_band").above_zero(every)?;
        }
        if let Some(window) = self.slow_start {
            Checks::of("slow_start").above_zero(window)?;
        }
        Checks::of("discovery_interval").above_zero(self.discovery_interval)?;
        Checks::of("discovery_timeout").above_zero(self.discovery_timeout)?;
        self.check_effect()
    }

    /// Settings that would have no effect in this set-up are refused, naming why: a user who
    /// set one expects it to do something. (`subset_client` without `subset` is refused with
    /// subsetting's own checks.)
    fn check_effect(&self) -> Result<(), Error> {
        use crate::checks::Checks;
        let polled = matches!(
            self.discovery,
            Some(DiscoverySource::Dns { .. } | DiscoverySource::Custom(_))
        );
        // A source that answers with the whole set (DNS, a resolver, xDS) would replace the
        // instances given one by one at its first answer; a stream of changes adds to them.
        let whole_set = polled || self.xds_target();
        if whole_set && !self.endpoints.is_empty() {
            return Err(crate::Error::InvalidSetting {
                name: self.discovery_by.unwrap_or("discovery"),
                reason: format!(
                    "its answers are the whole set, and would replace the {} instance(s) given with \
                     `uri`/`endpoint` ({}): give those to the source, or add instances with \
                     `discover` (a stream of changes, which adds to the list)",
                    self.endpoints.len(),
                    self.endpoints[0].name
                ),
            });
        }
        Checks::of("discovery_interval").that(
            polled || !self.interval_set,
            "has no effect here: it sets how often `dns` or `resolver` discovery asks again, and \
             neither is set",
        )?;
        Checks::of("endpoint_template").that(
            polled || self.template.is_none(),
            "has no effect here: it makes the endpoints of instances found by `dns` or \
             `resolver`, and neither is \
             set (give instances' settings on their own `Endpoint`)",
        )
    }

    /// Whether the membership comes from an xDS control plane.
    fn xds_target(&self) -> bool {
        #[cfg(feature = "xds")]
        return matches!(self.discovery, Some(DiscoverySource::Xds { .. }));
        #[cfg(not(feature = "xds"))]
        false
    }

    /// Every duration setting at most 30 years: any duration is accepted (`Duration::MAX` for
    /// "never"), and a longer one means the same as 30 years, so that no timer overflows.
    fn cap_durations(&mut self) {
        use crate::time::cap;
        self.backoff = self.backoff.clone().capped();
        self.ejection = self.ejection.clone().capped();
        self.retry = std::mem::take(&mut self.retry)
            .into_iter()
            .map(RetryPolicy::capped)
            .collect();
        #[cfg(feature = "health-check")]
        {
            self.health_check = self.health_check.take().map(HealthCheck::capped);
        }
        self.wrr = self.wrr.capped();
        self.latency_expiry = cap(self.latency_expiry);
        self.latency_decay = cap(self.latency_decay);
        self.discovery_interval = cap(self.discovery_interval);
        self.discovery_timeout = cap(self.discovery_timeout);
        self.slow_start = self.slow_start.map(cap);
        self.conns.idle = cap(self.conns.idle);
        self.load_report_max_age = cap(self.load_report_max_age);
        self.load_reports_oob = self.load_reports_oob.map(cap);
    }

    /// What the channel's stats call a source that pushes: the xDS target, or a stream.
    fn push_source_name(&self) -> String {
        match &self.discovery {
            #[cfg(feature = "xds")]
            Some(DiscoverySource::Xds { target }) => target.clone(),
            _ => "discovery stream".to_owned(),
        }
    }

    /// What the channel's metrics call it (`grpc.target`) unless told otherwise.
    #[cfg(feature = "metrics")]
    fn default_target(&self) -> String {
        match &self.discovery {
            Some(DiscoverySource::Dns { target, .. }) => {
                let rest = target.split_once("://").map_or(target.as_str(), |(_, r)| r);
                format!("dns:///{rest}")
            }
            Some(DiscoverySource::Custom(r)) => r.name(),
            Some(DiscoverySource::Push(_)) => "discovery stream".to_owned(),
            #[cfg(feature = "xds")]
            Some(DiscoverySource::Xds { target }) => target.clone(),
            None => self.list_target(),
        }
    }
}

/// Runs the interval rules of outlier ejection (see `health::sweep`) every `every`.
async fn interval_rules_task(pool: Weak<Shared>, health: crate::health::Health) {
    loop {
        // Rules off (no interval): wait for rules that have one.
        let every = health.rules().interval;
        let changed = tokio::select! {
            _ = tokio::time::sleep_until(crate::time::after(every.unwrap_or(Duration::MAX))) => false,
            _ = health.rules_changed() => true,
        };
        let Some(pool) = pool.upgrade() else { return };
        if changed {
            // New rules judge the calls made under them: a new interval starts.
            crate::health::restart_windows(&pool.snapshot());
        } else {
            crate::health::sweep(&health, &pool.snapshot());
        }
    }
}

/// How many calls the channel makes before it says which of its policies' and method configs'
/// names none of them matched.
const CALLS_BEFORE_UNMATCHED: u64 = 100;

/// Says once, as a warning, each name of a retry or hedging policy, of a method config or of
/// `metrics_methods` that none of the channel's first [`CALLS_BEFORE_UNMATCHED`] calls (or any
/// later one, checked every 5 s) matched, with the paths the calls had instead: `GetItem` or
/// `inventory.v1.GetItem` are valid gRPC names (a service without a package), so they cannot
/// be refused, but a policy that names no call does nothing, and a pinned name labels nothing.
async fn unmatched_names_task(pool: Weak<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut said: std::collections::HashSet<String> = Default::default();
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        if crate::ChannelStats::of(pool.set(), &pool.totals).calls() < CALLS_BEFORE_UNMATCHED {
            continue;
        }
        let (names, seen) = pool.methods.unmatched();
        let seen: Vec<&str> = seen.iter().map(|p| &**p).collect();
        let new: Vec<&str> = names.into_iter().filter(|n| !said.contains(*n)).collect();
        if !new.is_empty() {
            tracing::warn!(
                unmatched = ?new,
                calls_seen = ?seen,
                "a retry or hedging policy, or a service config's method config, names methods \
                 that no call of this channel has matched: it does nothing for them (a method \
                 is named `package.Service/Method`, as the calls' paths are)"
            );
            said.extend(new.into_iter().map(str::to_owned));
        }
        let pinned = crate::metrics::unmatched_methods(&pool.totals.metrics);
        let new: Vec<String> = pinned.into_iter().filter(|n| !said.contains(n)).collect();
        if !new.is_empty() {
            tracing::warn!(
                unmatched = ?new,
                calls_seen = ?seen,
                "Builder::metrics_methods names methods that no call of this channel has had: \
                 they label nothing, and the calls are labelled `other` (a method is named \
                 `package.Service/Method`, a service `package.Service`)"
            );
            said.extend(new);
        }
    }
}
