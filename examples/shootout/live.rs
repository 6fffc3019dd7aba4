//! The shootout's live view (`--live`): what `BalancedChannel::endpoints()` says of each
//! instance, redrawn eight times a second while load runs and the fleet misbehaves.
//!
//! One row per instance: its state, its calls in flight as a bar (the mean of the samples taken
//! every 10 ms since the last frame, so that a bar shows load rather than one instant), its
//! share of the calls the channel routed in the last second, the channel's latency estimate,
//! its failed calls and ejections. Above them, what the callers saw in the last second (calls
//! that succeeded and failed); below them, the scenario's events: `[x]` done (at the time it
//! was), `[ ]` to come.
//!
//! On a terminal it draws on the alternate screen with plain ANSI escapes (no dependency), and
//! puts the terminal back (cursor shown, normal screen) when the run ends, on Ctrl-C, on
//! SIGTERM and on a panic, then prints the last picture of each run. When stdout is not a
//! terminal (piped, redirected), it prints plain lines instead: the events as they happen and
//! every instance's line once a second.
//!
//! Without `--scenario` it runs a script of its own, made to be watched: one instance slower
//! than the others all along, one killed and restarted, then one that hangs and recovers. With
//! `--scenario`, each named shootout scenario runs in turn with its own fleet behaviours and its
//! kill (kill-restart). Each run builds a fresh `BalancedChannel` with the strategy of each
//! `--contender` named (ours only; default least pending), and ejects for 3 s instead of the
//! default 30 s so that a readmission happens while one watches.
//!
//! This file holds the options, the scenarios and the run; `live/view.rs` what the view keeps
//! between frames, `live/picture.rs` the picture of one moment, `live/screen.rs` the terminal.

mod picture;
mod screen;
mod view;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Endpoint;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, Strategy};
use tower::util::BoxCloneService;

use crate::contenders::{Contender, Svc, CONNECT_TIMEOUT};
use crate::fleet::pb::fleet_client::FleetClient;
use crate::fleet::{Behavior, Fleet};
use crate::load::{call, reset};
use crate::options::Opts;
use crate::report::ms;
use crate::scenarios::{costly, start_fleet, Scenario, Setup, FAST};
use picture::{frame, Line};
use screen::Screen;
use view::View;

/// A live run's length unless `--duration` says otherwise: the script's four events at 2, 5, 7
/// and 10 s, and time to see the last one settle.
pub const DURATION: Duration = Duration::from_secs(14);
/// The fleet's size unless `--instances` says otherwise: few enough for short rows.
pub const INSTANCES: usize = 8;
/// How often the picture is redrawn, and how often the channel is sampled between two frames.
const FRAME: Duration = Duration::from_millis(125);
const SAMPLE: Duration = Duration::from_millis(10);
/// The ejection time of the live runs: short, so that a readmission shows within a run.
const EJECTION: Duration = Duration::from_secs(3);
/// The script's slow instance.
const SLOW_LIVE: Duration = Duration::from_millis(20);

// ---------------------------------------------------------------------------------------------
// Options

/// Completes the options of a live run: its own defaults (duration, fleet size, contender)
/// where the command line is silent, and the flags that do not apply to it refused.
pub fn finish_opts(mut o: Opts, duration_set: bool, instances_set: bool) -> Result<Opts, String> {
    if o.sweep {
        return Err("--live and --sweep do not go together".to_owned());
    }
    if !o.rates.is_empty() {
        return Err("--rates is for the sweep (--sweep)".to_owned());
    }
    if !o.svg.is_empty() {
        return Err("--live draws no chart: --svg does not apply".to_owned());
    }
    if !duration_set {
        o.duration = DURATION;
    }
    if !instances_set {
        o.instances = INSTANCES;
    }
    if o.contenders.is_empty() {
        o.contenders = vec![Contender::Ours(Strategy::FewestThenFastest)];
    }
    if let Some(c) = o
        .contenders
        .iter()
        .find(|c| !matches!(c, Contender::Ours(_)))
    {
        return Err(format!(
            "--live shows BalancedChannel's own view of its instances (endpoints()), which {} does not have: use fewest-then-fastest, least-pending, peak-ewma, p2c or round-robin",
            c.name()
        ));
    }
    Ok(o)
}

// ---------------------------------------------------------------------------------------------
// What a run does

/// Something done to the fleet at a moment of the run.
#[derive(Clone)]
enum Action {
    Stop(usize),
    Restart(usize),
    Set(usize, Behavior),
}

struct Event {
    /// When, as a fraction of the run.
    at: f64,
    action: Action,
    text: String,
}

/// One live run's scenario: the fleet's behaviours and addresses (a shootout scenario's
/// `Setup`), and the events on its timeline.
struct Plan {
    title: String,
    about: String,
    setup: Setup,
    events: Vec<Event>,
}

