//! DNS discovery, end to end, on loopback: the channel follows the A records of a name as
//! they change, and keeps its set when DNS fails.
//!
//! ```text
//! cargo run --example dns_discovery
//! ```
//!
//! It starts a tiny DNS server on 127.0.0.1 (UDP) that answers for `greeter.local.`, and three
//! gRPC servers from the test fleet on 127.0.0.2, 127.0.0.3 and 127.0.0.4, all on one port, as
//! the pods behind a Kubernetes headless Service. The channel is built with
//! `dns_with("greeter.local.:PORT", ..)` pointed at that DNS server and asks it again
//! every 500 ms. The example then changes the records (adds the third instance, removes the
//! first, makes DNS fail) and, after each change, waits until the channel has seen it, sends
//! calls and prints which instances answered and what `endpoints()` shows. It talks only to
//! 127.0.0.x and ends by itself in a few seconds.

use fleet_service as fleet;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use fleet::dns::{resolver_for, DnsServer};
use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use fleet::{Behavior, Instance};
use futures::stream::{self, StreamExt};
use tonic_balancer::{BalancedChannel, State};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const NAME: &str = "greeter.local.";
const INTERVAL: Duration = Duration::from_millis(500);
/// How long to wait for the channel to see a change before giving up (a few intervals).
const PATIENCE: Duration = Duration::from_secs(5);
const CALLS: u64 = 60;
const CONCURRENCY: usize = 6;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let started = Instant::now();

    // Three instances on 127.0.0.2-4, one shared port (the first picks it, the others reuse it).
    let ips: Vec<Ipv4Addr> = (2..=4).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let names = ["greeter-a", "greeter-b", "greeter-c"];
    let behavior = Behavior::Delay(Duration::from_millis(2));
    let first = Instance::start_at(
        names[0],
        SocketAddr::new(ips[0].into(), 0),
        behavior.clone(),
    );
    let port = first.addr.port();
    let mut instances = vec![first];
    for (name, ip) in names[1..].iter().zip(&ips[1..]) {
        instances.push(Instance::start_at(
            name,
            SocketAddr::new((*ip).into(), port),
            behavior.clone(),
        ));
    }
    println!("== Fleet: three gRPC servers on one port");
    for i in &instances {
        println!("   {:<10} {}", i.name(), i.uri());
    }

    // The DNS server publishes the first two.
    let dns = DnsServer::start(NAME).await;
    dns.set(&ips[..2]);
    println!(
        "\n== DNS server on udp://{} answers {NAME} with {}",
        dns.addr,
        list(&dns.records())
    );

    let settings = resolver_for(&dns);
    let target = format!("{NAME}:{port}");
    let channel = BalancedChannel::builder()
        .dns_with(&target, settings)
        .discovery_interval(INTERVAL)
        .build()?;
    let client = FleetClient::new(channel.clone());
    println!("   channel built on dns {target}, re-resolving every {INTERVAL:?}");

    println!("\n== 1. Two records published: {CALLS} calls (the first waits for the first answer)");
    spread(&client, &instances).await?;
    table(&channel);

    println!("\n== 2. DNS adds {} (greeter-c)", ips[2]);
    dns.set(&ips);
    let uri_c = instances[2].uri();
    let took = wait_for("the third instance to join", || {
        live(&channel).contains(&uri_c)
    })
    .await?;
    println!("   the channel picked it up after {} ms", took.as_millis());
    spread(&client, &instances).await?;
    table(&channel);

    println!("\n== 3. DNS drops {} (greeter-a)", ips[0]);
    dns.set(&ips[1..]);
    let uri_a = instances[0].uri();
    let took = wait_for("the first instance to leave", || {
        !live(&channel).contains(&uri_a)
    })
    .await?;
    let now = match channel.endpoints().iter().find(|e| e.uri() == uri_a) {
        Some(e) => format!(
            "{}: no new calls, it finishes its {} in flight",
            e.state(),
            e.in_flight()
        ),
        None => "gone: it had no call in flight, so it closed at once".to_owned(),
    };
    println!(
        "   the channel let it go after {} ms ({now})",
        took.as_millis()
    );
    let before = instances[0].served();
    spread(&client, &instances).await?;
    println!(
        "   greeter-a served {} new calls since it left",
        instances[0].served() - before
    );
    table(&channel);

    println!("\n== 4. DNS fails (SERVFAIL on every query)");
    dns.set_failing(true);
    let q = dns.query_count();
    // A failed lookup sends a few queries (four with these resolver options: A and AAAA,
    // each asked twice), so eight failed queries are at least two failed lookups.
    let took = wait_for("two failed lookups", || dns.query_count() >= q + 8).await?;
    println!(
        "   {} queries answered SERVFAIL over {} ms (two lookups or more); the set is kept:",
        dns.query_count() - q,
        took.as_millis()
    );
    spread(&client, &instances).await?;
    table(&channel);

    println!("\n== Done in {} ms", started.elapsed().as_millis());
    Ok(())
}

/// Sends `CALLS` calls, `CONCURRENCY` at a time, and prints how many each instance answered.
async fn spread(
    client: &FleetClient<BalancedChannel>,
    instances: &[Instance],
) -> Result<(), BoxError> {
    let mut by_name: BTreeMap<String, u64> =
        instances.iter().map(|i| (i.name().to_owned(), 0)).collect();
    let mut replies = stream::iter(0..CALLS)
        .map(|id| {
            let mut c = client.clone();
            async move {
                c.unary(Req {
                    id,
                    ..Default::default()
                })
                .await
            }
        })
        .buffer_unordered(CONCURRENCY);
    while let Some(reply) = replies.next().await {
        *by_name.entry(reply?.into_inner().instance).or_default() += 1;
    }
    let parts: Vec<String> = by_name.iter().map(|(n, c)| format!("{n} {c}")).collect();
    println!("   answered by: {}", parts.join(", "));
    Ok(())
}

/// Prints `channel.endpoints()`.
fn table(channel: &BalancedChannel) {
    println!(
        "   {:<26} {:<11} {:>9} {:>8}",
        "uri", "state", "in_flight", "started"
    );
    let mut eps = channel.endpoints();
    eps.sort_by(|a, b| a.uri().cmp(b.uri()));
    for e in eps {
        println!(
            "   {:<26} {:<11} {:>9} {:>8}",
            e.uri(),
            e.state().to_string(),
            e.in_flight(),
            e.started()
        );
    }
}

/// The URIs of the instances the channel still routes to (not draining).
fn live(channel: &BalancedChannel) -> Vec<String> {
    channel
        .endpoints()
        .iter()
        .filter(|e| e.state() != State::Draining)
        .map(|e| e.uri().to_owned())
        .collect()
}

/// Polls `cond` every 10 ms until it holds (returns how long that took) or `PATIENCE` passes.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Result<Duration, BoxError> {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() > PATIENCE {
            return Err(format!("gave up after {PATIENCE:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(start.elapsed())
}

fn list<T: ToString>(ips: &[T]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
