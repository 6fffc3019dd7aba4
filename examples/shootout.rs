//! The shootout: the same load, through each balancer in turn, against a fleet of real local
//! gRPC servers in which something goes wrong.
//!
//! ```text
//! cargo run --release --example shootout
//! cargo run --release --example shootout -- --scenario hang,heterogeneous --rate 2000 --duration 3
//! cargo run --release --example shootout -- --scenario low-concurrency,mixed-methods
//! cargo run --release --example shootout -- --sweep
//! ```
//!
//! It starts a fleet of tonic servers on 127.0.0.1 (20 by default, each on a runtime of its
//! own) and, for each scenario, sends calls through each contender in turn: the four
//! strategies of `BalancedChannel`, tonic's `Channel::balance_list`, tower's p2c over
//! `PendingRequests` and over `PeakEwma`, and (with `--contender naive` or `all`) a naive
//! least-pending baseline. Between two contenders the fleet is reset (behaviours set again,
//! killed instances restarted, every call of the previous contender over, a cold start armed
//! again) and each contender gets a fresh channel. The order of the contenders rotates from one
//! scenario to the next, so that none always goes first.
//!
//! The scenarios: `uniform` (every instance answers in 5 ms), `heterogeneous` (a fifth of them
//! in 100 ms), `fail-fast` (one answers UNAVAILABLE at once), `unreachable` (two addresses
//! refuse connections), `hang` (one never answers), `overload` (a fifth take 5 ms + 20 ms per
//! call already in flight), `kill-restart` (one is killed at 1/3 of the run and restarted at
//! 2/3), and two that report each instance's share of the calls:
//!
//! - `low-concurrency`: one caller, one call at a time (closed loop: the next call starts when
//!   the previous one has ended, and a call's latency counts from its start), over 5 of the
//!   fleet's instances (i0 to i4), all answering in 5 ms, of which i0 answers its first 3 calls
//!   in 50 ms (a cold start). The cold start is counted from the reset before each contender
//!   (`Instance::cold_start`, on the server's own count of calls served), and this scenario has
//!   no warm-up: the measured run starts with the fresh channel and sees the cold start. It runs
//!   for `--duration`, at least 2 s. Does every instance get its share (at least half of it)?
//! - `mixed-methods`: every instance answers Unary in 5 ms and ClientStream (one message) in
//!   100 ms, and one call in 10 is a ClientStream call (a fixed pseudo-random choice, the same
//!   calls for every contender): a service whose methods differ 20x in cost, on two methods that
//!   a per-method estimate could tell apart. Open loop at `--rate`, for `--duration`, at least
//!   2 s. Its table adds the p99 of the Unary calls alone.
//!
//! - `stalls`: every instance answers in 5 ms, but each call stalls for 500 ms with 2%
//!   probability, on any instance alike (no pick can route around it). It always runs two
//!   contenders: LeastPending, and LeastPending with hedging (`HedgingPolicy` on Unary, 3
//!   attempts at most) whose delay is the p95 of the calls that did not stall in an unmeasured
//!   run without hedging just before (printed). Its table adds the extra attempts (calls that
//!   reached the servers beyond one per call, server-side counts) and checks issue 13's target:
//!   p99 cut at least 5x, at most 10% extra attempts.
//!
//! For low-concurrency and mixed-methods, the table gives the least share over the fair one (`min/fair`), the share
//! farthest from the fair one as a deviation from it (`max dev`, in %), and below it each
//! instance's share of the calls (server-side counts).
//!
//! The load of the other scenarios is open-loop: calls start on a fixed schedule (`--rate` per
//! second), whether or not the earlier ones have finished, and a call's latency counts from its
//! *scheduled* start, so a balancer that makes calls queue cannot hide it. Every call has a
//! deadline (1 s, `Request::set_timeout`, with a client-side backstop), so nothing waits
//! forever. Each contender first gets a short warm-up at the same rate (`--warmup`, not
//! counted), so that what is measured is the steady state rather than the opening of 20
//! connections.
//!
//! Per scenario it prints a table: the share of calls that succeeded, the latency
//! percentiles over *all* calls (a failed call ranks above every success: a percentile that
//! lands on failures prints as `fail`), the successful calls per second from the first call's
//! scheduled start to the end of the last successful one, and the share of the calls that
//! reached the misbehaving instances (from the servers' own counters). It writes the
//! percentiles as an SVG chart (`--svg`, default `target/shootout.svg`).
//!
//! `--sweep` runs the load sweep instead (not part of the default run): `heterogeneous` and
//! `overload` (or the open-loop scenarios named by `--scenario`) at 500, 1,000, 2,000, 3,000 and
//! 4,000 calls/s (`--rates`), every contender at every rate, 2 s measured per contender and rate
//! (`--duration`) after the warm-up. It prints a table per scenario (rows: contenders, columns:
//! rates, cells: p99) and writes a line chart per scenario of p99 against the rate, one line per
//! contender, a p99 on failed calls drawn clipped in a `fail` band at the top
//! (`--svg`, default `target/sweep.svg`). Every number is measured in the run.
//!
//! `--live` shows the balancer at work instead (examples/support/live.rs): per instance, its
//! state, calls in flight as a bar, share of the calls and latency estimate, redrawn eight times
//! a second while an instance is killed and another hangs (or while the `--scenario`s named
//! run), through `BalancedChannel` only (`--contender`: one of ours or several, in turn).

#[path = "../tests/fleet/mod.rs"]
mod fleet;
#[path = "support/live.rs"]
mod live;
#[cfg(feature = "orca")]
#[path = "shootout/many_clients.rs"]
mod many_clients;
#[path = "shootout/streams.rs"]
mod streams;

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
use tonic_balancer::{BalancedChannel, HedgingPolicy, Strategy};
use tower::load::{CompleteOnResponse, PeakEwma, PendingRequests};
use tower::util::BoxCloneService;
use tower::{BoxError, Service, ServiceExt};

/// What every contender is boxed into, so that one generated client type serves them all (the
/// box costs the same small allocation per call to each of them).
type Svc = BoxCloneService<http::Request<Body>, http::Response<Body>, BoxError>;

