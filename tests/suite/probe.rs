//! Load probes (`tonic_balancer::probe`) end to end, against real tonic servers: one with
//! `OrcaLayer` answers with its calls in flight and its latency estimate (feature `orca`); one
//! without the service answers UNIMPLEMENTED; one that never answers makes the probe time out.
//! On TCP (127.0.0.1) and in memory (a real tonic server and real HTTP/2 over in-process pipes,
//! on tokio's paused clock, where every time below is exact however loaded the machine).

use std::convert::Infallible;
use std::time::Duration;

use fleet_service as fleet;
use hyper_util::rt::TokioIo;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic_balancer::probe::{probe_once, PATH};

use fleet::{Behavior, Instance};

/// Generous: the machine may be loaded.
const LIMIT: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);

/// A channel of its own to the instance at `uri`, as the balancer keeps one per instance.
fn channel_to(uri: String) -> Channel {
    Endpoint::from_shared(uri).unwrap().connect_lazy()
}

type Incoming = UnboundedReceiverStream<Result<DuplexStream, std::io::Error>>;

/// A lazy channel whose every connection is an in-process pipe, and the pipes' server ends, for
/// a tonic server to serve with `serve_with_incoming`.
fn pipes() -> (Channel, Incoming) {
    let (conns, incoming) = mpsc::unbounded_channel();
    let connector = tower::service_fn(move |_: http::Uri| {
        let (client, server) = tokio::io::duplex(1 << 16);
        let sent = conns.send(Ok(server));
        async move {
            sent.map_err(|_| std::io::Error::other("the server is gone"))?;
            Ok::<_, std::io::Error>(TokioIo::new(client))
        }
    });
    let channel =
        Endpoint::from_static("http://memory.local").connect_with_connector_lazy(connector);
    (channel, UnboundedReceiverStream::new(incoming))
}

/// A server without the probe service answers UNIMPLEMENTED, which the probe reports as such.
#[tokio::test]
async fn a_server_without_the_service_is_unimplemented() {
    let plain = Instance::start("plain", Behavior::Ok);
    let answer = probe_once(channel_to(plain.uri()), LIMIT).await;
    assert_eq!(answer, Err("Unimplemented".to_owned()));
    assert_eq!(
        plain.served(),
        0,
        "the probe is no call of the fleet's service"
    );
}

/// The probe service, served by a server that never answers it.
#[derive(Clone)]
struct Silent;

impl tonic::server::NamedService for Silent {
    const NAME: &'static str = tonic_balancer::probe::SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for Silent {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Pending<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        assert_eq!(req.uri().path(), PATH);
        std::future::pending()
    }
}

/// A server whose probe handler never returns: the probe times out at its timeout, to the
/// millisecond of tokio's (paused) clock.
#[tokio::test(start_paused = true)]
async fn a_silent_server_times_out_in_memory() {
    let (channel, incoming) = pipes();
    let server = tonic::transport::Server::builder()
        .add_service(Silent)
        .serve_with_incoming(incoming);
    let server = tokio::spawn(server);
    for timeout in [250 * MS, 2_000 * MS] {
        let start = tokio::time::Instant::now();
        let answer = probe_once(channel.clone(), timeout).await;
        let took = start.elapsed();
        assert_eq!(answer, Err("Timeout".to_owned()));
        assert!(
            took >= timeout && took < timeout + MS,
            "timed out after {took:?}, timeout {timeout:?}"
        );
    }
    server.abort();
}

/// A TCP peer that accepts connections and never says a word (no HTTP/2 at all): the probe
/// times out, on the real clock.
#[tokio::test]
async fn a_mute_peer_times_out_on_tcp() {
    // Listening, never accepting: the kernel completes each connection, nobody reads it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let timeout = 300 * MS;
    let start = std::time::Instant::now();
    let answer = probe_once(channel_to(uri), timeout).await;
    let took = start.elapsed();
    assert_eq!(answer, Err("Timeout".to_owned()));
    assert!(
        took >= timeout && took < timeout + LIMIT,
        "timed out after {took:?}"
    );
    drop(listener);
}

#[cfg(feature = "orca")]
mod served {
    use super::*;

    use fleet::pb::fleet_client::FleetClient;
    use fleet::wait_until;
    use tonic::Code;
    use tonic_balancer::orca::{OrcaHandle, OrcaLayer};
    use tonic_balancer::probe::ProbeAnswer;

