//! The channel's timers on tokio's paused clock: hedging delays, retry backoff, deadlines and
//! reconnect backoff, against instances in memory (a real tonic server and real HTTP/2 over
//! in-process pipes, on the test's runtime, no socket: see `fleet::memory`). Time moves only
//! when every task waits, straight to the next timer, so each time below is exact, however
//! loaded the machine.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet_service as fleet;
use tokio::time::Instant;
use tonic::Code;
use tonic_balancer::{BalancedChannel, Ejection, HedgingPolicy, RetryPolicy};

use fleet::memory::MemoryInstance;
use fleet::pb::fleet_client::FleetClient;
use fleet::{req, Behavior};

const MS: Duration = Duration::from_millis(1);
const UNARY: &str = "fleet.v1.Fleet/Unary";

fn channel(instances: &[&MemoryInstance], b: tonic_balancer::Builder) -> BalancedChannel {
    instances
        .iter()
        .fold(b, |b, i| i.add_to(b))
        .build()
        .expect("a valid channel")
}

/// A hedge goes when its delay has passed and the first attempt has not answered, not a
/// nanosecond before; the first answer ends the call.
#[tokio::test(start_paused = true)]
async fn a_hedge_goes_at_its_delay() {
    for (answer, hedged) in [(99 * MS, false), (101 * MS, true), (400 * MS, true)] {
        let a = MemoryInstance::start("a", Behavior::Delay(answer));
        let b = MemoryInstance::start("b", Behavior::Delay(answer));
        let policy = HedgingPolicy::new([UNARY], 100 * MS).max_attempts(2);
        let ch = channel(&[&a, &b], BalancedChannel::builder().hedging(policy));
        let mut client = FleetClient::new(ch.clone());
        // Connections first: the first call on each opens it.
        for id in 0..4 {
            client.unary(req(id)).await.unwrap();
        }
        let before = a.served() + b.served();
        let start = Instant::now();
        client.unary(req(9)).await.unwrap();
        assert_eq!(start.elapsed(), answer, "the first answer ends the call");
        let attempts = a.served() + b.served() - before;
        assert_eq!(
            attempts,
            1 + u64::from(hedged),
            "answer after {answer:?}, delay 100 ms: {attempts} attempts"
        );
    }
}

/// Retries wait their backoff (full jitter: a random time up to `initial_backoff`, then up to
/// `multiplier` times that), and the call fails with the last status once the attempts are
/// spent.
#[tokio::test(start_paused = true)]
async fn retries_wait_their_backoff() {
    // Three instances: a retry goes to one the call has not tried.
    let a = MemoryInstance::start("a", Behavior::Fail(Code::Unavailable));
    let b = MemoryInstance::start("b", Behavior::Fail(Code::Unavailable));
    let c = MemoryInstance::start("c", Behavior::Fail(Code::Unavailable));
    let policy = RetryPolicy::default()
        .max_attempts(3)
        .codes([Code::Unavailable])
        .initial_backoff(Duration::from_secs(1))
        .multiplier(2.0)
        .max_backoff(Duration::from_secs(10))
        .budget_ratio(10.0);
    // No ejection: every attempt reaches an instance.
    let builder = BalancedChannel::builder()
        .retry(policy)
        .ejection(Ejection::default().max_ejected_percent(0));
    let ch = channel(&[&a, &b, &c], builder);
    let mut client = FleetClient::new(ch);
    let mut waits = Vec::new();
    for id in 0..40 {
        let start = Instant::now();
        let status = client.unary(req(id)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        waits.push(start.elapsed());
    }
    assert_eq!(
        a.served() + b.served() + c.served(),
        120,
        "3 attempts per call"
    );
    // Two backoffs: up to 1 s, then up to 2 s; random, so neither always nothing nor always
    // the most.
    assert!(
        waits.iter().all(|w| *w <= Duration::from_secs(3)),
        "{waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w > Duration::from_millis(1500)),
        "{waits:?}"
    );
    assert!(
        waits.iter().any(|w| *w < Duration::from_millis(1500)),
        "{waits:?}"
    );
}

/// A call whose instance hangs ends with DEADLINE_EXCEEDED when its `grpc-timeout` runs out,
/// at that time exactly.
#[tokio::test(start_paused = true)]
async fn a_call_ends_at_its_deadline() {
    let a = MemoryInstance::start("a", Behavior::Ok);
    let ch = channel(&[&a], BalancedChannel::builder());
    let mut client = FleetClient::new(ch);
    client.unary(req(0)).await.unwrap();
    a.set(Behavior::Hang);
    let mut r = tonic::Request::new(req(1));
    r.set_timeout(250 * MS);
    let start = Instant::now();
    let status = client.unary(r).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(start.elapsed(), 250 * MS);
}

/// An instance whose connection cannot be opened is taken out of the pick and probed again
/// with gRPC's connection backoff: 1 s, then 1.6 times longer each time (each ±20%), up to
/// the cap; the calls meanwhile go to the other instance.
#[tokio::test(start_paused = true)]
async fn an_unreachable_instance_is_probed_with_backoff() {
    let ok = MemoryInstance::start("ok", Behavior::Ok);
    let tried = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let noted = tried.clone();
    let refusing = tower::service_fn(move |_: http::Uri| {
        noted.lock().unwrap().push(Instant::now());
        async {
            Err::<hyper_util::rt::TokioIo<tokio::io::DuplexStream>, _>(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "refused",
            ))
        }
    });
    let endpoint = tonic::transport::Endpoint::from_static("http://memory.local");
    let builder = BalancedChannel::builder().endpoint_with_connector("down", endpoint, refusing);
    let ch = channel(&[&ok], builder);
    let mut client = FleetClient::new(ch.clone());
    for id in 0..10 {
        client.unary(req(id)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let tried = tried.lock().unwrap().clone();
    let gaps: Vec<f64> = tried
        .windows(2)
        .map(|w| (w[1] - w[0]).as_secs_f64())
        .collect();
    // The call that found it unreachable, then the probes: 1, 1.6, 2.56, 4.1, 6.6, 10.5,
    // 16.8 s (the next one would be after 60 s).
    assert!(gaps.len() >= 6, "probes at {gaps:?}");
    for (k, gap) in gaps.iter().enumerate() {
        let want = 1.6f64.powi(k as i32);
        assert!(
            (want * 0.8 - 1e-6..=want * 1.2 + 1e-6).contains(gap),
            "probe {k} after {gap} s, not {want} s ±20%: {gaps:?}"
        );
    }
    assert_eq!(ok.served(), 10, "every call went to the reachable instance");
}
