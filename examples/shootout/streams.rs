//! The shootout's `stream-limit` scenario (gRFC A105): one instance whose tonic server
//! allows 100 concurrent streams per connection, reached by `BalancedChannel` with one
//! connection per instance (the behaviour before connection scaling), with the default cap, and
//! with 10 (what 1,000 streams at 100 per connection take). Per contender, on a fresh channel:
//!
//! 1. `1000 streaming`: 1,000 server-streaming calls started at once; the time until every one
//!    of them has its first message while all hold their streams open (or how many did within
//!    the bound).
//! 2. `p99 idle`: unary calls, open loop at `--rate` for `--duration`, with no stream open: p99
//!    from each call's scheduled start, failures (1 s deadline) ranked above every success.
//! 3. `p99 900 open`: the same with 900 long-lived streams open on the instance.
//!
//! Run it alone: `cargo run --release --example shootout -- --scenario stream-limit`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::fleet::pb::fleet_client::FleetClient;
use super::fleet::pb::Req;
use super::fleet::{Behavior, Instance, ServerOptions};
use tonic_balancer::BalancedChannel;

/// The scenario's name for `--scenario`.
pub const KEY: &str = "stream-limit";

/// How long the 1,000 streams get to all be streaming before the run reports how many were.
const BOUND: Duration = Duration::from_secs(5);

/// Long-lived streams: each task holds its stream open until `stop`.
struct Held {
    streaming: Arc<AtomicUsize>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn hold(ch: &BalancedChannel, n: usize) -> Held {
    let streaming = Arc::new(AtomicUsize::new(0));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let tasks = (0..n)
        .map(|id| {
            let mut client = FleetClient::new(ch.clone());
            let streaming = streaming.clone();
            let mut stopped = stopped.clone();
            tokio::spawn(async move {
                let req = Req {
                    id: id as u64,
                    count: 1,
                    ..Default::default()
                };
                let call = async {
                    let mut s = client.server_stream(req).await.ok()?.into_inner();
                    s.message().await.ok()??;
                    streaming.fetch_add(1, Ordering::SeqCst);
                    Some(s)
                };
                let held = tokio::select! {
                    s = call => s,
                    _ = async { let _ = stopped.wait_for(|s| *s).await; } => None,
                };
                if held.is_some() {
                    let _ = stopped.wait_for(|s| *s).await;
                }
            })
        })
        .collect();
    Held {
        streaming,
        stop,
        tasks,
    }
}

impl Held {
    /// Waits until `n` stream (or `BOUND` passes); returns the time taken, or `None`.
    async fn all_streaming(&self, n: usize, from: Instant) -> Option<Duration> {
        while self.streaming.load(Ordering::SeqCst) < n {
            if from.elapsed() > BOUND {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Some(from.elapsed())
    }

    async fn close(self) {
        self.stop.send_replace(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Unary calls, open loop at `rate` for `duration`: their p99 from each call's scheduled start
/// (`None`: the p99 falls on failed calls) and the number that failed.
async fn unary_p99(
    ch: &BalancedChannel,
    rate: f64,
    duration: Duration,
) -> (Option<Duration>, usize) {
    let n = (rate * duration.as_secs_f64()).round().max(1.0) as usize;
    let start = Instant::now() + Duration::from_millis(5);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut client = FleetClient::new(ch.clone());
            let at = start + Duration::from_secs_f64(i as f64 / rate);
            tokio::spawn(async move {
                tokio::time::sleep_until(at.into()).await;
                let mut req = tonic::Request::new(Req {
                    id: i as u64,
                    ..Default::default()
                });
                req.set_timeout(Duration::from_secs(1));
                let ok = tokio::time::timeout(Duration::from_millis(1100), client.unary(req))
                    .await
                    .is_ok_and(|r| r.is_ok());
                ok.then(|| at.elapsed())
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(n);
    for t in tasks {
        lat.push(t.await.ok().flatten());
    }
    let failed = lat.iter().filter(|l| l.is_none()).count();
    // Failures rank above every success.
    lat.sort_by_key(|l| l.unwrap_or(Duration::MAX));
    let p99 = lat[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1];
    (p99, failed)
}

fn cell(d: Option<Duration>) -> String {
    d.map_or("fail".to_owned(), |d| {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    })
}

/// Runs the scenario and prints its table.
pub fn run(rate: f64, duration: Duration) {
    let server = Instance::start_with(
        "limited",
        "127.0.0.1:0".parse().unwrap(),
        Behavior::HoldStreams,
        ServerOptions {
            max_concurrent_streams: Some(100),
            ..Default::default()
        },
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    println!();
    println!(
        "{KEY}: one instance, its tonic server limited to 100 concurrent streams per connection; unary calls {rate:.0}/s open loop for {:.1} s, 1 s deadline; latency from the scheduled start, 'fail' = the p99 falls on failed calls",
        duration.as_secs_f64()
    );
    println!(
        "{:<34} {:>16} {:>12} {:>16} {:>8} {:>12}",
        "contender", "1000 streaming", "p99 idle", "p99 900 open", "ratio", "conns opened"
    );
    for (name, cap) in [
        ("least-pending, 1 connection", 1),
        (
            "least-pending, default (4)",
            tonic_balancer::DEFAULT_MAX_CONNECTIONS,
        ),
        ("least-pending, 10 connections", 10),
    ] {
        let before = server.connections();
        let row = rt.block_on(async {
            let ch = BalancedChannel::builder()
                .uri(&server.uri())
                .max_connections_per_instance(cap)
                .build()
                .expect("channel");
            // 1. 1,000 streams at once.
            let from = Instant::now();
            let thousand = hold(&ch, 1000);
            let took = thousand.all_streaming(1000, from).await;
            let reached = thousand.streaming.load(Ordering::SeqCst);
            thousand.close().await;
            // 2. Unary with no stream open.
            let (idle, idle_failed) = unary_p99(&ch, rate, duration).await;
            // 3. Unary with 900 streams open.
            let from = Instant::now();
            let nine = hold(&ch, 900);
            let _ = nine.all_streaming(900, from).await;
            let (open, open_failed) = unary_p99(&ch, rate, duration).await;
            nine.close().await;
            (took, reached, idle, idle_failed, open, open_failed)
        });
        let (took, reached, idle, idle_failed, open, open_failed) = row;
        let streaming = match took {
            Some(t) => format!("{:.0} ms", t.as_secs_f64() * 1e3),
            None => format!("{reached} by {} s", BOUND.as_secs()),
        };
        let ratio = match (idle, open) {
            (Some(a), Some(b)) => format!("{:.2}x", b.as_secs_f64() / a.as_secs_f64()),
            _ => "-".to_owned(),
        };
        let failed = if idle_failed + open_failed > 0 {
            format!(" (calls failed: {idle_failed} idle, {open_failed} with 900 open)")
        } else {
            String::new()
        };
        println!(
            "{name:<34} {streaming:>16} {:>12} {:>16} {ratio:>8} {:>12}{failed}",
            cell(idle),
            cell(open),
            server.connections() - before,
        );
    }
}
