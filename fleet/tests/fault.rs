//! The fault layer (`fleet::fault`) around a real tonic server on 127.0.0.1, with a service of
//! this file's own, called through a plain tonic `Channel`. Timings are on tokio's paused clock
//! (exact, so the bounds below hold on any machine); conditions are awaited by polling.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fleet_proto::fleet_client::FleetClient;
use fleet_proto::fleet_server::{Fleet, FleetServer};
use fleet_proto::{Reply, Req};
use futures::{Stream, StreamExt};
use http_body::{Body as _, Frame};
use prost::Message as _;
use tokio::time::Instant;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_balancer_fleet::fault::{Faults, MethodCount, Point, Script};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower::ServiceExt as _;

const SERVICE: &str = "/fleet.v1.Fleet/";
const UNARY: &str = "/fleet.v1.Fleet/Unary";
const SERVER_STREAM: &str = "/fleet.v1.Fleet/ServerStream";
const CLIENT_STREAM: &str = "/fleet.v1.Fleet/ClientStream";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

const MS: Duration = Duration::from_millis(1);
const SECOND: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// The service and the server
// ---------------------------------------------------------------------------------------------

/// Echoes ids; `server_stream` sends `count` replies (`seq` 0..count), `client_stream` answers
/// the number of messages it read (in `seq`) and the last id, `bidi` echoes each message.
#[derive(Clone, Default)]
struct Echo {
    /// Calls that reached a handler.
    handled: Arc<AtomicU64>,
    /// Messages read by `client_stream` and `bidi`.
    read: Arc<AtomicU64>,
}

type Replies = Pin<Box<dyn Stream<Item = Result<Reply, Status>> + Send>>;

