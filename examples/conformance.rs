//! The conformance matrix: this channel and tonic's `Channel::balance_list` against fleets of
//! servers of other gRPC implementations (grpc-go and grpcio, the test peers of `peers/`), one
//! fault at a time. What each implementation really does (its GOAWAYs, its keepalive
//! enforcement, its answer to a handler that throws, its stream limit) is what a user meets.
//!
//! ```sh
//! cargo run --release --all-features --example conformance [-- --only go|python] [--scenario NAME]
//! ```
//!
//! For each implementation and scenario it starts a fleet of 5 peers, sends a fixed load
//! through each channel (a fresh fleet for each), and prints one row of a markdown table: the
//! calls that failed, the calls the bad instance served, the connections that carried calls
//! (grpc-go's count; a restarted process's first life is not in it), the latency percentiles
//! of all calls (failed ones included), and the two most frequent failures. The load: 4
//! callers one call after the other, 1,200 unary calls in all, each answered after 5 ms, each
//! with a 5 s deadline (1 s in `hang`). This channel's rows are held to its targets (at most 2%
//! of the calls failed where one instance of five is faulty, 1% for refused streams, none for
//! a GOAWAY, keepalive enforcement or a health check): a miss is printed and the run exits
//! with 1 (`.ci/run` runs it). tonic's rows are measured, not judged.
//!
//! The scenarios (instance 0 is the bad one where there is one):
//! - `fail-fast`: it answers UNAVAILABLE at once.
//! - `unknown`: its handler fails (grpcio: an exception, UNKNOWN "Exception calling
//!   application"; grpc-go: a panic a recovery interceptor answers UNKNOWN).
//! - `internal`: it answers INTERNAL at once.
//! - `hang`: it never answers; calls have a 1 s deadline.
//! - `kill-restart`: it is killed (SIGKILL) after 400 calls and started again on the same port
//!   300 ms later; "to bad" counts what both processes served.
//! - `goaway`: every instance rotates its connections (max connection age 200 ms, ±10%, grace
//!   1 s): GOAWAY NO_ERROR "max_age" from both, twice (last stream id 2^31-1, then the real
//!   one).
//! - `refused`: every instance allows 10 streams per connection; 45 callers for 3 s.
//! - `keepalive`: every instance enforces keepalive (one ping in 10 s without data sent
//!   between); the clients ping every 10 ms, idle or not: GOAWAY ENHANCE_YOUR_CALM
//!   "too_many_pings" after the third early ping. Under this load a busy connection rarely
//!   pings (hyper pings after 10 ms without a frame received) and each answer resets the
//!   server's strikes: connections that go idle are the ones closed.
//! - `health`: after 400 calls it turns NOT_SERVING (and keeps answering, as a draining server
//!   does); this channel has health checks on (`HealthCheck::default()`); "to bad" counts the
//!   calls it served from then on.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_service::pb::peer::peer_client::PeerClient;
use fleet_service::pb::peer::Payload;
use fleet_service::peers::{Kind, Peer, Settings};
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic_balancer::{BalancedChannel, HealthCheck};
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceExt};

type Svc = BoxCloneService<http::Request<Body>, http::Response<Body>, BoxError>;

const FLEET: usize = 5;
const CALLERS: usize = 4;
const CALLS: usize = 1_200;
const ANSWER: &str = "ok delay=5ms";
const DEADLINE: Duration = Duration::from_secs(5);
/// When the bad instance is killed, or turns NOT_SERVING.
const EVENT_AT: usize = 400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    FailFast,
    Unknown,
    Internal,
    Hang,
    KillRestart,
    Goaway,
    Refused,
    Keepalive,
    Health,
}

