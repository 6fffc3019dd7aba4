//! Edge cases at the borders of the channel: connections a server rotates, deadlines shorter
//! than the service time, ejections raced by membership changes, the `grpc-timeout` of a call
//! sent again, transparent retry turned off, a discovery source that never answers, answers
//! without a gRPC status, and calls made from another executor.
use fleet_service as fleet;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use fleet::pb::fleet_server::{Fleet as FleetService, FleetServer};
use fleet::pb::{fleet_client::FleetClient, Reply, Req};
use fleet::{Behavior, Fleet, Instance, ServerOptions};
use tonic::{Code, Request, Response, Status, Streaming};
use tonic_balancer::{BalancedChannel, Ejection, Resolve, RetryPolicy, State, Strategy};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(20);

type Client = FleetClient<BalancedChannel>;

use fleet::req;

/// A request with a deadline (`grpc-timeout`).
fn with_timeout(id: u64, timeout: Duration) -> Request<Req> {
    let mut r = Request::new(req(id));
    r.set_timeout(timeout);
    r
}

use fleet::{dump, stats};

/// The value of a `grpc-timeout` header (digits and a unit), as the gRPC spec writes it.
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Serves `routes` on a free port of 127.0.0.1 from the test's runtime, with TCP_NODELAY as
/// the fleet does (without it a second response on a connection waits for a delayed ACK).
async fn serve(routes: tonic::service::Routes) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(incoming),
    );
    addr
}

// ---------------------------------------------------------------------------------------------
// 6. A server that rotates its connections (GOAWAY at a maximum connection age).

/// Sends unary calls from `tasks` tasks for `run`; returns how many calls ended each way ("OK",
/// or the code and message).
async fn hammer(ch: &BalancedChannel, tasks: u64, run: Duration) -> BTreeMap<String, u64> {
    let client = FleetClient::new(ch.clone());
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let mut out: BTreeMap<String, u64> = BTreeMap::new();
                let mut i = 0;
                while start.elapsed() < run {
                    let r = tokio::time::timeout(LIMIT, client.unary(req(t * 1_000_000 + i)))
                        .await
                        .expect("a call ended");
                    i += 1;
                    let k = match r {
                        Ok(_) => "OK".to_owned(),
                        Err(s) => format!("{:?}: {}", s.code(), s.message()),
                    };
                    *out.entry(k).or_default() += 1;
                }
                out
            })
        })
        .collect();
    let mut all = BTreeMap::new();
    for h in handles {
        for (k, v) in h.await.unwrap() {
            *all.entry(k).or_default() += v;
        }
    }
    all
}

