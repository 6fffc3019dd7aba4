//! Membership that changes: runtime inserts and removals under load, replace_all, and DNS
//! discovery against a real DNS server on loopback whose records the test changes.
use fleet_service as fleet;

#[cfg(feature = "hickory-dns")]
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "hickory-dns")]
use fleet::dns::{resolver_for, DnsServer};
use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet};
use tonic::transport::Endpoint;
use tonic_balancer::{BalancedChannel, State};

/// Instances added and removed while 4 tasks send calls: no call fails, a removed instance
/// gets no new calls, its calls in flight complete, and every count ends at zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_and_remove_under_load() {
    let fleet = Fleet::start(6, Behavior::Delay(Duration::from_millis(5)));
    let uris = fleet.uris();
    let ch = BalancedChannel::from_static(&uris[..3]).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..4u64 {
        let mut client = FleetClient::new(ch.clone());
        let (stop, failures, done) = (stop.clone(), failures.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut id = t << 32;
            while !stop.load(Ordering::SeqCst) {
                id += 1;
                if let Err(e) = client
                    .unary(Req {
                        id,
                        ..Default::default()
                    })
                    .await
                {
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
            fleet::wait_until("calls flowing", Duration::from_secs(20), || {
                done.load(Ordering::SeqCst) >= start + n
            })
            .await
        }
    };
    progress(100).await;
    for u in &uris[3..] {
        assert!(ch
            .insert(Endpoint::from_shared(u.clone()).unwrap())
            .unwrap());
    }
    progress(300).await;
    for i in &fleet.instances[3..] {
        assert!(i.served() > 0, "added instance {} got no calls", i.name());
    }
    // Remove three while calls flow.
    for u in &uris[..3] {
        assert!(ch.remove(u).unwrap());
    }
    assert!(!ch.remove(&uris[0]).unwrap(), "removed twice");
    // Calls routed before the removal may still be in flight (some not yet at the server);
    // they hold their instance, which stays listed as draining until the last one ends. After
    // that, none arrive.
    fleet::wait_until("removed instances drained", Duration::from_secs(20), || {
        let listed = ch.endpoints();
        uris[..3]
            .iter()
            .all(|u| !listed.iter().any(|e| e.uri() == u))
    })
    .await;
    let frozen: Vec<u64> = fleet.instances[..3].iter().map(|i| i.served()).collect();
    progress(300).await;
    let after: Vec<u64> = fleet.instances[..3].iter().map(|i| i.served()).collect();
    assert_eq!(frozen, after, "removed instances got new calls");
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "calls failed during membership changes"
    );
    fleet::wait_until("counts at zero", Duration::from_secs(10), || {
        fleet::total_in_flight(&ch) == 0
    })
    .await;
    assert_eq!(
        ch.endpoints()
            .iter()
            .filter(|e| e.state() != State::Draining)
            .count(),
        3
    );
}

