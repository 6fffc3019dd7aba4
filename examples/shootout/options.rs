//! The command line (clap's derive API), and the defaults and rules of each mode: the
//! scenario tables, the load sweep (`--sweep`), the live view (`--live`).

use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};

use crate::contenders::{Contender, CONTENDERS};
use crate::live;
use crate::scenarios::{Scenario, SCENARIOS, SWEEP_SCENARIOS};
use crate::streams;

/// The load sweep's rates and its measured time per contender and rate, unless told otherwise.
const SWEEP_RATES: [f64; 5] = [500.0, 1000.0, 2000.0, 3000.0, 4000.0];
const SWEEP_DURATION: Duration = Duration::from_secs(2);

/// What to run, as the command line says and with the defaults of its mode.
pub(crate) struct Opts {
    pub(crate) scenarios: Vec<Scenario>,
    pub(crate) contenders: Vec<Contender>,
    pub(crate) rate: f64,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) deadline: Duration,
    pub(crate) instances: usize,
    pub(crate) svg: String,
    /// The load sweep instead of the scenario tables.
    pub(crate) sweep: bool,
    /// The sweep's rates.
    pub(crate) rates: Vec<f64>,
    /// The live view instead of the tables.
    pub(crate) live: bool,
    /// The `stream-limit` scenario (run on its own: see `streams`).
    pub(crate) streams: bool,
    /// The `many-clients` scenario (run on its own, with the `orca` feature: see
    /// `many_clients`).
    pub(crate) many_clients: bool,
    /// How many times the sweep and many-clients run every contender (each cell the median).
    pub(crate) rounds: usize,
    /// Every instance of the fleet reports its load (ORCA) on every response.
    pub(crate) load_reports: bool,
}

impl Opts {
    /// The options of this run, from the command line; on an error, says so with the usage and
    /// exits (status 2), and on `--help` prints the help and exits.
    pub(crate) fn parse() -> Opts {
        Args::parse()
            .resolve()
            .unwrap_or_else(|e| Args::command().error(ErrorKind::ValueValidation, e).exit())
    }
}

// The command line as written. Its defaults are those of the help texts, applied in `resolve`
// (some depend on the mode), so that clap adds no `[default: ...]` of its own.
#[derive(Parser)]
#[command(
    name = "shootout",
    about = "The shootout: the same load, through each balancer in turn, against a fleet of real\nlocal gRPC servers in which something goes wrong.",
    override_usage = "cargo run --release --example shootout -- [options]",
    // An option given twice takes its last value, and a negative number is a
    // value (refused as such) rather than an unknown flag.
    args_override_self = true,
    allow_negative_numbers = true
)]
struct Args {
    /// uniform, heterogeneous, fail-fast, unreachable, hang, overload,
    /// kill-restart, low-concurrency, mixed-methods, stalls; repeatable or
    /// a comma list (default: all; with --sweep: heterogeneous,overload); and
    /// stream-limit (one server limited to 100 streams per connection; only
    /// when named); many-clients (50 clients, load reports; only when
    /// named, needs --features orca)
    #[arg(long, value_name = "NAME", value_parser = scenario_list, verbatim_doc_comment)]
    scenario: Vec<List<Named>>,

    /// fewest-then-fastest, least-pending, peak-ewma, p2c, round-robin, tonic,
    /// tower-pending, tower-ewma, naive, hedging, or all; repeatable or a comma list
    /// (default: all but naive and hedging; stalls always runs
    /// fewest-then-fastest and hedging)
    #[arg(long, value_name = "NAME", value_parser = contender_list, verbatim_doc_comment)]
    contender: Vec<List<Contender>>,

    /// calls per second, open loop (default 1000)
    #[arg(long, value_name = "N", value_parser = rate)]
    rate: Option<f64>,

    /// measured time per contender and scenario (default 1; at least 2 for
    /// low-concurrency and mixed-methods; with --sweep: per contender and
    /// rate, default 2)
    #[arg(long, value_name = "SECS", value_parser = secs, verbatim_doc_comment)]
    duration: Option<Duration>,

    /// unmeasured time at the same rate before it (default 0.15; none for
    /// low-concurrency)
    #[arg(long, value_name = "SECS", value_parser = secs, verbatim_doc_comment)]
    warmup: Option<Duration>,

    /// each call's deadline (default 1000)
    #[arg(long = "deadline-ms", value_name = "MS", value_parser = deadline_ms)]
    deadline: Option<Duration>,

    /// fleet size, at least 3 (default 20)
    #[arg(long, value_name = "N", value_parser = instances)]
    instances: Option<usize>,

    /// where the chart goes (default target/shootout.svg; with --sweep,
    /// target/sweep.svg)
    #[arg(long, value_name = "PATH", verbatim_doc_comment)]
    svg: Option<String>,

    /// the load sweep instead: each scenario (open-loop ones only) at each
    /// rate, every contender at every rate; prints p99 by rate and charts it
    #[arg(long, verbatim_doc_comment)]
    sweep: bool,

    /// the sweep's rates, a comma list (default 500,1000,2000,3000,4000)
    #[arg(long, value_name = "LIST", value_parser = rate_list)]
    rates: Vec<List<f64>>,

    /// every instance reports its load (ORCA) on every response, as with
    /// OrcaLayer (needs --features orca): compare with a run without it
    #[arg(long, verbatim_doc_comment)]
    load_reports: bool,

