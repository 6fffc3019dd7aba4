//! The shootout's `many-clients` scenario: many independent clients, each seeing only
//! its own slice of every instance's load, and what server-reported load (ORCA) adds.
//!
//! 20 instances (tonic servers with `OrcaLayer` and `OobService`), whose service time grows with
//! the calls they serve (5 ms + 2 ms per other call in flight); 4 of them (i0, i5, i10, i15)
//! slow down 3x (15 ms + 6 ms per call) for 2 s at random moments, an antagonist on their host
//! (one episode each per measured window, at times drawn once from a fixed seed, so that every
//! contender meets the same ones). Each instance reports as utilization its rate times its
//! current service time over 4 workers, as a CPU gauge would see it.
//!
//! The load: 2,000 calls/s in all, open loop, each call from one of 50 independent channels
//! drawn at random (50 clients, each with a connection to every instance, opened before the
//! run), 1 s deadline;
//! latency from each call's scheduled start. A contender is a strategy and what its clients do
//! with reports:
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
//!   client takes a slowed instance out of its set at the first instant of its slowdown and
//!   puts it back after: what knowing at once which instances are slow, and nothing of the
//!   others' calls in flight, can do at best;
//!
//! and weighted round robin (blackout 1 s, weights rebuilt every 250 ms) on per-call and on
//! out-of-band reports. Besides the latencies, the table gives the share of the calls answered
//! by an instance while it was slowed (`to slowed`; a fair share is 8%) and the p99 of the
//! calls answered by the others (`p99 elsewhere`): where the p99 comes from. Each contender gets
//! a fresh set of channels, 1.5 s of warm-up at the same rate, then 5 s measured; the order of
//! the contenders rotates from one round to the next (`--rounds`, default 1), and with several
//! rounds each cell is the median of its rounds.
//!
//! Run it alone:
//! `cargo run --release --features orca --example shootout -- --scenario many-clients`;
//! `MANY_CLIENTS_ONLY=oracle,LeastPending` runs only the contenders whose name contains one of
//! those.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fleet::pb::fleet_client::FleetClient;
use super::fleet::pb::Req;
use super::fleet::{Behavior, Instance, ServerOptions};
use tonic_balancer::orca::{OrcaHandle, WrrConfig};
use tonic_balancer::{BalancedChannel, Strategy};

/// The scenario's name for `--scenario`.
pub const KEY: &str = "many-clients";

const INSTANCES: usize = 20;
const CLIENTS: usize = 50;
const RATE: f64 = 2000.0;
const WARMUP: Duration = Duration::from_millis(1500);
const MEASURED: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(1);
/// The antagonised instances.
const SLOWED: [usize; 4] = [0, 5, 10, 15];
const EPISODE: Duration = Duration::from_secs(2);
const BASE: Duration = Duration::from_millis(5);
const PER_CALL: Duration = Duration::from_millis(2);
const SLOWDOWN: u32 = 3;
/// The workers a server's utilization is counted over.
const WORKERS: f64 = 4.0;
const OOB_INTERVAL: Duration = Duration::from_secs(1);
const OOB_FAST: Duration = Duration::from_millis(100);
const SEED: u64 = 0x5eed_0012;

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
    /// No reports, but every client takes a slowed instance out of its set for the whole of
    /// its slowdown, at its first instant, and puts it back after (a contender beyond the
    /// usual ones, knowing what no client can): the best that spreading the calls without
    /// knowing each instance's calls in flight can do.
    Oracle,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Contender {
    strategy: Strategy,
    reports: Reports,
}

