//! A balanced channel over a local fleet under load, with its metrics served for Prometheus on
//! loopback: gRPC's standard client metrics (`grpc_client_attempt_duration_seconds`, ...) and
//! the balancer's own per-instance gauges.
//!
//! ```text
//! cargo run --release --example prometheus --features metrics -- [--port 9184] [--seconds 0]
//! curl -s http://127.0.0.1:9184/metrics
//! ```
//!
//! The fleet: four instances answering after 1 to 4 ms, a fifth that fails every call with
//! UNAVAILABLE for 10 s of every 30 (ejected, retried around), and a sixth that is stopped for
//! 10 s of every 30 (connection failures, transparent retries). 16 calls are kept in flight.
//! `--seconds 0` (the default) runs until interrupted.

#[path = "../tests/fleet/mod.rs"]
mod fleet;

use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Instance};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tonic::Code;
use tonic_balancer::metrics::{
    CALL_RETRIES, CALL_RETRY_DELAY, CALL_TRANSPARENT_RETRIES, COUNT_BUCKETS, LATENCY_BUCKETS,
};
use tonic_balancer::{BalancedChannel, Ejection, RetryPolicy};

const IN_FLIGHT: usize = 16;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number"))
        })
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port = arg("--port", 9184) as u16;
    let seconds = arg("--seconds", 0);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));

    // The recorder first: the channel describes its instruments (units, help) when built.
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .with_recommended_naming(true)
        .set_buckets_for_metric(Matcher::Suffix(".duration".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(CALL_RETRY_DELAY.into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(CALL_RETRIES.into()), COUNT_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(CALL_TRANSPARENT_RETRIES.into()),
            COUNT_BUCKETS,
        )?
        .install()?;

    let mut fleet: Vec<Instance> = (1..=4)
        .map(|ms| {
            Instance::start(
                &format!("i{ms}"),
                Behavior::Delay(Duration::from_millis(ms)),
            )
        })
        .collect();
    fleet.push(Instance::start(
        "flaky",
        Behavior::Delay(Duration::from_millis(2)),
    ));
    fleet.push(Instance::start(
        "restarts",
        Behavior::Delay(Duration::from_millis(2)),
    ));
    let channel = BalancedChannel::builder()
        .uris(fleet.iter().map(Instance::uri))
        .retry(RetryPolicy::default())
        .ejection(Ejection::default().base_time(Duration::from_secs(5)))
        .metrics_all_methods(true)
        .metrics_target("fleet.example")
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
                let _ = client.unary(fleet::req(id)).await;
            }
        });
    }

    let start = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut phase = 0;
    loop {
        tick.tick().await;
        let elapsed = start.elapsed().as_secs();
        if seconds > 0 && elapsed >= seconds {
            break;
        }
        // Every 30 s: 10 s of failures on `flaky`, then 10 s with `restarts` stopped.
        let now = (elapsed % 30) / 10;
        if now != phase {
            phase = now;
            match phase {
                0 => fleet[5].restart(),
                1 => fleet[4].set(Behavior::Fail(Code::Unavailable)),
                _ => {
                    fleet[4].set(Behavior::Delay(Duration::from_millis(2)));
                    fleet[5].stop();
                }
            }
        }
        println!("{elapsed:>4}s {}", channel.stats());
    }
    workers.abort_all();
    Ok(())
}
