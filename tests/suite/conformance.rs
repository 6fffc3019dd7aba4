//! The channel's failure scenarios against servers of other implementations (grpc-go and
//! grpcio, `fleet_service::peers`), each with its target from the issue that set it: what
//! their servers do that the tonic fleet does not (a refused stream from a server whose count
//! of streams lags behind the client's, a handler fault, keepalive enforcement). The full matrix,
//! beside tonic's `balance_list` on the same servers, is `examples/conformance.rs`; its table is
//! in docs/benchmarks.md.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleet_service::pb::peer::peer_client::PeerClient;
use fleet_service::pb::peer::Payload;
use fleet_service::peers::{Kind, Peer, Settings};
use tonic::Code;
use tonic_balancer::BalancedChannel;

for_both!(
    refused_streams_at_the_servers_limit_fail_at_most_one_call_in_a_hundred,
    a_handler_that_throws_does_not_draw_the_traffic,
    an_instance_answering_internal_does_not_draw_the_traffic,
    keepalive_enforcement_loses_no_call_and_ejects_no_instance,
);

/// Peers of `kind` started at once (each start waits for its listening line), one per
/// settings.
fn start(kind: Kind, settings: Vec<Settings>) -> Option<Vec<Peer>> {
    let threads: Vec<_> = settings
        .into_iter()
        .map(|s| std::thread::spawn(move || Peer::with(kind, &s)))
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Five peers of `kind`, the first in `bad` mode, the others answering after 5 ms.
fn fleet(kind: Kind, bad: &str) -> Option<Vec<Peer>> {
    let mut settings = vec![Settings::mode(bad)];
    settings.extend((1..5).map(|_| Settings::mode("ok delay=5ms")));
    start(kind, settings)
}

/// How much load: this many calls in all, or calls for this long.
#[derive(Clone, Copy)]
enum Budget {
    Calls(u64),
    For(Duration),
}

/// Calls from `callers` concurrent callers, one after the other each, within `budget`: how
/// many, and the failed ones.
async fn calls(ch: &BalancedChannel, callers: usize, budget: Budget) -> (u64, Vec<tonic::Status>) {
    let made = Arc::new(AtomicU64::new(0));
    let begin = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let (mut client, made) = (PeerClient::new(ch.clone()), made.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                loop {
                    let n = made.fetch_add(1, Ordering::Relaxed);
                    match budget {
                        Budget::Calls(total) if n >= total => break,
                        Budget::For(d) if begin.elapsed() >= d => break,
                        _ => {}
                    }
                    let mut req = tonic::Request::new(Payload::default());
                    req.set_timeout(Duration::from_secs(10));
                    if let Err(s) = client.unary(req).await {
                        failed.push(s);
                    }
                }
                made.fetch_sub(1, Ordering::Relaxed);
                failed
            })
        })
        .collect();
    let mut failed = Vec::new();
    for t in tasks {
        failed.extend(t.await.unwrap());
    }
    (made.load(Ordering::Relaxed), failed)
}

/// One instance of five fails every call at once with `code` (its mode `bad`), the others
/// answer in 5 ms; 4 callers, 1,200 calls through the default channel: the failing instance,
/// which looks idle and fast, would draw most of the calls (77-98% of them failed before
/// UNKNOWN and INTERNAL counted against an instance); it is ejected after five failures in a
/// row, and at most 2% of the calls fail.
async fn a_server_fault_does_not_draw_the_traffic(kind: Kind, bad: &str, code: Code) {
    let Some(fleet) = fleet(kind, bad) else {
        return;
    };
    let ch = BalancedChannel::from_static(fleet.iter().map(Peer::uri)).unwrap();
    let (_, failed) = calls(&ch, 4, Budget::Calls(1200)).await;
    let served_by_bad = fleet[0].served().await;
    assert!(
        failed.len() <= 24,
        "{kind:?} {bad}: {} of 1,200 calls failed (> 2%): {:?}",
        failed.len(),
        ch.endpoints()
    );
    assert!(failed.iter().all(|s| s.code() == code), "{failed:?}");
    let bad_uri = fleet[0].uri();
    let stats = ch
        .endpoints()
        .into_iter()
        .find(|e| e.uri().trim_end_matches('/') == bad_uri)
        .unwrap();
    assert_eq!(stats.ejections(), 1, "{kind:?} {bad}: {stats}");
    assert!(
        served_by_bad <= 9,
        "{kind:?} {bad}: it served {served_by_bad} calls"
    );
}

/// A handler that throws: grpcio answers UNKNOWN "Exception calling application"; grpc-go with
/// a recovery interceptor, UNKNOWN too (the peer's `panic-recovered`).
async fn a_handler_that_throws_does_not_draw_the_traffic(kind: Kind) {
    let bad = match kind {
        Kind::Go => "panic-recovered",
        Kind::Python => "exception",
    };
    a_server_fault_does_not_draw_the_traffic(kind, bad, Code::Unknown).await;
}

