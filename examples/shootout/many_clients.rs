//! The shootout's `many-clients` scenario: many independent clients, each seeing only
//! its own slice of every instance's load, and what server-reported load (ORCA) adds.
//!
//! 20 instances (tonic servers with `OrcaLayer` and `OobService`, each on a runtime and thread
//! of its own), whose service time grows with the calls they serve (5 ms + 2 ms per other call
//! in flight). Four of them (i0, i5, i10, i15) misbehave, in one of two cases, each with a
//! table of its own:
//!
//! - `antagonist`: they slow down 3x (15 ms + 6 ms per other call in flight) for 2 s at random
//!   moments, an antagonist on their host (one episode each per measured window, at times
//!   drawn once from a fixed seed, so that every contender meets the same ones);
//! - `overload`: they are overloaded throughout: 5 ms + 20 ms per other call in flight (all
//!   clients' calls), as in the single-client shootout's `overload` scenario.
//!
//! and a third case of its own shape, `queue` (issue 40's): 18 instances answer after a fixed
//! 5 ms whatever their load, and two (i0, i10) serve one call at a time, 12.5 ms each, each
//! call waiting for those before it (`Behavior::Queue`): only slightly slower when idle, much
//! slower when several clients pick them at once. Measured from the start, without a warm-up
//! (a herd, if any, is the clients' first calls), 4 s per contender.
//!
//! Each instance reports as utilization its rate times its current mean service time (its base
//! plus its per-call time times its mean calls in flight, sampled every 10 ms) over 4 workers,
//! as a CPU gauge would see it.
//!
//! The load: 2,000 calls/s in all, open loop, each call from one of 50 independent clients
//! drawn at random (50 clients, each with its own balancer over every instance), 1 s deadline;
//! latency from each call's scheduled start. A contender is a balancer and what its clients do
//! with reports. `BalancedChannel`'s strategies, each client a channel (connected before the
//! run):
//!
//! - `none`: no reports (the servers' per-call reports taken off, `load_report_max_age(0)`);
//! - `per-call`: the report on each response (the default);
//! - `oob 1s`: out-of-band reports only (`load_reports_out_of_band(1 s)`,
//!   `load_report_max_age(2 s)`; the servers' per-call reports taken off);
//! - `oob 100ms` (least pending only): the same every 100 ms (`load_report_max_age(200 ms)`;
//!   the servers' `OobService` allow down to 100 ms): what fresher reports do;
//! - `ref 1 channel`: the reference, one channel carrying all the calls with the same strategy
//!   (it sees every call in flight; no reports);
//!
//! - `oracle` (least pending only, a contender beyond the usual ones): no reports, but every
//!   client takes a misbehaving instance out of its set: in `antagonist`, at the first instant
//!   of its slowdown, putting it back after; in `overload` and `queue`, before the run. What
//!   knowing at once which instances are slow, and nothing of the others' calls in flight, can
//!   do at best.
//! - `tower p2c, servers' own counts` (a contender beyond the usual ones): 50 clients, each
//!   its own tower p2c whose load for an instance is the instance's own count of its calls in
//!   flight (every client's), read in-process at the instant of the pick: what two probes per
//!   call could tell if their answers came at once and cost nothing (each client in a
//!   `tower::buffer::Buffer`, over lazy tonic channels, as the other tower contenders).
//! - `hot-cold, 3 free probes/call` (a contender beyond the usual ones): 50 clients, each
//!   drawing three instances per call and choosing among them by the probes' hot-cold rule,
//!   over their probe answers (`OrcaHandle::probe_answer`) read in-process at the instant of
//!   the pick: what three probes that each call waited for could tell if they came at once and
//!   cost nothing (each client with a lazy tonic channel to each instance).
//!
//! The contenders on `BalancedChannel`: `FewestThenFastest` (the default strategy) with none,
//! per-call and its reference; `LeastPending` with all of the above; `PeakEwma` with none,
//! per-call, oob 1s and its reference; `RoundRobin` with none; and weighted round robin
//! (`WRR`: blackout 1 s, weights rebuilt every 250 ms) on per-call and on oob 1s reports.
//! And what tower users have: `tower p2c PeakEwma` and `tower p2c pending`, 50 clients each
//! with its own `tower::balance::p2c::Balance` over `PeakEwma` (1 ms before the first sample,
//! 1 s decay, as `BalancedChannel`'s estimate) or `PendingRequests` of lazy tonic channels,
//! one to each instance, in a `tower::buffer::Buffer` (built as in the main shootout,
//! `contenders.rs`; their connections open during the warm-up; no reports). Every client is
//! boxed into one service type (`contenders::Svc`), and each call into a boxed future. A
//! contender without a reference of its own has its p99 compared with the best reference
//! (`p99/ref`).
//!
//! Besides the latencies, the table gives:
//!
//! - `to slowed`: in `antagonist`, the share of the calls answered by an instance while it was
//!   slowed (a fair share is 8%: 4 instances slowed 2 s each, of 20 for 5 s); in `overload`,
//!   the share of the calls that reached an overloaded instance, failed ones included
//!   (server-side counts over the measured window; a fair share is 20%); and `p99 elsewhere`,
//!   the p99 of the calls answered by the others: where the p99 comes from;
//! - `probes/call`: the probes the clients sent per call (`ChannelStats::probes_sent`);
//! - `CPU client`, `CPU server`: the CPU time (µs per call) that the client side (the client
//!   runtime's threads, `mc-client`: the clients, their calls and connections, probes
//!   included; the load generator's schedule runs on the main thread, not counted) and
//!   the server side (the 20 servers' threads, `fleet-i0`...) spent in the measured window,
//!   from each thread's `/proc/self/task/<tid>/schedstat` (ns on CPU) at the window's start and
//!   end, over the calls scheduled in it. The machine's other load is not in it, but contention
//!   for the cores is (cache misses, preemption).
//!
//! Each contender gets a fresh set of clients, 1.5 s of warm-up at the same rate, then 5 s
//! measured; the order of the contenders rotates from one round to the next (`--rounds`,
//! default 1), and with several rounds each cell is the median of its rounds.
//!
//! Run it alone:
//! `cargo run --release --features orca --example shootout -- --scenario many-clients`
//! (both cases, `antagonist` then `overload`); `MANY_CLIENTS_CASE=overload` (or `antagonist`)
//! runs one case only; `MANY_CLIENTS_ONLY=oracle,LeastPending` runs only the contenders whose
//! name contains one of those.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::contenders::{self, Svc};
use super::fleet::pb::fleet_client::FleetClient;
use super::fleet::pb::{Reply, Req};
use super::fleet::{Behavior, Instance, ServerOptions};
use tonic::body::Body;
use tonic_balancer::orca::{OrcaHandle, WrrConfig};
use tonic_balancer::{BalancedChannel, ProbeConfig, Strategy};
use tower::util::BoxCloneService;