/// The live mode's own scenario: one instance slower all along; one killed, then restarted;
/// then one that hangs (accepts calls, never answers), then answers again.
fn script(uris: &[String], duration: Duration) -> Plan {
    let n = uris.len();
    let mut setup = Scenario::Uniform.setup(uris);
    let (killed, hung) = (1, 2);
    let slow = (n >= 4).then_some(n - 1);
    if let Some(s) = slow {
        setup.behaviors[s] = Behavior::Delay(SLOW_LIVE);
    }
    let secs = |f: f64| format!("{:.1} s", duration.as_secs_f64() * f);
    let (kill, back, hang, answer) = (1.0 / 7.0, 2.5 / 7.0, 3.5 / 7.0, 5.0 / 7.0);
    let mut about = match slow {
        Some(s) => format!(
            "i{s} answers in {}, the others in {}; ",
            ms(SLOW_LIVE),
            ms(FAST)
        ),
        None => format!("all answer in {}; ", ms(FAST)),
    };
    let _ = write!(
        about,
        "i{killed} is killed at {} and restarted at {}; i{hung} hangs from {} to {}",
        secs(kill),
        secs(back),
        secs(hang),
        secs(answer)
    );
    Plan {
        title: "kill and hang".to_owned(),
        about,
        setup,
        events: vec![
            Event {
                at: kill,
                action: Action::Stop(killed),
                text: format!("i{killed} killed: its server stops, its connections close"),
            },
            Event {
                at: back,
                action: Action::Restart(killed),
                text: format!("i{killed} restarted on the same port"),
            },
            Event {
                at: hang,
                action: Action::Set(hung, Behavior::Hang),
                text: format!("i{hung} hangs: accepts calls, never answers"),
            },
            Event {
                at: answer,
                action: Action::Set(hung, Behavior::Delay(FAST)),
                text: format!("i{hung} answers again, in {}", ms(FAST)),
            },
        ],
    }
}

/// A shootout scenario, live: its behaviours from the start, its kill and restart as events.
fn from_scenario(scenario: Scenario, uris: &[String]) -> Plan {
    let setup = scenario.setup(uris);
    let mut events = vec![];
    if let (Some((stop, restart)), Some(&victim)) = (setup.kill, setup.bad.first()) {
        events.push(Event {
            at: stop,
            action: Action::Stop(victim),
            text: format!("i{victim} killed: its server stops, its connections close"),
        });
        events.push(Event {
            at: restart,
            action: Action::Restart(victim),
            text: format!("i{victim} restarted on the same port"),
        });
    }
    Plan {
        title: scenario.key().to_owned(),
        about: scenario.describe(uris.len()),
        setup,
        events,
    }
}

// ---------------------------------------------------------------------------------------------
// The run

/// What the callers saw, counted as calls end.
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    by_code: [AtomicU64; 17],
}

