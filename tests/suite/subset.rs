//! Subsetting with real servers: a client with `subset(k)` connects to and calls k instances
//! only, clients with distinct indices cover the fleet evenly, and a membership change moves
//! about one member of a subset while calls keep succeeding.
use fleet_service as fleet;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Fleet};
use tonic::transport::Endpoint;
use tonic_balancer::{BalancedChannel, Error, State};

const LIMIT: Duration = Duration::from_secs(20);

/// The URIs a channel keeps as instances that take calls (its subset), trailing `/` trimmed.
fn subset(ch: &BalancedChannel) -> BTreeSet<String> {
    ch.endpoints()
        .iter()
        .filter(|e| e.state() != State::Draining)
        .map(|e| e.uri().trim_end_matches('/').to_owned())
        .collect()
}

fn client(uris: &[String], size: usize, index: usize, count: usize) -> BalancedChannel {
    BalancedChannel::builder()
        .uris(uris.iter().map(String::as_str))
        .subset(size)
        .subset_client(index, count)
        .build()
        .expect("valid settings")
}

/// A client with `subset(4)` over 12 instances keeps 4, and its calls reach those 4 only: the
/// other 8 never see a connection. Three clients with indices 0, 1 and 2 of 3 take disjoint
/// subsets that cover the 12 (each instance has exactly 3 × 4 / 12 = 1 client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connects_to_and_calls_its_subset_only() {
    let fleet = Fleet::start(12, Behavior::Ok);
    let uris = fleet.uris();
    let first = client(&uris, 4, 0, 3);
    let mine = subset(&first);
    assert_eq!(mine.len(), 4, "subset: {mine:?}");
    let answered: BTreeSet<String> = fleet::calls(&mut FleetClient::new(first.clone()), 200)
        .await
        .into_iter()
        .collect();
    let by_name: HashMap<&str, &fleet::Instance> =
        fleet.instances.iter().map(|i| (i.name(), i)).collect();
    let answered_uris: BTreeSet<String> = answered
        .iter()
        .map(|n| by_name[n.as_str()].uri().trim_end_matches('/').to_owned())
        .collect();
    assert_eq!(answered_uris, mine, "calls went outside the subset");
    for i in &fleet.instances {
        let inside = mine.contains(i.uri().trim_end_matches('/'));
        assert_eq!(
            i.connections() > 0,
            inside,
            "{} (in the subset: {inside}) accepted {} connections",
            i.name(),
            i.connections()
        );
    }

    // The two other clients: together the three cover every instance once.
    let others = [client(&uris, 4, 1, 3), client(&uris, 4, 2, 3)];
    let mut clients_of: HashMap<String, usize> = HashMap::new();
    for s in [mine].into_iter().chain(others.iter().map(subset)) {
        assert_eq!(s.len(), 4);
        for u in s {
            *clients_of.entry(u).or_default() += 1;
        }
    }
    assert_eq!(clients_of.len(), 12, "instances covered: {clients_of:?}");
    assert!(clients_of.values().all(|&c| c == 1), "{clients_of:?}");
}

/// `Builder::connect` opens connections to the subset only, and says so when none of the
/// subset answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_the_subset_only() {
    let fleet = Fleet::start(10, Behavior::Ok);
    let uris = fleet.uris();
    let ch = BalancedChannel::builder()
        .uris(uris.iter().map(String::as_str))
        .subset(3)
        .subset_client(4, 5)
        .connect()
        .await
        .expect("the subset answers");
    let mine = subset(&ch);
    assert_eq!(mine.len(), 3);
    for e in ch.endpoints() {
        assert_eq!(e.state(), State::Ready, "{e}");
    }
    // The servers count a connection when their accept loop gets to it: wait for the
    // subset's, then check that no other instance has one.
    let inside = |i: &fleet::Instance| mine.contains(i.uri().trim_end_matches('/'));
    fleet::wait_until("the subset's connections accepted", LIMIT, || {
        fleet
            .instances
            .iter()
            .filter(|i| inside(i))
            .all(|i| i.connections() > 0)
    })
    .await;
    for i in fleet.instances.iter().filter(|i| !inside(i)) {
        assert_eq!(i.connections(), 0, "{} is outside the subset", i.name());
    }
}

