use fleet_service as fleet;

// A soak test of the channel: calls of every kind, with random deadlines and random
// cancellations, while a chaos task kills, restarts, fails, hangs and slows instances and a
// membership task adds and removes them. Two "anchor" instances are never touched, so a usable
// instance is always there: no call may fail for a reason of the channel's own making.
//
// Runs about 10 s (`TONIC_BALANCER_SOAK_SECS` to change it); `TONIC_BALANCER_SOAK_SEED` replays
// the same random choices (the timing, and so the run, still differs). The checks do not depend
// on timing: every call's outcome is put in a class, and only classes that a correct channel
// never produces fail the test. Run with `-- --nocapture` for the summary table.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{total_in_flight, wait_until, Behavior, Instance};
use futures::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tonic::{Code, Request, Status};
#[cfg(feature = "health-check")]
use tonic_balancer::HealthCheck;
use tonic_balancer::{Backoff, BalancedChannel, Ejection, HedgingPolicy, RetryPolicy};

type Client = FleetClient<BalancedChannel>;

/// Generous bound for conditions that hold within milliseconds on an idle machine.
const LIMIT: Duration = Duration::from_secs(30);
/// How long past its deadline (or, without one, at all) a call may take before the test calls
/// it stuck: hung instances are restarted within half a second.
const STUCK: Duration = Duration::from_secs(10);
/// The channel's background tasks end when it is dropped, not when their timers next fire
/// (the health checks tick every 3 s): generous for a loaded machine, short of the 3 s tick.
const TASKS_END_WITHIN: Duration = Duration::from_secs(2);
const LOAD_TASKS: u64 = 8;
const ANCHORS: usize = 2;
const CHURNED: usize = 4;