impl Scenario {
    const ALL: [Scenario; 9] = [
        Scenario::FailFast,
        Scenario::Unknown,
        Scenario::Internal,
        Scenario::Hang,
        Scenario::KillRestart,
        Scenario::Goaway,
        Scenario::Refused,
        Scenario::Keepalive,
        Scenario::Health,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::FailFast => "fail-fast",
            Scenario::Unknown => "unknown",
            Scenario::Internal => "internal",
            Scenario::Hang => "hang",
            Scenario::KillRestart => "kill-restart",
            Scenario::Goaway => "goaway",
            Scenario::Refused => "refused",
            Scenario::Keepalive => "keepalive",
            Scenario::Health => "health",
        }
    }

    /// The settings of every instance.
    fn all(self) -> Settings {
        let mut s = Settings::mode(ANSWER);
        match self {
            Scenario::Goaway => {
                s.max_connection_age = Some((Duration::from_millis(200), Duration::from_secs(1)))
            }
            Scenario::Refused => s.max_concurrent_streams = Some(10),
            Scenario::Keepalive => s.keepalive_min_time = Some(Duration::from_secs(10)),
            _ => {}
        }
        s
    }

    /// The bad instance's mode, if there is one from the start.
    fn bad_mode(self, kind: Kind) -> Option<&'static str> {
        match self {
            Scenario::FailFast => Some("status UNAVAILABLE"),
            Scenario::Unknown => Some(match kind {
                Kind::Go => "panic-recovered",
                Kind::Python => "exception",
            }),
            Scenario::Internal => Some("status INTERNAL"),
            Scenario::Hang => Some("hang"),
            _ => None,
        }
    }

    fn has_bad(self) -> bool {
        !matches!(
            self,
            Scenario::Goaway | Scenario::Refused | Scenario::Keepalive
        )
    }

    /// The most failed calls (a share) this channel may have in the scenario: its target.
    /// A fault of one instance of five costs its calls before the ejection (at most 2%); a
    /// GOAWAY, a refused stream, keepalive enforcement and a health check cost none, but for
    /// the 1% of refused streams a server may refuse again and again.
    fn target(self) -> f64 {
        match self {
            Scenario::Goaway | Scenario::Keepalive | Scenario::Health => 0.0,
            Scenario::Refused => 0.01,
            _ => 0.02,
        }
    }

    fn deadline(self) -> Duration {
        match self {
            Scenario::Hang => Duration::from_secs(1),
            _ => DEADLINE,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contender {
    Balanced,
    TonicBalanceList,
}

impl Contender {
    fn name(self) -> &'static str {
        match self {
            Contender::Balanced => "BalancedChannel",
            Contender::TonicBalanceList => "tonic balance_list",
        }
    }

    fn build(self, scenario: Scenario, uris: &[String]) -> Svc {
        let endpoints = uris.iter().map(|u| {
            let e = Endpoint::from_shared(u.clone())
                .expect("peer URI")
                .connect_timeout(Duration::from_secs(1));
            if scenario == Scenario::Keepalive {
                e.http2_keep_alive_interval(Duration::from_millis(10))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .keep_alive_while_idle(true)
            } else {
                e
            }
        });
        match self {
            Contender::Balanced => {
                let mut b = BalancedChannel::builder().endpoints(endpoints);
                if scenario == Scenario::Health {
                    b = b.health_check(HealthCheck::default());
                }
                BoxCloneService::new(b.build().expect("balanced channel"))
            }
            Contender::TonicBalanceList => {
                let ch = Channel::balance_list(endpoints);
                BoxCloneService::new(ch.map_err(BoxError::from))
            }
        }
    }
}

/// What one run measured.
struct Row {
    calls: usize,
    failed: usize,
    to_bad: Option<u64>,
    /// Connections that carried calls, over the fleet (grpc-go only: `conns`).
    conns: Option<u64>,
    p50: Duration,
    p99: Duration,
    /// Failures by what they were: code and message, the most frequent first.
    errors: Vec<(String, usize)>,
}

/// Starts `FLEET` peers of `kind` at once (each start waits for its LISTENING line).
fn start_fleet(kind: Kind, scenario: Scenario) -> Option<Vec<Peer>> {
    let threads: Vec<_> = (0..FLEET)
        .map(|i| {
            let mut settings = scenario.all();
            if i == 0 {
                if let Some(mode) = scenario.bad_mode(kind) {
                    settings.mode = Some(mode.to_owned());
                }
            }
            std::thread::spawn(move || Peer::with(kind, &settings))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

async fn run(kind: Kind, scenario: Scenario, contender: Contender) -> Option<Row> {
    let mut fleet = start_fleet(kind, scenario)?;
    let uris: Vec<String> = fleet.iter().map(Peer::uri).collect();
    let svc = contender.build(scenario, &uris);
    let (callers, budget) = match scenario {
        Scenario::Refused => (45, Budget::For(Duration::from_secs(3))),
        _ => (CALLERS, Budget::Calls(CALLS)),
    };
    let started = Arc::new(AtomicUsize::new(0));
    let deadline = scenario.deadline();
    let begin = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (svc, started) = (svc.clone(), started.clone());
            tokio::spawn(async move {
                let mut client = PeerClient::new(svc);
                let mut out = Vec::new();
                loop {
                    let n = started.fetch_add(1, Ordering::SeqCst);
                    match budget {
                        Budget::Calls(calls) if n >= calls => break,
                        Budget::For(d) if begin.elapsed() >= d => break,
                        _ => {}
                    }
                    let mut req = tonic::Request::new(Payload {
                        payload: b"x".to_vec(),
                    });
                    req.set_timeout(deadline);
                    let t = Instant::now();
                    let answer = tokio::time::timeout(
                        deadline + Duration::from_secs(2),
                        unary(&mut client, req),
                    )
                    .await;
                    let outcome = match answer {
                        Ok(Ok(_)) => None,
                        Ok(Err(status)) => Some(describe(&status)),
                        Err(_) => Some("no end by the deadline + 2 s".to_owned()),
                    };
                    out.push((t.elapsed(), outcome));
                }
                out
            })
        })
        .collect();

    // The bad instance's event. It served `to_bad` = `extra` + what it counts at the end -
    // `base`.
    let (mut extra, mut base) = (0, 0);
    match scenario {
        Scenario::KillRestart => {
            wait_started(&started, EVENT_AT).await;
            extra = fleet[0].served().await;
            tokio::task::block_in_place(|| fleet[0].kill());
            tokio::time::sleep(Duration::from_millis(300)).await;
            tokio::task::block_in_place(|| fleet[0].restart());
        }
        Scenario::Health => {
            wait_started(&started, EVENT_AT).await;
            fleet[0].control("health NOT_SERVING").await;
            base = fleet[0].served().await;
        }
        _ => {}
    }
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await.expect("a caller"));
    }
    let to_bad = if scenario.has_bad() {
        Some(extra + fleet[0].served().await - base)
    } else {
        None
    };

    let conns = if kind == Kind::Go {
        let mut n = 0;
        for peer in &fleet {
            n += peer.control("conns").await["conns=".len()..]
                .parse::<u64>()
                .unwrap();
        }
        Some(n)
    } else {
        None
    };

    let mut latencies: Vec<Duration> = results.iter().map(|(d, _)| *d).collect();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for (_, e) in &results {
        if let Some(e) = e {
            *errors.entry(e.clone()).or_default() += 1;
        }
    }
    let mut errors: Vec<_> = errors.into_iter().collect();
    errors.sort_by_key(|e| std::cmp::Reverse(e.1));
    Some(Row {
        calls: results.len(),
        failed: results.iter().filter(|(_, e)| e.is_some()).count(),
        to_bad,
        conns,
        p50: pct(0.50),
        p99: pct(0.99),
        errors,
    })
}