/// Removing an instance, then replacing the list, while 4 tasks send calls: no call fails;
/// the removed instance leaves the subsets that held it, replaced by one other instance; each
/// client's subset moves by at most two members per instance changed; the subset after the
/// changes is the one a client built with the new list would have (it depends on the list
/// only); and the instances that left a subset close their connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_changes_move_the_subset_minimally_and_calls_keep_succeeding() {
    let mut fleet = Fleet::start(13, Behavior::Delay(Duration::from_millis(2)));
    let extra = fleet.instances.pop().expect("13 instances");
    let uris = fleet.uris();
    let count = 4;
    let channels: Vec<BalancedChannel> = (0..count).map(|c| client(&uris, 4, c, count)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (t, ch) in channels.iter().enumerate() {
        let mut c = FleetClient::new(ch.clone());
        let (stop, failures, done) = (stop.clone(), failures.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut id = (t as u64) << 32;
            while !stop.load(Ordering::SeqCst) {
                id += 1;
                if let Err(e) = c.unary(fleet::req(id)).await {
                    eprintln!("call failed: {e:?}");
                    failures.fetch_add(1, Ordering::SeqCst);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let progress = |n: u64| {
        let done = done.clone();
        let start = done.load(Ordering::SeqCst);
        async move {
            fleet::wait_until("calls flowing", LIMIT, || {
                done.load(Ordering::SeqCst) >= start + n
            })
            .await
        }
    };
    progress(200).await;

    // Remove the first instance of client 0's subset, from every client.
    let before: Vec<BTreeSet<String>> = channels.iter().map(subset).collect();
    let gone = before[0].iter().next().expect("a member").clone();
    for ch in &channels {
        assert!(ch.remove(&gone).unwrap(), "{gone} was in the list");
    }
    let after: Vec<BTreeSet<String>> = channels.iter().map(subset).collect();
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.len(), 4, "the size stays: {a:?}");
        assert!(!a.contains(&gone));
        let moved = b.difference(a).count();
        assert!(moved <= 2, "{moved} members moved: {b:?} -> {a:?}");
    }
    progress(200).await;

    // The list without the removed one and one more, plus a new instance.
    let dropped = uris
        .iter()
        .find(|u| **u != gone && before[1].contains(u.trim_end_matches('/')))
        .expect("another member")
        .clone();
    let mut want: Vec<String> = uris
        .iter()
        .filter(|u| **u != gone && **u != dropped)
        .cloned()
        .collect();
    want.push(extra.uri());
    for (ch, a) in channels.iter().zip(&after) {
        let endpoints = want
            .iter()
            .map(|u| Endpoint::from_shared(u.clone()).unwrap());
        assert_eq!(ch.replace_all(endpoints).unwrap(), (1, 1));
        let now = subset(ch);
        assert_eq!(now.len(), 4);
        assert!(!now.contains(dropped.trim_end_matches('/')));
        let moved = a.difference(&now).count();
        assert!(moved <= 4, "two changes moved {moved}: {a:?} -> {now:?}");
    }
    progress(400).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("caller task");
    }
    assert_eq!(failures.load(Ordering::SeqCst), 0, "calls failed");

    // Determinism: the subset depends on the list and the client's place only.
    for (c, ch) in channels.iter().enumerate() {
        assert_eq!(
            subset(ch),
            subset(&client(&want, 4, c, count)),
            "client {c}"
        );
    }

    // Every instance that is in no subset now has no connection left open (what drained has
    // closed), and every subset member took calls.
    let in_some: BTreeSet<String> = channels.iter().flat_map(subset).collect();
    let all: Vec<&fleet::Instance> = fleet.instances.iter().chain([&extra]).collect();
    fleet::wait_until("left instances closed", LIMIT, || {
        all.iter()
            .filter(|i| !in_some.contains(i.uri().trim_end_matches('/')))
            .all(|i| i.open_connections() == 0)
    })
    .await;
    for i in &all {
        if in_some.contains(i.uri().trim_end_matches('/')) {
            assert!(
                i.served() > 0,
                "{} is in a subset and got no call",
                i.name()
            );
        }
    }
    for ch in &channels {
        assert_eq!(fleet::total_in_flight(ch), 0, "{}", fleet::dump(ch));
    }
}

/// Bad subsetting settings are refused by `build()`, naming the setting.
#[tokio::test]
async fn bad_settings_are_refused() {
    let named = |b: tonic_balancer::Builder| match b.build() {
        Err(Error::InvalidSetting { name, .. }) => name,
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("built"),
    };
    let base = || BalancedChannel::builder().uri("http://127.0.0.1:1");
    assert_eq!(named(base().subset(0).subset_client(0, 1)), "subset");
    assert_eq!(named(base().subset(2)), "subset_client");
    assert_eq!(named(base().subset(2).subset_client(5, 5)), "subset_client");
    assert_eq!(named(base().subset(2).subset_client(0, 0)), "subset_client");
    assert_eq!(named(base().subset_client(0, 2)), "subset");
    assert!(base().subset(2).subset_client(1, 2).build().is_ok());
}

/// A discovery source's answers go through the subset too: a client of a `Resolve` source
/// naming 8 instances keeps 3 and calls those only; when the source drops one of them, the
/// subset takes another and stays at 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_are_subset() {
    struct Addresses(Arc<std::sync::Mutex<Vec<std::net::SocketAddr>>>);
    impl tonic_balancer::Resolve for Addresses {
        fn resolve(
            &self,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<std::net::SocketAddr>, tower::BoxError>>
                    + Send
                    + '_,
            >,
        > {
            let addrs = self.0.lock().unwrap().clone();
            Box::pin(async move { Ok(addrs) })
        }
        fn name(&self) -> String {
            "test list".into()
        }
    }
    let fleet = Fleet::start(8, Behavior::Ok);
    let addrs = Arc::new(std::sync::Mutex::new(
        fleet.instances.iter().map(|i| i.addr).collect::<Vec<_>>(),
    ));
    let ch = BalancedChannel::builder()
        .resolver(Addresses(addrs.clone()))
        .discovery_interval(Duration::from_millis(50))
        .subset(3)
        .subset_client(1, 2)
        .build()
        .unwrap();
    fleet::calls(&mut FleetClient::new(ch.clone()), 60).await;
    let mine = subset(&ch);
    assert_eq!(mine.len(), 3, "{mine:?}");
    for i in &fleet.instances {
        let inside = mine.contains(i.uri().trim_end_matches('/'));
        assert_eq!(i.served() > 0, inside, "{} served {}", i.name(), i.served());
        assert_eq!(i.connections() > 0, inside, "{}", i.name());
    }
    let gone = mine.iter().next().unwrap().clone();
    addrs
        .lock()
        .unwrap()
        .retain(|a| format!("http://{a}") != gone);
    fleet::wait_until("the source's new answer applied", LIMIT, || {
        let now = subset(&ch);
        now.len() == 3 && !now.contains(&gone)
    })
    .await;
    let now = subset(&ch);
    assert!(mine.difference(&now).count() <= 2, "{mine:?} -> {now:?}");
    fleet::calls(&mut FleetClient::new(ch.clone()), 60).await;
}

/// When every instance of the subset is down, the subset stays the only set (the documented
/// decision): calls fail with UNAVAILABLE and no connection is opened to the instances
/// outside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subset_all_down_fails_calls_without_spilling_over() {
    let mut fleet = Fleet::start(6, Behavior::Ok);
    let uris = fleet.uris();
    let ch = client(&uris, 2, 0, 3);
    let mine = subset(&ch);
    assert_eq!(mine.len(), 2);
    fleet::calls(&mut FleetClient::new(ch.clone()), 10).await;
    for i in fleet.instances.iter_mut() {
        if mine.contains(i.uri().trim_end_matches('/')) {
            i.stop();
        }
    }
    let mut c = FleetClient::new(ch.clone());
    for id in 0..5 {
        let err = c
            .unary(fleet::req(id))
            .await
            .expect_err("every instance of the subset is down");
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    }
    assert_eq!(subset(&ch), mine, "the subset did not change");
    for i in &fleet.instances {
        if !mine.contains(i.uri().trim_end_matches('/')) {
            assert_eq!(i.connections(), 0, "{} got a connection", i.name());
        }
    }
    assert_eq!(fleet::total_in_flight(&ch), 0);
}