/// A call that never left (hyper fails the calls queued on a connection that the server closes
/// with GOAWAY, "connection closed", before they were written) must not reach the caller as
/// CANCELLED, nor count against the instance: it goes out on a fresh connection, or at worst
/// ends UNAVAILABLE. Servers rotating their connections every 20 ms under 32 tasks, with one
/// instance and with two; neither may be ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_on_a_rotated_connection_are_never_cancelled() {
    let mut problems = Vec::new();
    for n in [1, 2] {
        let instances: Vec<Instance> = (0..n)
            .map(|i| {
                Instance::start_with(
                    &format!("r{i}"),
                    "127.0.0.1:0".parse().unwrap(),
                    Behavior::Ok,
                    ServerOptions {
                        max_connection_age: Some(Duration::from_millis(20)),
                        ..Default::default()
                    },
                )
            })
            .collect();
        let uris: Vec<String> = instances.iter().map(Instance::uri).collect();
        let ch = BalancedChannel::from_static(&uris).unwrap();
        let outcomes = hammer(&ch, 32, Duration::from_millis(1500)).await;
        let cancelled: Vec<_> = outcomes
            .iter()
            .filter(|(k, _)| k.starts_with("Cancelled"))
            .collect();
        if !cancelled.is_empty() {
            problems.push(format!(
                "{n} instance(s): calls ended CANCELLED: {cancelled:?} (all: {outcomes:?})"
            ));
        }
        for e in ch.endpoints() {
            if e.ejections() > 0 || e.state() == State::Ejected {
                problems.push(format!(
                    "{n} instance(s): {} was ejected (calls: {outcomes:?}){}",
                    e.uri(),
                    dump(&ch)
                ));
            }
        }
        for k in outcomes.keys() {
            if !(k == "OK" || k.starts_with("Unavailable") || k.starts_with("Cancelled")) {
                problems.push(format!("{n} instance(s): unexpected outcome {k}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// 7. Deadlines: the caller's own, or the instance's fault.

fn no_success_rate(consecutive_failures: u32) -> Ejection {
    Ejection::default()
        .consecutive_failures(consecutive_failures)
        .interval(None)
}

/// `n` instances whose latency estimates the channel has near 1 ms, then that take `delay` to
/// answer; a channel that ejects after 5 failures in a row; a client.
async fn sleeping(
    n: usize,
    delay: Duration,
) -> (Fleet, BalancedChannel, FleetClient<BalancedChannel>) {
    let fleet = Fleet::start(n, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .ejection(no_success_rate(5))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 20).await;
    for i in &fleet.instances {
        i.set(Behavior::Delay(delay));
    }
    (fleet, ch, client)
}

/// Call `id`, with a 1 ms deadline, ended DEADLINE_EXCEEDED.
fn deadline_exceeded(id: u64, r: Result<Response<Reply>, Status>) {
    match r {
        Err(s) => assert_eq!(s.code(), Code::DeadlineExceeded, "call {id}: {s:?}"),
        Ok(reply) => panic!("call {id} answered within 1 ms: {reply:?}"),
    }
}

/// A caller's own deadline must not eject a healthy instance (gRPC's interop case
/// timeout_on_sleeping_server): 30 calls with a 1 ms deadline on instances that take 200 ms
/// each end DEADLINE_EXCEEDED, and neither instance is ejected (5 in a row would eject one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_deadlines_on_a_sleeping_server_eject_nothing() {
    let (fleet, ch, mut client) = sleeping(2, Duration::from_millis(200)).await;
    for id in 0..30 {
        let r = tokio::time::timeout(
            LIMIT,
            client.unary(with_timeout(id, Duration::from_millis(1))),
        )
        .await
        .expect("a call with a 1 ms deadline ended");
        deadline_exceeded(id, r);
    }
    for i in &fleet.instances {
        i.set(Behavior::Ok);
    }
    for e in ch.endpoints() {
        assert!(
            e.ejections() == 0 && e.state() != State::Ejected,
            "a caller's 1 ms deadlines ejected {}:{}",
            e.uri(),
            dump(&ch)
        );
    }
    fleet::calls(&mut client, 10).await;
}

/// A deadline whose timer fires late (the client's runtime was busy) holds the instance to the
/// deadline, not to when the timer fired: five calls with a 1 ms deadline, each seen 100 ms
/// late because the runtime's only thread was blocked, count nothing against a healthy
/// instance (counted against it, 5 in a row would eject it).
#[tokio::test(flavor = "current_thread")]
async fn a_deadline_seen_late_counts_nothing_against_the_instance() {
    let (_fleet, ch, client) = sleeping(1, Duration::from_millis(500)).await;
    for id in 0..5 {
        let mut c = client.clone();
        let call =
            tokio::spawn(async move { c.unary(with_timeout(id, Duration::from_millis(1))).await });
        fleet::wait_until("the call is on the instance", LIMIT, || {
            ch.endpoints()[0].in_flight() == 1
        })
        .await;
        // A busy runtime: its only thread does something else for 100 ms, and the deadline's
        // timer cannot fire meanwhile.
        std::thread::sleep(Duration::from_millis(100));
        let r = tokio::time::timeout(LIMIT, call)
            .await
            .expect("the call ended")
            .expect("the call's task");
        deadline_exceeded(id, r);
    }
    let e = &ch.endpoints()[0];
    assert_eq!(
        (e.failed(), e.ejections(), e.state()),
        (0, 0, State::Ready),
        "late deadlines counted against {}:{}",
        e.uri(),
        dump(&ch)
    );
}

/// The other side of the rule above: an instance that hangs is still ejected by deadlines.
/// After fast calls, one instance of two hangs; calls with a 300 ms deadline eject it after 5
/// of them went to it, while the other answers every call. Round robin, so that the calls keep
/// going to it whatever its latency estimate says (this is about the deadline rule, not the
/// pick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_on_a_hanging_instance_still_eject_it() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::builder()
        .strategy(tonic_balancer::Strategy::RoundRobin)
        .uris(fleet.uris())
        .ejection(no_success_rate(5))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 20).await;
    let hung = &fleet.instances[0];
    hung.set(Behavior::Hang);
    let before = stats(&ch, &hung.uri()).started();
    let start = Instant::now();
    let mut id = 0;
    while stats(&ch, &hung.uri()).state() != State::Ejected {
        assert!(
            start.elapsed() < LIMIT && id < 200,
            "the hanging instance was not ejected after {id} calls:{}",
            dump(&ch)
        );
        let r = tokio::time::timeout(
            LIMIT,
            client.unary(with_timeout(id, Duration::from_millis(300))),
        )
        .await
        .expect("a call with a 300 ms deadline ended");
        match r {
            Ok(reply) => assert_eq!(reply.get_ref().instance, fleet.instances[1].name()),
            Err(s) => assert_eq!(s.code(), Code::DeadlineExceeded, "call {id}: {s:?}"),
        }
        id += 1;
    }
    let s = stats(&ch, &hung.uri());
    assert_eq!(
        s.started() - before,
        5,
        "ejected after a number of deadlines other than 5:{}",
        dump(&ch)
    );
    assert_eq!(s.ejections(), 1);
}

// ---------------------------------------------------------------------------------------------
// 8a. The count of ejected instances when ejected instances leave and come back.

/// The URIs of the instances that are ejected in both of two snapshots taken one after the
/// other, with the same ejection count in both: ejected throughout, so that two of them were
/// ejected at the same moment (an instance readmitted between the snapshots as another is
/// ejected is not counted twice).
fn ejected_throughout(ch: &BalancedChannel) -> Vec<String> {
    let a = ch.endpoints();
    let b = ch.endpoints();
    a.iter()
        .filter(|x| {
            x.state() == State::Ejected
                && b.iter().any(|y| {
                    y.uri() == x.uri()
                        && y.state() == State::Ejected
                        && y.ejections() == x.ejections()
                })
        })
        .map(|x| x.uri().to_owned())
        .collect()
}

/// The count of ejected instances stays right when ejected instances are removed as their
/// ejection ends (a slot released both by the removal and by the readmission timer, or by
/// neither, would break ejection for good). 12 instances that fail every call
/// (`consecutive_failures: 1`, 1 ms ejections) are ejected together by a burst of calls, then
/// removed as the first of them is readmitted, and inserted again, round after round, while 4
/// tasks send calls. Throughout, no more than the cap (9) is ejected at once; afterwards, with
/// one failing instance and one good one (a cap of 1), the failing one is still ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejected_count_survives_removals_racing_readmissions() {
    const K: usize = 12;
    let good = Instance::start("good", Behavior::Ok);
    let failing: Vec<Instance> = (0..K)
        .map(|i| Instance::start(&format!("x{i}"), Behavior::Fail(Code::Unavailable)))
        .collect();
    let xs: Vec<String> = failing.iter().map(Instance::uri).collect();
    let ejection = Ejection::default()
        .consecutive_failures(1)
        .base_time(Duration::from_millis(1))
        .max_time(Duration::from_millis(20))
        .max_ejected_percent(75)
        .interval(None);
    let ch = BalancedChannel::builder()
        .uri(&good.uri())
        .uris(&xs)
        .ejection(ejection)
        .build()
        .unwrap();
    let cap = (K + 1) * 75 / 100;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let callers: Vec<_> = (0..4u64)
        .map(|t| {
            let mut client = FleetClient::new(ch.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let r = tokio::time::timeout(LIMIT, client.unary(req(t * 1_000_000 + i)))
                        .await
                        .expect("a call ended");
                    if let Err(s) = r {
                        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                    }
                    i += 1;
                }
            })
        })
        .collect();
    // Rounds, on a thread of its own: a burst of calls ejects the failing instances at once
    // (their readmission timers fall due together); as soon as one is readmitted, every
    // failing instance is removed, racing the readmissions of the others, then all are
    // inserted again.
    let churn = {
        let ch = ch.clone();
        let xs = xs.clone();
        let stop = stop.clone();
        let rt = tokio::runtime::Handle::current();
        std::thread::spawn(move || {
            let client = FleetClient::new(ch.clone());
            let mut rounds = 0u64;
            let mut removals = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rt.block_on(futures::future::join_all((0..=K as u64).map(|i| {
                    let mut client = client.clone();
                    async move { client.unary(req(i)).await }
                })));
                let ejected: Vec<(String, u32)> = ch
                    .endpoints()
                    .iter()
                    .filter(|e| e.state() == State::Ejected)
                    .map(|e| (e.uri().to_owned(), e.ejections()))
                    .collect();
                if ejected.is_empty() {
                    continue;
                }
                let spin = Instant::now();
                while spin.elapsed() < Duration::from_millis(50) {
                    let eps = ch.endpoints();
                    if ejected.iter().any(|(u, _)| {
                        eps.iter()
                            .any(|e| e.uri() == u && e.state() != State::Ejected)
                    }) {
                        break;
                    }
                }
                for (u, _) in ejected.iter().rev() {
                    ch.remove(u).unwrap();
                }
                for x in &xs {
                    ch.remove(x).unwrap();
                }
                for x in &xs {
                    ch.insert(tonic::transport::Endpoint::from_shared(x.clone()).unwrap())
                        .unwrap();
                }
                removals += ejected.len() as u64;
                rounds += 1;
            }
            (rounds, removals)
        })
    };
    let start = Instant::now();
    let mut most = 0;
    while start.elapsed() < Duration::from_millis(2500) {
        let ejected = ejected_throughout(&ch);
        most = most.max(ejected.len());
        assert!(
            ejected.len() <= cap,
            "{} ejected at once, above the cap of {cap}: {ejected:?}{}",
            ejected.len(),
            dump(&ch)
        );
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (rounds, removals) = churn.join().unwrap();
    for c in callers {
        c.await.unwrap();
    }

    // One failing instance and the good one: a cap of 1, so that one slot counted wrong
    // (released twice, or never) stops every ejection.
    for x in &xs {
        ch.insert(tonic::transport::Endpoint::from_shared(x.clone()).unwrap())
            .unwrap();
    }
    for x in &xs[1..] {
        assert!(ch.remove(x).unwrap());
    }
    fleet::wait_until("no instance ejected", LIMIT, || {
        ch.endpoints().iter().all(|e| e.state() != State::Ejected)
    })
    .await;
    let before = stats(&ch, &xs[0]).ejections();
    let mut client = FleetClient::new(ch.clone());
    let start = Instant::now();
    let mut id = 0;
    while stats(&ch, &xs[0]).ejections() == before {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "after {rounds} rounds ({removals} removals of ejected instances), a failing \
             instance is no longer ejected after {id} calls: the count of ejected instances \
             is off (at most {most} were ejected at once during the rounds){}",
            dump(&ch)
        );
        let r = tokio::time::timeout(LIMIT, client.unary(req(id)))
            .await
            .expect("a call ended");
        if let Err(s) = r {
            assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        }
        id += 1;
    }
}

