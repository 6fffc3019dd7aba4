//! The shootout: the same open-loop load, through each balancer in turn, against a fleet of
//! real local gRPC servers in which something goes wrong.
//!
//! ```text
//! cargo run --release --example shootout
//! cargo run --release --example shootout -- --scenario hang,heterogeneous --rate 2000 --duration 3
//! ```
//!
//! It starts a fleet of tonic servers on 127.0.0.1 (20 by default, each on a runtime of its
//! own) and, for each scenario, sends calls through each contender in turn: the four
//! strategies of `BalancedChannel`, tonic's `Channel::balance_list`, tower's p2c over
//! `PendingRequests` and over `PeakEwma`, and (with `--contender naive` or `all`) a naive
//! least-pending baseline. Between two
//! contenders the fleet is reset (behaviours set again, killed instances restarted, every call
//! of the previous contender over) and each contender gets a fresh channel. The order of the
//! contenders rotates from one scenario to the next, so that none always goes first.
//!
//! The load is open-loop: calls start on a fixed schedule (`--rate` per second), whether or not
//! the earlier ones have finished, and a call's latency counts from its *scheduled* start, so a
//! balancer that makes calls queue cannot hide it. Every call has a deadline (1 s,
//! `Request::set_timeout`, with a client-side backstop), so nothing waits forever. Each
//! contender first gets a short warm-up at the same rate (`--warmup`, not counted), so that
//! what is measured is the steady state rather than the opening of 20 connections.
//!
//! Per scenario it prints a table: the share of calls that succeeded, the latency
//! percentiles over *all* calls (a failed call ranks above every success: a percentile that
//! lands on failures prints as `fail`), the successful calls per second from the first call's
//! scheduled start to the end of the last successful one, and the share of the calls that reached the
//! misbehaving instances (from the servers' own counters). It writes the percentiles as an SVG
//! chart (`--svg`, default `target/shootout.svg`). Every number is measured in this run.

#[path = "../tests/fleet/mod.rs"]
mod fleet;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use fleet::{Behavior, Fleet, Shared};
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tonic_balancer::{BalancedChannel, Strategy};
use tower::load::{CompleteOnResponse, PeakEwma, PendingRequests};
use tower::util::BoxCloneService;
use tower::{BoxError, Service, ServiceExt};

/// What every contender is boxed into, so that one generated client type serves them all (the
/// box costs the same small allocation per call to each of them).
type Svc = BoxCloneService<http::Request<Body>, http::Response<Body>, BoxError>;

const FAST: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// Contenders

#[derive(Debug, Clone, Copy, PartialEq)]
enum Contender {
    Ours(Strategy),
    TonicBalanceList,
    TowerP2cPending,
    TowerP2cEwma,
    Naive,
}