const CONTENDERS: [Contender; 13] = [
    Contender {
        strategy: Strategy::LeastPending,
        reports: Reports::None,
    },
    Contender {
        strategy: Strategy::LeastPending,
        reports: Reports::PerCall,
    },
    Contender {
        strategy: Strategy::LeastPending,
        reports: Reports::Oob,
    },
    Contender {
        strategy: Strategy::LeastPending,
        reports: Reports::OobFast,
    },
    Contender {
        strategy: Strategy::LeastPending,
        reports: Reports::Reference,
    },
    Contender {
        strategy: Strategy::LeastPending,
        reports: Reports::Oracle,
    },
    Contender {
        strategy: Strategy::PeakEwma,
        reports: Reports::None,
    },
    Contender {
        strategy: Strategy::PeakEwma,
        reports: Reports::PerCall,
    },
    Contender {
        strategy: Strategy::PeakEwma,
        reports: Reports::Oob,
    },
    Contender {
        strategy: Strategy::PeakEwma,
        reports: Reports::Reference,
    },
    Contender {
        strategy: Strategy::RoundRobin,
        reports: Reports::None,
    },
    Contender {
        strategy: Strategy::WeightedRoundRobin,
        reports: Reports::PerCall,
    },
    Contender {
        strategy: Strategy::WeightedRoundRobin,
        reports: Reports::Oob,
    },
];

impl Contender {
    fn name(self) -> String {
        let s = match self.strategy {
            Strategy::LeastPending => "LeastPending",
            Strategy::PeakEwma => "PeakEwma",
            Strategy::RoundRobin => "RoundRobin",
            Strategy::WeightedRoundRobin => "WRR",
            _ => "?",
        };
        let r = match self.reports {
            Reports::None => "none",
            Reports::PerCall => "per-call",
            Reports::Oob => "oob 1s",
            Reports::OobFast => "oob 100ms",
            Reports::Reference => "ref 1 channel",
            Reports::Oracle => "oracle",
        };
        format!("{s}, {r}")
    }

    /// Its channels (connected). Within the client runtime.
    async fn channels(self, uris: &[String]) -> Vec<BalancedChannel> {
        let n = if self.reports == Reports::Reference {
            1
        } else {
            CLIENTS
        };
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut b = BalancedChannel::builder().uris(uris);
            b = match self.strategy {
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
            };
            out.push(b.connect().await.expect("the fleet answers"));
        }
        out
    }
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

fn normal() -> Behavior {
    Behavior::Overload {
        base: BASE,
        per_call: PER_CALL,
    }
}

fn slowed() -> Behavior {
    Behavior::Overload {
        base: BASE * SLOWDOWN,
        per_call: PER_CALL * SLOWDOWN,
    }
}

/// The fleet: instances with their load handles, and each one's current service time (µs).
struct Servers {
    instances: Vec<Instance>,
    handles: Vec<OrcaHandle>,
    base_us: Vec<AtomicU64>,
}

impl Servers {
    fn start() -> Servers {
        let mut instances = Vec::new();
        let mut handles = Vec::new();
        for i in 0..INSTANCES {
            let handle = OrcaHandle::new();
            instances.push(Instance::start_with(
                &format!("i{i}"),
                "127.0.0.1:0".parse().unwrap(),
                normal(),
                ServerOptions {
                    orca: Some(handle.clone()),
                    orca_oob: Some(OOB_FAST),
                    ..Default::default()
                },
            ));
            handles.push(handle);
        }
        let base_us = (0..INSTANCES)
            .map(|_| AtomicU64::new(BASE.as_micros() as u64))
            .collect();
        Servers {
            instances,
            handles,
            base_us,
        }
    }

    fn slow(&self, i: usize, on: bool) {
        let (b, base) = if on {
            (slowed(), BASE * SLOWDOWN)
        } else {
            (normal(), BASE)
        };
        self.instances[i].set(b);
        self.base_us[i].store(base.as_micros() as u64, Ordering::Relaxed);
    }

    fn per_call_reports(&self, on: bool) {
        for inst in &self.instances {
            inst.shared.orca_per_call_off.store(!on, Ordering::SeqCst);
        }
    }