/// `insert` with subsetting: new settings for a member of the subset replace its instance (the
/// old one drains, finishing its call), and an endpoint that falls outside the subset is listed
/// but gets no instance, so no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_renews_a_member_and_keeps_outsiders_unconnected() {
    let fleet = Fleet::start(6, Behavior::Hold);
    let uris = fleet.uris();
    let ch = client(&uris, 2, 0, 3);
    let mine = subset(&ch);
    let member = mine.iter().next().unwrap().clone();
    let inst = fleet
        .instances
        .iter()
        .find(|i| i.uri().trim_end_matches('/') == member)
        .unwrap();
    // One call held on the member (the only call: it goes to an instance of the subset; send
    // calls until the member has one).
    let mut held = Vec::new();
    while inst.held() == 0 {
        let mut c = FleetClient::new(ch.clone());
        held.push(tokio::spawn(async move { c.unary(fleet::req(1)).await }));
        let n = held.len();
        fleet::wait_until("the call held", LIMIT, || fleet.held() == n).await;
    }
    let renewed = Endpoint::from_shared(member.clone())
        .unwrap()
        .timeout(Duration::from_secs(30));
    assert!(!ch.insert(renewed).unwrap(), "the URI was in the list");
    let listed: Vec<_> = ch
        .endpoints()
        .into_iter()
        .filter(|e| e.uri().trim_end_matches('/') == member)
        .map(|e| (e.state(), e.in_flight()))
        .collect();
    assert_eq!(listed.len(), 2, "old and new instance: {listed:?}");
    assert!(listed.contains(&(State::Draining, 1)), "{listed:?}");
    assert_eq!(subset(&ch), mine, "the subset kept its members");

    // An outsider: inserted again (new settings), it stays outside with no connection.
    let outsider = uris
        .iter()
        .find(|u| !mine.contains(u.trim_end_matches('/')))
        .unwrap();
    assert!(!ch
        .insert(Endpoint::from_shared(outsider.clone()).unwrap())
        .unwrap());
    assert_eq!(subset(&ch), mine);

    fleet.release_all(held.len());
    for h in held {
        h.await.unwrap().expect("the held call ends well");
    }
    fleet::wait_until("the old instance drained", LIMIT, || {
        ch.endpoints().iter().all(|e| e.state() != State::Draining)
    })
    .await;
    for i in &fleet.instances {
        if !mine.contains(i.uri().trim_end_matches('/')) {
            assert_eq!(i.connections(), 0, "{}", i.name());
        }
    }
}