fn reply(id: u64, seq: u32) -> Reply {
    Reply {
        instance: "echo".into(),
        id,
        seq,
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Fleet for Echo {
    async fn unary(&self, req: Request<Req>) -> Result<Response<Reply>, Status> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(reply(req.into_inner().id, 0)))
    }

    type ServerStreamStream = Replies;

    async fn server_stream(&self, req: Request<Req>) -> Result<Response<Replies>, Status> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let Req { id, count, .. } = req.into_inner();
        let replies = futures::stream::iter((0..count).map(move |seq| Ok(reply(id, seq))));
        Ok(Response::new(Box::pin(replies)))
    }

    async fn client_stream(&self, req: Request<Streaming<Req>>) -> Result<Response<Reply>, Status> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let mut input = req.into_inner();
        let (mut n, mut last) = (0, 0);
        while let Some(m) = input.message().await? {
            self.read.fetch_add(1, Ordering::SeqCst);
            n += 1;
            last = m.id;
        }
        Ok(Response::new(reply(last, n)))
    }

    type BidiStream = Replies;

    async fn bidi(&self, req: Request<Streaming<Req>>) -> Result<Response<Replies>, Status> {
        self.handled.fetch_add(1, Ordering::SeqCst);
        let read = self.read.clone();
        let replies = req.into_inner().map(move |m| {
            read.fetch_add(1, Ordering::SeqCst);
            m.map(|m| reply(m.id, 0))
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// A server on 127.0.0.1:0 (the echo service and a health service, under `layer`) and a
/// client connected to it.
struct Fixture {
    addr: std::net::SocketAddr,
    echo: Echo,
    client: FleetClient<Channel>,
    health: HealthClient<Channel>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts the echo and health services on 127.0.0.1:0 under `Server::builder().layer($layer)`,
/// and connects a client (a macro: tonic's bounds on a layer are long to spell out).
macro_rules! serve {
    ($layer:expr) => {{
        let echo = Echo::default();
        let (_reporter, health) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = Server::builder()
            .layer($layer)
            .add_service(FleetServer::new(echo.clone()))
            .add_service(health);
        tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Fixture {
            addr,
            echo,
            client: FleetClient::new(channel.clone()),
            health: HealthClient::new(channel),
            _stop: stop,
        }
    }};
}

async fn start(faults: &Faults) -> Fixture {
    serve!(faults.layer())
}

fn req(id: u64) -> Req {
    Req {
        id,
        ..Default::default()
    }
}

/// A server-streaming request for `count` replies.
fn stream_req(id: u64, count: u32) -> Req {
    Req {
        id,
        count,
        ..Default::default()
    }
}

/// One unary call; its result and how long it took (on tokio's clock).
async fn timed_unary(
    client: &mut FleetClient<Channel>,
    id: u64,
) -> (Result<Reply, Status>, Duration) {
    let start = Instant::now();
    let result = client.unary(req(id)).await.map(Response::into_inner);
    (result, start.elapsed())
}

async fn unary_ok(client: &mut FleetClient<Channel>, id: u64) -> Duration {
    let (result, took) = timed_unary(client, id).await;
    let reply = result.unwrap_or_else(|e| panic!("call {id} failed: {e:?}"));
    assert_eq!(reply.id, id);
    took
}

async fn unary_err(client: &mut FleetClient<Channel>, id: u64) -> Status {
    match client.unary(req(id)).await {
        Ok(reply) => panic!("call {id} succeeded: {reply:?}"),
        Err(status) => status,
    }
}

/// Waits until `cond` holds, polling every millisecond; panics after 30 s of wall time.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(MS).await;
    }
}

/// Waits until the layer counts no call in flight.
async fn no_call_in_flight(faults: &Faults) {
    until("no call in flight", || faults.in_flight() == 0).await;
}

/// `stream` is the only call in flight: dropping it ends it, and the count goes back to 0.
async fn dropping_it_ends_the_only_call<T>(faults: &Faults, stream: T) {
    assert_eq!(faults.in_flight(), 1);
    drop(stream);
    no_call_in_flight(faults).await;
}

/// A unary call in a task of its own.
fn spawn_unary(
    client: &FleetClient<Channel>,
    id: u64,
) -> tokio::task::JoinHandle<Result<Reply, Status>> {
    let mut client = client.clone();
    tokio::spawn(async move { client.unary(req(id)).await.map(Response::into_inner) })
}

/// Opens a server stream of `count` messages and reads them in order; what comes after them
/// is left to the caller.
async fn read_stream(
    client: &mut FleetClient<Channel>,
    id: u64,
    count: u32,
) -> tonic::Streaming<Reply> {
    let mut stream = client
        .server_stream(stream_req(id, count))
        .await
        .unwrap()
        .into_inner();
    for seq in 0..count {
        assert_eq!(stream.message().await.unwrap().unwrap().seq, seq);
    }
    stream
}

/// Waits until `call` is the one call held, releases it, and returns its outcome.
async fn released(
    faults: &Faults,
    call: tokio::task::JoinHandle<Result<Reply, Status>>,
) -> Result<Reply, Status> {
    until("a held call", || faults.held() == 1).await;
    faults.release(1);
    call.await.unwrap()
}

async fn health_check(health: &mut HealthClient<Channel>) -> Result<(), Status> {
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(drop)
}

// ---------------------------------------------------------------------------------------------
// The waits
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn delay_adds_a_fixed_latency() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().delay(300 * MS));
    for id in 0..3 {
        let took = unary_ok(&mut f.client, id).await;
        assert!(took >= 300 * MS && took < 400 * MS, "took {took:?}");
    }
    faults.clear();
    let took = unary_ok(&mut f.client, 3).await;
    assert!(took < 300 * MS, "took {took:?} without a script");
}

#[tokio::test(start_paused = true)]
async fn per_call_in_flight_grows_with_the_calls_in_flight() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set_method(SERVER_STREAM, Script::new().hold());
    faults.set_method(UNARY, Script::new().hold());

    // Two held unary calls (the method's scope), and a held stream (another method's).
    let held_unary: Vec<_> = (10..12).map(|id| spawn_unary(&f.client, id)).collect();
    let mut client = f.client.clone();
    let stream = tokio::spawn(async move { client.server_stream(stream_req(9, 1)).await });
    until("three held calls", || faults.held() == 3).await;
    faults.set_method(UNARY, Script::new().per_call_in_flight(100 * MS));

    // This call and the two held ones of its method: 2 × 100 ms; the stream does not count.
    let took = unary_ok(&mut f.client, 1).await;
    assert!(
        took >= 200 * MS && took < 300 * MS,
        "took {took:?} with 2 others of its method in flight"
    );

    assert_eq!(faults.release(3), 3);
    for h in held_unary {
        h.await.unwrap().unwrap();
    }
    let mut stream = stream.await.unwrap().unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    no_call_in_flight(&faults).await;
    let took = unary_ok(&mut f.client, 2).await;
    assert!(took < 100 * MS, "took {took:?} alone again");
}

