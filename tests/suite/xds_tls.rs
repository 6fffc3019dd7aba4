//! TLS to the xDS control plane (feature `xds-tls`, gRFC A65): the channel reaches the control
//! plane (`peers/xds`, go-control-plane) served over TLS and over mTLS with the bootstrap's
//! `tls` channel credentials, and gets its instances from it; a control plane whose
//! certificate the bootstrap's CA did not sign, or that wants a client certificate the
//! bootstrap does not give, gives none: calls fail UNAVAILABLE by their deadline, naming the
//! control plane, and the log says why the connection failed.
//!
//! The certificates are in `tests/data/tls` (`make.sh xds`): the control plane's names
//! `localhost` and 127.0.0.1, the address the bootstrap dials; the fleet's CA (`ca.pem`) did
//! not sign it, and is the wrong CA here. Skipped, loudly, where Go is missing (with `CI=true`
//! it fails).
#![cfg(feature = "xds-tls")]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fleet::pb::fleet_client::FleetClient;
use fleet::xds::{ControlPlane, Snapshot};
use fleet::{Behavior, Fleet};
use fleet_service as fleet;
use serde_json::json;
use tonic_balancer::xds::Bootstrap;
use tonic_balancer::BalancedChannel;

/// The bound of each wait (a TLS stream opens in milliseconds; a busy machine is slow).
const LIMIT: Duration = Duration::from_secs(60);