// ---------------------------------------------------------------------------------------------
// 8b. The `grpc-timeout` of an attempt sent again.

/// One call as a recording server saw it.
#[derive(Debug, Clone)]
struct Seen {
    server: &'static str,
    timeout: Option<Duration>,
}

/// What the recording servers of a test saw, in order.
#[derive(Debug, Default)]
struct Log {
    calls: Mutex<Vec<Seen>>,
}

/// A Fleet service that records each unary call's `grpc-timeout`; the first call that any of
/// the servers sharing `log` gets answers UNAVAILABLE after `first_fails_after` (if set).
#[derive(Clone)]
struct Recorder {
    name: &'static str,
    log: Arc<Log>,
    first_fails_after: Option<Duration>,
}

type ReplyStream = Pin<Box<dyn futures::Stream<Item = Result<Reply, Status>> + Send>>;

#[tonic::async_trait]
impl FleetService for Recorder {
    async fn unary(&self, req: Request<Req>) -> Result<Response<Reply>, Status> {
        let timeout = req
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        let n = {
            let mut calls = self.log.calls.lock().unwrap();
            calls.push(Seen {
                server: self.name,
                timeout,
            });
            calls.len()
        };
        if n == 1 {
            if let Some(d) = self.first_fails_after {
                tokio::time::sleep(d).await;
                return Err(Status::unavailable(format!(
                    "{} fails its first call",
                    self.name
                )));
            }
        }
        Ok(Response::new(Reply {
            instance: self.name.to_owned(),
            id: req.get_ref().id,
            ..Default::default()
        }))
    }