/// INTERNAL: go-grpc-middleware's recovery interceptor answers it for a panic by default.
async fn an_instance_answering_internal_does_not_draw_the_traffic(kind: Kind) {
    a_server_fault_does_not_draw_the_traffic(kind, "status INTERNAL", Code::Internal).await;
}

/// Servers that enforce keepalive (one ping per 10 s without data, PermitWithoutStream off)
/// and a client whose `Endpoint` pings every 10 ms, idle or not: grpc-go and grpcio close its
/// connections with GOAWAY ENHANCE_YOUR_CALM (`too_many_pings`). Sequential calls with idle
/// gaps for 2 s: no instance ejected, and no call lost that the server did not take. A call
/// that was on the connection when the server closed it (its GOAWAY names it processed; the
/// busier the machine, the likelier) fails UNAVAILABLE, "broke during the call" from grpc-go
/// (as through grpc-go's own client), "Too many pings" from C-core: it may have run, so it is
/// not sent again.
async fn keepalive_enforcement_loses_no_call_and_ejects_no_instance(kind: Kind) {
    let settings = Settings {
        keepalive_min_time: Some(Duration::from_secs(10)),
        ..Settings::mode("ok")
    };
    let Some(fleet) = start(kind, vec![settings.clone(), settings]) else {
        return;
    };
    let mut b = BalancedChannel::builder();
    for peer in &fleet {
        b = b.endpoint(
            tonic::transport::Endpoint::from_shared(peer.uri())
                .unwrap()
                .http2_keep_alive_interval(Duration::from_millis(10))
                .keep_alive_while_idle(true),
        );
    }
    let ch = b.build().unwrap();
    let mut client = PeerClient::new(ch.clone());
    let until = Instant::now() + Duration::from_secs(2);
    let (mut calls, mut failed) = (0, Vec::new());
    while Instant::now() < until {
        calls += 1;
        if let Err(s) = client.unary(Payload::default()).await {
            failed.push(s);
        }
        // Idle between calls: the pings come without data, as enforcement counts them.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // grpc-go gives the call no status (the connection broke under it); C-core answers it
    // UNAVAILABLE "Too many pings" before it closes.
    let taken = |s: &tonic::Status| {
        s.code() == Code::Unavailable
            && (s.message().contains("broke during the call") || s.message() == "Too many pings")
    };
    // The calls are sequential: each failure is a close that caught the one call in flight,
    // and the server closes as often as its strikes run out (more often on a busy machine).
    // The bound only guards against a loss that is not of that kind.
    assert!(
        failed.iter().all(taken) && failed.len() * 10 <= calls,
        "{kind:?}: {} of {calls} calls failed: {failed:?}",
        failed.len()
    );
    for e in ch.endpoints() {
        assert_eq!(e.ejections(), 0, "{kind:?}: {e}");
    }
    if kind == Kind::Go {
        // The GOAWAYs came: each closed a connection, and the next call opened another.
        let mut conns = 0;
        for peer in &fleet {
            let answer = peer.control("conns").await;
            conns += answer
                .trim_start_matches("conns=")
                .trim()
                .parse::<u64>()
                .unwrap();
        }
        assert!(conns > 2, "no connection was closed: {conns} connections");
    }
}

/// One instance allowing 10 streams per connection, a channel of 10 streams on each of up to 5
/// connections to it, 45 callers of short unary calls for 3 s: grpcio (C-core) counts a stream
/// until it is closed on both sides, so it refuses streams its client counts as over. A
/// refused stream waits for room rather than spending its replays at once: at most 1% of the
/// calls fail.
async fn refused_streams_at_the_servers_limit_fail_at_most_one_call_in_a_hundred(kind: Kind) {
    let settings = Settings {
        max_concurrent_streams: Some(10),
        ..Settings::mode("ok")
    };
    let Some(peer) = Peer::with(kind, &settings) else {
        return;
    };
    let ch = BalancedChannel::builder()
        .uri(&peer.uri())
        .max_streams_per_connection(10)
        .max_connections_per_instance(5)
        .build()
        .unwrap();
    let (calls, failed) = calls(&ch, 45, Budget::For(Duration::from_secs(3))).await;
    let stats = ch.stats();
    eprintln!(
        "{kind:?}: {} of {calls} calls failed; {stats}",
        failed.len()
    );
    assert!(
        failed.len() as f64 <= 0.01 * calls as f64,
        "{kind:?}: {} of {calls} calls failed (> 1%): {:?}; {stats}",
        failed.len(),
        failed.iter().take(3).collect::<Vec<_>>()
    );
    assert!(
        failed.iter().all(|s| s.code() == Code::Unavailable),
        "{failed:?}"
    );
}
