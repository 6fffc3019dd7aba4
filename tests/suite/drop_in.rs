//! The drop-in claims: `BalancedChannel` goes wherever a `tonic::transport::Channel` goes.
//! Generated stubs with an interceptor, tower middleware around the channel (a timeout, a
//! concurrency limit, a buffer), and `tonic::client::Grpc` used directly.

use fleet_service as fleet;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::pb::fleet_server::{Fleet as FleetService, FleetServer};
use fleet::pb::{Reply, Req};
use fleet::{total_in_flight, wait_until, Behavior, Fleet};
use tonic::metadata::MetadataValue;
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_balancer::BalancedChannel;
use tower::{BoxError, ServiceBuilder};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(30);

use fleet::req;

// ---------------------------------------------------------------------------------------------
// 1. The bounds a drop-in replacement must meet, checked by the compiler.

fn assert_bounds<T: Clone + Send + Sync + 'static>() {}
fn assert_send_static<T: Send + 'static>() {}
fn assert_grpc_service<T: tonic::client::GrpcService<tonic::body::Body>>() {}

#[test]
fn the_channel_has_the_bounds_of_a_tonic_channel() {
    assert_bounds::<BalancedChannel>();
    assert_bounds::<tonic::transport::Channel>();
    assert_send_static::<tonic_balancer::ResponseFuture>();
    assert_send_static::<
        <BalancedChannel as tower::Service<http::Request<tonic::body::Body>>>::Future,
    >();
    assert_grpc_service::<BalancedChannel>();
    assert_bounds::<FleetClient<BalancedChannel>>();
}

// ---------------------------------------------------------------------------------------------
// A server of our own that records the `x-token` metadata of each unary call.

#[derive(Clone)]
struct TokenSvc {
    name: String,
    /// The `x-token` of each call that reached the handler (None: the call had none).
    tokens: Arc<Mutex<Vec<Option<String>>>>,
}

impl TokenSvc {
    fn calls(&self) -> usize {
        self.tokens.lock().unwrap().len()
    }
}

#[tonic::async_trait]
impl FleetService for TokenSvc {
    async fn unary(&self, req: Request<Req>) -> Result<Response<Reply>, Status> {
        let token = req
            .metadata()
            .get("x-token")
            .map(|v| v.to_str().expect("ASCII token").to_owned());
        self.tokens.lock().unwrap().push(token);
        let req = req.into_inner();
        Ok(Response::new(Reply {
            instance: self.name.clone(),
            id: req.id,
            seq: 0,
            payload: req.payload,
        }))
    }

    type ServerStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<Reply, Status>> + Send>>;

    async fn server_stream(
        &self,
        _req: Request<Req>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        Err(Status::unimplemented("server_stream"))
    }

    async fn client_stream(
        &self,
        _req: Request<Streaming<Req>>,
    ) -> Result<Response<Reply>, Status> {
        Err(Status::unimplemented("client_stream"))
    }

    type BidiStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<Reply, Status>> + Send>>;

    async fn bidi(
        &self,
        _req: Request<Streaming<Req>>,
    ) -> Result<Response<Self::BidiStream>, Status> {
        Err(Status::unimplemented("bidi"))
    }
}