// ---------------------------------------------------------------------------------------------
// Randomness: a seeded xorshift64*, one stream per task.

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that nearby seeds give unrelated streams (and never 0).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent` / 100.
    fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Uniform in `lo..=hi` milliseconds.
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: {e}")),
    )
}

// ---------------------------------------------------------------------------------------------
// Calls and their outcomes.

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Unary,
    ServerStream,
    ClientStream,
    Bidi,
}

const KINDS: [Kind; 4] = [
    Kind::Unary,
    Kind::ServerStream,
    Kind::ClientStream,
    Kind::Bidi,
];

/// How the test itself ends a call early, if it does (always by dropping, never by a status).
#[derive(Debug, Clone, Copy)]
enum Cancel {
    None,
    /// `tokio::time::timeout` around the whole call.
    Timeout(Duration),
    /// The call runs in a task of its own, aborted after this long.
    Abort(Duration),
    /// The response stream is dropped after this many messages (streaming responses).
    DropStream(u32),
}

/// One call, as drawn.
#[derive(Debug, Clone, Copy)]
struct Call {
    kind: Kind,
    id: u64,
    /// Server stream: replies asked for; client stream and bidi: messages sent; unary: payload
    /// bytes.
    count: u32,
    deadline: Option<Duration>,
    cancel: Cancel,
    /// Client stream: yield between the messages, so that a cancellation can land mid-body.
    pause: bool,
}

impl Call {
    fn draw(rng: &mut Rng, id: u64) -> Call {
        let kind = KINDS[rng.below(4) as usize];
        let count = match kind {
            Kind::Unary => rng.below(65) as u32,
            Kind::ServerStream => rng.below(21) as u32,
            Kind::ClientStream => rng.below(17) as u32,
            Kind::Bidi => rng.below(13) as u32,
        };
        let deadline = match rng.below(4) {
            0 => None,
            1 => Some(rng.ms(50, 200)),
            _ => Some(rng.ms(200, 2000)),
        };
        let cancel = match rng.below(100) {
            0..=59 => Cancel::None,
            60..=74 => Cancel::Timeout(rng.ms(0, 300)),
            75..=84 => Cancel::Abort(rng.ms(0, 300)),
            _ if matches!(kind, Kind::ServerStream | Kind::Bidi) => {
                Cancel::DropStream(rng.below(u64::from(count) + 1) as u32)
            }
            _ => Cancel::None,
        };
        Call {
            kind,
            id,
            count,
            deadline,
            cancel,
            pause: rng.percent(30),
        }
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        if let Some(d) = self.deadline {
            r.set_timeout(d);
        }
        r
    }
}

/// How a call ended, short of success.
enum Bad {
    Status(Status),
    /// A success whose replies are not what was asked for (invariant 1).
    Wrong(String),
    /// The call's own task panicked.
    Panic(String),
}

impl From<Status> for Bad {
    fn from(s: Status) -> Bad {
        Bad::Status(s)
    }
}

/// How a call ended, when not in error.
enum Ended {
    Done,
    /// The test dropped the call or its stream.
    Dropped,
}

/// Where a call's outcome falls. The ones after `Scripted` are failures no correct channel
/// produces while an anchor is in the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    Ok,
    /// Dropped by the test (timeout around it, task aborted, stream dropped).
    CancelledByTest,
    /// DEADLINE_EXCEEDED, at or after the call's own deadline.
    Deadline,
    /// UNAVAILABLE naming a connection that broke under the call or could not be opened (an
    /// instance was killed).
    Broken,
    /// A status that a failing instance was scripted to send, that retries could not hide.
    Scripted,
    // Forbidden from here on.
    WrongReply,
    DeadlineEarly,
    DeadlineWithoutDeadline,
    Cancelled,
    Unknown,
    Internal,
    NoInstances,
    NoUsable,
    RetryNoneLeft,
    OtherUnavailable,
    Other,
    Stuck,
    Panic,
}

impl Class {
    fn allowed(self) -> bool {
        self <= Class::Scripted
    }
}

fn classify(status: &Status, deadline: Option<Duration>, elapsed: Duration) -> Class {
    let msg = status.message();
    match status.code() {
        Code::DeadlineExceeded => match deadline {
            // The channel's timer starts after the test's clock: it never ends a call before
            // the test sees the deadline pass.
            Some(d) if elapsed >= d => Class::Deadline,
            Some(_) => Class::DeadlineEarly,
            None => Class::DeadlineWithoutDeadline,
        },
        Code::Unavailable | Code::ResourceExhausted if msg.contains("scripted to fail") => {
            Class::Scripted
        }
        Code::Unavailable
            if msg.contains("broke during the call") || msg.contains("could not be opened") =>
        {
            Class::Broken
        }
        Code::Unavailable if msg.contains("no instances in the set") => Class::NoInstances,
        Code::Unavailable if msg.contains("no usable instance") => Class::NoUsable,
        Code::Unavailable if msg.contains("no instance left") => Class::RetryNoneLeft,
        Code::Unavailable => Class::OtherUnavailable,
        Code::Cancelled => Class::Cancelled,
        Code::Unknown => Class::Unknown,
        Code::Internal => Class::Internal,
        _ => Class::Other,
    }
}

async fn unary(mut client: Client, call: Call) -> Result<Ended, Bad> {
    let payload = vec![call.id as u8; call.count as usize];
    let msg = Req {
        id: call.id,
        payload: payload.clone(),
        ..Default::default()
    };
    let r = client.unary(call.request(msg)).await?.into_inner();
    if r.id != call.id || r.payload != payload {
        return Err(Bad::Wrong(format!(
            "unary {}: reply id {} with {} payload bytes (sent {})",
            call.id,
            r.id,
            r.payload.len(),
            payload.len()
        )));
    }
    Ok(Ended::Done)
}

async fn server_stream(mut client: Client, call: Call) -> Result<Ended, Bad> {
    let msg = Req {
        id: call.id,
        count: call.count,
        ..Default::default()
    };
    let mut replies = client.server_stream(call.request(msg)).await?.into_inner();
    let mut seq = 0;
    loop {
        if matches!(call.cancel, Cancel::DropStream(k) if k == seq) {
            return Ok(Ended::Dropped);
        }
        match replies.message().await? {
            Some(r) if r.id == call.id && r.seq == seq && seq < call.count => seq += 1,
            Some(r) => {
                return Err(Bad::Wrong(format!(
                    "server stream {} of {}: reply {seq} is id {} seq {}",
                    call.id, call.count, r.id, r.seq
                )))
            }
            None if seq == call.count => return Ok(Ended::Done),
            None => {
                return Err(Bad::Wrong(format!(
                    "server stream {}: {seq} replies of {}, then OK",
                    call.id, call.count
                )))
            }
        }
    }
}

fn message_id(call: &Call, i: u32) -> u64 {
    (call.id << 6) + u64::from(i) + 1
}

async fn client_stream(mut client: Client, call: Call) -> Result<Ended, Bad> {
    let msgs: Vec<Req> = (0..call.count)
        .map(|i| Req {
            id: message_id(&call, i),
            ..Default::default()
        })
        .collect();
    let pause = call.pause;
    let input = futures::stream::iter(msgs).then(move |m| async move {
        if pause {
            tokio::task::yield_now().await;
        }
        m
    });
    let r = client
        .client_stream(call.request(input))
        .await?
        .into_inner();
    let last = call
        .count
        .checked_sub(1)
        .map_or(0, |i| message_id(&call, i));
    if r.seq != call.count || r.id != last {
        return Err(Bad::Wrong(format!(
            "client stream {}: sent {} messages (last id {last}), the reply says {} (last id {})",
            call.id, call.count, r.seq, r.id
        )));
    }
    Ok(Ended::Done)
}

async fn bidi(mut client: Client, call: Call) -> Result<Ended, Bad> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client
        .bidi(call.request(ReceiverStream::new(rx)))
        .await?
        .into_inner();
    for i in 0..call.count {
        if matches!(call.cancel, Cancel::DropStream(k) if k == i) {
            return Ok(Ended::Dropped);
        }
        let id = message_id(&call, i);
        let sent = tx
            .send(Req {
                id,
                ..Default::default()
            })
            .await;
        match replies.message().await? {
            Some(r) if sent.is_ok() && r.id == id && r.seq == i => {}
            Some(r) => {
                return Err(Bad::Wrong(format!(
                    "bidi {}: message {i} (id {id}, sent: {}) answered with id {} seq {}",
                    call.id,
                    sent.is_ok(),
                    r.id,
                    r.seq
                )))
            }
            None => {
                return Err(Bad::Wrong(format!(
                    "bidi {}: OK after {i} of {} replies",
                    call.id, call.count
                )))
            }
        }
    }
    drop(tx);
    match replies.message().await? {
        None => Ok(Ended::Done),
        Some(r) => Err(Bad::Wrong(format!(
            "bidi {}: an extra reply id {} seq {} after {} messages",
            call.id, r.id, r.seq, call.count
        ))),
    }
}

fn run(
    client: Client,
    call: Call,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Ended, Bad>> + Send>> {
    match call.kind {
        Kind::Unary => Box::pin(unary(client, call)),
        Kind::ServerStream => Box::pin(server_stream(client, call)),
        Kind::ClientStream => Box::pin(client_stream(client, call)),
        Kind::Bidi => Box::pin(bidi(client, call)),
    }
}

/// Makes the call, with its cancellation.
async fn make(client: Client, call: Call) -> Result<Ended, Bad> {
    match call.cancel {
        Cancel::None | Cancel::DropStream(_) => run(client, call).await,
        Cancel::Timeout(d) => tokio::time::timeout(d, run(client, call))
            .await
            .unwrap_or(Ok(Ended::Dropped)),
        Cancel::Abort(d) => {
            let mut task = tokio::spawn(run(client, call));
            let joined = tokio::select! {
                r = &mut task => r,
                _ = tokio::time::sleep(d) => {
                    task.abort();
                    task.await
                }
            };
            match joined {
                Ok(r) => r,
                Err(e) if e.is_cancelled() => Ok(Ended::Dropped),
                Err(e) => Err(Bad::Panic(e.to_string())),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tally.

#[derive(Default)]
struct Tally {
    counts: BTreeMap<(Class, Kind), u64>,
    examples: BTreeMap<Class, Vec<String>>,
}

impl Tally {
    fn add(&mut self, call: &Call, class: Class, elapsed: Duration, what: impl FnOnce() -> String) {
        *self.counts.entry((class, call.kind)).or_default() += 1;
        let ex = self.examples.entry(class).or_default();
        if ex.len() < 5 {
            ex.push(format!(
                "{:?} id={} count={} deadline={:?} cancel={:?} after {elapsed:?}: {}",
                call.kind,
                call.id,
                call.count,
                call.deadline,
                call.cancel,
                what()
            ));
        }
    }

    fn total(&self, class: Class) -> u64 {
        self.counts
            .iter()
            .filter(|((c, _), _)| *c == class)
            .map(|(_, n)| n)
            .sum()
    }

    fn table(&self) -> String {
        let mut s = format!(
            "{:<24}{:>8}{:>14}{:>14}{:>8}{:>8}\n",
            "class", "unary", "server_stream", "client_stream", "bidi", "total"
        );
        let mut classes: Vec<Class> = self.counts.keys().map(|(c, _)| *c).collect();
        classes.dedup();
        let mut per_kind = [0u64; 4];
        for class in classes {
            let n: Vec<u64> = KINDS
                .iter()
                .map(|k| self.counts.get(&(class, *k)).copied().unwrap_or(0))
                .collect();
            for (t, x) in per_kind.iter_mut().zip(&n) {
                *t += x;
            }
            let name = format!(
                "{class:?}{}",
                if class.allowed() { "" } else { " (forbidden)" }
            );
            s += &format!(
                "{name:<24}{:>8}{:>14}{:>14}{:>8}{:>8}\n",
                n[0],
                n[1],
                n[2],
                n[3],
                n.iter().sum::<u64>()
            );
        }
        s += &format!(
            "{:<24}{:>8}{:>14}{:>14}{:>8}{:>8}\n",
            "calls",
            per_kind[0],
            per_kind[1],
            per_kind[2],
            per_kind[3],
            per_kind.iter().sum::<u64>()
        );
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The load, the chaos and the membership changes.

fn endpoint(uri: &str) -> Endpoint {
    Endpoint::from_shared(uri.to_owned())
        .expect("valid URI")
        .connect_timeout(Duration::from_secs(1))
}

/// One load task: calls of random kinds until `stop`.
async fn load(
    client: Client,
    ch: BalancedChannel,
    anchors: Vec<String>,
    task: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
) {
    let mut rng = Rng::new(seed ^ (task + 1).wrapping_mul(0x1000_0000_01B3));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let call = Call::draw(&mut rng, (task << 44) | n);
        let start = Instant::now();
        let bound = call.deadline.unwrap_or_default() + STUCK;
        let outcome = tokio::time::timeout(bound, make(client.clone(), call)).await;
        let elapsed = start.elapsed();
        {
            let mut t = tally.lock().unwrap();
            match outcome {
                Ok(Ok(Ended::Done)) => t.add(&call, Class::Ok, elapsed, String::new),
                Ok(Ok(Ended::Dropped)) => {
                    t.add(&call, Class::CancelledByTest, elapsed, String::new)
                }
                Err(_) => t.add(&call, Class::Stuck, elapsed, || {
                    format!("no end within {bound:?}")
                }),
                Ok(Err(Bad::Wrong(what))) => t.add(&call, Class::WrongReply, elapsed, || what),
                Ok(Err(Bad::Panic(what))) => t.add(&call, Class::Panic, elapsed, || what),
                Ok(Err(Bad::Status(status))) => {
                    let class = classify(&status, call.deadline, elapsed);
                    t.add(&call, class, elapsed, || {
                        let mut s = format!("{:?} {:?}", status.code(), status.message());
                        if !class.allowed() {
                            // Where the anchors stood right after the failure.
                            for e in ch.endpoints() {
                                if anchors.iter().any(|a| e.uri().starts_with(a.as_str())) {
                                    s += &format!(" [anchor {} {}]", e.uri(), e.state());
                                }
                            }
                        }
                        s
                    });
                }
            }
        }
        if rng.percent(50) {
            tokio::time::sleep(rng.ms(0, 3)).await;
        }
    }
}

/// What the chaos did to one churned instance, until when.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Trouble {
    None,
    Stopped,
    Failing,
    Hanging,
    Delayed,
}

/// Brings an instance back: running and answering at once. A hung instance is restarted, so
/// that the calls it holds end (its `Hang` never answers, whatever its behaviour becomes).
fn heal(inst: &mut Instance, trouble: Trouble) {
    inst.set(Behavior::Ok);
    if matches!(trouble, Trouble::Stopped | Trouble::Hanging) {
        inst.restart();
    }
}

/// The chaos: every 50-200 ms, troubles one healthy instance for 50-500 ms; heals each one
/// when its time is up. On `stop`, heals them all and hands them back.
fn chaos(
    mut churned: Vec<Instance>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> (Vec<Instance>, BTreeMap<&'static str, u64>) {
    let mut rng = Rng::new(seed ^ 0xC4A0_5C4A_05C4_A05C);
    let mut state: Vec<(Trouble, Instant)> = vec![(Trouble::None, Instant::now()); churned.len()];
    let mut done = BTreeMap::<&'static str, u64>::new();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(rng.ms(50, 200));
        let now = Instant::now();
        for (inst, (trouble, until)) in churned.iter_mut().zip(state.iter_mut()) {
            if *trouble != Trouble::None && now >= *until {
                heal(inst, *trouble);
                *trouble = Trouble::None;
            }
        }
        let i = rng.below(churned.len() as u64) as usize;
        if state[i].0 != Trouble::None {
            continue;
        }
        let inst = &mut churned[i];
        let (trouble, what) = match rng.below(6) {
            0 | 1 => {
                inst.stop();
                (Trouble::Stopped, "stop")
            }
            2 => {
                inst.set(Behavior::Fail(Code::Unavailable));
                (Trouble::Failing, "fail UNAVAILABLE")
            }
            3 => {
                inst.set(Behavior::Fail(Code::ResourceExhausted));
                (Trouble::Failing, "fail RESOURCE_EXHAUSTED")
            }
            4 => {
                inst.set(Behavior::Hang);
                (Trouble::Hanging, "hang")
            }
            _ => {
                inst.set(Behavior::Delay(rng.ms(5, 100)));
                (Trouble::Delayed, "delay")
            }
        };
        *done.entry(what).or_default() += 1;
        state[i] = (trouble, Instant::now() + rng.ms(50, 500));
    }
    for (inst, (trouble, _)) in churned.iter_mut().zip(state) {
        heal(inst, trouble);
        assert!(inst.is_running());
    }
    (churned, done)
}

/// The membership changes: every 100-300 ms, a `replace_all` (the anchors and a random subset
/// of the others), an `insert` or a `remove` of a churned instance.
async fn membership(
    ch: BalancedChannel,
    anchors: Vec<String>,
    churned: Vec<String>,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> BTreeMap<&'static str, u64> {
    let mut rng = Rng::new(seed ^ 0x3E3B_E125_41F0_0D5E);
    let mut done = BTreeMap::<&'static str, u64>::new();
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(rng.ms(100, 300)).await;
        let what = match rng.below(3) {
            0 => {
                let keep = churned.iter().filter(|_| rng.percent(60));
                let set: Vec<Endpoint> = anchors.iter().chain(keep).map(|u| endpoint(u)).collect();
                ch.replace_all(set).expect("valid endpoints");
                "replace_all"
            }
            1 => {
                let u = &churned[rng.below(churned.len() as u64) as usize];
                ch.insert(endpoint(u)).expect("valid endpoint");
                "insert"
            }
            _ => {
                let u = &churned[rng.below(churned.len() as u64) as usize];
                ch.remove(u).expect("valid URI");
                "remove"
            }
        };
        *done.entry(what).or_default() += 1;
    }
    done
}

/// Panics anywhere in the process (test tasks, the channel's tasks, the fleet's threads; the
/// other tests of the suite, none of which panics when it passes).
static PANICS: AtomicUsize = AtomicUsize::new(0);
static PANIC_MESSAGES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn count_panics() {
    crate::common::on_panic(|info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut m) = PANIC_MESSAGES.lock() {
            m.push(info.to_string());
        }
    });
}

/// Calls of every kind with random deadlines and cancellations, while instances are killed,
/// restarted, failed, hung, slowed, added and removed (two anchors never are): no call fails
/// for a reason of the channel's own, every successful call got exactly its replies, every
/// count ends at zero, nothing panics, and the channel leaves no task behind once dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak() {
    count_panics();
    let secs = env_u64("TONIC_BALANCER_SOAK_SECS").unwrap_or(10);
    let seed = env_u64("TONIC_BALANCER_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    println!("soak: {secs} s, seed {seed} (TONIC_BALANCER_SOAK_SEED={seed} to draw the same)");

    let anchors: Vec<Instance> = (0..ANCHORS)
        .map(|i| Instance::start(&format!("anchor{i}"), Behavior::Ok))
        .collect();
    let churned: Vec<Instance> = (0..CHURNED)
        .map(|i| Instance::start(&format!("c{i}"), Behavior::Ok))
        .collect();
    let anchor_uris: Vec<String> = anchors.iter().map(Instance::uri).collect();
    let churned_uris: Vec<String> = churned.iter().map(Instance::uri).collect();

    // The channel, on a runtime of its own: its connections and background tasks run there.
    let channel_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("soak-channel")
        .enable_all()
        .build()
        .unwrap();
    let ch = {
        let _in = channel_rt.enter();
        let builder = BalancedChannel::builder()
            .endpoints(anchor_uris.iter().chain(&churned_uris).map(|u| endpoint(u)))
            .retry(
                RetryPolicy::default()
                    .initial_backoff(Duration::from_millis(2))
                    .max_backoff(Duration::from_millis(20)),
            )
            .backoff(
                Backoff::default()
                    .initial(Duration::from_millis(50))
                    .max(Duration::from_millis(500))
                    .min_connect_timeout(Duration::from_millis(500)),
            )
            .ejection(
                Ejection::default()
                    .base_time(Duration::from_millis(200))
                    .max_time(Duration::from_secs(1))
                    .interval(Some(Duration::from_secs(1))),
            )
            // Server streams are hedged (their attempts run beside each other), and a
            // connection carries few calls, so that extra connections open and close.
            .hedging(
                HedgingPolicy::new(["fleet.v1.Fleet/ServerStream"], Duration::from_millis(20))
                    .max_attempts(3),
            )
            .max_streams_per_connection(3)
            .connection_idle_timeout(Duration::from_millis(300))
            // A slow spell is forgotten fast, so that the churned instances keep getting
            // calls after one.
            .latency_expiry(Duration::from_millis(250));
        // Health checks whose interval is longer than the bound on invariant 5: a checker
        // that outlived the channel until its next tick would be caught.
        #[cfg(feature = "health-check")]
        let builder = builder.health_check(
            HealthCheck::default()
                .interval(Duration::from_secs(3))
                .timeout(Duration::from_millis(500)),
        );
        builder.build().expect("valid channel")
    };
    let client = FleetClient::new(ch.clone());

    let stop_load = Arc::new(AtomicBool::new(false));
    let stop_chaos = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let loads: Vec<_> = (0..LOAD_TASKS)
        .map(|task| {
            tokio::spawn(load(
                client.clone(),
                ch.clone(),
                anchor_uris.clone(),
                task,
                seed,
                stop_load.clone(),
                tally.clone(),
            ))
        })
        .collect();
    let chaos_thread = {
        let stop = stop_chaos.clone();
        std::thread::Builder::new()
            .name("soak-chaos".into())
            .spawn(move || chaos(churned, seed, stop))
            .unwrap()
    };
    let members = tokio::spawn(membership(
        ch.clone(),
        anchor_uris.clone(),
        churned_uris.clone(),
        seed,
        stop_chaos.clone(),
    ));

    tokio::time::sleep(Duration::from_secs(secs)).await;

    // The load stops (each task ends its call), then the chaos (every instance healed).
    let t = Instant::now();
    stop_load.store(true, Ordering::Relaxed);
    let mut task_errors = Vec::new();
    for (i, h) in loads.into_iter().enumerate() {
        match tokio::time::timeout(STUCK + LIMIT, h).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => task_errors.push(format!("load task {i}: {e}")),
            Err(_) => task_errors.push(format!("load task {i} did not end")),
        }
    }
    stop_chaos.store(true, Ordering::Relaxed);
    let membership_ops = match members.await {
        Ok(m) => m,
        Err(e) => {
            task_errors.push(format!("membership task: {e}"));
            BTreeMap::new()
        }
    };
    let (churned, chaos_ops) = match tokio::task::spawn_blocking(move || chaos_thread.join())
        .await
        .unwrap()
    {
        Ok(r) => r,
        Err(_) => panic!("the chaos thread panicked"),
    };
    println!("load and chaos stopped in {:?}", t.elapsed());
    println!("chaos: {chaos_ops:?}");
    println!("membership: {membership_ops:?}");
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    println!("{}", tally.table());
    for (class, ex) in tally.examples.iter().filter(|(c, _)| **c != Class::Ok) {
        for e in ex.iter().take(2) {
            println!("  {class:?}: {e}");
        }
    }
    let served: Vec<String> = anchors
        .iter()
        .chain(&churned)
        .map(|i| format!("{}={}", i.name(), i.served()))
        .collect();
    println!("served: {}", served.join(" "));
    for e in ch.endpoints() {
        println!("  {e}");
    }

    // Invariants 1 and 2: every call is in an allowed class.
    let forbidden: Vec<String> = tally
        .examples
        .iter()
        .filter(|(c, _)| !c.allowed())
        .map(|(c, ex)| {
            format!(
                "{c:?}: {} calls, such as:\n    {}",
                tally.total(*c),
                ex.join("\n    ")
            )
        })
        .collect();
    // Invariant 3: every count back to zero.
    let drained = {
        let ch = ch.clone();
        tokio::time::timeout(
            LIMIT,
            wait_until("every in-flight count back to 0", LIMIT, move || {
                total_in_flight(&ch) == 0
            }),
        )
        .await
        .is_ok()
    };
    let in_flight = ch
        .endpoints()
        .iter()
        .filter(|e| e.in_flight() > 0)
        .map(|e| e.to_string())
        .collect::<Vec<_>>();

    // Invariant 5: once every handle is gone, the channel's runtime has no task left.
    drop(client);
    drop(ch);
    let t = Instant::now();
    let alive_at_drop = channel_rt.metrics().num_alive_tasks();
    while channel_rt.metrics().num_alive_tasks() > 0 && t.elapsed() < TASKS_END_WITHIN {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let alive = channel_rt.metrics().num_alive_tasks();
    println!(
        "channel runtime: {alive_at_drop} tasks alive when the channel was dropped, {alive} after {:?}",
        t.elapsed()
    );
    channel_rt.shutdown_background();
    drop(churned);
    drop(anchors);

    let panics = PANICS.load(Ordering::SeqCst);
    let mut failures = Vec::new();
    if !forbidden.is_empty() {
        failures.push(format!(
            "calls failed for reasons of the channel's own (seed {seed}):\n  {}",
            forbidden.join("\n  ")
        ));
    }
    if !drained || !in_flight.is_empty() {
        failures.push(format!(
            "in-flight counts not back to 0 after the load and the chaos: {in_flight:?}"
        ));
    }
    if panics > 0 || !task_errors.is_empty() {
        failures.push(format!(
            "{panics} panics: {:?}; tasks: {task_errors:?}",
            PANIC_MESSAGES.lock().unwrap()
        ));
    }
    if alive > 0 {
        failures.push(format!(
            "{alive} tasks still alive on the channel's runtime {TASKS_END_WITHIN:?} after the channel was dropped"
        ));
    }
    let ok = tally.total(Class::Ok);
    if ok < 100 {
        failures.push(format!("only {ok} calls succeeded: the soak did not soak"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
