//! Instructions per call, for valgrind's callgrind: the channel's own cost, free of the noise of
//! a shared machine.
//!
//! The server runs in a process of its own, so that only the client's instructions are counted:
//!
//! ```text
//! cargo build --release --example instructions
//! target/release/examples/instructions serve 50071 &
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/instructions call balanced http://127.0.0.1:50071 2000 32
//! ```
//!
//! Instructions per call = (instructions for 2N calls − instructions for N calls) / N, which
//! takes out the set-up (runtime, connections). `scripts/instructions.sh` does all of it for
//! every contender. The client runs on a current-thread runtime so that the count repeats.
//!
//! `instructions pick (busy|idle) STRATEGY PICKS` makes picks alone, over 50 instances of the
//! pick benchmark's fleet (no server): `scripts/instructions.sh pick` counts instructions per
//! pick the same way.

use fleet_service as fleet;

use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use futures::stream::{FuturesUnordered, StreamExt};
use tonic::transport::{Channel, Endpoint};
use tonic_balancer::BalancedChannel;

const USAGE: &str = "usage: instructions serve PORT | instructions call (direct|balanced|balanced_n|balance_list) URI[,URI...] CALLS IN_FLIGHT | instructions rate URI ROUNDS CALLS IN_FLIGHT | instructions pick (busy|idle) (fewest_then_fastest|least_pending) PICKS";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("serve") => {
            let port: u16 = args.get(1).and_then(|p| p.parse().ok()).expect(USAGE);
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let _server = fleet::Instance::start_at("bench", addr, fleet::Behavior::Ok);
            // Serve until killed.
            loop {
                std::thread::park();
            }
        }
        Some("rate") => {
            let uri = args.get(1).expect(USAGE);
            let rounds: usize = args.get(2).and_then(|n| n.parse().ok()).expect(USAGE);
            let calls: usize = args.get(3).and_then(|n| n.parse().ok()).expect(USAGE);
            let in_flight: usize = args.get(4).and_then(|n| n.parse().ok()).expect(USAGE);
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(rates(uri, rounds, calls, in_flight));
        }
        Some("pick") => {
            let busy = match args.get(1).map(String::as_str) {
                Some("busy") => true,
                Some("idle") => false,
                _ => panic!("{USAGE}"),
            };
            let strategy = match args.get(2).map(String::as_str) {
                Some("fewest_then_fastest") => tonic_balancer::Strategy::FewestThenFastest,
                Some("least_pending") => tonic_balancer::Strategy::LeastPending,
                _ => panic!("{USAGE}"),
            };
            let picks: usize = args.get(3).and_then(|n| n.parse().ok()).expect(USAGE);
            picks_alone(busy, strategy, picks);
        }
        Some("call") => {
            let (kind, uri) = (args.get(1).expect(USAGE), args.get(2).expect(USAGE));
            let calls: usize = args.get(3).and_then(|n| n.parse().ok()).expect(USAGE);
            let in_flight: usize = args.get(4).and_then(|n| n.parse().ok()).expect(USAGE);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(run(kind, uri, calls, in_flight));
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

/// `picks` picks of the channel's own pick over 50 instances of the benchmarks' fleet
/// (`benches/pick.rs`), without calls.
fn picks_alone(busy: bool, strategy: tonic_balancer::Strategy, picks: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _in_rt = rt.enter();
    let picker = tonic_balancer::__bench::BenchPicker::new(50, strategy);
    picker.set_fleet(busy);
    for _ in 0..picks {
        std::hint::black_box(picker.pick());
    }
}

/// Calls per second of each contender to one server, interleaved: every round runs each
/// contender once (a fresh channel, `calls` calls with `in_flight` at a time, on a
/// multi-threaded runtime), so that the machine's drift hits them alike. Prints each round and
/// the median per contender.
async fn rates(uri: &str, rounds: usize, calls: usize, in_flight: usize) {
    let kinds = ["direct", "balanced", "balance_list"];
    let mut seen: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        let mut line = format!("round {round}:");
        // Rotate the order from one round to the next.
        for k in 0..kinds.len() {
            let i = (k + round) % kinds.len();
            let start = std::time::Instant::now();
            run(kinds[i], uri, calls, in_flight).await;
            let rate = calls as f64 / start.elapsed().as_secs_f64();
            seen[i].push(rate);
        }
        for (i, kind) in kinds.iter().enumerate() {
            line.push_str(&format!(" {kind} {:.0}/s", seen[i][round]));
        }
        println!("{line}");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let direct = median(&mut seen[0].clone());
    for (i, kind) in kinds.iter().enumerate() {
        let m = median(&mut seen[i]);
        println!("median {kind}: {m:.0} calls/s ({:.3}x direct)", m / direct);
    }
}

async fn run(kind: &str, uris: &str, calls: usize, in_flight: usize) {
    let uris: Vec<&str> = uris.split(',').collect();
    let endpoint = Endpoint::from_shared(uris[0].to_owned()).expect("uri");
    match kind {
        "direct" => drive(FleetClient::new(endpoint.connect_lazy()), calls, in_flight).await,
        "balanced" => {
            let ch = BalancedChannel::builder()
                .endpoint(endpoint)
                .build()
                .expect("channel");
            drive(FleetClient::new(ch), calls, in_flight).await
        }
        // Several instances (URIS is a comma list), so that the replay path of transparent
        // retry (request head copy, replayable body) is counted too.
        "balanced_n" => {
            let ch = BalancedChannel::from_static(&uris).expect("channel");
            drive(FleetClient::new(ch), calls, in_flight).await
        }
        "balance_list" => {
            let ch = Channel::balance_list(std::iter::once(endpoint));
            drive(FleetClient::new(ch), calls, in_flight).await
        }
        other => panic!("unknown contender {other}; {USAGE}"),
    }
}

async fn drive<T>(client: FleetClient<T>, calls: usize, in_flight: usize)
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let one = |mut c: FleetClient<T>, id: u64| async move {
        c.unary(Req {
            id,
            ..Default::default()
        })
        .await
        .expect("call");
    };
    // Open the connection first.
    one(client.clone(), 0).await;
    let mut pending = FuturesUnordered::new();
    let mut started = 0;
    while started < calls.min(in_flight) {
        pending.push(one(client.clone(), started as u64));
        started += 1;
    }
    while pending.next().await.is_some() {
        if started < calls {
            pending.push(one(client.clone(), started as u64));
            started += 1;
        }
    }
}
