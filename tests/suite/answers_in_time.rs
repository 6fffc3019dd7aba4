//! An answer that arrived before the call's deadline is the call's, however late its caller
//! polls: a caller busy elsewhere when the deadline passes gets the status the server sent (as
//! a grpc-go client gets the status its stream received), not DEADLINE_EXCEEDED. On tokio's
//! paused clock, with instances in memory: the clock moves only when every task waits, so the
//! answer has reached the client before the deadline passes.
use fleet_service as fleet;

use std::future::Future;
use std::time::Duration;

use fleet::memory::MemoryInstance;
use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use fleet::{req, Behavior};
use tonic::Code;
use tonic_balancer::BalancedChannel;

const MS: Duration = Duration::from_millis(1);

fn channel(instance: &MemoryInstance) -> BalancedChannel {
    instance
        .add_to(BalancedChannel::builder())
        .build()
        .expect("a valid channel")
}

/// Polls `call` until `sent` holds (its request reached the server), without letting the clock
/// move: the call is then left alone, as by a caller busy elsewhere.
async fn poll_until<F: Future + Unpin>(call: &mut F, sent: impl Fn() -> bool)
where
    F::Output: std::fmt::Debug,
{
    for _ in 0..10_000 {
        if sent() {
            return;
        }
        assert!(futures::poll!(&mut *call).is_pending(), "over already");
        tokio::task::yield_now().await;
    }
    panic!("the request never reached the server");
}

/// A unary call whose answer arrived in time, polled again only after its deadline: the
/// answer, not DEADLINE_EXCEEDED; and the same for a status (NOT_FOUND).
#[tokio::test(start_paused = true)]
async fn an_answer_there_before_the_deadline_wins_over_a_late_poll() {
    let a = MemoryInstance::start("a", Behavior::Ok);
    let mut client = FleetClient::new(channel(&a));
    client.unary(req(0)).await.unwrap();
    for behavior in [Behavior::Ok, Behavior::Fail(Code::NotFound)] {
        a.set(behavior.clone());
        let before = a.served();
        let mut r = tonic::Request::new(req(1));
        r.set_timeout(100 * MS);
        let mut call = Box::pin(client.unary(r));
        poll_until(&mut call, || a.served() > before).await;
        // The caller is busy for 200 ms; the answer waits for it.
        tokio::time::sleep(200 * MS).await;
        let got = call.await;
        match behavior {
            Behavior::Ok => assert_eq!(got.unwrap().into_inner().id, 1),
            _ => assert_eq!(got.unwrap_err().code(), Code::NotFound),
        }
    }
}

/// A server stream whose replies and status arrived in time, read only after the deadline:
/// every reply, then OK.
#[tokio::test(start_paused = true)]
async fn a_stream_read_late_yields_what_arrived_in_time() {
    let a = MemoryInstance::start("a", Behavior::Ok);
    let mut client = FleetClient::new(channel(&a));
    let mut r = tonic::Request::new(Req {
        id: 1,
        count: 3,
        ..Default::default()
    });
    r.set_timeout(100 * MS);
    let mut stream = client.server_stream(r).await.unwrap().into_inner();
    tokio::time::sleep(200 * MS).await;
    let mut seen = 0;
    while let Some(reply) = stream.message().await.expect("the replies, then OK") {
        assert_eq!(reply.seq, seen);
        seen += 1;
    }
    assert_eq!(seen, 3);
}

/// What had not arrived by the deadline is not waited for: a stream that the server holds
/// open ends with DEADLINE_EXCEEDED after the replies it sent in time.
#[tokio::test(start_paused = true)]
async fn what_had_not_arrived_by_the_deadline_is_not_waited_for() {
    let a = MemoryInstance::start("a", Behavior::HoldStreams);
    let mut client = FleetClient::new(channel(&a));
    let mut r = tonic::Request::new(Req {
        id: 1,
        count: 2,
        ..Default::default()
    });
    r.set_timeout(100 * MS);
    let mut stream = client.server_stream(r).await.unwrap().into_inner();
    tokio::time::sleep(200 * MS).await;
    assert!(stream.message().await.unwrap().is_some());
    assert!(stream.message().await.unwrap().is_some());
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
}