    /// An instance in memory behind `OrcaLayer`: the channel to it, its state, its handle.
    fn in_memory(behavior: Behavior) -> (Channel, std::sync::Arc<fleet::Shared>, OrcaHandle) {
        let (channel, incoming) = pipes();
        let shared = fleet::Shared::new("mem", behavior);
        let handle = OrcaHandle::new();
        let server = tonic::transport::Server::builder()
            .layer(OrcaLayer::new(handle.clone()))
            .add_service(fleet::service(shared.clone()))
            .serve_with_incoming(incoming);
        tokio::spawn(server);
        (channel, shared, handle)
    }

    async fn probe(channel: &Channel) -> ProbeAnswer {
        probe_once(channel.clone(), LIMIT)
            .await
            .expect("the server answers the probe")
    }

    /// Starts `n` calls, each on a task of its own.
    fn start_calls(
        channel: &Channel,
        n: u64,
    ) -> Vec<tokio::task::JoinHandle<Result<(), tonic::Status>>> {
        (0..n)
            .map(|id| {
                let mut client = FleetClient::new(channel.clone());
                tokio::spawn(async move { client.unary(fleet::req(id)).await.map(drop) })
            })
            .collect()
    }

    /// A server with `OrcaLayer` answers with its calls in flight (those it holds, not the
    /// probe) and, after some calls, a latency near theirs. The probe is no call: the service
    /// behind the layer never sees it, and the layer does not count it.
    #[tokio::test]
    async fn answers_calls_in_flight_and_latency_on_tcp() {
        let (inst, handle) = Instance::start_reporting("orca", Behavior::Delay(20 * MS));
        let channel = channel_to(inst.uri());
        let first = probe(&channel).await;
        assert_eq!((first.requests_in_flight, first.latency), (0, None));

        let mut client = FleetClient::new(channel.clone());
        for id in 0..4 {
            client
                .unary(fleet::req(id))
                .await
                .expect("the call succeeds");
        }
        let after = probe(&channel).await;
        assert_eq!(after.requests_in_flight, 0);
        let latency = after.latency.expect("an estimate after four calls");
        assert!(
            latency >= 20 * MS && latency < 20 * MS + LIMIT,
            "estimate {latency:?} for calls of 20 ms"
        );

        inst.set(Behavior::Hold);
        let held = start_calls(&channel, 5);
        wait_until("the server holds 5 calls", LIMIT, || {
            handle.in_flight() == 5 && inst.held() == 5
        })
        .await;
        let served = inst.served();
        for _ in 0..3 {
            let answer = probe(&channel).await;
            assert_eq!(answer.requests_in_flight, 5, "{answer:?}");
        }
        assert_eq!(handle.in_flight(), 5, "probes are not counted");
        assert_eq!(inst.served(), served, "probes do not reach the service");

        inst.release(5);
        for call in held {
            call.await
                .unwrap()
                .expect("a held call succeeds once released");
        }
        wait_until("the calls are over", LIMIT, || handle.in_flight() == 0).await;
        assert_eq!(probe(&channel).await.requests_in_flight, 0);
    }

    /// The estimate, exactly, on tokio's paused clock: the moving average of the latency of
    /// the calls that arrived with as many calls in flight as there are now, or the nearest
    /// such; failures answered at once (UNAVAILABLE) left out, application errors counted.
    #[tokio::test(start_paused = true)]
    async fn latency_estimate_by_calls_in_flight() {
        let (channel, shared, handle) = in_memory(Behavior::Delay(40 * MS));
        assert_eq!(probe(&channel).await, ProbeAnswer::new(0, None));
        let mut client = FleetClient::new(channel.clone());
        for id in 0..3 {
            client
                .unary(fleet::req(id))
                .await
                .expect("the call succeeds");
        }
        assert_eq!(probe(&channel).await, ProbeAnswer::new(0, Some(40 * MS)));

        // Shed at once: not a latency.
        shared.set(Behavior::Fail(Code::Unavailable));
        for id in 0..2 {
            let err = client.unary(fleet::req(id)).await.unwrap_err();
            assert_eq!(err.code(), Code::Unavailable);
        }
        assert_eq!(probe(&channel).await, ProbeAnswer::new(0, Some(40 * MS)));

        // An application's error after 8 ms is an answer like any: an eighth of the way.
        shared.set(Behavior::FailSome {
            one_in: 1,
            code: Code::NotFound,
            delay: 8 * MS,
        });
        let err = client.unary(fleet::req(9)).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
        assert_eq!(
            probe(&channel).await,
            ProbeAnswer::new(0, Some(36 * MS)),
            "(40 * 7 + 8) / 8 ms"
        );

        // Two long calls in flight: no call arrived with 2 in flight yet; the nearest bucket
        // with calls is that of none in flight.
        shared.set(Behavior::Delay(1_000 * MS));
        let long = start_calls(&channel, 2);
        wait_until("the server serves 2 calls", LIMIT, || {
            handle.in_flight() == 2
        })
        .await;
        assert_eq!(probe(&channel).await, ProbeAnswer::new(2, Some(36 * MS)));

        // A call that arrives with 2 in flight and takes 100 ms sets that bucket.
        shared.set(Behavior::Delay(100 * MS));
        let start = tokio::time::Instant::now();
        client
            .unary(fleet::req(10))
            .await
            .expect("the call succeeds");
        assert_eq!(start.elapsed(), 100 * MS);
        assert_eq!(probe(&channel).await, ProbeAnswer::new(2, Some(100 * MS)));

        for call in long {
            call.await.unwrap().expect("a long call succeeds");
        }
        wait_until("the calls are over", LIMIT, || handle.in_flight() == 0).await;
        assert_eq!(probe(&channel).await.requests_in_flight, 0);
    }