/// A removed instance with a call in flight shows as draining and finishes that call; named
/// again by `replace_all` (a discovery answer) while it drains, it is reused (same record: its
/// call in flight and its counters go on) and takes calls again; inserted once it has drained,
/// it is a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_instance_drains_and_can_come_back() {
    let fleet = Fleet::start(2, Behavior::Hold);
    let uris = fleet.uris();
    let ch = BalancedChannel::from_static(&uris).unwrap();
    let stats_of = |uri: &str| {
        let listed: Vec<_> = ch
            .endpoints()
            .into_iter()
            .filter(|e| e.uri().trim_end_matches('/') == uri)
            .collect();
        assert!(listed.len() <= 1, "listed twice: {listed:?}");
        listed.into_iter().next()
    };
    let mut client = FleetClient::new(ch.clone());
    let held = tokio::spawn(async move { client.unary(Req::default()).await });
    fleet::wait_until("call held", Duration::from_secs(10), || fleet.held() == 1).await;
    let busy = fleet.instances.iter().position(|i| i.held() == 1).unwrap();
    let inst = &fleet.instances[busy];
    let started = stats_of(&uris[busy]).unwrap().started();
    assert!(started >= 1);
    assert!(ch.remove(&uris[busy]).unwrap());
    let draining = stats_of(&uris[busy]).expect("draining instance listed");
    assert_eq!(draining.state(), State::Draining);
    assert_eq!(draining.in_flight(), 1);

    // Named again while its held call keeps it draining (the set replaced, as a discovery
    // answer does): the same instance comes back, with its connection.
    let everyone = uris
        .iter()
        .map(|u| Endpoint::from_shared(u.clone()).unwrap());
    assert_eq!(ch.replace_all(everyone).unwrap(), (1, 0));
    let back = stats_of(&uris[busy]).expect("re-added instance listed");
    assert!(back.state().is_usable(), "{back}");
    assert_eq!(back.in_flight(), 1, "not the same instance: {back}");
    assert_eq!(back.started(), started, "not the same instance: {back}");
    assert_eq!(ch.endpoints().len(), 2, "{:?}", ch.endpoints());
    inst.release(1);
    let reply = held
        .await
        .unwrap()
        .expect("a draining instance finishes its call");
    assert_eq!(reply.into_inner().instance, inst.name());
    // Its call over, it stays in the set and takes calls again.
    for i in &fleet.instances {
        i.set(Behavior::Ok);
    }
    let names = fleet::calls(&mut FleetClient::new(ch.clone()), 40).await;
    assert!(names.iter().any(|n| n == inst.name()), "{names:?}");
    let again = stats_of(&uris[busy]).expect("still listed");
    assert!(again.started() > started, "{again}");
    assert_eq!(again.in_flight(), 0, "{again}");

    // Removed again, and re-added only once it has drained: a new instance.
    assert!(ch.remove(&uris[busy]).unwrap());
    fleet::wait_until("drained", Duration::from_secs(10), || {
        stats_of(&uris[busy]).is_none()
    })
    .await;
    assert!(ch
        .insert(Endpoint::from_shared(uris[busy].clone()).unwrap())
        .unwrap());
    let fresh = stats_of(&uris[busy]).expect("re-added instance listed");
    assert_eq!(fresh.started(), 0, "a drained instance came back: {fresh}");
    assert_eq!(fresh.state(), State::Connecting, "{fresh}");
    let served = inst.served();
    let names = fleet::calls(&mut FleetClient::new(ch.clone()), 40).await;
    assert!(names.iter().any(|n| n == inst.name()), "{names:?}");
    assert!(inst.served() > served);

    // Then replace_all with the other one only.
    assert_eq!(ch.endpoints().len(), 2);
    let (added, removed) = ch
        .replace_all([Endpoint::from_shared(uris[1 - busy].clone()).unwrap()])
        .unwrap();
    assert_eq!((added, removed), (0, 1));
    fleet::wait_until("replaced", Duration::from_secs(10), || {
        ch.endpoints().len() == 1
    })
    .await;
}

