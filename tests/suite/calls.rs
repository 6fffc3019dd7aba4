//! The life of one call through the channel: every RPC kind, how long a call counts, that
//! abandoned calls leave no count, deadlines, and the per-instance totals.

use fleet_service as fleet;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use fleet::pb::{fleet_client::FleetClient, Reply, Req};
use fleet::{total_in_flight, wait_until, Behavior, Fleet};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Status};
use tonic_balancer::{BalancedChannel, Ejection, EndpointStats, State};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(30);

use fleet::req;

fn stream_req(id: u64, count: u32) -> Req {
    Req {
        id,
        count,
        ..Default::default()
    }
}

/// A request with a deadline (`grpc-timeout`).
fn with_timeout<T>(msg: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(timeout);
    r
}

fn stats_of(ch: &BalancedChannel, inst: &fleet::Instance) -> EndpointStats {
    ch.endpoints()
        .into_iter()
        .find(|e| e.uri() == inst.uri())
        .unwrap_or_else(|| panic!("no endpoint for {}", inst.uri()))
}

/// A channel over `fleet` with ejection off, for tests whose instances fail on purpose.
fn no_ejection(fleet: &Fleet) -> BalancedChannel {
    let b = BalancedChannel::builder()
        .ejection(Ejection::disabled())
        .uris(fleet.uris());
    b.build().unwrap()
}

