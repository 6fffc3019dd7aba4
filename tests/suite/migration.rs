//! The shapes tonic users move from: `Channel::balance_list`, `Channel::balance_channel` (a
//! sender of tonic's own `Change`), any pushed stream of changes (tonic's or tower's), and an insert that
//! brings new settings for an address already in the set.
use fleet_service as fleet;

use std::time::Duration;

use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet, Instance};
use tonic::transport::Endpoint;
use tonic_balancer::{BalancedChannel, State};
// tonic's own `Change`, as a tonic user's code has it (`tonic_balancer::Change` is the same type).
use tonic::transport::channel::Change;

/// The longest any step of these tests waits for what it waits for.
const LIMIT: Duration = Duration::from_secs(30);

fn endpoint(uri: &str) -> Endpoint {
    Endpoint::from_shared(uri.to_owned()).unwrap()
}

/// The instances of the channel as (URI without a trailing slash, state, calls in flight).
fn members(ch: &BalancedChannel) -> Vec<(String, State, usize)> {
    ch.endpoints()
        .iter()
        .map(|e| {
            (
                e.uri().trim_end_matches('/').to_owned(),
                e.state(),
                e.in_flight(),
            )
        })
        .collect()
}

/// `balance_list` takes tonic's `Endpoint`s, as tonic's does, and spreads the calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balance_list_spreads_calls_over_its_endpoints() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::balance_list(fleet.uris().iter().map(|u| endpoint(u))).unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 60).await;
    assert!(
        fleet.served().iter().all(|&n| n > 0),
        "{:?}",
        fleet.served()
    );
    assert_eq!(fleet::total_in_flight(&ch), 0);
}

/// `balance_channel`: calls made before the first insert wait for it; inserts add, removes
/// drain, and a key inserted again with another address moves to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balance_channel_follows_its_changes() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let [a, b, c] = [0, 1, 2].map(|i| fleet.instances[i].uri());
    let (ch, tx) = BalancedChannel::balance_channel::<&'static str>(16).unwrap();
    let mut early = FleetClient::new(ch.clone());
    let mut waiting = Box::pin(early.unary(fleet::req(7)));
    // Routed before any instance exists: the call waits for the first one (a call that failed
    // at once would be ready with its error here).
    assert!(
        futures::poll!(&mut waiting).is_pending(),
        "a call before the first insert must wait for it"
    );
    tx.send(Change::Insert("a", endpoint(&a))).await.unwrap();
    let reply = waiting
        .await
        .expect("answered by the first instance")
        .into_inner();
    assert_eq!((reply.instance.as_str(), reply.id), ("i0", 7));

    tx.send(Change::Insert("b", endpoint(&b))).await.unwrap();
    fleet::wait_until("two instances", Duration::from_secs(10), || {
        ch.endpoints().len() == 2
    })
    .await;
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 40).await;
    assert!(names.iter().any(|n| n == "i0") && names.iter().any(|n| n == "i1"));

    tx.send(Change::Remove("a")).await.unwrap();
    fleet::wait_until("a removed", Duration::from_secs(10), || {
        members(&ch).iter().all(|(u, _, _)| *u != a)
    })
    .await;
    let names = fleet::calls(&mut client, 20).await;
    assert!(names.iter().all(|n| n == "i1"), "{names:?}");

    // Key b now names c: b's old address leaves, c joins.
    tx.send(Change::Insert("b", endpoint(&c))).await.unwrap();
    fleet::wait_until("b moved to c", Duration::from_secs(10), || {
        let m = members(&ch);
        m.len() == 1 && m[0].0 == c
    })
    .await;
    let names = fleet::calls(&mut client, 20).await;
    assert!(names.iter().all(|n| n == "i2"), "{names:?}");
}

