//! The test peers themselves (`fleet_service::peers`): servers of other gRPC implementations,
//! grpc-go and grpcio, as real processes on 127.0.0.1. Each test runs once per implementation
//! (`peers::go::*`, `peers::python::*`) and shows that the peer does what the other tests
//! will rely on: it answers through a plain tonic channel and through the balanced channel,
//! each mode answers what it says, health changes are seen, its stream limit holds, and its
//! keepalive enforcement sends GOAWAY. A peer whose toolchain is missing is skipped (loudly;
//! with `CI=true` it fails).
//!
//! `cargo test --all-features --test suite peers::` runs them alone.

use std::error::Error as _;
use std::time::{Duration, Instant};

use fleet_service::pb::peer::peer_client::PeerClient;
use fleet_service::pb::peer::Payload;
use fleet_service::peers::{wait_for, Kind, Peer};
use tonic::transport::{Channel, Endpoint};
use tonic::Code;
use tonic_balancer::BalancedChannel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Each test's bound: none of them takes near it unless something is wrong.
const LIMIT: Duration = Duration::from_secs(20);

for_both!(
    unary_through_plain_and_balanced_channels,
    streams_of_every_kind,
    status_modes_answer_their_code,
    a_handler_fault_answers_unknown,
    hang_ends_by_the_callers_deadline,
    health_changes_are_seen,
    the_stream_limit_holds_on_one_connection,
    eager_keepalive_pings_get_goaway_enhance_your_calm,
    graceful_stop_finishes_the_calls_in_flight,
);

async fn plain(peer: &Peer) -> PeerClient<Channel> {
    let ch = Endpoint::from_shared(peer.uri())
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {peer:?}: {e}\n{}", peer.stderr()));
    PeerClient::new(ch)
}

fn payload(p: &str) -> Payload {
    Payload {
        payload: p.as_bytes().to_vec(),
    }
}

/// A unary call with a deadline (sent as `grpc-timeout`), bounded here too.
async fn unary<T>(
    client: &mut PeerClient<T>,
    p: &str,
    deadline: Duration,
) -> Result<Vec<u8>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut req = tonic::Request::new(payload(p));
    req.set_timeout(deadline);
    match tokio::time::timeout(deadline + LIMIT, client.unary(req)).await {
        Ok(answer) => answer.map(|r| r.into_inner().payload),
        Err(_) => panic!("a call with a deadline of {deadline:?} did not end"),
    }
}

async fn unary_through_plain_and_balanced_channels(kind: Kind) {
    let Some(peer) = Peer::start(kind, &[]) else {
        return;
    };
    let mut client = plain(&peer).await;
    assert_eq!(unary(&mut client, "plain", LIMIT).await.unwrap(), b"plain");
    let balanced = BalancedChannel::from_static([peer.uri()]).unwrap();
    let mut client = PeerClient::new(balanced);
    assert_eq!(
        unary(&mut client, "balanced", LIMIT).await.unwrap(),
        b"balanced"
    );
    assert_eq!(peer.counts().await["ok"], 2);
}

async fn streams_of_every_kind(kind: Kind) {
    let Some(peer) = Peer::start(kind, &[]) else {
        return;
    };
    let mut client = PeerClient::new(BalancedChannel::from_static([peer.uri()]).unwrap());
    let mut replies = client
        .server_stream(payload("5"))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(m) = replies.message().await.unwrap() {
        got.push(String::from_utf8(m.payload).unwrap());
    }
    assert_eq!(got, ["0", "1", "2", "3", "4"]);
    let input = futures::stream::iter(["a", "b", "c"].map(payload));
    let n = client.client_stream(input).await.unwrap().into_inner();
    assert_eq!(n.payload, b"3");
    let input = futures::stream::iter(["x", "y"].map(payload));
    let mut echoes = client.bidi(input).await.unwrap().into_inner();
    let mut got = Vec::new();
    while let Some(m) = echoes.message().await.unwrap() {
        got.push(m.payload);
    }
    assert_eq!(got, [b"x", b"y"]);
}

