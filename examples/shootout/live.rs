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

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Endpoint;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, EndpointStats, State, Strategy};
use tower::util::BoxCloneService;

use crate::contenders::{Contender, Svc, CONNECT_TIMEOUT};
use crate::fleet::pb::fleet_client::FleetClient;
use crate::fleet::{Behavior, Fleet};
use crate::load::{call, reset};
use crate::options::Opts;
use crate::report::ms;
use crate::scenarios::{costly, start_fleet, Scenario, Setup, FAST};

/// A live run's length unless `--duration` says otherwise: the script's four events at 2, 5, 7
/// and 10 s, and time to see the last one settle.
pub const DURATION: Duration = Duration::from_secs(14);
/// The fleet's size unless `--instances` says otherwise: few enough for short rows.
pub const INSTANCES: usize = 8;
/// How often the picture is redrawn, and how often the channel is sampled between two frames.
const FRAME: Duration = Duration::from_millis(125);
const SAMPLE: Duration = Duration::from_millis(10);
/// The window of the shares and of the callers' rates.
const WINDOW: Duration = Duration::from_secs(1);
/// How often the plain (non-terminal) output prints every instance's line.
const PLAIN_EVERY: Duration = Duration::from_secs(1);
/// The ejection time of the live runs: short, so that a readmission shows within a run.
const EJECTION: Duration = Duration::from_secs(3);
/// The script's slow instance.
const SLOW_LIVE: Duration = Duration::from_millis(20);
/// The width of the in-flight bar, in cells.
const BAR: usize = 20;

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
        o.contenders = vec![Contender::Ours(Strategy::LeastPending)];
    }
    if let Some(c) = o
        .contenders
        .iter()
        .find(|c| !matches!(c, Contender::Ours(_)))
    {
        return Err(format!(
            "--live shows BalancedChannel's own view of its instances (endpoints()), which {} does not have: use least-pending, peak-ewma, p2c or round-robin",
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

// ---------------------------------------------------------------------------------------------
// What the view keeps between frames

/// One instance, as sampled.
struct Track {
    uri: String,
    /// Its index in the fleet (None: an address of no instance, such as an unreachable one).
    index: Option<usize>,
    last: EndpointStats,
    /// In-flight samples since the last frame.
    sum: u64,
    samples: u32,
    /// Their mean, as of the last frame.
    mean: f64,
    /// `started` at each frame within the window (and the one just before it).
    history: VecDeque<(Instant, u64)>,
}

impl Track {
    fn routed_in_window(&self) -> u64 {
        match (self.history.front(), self.history.back()) {
            (Some(a), Some(b)) => b.1.saturating_sub(a.1),
            _ => 0,
        }
    }
}

struct View {
    fleet_uris: Vec<String>,
    tracks: Vec<Track>,
    tally: Arc<Tally>,
    /// (when, ok, failed) at each frame within the window.
    callers: VecDeque<(Instant, u64, u64)>,
    /// The largest mean in flight seen so far, for the bars' scale.
    peak: f64,
}

fn trim(uri: &str) -> &str {
    uri.trim_end_matches('/')
}

/// Drops the entries older than the window, but the newest of them (the window's start).
fn prune<T>(history: &mut VecDeque<(Instant, T)>, now: Instant) {
    while history.len() > 1 && now.duration_since(history[1].0) >= WINDOW {
        history.pop_front();
    }
}

impl View {
    fn new(fleet_uris: &[String], tally: Arc<Tally>) -> View {
        View {
            fleet_uris: fleet_uris.to_vec(),
            tracks: vec![],
            tally,
            callers: VecDeque::new(),
            peak: 0.0,
        }
    }

    fn sample(&mut self, endpoints: &[EndpointStats]) {
        for e in endpoints {
            let track = match self.tracks.iter().position(|t| t.uri == e.uri()) {
                Some(k) => &mut self.tracks[k],
                None => {
                    let index = self
                        .fleet_uris
                        .iter()
                        .position(|u| trim(u) == trim(e.uri()));
                    self.tracks.push(Track {
                        uri: e.uri().to_owned(),
                        index,
                        last: e.clone(),
                        sum: 0,
                        samples: 0,
                        mean: 0.0,
                        history: VecDeque::new(),
                    });
                    // Fleet order; addresses of no instance after them.
                    self.tracks
                        .sort_by_key(|t| (t.index.is_none(), t.index, t.uri.clone()));
                    let k = self.tracks.iter().position(|t| t.uri == e.uri()).unwrap();
                    &mut self.tracks[k]
                }
            };
            track.sum += e.in_flight() as u64;
            track.samples += 1;
            track.last = e.clone();
        }
    }

    /// Closes the samples of one frame.
    fn roll(&mut self, now: Instant) {
        for t in &mut self.tracks {
            if t.samples > 0 {
                t.mean = t.sum as f64 / f64::from(t.samples);
            }
            t.sum = 0;
            t.samples = 0;
            self.peak = self.peak.max(t.mean);
            t.history.push_back((now, t.last.started()));
            prune(&mut t.history, now);
        }
        let (ok, failed) = (
            self.tally.ok.load(Ordering::Relaxed),
            self.tally.failed.load(Ordering::Relaxed),
        );
        self.callers.push_back((now, ok, failed));
        while self.callers.len() > 1 && now.duration_since(self.callers[1].0) >= WINDOW {
            self.callers.pop_front();
        }
    }

    /// Calls that succeeded and failed per second, over the window.
    fn caller_rates(&self) -> (f64, f64) {
        match (self.callers.front(), self.callers.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                let s = (b.0 - a.0).as_secs_f64();
                ((b.1 - a.1) as f64 / s, (b.2 - a.2) as f64 / s)
            }
            _ => (0.0, 0.0),
        }
    }

    /// The bars' full scale: 4 calls, or the power of two above the largest mean seen.
    fn scale(&self) -> f64 {
        let mut s = 4.0;
        while s < self.peak {
            s *= 2.0;
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The picture

#[derive(Clone, Copy, PartialEq)]
enum Style {
    Plain,
    Bold,
    Dim,
    /// An SGR foreground colour (31 red ... 36 cyan).
    Fg(u8),
}

/// One line of the picture: pieces of text, each with a style.
#[derive(Clone, Default)]
struct Line(Vec<(String, Style)>);

impl Line {
    fn new() -> Line {
        Line(vec![])
    }

    fn of(text: impl Into<String>, style: Style) -> Line {
        Line(vec![(text.into(), style)])
    }

    fn push(mut self, text: impl Into<String>, style: Style) -> Line {
        self.0.push((text.into(), style));
        self
    }

    fn text(&self) -> String {
        self.0.iter().map(|(t, _)| t.as_str()).collect()
    }

    /// Appends the line to `out`, cut at `width` characters, with colours if `color`.
    fn render(&self, out: &mut String, width: usize, color: bool) {
        let mut left = width;
        for (text, style) in &self.0 {
            if left == 0 {
                break;
            }
            let n = text.chars().count();
            let piece: String = if n > left {
                text.chars().take(left).collect()
            } else {
                text.clone()
            };
            left -= n.min(left);
            let sgr = match style {
                _ if !color => None,
                Style::Plain => None,
                Style::Bold => Some("1".to_owned()),
                Style::Dim => Some("2".to_owned()),
                Style::Fg(c) => Some(c.to_string()),
            };
            match sgr {
                Some(s) => {
                    let _ = write!(out, "\x1b[{s}m{piece}\x1b[0m");
                }
                None => out.push_str(&piece),
            }
        }
    }
}

fn state_style(s: State) -> Style {
    match s {
        State::Ready => Style::Fg(32),
        State::Connecting => Style::Fg(33),
        State::Failing | State::Unhealthy => Style::Fg(31),
        State::Ejected => Style::Fg(35),
        _ => Style::Fg(36),
    }
}

/// `value` of `full` as a bar of `BAR` cells, in eighths of a cell where the terminal shows
/// block characters.
fn bar(value: f64, full: f64, unicode: bool) -> String {
    let eighths = ((value / full).clamp(0.0, 1.0) * (BAR * 8) as f64).round() as usize;
    let mut s = String::new();
    if unicode {
        const PARTS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
        s.extend(std::iter::repeat_n('█', eighths / 8));
        if !eighths.is_multiple_of(8) {
            s.push(PARTS[eighths % 8]);
        }
    } else {
        s.extend(std::iter::repeat_n('#', (eighths + 4) / 8));
    }
    let n = s.chars().count();
    s.extend(std::iter::repeat_n(' ', BAR - n));
    s
}

fn latency_cell(l: Option<Duration>) -> String {
    match l {
        None => "-".to_owned(),
        Some(d) if d >= Duration::from_secs(10) => ">10 s".to_owned(),
        Some(d) => {
            let m = d.as_secs_f64() * 1e3;
            if m >= 100.0 {
                format!("{m:.0} ms")
            } else {
                format!("{m:.1} ms")
            }
        }
    }
}

/// The port of an `http://host:port` URI, or the URI.
fn port(uri: &str) -> String {
    match trim(uri).rsplit_once(':') {
        Some((_, p)) if p.chars().all(|c| c.is_ascii_digit()) => format!(":{p}"),
        _ => trim(uri).to_owned(),
    }
}

fn instance_label(t: &Track) -> String {
    t.index.map_or_else(|| "--".to_owned(), |i| format!("i{i}"))
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![];
    let mut cur = String::new();
    for word in text.split(' ') {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// The picture of a run at one moment, in parts: a terminal shows them all, the plain output
/// picks from them.
struct Picture {
    /// The run's title and what it does.
    head: Vec<Line>,
    /// The time, and what the callers saw.
    status: Vec<Line>,
    /// The column names, then one row per instance.
    table: Vec<Line>,
    /// The events, done (with when) and to come.
    events: Vec<Line>,
    foot: Vec<Line>,
}

impl Picture {
    /// The whole picture if it fits in `rows`; else without what matters least (the notes,
    /// the description, the blank lines, then the events), so that the instances' rows stay.
    fn fit(&self, rows: usize) -> Vec<Line> {
        let all = self.lines();
        if all.len() <= rows {
            return all;
        }
        let mut v = vec![self.head[0].clone()];
        v.extend(self.status.iter().cloned());
        v.extend(self.table.iter().cloned());
        if v.len() + self.events.len() <= rows {
            v.extend(self.events.iter().cloned());
        }
        v
    }

    fn lines(&self) -> Vec<Line> {
        let mut v = self.head.clone();
        v.extend(self.status.iter().cloned());
        v.push(Line::new());
        v.extend(self.table.iter().cloned());
        if !self.events.is_empty() {
            v.push(Line::new());
            v.extend(self.events.iter().cloned());
        }
        v.push(Line::new());
        v.extend(self.foot.iter().cloned());
        v
    }
}

/// The picture of a run at `t`.
fn frame(
    info: &RunInfo<'_>,
    view: &View,
    t: Duration,
    done: &[Option<Duration>],
    finished: bool,
    unicode: bool,
) -> Picture {
    let dot = if unicode { " \u{b7} " } else { " - " };
    let (k, total) = info.run;
    let mut title = format!(
        "tonic-balancer live{dot}{}{dot}{}",
        info.plan.title,
        Contender::Ours(info.strategy).name()
    );
    if total > 1 {
        let _ = write!(title, "{dot}run {k} of {total}");
    }
    let mut head = vec![Line::of(title, Style::Bold)];
    for l in wrap(&info.plan.about, 78) {
        head.push(Line::of(l, Style::Dim));
    }
    let load = if info.plan.setup.closed_loop {
        "one call at a time".to_owned()
    } else {
        format!("{:.0} calls/s", info.rate)
    };
    head.push(Line::of(
        format!(
            "{} instances{dot}{load}{dot}deadline {}{dot}ejection {:.0} s (default 30 s)",
            info.instances,
            ms(info.deadline),
            EJECTION.as_secs_f64()
        ),
        Style::Dim,
    ));

    let (ok, failed) = view.caller_rates();
    let when = if finished {
        format!("t {:5.1} s, done", t.as_secs_f64())
    } else if t > info.duration {
        format!("t {:5.1} s, last calls", t.as_secs_f64())
    } else {
        format!(
            "t {:5.1} s of {:.1} s",
            t.as_secs_f64(),
            info.duration.as_secs_f64()
        )
    };
    let status = vec![
        Line::of(when, Style::Bold)
            .push(
                format!("   callers, last second: {ok:.0} ok/s, "),
                Style::Plain,
            )
            .push(
                format!("{failed:.0} failed/s"),
                if failed > 0.0 {
                    Style::Fg(31)
                } else {
                    Style::Plain
                },
            ),
        Line::of(
            format!("failed so far: {}", view.tally.failures()),
            Style::Dim,
        ),
    ];

    let scale = view.scale();
    let mut table = vec![Line::of(
        format!(
            "{:<4} {:<7}{:<11}{:<width$} {:>7} {:>8} {:>6} {:>3}",
            "",
            "port",
            "state",
            format!("in flight (full bar: {scale:.0})"),
            "share",
            "latency",
            "failed",
            "ej",
            // The bar, a space and the mean.
            width = BAR + 5
        ),
        Style::Bold,
    )];
    let routed: u64 = view.tracks.iter().map(Track::routed_in_window).sum();
    for tr in &view.tracks {
        let e = &tr.last;
        let share = if routed > 0 {
            format!(
                "{:.1}%",
                100.0 * tr.routed_in_window() as f64 / routed as f64
            )
        } else {
            "-".to_owned()
        };
        table.push(
            Line::of(
                format!("{:<4} {:<7}", instance_label(tr), port(&tr.uri)),
                Style::Plain,
            )
            .push(
                format!("{:<11}", e.state().to_string()),
                state_style(e.state()),
            )
            .push(bar(tr.mean, scale, unicode), Style::Fg(36))
            .push(
                format!(
                    " {:>4.1} {:>7} {:>8} {:>6} {:>3}",
                    tr.mean,
                    share,
                    latency_cell(e.latency()),
                    e.failed(),
                    e.ejections()
                ),
                Style::Plain,
            ),
        );
    }

    let events = info
        .plan
        .events
        .iter()
        .zip(done)
        .map(|(ev, d)| match d {
            Some(at) => Line::of(format!("[x] {:5.1} s  ", at.as_secs_f64()), Style::Bold)
                .push(&ev.text, Style::Plain),
            None => Line::of(
                format!(
                    "[ ] {:5.1} s  {}",
                    info.duration.mul_f64(ev.at).as_secs_f64(),
                    ev.text
                ),
                Style::Dim,
            ),
        })
        .collect();

    let mut foot = vec![Line::of(
        "share: of the calls routed in the last second; latency: the channel's estimate",
        Style::Dim,
    )];
    if !finished {
        foot.push(Line::of("Ctrl-C stops", Style::Dim));
    }
    Picture {
        head,
        status,
        table,
        events,
        foot,
    }
}

// ---------------------------------------------------------------------------------------------
// The terminal

/// Set once the terminal has been put back: no frame is drawn after it.
static CLOSED: AtomicBool = AtomicBool::new(false);

const ENTER: &str = "\x1b[?1049h\x1b[?25l\x1b[2J";
const LEAVE: &str = "\x1b[0m\x1b[?25h\x1b[?1049l";

/// Puts the terminal back, once (from the run's end, a signal or a panic), under stdout's lock
/// so that no frame is half-drawn around it. Returns whether this call did it.
fn restore() -> bool {
    let mut out = std::io::stdout().lock();
    if CLOSED.swap(true, Ordering::SeqCst) {
        return false;
    }
    let _ = out.write_all(LEAVE.as_bytes());
    let _ = out.flush();
    true
}

/// Where the picture goes: a terminal (redrawn in place) or plain lines.
struct Screen {
    tty: bool,
    color: bool,
    unicode: bool,
    /// Rows and columns, checked about once a second (the terminal can be resized).
    size: (usize, usize),
    size_checked: Option<Instant>,
    /// Plain output: when every instance's line was last printed, and events already printed.
    last_plain: Option<Duration>,
    printed: Vec<bool>,
}

impl Screen {
    fn open(rt: &tokio::runtime::Runtime) -> Screen {
        let tty =
            std::io::stdout().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
        let locale = ["LC_ALL", "LC_CTYPE", "LANG"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
            .unwrap_or_default()
            .to_ascii_lowercase();
        let screen = Screen {
            tty,
            color: tty && std::env::var_os("NO_COLOR").is_none(),
            unicode: locale.contains("utf-8") || locale.contains("utf8"),
            size: (24, 80),
            size_checked: None,
            last_plain: None,
            printed: vec![],
        };
        if tty {
            // Registered before the screen changes, so that no signal finds it changed and
            // unwatched.
            let _rt = rt.enter();
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                for (kind, name, code) in [
                    (SignalKind::interrupt(), "Ctrl-C", 130),
                    (SignalKind::terminate(), "SIGTERM", 143),
                ] {
                    let mut s = signal(kind).expect("signal handler");
                    rt.spawn(async move {
                        s.recv().await;
                        restore();
                        eprintln!("live view stopped ({name})");
                        std::process::exit(code);
                    });
                }
            }
            #[cfg(not(unix))]
            rt.spawn(async {
                let _ = tokio::signal::ctrl_c().await;
                restore();
                eprintln!("live view stopped (Ctrl-C)");
                std::process::exit(130);
            });
            // A panic's message comes after the terminal is back, where it stays readable.
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |p| {
                restore();
                hook(p);
            }));
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(ENTER.as_bytes());
            let _ = out.flush();
        }
        screen
    }

    /// The terminal's rows and columns (`stty size` on the controlling terminal), checked at
    /// most once a second; 24 x 80 if it cannot tell.
    fn size(&mut self) -> (usize, usize) {
        if self
            .size_checked
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return self.size;
        }
        self.size_checked = Some(Instant::now());
        let asked = std::fs::File::open("/dev/tty").ok().and_then(|tty| {
            let out = std::process::Command::new("stty")
                .arg("size")
                .stdin(tty)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            let mut it = text.split_whitespace().map(|v| v.parse::<usize>().ok());
            Some((it.next()??, it.next()??))
        });
        if let Some((rows, cols)) = asked.filter(|&(r, c)| r > 0 && c > 0) {
            self.size = (rows, cols);
        }
        self.size
    }

    fn show(
        &mut self,
        pic: &Picture,
        t: Duration,
        done: &[Option<Duration>],
        info: &RunInfo,
        finished: bool,
    ) {
        if self.tty {
            let rows = self.size().0;
            self.draw(&pic.fit(rows));
        } else {
            self.plain(pic, t, done, info, finished);
        }
    }

    /// Redraws the picture in place: from the top left, each line cleared to its end, the rest
    /// of the screen cleared; cut to the terminal's size (a line one column short of the
    /// width, so that the cursor never wraps).
    fn draw(&mut self, lines: &[Line]) {
        let (rows, cols) = self.size();
        let width = cols.saturating_sub(1).max(1);
        let mut buf = String::from("\x1b[H");
        let fit = lines.len() <= rows;
        let shown = if fit {
            lines.len()
        } else {
            rows.saturating_sub(1)
        };
        for (k, line) in lines.iter().take(shown).enumerate() {
            if k > 0 {
                buf.push_str("\r\n");
            }
            line.render(&mut buf, width, self.color);
            buf.push_str("\x1b[K");
        }
        if !fit {
            buf.push_str("\r\n");
            Line::of(
                format!(
                    "({} more lines: a taller terminal shows them)",
                    lines.len() - shown
                ),
                Style::Dim,
            )
            .render(&mut buf, width, self.color);
            buf.push_str("\x1b[K");
        }
        buf.push_str("\x1b[J");
        let mut out = std::io::stdout().lock();
        if CLOSED.load(Ordering::SeqCst) {
            return;
        }
        let _ = out.write_all(buf.as_bytes());
        let _ = out.flush();
    }

    /// Plain output: a run's heading once, each event when it has happened, and the status and
    /// every instance's row once a second and at the end of the run.
    fn plain(
        &mut self,
        pic: &Picture,
        t: Duration,
        done: &[Option<Duration>],
        info: &RunInfo,
        finished: bool,
    ) {
        let mut out = String::new();
        let stamp = format!("[{:6.1} s]", t.as_secs_f64());
        if self.last_plain.is_none() {
            for l in &pic.head {
                out.push_str(&l.text());
                out.push('\n');
            }
            self.printed = vec![false; done.len()];
        }
        for (k, d) in done.iter().enumerate() {
            if let (Some(at), false) = (d, self.printed[k]) {
                self.printed[k] = true;
                let _ = writeln!(
                    out,
                    "[{:6.1} s] event: {}",
                    at.as_secs_f64(),
                    info.plan.events[k].text
                );
            }
        }
        if finished || self.last_plain.is_none_or(|p| t >= p + PLAIN_EVERY) {
            self.last_plain = Some(t);
            for l in pic.status.iter().chain(&pic.table) {
                let _ = writeln!(out, "{stamp} {}", l.text().trim_end());
            }
        }
        if finished {
            // The next run prints its heading.
            self.last_plain = None;
            out.push('\n');
        }
        if !out.is_empty() {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(out.as_bytes());
            let _ = o.flush();
        }
    }

    /// Puts the terminal back if this screen changed it; returns whether it did.
    fn close(&mut self) -> bool {
        self.tty && restore()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.close();
    }
}