const CONTENDERS: [Contender; 8] = [
    Contender::Ours(Strategy::LeastPending),
    Contender::Ours(Strategy::PeakEwma),
    Contender::Ours(Strategy::PowerOfTwoChoices),
    Contender::Ours(Strategy::RoundRobin),
    Contender::TonicBalanceList,
    Contender::TowerP2cPending,
    Contender::TowerP2cEwma,
    Contender::Naive,
];

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Ours(Strategy::LeastPending) => "LeastPending",
            Contender::Ours(Strategy::PeakEwma) => "PeakEwma",
            Contender::Ours(Strategy::PowerOfTwoChoices) => "PowerOfTwoChoices",
            Contender::Ours(Strategy::RoundRobin) => "RoundRobin",
            Contender::Ours(_) => "BalancedChannel(?)",
            Contender::TonicBalanceList => "tonic balance_list",
            Contender::TowerP2cPending => "tower p2c pending",
            Contender::TowerP2cEwma => "tower p2c PeakEwma",
            Contender::Naive => "naive least-pending",
        }
    }

    /// The command-line name.
    fn key(self) -> &'static str {
        match self {
            Contender::Ours(Strategy::LeastPending) => "least-pending",
            Contender::Ours(Strategy::PeakEwma) => "peak-ewma",
            Contender::Ours(Strategy::PowerOfTwoChoices) => "p2c",
            Contender::Ours(Strategy::RoundRobin) => "round-robin",
            Contender::Ours(_) => "other",
            Contender::TonicBalanceList => "tonic",
            Contender::TowerP2cPending => "tower-pending",
            Contender::TowerP2cEwma => "tower-ewma",
            Contender::Naive => "naive",
        }
    }

    /// A fresh channel over these addresses. Must run within the client runtime.
    fn build(self, uris: &[String]) -> Svc {
        let endpoints = || {
            uris.iter().map(|u| {
                Endpoint::from_shared(u.clone())
                    .expect("fleet URI")
                    .connect_timeout(CONNECT_TIMEOUT)
            })
        };
        match self {
            Contender::Ours(strategy) => {
                let ch = BalancedChannel::builder()
                    .endpoints(endpoints())
                    .strategy(strategy)
                    .build()
                    .expect("balanced channel");
                BoxCloneService::new(ch)
            }
            Contender::TonicBalanceList => {
                let ch = Channel::balance_list(endpoints());
                BoxCloneService::new(ch.map_err(BoxError::from))
            }
            Contender::TowerP2cPending => {
                let list: Vec<_> = endpoints()
                    .map(|e| PendingRequests::new(e.connect_lazy(), CompleteOnResponse::default()))
                    .collect();
                let discover = tower::discover::ServiceList::new::<http::Request<Body>>(list);
                let balance = tower::balance::p2c::Balance::new(discover);
                BoxCloneService::new(tower::buffer::Buffer::new(balance, 1024))
            }
            Contender::TowerP2cEwma => {
                // The same defaults as BalancedChannel's estimate: 1 ms before the first
                // sample, 1 s decay.
                let list: Vec<_> = endpoints()
                    .map(|e| {
                        PeakEwma::new(
                            e.connect_lazy(),
                            Duration::from_millis(1),
                            1e9,
                            CompleteOnResponse::default(),
                        )
                    })
                    .collect();
                let discover = tower::discover::ServiceList::new::<http::Request<Body>>(list);
                let balance = tower::balance::p2c::Balance::new(discover);
                BoxCloneService::new(tower::buffer::Buffer::new(balance, 1024))
            }
            Contender::Naive => BoxCloneService::new(Naive {
                channels: Arc::new(endpoints().map(|e| e.connect_lazy()).collect()),
                counts: Arc::new(Mutex::new(vec![0; uris.len()])),
            }),
        }
    }
}

/// The baseline a first attempt writes: a mutex around the counts, the first least-loaded
/// instance in a scan (ties all go to the lowest index), +1 before the call, -1 when its
/// response head arrives, no failure handling.
#[derive(Clone)]
struct Naive {
    channels: Arc<Vec<Channel>>,
    counts: Arc<Mutex<Vec<usize>>>,
}

struct NaiveGuard(Arc<Mutex<Vec<usize>>>, usize);

impl Drop for NaiveGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1] -= 1;
    }
}