/// Which of `n` sequential calls stalled (took at least `stall`).
async fn stalls(client: &mut FleetClient<Channel>, n: u64, stall: Duration) -> Vec<bool> {
    let mut stalled = Vec::new();
    for id in 0..n {
        stalled.push(unary_ok(client, id).await >= stall);
    }
    stalled
}

#[tokio::test(start_paused = true)]
async fn stall_hits_its_share_of_calls_deterministically() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.seed(42);
    faults.set(Script::new().stall(0.25, SECOND));
    let first = stalls(&mut f.client, 200, SECOND).await;
    let hits = first.iter().filter(|s| **s).count();
    // Binomial(200, 0.25): mean 50, sd 6.1; the sequence is fixed, the bounds are not tight.
    assert!((30..=70).contains(&hits), "{hits} of 200 calls stalled");

    // The same seed, the same calls stalled.
    faults.seed(42);
    let again = stalls(&mut f.client, 200, SECOND).await;
    assert_eq!(first, again);

    // Certain and never.
    faults.set(Script::new().stall(1.0, SECOND));
    assert!(stalls(&mut f.client, 5, SECOND).await.iter().all(|s| *s));
    faults.set(Script::new().stall(0.0, SECOND));
    assert!(stalls(&mut f.client, 5, SECOND).await.iter().all(|s| !*s));
}

#[test]
#[should_panic(expected = "Script::stall: the probability 1.5 is not in [0, 1]")]
fn stall_refuses_a_probability_out_of_range() {
    let _ = Script::new().stall(1.5, SECOND);
}

#[tokio::test(start_paused = true)]
async fn cold_slows_the_first_calls_then_not() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().cold(3, SECOND));
    for id in 0..3 {
        let took = unary_ok(&mut f.client, id).await;
        assert!(took >= SECOND, "cold call {id} took {took:?}");
    }
    for id in 3..6 {
        let took = unary_ok(&mut f.client, id).await;
        assert!(took < SECOND, "warm call {id} took {took:?}");
    }
    // Set again: cold again, counted from now.
    faults.set(Script::new().cold(1, SECOND));
    assert!(unary_ok(&mut f.client, 6).await >= SECOND);
    assert!(unary_ok(&mut f.client, 7).await < SECOND);
}

#[tokio::test(start_paused = true)]
async fn queue_serves_one_call_at_a_time_in_turn() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().queue(100 * MS));
    let alone = unary_ok(&mut f.client, 0).await;
    assert!(
        alone >= 100 * MS && alone < 150 * MS,
        "took {alone:?} alone"
    );

    // Three at once: each waits for those before it.
    let start = Instant::now();
    let calls: Vec<_> = (1..4)
        .map(|id| {
            let mut client = f.client.clone();
            tokio::spawn(async move {
                unary_ok(&mut client, id).await;
                start.elapsed()
            })
        })
        .collect();
    let mut ends = Vec::new();
    for call in calls {
        ends.push(call.await.unwrap());
    }
    ends.sort();
    // The k-th to end waited for the k - 1 before it. (Over real sockets the paused clock may
    // move on to the next timer while an answer is on its way: an end can be late by one
    // service time, never early.)
    for (k, end) in ends.iter().enumerate() {
        let due = 100 * MS * (k as u32 + 1);
        assert!(
            *end >= due && *end < due + 150 * MS,
            "three calls at once ended after {ends:?}"
        );
    }

    // The queue emptied: alone again.
    let again = unary_ok(&mut f.client, 4).await;
    assert!(
        again >= 100 * MS && again < 150 * MS,
        "took {again:?} alone again"
    );
}