async fn status_modes_answer_their_code(kind: Kind) {
    let Some(peer) = Peer::start(kind, &[]) else {
        return;
    };
    let mut client = plain(&peer).await;
    for n in 1..=16 {
        let code = Code::from_i32(n);
        peer.control(&format!("status {n} scripted {n}")).await;
        let status = unary(&mut client, "x", LIMIT).await.unwrap_err();
        assert_eq!(status.code(), code, "{status:?}");
        assert_eq!(status.message(), format!("scripted {n}"));
    }
    // A status by its name, and one call's own mode in its payload.
    peer.control("status UNAVAILABLE").await;
    assert_eq!(
        unary(&mut client, "x", LIMIT).await.unwrap_err().code(),
        Code::Unavailable
    );
    peer.control("ok").await;
    let status = unary(&mut client, "!status INTERNAL", LIMIT)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(unary(&mut client, "y", LIMIT).await.unwrap(), b"y");
    assert_eq!(peer.counts().await["status"], 18);
}

/// What each implementation answers when a handler fails without choosing a status: grpcio
/// catches the exception and answers UNKNOWN "Exception calling application: ..." at once; a
/// grpc-go server with a recovery interceptor answers the interceptor's status.
async fn a_handler_fault_answers_unknown(kind: Kind) {
    let Some(peer) = Peer::start(kind, &[]) else {
        return;
    };
    let mut client = plain(&peer).await;
    let fault = match kind {
        Kind::Go => "panic-recovered",
        Kind::Python => "exception",
    };
    peer.control(fault).await;
    let status = unary(&mut client, "x", LIMIT).await.unwrap_err();
    assert_eq!(status.code(), Code::Unknown, "{status:?}");
    match kind {
        Kind::Go => assert_eq!(status.message(), "peer: panic recovered"),
        Kind::Python => assert_eq!(
            status.message(),
            "Exception calling application: peer: mode exception"
        ),
    }
    // The peer goes on serving.
    peer.control("ok").await;
    assert_eq!(unary(&mut client, "y", LIMIT).await.unwrap(), b"y");
    if kind == Kind::Go {
        go_panic_kills_the_process().await;
    }
}

/// grpc-go does not recover a handler's panic: the process dies, and the call in flight sees
/// its connection end (the channel's error: a transport error in its source, no status from the
/// server).
async fn go_panic_kills_the_process() {
    let Some(mut peer) = Peer::go(&["--mode", "panic"]) else {
        return;
    };
    let mut client = plain(&peer).await;
    let status = unary(&mut client, "x", LIMIT).await.unwrap_err();
    assert!(status.source().is_some(), "{status:?}");
    let exit = peer.wait_exit(LIMIT).expect("the peer exits");
    assert!(!exit.success(), "{exit:?}");
    assert!(
        peer.stderr().contains("panic: peer: mode panic"),
        "{}",
        peer.stderr()
    );
}

async fn hang_ends_by_the_callers_deadline(kind: Kind) {
    let Some(peer) = Peer::start(kind, &["--mode", "hang"]) else {
        return;
    };
    let deadline = Duration::from_millis(300);
    // tonic's own channel times the call out itself and answers CANCELLED "Timeout expired"
    // (a transport error in the source), unless the server's DEADLINE_EXCEEDED wins the race.
    let mut client = plain(&peer).await;
    let start = Instant::now();
    let status = unary(&mut client, "x", deadline).await.unwrap_err();
    assert!(
        matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded),
        "{status:?}"
    );
    assert!(start.elapsed() >= deadline);
    let mut client = PeerClient::new(BalancedChannel::from_static([peer.uri()]).unwrap());
    let start = Instant::now();
    let status = unary(&mut client, "x", deadline).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(start.elapsed() >= deadline);
    // The server's handlers end too.
    wait_for("the hanging calls to end on the peer", LIMIT, || async {
        peer.inflight().await.0 == 0
    })
    .await;
    assert_eq!(peer.counts().await["hang"], 2);
}

