//! TLS through the balancer, end to end: instances found in DNS are reached at their addresses
//! but checked against the name (their certificate names `fleet.test` only, no address), and
//! their requests carry the name as `:authority`, as one tonic endpoint for the name would.
//! The certificates are in `tests/data/tls` (`make.sh` makes them again).
#![cfg(feature = "hickory-dns")]

use fleet_service as fleet;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleet::dns::{resolver_for, DnsServer};
use fleet::pb::fleet_client::FleetClient;
use fleet::{Behavior, ServerOptions};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};
use tonic_balancer::{BalancedChannel, Resolve, ServedBy, Strategy};

const CA: &str = include_str!("../data/tls/ca.pem");
const CERT: &str = include_str!("../data/tls/server.pem");
const KEY: &str = include_str!("../data/tls/server.key");

fn tls_options() -> ServerOptions {
    ServerOptions {
        tls: Some(ServerTlsConfig::new().identity(Identity::from_pem(CERT, KEY))),
        ..ServerOptions::default()
    }
}

/// What a user writes for TLS: trust the service's CA, nothing else.
fn client_tls(uri: http::Uri) -> Endpoint {
    Endpoint::from(uri)
        .connect_timeout(Duration::from_secs(5))
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(CA)))
        .expect("a valid TLS configuration")
}

/// Two TLS instances of `fleet.test`, on 127.0.0.2 and 127.0.0.3 at the same port (as the
/// pods behind one DNS name listen on one port).
fn two_tls_instances() -> (u16, [fleet::Instance; 2]) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let at = |last: u8| SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), port);
    let a = fleet::Instance::start_with("a", at(2), Behavior::Ok, tls_options());
    let b = fleet::Instance::start_with("b", at(3), Behavior::Ok, tls_options());
    (port, [a, b])
}

/// DNS discovery over `https`: the template gets the name's URI, so tonic checks each
/// instance's certificate against `fleet.test` and sends `:authority: fleet.test:port`, while
/// the connections go to the addresses DNS gave, and each instance is known by its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_instances_are_checked_against_the_name_and_carry_it() {
    let (port, servers) = two_tls_instances();
    let dns = DnsServer::start("fleet.test.").await;
    dns.set_ips(&[
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3)),
    ]);
    let given = Arc::new(Mutex::new(Vec::new()));
    let seen = given.clone();
    let channel = BalancedChannel::builder()
        .dns_with(&format!("https://fleet.test:{port}"), resolver_for(&dns))
        .endpoint_template(move |uri| {
            seen.lock().unwrap().push(uri.to_string());
            client_tls(uri)
        })
        .strategy(Strategy::RoundRobin)
        .connect()
        .await
        .expect("discovery finds the instances");

    let mut listed: Vec<String> = channel
        .endpoints()
        .iter()
        .map(|e| e.uri().to_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            format!("https://127.0.0.2:{port}"),
            format!("https://127.0.0.3:{port}")
        ]
    );
    assert_eq!(
        *given.lock().unwrap(),
        vec![format!("https://fleet.test:{port}/"); 2],
        "the template gets the name, once per address"
    );

    let mut client = FleetClient::new(channel.clone());
    let mut served_by = Vec::new();
    for id in 0..20 {
        let response = client
            .unary(fleet::req(id))
            .await
            .unwrap_or_else(|s| panic!("call {id} over TLS: {s:?}"));
        served_by.push(response.extensions().get::<ServedBy>().unwrap().clone());
    }
    for (last, server) in [(2, &servers[0]), (3, &servers[1])] {
        let uri = format!("https://127.0.0.{last}:{port}");
        assert!(
            served_by.iter().any(|s| s.uri() == uri),
            "{uri} served nothing: {served_by:?}"
        );
        assert_eq!(
            server.shared.authority.get().map(String::as_str),
            Some(format!("fleet.test:{port}").as_str()),
            "{} got the wrong :authority",
            server.name()
        );
    }
}

/// The control for the test above: the same servers and TLS settings, reached by address
/// (a source with no name), fail the certificate check, since the certificate names only
/// `fleet.test`. So the test above passes because the name is used, not because nothing is
/// checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_without_the_name_fails_the_certificate_check() {
    struct Addresses(Vec<SocketAddr>);
    impl Resolve for Addresses {
        fn resolve(
            &self,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<SocketAddr>, tower::BoxError>>
                    + Send
                    + '_,
            >,
        > {
            Box::pin(async move { Ok(self.0.clone()) })
        }
        fn name(&self) -> String {
            "addresses".into()
        }
    }
    let (_port, servers) = two_tls_instances();
    let channel = BalancedChannel::builder()
        .resolver(Addresses(servers.iter().map(|s| s.addr).collect()))
        .endpoint_template(|uri| {
            // A custom source's addresses come as http://; this test wants TLS to them.
            let https = uri.to_string().replacen("http://", "https://", 1);
            client_tls(https.parse().unwrap())
        })
        .transparent_retry(false)
        .build()
        .unwrap();
    let mut client = FleetClient::new(channel);
    let status = client
        .unary(fleet::req(1))
        .await
        .expect_err("a certificate for fleet.test does not cover an address");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let message = format!("{status:?}").to_lowercase();
    assert!(
        message.contains("certificate"),
        "the failure names the certificate: {status:?}"
    );
}