// ---------------------------------------------------------------------------------------------
// The statuses
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn fail_answers_with_its_status_message_and_trailer() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(
        Script::new()
            .fail(Code::Unavailable, "scripted: going away")
            .trailer("grpc-retry-pushback-ms", "100")
            .trailer("x-fault", "yes"),
    );
    let status = unary_err(&mut f.client, 0).await;
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "scripted: going away");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "100"
    );
    assert_eq!(status.metadata().get("x-fault").unwrap(), "yes");
    assert_eq!(
        f.echo.handled.load(Ordering::SeqCst),
        0,
        "the service saw the call"
    );

    // Every kind of call.
    let status = f.client.server_stream(stream_req(1, 3)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let status = f
        .client
        .client_stream(futures::stream::iter(vec![req(1), req(2)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(faults.calls(), 3);
    no_call_in_flight(&faults).await;
}

#[test]
#[should_panic(expected = "Script::trailer: \"grpc-status\" is reserved")]
fn trailer_refuses_a_reserved_key() {
    let _ = Script::new().trailer("grpc-status", "0");
}

#[test]
#[should_panic(expected = "Script::trailer: \"x-data-bin\" is not a valid ASCII metadata key")]
fn trailer_refuses_a_binary_key() {
    let _ = Script::new().trailer("x-data-bin", "AAAA");
}

#[tokio::test]
async fn one_in_fails_every_nth_call() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().fail(Code::Internal, "one in three").one_in(3));
    let mut failed = Vec::new();
    for id in 0..9 {
        failed.push(timed_unary(&mut f.client, id).await.0.is_err());
    }
    let every_third = [false, false, true].repeat(3);
    assert_eq!(failed, every_third);
    assert_eq!(f.echo.handled.load(Ordering::SeqCst), 6);
}

#[test]
#[should_panic(expected = "Script::one_in: n must be at least 1, not 0")]
fn one_in_refuses_zero() {
    let _ = Script::new().one_in(0);
}

// ---------------------------------------------------------------------------------------------
// Hang and hold
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn hang_ends_at_the_clients_deadline() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().hang());
    let mut request = Request::new(req(0));
    request.set_timeout(500 * MS);
    let start = Instant::now();
    let status = f.client.unary(request).await.unwrap_err();
    let took = start.elapsed();
    // tonic 0.14 (client and server alike) answers a deadline that ran out with CANCELLED,
    // "Timeout expired", not DEADLINE_EXCEEDED.
    assert_eq!(status.code(), Code::Cancelled, "{status:?}");
    assert_eq!(status.message(), "Timeout expired");
    assert!(took >= 500 * MS && took < SECOND, "took {took:?}");
    until("the hung call leaves the count", || faults.in_flight() == 0).await;
    assert_eq!(f.echo.handled.load(Ordering::SeqCst), 0);
}

/// What tonic's server itself answers at a hung call's `grpc-timeout`, seen with a bare HTTP/2
/// client (tonic's client would give up at the same moment on its own).
#[tokio::test(start_paused = true)]
async fn the_server_answers_a_hang_at_its_grpc_timeout_with_cancelled() {
    let faults = Faults::new();
    let f = start(&faults).await;
    faults.set(Script::new().hang());
    let tcp = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    let (mut h2, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("http://{}{UNARY}", f.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", "300m")
        .body(())
        .unwrap();
    let start = Instant::now();
    let (response, mut body) = h2.send_request(request, false).unwrap();
    body.send_data(grpc_frame(0), true).unwrap();
    let response = response.await.unwrap();
    let took = start.elapsed();
    assert!(took >= 300 * MS && took < SECOND, "took {took:?}");
    // Trailers-only: CANCELLED, not DEADLINE_EXCEEDED.
    assert_eq!(response.headers()["grpc-status"], "1", "{response:?}");
    assert_eq!(response.headers()["grpc-message"], "Timeout%20expired");
    until("the hung call leaves the count", || faults.in_flight() == 0).await;
}

#[tokio::test(start_paused = true)]
async fn hang_at_the_end_outlives_the_deadline_until_the_client_drops_the_stream() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().hang().at(Point::AtEnd));
    let mut request = Request::new(stream_req(7, 2));
    request.set_timeout(200 * MS);
    let mut stream = f.client.server_stream(request).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 1);
    // The headers were answered: no deadline applies to the rest of the stream.
    let more = tokio::time::timeout(10 * SECOND, stream.message()).await;
    assert!(more.is_err(), "the stream ended: {more:?}");
    dropping_it_ends_the_only_call(&faults, stream).await;
}

#[tokio::test]
async fn hold_waits_for_release() {
    let faults = Faults::new();
    let f = start(&faults).await;
    faults.set(Script::new().hold());
    let calls: Vec<_> = (0..3).map(|id| spawn_unary(&f.client, id)).collect();
    until("three held calls", || faults.held() == 3).await;
    assert_eq!(f.echo.handled.load(Ordering::SeqCst), 0);

    assert_eq!(faults.release(1), 1);
    assert_eq!(faults.held(), 2);
    until("one call through", || {
        f.echo.handled.load(Ordering::SeqCst) == 1
    })
    .await;
    until("one call done", || {
        calls.iter().filter(|c| c.is_finished()).count() == 1
    })
    .await;

    assert_eq!(faults.release(3), 2, "the calls held now");
    assert_eq!(faults.held(), 0);
    for (id, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap().id, id as u64);
    }
    no_call_in_flight(&faults).await;

    // What was left of the release lets the next call go on at once; the one after waits.
    assert_eq!(spawn_unary(&f.client, 3).await.unwrap().unwrap().id, 3);
    let late = spawn_unary(&f.client, 4);
    until("a held call", || faults.held() == 1).await;
    assert!(!late.is_finished());
    faults.release(1);
    assert_eq!(late.await.unwrap().unwrap().id, 4);
}