/// The scenario's name for `--scenario`.
pub const KEY: &str = "many-clients";

const INSTANCES: usize = 20;
const CLIENTS: usize = 50;
const RATE: f64 = 2000.0;
const WARMUP: Duration = Duration::from_millis(1500);
const MEASURED: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(1);
/// The misbehaving instances (antagonised, or overloaded).
const SLOWED: [usize; 4] = [0, 5, 10, 15];
/// The queue case's queues, their service time, and how long it is measured (from the start).
const QUEUES: [usize; 2] = [0, 10];
const QUEUE_SERVICE: Duration = Duration::from_micros(12_500);
const QUEUE_MEASURED: Duration = Duration::from_secs(4);
const EPISODE: Duration = Duration::from_secs(2);
const BASE: Duration = Duration::from_millis(5);
const PER_CALL: Duration = Duration::from_millis(2);
const SLOWDOWN: u32 = 3;
/// An overloaded instance's time per other call in flight (the single-client shootout's
/// `overload`).
const OVERLOAD_PER_CALL: Duration = Duration::from_millis(20);
/// The workers a server's utilization is counted over.
const WORKERS: f64 = 4.0;
const OOB_INTERVAL: Duration = Duration::from_secs(1);
const OOB_FAST: Duration = Duration::from_millis(100);
const SEED: u64 = 0x5eed_0012;
/// The names of the client runtime's threads (the servers' are `fleet-<instance>`).
const CLIENT_THREADS: &str = "mc-client";
const SERVER_THREADS: &str = "fleet-";

/// What misbehaves.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    /// The 4 instances slow down 3x for 2 s each at random moments.
    Antagonist,
    /// The 4 instances take 5 ms + 20 ms per other call in flight, throughout.
    Overload,
    /// 18 instances answer in 5 ms whatever their load, 2 serve one call at a time (12.5 ms).
    Queue,
}

const CASES: [Case; 3] = [Case::Antagonist, Case::Overload, Case::Queue];

impl Case {
    fn key(self) -> &'static str {
        match self {
            Case::Antagonist => "antagonist",
            Case::Overload => "overload",
            Case::Queue => "queue",
        }
    }

    /// The instances that misbehave (for `to slowed`).
    fn misbehaving(self) -> &'static [usize] {
        match self {
            Case::Queue => &QUEUES,
            _ => &SLOWED,
        }
    }

    /// The warm-up before the measured window: none for `queue`, whose point is the start.
    fn warmup(self) -> Duration {
        match self {
            Case::Queue => Duration::ZERO,
            _ => WARMUP,
        }
    }

    fn measured(self) -> Duration {
        match self {
            Case::Queue => QUEUE_MEASURED,
            _ => MEASURED,
        }
    }

    /// The cases to run: `MANY_CLIENTS_CASE` (`antagonist`, `overload`, `queue`, or several
    /// with commas), else every one.
    fn chosen() -> Vec<Case> {
        match std::env::var("MANY_CLIENTS_CASE") {
            Ok(v) if !v.is_empty() && v != "both" && v != "all" => {
                let cases: Vec<Case> = CASES
                    .into_iter()
                    .filter(|c| v.split(',').any(|k| k.trim() == c.key()))
                    .collect();
                if cases.is_empty() {
                    eprintln!("MANY_CLIENTS_CASE={v:?}: not antagonist, overload or queue");
                    std::process::exit(2);
                }
                cases
            }
            _ => CASES.to_vec(),
        }
    }

    /// What misbehaves, for the table's heading.
    fn describe(self) -> String {
        match self {
            Case::Antagonist => "each 5 ms + 2 ms per other call in flight; i0, i5, i10, i15 3x slower (15 ms + 6 ms per other call in flight) for 2 s each at random moments".to_owned(),
            Case::Overload => format!(
                "each 5 ms + 2 ms per other call in flight; i0, i5, i10, i15 overloaded throughout ({} ms + {} ms per other call in flight, all clients' calls)",
                BASE.as_millis(),
                OVERLOAD_PER_CALL.as_millis()
            ),
            Case::Queue => format!(
                "i0, i10 serve one call at a time ({} ms each, a queue), the other 18 answer in {} ms whatever their load",
                QUEUE_SERVICE.as_secs_f64() * 1e3,
                BASE.as_millis()
            ),
        }
    }

    /// The fair share of `to slowed`.
    fn fair_share(self) -> f64 {
        match self {
            Case::Antagonist => {
                (SLOWED.len() as f64 * EPISODE.as_secs_f64())
                    / (INSTANCES as f64 * MEASURED.as_secs_f64())
            }
            Case::Overload | Case::Queue => self.misbehaving().len() as f64 / INSTANCES as f64,
        }
    }
}