/// Any stream of changes can drive the set (here tower's `Change`, so any tower `Discover`);
/// before its first change, calls wait at most the discovery timeout and then fail with
/// UNAVAILABLE saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushed_stream_of_changes_drives_the_set() {
    use tower::discover::Change;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change<u32, Endpoint>, std::io::Error>>(8);
    let ch = BalancedChannel::builder()
        .discover(tokio_stream::wrappers::ReceiverStream::new(rx))
        .discovery_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let started = std::time::Instant::now();
    let err = client
        .unary(Req::default())
        .await
        .expect_err("no instance was ever announced");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("no instance announced"), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        started.elapsed()
    );

    let one = Instance::start("one", Behavior::Ok);
    tx.send(Ok(Change::Insert(1, endpoint(&one.uri()))))
        .await
        .unwrap();
    fleet::wait_until("the instance announced", Duration::from_secs(10), || {
        ch.endpoints().len() == 1
    })
    .await;
    assert_eq!(fleet::calls(&mut client, 5).await, ["one"; 5]);
    // An error of the source keeps the set.
    tx.send(Err(std::io::Error::other("registry hiccup")))
        .await
        .unwrap();
    assert_eq!(fleet::calls(&mut client, 5).await, ["one"; 5]);
}

/// A registry's resync (every key announced again with the endpoint it has, as Kubernetes
/// watchers and most registries do every few seconds) changes nothing: an instance ejected
/// for its failures stays ejected, with its history, through ten resyncs, and no call goes
/// to it; a key that names a new endpoint still moves to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_of_unchanged_endpoints_keeps_an_ejection() {
    use tower::discover::Change;
    let good = Instance::start("good", Behavior::Ok);
    let bad = Instance::start("bad", Behavior::Fail(tonic::Code::Unavailable));
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Change<&str, Endpoint>, std::io::Error>>(8);
    let ch = BalancedChannel::builder()
        .discover(tokio_stream::wrappers::ReceiverStream::new(rx))
        .ejection(
            tonic_balancer::Ejection::default()
                .base_time(Duration::from_secs(600))
                .max_time(Duration::from_secs(600)),
        )
        .build()
        .unwrap();
    let announced = std::sync::atomic::AtomicU64::new(0);
    let resync = |keys: [(&'static str, String); 2]| {
        let (tx, ch, announced) = (tx.clone(), ch.clone(), &announced);
        async move {
            for (key, uri) in keys {
                tx.send(Ok(Change::Insert(key, endpoint(&uri))))
                    .await
                    .unwrap();
            }
            let want = announced.fetch_add(2, std::sync::atomic::Ordering::SeqCst) + 2;
            fleet::wait_until("the changes read", Duration::from_secs(10), || {
                ch.stats().discovery_lookups() >= want
            })
            .await;
        }
    };
    let both = || [("good", good.uri()), ("bad", bad.uri())];
    resync(both()).await;
    let stats_of = |uri: &str| {
        ch.endpoints()
            .into_iter()
            .find(|e| e.uri().trim_end_matches('/') == uri && e.state() != State::Draining)
            .expect("in the set")
    };
    let mut client = FleetClient::new(ch.clone());
    // Its failures gate it out of most calls (they go to the good one), so its fifth failure
    // in a row may take a few hundred calls.
    let start = std::time::Instant::now();
    while stats_of(&bad.uri()).state() != State::Ejected && start.elapsed() < LIMIT {
        let _ = tokio::time::timeout(LIMIT, client.unary(Req::default())).await;
    }
    let ejected = stats_of(&bad.uri());
    assert_eq!(ejected.state(), State::Ejected, "{ejected}");
    for _ in 0..10 {
        resync(both()).await;
    }
    let after = stats_of(&bad.uri());
    assert_eq!(
        after.state(),
        State::Ejected,
        "a resync readmitted it: {after}"
    );
    assert_eq!(
        after.failed(),
        ejected.failed(),
        "its history is gone: {after}"
    );
    assert_eq!(after.ejections(), 1, "{after}");
    assert_eq!(ch.endpoints().len(), 2, "instances were replaced");
    assert_eq!(fleet::calls(&mut client, 20).await, ["good"; 20]);

    // A key that names another endpoint moves to it.
    let other = Instance::start("other", Behavior::Ok);
    resync([("good", good.uri()), ("bad", other.uri())]).await;
    fleet::wait_until("bad moved to other", Duration::from_secs(10), || {
        members(&ch)
            .iter()
            .any(|(u, s, _)| *u == other.uri() && s.is_usable())
    })
    .await;
}