impl Tally {
    fn new() -> Tally {
        Tally {
            ok: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            by_code: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn record(&self, r: Result<(), Code>) {
        match r {
            Ok(()) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err(code) => {
                let i = (code as usize).min(self.by_code.len() - 1);
                self.by_code[i].fetch_add(1, Ordering::Relaxed);
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    /// The failures so far by status, most frequent first.
    fn failures(&self) -> String {
        let mut v: Vec<(u64, Code)> = self
            .by_code
            .iter()
            .enumerate()
            .map(|(i, c)| (c.load(Ordering::Relaxed), Code::from(i as i32)))
            .filter(|(k, _)| *k > 0)
            .collect();
        v.sort_by_key(|a| std::cmp::Reverse(a.0));
        if v.is_empty() {
            return "none".to_owned();
        }
        v.iter()
            .map(|(k, c)| format!("{k} {}", code_name(*c)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn code_name(c: Code) -> &'static str {
    match c {
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        _ => "other",
    }
}

/// The load: open loop at `rate` (calls start on schedule, whether or not earlier ones ended),
/// or one caller at a time (closed loop), until `duration` has passed; returns when every call
/// has ended.
async fn generate(
    client: FleetClient<Svc>,
    closed_loop: bool,
    mixed: bool,
    rate: f64,
    duration: Duration,
    deadline: Duration,
    tally: Arc<Tally>,
) {
    let start = tokio::time::Instant::now();
    let end = start + duration;
    if closed_loop {
        let mut client = client;
        let mut id = 0u64;
        while tokio::time::Instant::now() < end {
            let r = call(&mut client, id, mixed && costly(id), deadline).await;
            tally.record(r);
            id += 1;
        }
        return;
    }
    let period = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0u64;
    loop {
        let now = tokio::time::Instant::now();
        let mut sched = start + period.mul_f64(i as f64);
        while sched <= now && sched < end {
            let mut client = client.clone();
            let tally = tally.clone();
            let id = i;
            tasks.spawn(async move {
                let r = call(&mut client, id, mixed && costly(id), deadline).await;
                tally.record(r);
            });
            i += 1;
            sched = start + period.mul_f64(i as f64);
        }
        while tasks.try_join_next().is_some() {}
        if sched >= end {
            break;
        }
        tokio::time::sleep_until(sched).await;
    }
    while tasks.join_next().await.is_some() {}
}

/// Runs the plan's events at their times (on a thread: stopping an instance joins its thread),
/// and notes when each was done.
fn timeline(
    plan_events: Vec<(Duration, Action)>,
    fleet: Arc<Mutex<Fleet>>,
    start: Instant,
    done: Arc<Mutex<Vec<Option<Duration>>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for (k, (at, action)) in plan_events.into_iter().enumerate() {
            std::thread::sleep((start + at).saturating_duration_since(Instant::now()));
            {
                let mut fleet = fleet.lock().unwrap();
                match action {
                    Action::Stop(i) => fleet.instances[i].stop(),
                    Action::Restart(i) => fleet.instances[i].restart(),
                    Action::Set(i, b) => fleet.instances[i].set(b),
                }
            }
            done.lock().unwrap()[k] = Some(start.elapsed());
        }
    })
}

/// Runs every plan with every contender named, each with the live view.
pub fn run(opts: &Opts) {
    let fleet = start_fleet(opts.instances, opts.load_reports);
    let uris = fleet.uris();
    let fleet = Arc::new(Mutex::new(fleet));
    let plans: Vec<Plan> = if opts.scenarios.is_empty() {
        vec![script(&uris, opts.duration)]
    } else {
        opts.scenarios
            .iter()
            .map(|&s| from_scenario(s, &uris))
            .collect()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let mut screen = Screen::open(&rt);
    let total = plans.len() * opts.contenders.len();
    let mut finals = vec![];
    let mut k = 0;
    for plan in &plans {
        for &contender in &opts.contenders {
            k += 1;
            let Contender::Ours(strategy) = contender else {
                unreachable!("finish_opts keeps ours only")
            };
            let last = run_one(
                plan,
                strategy,
                (k, total),
                &fleet,
                &uris,
                &rt,
                opts,
                &mut screen,
            );
            finals.push(last);
        }
    }
    if screen.close() {
        // The normal screen keeps the last picture of each run.
        let mut out = String::new();
        for f in &finals {
            for line in f {
                line.render(&mut out, usize::MAX, screen.color);
                out.push('\n');
            }
            out.push('\n');
        }
        print!("{out}");
    }
}

/// What the view shows of one run besides the channel's numbers.
struct RunInfo<'a> {
    plan: &'a Plan,
    strategy: Strategy,
    run: (usize, usize),
    instances: usize,
    rate: f64,
    deadline: Duration,
    duration: Duration,
}

#[allow(clippy::too_many_arguments)]
fn run_one(
    plan: &Plan,
    strategy: Strategy,
    run: (usize, usize),
    fleet: &Arc<Mutex<Fleet>>,
    fleet_uris: &[String],
    rt: &tokio::runtime::Runtime,
    opts: &Opts,
    screen: &mut Screen,
) -> Vec<Line> {
    reset(fleet, &plan.setup);
    let info = RunInfo {
        plan,
        strategy,
        run,
        instances: plan.setup.uris.len(),
        rate: opts.rate,
        deadline: opts.deadline,
        duration: opts.duration,
    };
    let channel = {
        let _rt = rt.enter();
        BalancedChannel::builder()
            .endpoints(plan.setup.uris.iter().map(|u| {
                Endpoint::from_shared(u.clone())
                    .expect("fleet URI")
                    .connect_timeout(CONNECT_TIMEOUT)
            }))
            .strategy(strategy)
            .ejection(Ejection::default().base_time(EJECTION))
            .build()
            .expect("balanced channel")
    };
    let client = FleetClient::new(BoxCloneService::new(channel.clone()) as Svc);
    let tally = Arc::new(Tally::new());
    let start = Instant::now();
    let load = rt.spawn(generate(
        client,
        plan.setup.closed_loop,
        plan.setup.mixed,
        opts.rate,
        opts.duration,
        opts.deadline,
        tally.clone(),
    ));
    let done = Arc::new(Mutex::new(vec![None; plan.events.len()]));
    let events = plan
        .events
        .iter()
        .map(|e| (opts.duration.mul_f64(e.at), e.action.clone()))
        .collect();
    let events = timeline(events, fleet.clone(), start, done.clone());

    let mut view = View::new(fleet_uris, tally.clone());
    let mut next_frame = start;
    let last = loop {
        view.sample(&channel.endpoints());
        let now = Instant::now();
        let finished = load.is_finished();
        if now >= next_frame || finished {
            view.roll(now);
            let done = done.lock().unwrap().clone();
            let pic = frame(&info, &view, now - start, &done, finished, screen.unicode);
            screen.show(&pic, now - start, &done, &info, finished);
            next_frame += FRAME;
            if next_frame < now {
                // Behind (a loaded machine): the next frame a period from now.
                next_frame = now + FRAME;
            }
            if finished {
                break pic.lines();
            }
        }
        std::thread::sleep(SAMPLE.min(next_frame.saturating_duration_since(Instant::now())));
    };
    rt.block_on(load).expect("load task");
    events.join().expect("timeline thread");
    last
}