/// The channel follows the records: adds, removes; a failing lookup keeps the last set.
/// Every instance is on its own loopback address (127.0.0.x) with one shared port, as pods
/// behind a headless Service.
#[cfg(feature = "hickory-dns")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_discovery_follows_the_records() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ips: Vec<Ipv4Addr> = (2..5).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let servers: Vec<fleet::Instance> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            fleet::Instance::start_at(
                &format!("d{i}"),
                SocketAddr::new((*ip).into(), port),
                Behavior::Ok,
            )
        })
        .collect();
    let dns = DnsServer::start("fleet.test.").await;
    dns.set(&ips[..2]);
    let settings = resolver_for(&dns);
    let ch = BalancedChannel::builder()
        .dns_with(&format!("fleet.test.:{port}"), settings)
        .discovery_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    // The first call waits for the first answer.
    client.unary(Req::default()).await.unwrap();
    let uris = |ch: &BalancedChannel| {
        let mut v: Vec<String> = ch
            .endpoints()
            .iter()
            .filter(|e| e.state() != State::Draining)
            .map(|e| e.uri().to_owned())
            .collect();
        v.sort();
        v
    };
    let want = |ips: &[Ipv4Addr]| {
        let mut v: Vec<String> = ips.iter().map(|ip| format!("http://{ip}:{port}")).collect();
        v.sort();
        v
    };
    assert_eq!(uris(&ch), want(&ips[..2]));

    dns.set(&ips);
    fleet::wait_until("third address added", Duration::from_secs(10), || {
        uris(&ch) == want(&ips)
    })
    .await;
    fleet::calls(&mut client, 60).await;
    assert!(servers[2].served() > 0, "the added instance got no calls");

    dns.set(&ips[1..]);
    fleet::wait_until("first address removed", Duration::from_secs(10), || {
        uris(&ch) == want(&ips[1..])
    })
    .await;
    let frozen = servers[0].served();
    fleet::calls(&mut client, 60).await;
    assert_eq!(servers[0].served(), frozen, "a removed instance got calls");

    // Lookups fail: the last set stays and calls go on.
    dns.fail.store(true, Ordering::SeqCst);
    let q = dns.queries.load(Ordering::SeqCst);
    fleet::wait_until("a few failed lookups", Duration::from_secs(10), || {
        dns.queries.load(Ordering::SeqCst) >= q + 3
    })
    .await;
    assert_eq!(uris(&ch), want(&ips[1..]));
    fleet::calls(&mut client, 20).await;
    // And an empty answer keeps it too.
    dns.fail.store(false, Ordering::SeqCst);
    dns.set(&[]);
    let q = dns.queries.load(Ordering::SeqCst);
    fleet::wait_until("a few empty answers", Duration::from_secs(10), || {
        dns.queries.load(Ordering::SeqCst) >= q + 3
    })
    .await;
    assert_eq!(uris(&ch), want(&ips[1..]));
    client.unary(Req::default()).await.unwrap();
}

/// Without settings of its own, DNS discovery asks the system's resolver (getaddrinfo, which
/// reads /etc/hosts): `localhost` becomes the instance on 127.0.0.1 (and [::1] where the host
/// maps it, which refuses here and is routed around), and calls reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_through_the_system_resolver() {
    let fleet = Fleet::start(1, Behavior::Ok);
    let port = fleet.instances[0].addr.port();
    let ch = BalancedChannel::builder()
        .dns(&format!("localhost:{port}"))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 20).await;
    assert!(names.iter().all(|n| n == "i0"), "{names:?}");
    let uris: Vec<String> = ch.endpoints().iter().map(|e| e.uri().to_owned()).collect();
    assert!(
        uris.contains(&format!("http://127.0.0.1:{port}")),
        "localhost did not become 127.0.0.1:{port}: {uris:?}"
    );
}

/// A name that never resolves: the set stays empty and calls fail with UNAVAILABLE, naming
/// the DNS name, once the first lookup has answered.
#[cfg(feature = "hickory-dns")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_name_without_answer_fails_calls_with_unavailable() {
    let dns = DnsServer::start("other.test.").await;
    let settings = resolver_for(&dns);
    let ch = BalancedChannel::builder()
        .dns_with("missing.test.:50051", settings)
        .discovery_interval(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch);
    for _ in 0..3 {
        let err = tokio::time::timeout(Duration::from_secs(10), client.unary(Req::default()))
            .await
            .expect("call never hangs")
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
        assert!(err.message().contains("missing.test."), "{}", err.message());
    }
}