    type ServerStreamStream = ReplyStream;

    async fn server_stream(&self, _: Request<Req>) -> Result<Response<ReplyStream>, Status> {
        Err(Status::unimplemented("recorder: unary only"))
    }

    async fn client_stream(&self, _: Request<Streaming<Req>>) -> Result<Response<Reply>, Status> {
        Err(Status::unimplemented("recorder: unary only"))
    }

    type BidiStream = ReplyStream;

    async fn bidi(&self, _: Request<Streaming<Req>>) -> Result<Response<ReplyStream>, Status> {
        Err(Status::unimplemented("recorder: unary only"))
    }
}

async fn start_recorder(
    name: &'static str,
    log: &Arc<Log>,
    first_fails_after: Option<Duration>,
) -> String {
    let addr = serve(tonic::service::Routes::new(FleetServer::new(Recorder {
        name,
        log: log.clone(),
        first_fails_after,
    })))
    .await;
    format!("http://{addr}")
}

/// A retried attempt carries the time left of the call's deadline in its `grpc-timeout`, not
/// the original: the first attempt fails UNAVAILABLE after 300 ms of a 2 s deadline, the retry
/// on the other instance must say at most 1.75 s (and still well above zero).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_attempt_carries_the_time_left() {
    let log = Arc::new(Log::default());
    let a = start_recorder("a", &log, Some(Duration::from_millis(300))).await;
    let b = start_recorder("b", &log, Some(Duration::from_millis(300))).await;
    let ch = BalancedChannel::builder()
        .uri(&a)
        .uri(&b)
        .retry(
            RetryPolicy::default()
                .max_attempts(2)
                .codes([Code::Unavailable])
                .initial_backoff(Duration::from_millis(50))
                .max_backoff(Duration::from_millis(50)),
        )
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let reply = tokio::time::timeout(LIMIT, client.unary(with_timeout(1, Duration::from_secs(2))))
        .await
        .expect("the call ended")
        .expect("the retry succeeded");
    let calls = log.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(reply.get_ref().instance, calls[1].server);
    assert_ne!(calls[0].server, calls[1].server, "{calls:?}");
    let first = calls[0]
        .timeout
        .expect("the first attempt has a grpc-timeout");
    let second = calls[1].timeout.expect("the retry has a grpc-timeout");
    assert!(
        first > Duration::from_millis(1900),
        "first attempt: {first:?} of a 2 s deadline"
    );
    assert!(
        second <= first - Duration::from_millis(250) && second >= Duration::from_millis(200),
        "the retry, 300 ms into a 2 s deadline, says grpc-timeout {second:?} (first attempt {first:?})"
    );
}