const FAST: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// low-concurrency: the instances it uses, the cold instance's first calls and their time.
const LOW_CONCURRENCY_INSTANCES: usize = 5;
const COLD_CALLS: u64 = 3;
const COLD: Duration = Duration::from_millis(50);
/// mixed-methods: the expensive method's time and one call in this many goes to it.
const COSTLY: Duration = Duration::from_millis(100);
const COSTLY_ONE_IN: u64 = 10;
/// The least measured time of the scenarios that report each instance's share of the calls:
/// a share needs calls to be more than noise.
const SHARE_MIN_DURATION: Duration = Duration::from_secs(2);
/// The load sweep's rates and its measured time per contender and rate, unless told otherwise.
const SWEEP_RATES: [f64; 5] = [500.0, 1000.0, 2000.0, 3000.0, 4000.0];
const SWEEP_DURATION: Duration = Duration::from_secs(2);
/// stalls: how long a stall lasts, and the share of calls that stall.
const STALL: Duration = Duration::from_millis(500);
const STALL_P: f64 = 0.02;
/// The hedging contender's delay (µs), set by the stalls scenario's calibration run.
static HEDGE_DELAY_US: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(10_000);

// ---------------------------------------------------------------------------------------------
// Contenders

#[derive(Debug, Clone, Copy, PartialEq)]
enum Contender {
    Ours(Strategy),
    TonicBalanceList,
    TowerP2cPending,
    TowerP2cEwma,
    Naive,
    /// LeastPending with a hedging policy on Unary (stalls).
    Hedging,
}

const CONTENDERS: [Contender; 9] = [
    Contender::Ours(Strategy::LeastPending),
    Contender::Ours(Strategy::PeakEwma),
    Contender::Ours(Strategy::PowerOfTwoChoices),
    Contender::Ours(Strategy::RoundRobin),
    Contender::TonicBalanceList,
    Contender::TowerP2cPending,
    Contender::TowerP2cEwma,
    Contender::Naive,
    Contender::Hedging,
];

/// What the stalls scenario compares.
const STALL_CONTENDERS: [Contender; 2] =
    [Contender::Ours(Strategy::LeastPending), Contender::Hedging];

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
            Contender::Hedging => "LeastPending+hedging",
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
            Contender::Hedging => "hedging",
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
            Contender::Hedging => {
                let delay = Duration::from_micros(HEDGE_DELAY_US.load(Ordering::Relaxed));
                let ch = BalancedChannel::builder()
                    .endpoints(endpoints())
                    .hedging(HedgingPolicy::new(["fleet.v1.Fleet/Unary"], delay))
                    .build()
                    .expect("balanced channel");
                BoxCloneService::new(ch)
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
    LowConcurrency,
    MixedMethods,
    Stalls,
}

const SCENARIOS: [Scenario; 10] = [
    Scenario::Uniform,
    Scenario::Heterogeneous,
    Scenario::FailFast,
    Scenario::Unreachable,
    Scenario::Hang,
    Scenario::Overload,
    Scenario::KillRestart,
    Scenario::LowConcurrency,
    Scenario::MixedMethods,
    Scenario::Stalls,
];

/// What the sweep runs when `--scenario` does not say.
const SWEEP_SCENARIOS: [Scenario; 2] = [Scenario::Heterogeneous, Scenario::Overload];

const OVERLOAD_PER_CALL: Duration = Duration::from_millis(20);

/// What a scenario does to the fleet.
struct Setup {
    behaviors: Vec<Behavior>,
    uris: Vec<String>,
    /// The misbehaving instances (indices into the fleet), whose share of calls is reported.
    bad: Vec<usize>,
    /// Stop `bad[0]` at this fraction of the measured window, restart it at the second.
    kill: Option<(f64, f64)>,
    /// An instance whose cold start (`COLD_CALLS` calls in `COLD`) the reset arms afresh for
    /// each contender.
    cold: Option<usize>,
    /// The instances whose share of the calls is reported (empty: none is).
    shares: Vec<usize>,
    /// One caller, one call at a time (closed loop), instead of the open-loop schedule.
    closed_loop: bool,
    /// One call in `COSTLY_ONE_IN` is a ClientStream call (the expensive method).
    mixed: bool,
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
            Scenario::LowConcurrency => "low-concurrency",
            Scenario::MixedMethods => "mixed-methods",
            Scenario::Stalls => "stalls",
        }
    }

    /// The rate, measured time and warm-up of this scenario's runs.
    fn load(self, opts: &Opts) -> Load {
        let base = Load {
            rate: opts.rate,
            duration: opts.duration,
            warmup: opts.warmup,
        };
        match self {
            // No warm-up: the measured run starts with the fresh channel and the cold start.
            Scenario::LowConcurrency => Load {
                duration: opts.duration.max(SHARE_MIN_DURATION),
                warmup: Duration::ZERO,
                ..base
            },
            Scenario::MixedMethods => Load {
                duration: opts.duration.max(SHARE_MIN_DURATION),
                ..base
            },
            _ => base,
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
            Scenario::LowConcurrency => format!(
                "one caller, one call at a time, over {} of the {n} instances (i0-i{}) answering in {}; i0's first {COLD_CALLS} calls take {} (a cold start)",
                low_concurrency_n(n),
                low_concurrency_n(n) - 1,
                ms(FAST),
                ms(COLD)
            ),
            Scenario::MixedMethods => format!(
                "all {n} instances answer Unary in {} and ClientStream (one message) in {}; 1 call in {COSTLY_ONE_IN} is a ClientStream call",
                ms(FAST),
                ms(COSTLY)
            ),
            Scenario::Stalls => format!(
                "all {n} instances answer in {}, but each call stalls {} with {:.0}% probability, on any instance alike",
                ms(FAST),
                ms(STALL),
                STALL_P * 100.0
            ),
        }
    }

    fn setup(self, uris: &[String]) -> Setup {
        let n = uris.len();
        let mut behaviors = vec![Behavior::Delay(FAST); n];
        let mut uris = uris.to_vec();
        let mut kill = None;
        let mut cold = None;
        let mut shares = vec![];
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
            Scenario::LowConcurrency => {
                uris.truncate(low_concurrency_n(n));
                cold = Some(0);
                shares = (0..uris.len()).collect();
                vec![]
            }
            Scenario::MixedMethods => {
                behaviors.fill(Behavior::MethodCost {
                    other: FAST,
                    client_stream: COSTLY,
                });
                shares = (0..n).collect();
                vec![]
            }
            Scenario::Stalls => {
                behaviors.fill(Behavior::Stall {
                    p: STALL_P,
                    stall: STALL,
                    base: FAST,
                });
                vec![]
            }
        };
        Setup {
            behaviors,
            uris,
            bad,
            kill,
            cold,
            shares,
            closed_loop: self == Scenario::LowConcurrency,
            mixed: self == Scenario::MixedMethods,
        }
    }
}

