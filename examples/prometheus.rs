//! A balanced channel over a local fleet under load, with its metrics served for Prometheus on
//! loopback: gRPC's standard client metrics (`grpc_client_attempt_duration_seconds`, ...) and
//! the balancer's own gauges.
//!
//! ```text
//! cargo run --release --example prometheus --features metrics -- [--port 9184] [--seconds 0] [--phase 10] [--per-instance]
//! curl -s http://127.0.0.1:9184/metrics
//! ```
//!
//! The labels are the defaults: `grpc_method` for each method called (the example calls two),
//! `grpc_target` named with `metrics_target`, and the per-instance instruments per target, so
//! that the series stay as many however many addresses come and go. `--per-instance` labels
//! them with each instance's URI too (`tonic_balancer_instance`). The exporter forgets series
//! that nothing wrote for 10 minutes (its idle timeout), so that an instance or a channel gone
//! leaves no series behind for good.
//!
//! The fleet: four instances answering after 1 to 4 ms, `flaky` and `restarts` after 2 ms,
//! found through a registry (a discovery source the example answers itself). 16 calls are kept
//! in flight: 14 unary calls, retried (`Unary`), and 2 server-streaming calls of one reply,
//! hedged after 3 ms (`ServerStream`). A scenario of six phases of `--phase` seconds each, over and over, so that every
//! instrument has something to count:
//!
//! 1. steady: every instance serves;
//! 2. flaky: `flaky` fails one call in three with UNAVAILABLE (retried elsewhere; ejected by
//!    the success-rate rule);
//! 3. restarts: `restarts` is stopped (its connection breaks, connections to it fail, calls
//!    are replayed elsewhere);
//! 4. registry: `restarts` is back; the registry leaves `i4` out of its answers (removed) and
//!    fails every other lookup;
//! 5. outage: `i4` is back; every instance fails every call with UNAVAILABLE (retries spend
//!    the retry budget; instances are ejected up to the cap, the others are outliers not
//!    ejected);
//! 6. down: every instance is stopped (connections fail, calls are refused at once), until the
//!    next round restarts them.
//!
//! `--port 0` serves on a free port; the `curl` line printed says which. `--seconds 0` (the
//! default) runs until interrupted; `--seconds N` exits after N seconds.

use fleet_service as fleet;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Instance};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use metrics_util::MetricKindMask;
use tonic::Code;
use tonic_balancer::metrics::HISTOGRAMS;
use tonic_balancer::{Backoff, BalancedChannel, Ejection, HedgingPolicy, Resolve, RetryPolicy};

const IN_FLIGHT: usize = 16;
/// Of those, the callers of the hedged method.
const HEDGED: u64 = 2;
const UNARY: &str = "fleet.v1.Fleet/Unary";
const SERVER_STREAM: &str = "fleet.v1.Fleet/ServerStream";

/// The scenario's phases, in order.
const PHASES: [&str; 6] = ["steady", "flaky", "restarts", "registry", "outage", "down"];

/// The value after `name` on the command line, if given.
fn arg(name: &str) -> Option<f64> {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).map(|i| {
        args.get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|v: &f64| v.is_finite() && *v >= 0.0)
            .unwrap_or_else(|| panic!("{name} takes a number"))
    })
}