#[tokio::test]
async fn a_release_before_the_calls_arrive_is_not_lost() {
    let faults = Faults::new();
    let f = start(&faults).await;
    faults.set(Script::new().hold());
    assert_eq!(faults.release(2), 0, "nothing held yet");
    for id in 0..2 {
        assert_eq!(spawn_unary(&f.client, id).await.unwrap().unwrap().id, id);
    }
    let third = spawn_unary(&f.client, 2);
    assert_eq!(released(&faults, third).await.unwrap().id, 2);
}

#[tokio::test]
async fn hold_then_fail_answers_the_status_on_release() {
    let faults = Faults::new();
    let f = start(&faults).await;
    faults.set(Script::new().hold().fail(Code::Aborted, "after the hold"));
    let call = spawn_unary(&f.client, 0);
    let status = released(&faults, call).await.unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Aborted, "after the hold")
    );
}

#[tokio::test]
async fn limit_refuses_the_call_beyond_n_at_once() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(
        Script::new()
            .hold()
            .limit(2, Code::ResourceExhausted)
            .trailer("grpc-retry-pushback-ms", "50"),
    );
    let calls: Vec<_> = (0..2).map(|id| spawn_unary(&f.client, id)).collect();
    until("two held calls", || faults.held() == 2).await;

    let status = unary_err(&mut f.client, 2).await;
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "fault: more than 2 calls in flight");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "50"
    );
    assert_eq!(faults.held(), 2, "the refused call was not held");

    faults.release(2);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    no_call_in_flight(&faults).await;
    // Room again: held, not refused.
    let call = spawn_unary(&f.client, 3);
    released(&faults, call).await.unwrap();
    assert_eq!(faults.calls(), 4);
}

#[tokio::test]
async fn limit_counts_the_calls_of_its_scope() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set_method(SERVER_STREAM, Script::new().hold());
    faults.set_method(UNARY, Script::new().limit(1, Code::Unavailable));
    let mut streams = Vec::new();
    for id in 0..2 {
        let mut client = f.client.clone();
        streams.push(tokio::spawn(async move {
            client
                .server_stream(Req {
                    id,
                    count: 1,
                    ..Default::default()
                })
                .await
        }));
    }
    until("two held streams", || faults.held() == 2).await;
    // The unary method's scope: only its own calls count.
    unary_ok(&mut f.client, 0).await;

    // Every method's scope: the held streams count, though their own script applies to them.
    faults.set(Script::new().limit(2, Code::Unavailable));
    let status = health_check(&mut f.health).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "fault: more than 2 calls in flight");

    faults.release(2);
    for s in streams {
        let mut s = s.await.unwrap().unwrap().into_inner();
        while s.message().await.unwrap().is_some() {}
    }
    no_call_in_flight(&faults).await;
    health_check(&mut f.health).await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Points
// ---------------------------------------------------------------------------------------------

/// `n` requests, one every 100 ms (on tokio's clock), then the end of the stream.
fn slow_requests(n: u64) -> impl Stream<Item = Req> + Send + 'static {
    futures::stream::unfold(0, move |id| async move {
        if id == n {
            return None;
        }
        if id > 0 {
            tokio::time::sleep(100 * MS).await;
        }
        Some((req(id), id + 1))
    })
}

