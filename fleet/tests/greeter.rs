//! What a user of the fleet writes: resilience tests of a client of their own service (tonic's
//! helloworld `Greeter`, with a proto of its own), each in a few lines. The README's guide and
//! the crate's docs point here.

use std::time::Duration;

use fleet_proto::helloworld::greeter_client::GreeterClient;
use fleet_proto::helloworld::greeter_server::{Greeter, GreeterServer};
use fleet_proto::helloworld::{HelloReply, HelloRequest};
use tonic::{Code, Request, Response, Status};
use tonic_balancer::{BalancedChannel, RetryPolicy};
use tonic_balancer_fleet::{wait_until, Fleet, Script, Tally};

/// The service under test: the user's own.
struct MyGreeter;

#[tonic::async_trait]
impl Greeter for MyGreeter {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let message = format!("Hello {}!", req.into_inner().name);
        Ok(Response::new(HelloReply { message }))
    }
}

fn hello(deadline: Duration) -> Request<HelloRequest> {
    let mut request = Request::new(HelloRequest {
        name: "fleet".into(),
    });
    request.set_timeout(deadline);
    request
}

/// One instance of three hangs: calls with a deadline lose at most the few it takes the
/// channel to see it, and the others go on; every call it received is one of those lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn my_client_survives_an_instance_that_hangs() {
    let fleet = Fleet::start(3, |_| GreeterServer::new(MyGreeter));
    fleet[0].faults().set(Script::new().hang());
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .build()
        .unwrap();
    let mut client = GreeterClient::new(channel);
    let tally = Tally::new();
    for _ in 0..60 {
        tally.record(&client.say_hello(hello(Duration::from_millis(300))).await);
    }
    assert!(
        tally.failed() <= 6,
        "{} of 60 calls lost: {:?}",
        tally.failed(),
        tally.by_instance()
    );
    // None of the calls it received was answered, there or elsewhere: it received no more
    // calls than were lost. (That the channel stopped sending to it is the bound above.)
    let received = fleet[0].faults().calls();
    assert!(
        received <= tally.failed(),
        "the hanging instance received {received} calls, {} were lost",
        tally.failed()
    );
}

/// A rolling restart as an orchestrator does it: each instance in turn leaves discovery, stops
/// gracefully once the channel has let it go (GOAWAY, its calls finish), comes back and
/// rejoins, while calls run; the next one goes once the channel sends calls to it again. No
/// call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_no_call() {
    let mut fleet = Fleet::start(3, |_| GreeterServer::new(MyGreeter));
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .build()
        .unwrap();
    let (tally, limit) = (Tally::new(), Duration::from_secs(30));
    let (mut client, calls) = (GreeterClient::new(channel.clone()), tally.clone());
    let caller = tokio::spawn(async move {
        loop {
            calls.record(&client.say_hello(hello(Duration::from_secs(5))).await);
            tokio::task::yield_now().await;
        }
    });
    for i in 0..fleet.len() {
        let (uri, made) = (fleet[i].uri(), tally.total());
        channel.remove(&uri).unwrap();
        let gone = || {
            channel
                .endpoints()
                .iter()
                .all(|e| e.uri().trim_end_matches('/') != uri)
        };
        wait_until("the channel lets it go", limit, gone).await;
        fleet[i].stop_gracefully(limit).await;
        wait_until("calls go on without it", limit, || {
            tally.total() > made + 100
        })
        .await;
        fleet[i].restart();
        channel.insert(fleet[i].endpoint()).unwrap();
        let served = tally.served(&uri);
        wait_until("calls reach it again", limit, || {
            tally.served(&uri) > served
        })
        .await;
    }
    caller.abort();
    assert_eq!(tally.failed(), 0, "{:?}", tally.failures());
}

/// An instance that fails every call: retries hide it from the caller, and stay within the
/// budget (here 20% of the calls, plus a burst of 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stay_within_budget() {
    let fleet = Fleet::start(3, |_| GreeterServer::new(MyGreeter));
    fleet[0]
        .faults()
        .set(Script::new().fail(Code::Unavailable, "down"));
    let retry = RetryPolicy::default()
        .budget_ratio(0.2)
        .budget_min_per_sec(10);
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .retry(retry)
        .build()
        .unwrap();
    let mut client = GreeterClient::new(channel);
    let tally = Tally::new();
    for _ in 0..100 {
        tally.record(&client.say_hello(hello(Duration::from_secs(5))).await);
    }
    let attempts: u64 = fleet.calls().iter().sum();
    assert!(
        attempts <= 100 + 20 + 10,
        "{attempts} attempts for 100 calls"
    );
    assert!(
        tally.failed() <= 5,
        "{} of 100 calls failed",
        tally.failed()
    );
}