impl Service<http::Request<Body>> for Naive {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let i = {
            let mut counts = self.counts.lock().unwrap();
            let i = (0..counts.len()).min_by_key(|&i| counts[i]).unwrap();
            counts[i] += 1;
            i
        };
        let guard = NaiveGuard(self.counts.clone(), i);
        let channel = self.channels[i].clone();
        Box::pin(async move {
            let _guard = guard;
            let resp = channel.oneshot(req).await?;
            Ok(resp)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    Uniform,
    Heterogeneous,
    FailFast,
    Unreachable,
    Hang,
    Overload,
    KillRestart,
}

const SCENARIOS: [Scenario; 7] = [
    Scenario::Uniform,
    Scenario::Heterogeneous,
    Scenario::FailFast,
    Scenario::Unreachable,
    Scenario::Hang,
    Scenario::Overload,
    Scenario::KillRestart,
];

const OVERLOAD_PER_CALL: Duration = Duration::from_millis(20);

/// What a scenario does to the fleet.
struct Setup {
    behaviors: Vec<Behavior>,
    uris: Vec<String>,
    /// The misbehaving instances (indices into the fleet), whose share of calls is reported.
    bad: Vec<usize>,
    /// Stop `bad[0]` at this fraction of the measured window, restart it at the second.
    kill: Option<(f64, f64)>,
}

impl Scenario {
    fn key(self) -> &'static str {
        match self {
            Scenario::Uniform => "uniform",
            Scenario::Heterogeneous => "heterogeneous",
            Scenario::FailFast => "fail-fast",
            Scenario::Unreachable => "unreachable",
            Scenario::Hang => "hang",
            Scenario::Overload => "overload",
            Scenario::KillRestart => "kill-restart",
        }
    }

    fn describe(self, n: usize) -> String {
        let k = fifth(n).len();
        match self {
            Scenario::Uniform => format!("all {n} instances answer in {}", ms(FAST)),
            Scenario::Heterogeneous => format!(
                "{k} of {n} instances answer in {}, the others in {}",
                ms(SLOW),
                ms(FAST)
            ),
            Scenario::FailFast => {
                format!("1 of {n} instances answers UNAVAILABLE at once, the others in {}", ms(FAST))
            }
            Scenario::Unreachable => format!(
                "2 of {n} addresses refuse connections, the others answer in {}",
                ms(FAST)
            ),
            Scenario::Hang => {
                format!("1 of {n} instances never answers, the others answer in {}", ms(FAST))
            }
            Scenario::Overload => format!(
                "{k} of {n} instances take {} + {} per call already in flight, the others {}",
                ms(FAST),
                ms(OVERLOAD_PER_CALL),
                ms(FAST)
            ),
            Scenario::KillRestart => format!(
                "1 of {n} instances is killed at 1/3 of the run and restarted at 2/3, all answer in {}",
                ms(FAST)
            ),
        }
    }

    fn setup(self, uris: &[String]) -> Setup {
        let n = uris.len();
        let mut behaviors = vec![Behavior::Delay(FAST); n];
        let mut uris = uris.to_vec();
        let mut kill = None;
        let bad = match self {
            Scenario::Uniform => vec![],
            Scenario::Heterogeneous => {
                let bad = fifth(n);
                for &i in &bad {
                    behaviors[i] = Behavior::Delay(SLOW);
                }
                bad
            }
            Scenario::FailFast => {
                behaviors[0] = Behavior::Fail(Code::Unavailable);
                vec![0]
            }
            Scenario::Unreachable => {
                // Their instances keep running but are not in the list: they serve nothing.
                for u in uris.iter_mut().take(2.min(n - 1)) {
                    *u = fleet::unreachable_uri();
                }
                vec![]
            }
            Scenario::Hang => {
                behaviors[0] = Behavior::Hang;
                vec![0]
            }
            Scenario::Overload => {
                let bad = fifth(n);
                for &i in &bad {
                    behaviors[i] = Behavior::Overload {
                        base: FAST,
                        per_call: OVERLOAD_PER_CALL,
                    };
                }
                bad
            }
            Scenario::KillRestart => {
                kill = Some((1.0 / 3.0, 2.0 / 3.0));
                vec![0]
            }
        };
        Setup {
            behaviors,
            uris,
            bad,
            kill,
        }
    }
}

/// A fifth of `0..n` (at least one), spread out.
fn fifth(n: usize) -> Vec<usize> {
    let k = (n / 5).max(1);
    (0..k).map(|j| j * n / k).collect()
}

// ---------------------------------------------------------------------------------------------
// The fleet's sockets

// ---------------------------------------------------------------------------------------------
// Options

struct Opts {
    scenarios: Vec<Scenario>,
    contenders: Vec<Contender>,
    rate: f64,
    duration: Duration,
    warmup: Duration,
    deadline: Duration,
    instances: usize,
    svg: String,
}

const USAGE: &str = "\
usage: cargo run --release --example shootout -- [options]