/// What a contender's clients do with load reports.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reports {
    None,
    PerCall,
    Oob,
    /// Out-of-band reports only, every 100 ms (a contender beyond the usual ones: what
    /// fresher reports do).
    OobFast,
    /// One channel for all the calls (reports ignored).
    Reference,
    /// No reports, but every client takes a misbehaving instance out of its set (for the
    /// whole of its slowdown, at its first instant, and puts it back after; an overloaded one
    /// before the run): a contender beyond the usual ones, knowing what no client can, the
    /// best that spreading the calls without knowing each instance's calls in flight can do.
    Oracle,
    /// No reports; probes (`Builder::probes`), this many per call at most (Prequal's
    /// defaults otherwise).
    Probes(u8),
}

/// Each client's balancer.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Balancer {
    /// A `BalancedChannel` with this strategy.
    Ours(Strategy),
    /// tower's p2c over `PeakEwma` (`contenders::Contender::TowerP2cEwma`).
    TowerP2cEwma,
    /// tower's p2c over `PendingRequests` (`contenders::Contender::TowerP2cPending`).
    TowerP2cPending,
    /// tower's p2c over each instance's own count of its calls in flight (every client's),
    /// read in-process at the instant of the pick: what two probes per call could tell if
    /// their answers came at once and cost nothing (a contender beyond the usual ones).
    TowerP2cTrueLoad,
    /// Prequal's hot-cold rule over three instances drawn at random per call, each one's
    /// probe answer (`OrcaHandle::probe_answer`: calls in flight and latency estimate) read
    /// in-process at the instant of the pick: what three probes per call that each call waited
    /// for could tell if their answers came at once and cost nothing (a contender beyond the
    /// usual ones).
    FreeProbes,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Contender {
    balancer: Balancer,
    reports: Reports,
}

const fn ours(strategy: Strategy, reports: Reports) -> Contender {
    Contender {
        balancer: Balancer::Ours(strategy),
        reports,
    }
}

/// The new default strategy's contenders: no reports, per-call reports, probes at 1, 2 and 3
/// per call, and the 1-channel reference.
const FEWEST_THEN_FASTEST: [Contender; 6] = [
    ours(Strategy::FewestThenFastest, Reports::None),
    ours(Strategy::FewestThenFastest, Reports::PerCall),
    ours(Strategy::FewestThenFastest, Reports::Probes(1)),
    ours(Strategy::FewestThenFastest, Reports::Probes(2)),
    ours(Strategy::FewestThenFastest, Reports::Probes(3)),
    ours(Strategy::FewestThenFastest, Reports::Reference),
];

const CONTENDERS: [Contender; 17] = [
    ours(Strategy::LeastPending, Reports::None),
    ours(Strategy::LeastPending, Reports::PerCall),
    ours(Strategy::LeastPending, Reports::Oob),
    ours(Strategy::LeastPending, Reports::OobFast),
    ours(Strategy::LeastPending, Reports::Reference),
    ours(Strategy::LeastPending, Reports::Oracle),
    ours(Strategy::PeakEwma, Reports::None),
    ours(Strategy::PeakEwma, Reports::PerCall),
    ours(Strategy::PeakEwma, Reports::Oob),
    ours(Strategy::PeakEwma, Reports::Reference),
    ours(Strategy::RoundRobin, Reports::None),
    ours(Strategy::WeightedRoundRobin, Reports::PerCall),
    ours(Strategy::WeightedRoundRobin, Reports::Oob),
    Contender {
        balancer: Balancer::TowerP2cEwma,
        reports: Reports::None,
    },
    Contender {
        balancer: Balancer::TowerP2cPending,
        reports: Reports::None,
    },
    Contender {
        balancer: Balancer::TowerP2cTrueLoad,
        reports: Reports::None,
    },
    Contender {
        balancer: Balancer::FreeProbes,
        reports: Reports::None,
    },
];

/// Every contender, in the table's order: the new default's first.
fn all_contenders() -> Vec<Contender> {
    FEWEST_THEN_FASTEST
        .iter()
        .chain(CONTENDERS.iter())
        .copied()
        .collect()
}

impl Contender {
    fn name(self) -> String {
        let s = match self.balancer {
            Balancer::TowerP2cEwma => return "tower p2c PeakEwma".to_owned(),
            Balancer::TowerP2cPending => return "tower p2c pending".to_owned(),
            Balancer::TowerP2cTrueLoad => return "tower p2c, servers' own counts".to_owned(),
            Balancer::FreeProbes => return "hot-cold, 3 free probes/call".to_owned(),
            Balancer::Ours(Strategy::FewestThenFastest) => "FewestThenFastest",
            Balancer::Ours(Strategy::LeastPending) => "LeastPending",
            Balancer::Ours(Strategy::PeakEwma) => "PeakEwma",
            Balancer::Ours(Strategy::RoundRobin) => "RoundRobin",
            Balancer::Ours(Strategy::WeightedRoundRobin) => "WRR",
            Balancer::Ours(_) => "?",
        };
        let r = match self.reports {
            Reports::None => "none",
            Reports::PerCall => "per-call",
            Reports::Oob => "oob 1s",
            Reports::OobFast => "oob 100ms",
            Reports::Reference => "ref 1 channel",
            Reports::Oracle => "oracle",
            Reports::Probes(n) => return format!("{s}, probes {n}/call"),
        };
        format!("{s}, {r}")
    }

