//! What the channel tells its callers: which instance served a call, and which statuses it
//! made itself (a typed source) rather than an instance answering them.
use fleet_service as fleet;

use std::error::Error as _;
use std::time::Duration;

use fleet::pb::{fleet_client::FleetClient, Req};
use fleet::{Behavior, Fleet, Instance};
use tonic::Code;
use tonic_balancer::{BalancedChannel, Error, ServedBy};

/// The balancer's own error behind a status, if it made the status.
fn made_by_balancer(status: &tonic::Status) -> Option<&Error> {
    status.source().and_then(|s| s.downcast_ref::<Error>())
}

/// Every response, unary or streaming, names the instance that served it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_names_the_instance_that_served_it() {
    let fleet = Fleet::start(3, Behavior::Ok);
    let ch = BalancedChannel::from_static(fleet.uris()).unwrap();
    let mut client = FleetClient::new(ch);
    for id in 0..30 {
        let resp = client
            .unary(Req {
                id,
                ..Default::default()
            })
            .await
            .unwrap();
        let served_by = resp.extensions().get::<ServedBy>().expect("a ServedBy");
        let named = fleet.by_name(&resp.get_ref().instance);
        assert_eq!(served_by.uri().trim_end_matches('/'), named.uri());
    }
    let resp = client
        .server_stream(Req {
            count: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    let served_by = resp
        .extensions()
        .get::<ServedBy>()
        .cloned()
        .expect("a ServedBy");
    let mut stream = resp.into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(
        served_by.uri().trim_end_matches('/'),
        fleet.by_name(&first.instance).uri()
    );
}

/// Statuses the channel makes carry its error as their source; an instance's own answer does
/// not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_the_channel_makes_say_so() {
    // Nothing usable.
    let ch = BalancedChannel::from_static([fleet::unreachable_uri()]).unwrap();
    let mut client = FleetClient::new(ch);
    let mut last = None;
    for _ in 0..3 {
        last = Some(client.unary(Req::default()).await.unwrap_err());
    }
    let status = last.unwrap();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        matches!(
            made_by_balancer(&status),
            Some(Error::NoUsableInstance { .. } | Error::Unavailable { .. })
        ),
        "{status:?}"
    );

    // The deadline.
    let hang = Instance::start("hang", Behavior::Hang);
    let ch = BalancedChannel::from_static([hang.uri()]).unwrap();
    let mut client = FleetClient::new(ch);
    let mut req = tonic::Request::new(Req::default());
    req.set_timeout(Duration::from_millis(100));
    let status = client.unary(req).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(made_by_balancer(&status), Some(&Error::DeadlineExceeded));

    // An instance's answer is the instance's.
    let failing = Instance::start("failing", Behavior::Fail(Code::Unavailable));
    let ch = BalancedChannel::from_static([failing.uri()]).unwrap();
    let mut client = FleetClient::new(ch);
    let status = client.unary(Req::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(status.message().contains("scripted to fail"), "{status:?}");
    assert!(made_by_balancer(&status).is_none(), "{status:?}");
}

/// A connection that breaks under a call: the status is the balancer's, and its source chain
/// reaches the transport's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_keeps_its_cause() {
    let mut inst = Instance::start("doomed", Behavior::Hold);
    let ch = BalancedChannel::from_static([inst.uri()]).unwrap();
    let mut client = FleetClient::new(ch);
    let call = tokio::spawn(async move { client.unary(Req::default()).await });
    fleet::wait_until("the call held", Duration::from_secs(10), || {
        inst.held() == 1
    })
    .await;
    inst.stop();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let Some(Error::Unavailable { uri, source, .. }) = made_by_balancer(&status) else {
        panic!("not the balancer's: {status:?}");
    };
    assert_eq!(uri.trim_end_matches('/'), inst.uri());
    assert!(
        source.is_some(),
        "the transport's error is kept: {status:?}"
    );
}