/// The scenarios of this run whose schedule is not the common one, as a note for the headers.
fn exceptions(opts: &Opts) -> String {
    let mut notes = vec![];
    for s in &opts.scenarios {
        let load = s.load(opts);
        if *s == Scenario::LowConcurrency {
            notes.push(format!(
                "{}: closed loop, {:.1} s, no warm-up",
                s.key(),
                load.duration.as_secs_f64()
            ));
        } else if load.duration != opts.duration {
            notes.push(format!("{}: {:.1} s", s.key(), load.duration.as_secs_f64()));
        }
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    }
}

/// The contenders of a scenario: stalls always compares the default strategy without and with
/// hedging; the others run the ones chosen.
fn contenders_of(scenario: Scenario, opts: &Opts) -> Vec<Contender> {
    if scenario == Scenario::Stalls && !opts.sweep {
        STALL_CONTENDERS.to_vec()
    } else {
        opts.contenders.clone()
    }
}

/// The instances low-concurrency uses: 5, or the whole fleet if it is smaller.
fn low_concurrency_n(n: usize) -> usize {
    LOW_CONCURRENCY_INSTANCES.min(n)
}

/// Whether call `i` goes to the expensive method: a fixed pseudo-random pattern (splitmix64),
/// the same for every contender, one call in `COSTLY_ONE_IN` on average. A pattern with a
/// period (every tenth call) would line up with a round robin's.
fn costly(i: u64) -> bool {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z.is_multiple_of(COSTLY_ONE_IN)
}

/// A fifth of `0..n` (at least one), spread out.
fn fifth(n: usize) -> Vec<usize> {
    let k = (n / 5).max(1);
    (0..k).map(|j| j * n / k).collect()
}

/// The fleet of a run: `n` instances answering in `FAST`; with `load_reports`, each reports its
/// load (ORCA) on every response, as with `OrcaLayer` (the options accept it with the `orca`
/// feature only).
fn start_fleet(n: usize, load_reports: bool) -> Fleet {
    assert!(
        cfg!(feature = "orca") || !load_reports,
        "load reports need the orca feature"
    );
    Fleet::start_with(n, Behavior::Delay(FAST), || fleet::ServerOptions {
        #[cfg(feature = "orca")]
        orca: load_reports.then(tonic_balancer::orca::OrcaHandle::new),
        ..fleet::ServerOptions::default()
    })
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
    /// The load sweep instead of the scenario tables.
    sweep: bool,
    /// The sweep's rates.
    rates: Vec<f64>,
    /// The live view instead of the tables.
    live: bool,
    /// The `stream-limit` scenario (run on its own: see `streams`).
    streams: bool,
    /// The `many-clients` scenario (run on its own, with the `orca` feature: see
    /// `many_clients`), and its rounds.
    many_clients: bool,
    rounds: usize,
    /// Every instance of the fleet reports its load (ORCA) on every response.
    load_reports: bool,
}

/// The schedule of one run: calls per second (open loop), measured time, warm-up before it.
#[derive(Debug, Clone, Copy)]
struct Load {
    rate: f64,
    duration: Duration,
    warmup: Duration,
}

const USAGE: &str = "\
usage: cargo run --release --example shootout -- [options]

  --scenario NAME    uniform, heterogeneous, fail-fast, unreachable, hang, overload,
                     kill-restart, low-concurrency, mixed-methods, stalls; repeatable or
                     a comma list (default: all; with --sweep: heterogeneous,overload); and
                     stream-limit (one server limited to 100 streams per connection; only
                     when named); many-clients (50 clients, load reports; only when
                     named, needs --features orca)
  --contender NAME   least-pending, peak-ewma, p2c, round-robin, tonic, tower-pending,
                     tower-ewma, naive, hedging, or all; repeatable or a comma list
                     (default: all but naive and hedging; stalls always runs
                     least-pending and hedging)
  --rate N           calls per second, open loop (default 1000)
  --duration SECS    measured time per contender and scenario (default 1; at least 2 for
                     low-concurrency and mixed-methods; with --sweep: per contender and
                     rate, default 2)
  --warmup SECS      unmeasured time at the same rate before it (default 0.15; none for
                     low-concurrency)
  --deadline-ms MS   each call's deadline (default 1000)
  --instances N      fleet size, at least 3 (default 20)
  --svg PATH         where the chart goes (default target/shootout.svg; with --sweep,
                     target/sweep.svg)
  --sweep            the load sweep instead: each scenario (open-loop ones only) at each
                     rate, every contender at every rate; prints p99 by rate and charts it
  --rates LIST       the sweep's rates, a comma list (default 500,1000,2000,3000,4000)
  --load-reports     every instance reports its load (ORCA) on every response, as with
                     OrcaLayer (needs --features orca): compare with a run without it
  --rounds N         many-clients: every contender N times, in a rotated order each round;
                     each cell the median (default 1)
  --live             a live view of each instance instead, redrawn while the run goes on:
                     without --scenario, an instance is killed and one hangs; with it, the
                     scenarios named. Our strategies only (default least-pending); --duration
                     per run (default 14), --instances (default 8), --rate, --deadline-ms apply;
                     no warm-up (the view shows the opening too)
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
        svg: String::new(),
        sweep: false,
        rates: vec![],
        live: false,
        streams: false,
        many_clients: false,
        rounds: 1,
        load_reports: false,
    };
    let (mut rate_set, mut duration_set) = (false, false);
    let mut instances_set = false;
    let parse_rate = |v: &str, flag: &str| -> Result<f64, String> {
        v.parse::<f64>()
            .ok()
            .filter(|r| r.is_finite() && *r > 0.0 && *r <= 1e6)
            .ok_or_else(|| format!("{flag}: not a rate in (0, 1e6]: {v:?}"))
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
        if flag == "--sweep" {
            o.sweep = true;
            continue;
        }
        if flag == "--live" {
            o.live = true;
            continue;
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
                    if name == streams::KEY {
                        o.streams = true;
                        continue;
                    }
                    if name == "many-clients" {
                        if cfg!(not(feature = "orca")) {
                            return Err("many-clients needs the orca feature: cargo run --release --features orca --example shootout -- --scenario many-clients".to_owned());
                        }
                        o.many_clients = true;
                        continue;
                    }
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
                o.rate = parse_rate(&value()?, "--rate")?;
                rate_set = true;
            }
            "--rates" => {
                for v in value()?.split(',').filter(|s| !s.is_empty()) {
                    o.rates.push(parse_rate(v, "--rates")?);
                }
            }
            "--load-reports" => {
                if cfg!(not(feature = "orca")) {
                    return Err("--load-reports needs the orca feature: cargo run --release --features orca --example shootout -- --load-reports".to_owned());
                }
                o.load_reports = true;
            }
            "--rounds" => {
                let v = value()?;
                o.rounds = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=20).contains(n))
                    .ok_or_else(|| format!("--rounds: not a number from 1 to 20: {v:?}"))?;
            }
            "--duration" => {
                o.duration = secs(value()?, "--duration")?;
                duration_set = true;
            }
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
                instances_set = true;
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
    if o.live {
        return live::finish_opts(o, duration_set, instances_set);
    }
    if o.sweep {
        if rate_set {
            return Err("--rate does not apply to the sweep: --rates".to_owned());
        }
        if o.rates.is_empty() {
            o.rates = SWEEP_RATES.to_vec();
        }
        if !duration_set {
            o.duration = SWEEP_DURATION;
        }
        if o.svg.is_empty() {
            o.svg = "target/sweep.svg".to_owned();
        }
        if o.scenarios.is_empty() {
            o.scenarios = SWEEP_SCENARIOS.to_vec();
        }
        if o.scenarios.contains(&Scenario::LowConcurrency) {
            return Err("low-concurrency is closed loop: it has no rate to sweep".to_owned());
        }
    } else if !o.rates.is_empty() {
        return Err("--rates is for the sweep (--sweep)".to_owned());
    }
    if o.svg.is_empty() {
        o.svg = "target/shootout.svg".to_owned();
    }
    if o.scenarios.is_empty() && !o.streams && !o.many_clients {
        o.scenarios = SCENARIOS.to_vec();
    }
    if o.contenders.is_empty() {
        // The naive baseline only on request, to keep the default run near a minute.
        o.contenders = CONTENDERS
            .into_iter()
            .filter(|&c| c != Contender::Naive && c != Contender::Hedging)
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
    /// Whether each call went to the expensive method (mixed-methods; else all false).
    costly: Vec<bool>,
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
    // Armed once the previous contender's calls are over, so none of them takes a cold call.
    if let Some(i) = setup.cold {
        fleet.instances[i].cold_start(COLD_CALLS, COLD, FAST);
    }
}