#[tokio::test(start_paused = true)]
async fn after_request_waits_after_the_whole_input_and_the_service_reads_it_all() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set_method(
        CLIENT_STREAM,
        Script::new().delay(SECOND).at(Point::AfterRequest),
    );
    let start = Instant::now();
    let reply = f
        .client
        .client_stream(slow_requests(5))
        .await
        .unwrap()
        .into_inner();
    let took = start.elapsed();
    assert_eq!(
        (reply.seq, reply.id),
        (5, 4),
        "the service read every message"
    );
    assert_eq!(f.echo.read.load(Ordering::SeqCst), 5);
    // 400 ms of input, then the second: not overlapped as a wait before the call would be.
    assert!(took >= 1400 * MS && took < 2 * SECOND, "took {took:?}");

    // The same wait before the call overlaps with the input.
    faults.set_method(CLIENT_STREAM, Script::new().delay(SECOND));
    let start = Instant::now();
    f.client.client_stream(slow_requests(5)).await.unwrap();
    let took = start.elapsed();
    assert!(
        took >= SECOND && took < 1400 * MS,
        "took {took:?} before the call"
    );
}

#[tokio::test(start_paused = true)]
async fn after_request_status_comes_after_the_input_without_calling_the_service() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(
        Script::new()
            .fail(Code::Unavailable, "read it, refused it")
            .at(Point::AfterRequest),
    );
    let start = Instant::now();
    let status = f.client.client_stream(slow_requests(3)).await.unwrap_err();
    let took = start.elapsed();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), "read it, refused it");
    assert!(
        took >= 200 * MS,
        "answered after {took:?}, before the input ended"
    );
    assert_eq!(f.echo.handled.load(Ordering::SeqCst), 0);

    // Bidi too: the whole input, then the status.
    let mut replies = f
        .client
        .bidi(slow_requests(3))
        .await
        .map(Response::into_inner);
    let status = match &mut replies {
        Ok(stream) => stream.message().await.unwrap_err(),
        Err(status) => status.clone(),
    };
    assert_eq!(status.code(), Code::Unavailable);
}

#[tokio::test(start_paused = true)]
async fn at_end_the_status_follows_every_message() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(
        Script::new()
            .fail(Code::Internal, "stream broke")
            .delay(SECOND)
            .at(Point::AtEnd),
    );
    let start = Instant::now();
    let mut stream = read_stream(&mut f.client, 3, 4).await;
    assert!(start.elapsed() < SECOND, "the messages waited");
    let status = stream.message().await.unwrap_err();
    assert!(start.elapsed() >= SECOND, "the trailers did not wait");
    assert_eq!(
        (status.code(), status.message()),
        (Code::Internal, "stream broke")
    );
    assert_eq!(f.echo.handled.load(Ordering::SeqCst), 1);

    // A unary call's message comes, then the status: the call fails.
    let status = unary_err(&mut f.client, 0).await;
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(f.echo.handled.load(Ordering::SeqCst), 2);
    no_call_in_flight(&faults).await;
}

#[tokio::test(start_paused = true)]
async fn at_end_replaces_the_status_of_a_trailers_only_answer() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    // The health service answers NOT_FOUND (trailers-only) for a service it does not know.
    faults.set_method(
        HEALTH_CHECK,
        Script::new()
            .fail(Code::DataLoss, "replaced")
            .at(Point::AtEnd),
    );
    let status = f
        .health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::DataLoss, "replaced")
    );

    // A wait alone keeps the service's own status, later.
    faults.set_method(HEALTH_CHECK, Script::new().delay(SECOND).at(Point::AtEnd));
    let start = Instant::now();
    let status = f
        .health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(start.elapsed() >= SECOND);
}

#[tokio::test(start_paused = true)]
async fn at_end_hold_keeps_the_stream_open_after_its_messages_until_released() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().hold().at(Point::AtEnd));
    let mut stream = read_stream(&mut f.client, 9, 3).await;
    until("the stream held at its end", || faults.held() == 1).await;
    assert_eq!(faults.in_flight(), 1);
    let more = tokio::time::timeout(10 * SECOND, stream.message()).await;
    assert!(more.is_err(), "the held stream ended: {more:?}");
    assert_eq!(faults.release(1), 1);
    assert!(
        stream.message().await.unwrap().is_none(),
        "the stream ends cleanly"
    );
    no_call_in_flight(&faults).await;
}