/// Inserting an address that is in the set already, with new settings, replaces its instance:
/// the old one drains (its call in flight finishes on its connection), new calls go to the new
/// one, and `insert` says it replaced (`Ok(false)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserting_an_address_again_replaces_its_instance() {
    let x = Instance::start("x", Behavior::Hold);
    let ch = BalancedChannel::builder().uri(&x.uri()).build().unwrap();
    let mut held = FleetClient::new(ch.clone());
    let held_call = tokio::spawn(async move { held.unary(Req::default()).await });
    fleet::wait_until("a call held on x", Duration::from_secs(10), || {
        x.held() == 1
    })
    .await;

    let renewed = endpoint(&x.uri()).timeout(Duration::from_secs(30));
    assert!(!ch.insert(renewed).unwrap(), "insert must say it replaced");
    let m = members(&ch);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(
        m.iter().any(|(_, s, n)| *s == State::Draining && *n == 1),
        "the old instance drains with its call: {m:?}"
    );
    assert!(
        m.iter().any(|(_, s, n)| s.is_usable() && *n == 0),
        "the new instance is in: {m:?}"
    );
    x.set(Behavior::Ok);
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 5).await;
    let started_on_new: u64 = ch
        .endpoints()
        .iter()
        .filter(|e| e.state() != State::Draining)
        .map(|e| e.started())
        .sum();
    assert_eq!(started_on_new, 5, "new calls go to the new instance");
    x.release(1);
    held_call
        .await
        .unwrap()
        .expect("the held call finishes on the old connection");
    fleet::wait_until("the old instance gone", Duration::from_secs(10), || {
        ch.endpoints().len() == 1
    })
    .await;
}

/// `Builder::connect().await` opens the connections now, as tonic's `Endpoint::connect`: the
/// instances that answer are ready before the first call, one that cannot be reached is out
/// (reconnecting), and when none answers it fails naming each one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_the_connections_now() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let dead = fleet::unreachable_uri();
    let ch = BalancedChannel::builder()
        .uris(fleet.uris())
        .uri(&dead)
        .connect()
        .await
        .unwrap();
    for i in &fleet.instances {
        assert_eq!(fleet::stats(&ch, &i.uri()).state(), State::Ready);
    }
    assert_eq!(fleet::stats(&ch, &dead).state(), State::Failing);
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 20).await;
    assert_eq!(
        fleet::stats(&ch, &dead).started(),
        0,
        "{}",
        fleet::dump(&ch)
    );

    let (a, b) = (fleet::unreachable_uri(), fleet::unreachable_uri());
    let err = BalancedChannel::builder()
        .uri(&a)
        .uri(&b)
        .connect()
        .await
        .expect_err("nothing could be reached");
    let msg = err.to_string();
    assert!(
        matches!(err, tonic_balancer::Error::NoUsableInstance { .. }),
        "{err:?}"
    );
    assert!(msg.contains(a.trim_start_matches("http://")), "{msg}");
    assert!(msg.contains(b.trim_start_matches("http://")), "{msg}");
    assert!(msg.contains("none of the 2 instances"), "{msg}");
    let err = BalancedChannel::builder()
        .uri(&a)
        .connect()
        .await
        .expect_err("nothing could be reached");
    assert!(
        err.to_string()
            .contains("the one instance could not be reached"),
        "{err}"
    );

    // Bad input is refused as build() refuses it.
    let err = BalancedChannel::builder()
        .uri(&a)
        .uri(&a)
        .connect()
        .await
        .expect_err("a duplicate");
    assert!(
        matches!(err, tonic_balancer::Error::DuplicateUri { .. }),
        "{err:?}"
    );
}