async fn health_changes_are_seen(kind: Kind) {
    let Some(peer) = Peer::start(kind, &[]) else {
        return;
    };
    let channel = Endpoint::from_shared(peer.uri())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let check = |mut h: HealthClient<Channel>| async move {
        let req = HealthCheckRequest {
            service: String::new(),
        };
        h.check(req).await.unwrap().into_inner().status
    };
    assert_eq!(check(health.clone()).await, ServingStatus::Serving as i32);
    peer.control("health NOT_SERVING").await;
    assert_eq!(
        check(health.clone()).await,
        ServingStatus::NotServing as i32
    );
    peer.control("health SERVING").await;
    assert_eq!(check(health.clone()).await, ServingStatus::Serving as i32);
    // A service the peer was never told of.
    let req = HealthCheckRequest {
        service: "no.Such".into(),
    };
    assert_eq!(health.check(req).await.unwrap_err().code(), Code::NotFound);
}

/// N+1 calls at once on one connection to a peer that allows N streams: the client holds the
/// last one back (the server's SETTINGS said N), the server never has more than N, and every
/// call succeeds once the first ones end.
async fn the_stream_limit_holds_on_one_connection(kind: Kind) {
    const N: u64 = 4;
    let limit = N.to_string();
    let args = ["--max-concurrent-streams", &limit, "--mode", "hang"];
    let Some(peer) = Peer::start(kind, &args) else {
        return;
    };
    let mut client = plain(&peer).await;
    // One call first, so that the client has the server's SETTINGS: until then it does not
    // know the limit, and a burst of N+1 gets the last stream refused (grpc-go: RST_STREAM
    // REFUSED_STREAM; grpcio: RST_STREAM ENHANCE_YOUR_CALM).
    peer.control("ok").await;
    unary(&mut client, "first", LIMIT).await.unwrap();
    peer.control("hang").await;
    let calls: Vec<_> = (0..=N)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { unary(&mut client, &i.to_string(), LIMIT).await })
        })
        .collect();
    wait_for("N calls in flight on the peer", LIMIT, || async {
        peer.inflight().await.0 == N
    })
    .await;
    peer.control("ok").await;
    peer.control("release").await;
    for call in calls {
        call.await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e:?}\n{}", peer.stderr()));
    }
    assert_eq!(peer.inflight().await.1, N, "the most in flight at once");
    assert_eq!(peer.served().await, N + 2);
}