    /// Its clients, boxed, and the `BalancedChannel`s among them (the oracle takes instances
    /// out of them; the probes are counted on them). Within the client runtime.
    async fn clients(
        self,
        uris: &[String],
        servers: &Arc<Servers>,
    ) -> (Vec<Svc>, Vec<BalancedChannel>) {
        let n = if self.reports == Reports::Reference {
            1
        } else {
            CLIENTS
        };
        let strategy = match self.balancer {
            Balancer::Ours(s) => s,
            Balancer::TowerP2cEwma => {
                let c = contenders::Contender::TowerP2cEwma;
                return ((0..n).map(|_| c.build(uris)).collect(), Vec::new());
            }
            Balancer::TowerP2cPending => {
                let c = contenders::Contender::TowerP2cPending;
                return ((0..n).map(|_| c.build(uris)).collect(), Vec::new());
            }
            Balancer::TowerP2cTrueLoad => {
                let client = || {
                    let list: Vec<TrueLoad> = uris
                        .iter()
                        .enumerate()
                        .map(|(i, u)| TrueLoad {
                            channel: tonic::transport::Endpoint::from_shared(u.clone())
                                .expect("fleet URI")
                                .connect_lazy(),
                            servers: servers.clone(),
                            i,
                        })
                        .collect();
                    let discover = tower::discover::ServiceList::new::<http::Request<Body>>(list);
                    let balance = tower::balance::p2c::Balance::new(discover);
                    Svc::new(tower::buffer::Buffer::new(balance, 1024))
                };
                return ((0..n).map(|_| client()).collect(), Vec::new());
            }
            Balancer::FreeProbes => {
                let client = |seed: u64| {
                    let channels = uris
                        .iter()
                        .map(|u| {
                            tonic::transport::Endpoint::from_shared(u.clone())
                                .expect("fleet URI")
                                .connect_lazy()
                        })
                        .collect();
                    let probes = FreeProbes {
                        channels: Arc::new(channels),
                        servers: servers.clone(),
                        draws: Arc::new(std::sync::Mutex::new(seed)),
                    };
                    Svc::new(tower::service_fn(move |req: http::Request<Body>| {
                        let channel = probes.channels[probes.pick()].clone();
                        async move {
                            tower::ServiceExt::oneshot(channel, req)
                                .await
                                .map_err(tower::BoxError::from)
                        }
                    }))
                };
                return ((0..n as u64).map(client).collect(), Vec::new());
            }
        };
        let mut channels = Vec::with_capacity(n);
        for _ in 0..n {
            let mut b = BalancedChannel::builder().uris(uris);
            b = match strategy {
                Strategy::WeightedRoundRobin => b.weighted_round_robin(
                    WrrConfig::default()
                        .blackout_period(Duration::from_secs(1))
                        .weight_update_period(Duration::from_millis(250)),
                ),
                s => b.strategy(s),
            };
            b = match self.reports {
                Reports::None | Reports::Reference | Reports::Oracle => {
                    b.load_report_max_age(Duration::ZERO)
                }
                Reports::PerCall => b,
                Reports::Oob => b
                    .load_reports_out_of_band(OOB_INTERVAL)
                    .load_report_max_age(2 * OOB_INTERVAL),
                Reports::OobFast => b
                    .load_reports_out_of_band(OOB_FAST)
                    .load_report_max_age(2 * OOB_FAST),
                Reports::Probes(n) => b
                    .load_report_max_age(Duration::ZERO)
                    .probes(ProbeConfig::default().per_call(f64::from(n))),
            };
            channels.push(b.connect().await.expect("the fleet answers"));
        }
        let boxed = channels
            .iter()
            .map(|c| BoxCloneService::new(c.clone()))
            .collect();
        (boxed, channels)
    }
}

/// The probes these clients have sent so far (the tower contenders have no channels here and
/// send none).
fn probes_sent(channels: &[BalancedChannel]) -> u64 {
    channels.iter().map(|c| c.stats().probes_sent()).sum()
}

/// splitmix64: the antagonist's draws.
fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Each antagonised instance's episode start, from the start of the measured window.
fn episodes() -> Vec<(usize, Duration)> {
    let mut x = SEED;
    let span = (MEASURED - EPISODE).as_secs_f64();
    SLOWED
        .iter()
        .map(|&i| {
            let unit = (splitmix(&mut x) >> 11) as f64 / (1u64 << 53) as f64;
            (i, Duration::from_secs_f64(unit * span))
        })
        .collect()
}

/// Service times: the base, and the time per other call in flight.
fn normal() -> (Duration, Duration) {
    (BASE, PER_CALL)
}

fn slowed() -> (Duration, Duration) {
    (BASE * SLOWDOWN, PER_CALL * SLOWDOWN)
}

fn overloaded() -> (Duration, Duration) {
    (BASE, OVERLOAD_PER_CALL)
}

/// A connection to instance `i` whose load is the instance's own count of its calls in flight
/// (`Balancer::TowerP2cTrueLoad`).
struct TrueLoad {
    channel: tonic::transport::Channel,
    servers: Arc<Servers>,
    i: usize,
}

