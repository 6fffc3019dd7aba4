//! The command line, and the defaults and rules of each mode: the
//! scenario tables, the load sweep (`--sweep`), the live view (`--live`).

use std::time::Duration;

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
    /// `many_clients`), and its rounds.
    pub(crate) many_clients: bool,
    pub(crate) rounds: usize,
    /// Every instance of the fleet reports its load (ORCA) on every response.
    pub(crate) load_reports: bool,
}

impl Opts {
    /// The options of this run, from the command line; on an error, says so with the usage and
    /// exits (status 2), and on `--help` prints the usage and exits.
    pub(crate) fn parse() -> Opts {
        match parse_args() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e}\n\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
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
