//! The channel with probes (`Builder::probes`) against real tonic servers on 127.0.0.1: it
//! steers calls by the instances' answers (feature `orca`, whose `OrcaLayer` answers them),
//! leaves instances without the probe service to its strategy, and never waits on a probe
//! that gets no answer.

use std::time::Duration;

use fleet_service as fleet;
use tonic_balancer::{BalancedChannel, ProbeConfig};

use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, Instance};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(30);

fn channel(uris: &[String], probes: ProbeConfig) -> BalancedChannel {
    BalancedChannel::builder()
        .uris(uris.iter().map(String::as_str))
        .probes(probes)
        .build()
        .unwrap()
}

/// Instances without the probe service answer UNIMPLEMENTED: each is probed about once (a
/// few more while the first answers are on their way), then left to the strategy; every call
/// succeeds.
#[tokio::test]
async fn instances_without_probes_are_left_to_the_strategy() {
    let fleet: Vec<Instance> = (0..3)
        .map(|k| Instance::start(&format!("plain{k}"), Behavior::Ok))
        .collect();
    let uris: Vec<String> = fleet.iter().map(Instance::uri).collect();
    let ch = channel(&uris, ProbeConfig::default());
    let mut client = FleetClient::new(ch.clone());
    fleet::calls(&mut client, 50).await;
    fleet::wait_until("the probes' answers", LIMIT, || {
        ch.stats().probes_sent() >= 3
    })
    .await;
    // Every probe on its way has come back UNIMPLEMENTED once none is sent any more.
    let mut sent = ch.stats().probes_sent();
    loop {
        fleet::calls(&mut client, 20).await;
        let now = ch.stats().probes_sent();
        if now == sent {
            break;
        }
        sent = now;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        sent <= 3 * 20,
        "{sent} probes for 3 instances that refuse them"
    );
    fleet::calls(&mut client, 60).await;
    assert_eq!(ch.stats().probes_sent(), sent, "no more probes");
}

#[cfg(feature = "orca")]
mod orca {
    use super::*;
    use tonic_balancer::orca::OrcaHandle;

    /// The share of the calls (named by the instance that answered each) that went to "i0".
    fn share_of_i0(names: &[String]) -> f64 {
        names.iter().filter(|n| *n == "i0").count() as f64 / names.len() as f64
    }

    /// Ten calls of another client to each instance: its `OrcaLayer` has a latency estimate
    /// for its probe answers.
    async fn measured_by_another_client(fleet: &[(Instance, OrcaHandle)]) {
        for (inst, handle) in fleet {
            let mut direct = FleetClient::new(
                tonic::transport::Endpoint::from_shared(inst.uri())
                    .unwrap()
                    .connect_lazy(),
            );
            for id in 0..10 {
                direct.unary(fleet::req(id)).await.unwrap();
            }
            assert!(handle.probe_answer().latency.is_some());
        }
    }

    /// The shares of the calls that went to `which`, with probes and without, for a message.
    fn with_and_without(which: &str, shares: &[f64]) -> String {
        format!(
            "to {which}: {:.1}% with probes, {:.1}% without",
            shares[0] * 100.0,
            shares[1] * 100.0
        )
    }