impl tower::Service<http::Request<Body>> for TrueLoad {
    type Response = http::Response<Body>;
    type Error = tower::BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<Body>, tower::BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), tower::BoxError>> {
        tower::Service::poll_ready(&mut self.channel, cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let call = tower::Service::call(&mut self.channel, req);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

impl tower::load::Load for TrueLoad {
    type Metric = usize;

    fn load(&self) -> usize {
        self.servers.instances[self.i].active()
    }
}

/// `Balancer::FreeProbes`: one client, with a lazy tonic channel to each instance.
#[derive(Clone)]
struct FreeProbes {
    channels: Arc<Vec<tonic::transport::Channel>>,
    servers: Arc<Servers>,
    /// The client's random sequence (`splitmix`).
    draws: Arc<std::sync::Mutex<u64>>,
}

impl FreeProbes {
    /// Three distinct instances drawn at random, and among them the crate's hot-cold choice
    /// over their probe answers, at the default quantile (0.84 of three: the two with the
    /// fewest calls in flight are cold; the lower latency estimate of those wins).
    fn pick(&self) -> usize {
        let n = self.channels.len() as u64;
        let mut drawn = [0u32; 3];
        let mut k = 0;
        let mut draws = self.draws.lock().unwrap();
        while k < 3 {
            let i = (splitmix(&mut draws) % n) as u32;
            if !drawn[..k].contains(&i) {
                drawn[k] = i;
                k += 1;
            }
        }
        drop(draws);
        let answers = drawn.map(|i| (i, self.servers.handles[i as usize].probe_answer()));
        tonic_balancer::__bench::hot_cold(&answers, 0.84).expect("three answers")
    }
}

/// The fleet: instances with their load handles, and each one's current service times (µs:
/// base, per other call in flight).
struct Servers {
    instances: Vec<Instance>,
    handles: Vec<OrcaHandle>,
    base_us: Vec<AtomicU64>,
    per_call_us: Vec<AtomicU64>,
}

impl Servers {
    fn start() -> Servers {
        let mut instances = Vec::new();
        let mut handles = Vec::new();
        let (base, per_call) = normal();
        for i in 0..INSTANCES {
            let handle = OrcaHandle::new();
            instances.push(Instance::start_with(
                &format!("i{i}"),
                "127.0.0.1:0".parse().unwrap(),
                Behavior::Overload { base, per_call },
                ServerOptions {
                    orca: Some(handle.clone()),
                    orca_oob: Some(OOB_FAST),
                    ..Default::default()
                },
            ));
            handles.push(handle);
        }
        let us = |d: Duration| {
            (0..INSTANCES)
                .map(|_| AtomicU64::new(d.as_micros() as u64))
                .collect()
        };
        Servers {
            instances,
            handles,
            base_us: us(base),
            per_call_us: us(per_call),
        }
    }

    /// Instance `i` answers in `base + per_call × other calls in flight` from now on.
    fn set(&self, i: usize, (base, per_call): (Duration, Duration)) {
        self.instances[i].set(Behavior::Overload { base, per_call });
        self.base_us[i].store(base.as_micros() as u64, Ordering::Relaxed);
        self.per_call_us[i].store(per_call.as_micros() as u64, Ordering::Relaxed);
    }

    /// Instance `i` serves one call at a time, `service` each, from now on (a fresh queue).
    fn queue(&self, i: usize, service: Duration) {
        self.instances[i].set(Behavior::Queue(service));
        self.base_us[i].store(service.as_micros() as u64, Ordering::Relaxed);
        self.per_call_us[i].store(0, Ordering::Relaxed);
    }

    /// Every instance as the case has them outside of an episode.
    fn reset(&self, case: Case) {
        for i in 0..INSTANCES {
            match case {
                Case::Queue if QUEUES.contains(&i) => self.queue(i, QUEUE_SERVICE),
                Case::Queue => self.set(i, (BASE, Duration::ZERO)),
                Case::Overload if SLOWED.contains(&i) => self.set(i, overloaded()),
                _ => self.set(i, normal()),
            }
        }
    }

    fn slow(&self, i: usize, on: bool) {
        self.set(i, if on { slowed() } else { normal() });
    }

    fn per_call_reports(&self, on: bool) {
        for inst in &self.instances {
            inst.set_per_call_reports(on);
        }
    }

    /// Utilization as a CPU gauge would see it: the rate times the mean service time (with
    /// `in_flight`, each instance's mean calls in flight), over the workers.
    fn update_utilization(&self, in_flight: &[f64]) {
        for (i, h) in self.handles.iter().enumerate() {
            let rps = h.report().rps_fractional;
            let base = self.base_us[i].load(Ordering::Relaxed) as f64 * 1e-6;
            let per_call = self.per_call_us[i].load(Ordering::Relaxed) as f64 * 1e-6;
            let service = base + per_call * in_flight[i];
            h.set_application_utilization((rps * service / WORKERS).max(0.001));
        }
    }

    /// The gauge: samples each instance's calls in flight every 10 ms and sets the
    /// utilizations every 100 ms, on a thread of its own (counted on neither side), until
    /// `stop`.
    fn gauge(self: &Arc<Self>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
        let servers = self.clone();
        std::thread::Builder::new()
            .name("mc-gauge".to_owned())
            .spawn(move || {
                let mut sum = [0usize; INSTANCES];
                let mut samples = 0;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(10));
                    for (s, inst) in sum.iter_mut().zip(&servers.instances) {
                        *s += inst.active();
                    }
                    samples += 1;
                    if samples == 10 {
                        let mean: Vec<f64> =
                            sum.iter().map(|&s| s as f64 / samples as f64).collect();
                        servers.update_utilization(&mean);
                        sum.fill(0);
                        samples = 0;
                    }
                }
            })
            .expect("the gauge's thread")
    }
}

/// Which side a thread of the process works for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Client,
    Server,
    Other,
}

/// The CPU time (ns) each thread of the process has had so far, by thread id, with its side
/// (from its name): `/proc/self/task/<tid>/schedstat`'s first field, or where that is missing,
/// `stat`'s utime + stime (clock ticks of 10 ms).
fn thread_cpu() -> HashMap<u32, (Side, u64)> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        let dir = task.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let side = if comm.starts_with(CLIENT_THREADS) {
            Side::Client
        } else if comm.starts_with(SERVER_THREADS) {
            Side::Server
        } else {
            Side::Other
        };
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .or_else(|| {
                // The fields after the command's name (which may hold spaces), in `)`.
                let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
                let rest = &stat[stat.rfind(')')? + 2..];
                let f: Vec<&str> = rest.split_whitespace().collect();
                // utime and stime: fields 14 and 15, the 12th and 13th after the name.
                let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
                Some(ticks * 10_000_000)
            });
        if let Some(ns) = ns {
            out.insert(tid, (side, ns));
        }
    }
    out
}

/// The CPU time (ns) of each side between two snapshots of `thread_cpu` (a thread that started
/// in between counts from 0; one that ended in between is lost).
fn cpu_between(
    from: &HashMap<u32, (Side, u64)>,
    to: &HashMap<u32, (Side, u64)>,
) -> HashMap<&'static str, u64> {
    let mut out = HashMap::new();
    for (tid, &(side, ns)) in to {
        let before = from.get(tid).map_or(0, |&(_, b)| b);
        let key = match side {
            Side::Client => "client",
            Side::Server => "server",
            Side::Other => "other",
        };
        *out.entry(key).or_insert(0) += ns.saturating_sub(before);
    }
    out
}