/// Calls that reached each instance so far (the servers' own counters).
fn served(shared: &[Arc<Shared>]) -> Vec<u64> {
    shared
        .iter()
        .map(|s| s.served.load(Ordering::SeqCst))
        .collect()
}

#[allow(clippy::too_many_arguments)]
async fn run_one(
    contender: Contender,
    setup: &Setup,
    fleet: &Arc<Mutex<Fleet>>,
    shared: &[Arc<Shared>],
    load: Load,
    deadline: Duration,
    progress: &Progress,
    label: &str,
) -> RunResult {
    if setup.closed_loop {
        return run_closed(contender, setup, shared, load, deadline, progress, label).await;
    }
    let client = FleetClient::new(contender.build(&setup.uris));
    let period = Duration::from_secs_f64(1.0 / load.rate);
    let warmup_calls = (load.warmup.as_secs_f64() * load.rate).round() as u64;
    let measured_calls = ((load.duration.as_secs_f64() * load.rate).round() as u64).max(1);
    let total = warmup_calls + measured_calls;
    let t0 = tokio::time::Instant::now() + Duration::from_millis(5);
    let measure_start = t0 + period * warmup_calls as u32;

    // Kill and restart on a thread of their own (stopping an instance joins its thread).
    let killer = setup.kill.map(|(at_stop, at_restart)| {
        let fleet = fleet.clone();
        let victim = setup.bad[0];
        let stop_at = measure_start.into_std() + load.duration.mul_f64(at_stop);
        let restart_at = measure_start.into_std() + load.duration.mul_f64(at_restart);
        std::thread::spawn(move || {
            std::thread::sleep(stop_at.saturating_duration_since(Instant::now()));
            fleet.lock().unwrap().instances[victim].stop();
            std::thread::sleep(restart_at.saturating_duration_since(Instant::now()));
            fleet.lock().unwrap().instances[victim].restart();
        })
    });

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
            let expensive = setup.mixed && costly(id);
            handles.push(tokio::spawn(async move {
                let r = call(&mut client, id, expensive, deadline).await;
                let end = tokio::time::Instant::now();
                let result = r.map(|()| end - sched);
                (measured, expensive, result, end)
            }));
            i += 1;
        }
        if last_draw.elapsed() > Duration::from_millis(100) {
            let frac = (now.saturating_duration_since(t0)).as_secs_f64()
                / (load.warmup + load.duration).as_secs_f64();
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
    let mut costly = Vec::with_capacity(measured_calls as usize);
    let mut last_end = measure_start;
    for h in handles {
        let (measured, expensive, result, end) = h.await.expect("call task");
        if measured {
            if result.is_ok() {
                last_end = last_end.max(end);
            }
            calls.push(result);
            costly.push(expensive);
        }
    }
    if let Some(k) = killer {
        k.join().expect("kill thread");
    }
    let after = served(shared);
    let before = served_before.unwrap_or_else(|| after.clone());
    RunResult {
        calls,
        costly,
        span: (last_end - measure_start).max(load.duration),
        served: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        max_lag,
    }
}

/// One caller, one call at a time, for the measured time: each call starts when the one
/// before it has ended, and its latency counts from its start. No warm-up: what is measured
/// starts with the fresh channel (and the cold start the reset armed).
async fn run_closed(
    contender: Contender,
    setup: &Setup,
    shared: &[Arc<Shared>],
    load: Load,
    deadline: Duration,
    progress: &Progress,
    label: &str,
) -> RunResult {
    let mut client = FleetClient::new(contender.build(&setup.uris));
    let before = served(shared);
    let start = tokio::time::Instant::now();
    let end_at = start + load.duration;
    let mut calls = Vec::new();
    let mut last_end = start;
    let mut last_draw = Instant::now();
    let mut id = 0u64;
    while tokio::time::Instant::now() < end_at {
        let begun = tokio::time::Instant::now();
        let r = call(&mut client, id, false, deadline).await;
        let end = tokio::time::Instant::now();
        if r.is_ok() {
            last_end = end;
        }
        calls.push(r.map(|()| end - begun));
        id += 1;
        if last_draw.elapsed() > Duration::from_millis(100) {
            progress.draw(
                (end - start).as_secs_f64() / load.duration.as_secs_f64(),
                label,
            );
            last_draw = Instant::now();
        }
    }
    drop(client);
    let after = served(shared);
    RunResult {
        costly: vec![false; calls.len()],
        calls,
        span: (last_end - start).max(load.duration),
        served: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        max_lag: Duration::ZERO,
    }
}