    /// Another client's 8 calls are held by instance 0 (which answers the rest in 2 ms, as the
    /// others do): its probes answer 8 calls in flight, the others 0. A
    /// channel with probes (and no load reports) sends it hardly any of its calls (only those
    /// its strategy picks while fewer than two answers are fresh); the same channel without
    /// probes, which sees only its own calls, sends it its fair share.
    #[tokio::test]
    async fn probes_steer_calls_away_from_an_instance_busy_with_other_clients() {
        let fleet: Vec<(Instance, OrcaHandle)> = (0..4)
            .map(|k| {
                Instance::start_reporting(
                    &format!("i{k}"),
                    Behavior::Delay(Duration::from_millis(2)),
                )
            })
            .collect();
        let uris: Vec<String> = fleet.iter().map(|(i, _)| i.uri()).collect();
        let busy = &fleet[0];
        // Another client's 8 calls, held by i0 until the end; then i0 answers in 2 ms again.
        busy.0.set(Behavior::Hold);
        let other = tonic::transport::Endpoint::from_shared(busy.0.uri())
            .unwrap()
            .connect_lazy();
        let held: Vec<_> = (0..8)
            .map(|id| {
                let mut other = FleetClient::new(other.clone());
                tokio::spawn(async move { other.unary(fleet::req(id)).await })
            })
            .collect();
        fleet::wait_until("8 calls in flight on i0", LIMIT, || busy.1.in_flight() == 8).await;
        busy.0.set(Behavior::Delay(Duration::from_millis(2)));
        let mut shares = Vec::new();
        for probes in [true, false] {
            // The per-call load reports off: the probes alone tell of the other client's calls.
            // Least pending, whose turns share the calls evenly among equals: the default's
            // gates, set by answers a loaded machine slows, took the control's share to 14.8%.
            let mut b = BalancedChannel::builder()
                .uris(uris.iter().map(String::as_str))
                .strategy(tonic_balancer::Strategy::LeastPending)
                .load_report_max_age(Duration::ZERO);
            if probes {
                b = b.probes(ProbeConfig::default());
            }
            let ch = b.build().unwrap();
            let mut client = FleetClient::new(ch.clone());
            let names = fleet::calls(&mut client, 400).await;
            shares.push(share_of_i0(&names));
            if probes {
                let sent = ch.stats().probes_sent();
                assert!(sent > 0 && sent <= 3 * 400, "{sent} probes for 400 calls");
            }
        }
        let why = with_and_without("the busy one", &shares);
        assert!(shares[0] < 0.08, "{why}");
        assert!(shares[1] > 0.15, "{why}");
        busy.0.release(8);
        for call in held {
            call.await.unwrap().unwrap();
        }
    }

    /// Instance 0 answers in 30 ms, the others in 2 ms, and each has served calls already, so
    /// its probe answers say so: round robin with probes sends it hardly any call (only while
    /// fewer than two answers are fresh; otherwise the fastest cold answer wins), round robin
    /// without probes its quarter.
    #[tokio::test]
    async fn probes_keep_calls_off_an_instance_whose_answers_say_it_is_slow() {
        let fleet: Vec<(Instance, OrcaHandle)> = (0..4)
            .map(|k| {
                let ms = if k == 0 { 30 } else { 2 };
                Instance::start_reporting(
                    &format!("i{k}"),
                    Behavior::Delay(Duration::from_millis(ms)),
                )
            })
            .collect();
        // Each instance's latency estimate, from calls of another client.
        measured_by_another_client(&fleet).await;
        let uris: Vec<String> = fleet.iter().map(|(i, _)| i.uri()).collect();
        let mut shares = Vec::new();
        for probes in [true, false] {
            let mut b = BalancedChannel::builder()
                .uris(uris.iter().map(String::as_str))
                .strategy(tonic_balancer::Strategy::RoundRobin);
            if probes {
                b = b.probes(ProbeConfig::default());
            }
            let mut client = FleetClient::new(b.build().unwrap());
            let names = fleet::calls(&mut client, 200).await;
            shares.push(share_of_i0(&names));
        }
        let why = with_and_without("the slow one", &shares);
        assert!(shares[0] < 0.05, "{why}");
        assert!(shares[1] > 0.2, "{why}");
    }

    /// The probe service, served by a server that never answers it.
    #[derive(Clone)]
    struct Silent;

    impl tonic::server::NamedService for Silent {
        const NAME: &'static str = tonic_balancer::probe::SERVICE;
    }