/// Serves a `TokenSvc` on a free port of 127.0.0.1, on the test's runtime. Returns it and its
/// `http://` URI.
async fn token_server(name: &str) -> (TokenSvc, String) {
    let svc = TokenSvc {
        name: name.to_owned(),
        tokens: Arc::default(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(FleetServer::new(svc.clone()))
        .serve_with_incoming(incoming);
    tokio::spawn(async move {
        server.await.expect("token server");
    });
    (svc, format!("http://{addr}"))
}

// ---------------------------------------------------------------------------------------------
// 2. Generated stubs with an interceptor.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interceptors_metadata_reaches_the_servers() {
    let (a, uri_a) = token_server("a").await;
    let (b, uri_b) = token_server("b").await;
    let ch = BalancedChannel::from_static([&uri_a, &uri_b]).unwrap();
    let n = AtomicU64::new(0);
    let mut client = FleetClient::with_interceptor(ch.clone(), move |mut req: Request<()>| {
        // A token of its own for each call, to see each call's arrive exactly once.
        let token = format!("tok-{}", n.fetch_add(1, Ordering::SeqCst));
        req.metadata_mut()
            .insert("x-token", MetadataValue::try_from(token).unwrap());
        Ok(req)
    });

    const CALLS: u64 = 60;
    let mut names = BTreeSet::new();
    for id in 0..CALLS {
        let reply = tokio::time::timeout(LIMIT, client.unary(req(id)))
            .await
            .expect("call timed out")
            .unwrap_or_else(|e| panic!("call {id} failed: {e:?}"))
            .into_inner();
        assert_eq!(reply.id, id, "the reply of another call");
        names.insert(reply.instance);
    }

    let mut seen: Vec<String> = Vec::new();
    for svc in [&a, &b] {
        for t in svc.tokens.lock().unwrap().iter() {
            seen.push(
                t.clone()
                    .expect("a call reached the server without its x-token"),
            );
        }
    }
    seen.sort();
    let mut sent: Vec<String> = (0..CALLS).map(|i| format!("tok-{i}")).collect();
    sent.sort();
    assert_eq!(
        seen, sent,
        "each call's token reached a server exactly once"
    );
    assert!(
        a.calls() > 0 && b.calls() > 0,
        "both instances served calls: a {}, b {}",
        a.calls(),
        b.calls()
    );
    assert_eq!(names.len(), 2, "replies came from {names:?}");
    assert_eq!(total_in_flight(&ch), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interceptor_that_refuses_sends_nothing() {
    let (a, uri_a) = token_server("a").await;
    let (b, uri_b) = token_server("b").await;
    let ch = BalancedChannel::from_static([&uri_a, &uri_b]).unwrap();
    let mut client = FleetClient::with_interceptor(ch.clone(), |_req: Request<()>| {
        Err(Status::unauthenticated("no token for you"))
    });

    for id in 0..10 {
        let err = tokio::time::timeout(LIMIT, client.unary(req(id)))
            .await
            .expect("call timed out")
            .expect_err("the interceptor refused the call");
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        assert_eq!(err.message(), "no token for you");
    }

    // The refusal is decided before the channel is called: nothing routed, nothing counted.
    assert_eq!(a.calls() + b.calls(), 0, "a refused call reached a server");
    assert_eq!(total_in_flight(&ch), 0);
    let started: u64 = ch.endpoints().iter().map(|e| e.started()).sum();
    assert_eq!(started, 0, "the channel routed a refused call");

    // The same channel still serves a stub without the interceptor.
    let mut plain = FleetClient::new(ch.clone());
    let reply = tokio::time::timeout(LIMIT, plain.unary(req(99)))
        .await
        .expect("call timed out")
        .unwrap()
        .into_inner();
    assert_eq!(reply.id, 99);
    assert_eq!(a.calls() + b.calls(), 1);
}

// ---------------------------------------------------------------------------------------------
// 3. Under tower middleware.

/// (a) A timeout around the channel. tower's `timeout` feature is not enabled for the tests,
/// so the timeout is `ServiceBuilder::map_future` over `tokio::time::timeout`, which does what
/// tower's `Timeout` does: drops the channel's future when the time is up. Its error is
/// tonic's `TimeoutExpired`, as with `Endpoint::timeout` on a tonic `Channel`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_ends_a_held_call_and_releases_its_count() {
    let fleet = Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    const TIMEOUT: Duration = Duration::from_secs(1);
    let svc = ServiceBuilder::new()
        .map_future(|fut: tonic_balancer::ResponseFuture| async move {
            match tokio::time::timeout(TIMEOUT, fut).await {
                Ok(r) => r,
                Err(_) => Err(BoxError::from(tonic::TimeoutExpired(()))),
            }
        })
        .service(ch.clone());
    let mut client = FleetClient::new(svc);
    // A first call opens the connection, so that the held call reaches the instance well
    // within the timeout.
    let reply = tokio::time::timeout(LIMIT, client.unary(req(0)))
        .await
        .expect("call timed out")
        .unwrap()
        .into_inner();
    assert_eq!(reply.id, 0);
    fleet.instances[0].set(Behavior::Hold);

    let start = Instant::now();
    let err = tokio::time::timeout(LIMIT, client.unary(req(1)))
        .await
        .expect("the timeout layer did not end the call")
        .expect_err("the call was held: only the timeout ends it");
    let took = start.elapsed();
    assert_eq!(err.code(), Code::Cancelled, "{err:?}");
    assert!(took >= TIMEOUT, "ended after {took:?}, before the timeout");
    // The call did reach the instance (it was held there, not refused on the way).
    assert_eq!(fleet.instances[0].served(), 2);

    // The dropped call released its count, and the server saw the call go (stream reset).
    wait_until("the dropped call's count released", LIMIT, || {
        total_in_flight(&ch) == 0
    })
    .await;
    wait_until("the server's held call cancelled", LIMIT, || {
        fleet.held() == 0
    })
    .await;
    // A caller that gives up is not the instance's failure.
    let stats = &ch.endpoints()[0];
    assert_eq!(stats.started(), 2);
    assert_eq!(
        stats.failed(),
        0,
        "the caller's timeout counted against the instance"
    );

    // The channel and the instance go on: a call that is not held succeeds.
    fleet.instances[0].set(Behavior::Ok);
    let reply = tokio::time::timeout(LIMIT, client.unary(req(2)))
        .await
        .expect("call timed out")
        .unwrap()
        .into_inner();
    assert_eq!(reply.id, 2);
    assert_eq!(total_in_flight(&ch), 0);
}

/// (b) A concurrency limit of 2 around the channel, shared by the clones of the stub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_bounds_the_calls_in_flight() {
    let fleet = Fleet::start(3, Behavior::Hold);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let svc = ServiceBuilder::new()
        .concurrency_limit(2)
        .service(ch.clone());
    let client = FleetClient::new(svc);

    const CALLS: usize = 10;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for id in 0..CALLS as u64 {
        let mut client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let reply = client.unary(req(id)).await;
            done.fetch_add(1, Ordering::SeqCst);
            let reply = reply.unwrap_or_else(|e| panic!("call {id} failed: {e:?}"));
            assert_eq!(reply.into_inner().id, id, "the reply of another call");
        }));
    }

    // Let the held calls go one at a time, checking all along that no more than 2 are held
    // at the servers. The channel may count one more: the limit's permit goes back when the
    // response's headers arrive, the channel's count when its body is over, so the next call
    // can be routed while the one released last reads its reply.
    let mut max_held = 0;
    let sample = |max_held: &mut usize| {
        let held = fleet.held();
        let in_flight = total_in_flight(&ch);
        assert!(held <= 2, "{held} calls held at once under a limit of 2");
        assert!(
            in_flight <= 3,
            "{in_flight} calls in flight under a limit of 2"
        );
        *max_held = (*max_held).max(held);
    };
    while done.load(Ordering::SeqCst) < CALLS {
        // As many held as the limit allows (fewer at the end).
        wait_until("the limit's worth of calls held", LIMIT, || {
            sample(&mut max_held);
            fleet.held() >= 2.min(CALLS - done.load(Ordering::SeqCst))
        })
        .await;
        let before = done.load(Ordering::SeqCst);
        if before == CALLS {
            break;
        }
        let holder = fleet
            .instances
            .iter()
            .find(|i| i.held() > 0)
            .expect("a held call");
        holder.release(1);
        wait_until("the released call done", LIMIT, || {
            sample(&mut max_held);
            done.load(Ordering::SeqCst) > before
        })
        .await;
    }
    for t in tasks {
        tokio::time::timeout(LIMIT, t)
            .await
            .expect("call timed out")
            .expect("call task panicked");
    }
    assert_eq!(max_held, 2, "the limit let 2 calls run together");
    assert_eq!(fleet.served().iter().sum::<u64>(), CALLS as u64);
    assert_eq!(fleet.held(), 0);
    wait_until("no call in flight", LIMIT, || total_in_flight(&ch) == 0).await;
}