/// One unary call, boxed as a `Send` future: spawning the generated client's future directly
/// trips a rustc limitation on higher-ranked lifetimes ("implementation of `From` is not
/// general enough"), as in the shootout's `load.rs`.
fn unary(
    client: &mut PeerClient<Svc>,
    req: tonic::Request<Payload>,
) -> futures::future::BoxFuture<'_, Result<tonic::Response<Payload>, tonic::Status>> {
    Box::pin(client.unary(req))
}

#[derive(Debug, Clone, Copy)]
enum Budget {
    Calls(usize),
    For(Duration),
}

async fn wait_started(started: &AtomicUsize, n: usize) {
    while started.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A failure in a few words: its code, its message, and the transport error under it (an h2
/// frame and reason, an I/O error) when the channel made it; peers' addresses and stream ids
/// left out, so that alike failures group.
fn describe(status: &tonic::Status) -> String {
    let mut s = format!("{:?}", status.code());
    let message = without_addresses(status.message());
    if !message.is_empty() {
        s.push_str(&format!(" \"{}\"", truncate(&message, 60)));
    }
    let mut source = std::error::Error::source(status);
    let mut deepest = None;
    while let Some(e) = source {
        deepest = Some(e);
        source = e.source();
    }
    if let Some(e) = deepest {
        match e.downcast_ref::<h2::Error>() {
            Some(h2) if h2.is_go_away() || h2.is_reset() => {
                let frame = if h2.is_go_away() {
                    "GOAWAY"
                } else {
                    "RST_STREAM"
                };
                let from = if h2.is_remote() {
                    "from the server"
                } else {
                    "local"
                };
                let reason = h2.reason().map_or("?".to_owned(), |r| format!("{r:?}"));
                s.push_str(&format!(" (h2: {frame} {reason} {from})"));
            }
            _ => s.push_str(&format!(" ({})", truncate(&e.to_string(), 60))),
        }
    }
    s
}

/// `s` with each `127.0.0.1:<port>` as `<peer>`.
fn without_addresses(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("127.0.0.1:") {
        out.push_str(rest[..i].trim_end_matches("http://"));
        out.push_str("<peer>");
        rest = rest[i + "127.0.0.1:".len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let only = arg("--only");
    let kinds: Vec<Kind> = Kind::ALL
        .into_iter()
        .filter(|k| match only.as_deref() {
            None => true,
            Some("go") => *k == Kind::Go,
            Some("python") => *k == Kind::Python,
            Some(other) => panic!("--only go|python, not {other:?}"),
        })
        .collect();
    let only_scenario = arg("--scenario");
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| only_scenario.as_deref().is_none_or(|n| n == s.name()))
        .collect();
    assert!(!scenarios.is_empty(), "no scenario named {only_scenario:?}");

    println!(
        "{FLEET} peers per fleet; {CALLERS} callers, {CALLS} unary calls answered after 5 ms \
         (refused: 45 callers for 3 s); latencies of all calls, failed ones included\n"
    );
    println!("| server | scenario | channel | calls | failed | to bad | conns | p50 | p99 | failures (most frequent) |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---|");
    let mut misses = Vec::new();
    for kind in kinds {
        if !Peer::available(kind) {
            continue;
        }
        for &scenario in &scenarios {
            for contender in [Contender::Balanced, Contender::TonicBalanceList] {
                let Some(row) = run(kind, scenario, contender).await else {
                    continue;
                };
                let failed = format!(
                    "{} ({:.1}%)",
                    row.failed,
                    100.0 * row.failed as f64 / row.calls.max(1) as f64
                );
                let to_bad = row.to_bad.map_or("-".to_owned(), |n| n.to_string());
                let conns = row.conns.map_or("-".to_owned(), |n| n.to_string());
                let errors = row
                    .errors
                    .iter()
                    .take(2)
                    .map(|(e, n)| format!("{n}× {e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
                    .replace('|', "\\|");
                let share = row.failed as f64 / row.calls.max(1) as f64;
                if contender == Contender::Balanced && share > scenario.target() {
                    misses.push(format!(
                        "{kind} {}: {failed} failed, target {:.0}%",
                        scenario.name(),
                        100.0 * scenario.target()
                    ));
                }
                println!(
                    "| {kind} | {} | {} | {} | {failed} | {to_bad} | {conns} | {} | {} | {errors} |",
                    scenario.name(),
                    contender.name(),
                    row.calls,
                    ms(row.p50),
                    ms(row.p99),
                );
            }
        }
    }
    // The channel's targets (see `Scenario::target`): a miss fails the run, as in CI.
    if !misses.is_empty() {
        eprintln!("targets missed:\n  {}", misses.join("\n  "));
        std::process::exit(1);
    }
}