    impl tower::Service<http::Request<tonic::body::Body>> for Silent {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Pending<Result<Self::Response, Self::Error>>;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
            std::future::pending()
        }
    }

    /// Two instances answer probes, a third never does: calls never wait for a probe (each
    /// answers within its 2 ms), the silent one's probes time out and it keeps its calls by the
    /// strategy, and the channel says so (INFO, naming it and the timeout).
    #[tokio::test]
    async fn a_probe_that_gets_no_answer_holds_no_call() {
        let events = crate::common::Events::default();
        let _guard = events.install();
        let mut fleet: Vec<Instance> = (0..2)
            .map(|k| {
                Instance::start_reporting(
                    &format!("i{k}"),
                    Behavior::Delay(Duration::from_millis(2)),
                )
                .0
            })
            .collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_uri = format!("http://{}", listener.local_addr().unwrap());
        let shared = fleet::Shared::new("silent", Behavior::Delay(Duration::from_millis(2)));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(Silent)
                .add_service(fleet::service(shared.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut uris: Vec<String> = fleet.iter().map(Instance::uri).collect();
        uris.push(silent_uri);
        // 200 ms: the silent one never answers, and the others answer within it even on a
        // busy machine (at 50 ms, one of them missed it once beside a test suite and four
        // spinning processes).
        let ch = channel(
            &uris,
            ProbeConfig::default().timeout(Duration::from_millis(200)),
        );
        let mut client = FleetClient::new(ch.clone());
        for id in 0..300 {
            let mut req = tonic::Request::new(fleet::req(id));
            req.set_timeout(Duration::from_secs(5));
            client.unary(req).await.unwrap();
        }
        assert!(shared.served() > 0, "the silent one still got calls");
        assert!(ch.stats().probes_sent() > 0);
        // Said, naming it and why.
        let said = events.with("probe not answered");
        assert!(!said.is_empty(), "not said");
        assert!(
            said.iter()
                .any(|(_, f)| f.get("server.address") == Some(&uris[2])),
            "the silent one not named: {said:?}"
        );
        for (_, fields) in &said {
            assert_eq!(
                fields.get("error").map(String::as_str),
                Some("no answer within the probe's timeout"),
                "{said:?}"
            );
        }
        fleet.clear();
        server.abort();
    }

    /// The probe proto's messages (`proto/tonic_balancer/probe/v1/probe.proto`).
    #[derive(Clone, PartialEq, prost::Message)]
    struct ProbeRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    struct ProbeResponse {
        #[prost(uint64, tag = "1")]
        requests_in_flight: u64,
        #[prost(double, tag = "2")]
        latency_ms: f64,
    }

    /// The probe service of a server that measures no latency: every answer says no call in
    /// flight and `latency_ms` 0, "no estimate", as the proto allows (a grpcio server written
    /// from the proto's comments answered so).
    #[derive(Clone)]
    struct NoEstimate;

    impl tonic::server::NamedService for NoEstimate {
        const NAME: &'static str = tonic_balancer::probe::SERVICE;
    }

    impl tonic::server::UnaryService<ProbeRequest> for NoEstimate {
        type Response = ProbeResponse;
        type Future = std::future::Ready<Result<tonic::Response<ProbeResponse>, tonic::Status>>;

        fn call(&mut self, _: tonic::Request<ProbeRequest>) -> Self::Future {
            std::future::ready(Ok(tonic::Response::new(ProbeResponse::default())))
        }
    }

    impl tower::Service<http::Request<tonic::body::Body>> for NoEstimate {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
        >;

        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<ProbeResponse, ProbeRequest>::default();
                Ok(tonic::server::Grpc::new(codec).unary(NoEstimate, req).await)
            })
        }
    }

    /// Three instances whose probe answers carry the latency their servers measured (2 ms,
    /// from another client's calls) and one whose answers carry none: round robin with probes
    /// gives it at least half its fair share of 400 calls (an answer without an estimate leaves
    /// the strategy's choice standing while it is cold; ranked below every estimate, it got none
    /// in three runs).
    #[tokio::test]
    async fn an_instance_answering_without_an_estimate_keeps_its_share() {
        let fleet: Vec<(Instance, OrcaHandle)> = (0..3)
            .map(|k| {
                Instance::start_reporting(
                    &format!("i{k}"),
                    Behavior::Delay(Duration::from_millis(2)),
                )
            })
            .collect();
        measured_by_another_client(&fleet).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let blind_uri = format!("http://{}", listener.local_addr().unwrap());
        let shared = fleet::Shared::new("blind", Behavior::Delay(Duration::from_millis(2)));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NoEstimate)
                .add_service(fleet::service(shared.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let mut uris: Vec<String> = fleet.iter().map(|(i, _)| i.uri()).collect();
        uris.push(blind_uri);
        let ch = BalancedChannel::builder()
            .uris(uris.iter().map(String::as_str))
            .strategy(tonic_balancer::Strategy::RoundRobin)
            .probes(ProbeConfig::default())
            .build()
            .unwrap();
        let mut client = FleetClient::new(ch.clone());
        let names = fleet::calls(&mut client, 400).await;
        let blind = names.iter().filter(|n| *n == "blind").count();
        assert!(ch.stats().probes_sent() > 0);
        assert!(
            blind >= 50,
            "{blind} of 400 calls to the instance without an estimate: {:?}",
            ch.endpoints()
        );
        server.abort();
    }
}