/// (c) A buffer in front of the channel: one worker task calls the channel, the stubs share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_in_front_of_the_channel_serves_concurrent_callers() {
    let fleet = Fleet::start(3, Behavior::Delay(Duration::from_millis(30)));
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let svc = ServiceBuilder::new().buffer(16).service(ch.clone());
    let client = FleetClient::new(svc);

    const CALLS: u64 = 50;
    let mut tasks = Vec::new();
    for id in 0..CALLS {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let reply = client
                .unary(req(id))
                .await
                .unwrap_or_else(|e| panic!("call {id} failed: {e:?}"))
                .into_inner();
            assert_eq!(reply.id, id, "the reply of another call");
            reply.instance
        }));
    }
    let mut names = BTreeSet::new();
    for t in tasks {
        let name = tokio::time::timeout(LIMIT, t)
            .await
            .expect("call timed out")
            .expect("call task panicked");
        names.insert(name);
    }
    let served = fleet.served();
    assert_eq!(served.iter().sum::<u64>(), CALLS, "{served:?}");
    assert!(served.iter().all(|&n| n > 0), "not spread: {served:?}");
    assert_eq!(names.len(), 3, "{names:?}");
    wait_until("no call in flight", LIMIT, || total_in_flight(&ch) == 0).await;
}