    /// --sweep and many-clients: every contender N times, in a rotated order
    /// each round; each cell the median (default 1)
    #[arg(long, value_name = "N", value_parser = rounds, verbatim_doc_comment)]
    rounds: Option<usize>,

    /// a live view of each instance instead, redrawn while the run goes on:
    /// without --scenario, an instance is killed and one hangs; with it, the
    /// scenarios named. Our strategies only (default fewest-then-fastest); --duration
    /// per run (default 14), --instances (default 8), --rate, --deadline-ms apply;
    /// no warm-up (the view shows the opening too)
    #[arg(long, verbatim_doc_comment)]
    live: bool,

    /// `cargo bench` passes this to every target; harmless here.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// One occurrence of an option that takes a comma list.
#[derive(Clone)]
struct List<T>(Vec<T>);

/// A name `--scenario` takes: a scenario of the tables, or one that runs on its own.
#[derive(Clone, Copy)]
enum Named {
    Table(Scenario),
    Streams,
    ManyClients,
}

/// A comma list of `f`'s values; empty items are skipped.
fn list<T>(v: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<List<T>, String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(f)
        .collect::<Result<_, _>>()
        .map(List)
}

fn scenario_list(v: &str) -> Result<List<Named>, String> {
    list(v, |name| {
        if name == streams::KEY {
            return Ok(Named::Streams);
        }
        if name == "many-clients" {
            if cfg!(not(feature = "orca")) {
                return Err("many-clients needs the orca feature: cargo run --release --features orca --example shootout -- --scenario many-clients".to_owned());
            }
            return Ok(Named::ManyClients);
        }
        SCENARIOS
            .into_iter()
            .find(|s| s.key() == name)
            .map(Named::Table)
            .ok_or_else(|| format!("unknown scenario {name:?}"))
    })
}

/// Contenders; `all` is every one of them.
fn contender_list(v: &str) -> Result<List<Contender>, String> {
    let lists = list(v, |name| {
        if name == "all" {
            return Ok(CONTENDERS.to_vec());
        }
        CONTENDERS
            .into_iter()
            .find(|c| c.key() == name)
            .map(|c| vec![c])
            .ok_or_else(|| format!("unknown contender {name:?}"))
    })?;
    Ok(List(lists.0.concat()))
}

fn rate(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0 && *r <= 1e6)
        .ok_or_else(|| "not a rate in (0, 1e6]".to_owned())
}

fn rate_list(v: &str) -> Result<List<f64>, String> {
    list(v, |r| rate(r).map_err(|e| format!("{e}: {r:?}")))
}

fn secs(v: &str) -> Result<Duration, String> {
    v.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "not a number of seconds".to_owned())
}

fn deadline_ms(v: &str) -> Result<Duration, String> {
    v.parse::<u64>()
        .ok()
        .filter(|&d| d > 0)
        .map(Duration::from_millis)
        .ok_or_else(|| "not a positive integer".to_owned())
}

fn instances(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|&n| (3..=1000).contains(&n))
        .ok_or_else(|| "not a number in 3..=1000".to_owned())
}

fn rounds(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=20).contains(n))
        .ok_or_else(|| "not a number from 1 to 20".to_owned())
}

/// Pushes `x` unless `v` has it already.
fn push_new<T: PartialEq>(v: &mut Vec<T>, x: T) {
    if !v.contains(&x) {
        v.push(x);
    }
}

impl Args {
    /// The options, with the defaults of the mode, or what does not go together.
    fn resolve(self) -> Result<Opts, String> {
        let mut o = Opts {
            scenarios: vec![],
            contenders: vec![],
            rate: self.rate.unwrap_or(1000.0),
            duration: self.duration.unwrap_or(Duration::from_secs(1)),
            warmup: self.warmup.unwrap_or(Duration::from_millis(150)),
            deadline: self.deadline.unwrap_or(Duration::from_secs(1)),
            instances: self.instances.unwrap_or(20),
            // An empty path is no path: the mode's default.
            svg: self.svg.unwrap_or_default(),
            sweep: self.sweep,
            rates: self.rates.into_iter().flat_map(|l| l.0).collect(),
            live: self.live,
            streams: false,
            many_clients: false,
            rounds: self.rounds.unwrap_or(1),
            load_reports: self.load_reports,
        };
        for named in self.scenario.into_iter().flat_map(|l| l.0) {
            match named {
                Named::Table(s) => push_new(&mut o.scenarios, s),
                Named::Streams => o.streams = true,
                Named::ManyClients => o.many_clients = true,
            }
        }
        for c in self.contender.into_iter().flat_map(|l| l.0) {
            push_new(&mut o.contenders, c);
        }
        if o.load_reports && cfg!(not(feature = "orca")) {
            return Err("--load-reports needs the orca feature: cargo run --release --features orca --example shootout -- --load-reports".to_owned());
        }
        if o.duration.is_zero() {
            return Err("--duration must be above zero".to_owned());
        }
        if o.live {
            return live::finish_opts(o, self.duration.is_some(), self.instances.is_some());
        }
        if o.sweep {
            if self.rate.is_some() {
                return Err("--rate does not apply to the sweep: --rates".to_owned());
            }
            if o.rates.is_empty() {
                o.rates = SWEEP_RATES.to_vec();
            }
            if self.duration.is_none() {
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
}