/// One measured call.
struct Call {
    /// Its scheduled start, from the start of the measured window.
    at: Duration,
    /// The instance that answered (its index), if it succeeded.
    by: Option<usize>,
    /// From the scheduled start to the answer; `None` for a failure.
    latency: Option<Duration>,
}

impl Call {
    /// Whether it was answered by a misbehaving instance (in `antagonist`, while it was
    /// slowed).
    fn on_slowed(&self, case: Case, episodes: &[(usize, Duration)]) -> bool {
        match case {
            Case::Antagonist => episodes.iter().any(|&(i, from)| {
                self.by == Some(i) && self.at >= from && self.at < from + EPISODE
            }),
            Case::Overload | Case::Queue => {
                self.by.is_some_and(|i| case.misbehaving().contains(&i))
            }
        }
    }
}

/// What the measured window cost, per call scheduled in it, and where the calls went.
#[derive(Clone, Copy, Default)]
struct Window {
    /// CPU µs per call, client side and server side.
    client_us: f64,
    server_us: f64,
    /// Threads of neither side (the main thread, the gauge): a check that the split holds.
    other_us: f64,
    /// Probes sent per call.
    probes: f64,
    /// The share of the calls that reached the misbehaving instances (server-side counts,
    /// failed calls included).
    reached_slowed: f64,
}

/// One contender's measured calls, and what the measured window cost.
async fn run_one(
    servers: Arc<Servers>,
    uris: Vec<String>,
    contender: Contender,
    case: Case,
) -> (Vec<Call>, Window) {
    servers.reset(case);
    // Without reports, the servers send none: what a user who does not turn them on has.
    servers.per_call_reports(contender.reports == Reports::PerCall);
    let (boxed, channels) = contender.clients(&uris, &servers).await;
    let oracle = contender.reports == Reports::Oracle;
    if oracle && matches!(case, Case::Overload | Case::Queue) {
        for c in &channels {
            for &i in case.misbehaving() {
                c.remove(&uris[i]).expect("a valid URI");
            }
        }
    }
    let clients: Vec<FleetClient<Svc>> = boxed.into_iter().map(FleetClient::new).collect();
    let (warmup, measured) = (case.warmup(), case.measured());
    let warm = (RATE * warmup.as_secs_f64()) as usize;
    let total = warm + (RATE * measured.as_secs_f64()) as usize;
    let start = Instant::now() + Duration::from_millis(20);
    let measured_from = start + warmup;
    // The antagonist, on the measured window's clock.
    let antagonist = {
        let servers = servers.clone();
        let oracle = oracle.then(|| (channels.clone(), uris.clone()));
        let episodes = if case == Case::Antagonist {
            episodes()
        } else {
            Vec::new()
        };
        tokio::spawn(async move {
            let mut events: Vec<(Instant, usize, bool)> = episodes
                .into_iter()
                .flat_map(|(i, at)| {
                    [
                        (measured_from + at, i, true),
                        (measured_from + at + EPISODE, i, false),
                    ]
                })
                .collect();
            events.sort_by_key(|e| e.0);
            for (at, i, on) in events {
                tokio::time::sleep_until(at.into()).await;
                servers.slow(i, on);
                if let Some((channels, uris)) = &oracle {
                    for c in channels {
                        if on {
                            c.remove(&uris[i]).expect("a valid URI");
                        } else {
                            let e = tonic::transport::Endpoint::from_shared(uris[i].clone())
                                .expect("a valid URI");
                            c.insert(e).expect("a valid URI");
                        }
                    }
                }
            }
        })
    };
    // The meter: each side's CPU time and the probes over the measured window (the calls of
    // the warm-up still finishing at its start are, in the steady state, as many as those of
    // the window still running at its end).
    let meter = {
        let channels = channels.clone();
        let servers = servers.clone();
        tokio::spawn(async move {
            let served = || -> Vec<u64> { servers.instances.iter().map(|i| i.served()).collect() };
            tokio::time::sleep_until(measured_from.into()).await;
            let (t0, cpu0, probes0) = (Instant::now(), thread_cpu(), probes_sent(&channels));
            let served0 = served();
            tokio::time::sleep_until((measured_from + measured).into()).await;
            let (t1, cpu1, probes1) = (Instant::now(), thread_cpu(), probes_sent(&channels));
            let served1 = served();
            let calls = RATE * (t1 - t0).as_secs_f64();
            let cpu = cpu_between(&cpu0, &cpu1);
            let us = |side| cpu.get(side).copied().unwrap_or(0) as f64 * 1e-3 / calls;
            let reached: Vec<u64> = served1.iter().zip(&served0).map(|(b, a)| b - a).collect();
            let to_slowed: u64 = case.misbehaving().iter().map(|&i| reached[i]).sum();
            Window {
                client_us: us("client"),
                server_us: us("server"),
                other_us: us("other"),
                probes: probes1.saturating_sub(probes0) as f64 / calls,
                reached_slowed: to_slowed as f64 / reached.iter().sum::<u64>().max(1) as f64,
            }
        })
    };
    let mut tasks = Vec::with_capacity(total);
    // Each call from a client drawn at random (the same draws for every contender): clients
    // that took their calls in strict turn would move in lockstep (their round robins would
    // all send to the same instance at once).
    let mut draws = SEED ^ 0xc11e;
    for k in 0..total {
        let at = start + Duration::from_secs_f64(k as f64 / RATE);
        tokio::time::sleep_until(at.into()).await;
        let pick = (splitmix(&mut draws) % clients.len() as u64) as usize;
        let mut client = clients[pick].clone();
        tasks.push(tokio::spawn(async move {
            let mut req = tonic::Request::new(Req {
                id: k as u64,
                ..Default::default()
            });
            req.set_timeout(DEADLINE);
            let reply = tokio::time::timeout(
                DEADLINE + Duration::from_millis(100),
                unary(&mut client, req),
            )
            .await
            .ok()
            .and_then(|r| r.ok());
            let latency = reply.is_some().then(|| at.elapsed());
            Call {
                at: at.saturating_duration_since(measured_from),
                by: reply.and_then(|r| r.into_inner().instance[1..].parse().ok()),
                latency,
            }
        }));
    }
    let mut calls = Vec::with_capacity(total - warm);
    for (k, t) in tasks.into_iter().enumerate() {
        let call = t.await.expect("a call's task");
        if k >= warm {
            calls.push(call);
        }
    }
    let _ = antagonist.await;
    let window = meter.await.expect("the meter");
    servers.reset(case);
    drop(clients);
    drop(channels);
    (calls, window)
}