/// A transparently replayed attempt carries the time left too: the first instance is a black
/// hole whose connect times out after 300 ms; the call, replayed on the other instance, must
/// say at most 1.75 s of its 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_attempt_carries_the_time_left() {
    let log = Arc::new(Log::default());
    let ok = start_recorder("ok", &log, None).await;
    let hole = fleet::black_hole_uri();
    let ch = BalancedChannel::builder()
        .endpoint(
            tonic::transport::Endpoint::from_shared(hole.clone())
                .unwrap()
                .connect_timeout(Duration::from_millis(300)),
        )
        .uri(&ok)
        // The black hole (first in the set) gets the first call.
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let start = Instant::now();
    let reply = tokio::time::timeout(LIMIT, client.unary(with_timeout(1, Duration::from_secs(2))))
        .await
        .expect("the call ended")
        .expect("the replay succeeded");
    assert_eq!(reply.get_ref().instance, "ok");
    assert!(
        start.elapsed() >= Duration::from_millis(290),
        "the call did not wait for the black hole's connect timeout: {:?}{}",
        start.elapsed(),
        dump(&ch)
    );
    assert!(
        stats(&ch, &hole).started() >= 1,
        "the call did not go to the black hole first:{}",
        dump(&ch)
    );
    let calls = log.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let t = calls[0].timeout.expect("the replay has a grpc-timeout");
    assert!(
        t <= Duration::from_millis(1750) && t >= Duration::from_millis(200),
        "the replay, 300 ms into a 2 s deadline, says grpc-timeout {t:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 8d. Transparent retry off, with a retry policy on.

/// `transparent_retry(false)` holds with a retry policy set: a call whose instance refuses the
/// connection fails with UNAVAILABLE (the policy retries RESOURCE_EXHAUSTED only) instead of
/// going to the other instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transparent_retry_off_holds_with_a_retry_policy() {
    let good = Instance::start("good", Behavior::Ok);
    let unreachable = fleet::unreachable_uri();
    let ch = BalancedChannel::builder()
        .uri(&unreachable)
        .uri(&good.uri())
        // The unreachable instance (first in the set) gets the first call.
        .strategy(Strategy::RoundRobin)
        .transparent_retry(false)
        .retry(RetryPolicy::default().codes([Code::ResourceExhausted]))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let r = tokio::time::timeout(LIMIT, client.unary(req(1)))
        .await
        .expect("the call ended");
    match r {
        Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        Ok(reply) => panic!(
            "with transparent retry off, the call to the unreachable instance was sent again and \
             answered by {:?}:{}",
            reply.get_ref().instance,
            dump(&ch)
        ),
    }
    assert!(stats(&ch, &unreachable).started() >= 1, "{}", dump(&ch));
    assert_eq!(good.served(), 0, "the call went to the good instance");
}

