//! What the balancer costs per call: a unary call to one local server through a
//! `BalancedChannel` (one instance), through a plain tonic `Channel`, and through tonic's
//! `Channel::balance_list` (one endpoint), measured in the same run and the same groups.
//!
//! ```text
//! cargo bench --bench overhead
//! cargo bench --bench overhead -- --quick
//! ```
//!
//! - `overhead/sequential`: one call at a time (the latency of a call).
//! - `overhead/32_in_flight`: 32 calls at once, so that criterion's throughput is the calls per
//!   second each channel sustains.
//!
//! The server is a tonic server of the test fleet on its own runtime and thread (answering at
//! once); the client runs on a multi-threaded runtime. The connections are opened before
//! measuring.

use fleet_service as fleet;

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleet::pb::fleet_client::FleetClient;
use fleet::pb::Req;
use fleet::{Behavior, Instance};
use futures::stream::{FuturesUnordered, StreamExt};
use tonic::transport::{Channel, Endpoint};
use tonic_balancer::BalancedChannel;

const IN_FLIGHT: usize = 32;

async fn call<T>(client: &mut FleetClient<T>)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let reply = client
        .unary(Req {
            id: 1,
            count: 0,
            payload: Vec::new(),
        })
        .await
        .expect("call");
    std::hint::black_box(reply);
}

async fn concurrent<T>(client: &FleetClient<T>)
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut calls: FuturesUnordered<_> = (0..IN_FLIGHT)
        .map(|_| {
            let mut c = client.clone();
            async move { call(&mut c).await }
        })
        .collect();
    while calls.next().await.is_some() {}
}

fn bench(c: &mut Criterion) {
    let server = Instance::start("bench", Behavior::Ok);
    let uri = server.uri();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    let endpoint = Endpoint::from_shared(uri.clone())
        .expect("uri")
        .connect_timeout(Duration::from_secs(1));
    let (direct, balanced, tonic_list) = rt.block_on(async {
        let direct = FleetClient::new(endpoint.connect().await.expect("connect"));
        let balanced = FleetClient::new(
            BalancedChannel::builder()
                .endpoint(endpoint.clone())
                .build()
                .expect("balanced channel"),
        );
        let tonic_list = FleetClient::new(Channel::balance_list(std::iter::once(endpoint)));
        // Open every connection before measuring.
        for _ in 0..10 {
            call(&mut direct.clone()).await;
            call(&mut balanced.clone()).await;
            call(&mut tonic_list.clone()).await;
        }
        (direct, balanced, tonic_list)
    });

    let mut g = c.benchmark_group("overhead/sequential");
    g.throughput(Throughput::Elements(1));
    g.bench_function("tonic Channel", |b| {
        b.to_async(&rt).iter(|| {
            let mut c = direct.clone();
            async move { call(&mut c).await }
        })
    });
    g.bench_function("BalancedChannel", |b| {
        b.to_async(&rt).iter(|| {
            let mut c = balanced.clone();
            async move { call(&mut c).await }
        })
    });
    g.bench_function("tonic balance_list", |b| {
        b.to_async(&rt).iter(|| {
            let mut c = tonic_list.clone();
            async move { call(&mut c).await }
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("overhead/{IN_FLIGHT}_in_flight"));
    g.throughput(Throughput::Elements(IN_FLIGHT as u64));
    g.bench_function("tonic Channel", |b| {
        b.to_async(&rt).iter(|| concurrent(&direct))
    });
    g.bench_function("BalancedChannel", |b| {
        b.to_async(&rt).iter(|| concurrent(&balanced))
    });
    g.bench_function("tonic balance_list", |b| {
        b.to_async(&rt).iter(|| concurrent(&tonic_list))
    });
    g.finish();

    drop((direct, balanced, tonic_list));
    drop(rt);
    drop(server);
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}
criterion_main!(benches);