/// One unary call, boxed as a `Send` future (as in `load.rs`): spawning the generated client's
/// future directly trips a rustc limitation on higher-ranked lifetimes.
fn unary(
    client: &mut FleetClient<Svc>,
    req: tonic::Request<Req>,
) -> futures::future::BoxFuture<'_, Result<tonic::Response<Reply>, tonic::Status>> {
    Box::pin(client.unary(req))
}

/// What a contender's run measured.
#[derive(Clone, Copy)]
struct Summary {
    /// p50, p99, p99.9 (failures ranked above every success: `None`).
    q: [Option<Duration>; 3],
    /// The share of the calls that succeeded.
    ok: f64,
    /// The share of the calls answered by an instance while it was slowed (`antagonist`), or
    /// that reached an overloaded one (`overload`, failed calls included).
    to_slowed: f64,
    /// The p99 of the calls answered by the other instances.
    p99_elsewhere: Option<Duration>,
    window: Window,
}

/// p50, p99, p99.9 of `lat` (failures ranked above every success).
fn quantiles(mut lat: Vec<Option<Duration>>) -> [Option<Duration>; 3] {
    let n = lat.len().max(1);
    lat.sort_by_key(|l| l.unwrap_or(Duration::MAX));
    let q = |p: f64| {
        lat.get(((n as f64 * p).ceil() as usize).clamp(1, n) - 1)
            .copied()
            .flatten()
    };
    [q(0.5), q(0.99), q(0.999)]
}

fn summary(calls: &[Call], window: Window, case: Case) -> Summary {
    let n = calls.len().max(1) as f64;
    let eps = episodes();
    let slowed = calls.iter().filter(|c| c.on_slowed(case, &eps)).count() as f64;
    // Answered by an instance that was not misbehaving (a failed call's instance is not
    // known: failures show in `ok`).
    let elsewhere = calls
        .iter()
        .filter(|c| c.by.is_some() && !c.on_slowed(case, &eps))
        .map(|c| c.latency)
        .collect();
    Summary {
        q: quantiles(calls.iter().map(|c| c.latency).collect()),
        ok: calls.iter().filter(|c| c.latency.is_some()).count() as f64 / n,
        to_slowed: match case {
            Case::Antagonist => slowed / n,
            // Failed calls included: the share that reached them.
            Case::Overload | Case::Queue => window.reached_slowed,
        },
        p99_elsewhere: quantiles(elsewhere)[1],
        window,
    }
}

fn cell(d: Option<Duration>) -> String {
    d.map_or("fail".to_owned(), |d| {
        format!("{:.2}", d.as_secs_f64() * 1e3)
    })
}

/// The median of `v` (the lower of the middle two) in the order of `cmp`.
fn median<T: Copy>(mut v: Vec<T>, cmp: impl FnMut(&T, &T) -> std::cmp::Ordering) -> T {
    v.sort_by(cmp);
    v[(v.len() - 1) / 2]
}

/// The median of latencies, failures (`None`) ranked above every success.
fn median_latency(v: Vec<Option<Duration>>) -> Option<Duration> {
    median(v, |a, b| {
        a.unwrap_or(Duration::MAX).cmp(&b.unwrap_or(Duration::MAX))
    })
}