/// Installs the Prometheus recorder, serving on `port` of loopback (0: a free one); returns the
/// address it serves on.
fn serve_metrics(port: u16) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let mut tries = 0;
    loop {
        let addr = if port == 0 {
            // A free port, given back just before the exporter binds it: another process may
            // take it in between, rarely; then another one.
            std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?
        } else {
            SocketAddr::from(([127, 0, 0, 1], port))
        };
        // The recorder first: the channel describes its instruments (units, help) when built.
        let mut builder = PrometheusBuilder::new()
            .with_http_listener(addr)
            .with_recommended_naming(true)
            // Series nothing wrote for 10 minutes are forgotten: those of an instance that left
            // (with `--per-instance`) or of a channel dropped. A live channel writes its gauges
            // twice a second; a counter forgotten while idle starts again at its next increment.
            .idle_timeout(MetricKindMask::ALL, Some(Duration::from_secs(600)));
        // Every histogram's buckets (without them, the exporter renders a summary).
        for (name, buckets) in HISTOGRAMS {
            builder = builder.set_buckets_for_metric(Matcher::Full((*name).into()), buckets)?;
        }
        let built = builder.build();
        match built {
            Ok((recorder, exporter)) => {
                metrics::set_global_recorder(recorder)?;
                tokio::spawn(exporter);
                return Ok(addr);
            }
            Err(BuildError::FailedToCreateHTTPListener(_)) if port == 0 && tries < 10 => {
                tries += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// What instance `k` of the fleet does when all is well: `i1` to `i4` answer after 1 to 4 ms,
/// `flaky` and `restarts` after 2 ms.
fn serving(k: usize) -> Behavior {
    let ms = if k < 4 { k as u64 + 1 } else { 2 };
    Behavior::Delay(Duration::from_millis(ms))
}

/// The registry the channel discovers the fleet through: the addresses it lists, and whether
/// every other lookup fails.
#[derive(Clone, Default)]
struct Registry {
    addrs: Arc<Mutex<Vec<SocketAddr>>>,
    flaky: Arc<Mutex<bool>>,
    lookups: Arc<AtomicU64>,
}

impl Resolve for Registry {
    #[allow(clippy::type_complexity)]
    fn resolve(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Vec<SocketAddr>, tower::BoxError>> + Send + '_>,
    > {
        let n = self.lookups.fetch_add(1, Ordering::Relaxed);
        let answer = if *self.flaky.lock().unwrap() && n % 2 == 1 {
            Err("registry unavailable".into())
        } else {
            Ok(self.addrs.lock().unwrap().clone())
        };
        Box::pin(async move { answer })
    }

    fn name(&self) -> String {
        "registry:///fleet".into()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = arg("--port").unwrap_or(9184.0) as u16;
    let seconds = arg("--seconds").unwrap_or(0.0);
    let phase = Duration::from_secs_f64(arg("--phase").unwrap_or(10.0).max(0.2));
    let per_instance = std::env::args().any(|a| a == "--per-instance");

    let addr = serve_metrics(port)?;

    let names = ["i1", "i2", "i3", "i4", "flaky", "restarts"];
    let mut fleet: Vec<Instance> = names
        .iter()
        .enumerate()
        .map(|(k, name)| Instance::start(name, serving(k)))
        .collect();
    let registry = Registry::default();
    let all: Vec<SocketAddr> = fleet.iter().map(|i| i.addr).collect();
    *registry.addrs.lock().unwrap() = all.clone();

    let channel = BalancedChannel::builder()
        .resolver(registry.clone())
        .discovery_interval(phase / 4)
        .retry(RetryPolicy::new([UNARY]))
        // Sent again after 3 ms without an answer: the slower instances' calls are hedged.
        .hedging(HedgingPolicy::new([SERVER_STREAM], Duration::from_millis(3)).max_attempts(2))
        .ejection(
            Ejection::default()
                .base_time(phase)
                .interval(Some(phase / 2))
                // Intervals as short as the phases: the success-rate rule judges an instance
                // from 20 calls in one (A50's 100 were not reached in a 1 s interval by `flaky`,
                // whose failures also cost it turns, on a machine short of CPU).
                .success_rate_min_calls(20),
        )
        .backoff(
            Backoff::default()
                .initial((phase / 10).min(Duration::from_secs(1)))
                .max(phase.min(Duration::from_secs(10))),
        )
        .metrics_target("fleet.example")
        .metrics_per_instance(per_instance)
        .build()?;

    println!("serving metrics on http://{addr}/metrics");
    println!("curl -s http://{addr}/metrics | grep -E '^(grpc|tonic_balancer)_'");

    let mut workers = tokio::task::JoinSet::new();
    for w in 0..IN_FLIGHT as u64 {
        let mut client = FleetClient::new(channel.clone());
        workers.spawn(async move {
            let mut id = w << 40;
            loop {
                id += 1;
                let ok = if w < HEDGED {
                    let req = fleet::pb::Req {
                        id,
                        count: 1,
                        ..Default::default()
                    };
                    match client.server_stream(req).await {
                        Ok(stream) => stream.into_inner().message().await.is_ok(),
                        Err(_) => false,
                    }
                } else {
                    client.unary(fleet::req(id)).await.is_ok()
                };
                if !ok {
                    // A call refused at once would otherwise spin.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
    }

    let start = Instant::now();
    let mut tick = tokio::time::interval(phase / 4);
    let mut current = 0;
    loop {
        tick.tick().await;
        let elapsed = start.elapsed();
        if seconds > 0.0 && elapsed.as_secs_f64() >= seconds {
            break;
        }
        let now = (elapsed.as_nanos() / phase.as_nanos()) as usize % PHASES.len();
        if now == current {
            continue;
        }
        current = now;
        match PHASES[now] {
            "steady" => {
                for (k, inst) in fleet.iter_mut().enumerate() {
                    if !inst.is_running() {
                        inst.restart();
                    }
                    inst.set(serving(k));
                }
            }
            "flaky" => fleet[4].set(Behavior::FailSome {
                one_in: 3,
                code: Code::Unavailable,
                delay: Duration::from_millis(2),
            }),
            "restarts" => {
                fleet[4].set(serving(4));
                fleet[5].stop();
            }
            "registry" => {
                fleet[5].restart();
                *registry.flaky.lock().unwrap() = true;
                registry
                    .addrs
                    .lock()
                    .unwrap()
                    .retain(|a| *a != fleet[3].addr);
            }
            "outage" => {
                *registry.flaky.lock().unwrap() = false;
                *registry.addrs.lock().unwrap() = all.clone();
                for inst in &fleet {
                    inst.set(Behavior::Fail(Code::Unavailable));
                }
            }
            _ => {
                for inst in &mut fleet {
                    inst.stop();
                }
            }
        }
        println!(
            "{:>6.1}s {:<8} {}",
            elapsed.as_secs_f64(),
            PHASES[now],
            channel.stats()
        );
    }
    workers.abort_all();
    Ok(())
}