    /// The answer is a plain gRPC response, as any gRPC client expects it: status 200,
    /// content-type application/grpc, one uncompressed message, grpc-status 0 in the trailers.
    /// A malformed request gets INTERNAL, a compressed one UNIMPLEMENTED (gRPC's rule for a
    /// compression the server does not take), both trailers-only.
    #[tokio::test(start_paused = true)]
    async fn the_answer_is_plain_grpc() {
        let (channel, _shared, _handle) = in_memory(Behavior::Ok);
        // A request with a field the server does not know: skipped.
        let (head, data, trailers) = raw_probe(&channel, framed(0, &[0x08, 7])).await;
        assert_eq!(head.status, http::StatusCode::OK);
        assert_eq!(head.headers["content-type"], "application/grpc");
        assert_eq!(data[0], 0, "uncompressed");
        let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
        assert_eq!(data.len(), 5 + len, "one message");
        assert_eq!(
            ProbeAnswer::decode(&data[5..]),
            Some(ProbeAnswer::new(0, None))
        );
        let trailers = trailers.expect("trailers");
        assert_eq!(trailers["grpc-status"], "0");

        for (body, code) in [
            (framed(0, &[0x08]), Code::Internal),
            (framed(1, &[]), Code::Unimplemented),
            (bytes::Bytes::new(), Code::Internal),
            (
                bytes::Bytes::from_static(&[0, 0, 0, 0, 9, 1]),
                Code::Internal,
            ),
        ] {
            let (head, data, trailers) = raw_probe(&channel, body.clone()).await;
            assert_eq!(head.status, http::StatusCode::OK);
            assert_eq!(head.headers["content-type"], "application/grpc");
            assert_eq!(
                head.headers["grpc-status"],
                i32::from(code).to_string().as_str(),
                "{body:x?}: {:?}",
                head.headers.get("grpc-message")
            );
            assert!(data.is_empty() && trailers.is_none(), "trailers-only");
        }
    }

    /// Bytes of a message sent over gRPC: its frame's five-byte head and the message.
    fn framed(flag: u8, message: &[u8]) -> bytes::Bytes {
        let mut b = vec![flag];
        b.extend((message.len() as u32).to_be_bytes());
        b.extend(message);
        b.into()
    }

    /// The bytes and trailers of a response body, read to its end.
    async fn read_body(mut body: tonic::body::Body) -> (Vec<u8>, Option<http::HeaderMap>) {
        use http_body::Body as _;
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.expect("the body reads");
            match frame.into_data() {
                Ok(d) => data.extend_from_slice(&d),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        (data, trailers)
    }

    /// One raw HTTP/2 request of the probe's method, `body` as its body: the response's head,
    /// bytes and trailers.
    async fn raw_probe(
        channel: &Channel,
        body: bytes::Bytes,
    ) -> (http::response::Parts, Vec<u8>, Option<http::HeaderMap>) {
        use tower::ServiceExt;
        let req = http::Request::builder()
            .method("POST")
            .uri(format!("http://memory.local{PATH}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(FullBody(Some(body))))
            .unwrap();
        let resp = channel.clone().oneshot(req).await.expect("a response");
        let (head, body) = resp.into_parts();
        let (data, trailers) = read_body(body).await;
        (head, data, trailers)
    }

    /// A request body of these bytes, in one frame.
    struct FullBody(Option<bytes::Bytes>);

    impl http_body::Body for FullBody {
        type Data = bytes::Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>>
        {
            std::task::Poll::Ready(self.0.take().map(|b| Ok(http_body::Frame::data(b))))
        }

        fn is_end_stream(&self) -> bool {
            self.0.is_none()
        }
    }
}