// ---------------------------------------------------------------------------------------------
// 1. Every RPC kind through the generated stub.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_kind_works_through_the_stub() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let names: BTreeSet<String> = fleet.instances.iter().map(|i| i.name().into()).collect();
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());

    // Unary.
    let reply = client
        .unary(Req {
            id: 42,
            count: 0,
            payload: b"hello".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.id, 42);
    assert_eq!(reply.payload, b"hello");
    assert!(names.contains(&reply.instance), "{reply:?}");
    assert_eq!(total_in_flight(&ch), 0);

    // Server streaming: 5 replies, in order, from one instance.
    let mut stream = client
        .server_stream(stream_req(7, 5))
        .await
        .unwrap()
        .into_inner();
    let mut got = Vec::new();
    while let Some(r) = stream.message().await.unwrap() {
        got.push(r);
    }
    assert_eq!(got.len(), 5, "{got:?}");
    for (seq, r) in got.iter().enumerate() {
        assert_eq!((r.id, r.seq), (7, seq as u32), "{got:?}");
        assert_eq!(r.instance, got[0].instance);
    }
    assert!(names.contains(&got[0].instance));
    drop(stream);
    assert_eq!(total_in_flight(&ch), 0);

    // Client streaming: the server counts 7 messages and answers with the last id.
    let input = tokio_stream::iter((0..7).map(|id| req(100 + id)));
    let reply = client.client_stream(input).await.unwrap().into_inner();
    assert_eq!((reply.id, reply.seq), (106, 7), "{reply:?}");
    assert!(names.contains(&reply.instance));
    assert_eq!(total_in_flight(&ch), 0);

    // Bidi, ping-pong: each reply comes before the next request is sent.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut replies = client
        .bidi(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut instance = None;
    for k in 0..5u64 {
        tx.send(req(200 + k)).await.unwrap();
        let r = replies
            .message()
            .await
            .unwrap()
            .expect("a reply per request");
        assert_eq!((r.id, r.seq), (200 + k, k as u32), "{r:?}");
        assert_eq!(instance.get_or_insert(r.instance.clone()), &r.instance);
    }
    assert_eq!(total_in_flight(&ch), 1, "the bidi call is open");
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
    assert_eq!(total_in_flight(&ch), 0);

    let eps = ch.endpoints();
    assert_eq!(eps.iter().map(|e| e.started()).sum::<u64>(), 4, "{eps:?}");
    assert_eq!(eps.iter().map(|e| e.failed()).sum::<u64>(), 0, "{eps:?}");
}

// ---------------------------------------------------------------------------------------------
// 3. A call counts until it is completely over.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_counts_until_its_trailers_are_read() {
    let fleet = Fleet::start(2, Behavior::Hold);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut stream = client
        .server_stream(stream_req(1, 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(total_in_flight(&ch), 1, "response head received");
    for seq in 0..3 {
        let r = stream.message().await.unwrap().expect("3 replies");
        assert_eq!(r.seq, seq);
    }
    // The server has sent every message and holds the trailers.
    wait_until("the server holds the call", LIMIT, || fleet.held() == 1).await;
    assert_eq!(total_in_flight(&ch), 1, "every message read, trailers not");
    fleet.release_all(1);
    assert!(stream.message().await.unwrap().is_none());
    assert_eq!(
        total_in_flight(&ch),
        0,
        "trailers read: {:?}",
        ch.endpoints()
    );
    drop(stream);
    assert_eq!(total_in_flight(&ch), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_dropped_half_read_stops_counting() {
    let fleet = Fleet::start(2, Behavior::Hang);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());

    // Dropped after 2 of 5 messages.
    read_then_drop(&mut client, &ch, stream_req(1, 5), Some(2)).await;
    // Dropped after the response head, before any message.
    read_then_drop(&mut client, &ch, stream_req(2, 5), None).await;
    // Dropped after every message, before the trailers (the server never sends them).
    read_then_drop(&mut client, &ch, stream_req(3, 2), Some(2)).await;
}

/// Opens a server stream, reads `read` messages (`None`: not even the stream, only the
/// response head), checks that the call counts, drops it and checks that it no longer does.
async fn read_then_drop(
    client: &mut FleetClient<BalancedChannel>,
    ch: &BalancedChannel,
    req: Req,
    read: Option<usize>,
) {
    let response = client.server_stream(req).await.unwrap();
    match read {
        None => {
            assert_eq!(total_in_flight(ch), 1);
            drop(response);
        }
        Some(n) => {
            let mut stream = response.into_inner();
            for _ in 0..n {
                stream.message().await.unwrap().expect("a reply");
            }
            assert_eq!(total_in_flight(ch), 1);
            drop(stream);
        }
    }
    assert_eq!(total_in_flight(ch), 0, "{:?}", ch.endpoints());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_stream_and_bidi_count_until_over() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();

    // Client streaming: in flight while the request stream is open, over with the reply.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut client = FleetClient::new(ch.clone());
    let call = tokio::spawn(async move { client.client_stream(ReceiverStream::new(rx)).await });
    tx.send(req(1)).await.unwrap();
    tx.send(req(2)).await.unwrap();
    wait_until("the server is reading the stream", LIMIT, || {
        fleet.instances.iter().map(|i| i.active()).sum::<usize>() == 1
    })
    .await;
    assert_eq!(total_in_flight(&ch), 1);
    drop(tx);
    let reply = call.await.unwrap().unwrap().into_inner();
    assert_eq!((reply.id, reply.seq), (2, 2));
    assert_eq!(total_in_flight(&ch), 0, "{:?}", ch.endpoints());

    // Bidi: in flight until the response stream ends.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut client = FleetClient::new(ch.clone());
    let mut replies = client
        .bidi(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(req(5)).await.unwrap();
    assert_eq!(replies.message().await.unwrap().unwrap().id, 5);
    assert_eq!(total_in_flight(&ch), 1);
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
    assert_eq!(total_in_flight(&ch), 0, "{:?}", ch.endpoints());

    // Bidi dropped while both sides are open.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut replies = client
        .bidi(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(req(6)).await.unwrap();
    assert_eq!(replies.message().await.unwrap().unwrap().id, 6);
    assert_eq!(total_in_flight(&ch), 1);
    drop(replies);
    assert_eq!(total_in_flight(&ch), 0, "{:?}", ch.endpoints());
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_counts_until_answered() {
    let fleet = Fleet::start(1, Behavior::Hold);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let call = tokio::spawn(async move { client.unary(req(9)).await });
    wait_until("the server holds the call", LIMIT, || fleet.held() == 1).await;
    assert_eq!(total_in_flight(&ch), 1);
    fleet.release_all(1);
    assert_eq!(call.await.unwrap().unwrap().into_inner().id, 9);
    assert_eq!(total_in_flight(&ch), 0);
}

// ---------------------------------------------------------------------------------------------
// 4. Abandoned calls leave no count.

/// How the call number `i` of the 1,000 is abandoned. Returns the status the call ended with,
/// if it ended with one rather than being dropped.
///
/// Every instance hangs, so no call may answer OK. A call may end in a transport error: the
/// servers' HTTP/2 rapid-reset defence (h2: more than 20 streams reset before the server
/// accepted them) closes a connection with GOAWAY when cancellations come in bursts on a loaded
/// machine. That is part of what the counts must survive.
async fn abandon(ch: BalancedChannel, i: u64) -> Option<Status> {
    let mut client = FleetClient::new(ch);
    match i % 10 {
        // Cancelled by the caller's timer at some point of its life (0 to 3 ms).
        0..=2 => {
            let wait = Duration::from_micros((i * 7919) % 3000);
            match tokio::time::timeout(wait, client.unary(req(i))).await {
                Err(_elapsed) => None,
                Ok(Ok(r)) => panic!("call {i} to a hanging instance answered: {r:?}"),
                Ok(Err(s)) => Some(s),
            }
        }
        // Cancelled right after being routed (first poll), before anything came back.
        3 => {
            let call = client.unary(req(i));
            tokio::pin!(call);
            tokio::select! {
                biased;
                r = &mut call => match r {
                    Ok(r) => panic!("call {i} to a hanging instance answered: {r:?}"),
                    Err(s) => Some(s),
                },
                _ = tokio::task::yield_now() => None,
            }
        }
        // Client streaming, cancelled while its request stream is open.
        4 => {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(req(i)).await.unwrap();
            let wait = Duration::from_micros((i * 104_729) % 5000);
            let call = client.client_stream(ReceiverStream::new(rx));
            match tokio::time::timeout(wait, call).await {
                Err(_elapsed) => None,
                Ok(Ok(r)) => panic!("client stream {i} with its input open answered: {r:?}"),
                Ok(Err(s)) => Some(s),
            }
        }
        // A server stream of 3 messages (then the server hangs), dropped after 0 to 2.
        5 | 6 => {
            let mut stream = match client.server_stream(stream_req(i, 3)).await {
                Ok(r) => r.into_inner(),
                Err(s) => return Some(s),
            };
            for _ in 0..(i / 10) % 3 {
                match stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => panic!("stream {i} to a hanging instance ended"),
                    Err(s) => return Some(s),
                }
            }
            None
        }
        // A server stream whose deadline ends it (after its messages, or before its response
        // head on a loaded machine).
        7 => {
            let timeout = Duration::from_millis(20 + i % 50);
            let mut stream = match client
                .server_stream(with_timeout(stream_req(i, 2), timeout))
                .await
            {
                Ok(r) => r.into_inner(),
                Err(s) => return Some(s),
            };
            let mut n = 0;
            loop {
                match stream.message().await {
                    Ok(Some(_)) => n += 1,
                    Ok(None) => panic!("stream {i} to a hanging instance ended"),
                    Err(s) => {
                        assert!(n <= 2, "stream {i}: {n} replies");
                        return Some(s);
                    }
                }
            }
        }
        // A unary call whose deadline ends it.
        8 => {
            let timeout = Duration::from_millis(20 + i % 50);
            match client.unary(with_timeout(req(i), timeout)).await {
                Ok(r) => panic!("call {i} to a hanging instance answered: {r:?}"),
                Err(s) => Some(s),
            }
        }
        // Bidi dropped after one exchange, both sides open.
        _ => {
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            let mut replies = match client.bidi(ReceiverStream::new(rx)).await {
                Ok(r) => r.into_inner(),
                Err(s) => return Some(s),
            };
            tx.send(req(i)).await.unwrap();
            match replies.message().await {
                Ok(Some(r)) => assert_eq!(r.id, i),
                Ok(None) => panic!("bidi {i} with its input open ended"),
                Err(s) => return Some(s),
            }
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_abandoned_calls_leave_no_count() {
    let fleet = Fleet::start(4, Behavior::Hang);
    // Ejection off, so that the deadlines do not take instances out: all four keep calls.
    let ch = no_ejection(&fleet);
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000u64 {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let ch = ch.clone();
        tasks.spawn(async move {
            let ended = abandon(ch, i).await;
            drop(permit);
            (i, ended)
        });
    }
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    let done = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(r) = tasks.join_next().await {
            let (i, ended) = r.unwrap();
            let what = match ended {
                None => "dropped".to_owned(),
                Some(s) => format!("{}/{:?}", i % 10, s.code()),
            };
            *codes.entry(what).or_default() += 1;
        }
    })
    .await;
    assert!(done.is_ok(), "some calls never ended: {codes:?}");
    wait_until("every count back at zero", LIMIT, || {
        total_in_flight(&ch) == 0
    })
    .await;
    let eps = ch.endpoints();
    assert!(eps.iter().all(|e| e.in_flight() == 0), "{eps:?}");
    assert!(eps.iter().all(|e| e.started() > 0), "{eps:?} {codes:?}");
    assert!(
        eps.iter().map(|e| e.started()).sum::<u64>() >= 700,
        "most calls were routed: {eps:?} {codes:?}"
    );
    // The deadlines (kinds 7 and 8) ended their calls.
    let deadlines: usize = ["7/DeadlineExceeded", "8/DeadlineExceeded"]
        .iter()
        .filter_map(|k| codes.get(*k))
        .sum();
    assert!(deadlines >= 100, "{codes:?}");
}

// ---------------------------------------------------------------------------------------------
// 6. A deadline always ends a call, with DEADLINE_EXCEEDED.

async fn assert_deadline_exceeded<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, Status>>,
) {
    let start = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no end 10 s after a deadline of {timeout:?}"));
    let status = r.expect_err(what);
    assert_eq!(status.code(), Code::DeadlineExceeded, "{what}: {status:?}");
    assert!(
        start.elapsed() >= timeout,
        "{what}: ended before its deadline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_ends_a_unary_call_on_a_hanging_instance() {
    let fleet = Fleet::start(1, Behavior::Hang);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let t = Duration::from_millis(200);
    assert_deadline_exceeded("unary", t, client.unary(with_timeout(req(1), t))).await;
    assert_eq!(total_in_flight(&ch), 0);
    // The same on a held call.
    fleet.instances[0].set(Behavior::Hold);
    assert_deadline_exceeded("held unary", t, client.unary(with_timeout(req(2), t))).await;
    assert_eq!(total_in_flight(&ch), 0);
}

/// Many deadlines at once, each ending with DEADLINE_EXCEEDED: the servers' own timer for the
/// same `grpc-timeout` (tonic's server answers CANCELLED "Timeout expired" when it runs out)
/// must not turn it into another code.
///
/// 40 calls over 4 instances: about 10 per connection, so that the cancellations of the calls
/// whose deadline passes cannot trip the servers' rapid-reset defence (h2 closes a connection
/// with more than 20 streams reset before the server accepted them), which a loaded machine
/// could otherwise provoke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_ends_every_call_with_deadline_exceeded() {
    let fleet = Fleet::start(4, Behavior::Hang);
    let ch = no_ejection(&fleet);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40u64 {
        let mut client = FleetClient::new(ch.clone());
        tasks.spawn(async move {
            let t = Duration::from_millis(50 + i % 50);
            let r = client.unary(with_timeout(req(i), t)).await;
            let s = r.expect_err("a hanging instance never answers");
            format!("{:?}: {}", s.code(), s.message())
        });
    }
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    while let Some(code) = tasks.join_next().await {
        *codes.entry(code.unwrap()).or_default() += 1;
    }
    let deadline_exceeded: usize = codes
        .iter()
        .filter(|(k, _)| k.starts_with("DeadlineExceeded:"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(deadline_exceeded, 40, "codes: {codes:?}");
    assert_eq!(total_in_flight(&ch), 0);
}

/// A server stream that sends its messages and then hangs is ended by its deadline, with
/// DEADLINE_EXCEEDED after the messages. The deadline must leave the messages time to come:
/// on a loaded machine the first try may run out before them (that too must end with
/// DEADLINE_EXCEEDED), and the next tries double it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_ends_a_server_stream_that_hangs_after_its_messages() {
    let fleet = Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    // Open the connection first.
    client.unary(req(0)).await.unwrap();
    fleet.instances[0].set(Behavior::Hang);
    let mut t = Duration::from_millis(300);
    for attempt in 0.. {
        assert!(attempt < 6, "the messages never came before the deadline");
        let start = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(60), async {
            let mut stream = match client
                .server_stream(with_timeout(stream_req(attempt, 3), t))
                .await
            {
                Ok(r) => r.into_inner(),
                Err(s) => return (0, s),
            };
            let mut got = 0;
            loop {
                match stream.message().await {
                    Ok(Some(r)) => {
                        assert_eq!(r.seq, got);
                        got += 1;
                    }
                    Ok(None) => panic!("stream ended without error after {got} messages"),
                    Err(s) => return (got, s),
                }
            }
        })
        .await
        .expect("the deadline ends the stream");
        let (got, status) = status;
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(start.elapsed() >= t);
        assert_eq!(total_in_flight(&ch), 0, "{:?}", ch.endpoints());
        assert!(got <= 3);
        if got == 3 {
            break;
        }
        t *= 2;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_ends_an_open_bidi_call() {
    let fleet = Fleet::start(1, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let t = Duration::from_millis(300);
    let mut replies = client
        .bidi(with_timeout(ReceiverStream::new(rx), t))
        .await
        .unwrap()
        .into_inner();
    tx.send(req(1)).await.unwrap();
    assert_eq!(replies.message().await.unwrap().unwrap().id, 1);
    // The request stream stays open: only the deadline can end the call.
    let status = tokio::time::timeout(Duration::from_secs(10), replies.message())
        .await
        .expect("the deadline ends the call")
        .expect_err("ended by its deadline");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(total_in_flight(&ch), 0, "{:?}", ch.endpoints());
    drop(tx);
}

// ---------------------------------------------------------------------------------------------
// 9. EndpointStats totals.

/// A channel over `fleet` with `Strategy::LeastPending`: the instance with no call in flight
/// gets every call while the others hold one each. (The default weighs the calls of an instance
/// that answered markedly slower than usual: a fast NOT_FOUND answer slowed by the machine
/// could send a call to an instance that holds it until the test ends.)
fn least_pending(fleet: &Fleet) -> BalancedChannel {
    BalancedChannel::builder()
        .uris(fleet.uris())
        .strategy(tonic_balancer::Strategy::LeastPending)
        .build()
        .unwrap()
}

/// Application statuses count in `failed` but never against the instance: 200 NOT_FOUND
/// answers in a row leave it ready, never ejected, with no consecutive failures (5 failures
/// in a row would eject it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_errors_count_as_failed_but_never_eject() {
    let fleet = Fleet::start(3, Behavior::Hold);
    let ch = least_pending(&fleet);
    // One held call on each of i1 and i2 (started while i0 holds calls too, then i0's is
    // released), so that i0, with none, gets every call after.
    let held = hold_one_each(&ch, &fleet).await;
    fleet.instances[0].release(1);
    wait_until("i0's call is over", LIMIT, || {
        stats_of(&ch, &fleet.instances[0]).in_flight() == 0
    })
    .await;
    let i0 = &fleet.instances[0];
    i0.set(Behavior::Fail(Code::NotFound));
    let before = stats_of(&ch, i0);
    let mut client = FleetClient::new(ch.clone());
    for id in 0..200 {
        let s = client
            .unary(req(id))
            .await
            .expect_err("i0 answers NOT_FOUND");
        assert_eq!(s.code(), Code::NotFound, "{s:?}");
        assert!(s.message().contains("i0"), "{s:?}");
    }
    let e0 = stats_of(&ch, i0);
    assert_eq!(e0.started() - before.started(), 200, "{e0}");
    assert_eq!(e0.failed() - before.failed(), 200, "{e0}");
    assert_eq!(e0.started(), i0.served(), "{e0}");
    assert_eq!(e0.state(), State::Ready, "{e0}");
    assert!(e0.state().is_usable());
    assert_eq!(e0.ejections(), 0, "{e0}");
    assert_eq!(e0.consecutive_failures(), 0, "{e0}");

    fleet.release_all(1);
    for h in held {
        h.await.unwrap().unwrap();
    }
    for inst in &fleet.instances[1..] {
        let e = stats_of(&ch, inst);
        assert_eq!((e.started(), e.failed(), e.in_flight()), (1, 0, 0), "{e}");
    }
    assert_eq!(total_in_flight(&ch), 0);
}

/// One held call on each instance but i0 (whose call, if any, is released): starts one call per
/// instance while all hold, which least pending spreads one per instance.
async fn hold_one_each(
    ch: &BalancedChannel,
    fleet: &Fleet,
) -> Vec<tokio::task::JoinHandle<Result<tonic::Response<Reply>, Status>>> {
    let mut calls = Vec::new();
    for k in 0..fleet.instances.len() {
        let mut client = FleetClient::new(ch.clone());
        calls.push(tokio::spawn(async move {
            client.unary(req(1_000_000 + k as u64)).await
        }));
        wait_until("the call is routed", LIMIT, || total_in_flight(ch) == k + 1).await;
    }
    let per_instance: Vec<usize> = fleet
        .instances
        .iter()
        .map(|i| stats_of(ch, i).in_flight())
        .collect();
    assert_eq!(
        per_instance,
        vec![1; fleet.instances.len()],
        "{:?}",
        ch.endpoints()
    );
    wait_until("every instance holds its call", LIMIT, || {
        fleet.instances.iter().all(|i| i.held() == 1)
    })
    .await;
    calls
}

/// The control for the test above: UNAVAILABLE answers do count against the instance, which
/// is ejected after 5 in a row and then gets no calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_answers_count_against_the_instance() {
    let fleet = Fleet::start(3, Behavior::Hold);
    let ch = least_pending(&fleet);
    let held = hold_one_each(&ch, &fleet).await;
    let i0 = &fleet.instances[0];
    i0.release(1);
    wait_until("i0's call is over", LIMIT, || {
        stats_of(&ch, i0).in_flight() == 0
    })
    .await;
    i0.set(Behavior::Fail(Code::Unavailable));
    let mut client = FleetClient::new(ch.clone());
    for id in 0..5 {
        let s = client
            .unary(req(id))
            .await
            .expect_err("i0 answers UNAVAILABLE");
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert!(s.message().contains("i0"), "{s:?}");
    }
    let e0 = stats_of(&ch, i0);
    assert_eq!(e0.state(), State::Ejected, "{e0}");
    assert_eq!(e0.ejections(), 1, "{e0}");
    assert_eq!((e0.started(), e0.failed()), (6, 5), "{e0}");
    // Ejected (30 s by default): the next call goes elsewhere although i0 has the fewest calls
    // in flight.
    let mut client = FleetClient::new(ch.clone());
    let next = tokio::spawn(async move { client.unary(req(99)).await });
    wait_until("the next call is routed", LIMIT, || {
        total_in_flight(&ch) == 3
    })
    .await;
    assert_eq!(stats_of(&ch, i0).started(), 6, "{:?}", ch.endpoints());
    assert_eq!(stats_of(&ch, i0).in_flight(), 0);

    fleet.release_all(10);
    let r = next.await.unwrap().unwrap().into_inner();
    assert_ne!(r.instance, "i0");
    for h in held {
        h.await.unwrap().unwrap();
    }
    assert_eq!(total_in_flight(&ch), 0);
}

/// A stream that ends with an error status counts as failed; one that ends OK does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_ending_in_error_counts_as_failed() {
    let fleet = Fleet::start(1, Behavior::Fail(Code::NotFound));
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let mut stream = client
        .server_stream(stream_req(1, 2))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    assert!(stream.message().await.unwrap().is_some());
    let status = stream.message().await.expect_err("ends with NOT_FOUND");
    assert_eq!(status.code(), Code::NotFound);
    drop(stream);
    let e = stats_of(&ch, &fleet.instances[0]);
    assert_eq!((e.started(), e.failed(), e.in_flight()), (1, 1, 0), "{e}");
    assert_eq!(e.state(), State::Ready, "{e}");

    fleet.instances[0].set(Behavior::Ok);
    let mut stream = client
        .server_stream(stream_req(2, 2))
        .await
        .unwrap()
        .into_inner();
    while stream.message().await.unwrap().is_some() {}
    let e = stats_of(&ch, &fleet.instances[0]);
    assert_eq!((e.started(), e.failed(), e.in_flight()), (2, 1, 0), "{e}");
}