// ---------------------------------------------------------------------------------------------
// Scopes, counts, clear
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn set_method_scopes_and_the_most_specific_wins() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    let stream = |c: &mut FleetClient<Channel>| {
        let mut c = c.clone();
        async move { c.server_stream(stream_req(0, 1)).await.map(drop) }
    };

    faults.set_method(UNARY, Script::new().fail(Code::Unavailable, "method"));
    assert_eq!(unary_err(&mut f.client, 0).await.message(), "method");
    stream(&mut f.client).await.unwrap();
    health_check(&mut f.health).await.unwrap();

    faults.set_method(SERVICE, Script::new().fail(Code::Aborted, "service"));
    assert_eq!(unary_err(&mut f.client, 0).await.message(), "method");
    assert_eq!(
        stream(&mut f.client).await.unwrap_err().message(),
        "service"
    );
    health_check(&mut f.health).await.unwrap();

    faults.set(Script::new().fail(Code::DataLoss, "all"));
    assert_eq!(unary_err(&mut f.client, 0).await.message(), "method");
    assert_eq!(
        stream(&mut f.client).await.unwrap_err().message(),
        "service"
    );
    assert_eq!(
        health_check(&mut f.health).await.unwrap_err().message(),
        "all"
    );

    // No fault for one method, against its service's script.
    faults.set_method(UNARY, Script::new());
    unary_ok(&mut f.client, 1).await;
    assert_eq!(
        stream(&mut f.client).await.unwrap_err().message(),
        "service"
    );

    faults.clear();
    unary_ok(&mut f.client, 2).await;
    stream(&mut f.client).await.unwrap();
    health_check(&mut f.health).await.unwrap();
}

#[test]
fn set_method_refuses_other_paths_naming_them() {
    let faults = Faults::new();
    for path in ["Unary", "", "/", "//Unary", "/fleet.v1.Fleet", "/a/b/c"] {
        let refused = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            faults.set_method(path, Script::new())
        }))
        .expect_err(path);
        let message = refused.downcast_ref::<String>().unwrap();
        assert!(
            message.contains(&format!("{path:?} is neither")),
            "{message}"
        );
    }
}

#[tokio::test]
async fn counts_every_call_per_method_with_peaks_and_releases_cancelled_calls() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    assert_eq!(faults.method(UNARY), MethodCount::default());
    for id in 0..3 {
        unary_ok(&mut f.client, id).await;
    }
    let mut stream = read_stream(&mut f.client, 0, 2).await;
    assert!(stream.message().await.unwrap().is_none(), "two messages");
    no_call_in_flight(&faults).await;
    assert_eq!(faults.calls(), 4);
    assert_eq!(
        faults.methods(),
        vec![
            (
                SERVER_STREAM.to_owned(),
                MethodCount {
                    calls: 1,
                    in_flight: 0,
                    peak_in_flight: 1
                }
            ),
            (
                UNARY.to_owned(),
                MethodCount {
                    calls: 3,
                    in_flight: 0,
                    peak_in_flight: 1
                }
            ),
        ]
    );

    // Three held at once; one cancelled by its client.
    faults.set_method(UNARY, Script::new().hold());
    let calls: Vec<_> = (0..3).map(|id| spawn_unary(&f.client, id)).collect();
    until("three held calls", || faults.held() == 3).await;
    assert_eq!(faults.in_flight(), 3);
    assert_eq!(faults.peak_in_flight(), 3);
    assert_eq!(
        faults.method(UNARY),
        MethodCount {
            calls: 6,
            in_flight: 3,
            peak_in_flight: 3
        }
    );
    calls[0].abort();
    until("the cancelled call leaves the counts", || {
        faults.in_flight() == 2 && faults.held() == 2
    })
    .await;
    assert_eq!(faults.method(UNARY).in_flight, 2);

    // Counts reset: the calls in flight stay counted.
    faults.reset_counts();
    assert_eq!(faults.calls(), 0);
    assert_eq!(faults.peak_in_flight(), 2);
    assert_eq!(
        faults.methods(),
        vec![(
            UNARY.to_owned(),
            MethodCount {
                calls: 0,
                in_flight: 2,
                peak_in_flight: 2
            }
        )]
    );
    assert_eq!(faults.release(usize::MAX), 2);
    for call in calls.into_iter().skip(1) {
        call.await.unwrap().unwrap();
    }
    no_call_in_flight(&faults).await;
    assert_eq!(
        faults.method(UNARY),
        MethodCount {
            calls: 0,
            in_flight: 0,
            peak_in_flight: 2
        }
    );
    faults.reset_counts();
    assert!(faults.methods().is_empty());
    assert_eq!(faults.peak_in_flight(), 0);
}