// ---------------------------------------------------------------------------------------------
// 8e. A discovery source that never answers.

/// A source whose lookups never complete.
struct Stuck;

impl Resolve for Stuck {
    fn resolve(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<SocketAddr>, tower::BoxError>> + Send + '_>> {
        Box::pin(std::future::pending())
    }

    fn name(&self) -> String {
        "stuck registry".into()
    }
}

/// A lookup has a timeout: with a source that never answers and a 200 ms discovery timeout, a
/// call without a deadline ends within seconds with UNAVAILABLE, naming the source and saying
/// it timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_source_that_never_answers_times_out() {
    let ch = BalancedChannel::builder()
        .resolver(Stuck)
        .discovery_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), client.unary(req(1)))
        .await
        .expect("a call waiting for a stuck discovery source did not end within 5 s");
    let s = r.expect_err("no instance to answer");
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    let msg = s.message().to_lowercase();
    assert!(msg.contains("stuck registry"), "{s:?}");
    assert!(
        msg.contains("timed out") || msg.contains("no answer within"),
        "the message does not say the lookup timed out: {s:?}"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(190),
        "{:?}",
        start.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 8f. An answer without a gRPC status (an HTTP 503 from a proxy).

/// A server that answers every request with HTTP 503 and nothing else (no gRPC headers), as a
/// proxy in front of a dead service does. Counts the requests.
#[derive(Clone, Default)]
struct Http503 {
    hits: Arc<AtomicU64>,
}

impl tonic::server::NamedService for Http503 {
    const NAME: &'static str = "fleet.v1.Fleet";
}

impl tower::Service<http::Request<tonic::body::Body>> for Http503 {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        self.hits.fetch_add(1, Ordering::SeqCst);
        let resp = http::Response::builder()
            .status(http::StatusCode::SERVICE_UNAVAILABLE)
            .body(tonic::body::Body::empty())
            .unwrap();
        std::future::ready(Ok(resp))
    }
}

