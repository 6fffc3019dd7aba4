//! The report: each run summed up (success, latency percentiles over all calls, throughput,
//! the share of the calls that reached the misbehaving instances, each instance's share), and
//! the tables printed per scenario and per sweep.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use tonic_balancer::Strategy;

use crate::contenders::{hedge_delay, Contender};
use crate::load::{CallResult, Load, RunResult};
use crate::options::Opts;
use crate::scenarios::{Scenario, Setup};

pub(crate) struct Row {
    pub(crate) contender: Contender,
    pub(crate) ok_pct: f64,
    /// p50, p99, p99.9; `None` where the percentile lands on failed calls.
    pub(crate) pcts: [Option<Duration>; 3],
    pub(crate) ok_per_sec: f64,
    pub(crate) bad_share: Option<f64>,
    pub(crate) errors: BTreeMap<String, usize>,
    pub(crate) calls: usize,
    pub(crate) max_lag: Duration,
    /// Each reported instance's share of the calls that reached them, in % (server-side
    /// counts; empty where the scenario reports none).
    pub(crate) shares: Vec<f64>,
    /// p99 of the cheap (Unary) calls alone, in mixed-methods.
    cheap_p99: Option<Option<Duration>>,
    /// Expensive calls among the measured ones, in mixed-methods.
    pub(crate) costly_calls: usize,
    /// Calls that reached the servers beyond one per measured call, in % of the calls.
    pub(crate) extra_pct: f64,
}

const QUANTILES: [f64; 3] = [0.50, 0.99, 0.999];
pub(crate) const QUANTILE_NAMES: [&str; 3] = ["p50", "p99", "p99.9"];

/// The quantiles of these calls' latencies; failures rank after every success (`None`).
pub(crate) fn quantiles<'a>(
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

pub(crate) fn summarize(contender: Contender, run: &RunResult, setup: &Setup) -> Row {
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

pub(crate) fn ms(d: Duration) -> String {
    let m = d.as_secs_f64() * 1e3;
    if m >= 100.0 {
        format!("{m:.0} ms")
    } else if m >= 10.0 {
        format!("{m:.1} ms")
    } else {
        format!("{m:.2} ms")
    }
}

pub(crate) fn pct_cell(p: Option<Duration>) -> String {
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

pub(crate) fn print_table(
    scenario: Scenario,
    rows: &[Row],
    setup: &Setup,
    load: Load,
    opts: &Opts,
) {
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

/// The stalls table: latency, extra attempts, and hedging's target (hedging cuts p99 at
/// least 5x against the same strategy without it, with at most 10% extra attempts).
fn print_stalls_table(rows: &[Row]) {
    let delay = hedge_delay();
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
        find(Contender::Ours(Strategy::FewestThenFastest)),
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

/// Rows = contenders, columns = rates, cells = p99 (`fail`: it falls on failed calls).
pub(crate) fn print_sweep_table(scenario: Scenario, by_rate: &[Vec<Row>], opts: &Opts) {
    println!();
    println!(
        "== sweep/{}: {} (p99 by rate, {:.1} s per contender and rate, deadline {}{})",
        scenario.key(),
        scenario.describe(opts.instances),
        opts.duration.as_secs_f64(),
        ms(opts.deadline),
        if opts.rounds > 1 {
            format!("; each cell the median of {} rounds", opts.rounds)
        } else {
            String::new()
        },
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