#[tokio::test]
async fn bad_dns_targets_are_refused() {
    for bad in [
        "no-port",
        "host:notaport",
        ":50051",
        "ftp://host:1",
        "host:0",
        "host:99999",
        "dns:///",
    ] {
        let err = BalancedChannel::builder().dns(bad).build().unwrap_err();
        assert!(err.to_string().contains(bad), "{bad}: {err}");
    }
    // Ports that no server can have, in instance URIs too.
    for bad in ["http://127.0.0.1:0", "http://127.0.0.1:99999"] {
        let err = BalancedChannel::from_static([bad]).unwrap_err();
        assert!(err.to_string().contains(bad), "{bad}: {err}");
    }
}

/// gRPC's target strings, as grpc-go users write them: DNS (`dns:///`, no scheme), a list of
/// addresses (`ipv4:`), each served by real instances; a malformed one names the accepted forms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_target_strings_name_the_instances() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let ports: Vec<u16> = fleet.instances.iter().map(|i| i.addr.port()).collect();
    let list = format!("ipv4:127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]);
    let ch = BalancedChannel::for_target(&list).unwrap();
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 20).await;
    for name in ["i0", "i1"] {
        assert!(names.iter().any(|n| n == name), "{list}: {names:?}");
    }
    for target in [
        format!("dns:///localhost:{}", ports[0]),
        format!("dns:localhost:{}", ports[0]),
        format!("localhost:{}", ports[0]),
    ] {
        let ch = BalancedChannel::builder().target(&target).build().unwrap();
        let mut client = FleetClient::new(ch.clone());
        let names = fleet::calls(&mut client, 10).await;
        assert!(names.iter().all(|n| n == "i0"), "{target}: {names:?}");
        // So do `from_static`'s URIs, with a scheme (a bare `host:port` is no URI there)...
        if target.starts_with("dns:") {
            let ch = BalancedChannel::from_static([&target]).unwrap();
            let names = fleet::calls(&mut FleetClient::new(ch), 5).await;
            assert!(names.iter().all(|n| n == "i0"), "{target}: {names:?}");
        }
        // ...and `dns`, gRPC's spelling.
        let ch = BalancedChannel::builder().dns(&target).build();
        assert!(ch.is_ok() || !target.starts_with("dns:"), "{target}");
    }
    let e = BalancedChannel::for_target("ipv4:127.0.0.1:http").unwrap_err();
    assert!(e.to_string().contains("accepted: `dns:"), "{e}");
}

/// Instances given one by one and a source that answers with the whole set (DNS, a resolver):
/// the first answer would replace them, so the builder refuses the pair, naming the source.
#[tokio::test]
async fn uris_beside_a_whole_set_source_are_refused() {
    let e = BalancedChannel::builder()
        .uri("http://127.0.0.1:50051")
        .dns("localhost:50051")
        .build()
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("dns") && msg.contains("http://127.0.0.1:50051") && msg.contains("discover"),
        "{msg}"
    );
}