/// Runs the scenario (each case chosen, `rounds` times every contender) and prints a table per
/// case.
pub fn run(rounds: usize) {
    let servers = Arc::new(Servers::start());
    let uris: Vec<String> = servers.instances.iter().map(|i| i.uri()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(CLIENT_THREADS)
        .build()
        .expect("client runtime");
    let stop = Arc::new(AtomicBool::new(false));
    let gauge = servers.gauge(stop.clone());
    for case in Case::chosen() {
        run_case(&rt, &servers, &uris, case, rounds);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = gauge.join();
}

/// One case: every contender `rounds` times, and its table.
fn run_case(
    rt: &tokio::runtime::Runtime,
    servers: &Arc<Servers>,
    uris: &[String],
    case: Case,
    rounds: usize,
) {
    let contenders = all_contenders();
    println!();
    println!(
        "{KEY} ({}): {CLIENTS} clients (independent balancers), {RATE:.0} calls/s in all, open loop, {INSTANCES} instances, {}; {:.1} s measured (+{:.1} s warm-up) per contender, {rounds} round(s), deadline 1 s; latency in ms from the scheduled start, 'fail' = the percentile falls on failed calls",
        case.key(),
        case.describe(),
        case.measured().as_secs_f64(),
        case.warmup().as_secs_f64()
    );
    match case {
        Case::Antagonist => {
            let episodes: Vec<String> = episodes()
                .iter()
                .map(|(i, at)| format!("i{i} at {:.2} s", at.as_secs_f64()))
                .collect();
            println!(
                "slow episodes (from the start of the measured window): {}; 'to slowed': calls answered by an instance while it was slowed (fair share {:.0}%)",
                episodes.join(", "),
                case.fair_share() * 100.0
            );
        }
        Case::Overload | Case::Queue => println!(
            "'to slowed': calls that reached {}, failed ones included (server-side counts over the measured window; fair share {:.0}%); 'p99 elsewhere': of the calls answered by the others",
            case.misbehaving()
                .iter()
                .map(|i| format!("i{i}"))
                .collect::<Vec<_>>()
                .join(", "),
            case.fair_share() * 100.0
        ),
    }
    println!("probes/call: probes sent per call; CPU client/server: µs of CPU time per call of the client runtime's threads / the 20 servers' threads over the measured window");
    let mut results: Vec<Vec<Summary>> = vec![Vec::new(); contenders.len()];
    // MANY_CLIENTS_ONLY=a,b: only the contenders whose name contains one of these.
    let only: Vec<String> = std::env::var("MANY_CLIENTS_ONLY")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    for round in 0..rounds {
        for j in 0..contenders.len() {
            let c = (j + round * 3) % contenders.len();
            let contender = contenders[c];
            let name = contender.name();
            if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
                continue;
            }
            // The load generator's schedule runs on this thread (counted as `other`, not as the
            // client's: it is the bench, not the balancer), the calls on the client runtime's
            // threads. On a worker thread of that runtime, the schedule competed with the calls
            // for the 2 cores and started calls late: the one-channel references' p99 were 15
            // to 46 ms over a run's rounds, 10 to 25 ms with the schedule here.
            let (calls, window) =
                rt.block_on(run_one(servers.clone(), uris.to_vec(), contender, case));
            let s = summary(&calls, window, case);
            eprintln!(
                "  {} round {} {:<32} p50 {:>7} p99 {:>7}  to slowed {:>5.2}%  p99 elsewhere {:>7}  CPU client {:>5.0} server {:>5.0} other {:>4.0} µs/call",
                case.key(),
                round + 1,
                name,
                cell(s.q[0]),
                cell(s.q[1]),
                s.to_slowed * 100.0,
                cell(s.p99_elsewhere),
                window.client_us,
                window.server_us,
                window.other_us,
            );
            results[c].push(s);
        }
    }
    // Each contender's rounds: the median of each figure (the mean of the share that
    // succeeded).
    let med: Vec<Option<Summary>> = results
        .iter()
        .map(|r| {
            if r.is_empty() {
                return None;
            }
            let q = |k: usize| median_latency(r.iter().map(|s| s.q[k]).collect());
            let m = |f: fn(&Summary) -> f64| median(r.iter().map(f).collect(), f64::total_cmp);
            Some(Summary {
                q: [q(0), q(1), q(2)],
                ok: r.iter().map(|s| s.ok).sum::<f64>() / r.len() as f64,
                to_slowed: m(|s| s.to_slowed),
                p99_elsewhere: median_latency(r.iter().map(|s| s.p99_elsewhere).collect()),
                window: Window {
                    client_us: m(|s| s.window.client_us),
                    server_us: m(|s| s.window.server_us),
                    other_us: m(|s| s.window.other_us),
                    probes: m(|s| s.window.probes),
                    reached_slowed: m(|s| s.window.reached_slowed),
                },
            })
        })
        .collect();
    let p99 = |balancer: Balancer, reports: Reports| {
        contenders
            .iter()
            .position(|c| c.balancer == balancer && c.reports == reports)
            .and_then(|k| med[k].and_then(|m| m.q[1]))
    };
    let has_ref = |balancer: Balancer| {
        contenders
            .iter()
            .any(|c| c.balancer == balancer && c.reports == Reports::Reference)
    };
    // The best reference, for the contenders without one of their own.
    let best_ref = contenders
        .iter()
        .filter(|c| c.reports == Reports::Reference)
        .filter_map(|c| p99(c.balancer, Reports::Reference))
        .min();
    println!(
        "{:<32} {:>8} {:>9} {:>9} {:>9} {:>14} {:>10} {:>10} {:>14} {:>11} {:>10} {:>10}",
        "contender",
        "ok",
        "p50",
        "p99",
        "p99.9",
        "p99/no reports",
        "p99/ref",
        "to slowed",
        "p99 elsewhere",
        "probes/call",
        "CPU client",
        "CPU server"
    );
    for (k, c) in contenders.iter().enumerate() {
        let Some(Summary {
            q: [p50, p99c, p999],
            ok,
            to_slowed,
            p99_elsewhere,
            window,
        }) = med[k]
        else {
            continue;
        };
        let ratio = |base: Option<Duration>| match (p99c, base) {
            (Some(a), Some(b)) => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
            _ => "-".to_owned(),
        };
        let vs_none = match (c.balancer, c.reports) {
            // WRR without reports is round robin.
            (
                Balancer::Ours(Strategy::WeightedRoundRobin),
                Reports::PerCall | Reports::Oob | Reports::OobFast,
            ) => ratio(p99(Balancer::Ours(Strategy::RoundRobin), Reports::None)),
            (b, Reports::PerCall | Reports::Oob | Reports::OobFast) => ratio(p99(b, Reports::None)),
            _ => "-".to_owned(),
        };
        let vs_ref = match c.reports {
            Reports::Reference => "-".to_owned(),
            // Its own strategy's reference if it has one, else the best reference.
            _ if has_ref(c.balancer) => ratio(p99(c.balancer, Reports::Reference)),
            _ => ratio(best_ref),
        };
        println!(
            "{:<32} {:>7.2}% {:>9} {:>9} {:>9} {:>14} {:>10} {:>9.2}% {:>14} {:>11.2} {:>10.1} {:>10.1}",
            c.name(),
            ok * 100.0,
            cell(p50),
            cell(p99c),
            cell(p999),
            vs_none,
            vs_ref,
            to_slowed * 100.0,
            cell(p99_elsewhere),
            window.probes,
            window.client_us,
            window.server_us
        );
    }
}