// ---------------------------------------------------------------------------------------------
// 5. `tonic::client::Grpc` directly, as hand-written clients use it.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_channel_works_under_tonic_client_grpc() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    for id in 0..20 {
        tokio::time::timeout(LIMIT, grpc.ready())
            .await
            .expect("never ready")
            .expect("ready");
        let codec: tonic_prost::ProstCodec<Req, Reply> = tonic_prost::ProstCodec::default();
        let path = http::uri::PathAndQuery::from_static("/fleet.v1.Fleet/Unary");
        let mut request = Request::new(Req {
            id,
            payload: b"hand-written".to_vec(),
            ..Default::default()
        });
        // As generated code does: the method's name for interceptors and tracing.
        request
            .extensions_mut()
            .insert(tonic::GrpcMethod::new("fleet.v1.Fleet", "Unary"));
        let reply = tokio::time::timeout(LIMIT, grpc.unary(request, path, codec))
            .await
            .expect("call timed out")
            .unwrap_or_else(|e| panic!("call {id} failed: {e:?}"))
            .into_inner();
        assert_eq!(reply.id, id);
        assert_eq!(reply.payload, b"hand-written");
    }
    let served = fleet.served();
    assert_eq!(served.iter().sum::<u64>(), 20, "{served:?}");
    assert_eq!(total_in_flight(&ch), 0);
}

/// Callers that give up on their own side (a `tokio::time::timeout`, a tower timeout) rather
/// than with a deadline: the channel sees only dropped calls. A hanging instance must still
/// lose the calls: each call it held unanswered for long is a latency sample of at least that
/// long, so it stops winning ties (without counting the caller's cancellations as failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_side_timeouts_steer_calls_off_a_hanging_instance() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    // Warm up: both instances answer fast, so both have fast estimates.
    fleet::calls(&mut client, 20).await;
    fleet.instances[1].set(Behavior::Hang);
    let before = fleet.instances[1].served();
    let mut timed_out = 0;
    // A call given up after 10 ms or more is a sample of at least that long: the caller's limit
    // far above the usual answer even on a loaded machine, where the warm-up's answers are
    // slow too.
    let usual = ch
        .endpoints()
        .iter()
        .filter_map(|e| e.latency())
        .max()
        .unwrap_or_default();
    let limit = (usual * 20).max(Duration::from_millis(200));
    for id in 0..30 {
        match tokio::time::timeout(limit, client.unary(req(id))).await {
            Ok(reply) => assert_eq!(reply.unwrap().into_inner().instance, "i0"),
            Err(_) => timed_out += 1,
        }
    }
    let to_hanging = fleet.instances[1].served() - before;
    assert_eq!(
        to_hanging, timed_out,
        "every call to the hanging one timed out"
    );
    // Without the sample, 23 of 30 (the hanging one keeps winning ties); with it, the few
    // that it takes for its estimate to rise past the other's, and the tie-break's re-checks:
    // 1 to 8 beside a second full suite run, and once 12 (the same before and after the call
    // path became one machine, measured interleaved).
    assert!(
        to_hanging <= 15,
        "{to_hanging} of 30 calls went to the hanging instance"
    );
    let stats = ch.endpoints();
    assert!(
        stats.iter().all(|e| e.failed() == 0),
        "cancellations are not failures: {stats:?}"
    );
    fleet::wait_until("counts back to 0", Duration::from_secs(10), || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
}