#[tokio::test]
async fn a_stream_dropped_half_read_leaves_the_counts() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    let mut stream = f
        .client
        .server_stream(Req {
            id: 0,
            count: u32::MAX,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    stream.message().await.unwrap().unwrap();
    dropping_it_ends_the_only_call(&faults, stream).await;
}

#[tokio::test]
async fn clear_ends_every_fault_for_new_calls_but_held_calls_stay_held() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set(Script::new().fail(Code::Unavailable, "down"));
    faults.set_method(UNARY, Script::new().hold());
    let held = spawn_unary(&f.client, 0);
    until("a held call", || faults.held() == 1).await;
    health_check(&mut f.health).await.unwrap_err();

    faults.clear();
    health_check(&mut f.health).await.unwrap();
    unary_ok(&mut f.client, 1).await;
    assert_eq!(faults.held(), 1);
    faults.release(1);
    held.await.unwrap().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Composition
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn layers_stack_with_service_builder_inside_a_server() {
    let outer = Faults::new();
    let inner = Faults::new();
    let layers = tower::ServiceBuilder::new()
        .layer(outer.layer())
        .layer(inner.layer())
        .into_inner();
    let mut f = serve!(layers);
    inner.set_method(UNARY, Script::new().fail(Code::Unavailable, "inner"));
    assert_eq!(unary_err(&mut f.client, 0).await.message(), "inner");
    outer.set_method(UNARY, Script::new().fail(Code::Aborted, "outer"));
    assert_eq!(unary_err(&mut f.client, 1).await.message(), "outer");
    assert_eq!((outer.calls(), inner.calls()), (2, 1));
}

/// One request body frame.
struct Once(Option<Bytes>);

impl http_body::Body for Once {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.take().map(|b| Ok(Frame::data(b))))
    }
}

/// A `Req` with this id as a gRPC message: uncompressed, length-prefixed.
fn grpc_frame(id: u64) -> Bytes {
    let message = req(id).encode_to_vec();
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.extend_from_slice(&[0]);
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    frame.freeze()
}

/// A gRPC unary request for `Unary`, framed by hand.
fn grpc_request(id: u64) -> http::Request<Once> {
    http::Request::post(format!("http://localhost{UNARY}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Once(Some(grpc_frame(id))))
        .unwrap()
}

#[tokio::test]
async fn wraps_routes_as_a_plain_tower_layer() {
    let faults = Faults::new();
    let routes = tonic::service::Routes::new(FleetServer::new(Echo::default()));
    let svc = tower::ServiceBuilder::new()
        .layer(faults.layer())
        .service(routes);

    // No fault: the service's answer, its body wrapped.
    let response = svc.clone().oneshot(grpc_request(5)).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    let mut body = std::pin::pin!(response.into_body());
    let mut data = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        match frame.unwrap().into_data() {
            Ok(d) => data.extend_from_slice(&d),
            Err(frame) => trailers = frame.into_trailers().ok(),
        }
    }
    assert_eq!(Reply::decode(&data[5..]).unwrap().id, 5);
    assert_eq!(trailers.unwrap()["grpc-status"], "0");
    assert_eq!(faults.in_flight(), 0, "the ended body left the count");

    // A status: trailers-only.
    faults.set(Script::new().fail(Code::PermissionDenied, "no"));
    let response = svc.oneshot(grpc_request(6)).await.unwrap();
    assert_eq!(response.headers()["grpc-status"], "7");
    assert_eq!(response.headers()["grpc-message"], "no");
    assert!(response.body().is_end_stream());
    drop(response);
    assert_eq!((faults.calls(), faults.in_flight()), (2, 0));
}

/// A method or service named as the balancer's policies name it (no leading slash) scripts the
/// same calls as the request's path does.
#[tokio::test]
async fn a_method_is_named_with_or_without_its_leading_slash() {
    let faults = Faults::new();
    let mut f = start(&faults).await;
    faults.set_method(
        "fleet.v1.Fleet/Unary",
        Script::new().fail(Code::Aborted, "by name"),
    );
    let s = f.client.unary(Req::default()).await.unwrap_err();
    assert_eq!((s.code(), s.message()), (Code::Aborted, "by name"));
    faults.clear();
    faults.set_method(
        "fleet.v1.Fleet/",
        Script::new().fail(Code::Aborted, "by service"),
    );
    let s = f.client.unary(Req::default()).await.unwrap_err();
    assert_eq!(s.message(), "by service");
    // The exemption of the method, in the request's form, still wins over its service's.
    faults.set_method("/fleet.v1.Fleet/Unary", Script::new());
    f.client.unary(Req::default()).await.unwrap();
}
