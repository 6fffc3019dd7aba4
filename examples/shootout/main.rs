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
//! own) and, for each scenario, sends calls through each contender in turn: the five
//! strategies of `BalancedChannel` (weighted round robin, which needs load reports, aside), tonic's `Channel::balance_list`, tower's p2c over
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
//!   contenders: FewestThenFastest, and FewestThenFastest with hedging (`HedgingPolicy` on Unary, 3
//!   attempts at most) whose delay is the p95 of the calls that did not stall in an unmeasured
//!   run without hedging just before (printed). Its table adds the extra attempts (calls that
//!   reached the servers beyond one per call, server-side counts) and checks hedging's target:
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
//! `--live` shows the balancer at work instead (`live.rs`): per instance, its state, calls in
//! flight as a bar, share of the calls and latency estimate, redrawn eight times a second while
//! an instance is killed and another hangs (or while the `--scenario`s named run), through
//! `BalancedChannel` only (`--contender`: one of ours or several, in turn).
//!
//! The files, by role: `options.rs` (the command line), `contenders.rs`, `scenarios.rs`,
//! `load.rs` (the load generator: one run of one contender), `report.rs` (the tables),
//! `svg.rs` (the charts), `live.rs` (the live view), and the scenarios that run on their own:
//! `streams.rs` (`stream-limit`) and `many_clients.rs` (`many-clients`). This file runs them.

use fleet_service as fleet;

mod contenders;
mod live;
mod load;
#[cfg(feature = "orca")]
mod many_clients;
mod options;
mod report;
mod scenarios;
mod streams;
mod svg;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic_balancer::Strategy;

use contenders::{set_hedge_delay, Contender};
use fleet::{Fleet, Shared};
use load::{reset, run_one, CallResult, Load, Progress};
use options::Opts;
use report::{ms, print_sweep_table, print_table, quantiles, summarize, Row};
use scenarios::{contenders_of, exceptions, start_fleet, Scenario, Setup, FAST, STALL};

fn main() {
    let opts = Opts::parse();
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

    let rates = if opts.sweep {
        opts.rates.len() * opts.rounds
    } else {
        1
    };
    let mut progress = Progress::new(
        opts.scenarios
            .iter()
            .map(|&s| rates * contenders_of(s, &opts).len())
            .sum(),
    );
    let started = Instant::now();
    if opts.sweep {
        let results = sweep(&opts, &rt, &fleet, &shared, &uris, &mut progress);
        drop(rt);
        svg::write_svg(&opts.svg, &svg::sweep_svg(&results, &opts));
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
    let results = scenarios(&opts, &rt, &fleet, &shared, &uris, &mut progress);
    drop(rt);

    svg::write_svg(&opts.svg, &svg::shootout_svg(&results, &opts));
    let calls: usize = results
        .iter()
        .flat_map(|(_, r)| r.iter().map(|r| r.calls))
        .sum();
    println!(
        "{calls} measured calls in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// What each measured run needs: the client runtime and the fleet.
struct Bench<'a> {
    rt: &'a tokio::runtime::Runtime,
    fleet: &'a Arc<Mutex<Fleet>>,
    shared: &'a [Arc<Shared>],
}

impl Bench<'_> {
    /// One contender over `setup` at `load`, on a fleet reset first: its row of the table.
    fn measure(
        &self,
        contender: Contender,
        setup: &Setup,
        load: Load,
        opts: &Opts,
        label: &str,
        progress: &mut Progress,
    ) -> Row {
        reset(self.fleet, setup);
        progress.draw(0.0, label);
        let run = self.rt.block_on(run_one(
            contender,
            setup,
            self.fleet,
            self.shared,
            load,
            opts.deadline,
            progress,
            label,
        ));
        let row = summarize(contender, &run, setup);
        progress.done_one();
        row
    }
}

/// Each scenario in turn, every contender in it: the order of the contenders rotates from one
/// scenario to the next, and the fleet is reset before each run.
fn scenarios(
    opts: &Opts,
    rt: &tokio::runtime::Runtime,
    fleet: &Arc<Mutex<Fleet>>,
    shared: &[Arc<Shared>],
    uris: &[String],
    progress: &mut Progress,
) -> Vec<(Scenario, Vec<Row>)> {
    let mut results = Vec::new();
    for (si, &scenario) in opts.scenarios.iter().enumerate() {
        let setup = scenario.setup(uris);
        let load = scenario.load(opts);
        let contenders = contenders_of(scenario, opts);
        if scenario == Scenario::Stalls {
            calibrate_hedging(rt, fleet, shared, &setup, load, opts, progress);
        }
        let k = contenders.len();
        let mut rows: Vec<Option<Row>> = (0..k).map(|_| None).collect();
        // Rotate the order from one scenario to the next.
        for j in 0..k {
            let ci = (j + si) % k;
            let contender = contenders[ci];
            let label = format!("{} / {}", scenario.key(), contender.name());
            let bench = Bench { rt, fleet, shared };
            rows[ci] = Some(bench.measure(contender, &setup, load, opts, &label, progress));
        }
        progress.clear();
        let rows: Vec<Row> = rows
            .into_iter()
            .map(|r| r.expect("every contender ran"))
            .collect();
        print_table(scenario, &rows, &setup, load, opts);
        results.push((scenario, rows));
    }
    progress.clear();
    results
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
    let plain = Contender::Ours(Strategy::FewestThenFastest);
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
    set_hedge_delay(p95);
    p95
}

/// Per scenario, per rate, one row per contender (in `opts.contenders`' order).
pub(crate) type SweepResults = Vec<(Scenario, Vec<Vec<Row>>)>;

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
            let mut runs: Vec<Vec<Row>> = (0..k).map(|_| Vec::new()).collect();
            for round in 0..opts.rounds {
                for j in 0..k {
                    let ci = (j + round + si * opts.rates.len() + ri) % k;
                    let contender = opts.contenders[ci];
                    let label = format!("{} {rate:.0}/s / {}", scenario.key(), contender.name());
                    let bench = Bench { rt, fleet, shared };
                    runs[ci].push(bench.measure(contender, &setup, load, opts, &label, progress));
                }
            }
            // Each contender's cell: its round with the median p99 (a failed p99 ranks last).
            by_rate.push(
                runs.into_iter()
                    .map(|mut rounds| {
                        rounds.sort_by_key(|r| r.pcts[1].unwrap_or(Duration::MAX));
                        let mid = rounds.len() / 2;
                        rounds.swap_remove(mid)
                    })
                    .collect(),
            );
        }
        progress.clear();
        print_sweep_table(scenario, &by_rate, opts);
        results.push((scenario, by_rate));
    }
    progress.clear();
    results
}