    /// Utilization as a CPU gauge would see it: the rate times the service time, over the
    /// workers.
    fn update_utilization(&self) {
        for (i, h) in self.handles.iter().enumerate() {
            let rps = h.report().rps_fractional;
            let base = self.base_us[i].load(Ordering::Relaxed) as f64 * 1e-6;
            h.set_application_utilization((rps * base / WORKERS).max(0.001));
        }
    }
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
    /// Whether it was answered by an instance while that instance was slowed.
    fn on_slowed(&self, episodes: &[(usize, Duration)]) -> bool {
        episodes
            .iter()
            .any(|&(i, from)| self.by == Some(i) && self.at >= from && self.at < from + EPISODE)
    }
}

/// One contender's measured calls.
async fn run_one(servers: &Arc<Servers>, uris: &[String], contender: Contender) -> Vec<Call> {
    // Without reports, the servers send none: what a user who does not turn them on has.
    servers.per_call_reports(contender.reports == Reports::PerCall);
    let channels = contender.channels(uris).await;
    let clients: Vec<_> = channels
        .iter()
        .map(|c| FleetClient::new(c.clone()))
        .collect();
    let warm = (RATE * WARMUP.as_secs_f64()) as usize;
    let total = warm + (RATE * MEASURED.as_secs_f64()) as usize;
    let start = Instant::now() + Duration::from_millis(20);
    let measured_from = start + WARMUP;
    // The antagonist, on the measured window's clock.
    let antagonist = {
        let servers = servers.clone();
        let oracle =
            (contender.reports == Reports::Oracle).then(|| (channels.clone(), uris.to_vec()));
        tokio::spawn(async move {
            let mut events: Vec<(Instant, usize, bool)> = episodes()
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
            let reply =
                tokio::time::timeout(DEADLINE + Duration::from_millis(100), client.unary(req))
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
    for &i in &SLOWED {
        servers.slow(i, false);
    }
    drop(clients);
    drop(channels);
    calls
}

/// What a contender's run measured.
#[derive(Clone, Copy)]
struct Summary {
    /// p50, p99, p99.9 (failures ranked above every success: `None`).
    q: [Option<Duration>; 3],
    /// The share of the calls that succeeded.
    ok: f64,
    /// The share of the calls answered by an instance while it was slowed (its fair share is
    /// 8%: 4 instances slowed 2 s each, of 20 instances for 5 s).
    to_slowed: f64,
    /// The p99 of the calls answered by an instance that was not slowed.
    p99_elsewhere: Option<Duration>,
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

fn summary(calls: &[Call]) -> Summary {
    let n = calls.len().max(1) as f64;
    let eps = episodes();
    let slowed = calls.iter().filter(|c| c.on_slowed(&eps)).count() as f64;
    // Answered by an instance that was not slowed (a failed call's instance is not known:
    // failures show in `ok`).
    let elsewhere = calls
        .iter()
        .filter(|c| c.by.is_some() && !c.on_slowed(&eps))
        .map(|c| c.latency)
        .collect();
    Summary {
        q: quantiles(calls.iter().map(|c| c.latency).collect()),
        ok: calls.iter().filter(|c| c.latency.is_some()).count() as f64 / n,
        to_slowed: slowed / n,
        p99_elsewhere: quantiles(elsewhere)[1],
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

/// Runs the scenario (`rounds` times every contender) and prints its table.
pub fn run(rounds: usize) {
    let servers = Arc::new(Servers::start());
    let uris: Vec<String> = servers.instances.iter().map(|i| i.uri()).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let updater = {
        let servers = servers.clone();
        rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                servers.update_utilization();
            }
        })
    };
    println!();
    println!(
        "{KEY}: {CLIENTS} clients (independent channels), {RATE:.0} calls/s in all, open loop, {INSTANCES} instances of 5 ms + 2 ms per other call in flight; i0, i5, i10, i15 3x slower for 2 s each at random moments; {:.1} s measured (+{:.1} s warm-up) per contender, {rounds} round(s), deadline 1 s; latency in ms from the scheduled start, 'fail' = the percentile falls on failed calls",
        MEASURED.as_secs_f64(),
        WARMUP.as_secs_f64()
    );
    let episodes: Vec<String> = episodes()
        .iter()
        .map(|(i, at)| format!("i{i} at {:.2} s", at.as_secs_f64()))
        .collect();
    println!(
        "slow episodes (from the start of the measured window): {}",
        episodes.join(", ")
    );
    let mut results: Vec<Vec<Summary>> = vec![Vec::new(); CONTENDERS.len()];
    // MANY_CLIENTS_ONLY=a,b: only the contenders whose name contains one of these.
    let only: Vec<String> = std::env::var("MANY_CLIENTS_ONLY")
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    for round in 0..rounds {
        for j in 0..CONTENDERS.len() {
            let c = (j + round * 3) % CONTENDERS.len();
            let name = CONTENDERS[c].name();
            if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
                continue;
            }
            let calls = rt.block_on(run_one(&servers, &uris, CONTENDERS[c]));
            let s = summary(&calls);
            eprintln!(
                "  round {} {:<26} p50 {:>7} p99 {:>7}  to slowed {:>5.2}%  p99 elsewhere {:>7}",
                round + 1,
                CONTENDERS[c].name(),
                cell(s.q[0]),
                cell(s.q[1]),
                s.to_slowed * 100.0,
                cell(s.p99_elsewhere),
            );
            results[c].push(s);
        }
    }
    updater.abort();
    // Each contender's rounds: the median of each figure (the mean of the share that
    // succeeded).
    let med: Vec<Option<Summary>> = results
        .iter()
        .map(|r| {
            if r.is_empty() {
                return None;
            }
            let q = |k: usize| median_latency(r.iter().map(|s| s.q[k]).collect());
            Some(Summary {
                q: [q(0), q(1), q(2)],
                ok: r.iter().map(|s| s.ok).sum::<f64>() / r.len() as f64,
                to_slowed: median(r.iter().map(|s| s.to_slowed).collect(), f64::total_cmp),
                p99_elsewhere: median_latency(r.iter().map(|s| s.p99_elsewhere).collect()),
            })
        })
        .collect();
    let p99 = |strategy: Strategy, reports: Reports| {
        CONTENDERS
            .iter()
            .position(|c| c.strategy == strategy && c.reports == reports)
            .and_then(|k| med[k].and_then(|m| m.q[1]))
    };
    println!(
        "{:<28} {:>8} {:>9} {:>9} {:>9} {:>14} {:>10} {:>10} {:>14}",
        "contender",
        "ok",
        "p50",
        "p99",
        "p99.9",
        "p99/no reports",
        "p99/ref",
        "to slowed",
        "p99 elsewhere"
    );
    for (k, c) in CONTENDERS.iter().enumerate() {
        let Some(Summary {
            q: [p50, p99c, p999],
            ok,
            to_slowed,
            p99_elsewhere,
        }) = med[k]
        else {
            continue;
        };
        let ratio = |base: Option<Duration>| match (p99c, base) {
            (Some(a), Some(b)) => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
            _ => "-".to_owned(),
        };
        let vs_none = match c.reports {
            Reports::PerCall | Reports::Oob | Reports::OobFast => ratio(match c.strategy {
                // WRR without reports is round robin.
                Strategy::WeightedRoundRobin => p99(Strategy::RoundRobin, Reports::None),
                s => p99(s, Reports::None),
            }),
            _ => "-".to_owned(),
        };
        let vs_ref = match c.reports {
            Reports::Reference => "-".to_owned(),
            _ => ratio(match c.strategy {
                Strategy::LeastPending | Strategy::PeakEwma => p99(c.strategy, Reports::Reference),
                // No reference of their own: the best reference.
                _ => [
                    p99(Strategy::LeastPending, Reports::Reference),
                    p99(Strategy::PeakEwma, Reports::Reference),
                ]
                .into_iter()
                .flatten()
                .min(),
            }),
        };
        println!(
            "{:<28} {:>7.2}% {:>9} {:>9} {:>9} {:>14} {:>10} {:>9.2}% {:>14}",
            c.name(),
            ok * 100.0,
            cell(p50),
            cell(p99c),
            cell(p999),
            vs_none,
            vs_ref,
            to_slowed * 100.0,
            cell(p99_elsewhere)
        );
    }
}