/// A test certificate's path.
fn data(name: &str) -> String {
    format!("{}/tests/data/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A control plane over TLS with the `localhost` certificate; with `mtls`, it also requires a
/// client certificate signed by the xDS test CA.
fn tls_control_plane(mtls: bool) -> Option<ControlPlane> {
    let (cert, key, ca) = (
        data("xds-server.pem"),
        data("xds-server.key"),
        data("xds-ca.pem"),
    );
    let mut args = vec!["--tls-cert", &cert, "--tls-key", &key];
    if mtls {
        args.extend(["--client-ca", &ca]);
    }
    ControlPlane::start_with(&args)
}

/// A channel to `xds:///svc` with this bootstrap; with `discovery_timeout` (how long a call
/// waits for the first instances) when given.
fn channel(bootstrap: &str, discovery_timeout: Option<Duration>) -> BalancedChannel {
    let bootstrap = Bootstrap::from_json(bootstrap).expect("the test's bootstrap");
    let mut builder = BalancedChannel::builder()
        .xds("xds:///svc")
        .xds_bootstrap(bootstrap);
    if let Some(timeout) = discovery_timeout {
        builder = builder.discovery_timeout(timeout);
    }
    builder.build().expect("an xDS channel")
}

/// The fleet's instances in listener `svc`'s cluster.
fn serve(cp: &mut ControlPlane, fleet: &Fleet) {
    let addrs: Vec<SocketAddr> = fleet.instances.iter().map(|i| i.addr).collect();
    cp.set(&Snapshot::simple("1", "svc", &addrs));
}

/// Batches of 20 calls, each of which must succeed, until both instances serve; panics after
/// [`LIMIT`] with the last batch and the control plane's log.
async fn until_both_serve(ch: &BalancedChannel, cp: &ControlPlane) {
    let start = Instant::now();
    loop {
        let mut counts = BTreeMap::<String, u64>::new();
        for name in fleet::calls(&mut FleetClient::new(ch.clone()), 20).await {
            *counts.entry(name).or_default() += 1;
        }
        if counts.len() == 2 {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "both instances: not within {LIMIT:?}; the last 20 calls went {counts:?}\n{}\n\
             --- the control plane's log ---\n{}",
            ch.stats(),
            cp.stderr()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One call with a deadline of `deadline`, which must fail: its status, within the deadline
/// and a margin (a call never waits past its deadline).
async fn failed_call(ch: &BalancedChannel, deadline: Duration) -> tonic::Status {
    let mut request = tonic::Request::new(fleet::req(1));
    request.set_timeout(deadline);
    let start = Instant::now();
    let answer = tokio::time::timeout(
        deadline + Duration::from_secs(5),
        FleetClient::new(ch.clone()).unary(request),
    )
    .await
    .expect("the call ends by its deadline");
    let status = answer.expect_err("no instance: the call fails");
    assert!(start.elapsed() < deadline + Duration::from_secs(5));
    status
}

/// `tls` credentials with `ca_certificate_file`: the stream opens over TLS, the instances come
/// from the control plane, and calls succeed. The `google_default` entry before it is of a type
/// this client does not support, and is skipped, as gRPC skips it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_credentials_with_a_ca_file_reach_the_control_plane() {
    let Some(mut cp) = tls_control_plane(false) else {
        return;
    };
    let fleet = Fleet::start(2, Behavior::Ok);
    serve(&mut cp, &fleet);
    let creds = json!([
        { "type": "google_default" },
        { "type": "tls", "config": { "ca_certificate_file": data("xds-ca.pem") } },
    ]);
    let ch = channel(&cp.bootstrap_with_creds("tls-ca", creds), None);
    until_both_serve(&ch, &cp).await;
}

/// mTLS: a control plane that requires a client certificate gives nothing to a client without
/// one (its calls fail UNAVAILABLE, naming the control plane), and serves the one whose
/// bootstrap gives `certificate_file` and `private_key_file`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_credentials_give_the_client_certificate_the_control_plane_requires() {
    let Some(mut cp) = tls_control_plane(true) else {
        return;
    };
    let fleet = Fleet::start(2, Behavior::Ok);
    serve(&mut cp, &fleet);
    // Without a client certificate: refused in the handshake, so no instance.
    let without =
        json!([{ "type": "tls", "config": { "ca_certificate_file": data("xds-ca.pem") } }]);
    let refused = channel(
        &cp.bootstrap_with_creds("mtls-without", without),
        Some(Duration::from_secs(1)),
    );
    let status = failed_call(&refused, Duration::from_secs(20)).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("no answer from the control plane"),
        "{status:?}\n--- the control plane's log ---\n{}",
        cp.stderr()
    );
    assert!(refused.endpoints().is_empty(), "{:?}", refused.endpoints());

    let with = json!([{ "type": "tls", "config": {
        "ca_certificate_file": data("xds-ca.pem"),
        "certificate_file": data("xds-client.pem"),
        "private_key_file": data("xds-client.key"),
        "refresh_interval": "600s",
    } }]);
    let ch = channel(&cp.bootstrap_with_creds("mtls-with", with), None);
    until_both_serve(&ch, &cp).await;
}

/// A CA that did not sign the control plane's certificate (the fleet's): the handshake fails,
/// the channel gets no instance, and a call fails UNAVAILABLE, naming the control plane that
/// did not answer and why its stream is down (the certificate: the status is written again
/// when the stream fails, so a handshake that fails after the wait for the first answer is
/// named too); the warning of the failed stream says so as well. The stream keeps trying with
/// gRPC's backoff, so the test ends by dropping the channel. On a current-thread runtime, so
/// that the stream's task logs on this thread.
#[tokio::test(flavor = "current_thread")]
async fn a_control_plane_certificate_from_another_ca_gives_no_instances_and_says_so() {
    let events = crate::common::Events::default();
    let _guard = events.install();
    let Some(mut cp) = tls_control_plane(false) else {
        return;
    };
    let fleet = Fleet::start(1, Behavior::Ok);
    serve(&mut cp, &fleet);
    let creds = json!([{ "type": "tls", "config": { "ca_certificate_file": data("ca.pem") } }]);
    let ch = channel(
        &cp.bootstrap_with_creds("wrong-ca", creds),
        Some(Duration::from_secs(1)),
    );
    let start = Instant::now();
    let status = loop {
        let status = failed_call(&ch, Duration::from_secs(20)).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("xds:///svc")
                && status
                    .message()
                    .contains("no answer from the control plane"),
            "{status:?}"
        );
        if status.message().contains("not connected: ") {
            break status;
        }
        assert!(
            start.elapsed() < LIMIT,
            "the status never says why: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (_, why) = status.message().split_once("not connected: ").unwrap();
    assert!(why.contains("certificate"), "{status:?}");
    assert!(ch.endpoints().is_empty(), "{:?}", ch.endpoints());
    // The failed stream's warning names the control plane and the certificate's fault.
    let start = Instant::now();
    let warning = loop {
        if let Some((_, fields)) = events.with("xDS stream ended").pop() {
            break fields;
        }
        assert!(start.elapsed() < LIMIT, "no warning of the failed stream");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let error = &warning["error"];
    assert_eq!(warning["server"], cp.uri(), "{warning:?}");
    assert!(
        error.contains("connect") && error.contains("certificate"),
        "{warning:?}"
    );
}