/// An HTTP 503 without grpc-status is a failure of the instance: the caller sees UNAVAILABLE
/// (gRPC's mapping of 503), and three in a row eject the instance (`consecutive_failures: 3`),
/// each counted in `failed()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_503_without_grpc_status_counts_against_the_instance() {
    let good = Instance::start("good", Behavior::Ok);
    let proxy = Http503::default();
    let bad = format!(
        "http://{}",
        serve(tonic::service::Routes::new(proxy.clone())).await
    );
    let ch = BalancedChannel::builder()
        .uri(&good.uri())
        .uri(&bad)
        .ejection(no_success_rate(3))
        .build()
        .unwrap();
    let mut client: Client = FleetClient::new(ch.clone());
    let start = Instant::now();
    let (mut id, mut unavailable) = (0, 0);
    while proxy.hits.load(Ordering::SeqCst) < 3 {
        assert!(
            start.elapsed() < LIMIT && id < 500,
            "the 503 instance got {} calls of {id}:{}",
            proxy.hits.load(Ordering::SeqCst),
            dump(&ch)
        );
        let r = tokio::time::timeout(LIMIT, client.unary(req(id)))
            .await
            .expect("a call ended");
        if let Err(s) = r {
            assert_eq!(s.code(), Code::Unavailable, "a 503 answer: {s:?}");
            unavailable += 1;
        }
        id += 1;
    }
    assert_eq!(
        unavailable,
        proxy.hits.load(Ordering::SeqCst),
        "each call answered 503 ends UNAVAILABLE, and only those"
    );
    let s = stats(&ch, &bad);
    assert!(
        s.failed() >= 3 && s.ejections() == 1 && s.state() == State::Ejected,
        "three HTTP 503 answers in a row are not counted against the instance:{}",
        dump(&ch)
    );
}

// ---------------------------------------------------------------------------------------------
// 8g. Calls from another executor.

/// Runs `f` on a plain thread (no tokio runtime) and returns what it returned, or the message
/// of its panic; fails the test if it does not end within `LIMIT`.
fn on_plain_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(v) => {
            thread.join().unwrap();
            Ok(v)
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a call on a plain thread did not end within {LIMIT:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let panic = thread
                .join()
                .expect_err("the thread ended without a result");
            Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_owned()))
        }
    }
}

/// A call from another executor works: the channel is built in a tokio runtime that stays up,
/// and a plain thread runs calls with `futures::executor::block_on`: one with a deadline, one
/// whose first attempt fails UNAVAILABLE and is retried after a backoff. The channel's timers
/// run on its own runtime.
#[test]
fn calls_from_another_executor_work() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fleet = Fleet::start(2, Behavior::Ok);
    let failing = Instance::start("failing", Behavior::Fail(Code::Unavailable));
    let (plain, retrying) = rt.block_on(async {
        let plain = BalancedChannel::from_static(fleet.uris()).unwrap();
        let retrying = BalancedChannel::builder()
            .uri(&failing.uri())
            .uri(&fleet.instances[0].uri())
            // The failing instance (first in the set) gets the first attempt.
            .strategy(Strategy::RoundRobin)
            .retry(
                RetryPolicy::default()
                    .max_attempts(2)
                    .initial_backoff(Duration::from_millis(10))
                    .max_backoff(Duration::from_millis(10)),
            )
            .build()
            .unwrap();
        (plain, retrying)
    });

    let mut client = FleetClient::new(plain.clone());
    let with_deadline = on_plain_thread(move || {
        futures::executor::block_on(client.unary(with_timeout(1, Duration::from_secs(5))))
            .map(|r| r.into_inner().instance)
    });
    let mut client = FleetClient::new(retrying.clone());
    let retried = on_plain_thread(move || {
        futures::executor::block_on(client.unary(req(2))).map(|r| r.into_inner().instance)
    });
    let served_by_failing = failing.served();
    drop(rt);
    match with_deadline {
        Ok(Ok(name)) => assert!(name.starts_with('i'), "{name}"),
        other => panic!("a call with a deadline from a plain thread: {other:?}"),
    }
    match retried {
        Ok(Ok(name)) => assert_eq!(name, fleet.instances[0].name()),
        other => panic!("a retried call from a plain thread: {other:?}"),
    }
    assert_eq!(
        served_by_failing, 1,
        "the first attempt did not go to the failing instance"
    );
}