/// One call with its deadline: Unary, or (`expensive`) ClientStream with one message, which
/// the mixed-methods fleet serves 20x slower. A backstop past the deadline ends a call stuck
/// where `grpc-timeout` does not reach (such as a queue in front of the channel).
async fn call(
    client: &mut FleetClient<Svc>,
    id: u64,
    expensive: bool,
    deadline: Duration,
) -> Result<(), Code> {
    let msg = Req {
        id,
        count: 0,
        payload: Vec::new(),
    };
    let fut = if expensive {
        let mut req = tonic::Request::new(futures::stream::iter([msg]));
        req.set_timeout(deadline);
        client_stream(client, req)
    } else {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(deadline);
        unary(client, req)
    };
    match tokio::time::timeout(deadline + Duration::from_millis(50), fut).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(status.code()),
        Err(_) => Err(Code::DeadlineExceeded),
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

/// One client-streaming call, boxed for the same reason.
fn client_stream(
    client: &mut FleetClient<Svc>,
    req: tonic::Request<futures::stream::Iter<std::array::IntoIter<Req, 1>>>,
) -> futures::future::BoxFuture<'_, Result<tonic::Response<fleet::pb::Reply>, tonic::Status>> {
    Box::pin(client.client_stream(req))
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
    /// Each reported instance's share of the calls that reached them, in % (server-side
    /// counts; empty where the scenario reports none).
    shares: Vec<f64>,
    /// p99 of the cheap (Unary) calls alone, in mixed-methods.
    cheap_p99: Option<Option<Duration>>,
    /// Expensive calls among the measured ones, in mixed-methods.
    costly_calls: usize,
    /// Calls that reached the servers beyond one per measured call, in % of the calls.
    extra_pct: f64,
}

const QUANTILES: [f64; 3] = [0.50, 0.99, 0.999];
const QUANTILE_NAMES: [&str; 3] = ["p50", "p99", "p99.9"];

/// The quantiles of these calls' latencies; failures rank after every success (`None`).
fn quantiles<'a>(
    calls: impl Iterator<Item = &'a CallResult>,
    qs: &[f64; 3],
) -> [Option<Duration>; 3] {
    let mut lat: Vec<Option<Duration>> = calls.map(|r| r.ok()).collect();
    lat.sort_by_key(|l| (l.is_none(), *l));
    let n = lat.len();
    qs.map(|q| {
        let idx = ((q * n as f64).ceil() as usize).clamp(1, n.max(1)) - 1;
        lat.get(idx).copied().flatten()
    })
}

