//! Out-of-band load reports (ORCA, gRFC A51) end to end: tonic servers with `OobService`, a
//! channel with `load_reports_out_of_band`, reports that arrive without any call and steer the
//! least-pending pick; a server without the service left alone; the stream ended with its
//! instance.
#![cfg(feature = "orca")]

use fleet_service as fleet;

use std::time::Duration;

use fleet::pb::fleet_client::FleetClient;
use fleet::{stats, wait_until, Behavior, Instance, ServerOptions};
use tonic_balancer::orca::OrcaHandle;
use tonic_balancer::{Backoff, BalancedChannel, ServedBy, Strategy};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(30);

/// An instance that reports its load on its responses and, with `oob`, out of band (at most
/// every 50 ms).
fn reporting(name: &str, behavior: Behavior, oob: bool) -> (Instance, OrcaHandle) {
    let handle = OrcaHandle::new();
    let inst = Instance::start_with(
        name,
        "127.0.0.1:0".parse().unwrap(),
        behavior,
        ServerOptions {
            orca: Some(handle.clone()),
            orca_oob: oob.then_some(Duration::from_millis(50)),
            ..Default::default()
        },
    );
    (inst, handle)
}

/// A channel with out-of-band reports every 100 ms, reconnecting fast.
fn oob_channel(uris: &[String]) -> BalancedChannel {
    BalancedChannel::builder()
        .uris(uris)
        .strategy(Strategy::LeastPending)
        .backoff(Backoff::default().initial(Duration::from_millis(20)))
        .load_reports_out_of_band(Duration::from_millis(100))
        .build()
        .unwrap()
}

fn served_by(resp: &tonic::Response<fleet::pb::Reply>) -> String {
    resp.extensions()
        .get::<ServedBy>()
        .expect("ServedBy")
        .uri()
        .trim_end_matches('/')
        .to_owned()
}

/// A channel that has sent nothing gets an instance's reports anyway, through the
/// out-of-band stream: the calls another client holds there (not counting the report stream
/// itself, on either side); and its least-pending pick, seeing them, sends its own calls to the
/// idle instance.
#[tokio::test]
async fn reports_arrive_without_calls_and_steer_the_pick() {
    let (busy, _hb) = reporting("busy", Behavior::Hold, true);
    let (idle, _hi) = reporting("idle", Behavior::Ok, true);
    // Another client, without reports, holds 6 calls on `busy`.
    let other = BalancedChannel::from_static([busy.uri()]).unwrap();
    let mut held = Vec::new();
    for i in 0..6 {
        let mut c = FleetClient::new(other.clone());
        held.push(tokio::spawn(async move { c.unary(fleet::req(i)).await }));
    }
    wait_until("6 calls held on busy", LIMIT, || busy.held() == 6).await;

    let ch = oob_channel(&[busy.uri(), idle.uri()]);
    wait_until("a report of busy's 6 calls, out of band", LIMIT, || {
        stats(&ch, &busy.uri())
            .load_report()
            .and_then(|r| r.calls_in_flight())
            == Some(6.0)
    })
    .await;
    wait_until("a report from idle", LIMIT, || {
        stats(&ch, &idle.uri()).load_report().is_some()
    })
    .await;
    assert_eq!(stats(&ch, &busy.uri()).started(), 0, "no call was made");
    assert_eq!(
        stats(&ch, &busy.uri()).in_flight(),
        0,
        "the stream is no call"
    );
    assert_eq!(busy.oob_open(), 1);

    // Without the reports this channel counts 0 on both: its calls would go to both. With
    // them, busy counts 6 and every call goes to idle.
    for i in 0..8 {
        let resp = FleetClient::new(ch.clone())
            .unary(fleet::req(100 + i))
            .await
            .expect("the call succeeds");
        assert_eq!(served_by(&resp), idle.uri(), "call {i}");
    }
    busy.release(6);
    for h in held {
        h.await.unwrap().expect("held call released");
    }
}

/// A server that does not serve out-of-band reports answers UNIMPLEMENTED once: the channel
/// works, does not ask again on that connection (however short its backoff), and asks again
/// after the connection is opened again, then no more.
#[tokio::test]
async fn a_server_without_the_service_is_asked_once_per_connection() {
    let (mut plain, _h) = reporting("plain", Behavior::Ok, false);
    let ch = oob_channel(&[plain.uri()]);
    wait_until("the stream asked for", LIMIT, || plain.oob_requests() >= 1).await;
    for i in 0..20 {
        FleetClient::new(ch.clone())
            .unary(fleet::req(i))
            .await
            .expect("calls work");
    }
    // Twenty backoffs of 20 ms and more would have passed by now if it asked again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(plain.oob_requests(), 1);
    assert!(
        stats(&ch, &plain.uri()).load_report().is_some(),
        "per-call reports still read"
    );

    // A new connection: asked once more.
    plain.stop();
    plain.restart();
    let deadline = std::time::Instant::now() + LIMIT;
    loop {
        let mut client = FleetClient::new(ch.clone());
        let call = client.unary(fleet::req(99));
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), call).await {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no call went through");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_until("asked again on the new connection", LIMIT, || {
        plain.oob_requests() >= 2
    })
    .await;
    // (More than once if the connection went through several states while the server was
    // down.) Then left alone again.
    let asked = plain.oob_requests();
    for i in 0..20 {
        FleetClient::new(ch.clone())
            .unary(fleet::req(200 + i))
            .await
            .expect("calls work");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(plain.oob_requests(), asked);
}

/// Removing an instance ends its report stream at once, even while a call of the channel
/// keeps the instance alive (draining); dropping the channel ends the others.
#[tokio::test]
async fn the_stream_ends_when_the_instance_is_removed() {
    let (a, _ha) = reporting("a", Behavior::Hold, true);
    let (b, _hb) = reporting("b", Behavior::Hold, true);
    let ch = oob_channel(&[a.uri(), b.uri()]);
    wait_until("both streams open", LIMIT, || {
        a.oob_open() == 1 && b.oob_open() == 1
    })
    .await;
    // A call held on one of them: that one drains with it.
    let mut c = FleetClient::new(ch.clone());
    let held = tokio::spawn(async move { c.unary(fleet::req(1)).await });
    wait_until("a call held", LIMIT, || a.held() + b.held() == 1).await;
    let (gone, kept) = if a.held() == 1 { (&a, &b) } else { (&b, &a) };
    assert!(ch.remove(&gone.uri()).unwrap());
    wait_until("the removed instance's stream closed", LIMIT, || {
        gone.oob_open() == 0
    })
    .await;
    assert_eq!(gone.held(), 1, "the draining call goes on");
    assert_eq!(kept.oob_open(), 1);
    gone.release(1);
    held.await.unwrap().expect("the held call ends well");

    // Dropping the channel ends the other.
    drop(ch);
    wait_until("the other stream closed", LIMIT, || kept.oob_open() == 0).await;
}

/// A zero interval is refused when the channel is built, naming the setting.
#[tokio::test]
async fn a_zero_interval_is_refused() {
    let err = BalancedChannel::builder()
        .uri("http://127.0.0.1:1")
        .load_reports_out_of_band(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("load_reports_out_of_band"),
        "{err}"
    );
}