  --scenario NAME    uniform, heterogeneous, fail-fast, unreachable, hang, overload,
                     kill-restart; repeatable or a comma list (default: all)
  --contender NAME   least-pending, peak-ewma, p2c, round-robin, tonic, tower-pending,
                     tower-ewma, naive, or all; repeatable or a comma list
                     (default: all but naive)
  --rate N           calls per second, open loop (default 1000)
  --duration SECS    measured time per contender and scenario (default 1)
  --warmup SECS      unmeasured time at the same rate before it (default 0.15)
  --deadline-ms MS   each call's deadline (default 1000)
  --instances N      fleet size, at least 3 (default 20)
  --svg PATH         where the chart goes (default target/shootout.svg)
";

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        scenarios: vec![],
        contenders: vec![],
        rate: 1000.0,
        duration: Duration::from_secs(1),
        warmup: Duration::from_millis(150),
        deadline: Duration::from_secs(1),
        instances: 20,
        svg: "target/shootout.svg".to_owned(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let secs = |v: String, flag: &str| -> Result<Duration, String> {
            v.parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("{flag}: not a number of seconds: {v:?}"))
        };
        match flag.as_str() {
            "--scenario" => {
                for name in value()?.split(',').filter(|s| !s.is_empty()) {
                    let s = SCENARIOS
                        .into_iter()
                        .find(|s| s.key() == name)
                        .ok_or_else(|| format!("unknown scenario {name:?}"))?;
                    if !o.scenarios.contains(&s) {
                        o.scenarios.push(s);
                    }
                }
            }
            "--contender" => {
                for name in value()?.split(',').filter(|s| !s.is_empty()) {
                    if name == "all" {
                        for c in CONTENDERS {
                            if !o.contenders.contains(&c) {
                                o.contenders.push(c);
                            }
                        }
                        continue;
                    }
                    let c = CONTENDERS
                        .into_iter()
                        .find(|c| c.key() == name)
                        .ok_or_else(|| format!("unknown contender {name:?}"))?;
                    if !o.contenders.contains(&c) {
                        o.contenders.push(c);
                    }
                }
            }
            "--rate" => {
                let v = value()?;
                o.rate = v
                    .parse::<f64>()
                    .ok()
                    .filter(|r| r.is_finite() && *r > 0.0 && *r <= 1e6)
                    .ok_or_else(|| format!("--rate: not a rate in (0, 1e6]: {v:?}"))?;
            }
            "--duration" => o.duration = secs(value()?, "--duration")?,
            "--warmup" => o.warmup = secs(value()?, "--warmup")?,
            "--deadline-ms" => {
                let v = value()?;
                o.deadline = v
                    .parse::<u64>()
                    .ok()
                    .filter(|&d| d > 0)
                    .map(Duration::from_millis)
                    .ok_or_else(|| format!("--deadline-ms: not a positive integer: {v:?}"))?;
            }
            "--instances" => {
                let v = value()?;
                o.instances = v
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| (3..=1000).contains(&n))
                    .ok_or_else(|| format!("--instances: not a number in 3..=1000: {v:?}"))?;
            }
            "--svg" => o.svg = value()?,
            // `cargo bench` passes this to every target; harmless here.
            "--bench" => {}
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if o.duration.is_zero() {
        return Err("--duration must be above zero".to_owned());
    }
    if o.scenarios.is_empty() {
        o.scenarios = SCENARIOS.to_vec();
    }
    if o.contenders.is_empty() {
        // The naive baseline only on request, to keep the default run near a minute.
        o.contenders = CONTENDERS
            .into_iter()
            .filter(|&c| c != Contender::Naive)
            .collect();
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// One run: one scenario, one contender

/// The outcome of one measured call: its latency from its scheduled start, or its error code.
type CallResult = Result<Duration, Code>;

struct RunResult {
    calls: Vec<CallResult>,
    /// From the first measured call's scheduled start to the end of the last successful one
    /// (at least the measured window).
    span: Duration,
    /// Calls that reached each instance during the measured window.
    served: Vec<u64>,
    /// The latest the generator started a call after its scheduled time.
    max_lag: Duration,
}

struct Progress {
    done: usize,
    total: usize,
    started: Instant,
    tty: bool,
}

impl Progress {
    fn draw(&self, run_frac: f64, label: &str) {
        if !self.tty {
            return;
        }
        let frac = ((self.done as f64 + run_frac.clamp(0.0, 1.0)) / self.total as f64).min(1.0);
        let width = 30;
        let filled = (frac * width as f64).round() as usize;
        let elapsed = self.started.elapsed().as_secs_f64();
        let eta = if frac > 0.01 {
            format!("{:>3.0}s left", elapsed / frac - elapsed)
        } else {
            "    ...".to_owned()
        };
        eprint!(
            "\r[{}{}] {:>3}/{} {eta}  {label:<42}",
            "#".repeat(filled),
            "-".repeat(width - filled),
            self.done + 1,
            self.total,
        );
        let _ = std::io::stderr().flush();
    }

    fn clear(&self) {
        if self.tty {
            eprint!("\r{:<100}\r", "");
            let _ = std::io::stderr().flush();
        }
    }
}

/// Puts the fleet back in the scenario's state: every instance running, with its behaviour, and
/// no call of an earlier contender still in a handler.
fn reset(fleet: &Mutex<Fleet>, setup: &Setup) {
    let mut fleet = fleet.lock().unwrap();
    for (inst, b) in fleet.instances.iter_mut().zip(&setup.behaviors) {
        if !inst.is_running() {
            inst.restart();
        }
        inst.set(b.clone());
    }
    let start = Instant::now();
    while fleet.instances.iter().any(|i| i.active() > 0) {
        if start.elapsed() > Duration::from_secs(5) {
            eprintln!("warning: calls of the previous contender still in the servers after 5 s");
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

async fn run_one(
    contender: Contender,
    setup: &Setup,
    fleet: &Arc<Mutex<Fleet>>,
    shared: &[Arc<Shared>],
    opts: &Opts,
    progress: &Progress,
    label: &str,
) -> RunResult {
    let client = FleetClient::new(contender.build(&setup.uris));
    let period = Duration::from_secs_f64(1.0 / opts.rate);
    let warmup_calls = (opts.warmup.as_secs_f64() * opts.rate).round() as u64;
    let measured_calls = ((opts.duration.as_secs_f64() * opts.rate).round() as u64).max(1);
    let total = warmup_calls + measured_calls;
    let t0 = tokio::time::Instant::now() + Duration::from_millis(5);
    let measure_start = t0 + period * warmup_calls as u32;
    let deadline = opts.deadline;

    // Kill and restart on a thread of their own (stopping an instance joins its thread).
    let killer = setup.kill.map(|(at_stop, at_restart)| {
        let fleet = fleet.clone();
        let victim = setup.bad[0];
        let stop_at = measure_start.into_std() + opts.duration.mul_f64(at_stop);
        let restart_at = measure_start.into_std() + opts.duration.mul_f64(at_restart);
        std::thread::spawn(move || {
            std::thread::sleep(stop_at.saturating_duration_since(Instant::now()));
            fleet.lock().unwrap().instances[victim].stop();
            std::thread::sleep(restart_at.saturating_duration_since(Instant::now()));
            fleet.lock().unwrap().instances[victim].restart();
        })
    });

    let served = |shared: &[Arc<Shared>]| -> Vec<u64> {
        shared
            .iter()
            .map(|s| s.served.load(Ordering::SeqCst))
            .collect()
    };
    let mut served_before = None;
    let mut handles = Vec::with_capacity(total as usize);
    let mut max_lag = Duration::ZERO;
    let mut last_draw = Instant::now();
    let mut i = 0u64;
    while i < total {
        let now = tokio::time::Instant::now();
        while i < total {
            let sched = t0 + period * i as u32;
            if sched > now {
                break;
            }
            let measured = i >= warmup_calls;
            if measured && served_before.is_none() {
                served_before = Some(served(shared));
            }
            if measured {
                max_lag = max_lag.max(now - sched);
            }
            let mut client = client.clone();
            let id = i;
            handles.push(tokio::spawn(async move {
                let mut req = tonic::Request::new(Req {
                    id,
                    count: 0,
                    payload: Vec::new(),
                });
                req.set_timeout(deadline);
                // A backstop past the deadline, for a call stuck where `grpc-timeout` does not
                // reach (such as a queue in front of the channel).
                let r = tokio::time::timeout(
                    deadline + Duration::from_millis(50),
                    unary(&mut client, req),
                )
                .await;
                let end = tokio::time::Instant::now();
                let result = match r {
                    Ok(Ok(_)) => Ok(end - sched),
                    Ok(Err(status)) => Err(status.code()),
                    Err(_) => Err(Code::DeadlineExceeded),
                };
                (measured, result, end)
            }));
            i += 1;
        }
        if last_draw.elapsed() > Duration::from_millis(100) {
            let frac = (now.saturating_duration_since(t0)).as_secs_f64()
                / (opts.warmup + opts.duration).as_secs_f64();
            progress.draw(frac, label);
            last_draw = Instant::now();
        }
        if i < total {
            tokio::time::sleep_until(t0 + period * i as u32).await;
        }
    }
    drop(client);
    progress.draw(1.0, &format!("{label} (last calls)"));

    let mut calls = Vec::with_capacity(measured_calls as usize);
    let mut last_end = measure_start;
    for h in handles {
        let (measured, result, end) = h.await.expect("call task");
        if measured {
            if result.is_ok() {
                last_end = last_end.max(end);
            }
            calls.push(result);
        }
    }
    if let Some(k) = killer {
        k.join().expect("kill thread");
    }
    let after = served(shared);
    let before = served_before.unwrap_or_else(|| after.clone());
    RunResult {
        calls,
        span: (last_end - measure_start).max(opts.duration),
        served: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        max_lag,
    }
}

/// One unary call, boxed as a `Send` future: spawning the generated client's future directly
/// trips a rustc limitation on higher-ranked lifetimes ("implementation of `From` is not
/// general enough").
fn unary(
    client: &mut FleetClient<Svc>,
    req: tonic::Request<Req>,
) -> futures::future::BoxFuture<'_, Result<tonic::Response<fleet::pb::Reply>, tonic::Status>> {
    Box::pin(client.unary(req))
}

// ---------------------------------------------------------------------------------------------
// Statistics

struct Row {
    contender: Contender,
    ok_pct: f64,
    /// p50, p99, p99.9; `None` where the percentile lands on failed calls.
    pcts: [Option<Duration>; 3],
    ok_per_sec: f64,
    bad_share: Option<f64>,
    errors: BTreeMap<String, usize>,
    calls: usize,
    max_lag: Duration,
}

const QUANTILES: [f64; 3] = [0.50, 0.99, 0.999];
const QUANTILE_NAMES: [&str; 3] = ["p50", "p99", "p99.9"];

fn summarize(contender: Contender, run: &RunResult, bad: &[usize]) -> Row {
    let n = run.calls.len();
    let mut lat: Vec<Option<Duration>> = run.calls.iter().map(|r| r.ok()).collect();
    // Failures (None) rank after every success.
    lat.sort_by_key(|l| (l.is_none(), *l));
    let ok = lat.iter().filter(|l| l.is_some()).count();
    let pcts = QUANTILES.map(|q| {
        let idx = ((q * n as f64).ceil() as usize).clamp(1, n) - 1;
        lat[idx]
    });
    let mut errors = BTreeMap::new();
    for r in &run.calls {
        if let Err(code) = r {
            *errors.entry(format!("{code:?}")).or_insert(0) += 1;
        }
    }
    let total_served: u64 = run.served.iter().sum();
    let bad_share = (!bad.is_empty() && total_served > 0).then(|| {
        bad.iter().map(|&i| run.served[i]).sum::<u64>() as f64 / total_served as f64 * 100.0
    });
    Row {
        contender,
        ok_pct: ok as f64 / n as f64 * 100.0,
        pcts,
        ok_per_sec: ok as f64 / run.span.as_secs_f64().max(1e-9),
        bad_share,
        errors,
        calls: n,
        max_lag: run.max_lag,
    }
}

fn ms(d: Duration) -> String {
    let m = d.as_secs_f64() * 1e3;
    if m >= 100.0 {
        format!("{m:.0} ms")
    } else if m >= 10.0 {
        format!("{m:.1} ms")
    } else {
        format!("{m:.2} ms")
    }
}

fn pct_cell(p: Option<Duration>) -> String {
    p.map(ms).unwrap_or_else(|| "fail".to_owned())
}

fn print_table(scenario: Scenario, rows: &[Row], bad: &[usize], opts: &Opts) {
    let n = opts.instances;
    println!();
    println!(
        "== {}: {} ({:.0} calls/s, {:.1} s per contender, deadline {})",
        scenario.key(),
        scenario.describe(n),
        opts.rate,
        opts.duration.as_secs_f64(),
        ms(opts.deadline),
    );
    let bad_head = if bad.is_empty() {
        "to bad".to_owned()
    } else {
        format!("to bad (fair {:.1}%)", bad.len() as f64 / n as f64 * 100.0)
    };
    println!(
        "{:<20} {:>7} {:>9} {:>9} {:>9} {:>7}  {:>19}  errors",
        "contender", "ok %", "p50", "p99", "p99.9", "ok/s", bad_head
    );
    for r in rows {
        let bad_cell = match r.bad_share {
            Some(s) => format!("{s:.1}%"),
            None => "-".to_owned(),
        };
        let errors = if r.errors.is_empty() {
            String::new()
        } else {
            let mut e: Vec<_> = r.errors.iter().collect();
            e.sort_by(|a, b| b.1.cmp(a.1));
            e.iter()
                .map(|(code, k)| format!("{k} {code}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "{:<20} {:>7.2} {:>9} {:>9} {:>9} {:>7.0}  {:>19}  {}",
            r.contender.name(),
            r.ok_pct,
            pct_cell(r.pcts[0]),
            pct_cell(r.pcts[1]),
            pct_cell(r.pcts[2]),
            r.ok_per_sec,
            bad_cell,
            errors
        );
    }
    let lag = rows.iter().map(|r| r.max_lag).max().unwrap_or_default();
    if lag > Duration::from_millis(20) {
        println!(
            "(note: the load generator started some calls up to {} late; their latency counts from the scheduled start)",
            ms(lag)
        );
    }
    let _ = std::io::stdout().flush();
}

// ---------------------------------------------------------------------------------------------
// SVG

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn svg(results: &[(Scenario, Vec<Row>)], opts: &Opts) -> String {
    const W: f64 = 1100.0;
    const PANEL_H: f64 = 250.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 60.0;
    const COLORS: [&str; 3] = ["#9ecae1", "#4292c6", "#08306b"];
    let plot_top = 34.0;
    let plot_h = 160.0;
    let lo = 1.0f64; // ms
    let hi = (opts.deadline.as_secs_f64() * 1e3 * 2.0).max(10.0);
    let y = |v_ms: f64| -> f64 {
        let f = (v_ms.clamp(lo, hi).log10() - lo.log10()) / (hi.log10() - lo.log10());
        plot_top + plot_h * (1.0 - f)
    };
    let h = TOP + PANEL_H * results.len() as f64 + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="22" font-size="16" font-weight="bold">tonic-balancer shootout: latency from scheduled start, per contender (log scale)</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="40" fill="#666">{} instances, {:.0} calls/s open loop, {:.1} s per contender, deadline {}; red = the percentile falls on failed calls</text>"##,
        opts.instances,
        opts.rate,
        opts.duration.as_secs_f64(),
        esc(&ms(opts.deadline))
    );
    for (qi, name) in QUANTILE_NAMES.iter().enumerate() {
        let x = W - RIGHT - 220.0 + qi as f64 * 70.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40">{name}</text>"#,
            COLORS[qi],
            x + 16.0
        );
    }
    for (pi, (scenario, rows)) in results.iter().enumerate() {
        let oy = TOP + PANEL_H * pi as f64;
        let _ = writeln!(s, r#"<g transform="translate(0,{oy})">"#);
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{}</text><text x="{}" y="16" fill="#666">{}</text>"##,
            esc(scenario.key()),
            // Bold 13 px text is about 8 px a character.
            LEFT + 20.0 + 8.5 * scenario.key().len() as f64,
            esc(&scenario.describe(opts.instances))
        );
        // Grid and axis labels.
        let mut tick = 1.0;
        while tick <= hi {
            let ty = y(tick);
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" x2="{}" y1="{ty:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end" fill="#666">{}</text>"##,
                W - RIGHT,
                LEFT - 6.0,
                ty + 4.0,
                if tick >= 1000.0 {
                    format!("{} s", tick / 1000.0)
                } else {
                    format!("{tick} ms")
                }
            );
            tick *= 10.0;
        }
        let dl = y(opts.deadline.as_secs_f64() * 1e3);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{dl:.1}" y2="{dl:.1}" stroke="#d62728" stroke-dasharray="4 3"/><text x="{}" y="{:.1}" text-anchor="end" fill="#d62728">deadline</text>"##,
            W - RIGHT,
            W - RIGHT,
            dl - 3.0
        );
        let group_w = (W - LEFT - RIGHT) / rows.len().max(1) as f64;
        let bar_w = (group_w * 0.7 / 3.0).min(22.0);
        for (ci, row) in rows.iter().enumerate() {
            let gx = LEFT + group_w * ci as f64;
            let x0 = gx + (group_w - bar_w * 3.0) / 2.0;
            for (qi, p) in row.pcts.iter().enumerate() {
                let x = x0 + bar_w * qi as f64;
                let (top, fill, title) = match p {
                    Some(d) => {
                        let v = d.as_secs_f64() * 1e3;
                        (
                            y(v),
                            COLORS[qi],
                            format!("{}: {}", QUANTILE_NAMES[qi], ms(*d)),
                        )
                    }
                    None => (
                        y(hi),
                        "#d62728",
                        format!("{}: failed calls", QUANTILE_NAMES[qi]),
                    ),
                };
                let base = plot_top + plot_h;
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{fill}"><title>{} {}</title></rect>"#,
                    bar_w - 1.0,
                    (base - top).max(0.5),
                    esc(row.contender.name()),
                    esc(&title)
                );
            }
            let cx = gx + group_w / 2.0;
            let _ = writeln!(
                s,
                r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="{}">ok {:.2}%</text>"##,
                plot_top + plot_h + 15.0,
                esc(row.contender.name()),
                plot_top + plot_h + 29.0,
                if row.ok_pct < 99.9 {
                    "#d62728"
                } else {
                    "#2ca02c"
                },
                row.ok_pct
            );
        }
        let _ = writeln!(s, "</g>");
    }
    let _ = writeln!(s, "</svg>");
    s
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let n = opts.instances;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    println!(
        "tonic-balancer shootout: {n} local instances, {:.0} calls/s open loop, {:.1} s measured (+{:.2} s warm-up) per contender and scenario, deadline {}, {} scenarios x {} contenders, {cores} cores",
        opts.rate,
        opts.duration.as_secs_f64(),
        opts.warmup.as_secs_f64(),
        ms(opts.deadline),
        opts.scenarios.len(),
        opts.contenders.len(),
    );
    println!("latency: from each call's scheduled start, over all calls; a failed call ranks above every success ('fail' = the percentile falls on failed calls)");
    println!("errors: the status each client got (tonic's own deadline timer reports CANCELLED, BalancedChannel's DEADLINE_EXCEEDED)");
    println!("ok/s: successful calls per second, from the first call's scheduled start to the end of the last successful one (at least the measured time); 'to bad': share of the calls that reached the misbehaving instances (server-side counts)");

    let fleet = Fleet::start(n, Behavior::Delay(FAST));
    let shared: Vec<Arc<Shared>> = fleet.instances.iter().map(|i| i.shared.clone()).collect();
    let uris = fleet.uris();
    let fleet = Arc::new(Mutex::new(fleet));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("client runtime");

    let mut progress = Progress {
        done: 0,
        total: opts.scenarios.len() * opts.contenders.len(),
        started: Instant::now(),
        tty: std::io::stderr().is_terminal(),
    };
    let started = Instant::now();
    let mut results = Vec::new();
    for (si, &scenario) in opts.scenarios.iter().enumerate() {
        let setup = scenario.setup(&uris);
        let k = opts.contenders.len();
        let mut rows: Vec<Option<Row>> = (0..k).map(|_| None).collect();
        // Rotate the order from one scenario to the next.
        for j in 0..k {
            let ci = (j + si) % k;
            let contender = opts.contenders[ci];
            reset(&fleet, &setup);
            let label = format!("{} / {}", scenario.key(), contender.name());
            progress.draw(0.0, &label);
            let run = rt.block_on(run_one(
                contender, &setup, &fleet, &shared, &opts, &progress, &label,
            ));
            rows[ci] = Some(summarize(contender, &run, &setup.bad));
            progress.done += 1;
        }
        progress.clear();
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|r| r.expect("every contender ran"))
            .collect();
        print_table(scenario, &rows, &setup.bad, &opts);
        results.push((scenario, rows));
    }
    progress.clear();
    drop(rt);

    let chart = svg(&results, &opts);
    let path = std::path::Path::new(&opts.svg);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(path, chart) {
        Ok(()) => println!("\nchart: {}", path.display()),
        Err(e) => eprintln!("\ncould not write {}: {e}", path.display()),
    }
    let calls: usize = results
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| r.calls))
        .sum();
    println!(
        "{calls} measured calls in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