fn summarize(contender: Contender, run: &RunResult, setup: &Setup) -> Row {
    let bad = &setup.bad;
    let n = run.calls.len();
    let ok = run.calls.iter().filter(|r| r.is_ok()).count();
    let pcts = quantiles(run.calls.iter(), &QUANTILES);
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
    let shared_total: u64 = setup.shares.iter().map(|&i| run.served[i]).sum();
    let shares = setup
        .shares
        .iter()
        .map(|&i| run.served[i] as f64 / shared_total.max(1) as f64 * 100.0)
        .collect();
    let cheap_p99 = setup.mixed.then(|| {
        let cheap = run
            .calls
            .iter()
            .zip(&run.costly)
            .filter(|(_, &c)| !c)
            .map(|(r, _)| r);
        quantiles(cheap, &[0.99; 3])[0]
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
        shares,
        cheap_p99,
        costly_calls: run.costly.iter().filter(|&&c| c).count(),
        extra_pct: (total_served as f64 - n as f64) / n.max(1) as f64 * 100.0,
    }
}

impl Row {
    /// The least share over the fair share (1.0: every instance got its share).
    fn min_over_fair(&self) -> f64 {
        let fair = 100.0 / self.shares.len().max(1) as f64;
        self.shares.iter().copied().fold(f64::INFINITY, f64::min) / fair
    }

    /// The share farthest from the fair share, as a signed deviation from it in %.
    fn max_dev(&self) -> f64 {
        let fair = 100.0 / self.shares.len().max(1) as f64;
        self.shares
            .iter()
            .map(|s| (s - fair) / fair * 100.0)
            .fold(0.0, |m: f64, d| if d.abs() > m.abs() { d } else { m })
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

fn errors_cell(r: &Row) -> String {
    let mut e: Vec<_> = r.errors.iter().collect();
    e.sort_by(|a, b| b.1.cmp(a.1));
    e.iter()
        .map(|(code, k)| format!("{k} {code}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_table(scenario: Scenario, rows: &[Row], setup: &Setup, load: Load, opts: &Opts) {
    let n = opts.instances;
    println!();
    let schedule = if setup.closed_loop {
        "closed loop".to_owned()
    } else {
        format!("{:.0} calls/s", load.rate)
    };
    println!(
        "== {}: {} ({schedule}, {:.1} s per contender, deadline {})",
        scenario.key(),
        scenario.describe(n),
        load.duration.as_secs_f64(),
        ms(opts.deadline),
    );
    if !setup.shares.is_empty() {
        print_share_table(rows, setup);
        return;
    }
    if scenario == Scenario::Stalls {
        print_stalls_table(rows);
        return;
    }
    let bad = &setup.bad;
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
        let errors = errors_cell(r);
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

/// stalls: the hedging delay, near the fast calls' p95: the p95 of the calls that did not stall
/// (under half a stall) in a run of the same load without hedging, not counted.
fn calibrate_hedging(
    rt: &tokio::runtime::Runtime,
    fleet: &Arc<Mutex<Fleet>>,
    shared: &[Arc<Shared>],
    setup: &Setup,
    load: Load,
    opts: &Opts,
    progress: &Progress,
) -> Duration {
    reset(fleet, setup);
    let label = "stalls / calibration (no hedging)";
    let plain = Contender::Ours(Strategy::LeastPending);
    let run = rt.block_on(run_one(
        plain,
        setup,
        fleet,
        shared,
        load,
        opts.deadline,
        progress,
        label,
    ));
    let fast: Vec<CallResult> = run
        .calls
        .into_iter()
        .filter(|r| r.is_ok_and(|d| d < STALL / 2))
        .collect();
    let p95 = quantiles(fast.iter(), &[0.95; 3])[0].unwrap_or(FAST);
    HEDGE_DELAY_US.store(p95.as_micros() as u64, Ordering::Relaxed);
    p95
}

/// The stalls table: latency, extra attempts, and issue 13's target (hedging cuts p99 at
/// least 5x against the same strategy without it, with at most 10% extra attempts).
fn print_stalls_table(rows: &[Row]) {
    let delay = Duration::from_micros(HEDGE_DELAY_US.load(Ordering::Relaxed));
    println!(
        "(hedging delay {}: the p95 of the calls that did not stall, in an unmeasured run without hedging; 3 attempts at most; extra attempts: server-side counts)",
        ms(delay)
    );
    println!(
        "{:<20} {:>7} {:>9} {:>9} {:>9} {:>7}  {:>14}  errors",
        "contender", "ok %", "p50", "p99", "p99.9", "ok/s", "extra attempts"
    );
    for r in rows {
        println!(
            "{:<20} {:>7.2} {:>9} {:>9} {:>9} {:>7.0}  {:>13.1}%  {}",
            r.contender.name(),
            r.ok_pct,
            pct_cell(r.pcts[0]),
            pct_cell(r.pcts[1]),
            pct_cell(r.pcts[2]),
            r.ok_per_sec,
            r.extra_pct,
            errors_cell(r)
        );
    }
    let find = |c: Contender| rows.iter().find(|r| r.contender == c);
    if let (Some(plain), Some(hedged)) = (
        find(Contender::Ours(Strategy::LeastPending)),
        find(Contender::Hedging),
    ) {
        if let (Some(p), Some(h)) = (plain.pcts[1], hedged.pcts[1]) {
            let cut = p.as_secs_f64() / h.as_secs_f64().max(1e-9);
            let met = cut >= 5.0 && hedged.extra_pct <= 10.0;
            println!(
                "(target: p99 cut >= 5x, extra attempts <= 10%: p99 {} -> {} ({cut:.1}x), {:.1}% extra: {})",
                ms(p),
                ms(h),
                hedged.extra_pct,
                if met { "met" } else { "MISSED" }
            );
        } else {
            println!("(target: p99 falls on failed calls: MISSED)");
        }
    }
}

/// The table of a scenario that reports each instance's share of the calls: the usual
/// columns, the least share over the fair one and the farthest share from it, then each
/// instance's share (indented lines, one per contender).
fn print_share_table(rows: &[Row], setup: &Setup) {
    let k = setup.shares.len();
    let fair = 100.0 / k.max(1) as f64;
    let cheap = if setup.mixed { "  unary p99" } else { "" };
    println!(
        "{:<20} {:>7} {:>9} {:>9} {:>9} {:>7}{cheap}  {:>8}  {:>7}  errors",
        "contender", "ok %", "p50", "p99", "p99.9", "ok/s", "min/fair", "max dev"
    );
    for r in rows {
        let cheap = match r.cheap_p99 {
            Some(p) => format!("  {:>9}", pct_cell(p)),
            None => String::new(),
        };
        println!(
            "{:<20} {:>7.2} {:>9} {:>9} {:>9} {:>7.0}{cheap}  {:>8.2}  {:>+6.1}%  {}",
            r.contender.name(),
            r.ok_pct,
            pct_cell(r.pcts[0]),
            pct_cell(r.pcts[1]),
            pct_cell(r.pcts[2]),
            r.ok_per_sec,
            r.min_over_fair(),
            r.max_dev(),
            errors_cell(r)
        );
    }
    let cold = setup
        .cold
        .map(|i| format!(", i{i} the cold one"))
        .unwrap_or_default();
    println!("share of the calls per instance, % (server-side counts; fair {fair:.1}%{cold}):");
    let names: Vec<String> = setup
        .shares
        .iter()
        .map(|i| format!("{:>4}", format!("i{i}")))
        .collect();
    println!("  {:<20} {}", "", names.join(" "));
    for r in rows {
        let cells: Vec<String> = r.shares.iter().map(|s| format!("{s:4.1}")).collect();
        println!("  {:<20} {}", r.contender.name(), cells.join(" "));
    }
    if let (true, Some(r)) = (setup.mixed, rows.first()) {
        println!(
            "  (ClientStream calls: {} of the {} measured calls, the same calls for every contender)",
            r.costly_calls, r.calls
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

/// The start of an SVG chart: the document, a white background, a title and a grey subtitle.
fn svg_open(width: f64, height: f64, left: f64, title: &str, subtitle: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="16" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="40" fill="#666">{}</text>"##,
        esc(subtitle)
    );
    s
}

/// A logarithmic latency axis from 1 ms to `hi` ms, drawn over `height` pixels from `top`.
struct LogAxis {
    hi: f64,
    top: f64,
    height: f64,
}

impl LogAxis {
    const LO: f64 = 1.0;

    /// The y of a latency in milliseconds (clamped to the axis).
    fn y(&self, v_ms: f64) -> f64 {
        let f = (v_ms.clamp(Self::LO, self.hi).log10() - Self::LO.log10())
            / (self.hi.log10() - Self::LO.log10());
        self.top + self.height * (1.0 - f)
    }

    /// The grid lines at each power of ten with their labels, and the deadline as a dashed red
    /// line, from x `left` to `right`.
    fn grid(&self, s: &mut String, left: f64, right: f64, deadline: Duration) {
        let mut tick = 1.0;
        while tick <= self.hi {
            let ty = self.y(tick);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{right}" y1="{ty:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end" fill="#666">{}</text>"##,
                left - 6.0,
                ty + 4.0,
                if tick >= 1000.0 {
                    format!("{} s", tick / 1000.0)
                } else {
                    format!("{tick} ms")
                }
            );
            tick *= 10.0;
        }
        let dl = self.y(deadline.as_secs_f64() * 1e3);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{right}" y1="{dl:.1}" y2="{dl:.1}" stroke="#d62728" stroke-dasharray="4 3"/><text x="{right}" y="{:.1}" text-anchor="end" fill="#d62728">deadline</text>"##,
            dl - 3.0
        );
    }
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
    let axis = LogAxis {
        hi: (opts.deadline.as_secs_f64() * 1e3 * 2.0).max(10.0),
        top: plot_top,
        height: plot_h,
    };
    let y = |v_ms: f64| axis.y(v_ms);
    let hi = axis.hi;
    let h = TOP + PANEL_H * results.len() as f64 + 20.0;
    let mut s = svg_open(
        W,
        h,
        LEFT,
        "tonic-balancer shootout: latency from scheduled start, per contender (log scale)",
        &format!(
            "{} instances, {:.0} calls/s open loop, {:.1} s per contender, deadline {}; red = the percentile falls on failed calls",
            opts.instances,
            opts.rate,
            opts.duration.as_secs_f64(),
            ms(opts.deadline)
        ),
    );
    let notes = exceptions(opts);
    if !notes.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="54" fill="#666">{}</text>"##,
            esc(notes.trim())
        );
    }
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
        axis.grid(&mut s, LEFT, W - RIGHT, opts.deadline);
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

fn write_svg(path: &str, chart: &str) {
    let path = std::path::Path::new(path);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(path, chart) {
        Ok(()) => println!("\nchart: {}", path.display()),
        Err(e) => eprintln!("\ncould not write {}: {e}", path.display()),
    }
}

// ---------------------------------------------------------------------------------------------
// The load sweep

/// Per scenario, per rate, one row per contender (in `opts.contenders`' order).
type SweepResults = Vec<(Scenario, Vec<Vec<Row>>)>;

/// Each scenario at each rate, every contender at every rate: the order of the contenders
/// rotates from one (scenario, rate) to the next, and the fleet is reset before each run.
fn sweep(
    opts: &Opts,
    rt: &tokio::runtime::Runtime,
    fleet: &Arc<Mutex<Fleet>>,
    shared: &[Arc<Shared>],
    uris: &[String],
    progress: &mut Progress,
) -> SweepResults {
    let k = opts.contenders.len();
    let mut results = Vec::new();
    for (si, &scenario) in opts.scenarios.iter().enumerate() {
        let setup = scenario.setup(uris);
        let mut by_rate = Vec::new();
        for (ri, &rate) in opts.rates.iter().enumerate() {
            let load = Load {
                rate,
                duration: opts.duration,
                warmup: opts.warmup,
            };
            let mut rows: Vec<Option<Row>> = (0..k).map(|_| None).collect();
            for j in 0..k {
                let ci = (j + si * opts.rates.len() + ri) % k;
                let contender = opts.contenders[ci];
                reset(fleet, &setup);
                let label = format!("{} {rate:.0}/s / {}", scenario.key(), contender.name());
                progress.draw(0.0, &label);
                let run = rt.block_on(run_one(
                    contender,
                    &setup,
                    fleet,
                    shared,
                    load,
                    opts.deadline,
                    progress,
                    &label,
                ));
                rows[ci] = Some(summarize(contender, &run, &setup));
                progress.done += 1;
            }
            by_rate.push(rows.into_iter().map(|r| r.expect("ran")).collect());
        }
        progress.clear();
        print_sweep_table(scenario, &by_rate, opts);
        results.push((scenario, by_rate));
    }
    progress.clear();
    results
}

/// Rows = contenders, columns = rates, cells = p99 (`fail`: it falls on failed calls).
fn print_sweep_table(scenario: Scenario, by_rate: &[Vec<Row>], opts: &Opts) {
    println!();
    println!(
        "== sweep/{}: {} (p99 by rate, {:.1} s per contender and rate, deadline {})",
        scenario.key(),
        scenario.describe(opts.instances),
        opts.duration.as_secs_f64(),
        ms(opts.deadline),
    );
    let mut head = format!("{:<20}", "contender");
    for r in &opts.rates {
        let _ = write!(head, " {:>9}", format!("{r:.0}/s"));
    }
    println!("{head}");
    for (ci, c) in opts.contenders.iter().enumerate() {
        let mut line = format!("{:<20}", c.name());
        for rows in by_rate {
            let _ = write!(line, " {:>9}", pct_cell(rows[ci].pcts[1]));
        }
        println!("{line}");
    }
    let lags: Vec<Duration> = by_rate
        .iter()
        .map(|rows| rows.iter().map(|r| r.max_lag).max().unwrap_or_default())
        .collect();
    if lags.iter().any(|&l| l > Duration::from_millis(20)) {
        let cells: Vec<String> = opts
            .rates
            .iter()
            .zip(&lags)
            .map(|(r, l)| format!("{} at {r:.0}/s", ms(*l)))
            .collect();
        println!(
            "(note: the load generator started some calls late, at most {}; their latency counts from the scheduled start)",
            cells.join(", ")
        );
    }
    let _ = std::io::stdout().flush();
}

/// A line chart per scenario: p99 (log scale) against the rate, one line per contender (solid:
/// this crate's strategies, dashed: the others). A p99 that falls on failed calls is drawn in
/// the `fail` band above the plot, clipped, with a cross.
fn sweep_svg(results: &SweepResults, opts: &Opts) -> String {
    const W: f64 = 1100.0;
    const PANEL_H: f64 = 360.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 230.0;
    const TOP: f64 = 60.0;
    const COLORS: [&str; 8] = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#7f7f7f",
    ];
    let fail_y = 40.0;
    let plot_top = 60.0;
    let plot_h = 250.0;
    let axis = LogAxis {
        hi: (opts.deadline.as_secs_f64() * 1e3 * 1.5).max(10.0),
        top: plot_top,
        height: plot_h,
    };
    let y = |v_ms: f64| axis.y(v_ms);
    let (rmin, rmax) = opts
        .rates
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &r| (a.min(r), b.max(r)));
    let plot_w = W - LEFT - RIGHT;
    let x = |rate: f64| -> f64 {
        if rmax > rmin {
            LEFT + 20.0 + (plot_w - 40.0) * (rate - rmin) / (rmax - rmin)
        } else {
            LEFT + plot_w / 2.0
        }
    };
    let h = TOP + PANEL_H * results.len() as f64 + 10.0;
    let mut s = svg_open(
        W,
        h,
        LEFT,
        "tonic-balancer load sweep: p99 latency from scheduled start against the rate (log scale)",
        &format!(
            "{} instances, open loop, {:.1} s per contender and rate, deadline {}; solid: BalancedChannel's strategies, dashed: the others; x in the top band: p99 on failed calls",
            opts.instances,
            opts.duration.as_secs_f64(),
            ms(opts.deadline)
        ),
    );
    for (pi, (scenario, by_rate)) in results.iter().enumerate() {
        let oy = TOP + PANEL_H * pi as f64;
        let _ = writeln!(s, r#"<g transform="translate(0,{oy})">"#);
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{}</text><text x="{LEFT}" y="31" fill="#666">{}</text>"##,
            esc(scenario.key()),
            esc(&scenario.describe(opts.instances))
        );
        // The fail band, the grid, the axes.
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{:.1}" width="{plot_w}" height="14" fill="#fdecea"/><text x="{}" y="{:.1}" text-anchor="end" fill="#d62728">fail</text>"##,
            fail_y - 7.0,
            LEFT - 6.0,
            fail_y + 4.0
        );
        axis.grid(&mut s, LEFT, LEFT + plot_w, opts.deadline);
        for &r in &opts.rates {
            let tx = x(r);
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{plot_top}" y2="{:.1}" stroke="#eee"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#666">{r:.0}/s</text>"##,
                plot_top + plot_h,
                plot_top + plot_h + 15.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#666">calls per second</text>"##,
            LEFT + plot_w / 2.0,
            plot_top + plot_h + 30.0
        );
        // One line per contender.
        let fail_dx = 9.0;
        let mid = (opts.contenders.len() as f64 - 1.0) / 2.0;
        for (ci, c) in opts.contenders.iter().enumerate() {
            let color = COLORS[ci % COLORS.len()];
            let dash = if matches!(c, Contender::Ours(_)) {
                ""
            } else {
                r#" stroke-dasharray="6 3""#
            };
            let points: Vec<(f64, f64, Option<Duration>)> = opts
                .rates
                .iter()
                .zip(by_rate)
                .map(|(&r, rows)| {
                    let p = rows[ci].pcts[1];
                    match p {
                        Some(d) => (x(r), y(d.as_secs_f64() * 1e3), p),
                        // Side by side in the band, so that every failed contender shows.
                        None => (x(r) + fail_dx * (ci as f64 - mid), fail_y, p),
                    }
                })
                .collect();
            let path: Vec<String> = points
                .iter()
                .map(|(px, py, _)| format!("{px:.1},{py:.1}"))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for ((px, py, p), &r) in points.iter().zip(&opts.rates) {
                let title = format!("{} at {r:.0}/s: p99 {}", c.name(), pct_cell(*p));
                if p.is_some() {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{color}"><title>{}</title></circle>"#,
                        esc(&title)
                    );
                } else {
                    let _ = writeln!(
                        s,
                        r#"<path d="M{:.1},{:.1} l8,8 m0,-8 l-8,8" stroke="{color}" stroke-width="2.5"><title>{}</title></path>"#,
                        px - 4.0,
                        py - 4.0,
                        esc(&title)
                    );
                }
            }
            // Legend.
            let ly = plot_top + 4.0 + 18.0 * ci as f64;
            let lx = LEFT + plot_w + 20.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" x2="{}" y1="{ly:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                ly + 4.0,
                esc(c.name())
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
    if opts.live {
        live::run(&opts);
        return;
    }
    if opts.streams {
        streams::run(opts.rate, opts.duration);
        if opts.scenarios.is_empty() && !opts.many_clients {
            return;
        }
    }
    #[cfg(feature = "orca")]
    if opts.many_clients {
        many_clients::run(opts.rounds);
        if opts.scenarios.is_empty() {
            return;
        }
    }
    let n = opts.instances;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    if opts.sweep {
        println!(
            "tonic-balancer shootout, load sweep: {n} local instances, {} calls/s open loop, {:.1} s measured (+{:.2} s warm-up) per contender, scenario and rate, deadline {}, {} scenarios x {} rates x {} contenders, {cores} cores",
            opts.rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join("/"),
            opts.duration.as_secs_f64(),
            opts.warmup.as_secs_f64(),
            ms(opts.deadline),
            opts.scenarios.len(),
            opts.rates.len(),
            opts.contenders.len(),
        );
    } else {
        println!(
            "tonic-balancer shootout: {n} local instances, {:.0} calls/s open loop, {:.1} s measured (+{:.2} s warm-up) per contender and scenario{}, deadline {}, {} scenarios x {} contenders, {cores} cores",
            opts.rate,
            opts.duration.as_secs_f64(),
            opts.warmup.as_secs_f64(),
            exceptions(&opts),
            ms(opts.deadline),
            opts.scenarios.len(),
            opts.contenders.len(),
        );
    }
    println!("latency: from each call's scheduled start, over all calls; a failed call ranks above every success ('fail' = the percentile falls on failed calls)");
    println!("errors: the status each client got (tonic's own deadline timer reports CANCELLED, BalancedChannel's DEADLINE_EXCEEDED)");
    println!("ok/s: successful calls per second, from the first call's scheduled start to the end of the last successful one (at least the measured time); 'to bad': share of the calls that reached the misbehaving instances (server-side counts)");

    let fleet = start_fleet(n, opts.load_reports);
    let shared: Vec<Arc<Shared>> = fleet.instances.iter().map(|i| i.shared.clone()).collect();
    let uris = fleet.uris();
    let fleet = Arc::new(Mutex::new(fleet));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("client runtime");

    let rates = if opts.sweep { opts.rates.len() } else { 1 };
    let mut progress = Progress {
        done: 0,
        total: opts
            .scenarios
            .iter()
            .map(|&s| rates * contenders_of(s, &opts).len())
            .sum(),
        started: Instant::now(),
        tty: std::io::stderr().is_terminal(),
    };
    let started = Instant::now();
    if opts.sweep {
        let results = sweep(&opts, &rt, &fleet, &shared, &uris, &mut progress);
        drop(rt);
        write_svg(&opts.svg, &sweep_svg(&results, &opts));
        let calls: usize = results
            .iter()
            .flat_map(|(_, rows)| rows.iter().flatten().map(|r| r.calls))
            .sum();
        println!(
            "{calls} measured calls in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        return;
    }
    let mut results = Vec::new();
    for (si, &scenario) in opts.scenarios.iter().enumerate() {
        let setup = scenario.setup(&uris);
        let load = scenario.load(&opts);
        let contenders = contenders_of(scenario, &opts);
        if scenario == Scenario::Stalls {
            calibrate_hedging(&rt, &fleet, &shared, &setup, load, &opts, &progress);
        }
        let k = contenders.len();
        let mut rows: Vec<Option<Row>> = (0..k).map(|_| None).collect();
        // Rotate the order from one scenario to the next.
        for j in 0..k {
            let ci = (j + si) % k;
            let contender = contenders[ci];
            reset(&fleet, &setup);
            let label = format!("{} / {}", scenario.key(), contender.name());
            progress.draw(0.0, &label);
            let run = rt.block_on(run_one(
                contender,
                &setup,
                &fleet,
                &shared,
                load,
                opts.deadline,
                &progress,
                &label,
            ));
            rows[ci] = Some(summarize(contender, &run, &setup));
            progress.done += 1;
        }
        progress.clear();
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|r| r.expect("every contender ran"))
            .collect();
        print_table(scenario, &rows, &setup, load, &opts);
        results.push((scenario, rows));
    }
    progress.clear();
    drop(rt);

    write_svg(&opts.svg, &svg(&results, &opts));
    let calls: usize = results
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| r.calls))
        .sum();
    println!(
        "{calls} measured calls in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