/// Slow start: a newly added instance's share ramps up over the window instead of jumping to
/// its fair share at once. Four tasks send calls of 10 ms (well above scheduling noise) to four
/// instances; a fifth joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_start_ramps_a_new_instance_up() {
    // Equal instances, served on the test's runtime: on a busy machine a thread of its own can
    // be served the CPU late for a while, and least pending rightly gates an instance that
    // answers slower (once, 7% of the calls after the window for the newcomer so served).
    let fleet =
        fleet::local::LocalFleet::start(5, Behavior::Delay(Duration::from_millis(10))).await;
    let uris = fleet.uris();
    let window = Duration::from_secs(6);
    // Least pending, whose turns share the calls evenly among equals: this tests the ramp. (The
    // default gates an instance for 200 usual call times after an answer twice as slow as
    // usual; on a loaded machine one such answer took the newcomer to 8% after its window.)
    let b = BalancedChannel::builder()
        .strategy(tonic_balancer::Strategy::LeastPending)
        .slow_start(window)
        .uris(&uris[..4]);
    let ch = b.build().unwrap();
    let newcomer = fleet.instances[4].name.clone();
    // Sends calls from 4 tasks until `until`; returns (calls, calls served by the newcomer).
    let burst = |until: std::time::Instant| {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let mut client = FleetClient::new(ch.clone());
                let newcomer = newcomer.clone();
                tokio::spawn(async move {
                    let (mut all, mut new) = (0u64, 0u64);
                    while std::time::Instant::now() < until {
                        let r = client.unary(Req::default()).await.unwrap().into_inner();
                        all += 1;
                        new += u64::from(r.instance == newcomer);
                    }
                    (all, new)
                })
            })
            .collect();
        async move {
            let mut sum = (0, 0);
            for t in tasks {
                let (a, n) = t.await.unwrap();
                sum = (sum.0 + a, sum.1 + n);
            }
            sum
        }
    };
    burst(std::time::Instant::now() + Duration::from_millis(300)).await;
    ch.insert(Endpoint::from_shared(uris[4].clone()).unwrap())
        .unwrap();
    let added = std::time::Instant::now();
    // The first tenth of the window: the newcomer takes part in at most 10% of the picks.
    let (early, early_new) = burst(added + window / 10).await;
    tokio::time::sleep_until((added + window + Duration::from_millis(100)).into()).await;
    let (late, late_new) = burst(std::time::Instant::now() + Duration::from_millis(1000)).await;
    let early_share = early_new as f64 / early as f64;
    let late_share = late_new as f64 / late as f64;
    assert!(
        early >= 20 && late >= 20,
        "too few calls to judge: {early}, {late}"
    );
    assert!(
        early_share < 0.12,
        "newcomer took {early_share:.3} of {early} calls in the first tenth of its slow start"
    );
    assert!(
        late_share > 0.12,
        "newcomer took only {late_share:.3} of {late} calls after its slow start"
    );
}

/// The handle is safe from any thread: an instance inserted from a thread outside the runtime
/// gets its connection on the channel's runtime and takes calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_from_a_thread_outside_the_runtime() {
    let fleet = Fleet::start(2, Behavior::Ok);
    let uris = fleet.uris();
    let ch = BalancedChannel::from_static(&uris[..1]).unwrap();
    let handle = ch.clone();
    let second = uris[1].clone();
    std::thread::spawn(move || {
        assert!(handle
            .insert(Endpoint::from_shared(second).unwrap())
            .unwrap());
    })
    .join()
    .expect("insert from a plain thread");
    let mut client = FleetClient::new(ch.clone());
    let names = fleet::calls(&mut client, 40).await;
    assert!(
        names.iter().any(|n| n == fleet.instances[1].name()),
        "{names:?}"
    );
}

/// A and AAAA records both become instances: one on 127.0.0.2, one on [::1], same port.
#[cfg(feature = "hickory-dns")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_discovery_takes_a_and_aaaa_records() {
    use std::net::{IpAddr, Ipv6Addr};
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let v4 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    let servers = [
        fleet::Instance::start_at("v4", SocketAddr::new(v4, port), Behavior::Ok),
        fleet::Instance::start_at("v6", SocketAddr::new(v6, port), Behavior::Ok),
    ];
    let dns = DnsServer::start("dual.test.").await;
    dns.set_ips(&[v4, v6]);
    let settings = resolver_for(&dns);
    let ch = BalancedChannel::builder()
        .dns_with(&format!("dual.test.:{port}"), settings)
        .build()
        .unwrap();
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 1).await;
    let mut listed: Vec<String> = ch.endpoints().iter().map(|e| e.uri().to_owned()).collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            format!("http://127.0.0.2:{port}"),
            format!("http://[::1]:{port}")
        ]
    );
    let names = fleet::calls(&mut client, 40).await;
    for s in &servers {
        assert!(
            names.iter().any(|n| n == s.name()),
            "{} got no calls: {names:?}",
            s.name()
        );
    }
}