/// A client that pings every 20 ms while a call is open, against a server that allows one
/// ping in 10 s: grpc-go (`keepalive.EnforcementPolicy.MinTime`) and C-core
/// (`grpc.http2.min_ping_interval_without_data_ms`, `grpc.http2.max_ping_strikes`) both count
/// each early ping a strike and past two send GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and
/// close the connection (<https://github.com/grpc/grpc-go/blob/master/Documentation/keepalive.md>,
/// <https://github.com/grpc/grpc/blob/master/doc/keepalive.md>).
///
/// First with an h2 client of the test's own, whose connection ends with the GOAWAY's error;
/// then as a tonic channel with an eager `http2_keep_alive_interval` meets it: the call open on
/// the connection fails (grpc-go: the connection just ends under it, a transport error;
/// grpcio: UNAVAILABLE "Too many pings", a status C-core writes before its GOAWAY), and the
/// channel's next call, on a new connection, succeeds.
async fn eager_keepalive_pings_get_goaway_enhance_your_calm(kind: Kind) {
    let min = match kind {
        Kind::Go => ["--keepalive-min-time", "10s"],
        Kind::Python => ["--min-ping-interval-ms", "10000"],
    };
    let Some(peer) = Peer::start(kind, &[min[0], min[1], "--mode", "hang"]) else {
        return;
    };

    let goaway = pinged_until_closed(&peer).await;
    assert!(goaway.is_go_away(), "{goaway:?}");
    assert!(goaway.is_remote(), "{goaway:?}");
    assert_eq!(
        goaway.reason(),
        Some(h2::Reason::ENHANCE_YOUR_CALM),
        "{goaway:?}"
    );
    assert!(goaway.to_string().contains("too_many_pings"), "{goaway}");

    let channel = Endpoint::from_shared(peer.uri())
        .unwrap()
        .http2_keep_alive_interval(Duration::from_millis(20))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut client = PeerClient::new(channel);
    let status = unary(&mut client, "x", LIMIT).await.unwrap_err();
    match kind {
        Kind::Go => assert!(status.source().is_some(), "{status:?}"),
        Kind::Python => {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
            assert_eq!(status.message(), "Too many pings", "{status:?}");
        }
    }
    peer.control("ok").await;
    // tonic's channel opens a new connection for a later call; one sent while the closed
    // connection is still being torn down fails with CANCELLED "connection closed" (seen under
    // a busy machine): the peer answers again once a call reaches a new connection.
    let mut answer = None;
    for _ in 0..10 {
        if let Ok(a) = unary(&mut client, "again", LIMIT).await {
            answer = Some(a);
            break;
        }
    }
    assert_eq!(answer.as_deref(), Some(&b"again"[..]));
}

/// Opens a unary call to `peer` (in mode hang) on an h2 connection of the test's own, pings
/// every 20 ms while it is open, and returns the error the connection ended with.
async fn pinged_until_closed(peer: &Peer) -> h2::Error {
    let tcp = tokio::net::TcpStream::connect(peer.addr()).await.unwrap();
    let (send, mut conn) = h2::client::handshake(tcp).await.unwrap();
    let mut pings = conn.ping_pong().expect("the connection's ping-pong");
    let driver = tokio::spawn(conn);
    let mut send = send.ready().await.unwrap();
    let req = http::Request::post(format!("http://{}/peer.Peer/Unary", peer.addr()))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (_response, mut body) = send.send_request(req, false).unwrap();
    // One gRPC message: no compression, its length, and the Payload "x" (field 1, 1 byte).
    body.send_data(
        bytes::Bytes::from_static(&[0, 0, 0, 0, 3, 0x0a, 1, b'x']),
        true,
    )
    .unwrap();
    let start = Instant::now();
    while !driver.is_finished() {
        assert!(
            start.elapsed() < LIMIT,
            "the peer never closed the connection"
        );
        let _ = tokio::time::timeout(Duration::from_secs(1), pings.ping(h2::Ping::opaque())).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match driver.await.unwrap() {
        Ok(()) => panic!("the connection ended without an error"),
        Err(e) => e,
    }
}

/// A graceful stop while a call is in flight: the call finishes (the peer releases it after
/// the stop began), the process exits by itself, and nothing more is served.
async fn graceful_stop_finishes_the_calls_in_flight(kind: Kind) {
    let Some(mut peer) = Peer::start(kind, &["--mode", "hang"]) else {
        return;
    };
    let mut client = plain(&peer).await;
    let call = tokio::spawn(async move { unary(&mut client, "in flight", LIMIT).await });
    wait_for("the call in flight on the peer", LIMIT, || async {
        peer.inflight().await.0 == 1
    })
    .await;
    assert_eq!(
        peer.control("graceful-stop drain=200ms").await,
        "stopping inflight=1"
    );
    assert_eq!(call.await.unwrap().unwrap(), b"in flight");
    let exit = peer
        .wait_exit(LIMIT)
        .expect("the peer exits after its graceful stop");
    assert!(exit.success(), "{exit:?}\n{}", peer.stderr());
    let mut client = PeerClient::new(BalancedChannel::from_static([peer.uri()]).unwrap());
    let status = unary(&mut client, "after", Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}
