//! The contenders: this crate's strategies, what tonic and tower users have today, a naive
//! baseline, and the default (FewestThenFastest) with hedging; each built afresh over the fleet's addresses and
//! boxed into one service type.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::body::Body;
use tonic::transport::{Channel, Endpoint};
use tonic_balancer::{BalancedChannel, HedgingPolicy, Strategy};
use tower::load::{CompleteOnResponse, PeakEwma, PendingRequests};
use tower::util::BoxCloneService;
use tower::{BoxError, Service, ServiceExt};

/// What every contender is boxed into, so that one generated client type serves them all (the
/// box costs the same small allocation per call to each of them).
pub(crate) type Svc = BoxCloneService<http::Request<Body>, http::Response<Body>, BoxError>;

pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// The hedging contender's delay (µs), set by the stalls scenario's calibration run.
static HEDGE_DELAY_US: AtomicU64 = AtomicU64::new(10_000);

/// The hedging contender's delay, as the stalls scenario's calibration last set it.
pub(crate) fn hedge_delay() -> Duration {
    Duration::from_micros(HEDGE_DELAY_US.load(Ordering::Relaxed))
}

pub(crate) fn set_hedge_delay(delay: Duration) {
    HEDGE_DELAY_US.store(delay.as_micros() as u64, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Contender {
    Ours(Strategy),
    TonicBalanceList,
    TowerP2cPending,
    TowerP2cEwma,
    Naive,
    /// The default strategy (FewestThenFastest) with a hedging policy on Unary (stalls).
    Hedging,
}

pub(crate) const CONTENDERS: [Contender; 10] = [
    Contender::Ours(Strategy::FewestThenFastest),
    Contender::Ours(Strategy::LeastPending),
    Contender::Ours(Strategy::PeakEwma),
    Contender::Ours(Strategy::PowerOfTwoChoices),
    Contender::Ours(Strategy::RoundRobin),
    Contender::TonicBalanceList,
    Contender::TowerP2cPending,
    Contender::TowerP2cEwma,
    Contender::Naive,
    Contender::Hedging,
];

/// What the stalls scenario compares.
pub(crate) const STALL_CONTENDERS: [Contender; 2] = [
    Contender::Ours(Strategy::FewestThenFastest),
    Contender::Hedging,
];

impl Contender {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Contender::Ours(Strategy::FewestThenFastest) => "FewestThenFastest",
            Contender::Ours(Strategy::LeastPending) => "LeastPending",
            Contender::Ours(Strategy::PeakEwma) => "PeakEwma",
            Contender::Ours(Strategy::PowerOfTwoChoices) => "PowerOfTwoChoices",
            Contender::Ours(Strategy::RoundRobin) => "RoundRobin",
            Contender::Ours(_) => "BalancedChannel(?)",
            Contender::TonicBalanceList => "tonic balance_list",
            Contender::TowerP2cPending => "tower p2c pending",
            Contender::TowerP2cEwma => "tower p2c PeakEwma",
            Contender::Naive => "naive least-pending",
            Contender::Hedging => "FewestThenFastest+hedging",
        }
    }

    /// The command-line name.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Contender::Ours(Strategy::FewestThenFastest) => "fewest-then-fastest",
            Contender::Ours(Strategy::LeastPending) => "least-pending",
            Contender::Ours(Strategy::PeakEwma) => "peak-ewma",
            Contender::Ours(Strategy::PowerOfTwoChoices) => "p2c",
            Contender::Ours(Strategy::RoundRobin) => "round-robin",
            Contender::Ours(_) => "other",
            Contender::TonicBalanceList => "tonic",
            Contender::TowerP2cPending => "tower-pending",
            Contender::TowerP2cEwma => "tower-ewma",
            Contender::Naive => "naive",
            Contender::Hedging => "hedging",
        }
    }

    /// A fresh channel over these addresses. Must run within the client runtime.
    pub(crate) fn build(self, uris: &[String]) -> Svc {
        let endpoints = || {
            uris.iter().map(|u| {
                Endpoint::from_shared(u.clone())
                    .expect("fleet URI")
                    .connect_timeout(CONNECT_TIMEOUT)
            })
        };
        match self {
            Contender::Ours(strategy) => {
                let ch = BalancedChannel::builder()
                    .endpoints(endpoints())
                    .strategy(strategy)
                    .build()
                    .expect("balanced channel");
                BoxCloneService::new(ch)
            }
            Contender::TonicBalanceList => {
                let ch = Channel::balance_list(endpoints());
                BoxCloneService::new(ch.map_err(BoxError::from))
            }
            Contender::TowerP2cPending => {
                let list: Vec<_> = endpoints()
                    .map(|e| PendingRequests::new(e.connect_lazy(), CompleteOnResponse::default()))
                    .collect();
                let discover = tower::discover::ServiceList::new::<http::Request<Body>>(list);
                let balance = tower::balance::p2c::Balance::new(discover);
                BoxCloneService::new(tower::buffer::Buffer::new(balance, 1024))
            }
            Contender::TowerP2cEwma => {
                // The same defaults as BalancedChannel's estimate: 1 ms before the first
                // sample, 1 s decay.
                let list: Vec<_> = endpoints()
                    .map(|e| {
                        PeakEwma::new(
                            e.connect_lazy(),
                            Duration::from_millis(1),
                            1e9,
                            CompleteOnResponse::default(),
                        )
                    })
                    .collect();
                let discover = tower::discover::ServiceList::new::<http::Request<Body>>(list);
                let balance = tower::balance::p2c::Balance::new(discover);
                BoxCloneService::new(tower::buffer::Buffer::new(balance, 1024))
            }
            Contender::Hedging => {
                let delay = hedge_delay();
                let ch = BalancedChannel::builder()
                    .endpoints(endpoints())
                    .hedging(HedgingPolicy::new(["fleet.v1.Fleet/Unary"], delay))
                    .build()
                    .expect("balanced channel");
                BoxCloneService::new(ch)
            }
            Contender::Naive => BoxCloneService::new(Naive {
                channels: Arc::new(endpoints().map(|e| e.connect_lazy()).collect()),
                counts: Arc::new(Mutex::new(vec![0; uris.len()])),
            }),
        }
    }
}

/// The baseline a first attempt writes: a mutex around the counts, the first least-loaded
/// instance in a scan (ties all go to the lowest index), +1 before the call, -1 when its
/// response head arrives, no failure handling.
#[derive(Clone)]
struct Naive {
    channels: Arc<Vec<Channel>>,
    counts: Arc<Mutex<Vec<usize>>>,
}

struct NaiveGuard(Arc<Mutex<Vec<usize>>>, usize);

impl Drop for NaiveGuard {
    fn drop(&mut self) {
        self.0.lock().unwrap()[self.1] -= 1;
    }
}

impl Service<http::Request<Body>> for Naive {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = futures::future::BoxFuture<'static, Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let i = {
            let mut counts = self.counts.lock().unwrap();
            let i = (0..counts.len()).min_by_key(|&i| counts[i]).unwrap();
            counts[i] += 1;
            i
        };
        let guard = NaiveGuard(self.counts.clone(), i);
        let channel = self.channels[i].clone();
        Box::pin(async move {
            let _guard = guard;
            let resp = channel.oneshot(req).await?;
            Ok(resp)
        })
    }
}
