//! Instances on other transports than TCP to the URI's host: Unix sockets (`unix:` URIs, as
//! tonic's `Endpoint` takes them) and connectors of the user's (`Endpoint::connect_with_connector`),
//! several of which may share one placeholder URI and are known by their names.

use fleet_service as fleet;

use std::net::SocketAddr;
use std::time::Duration;

use fleet::pb::fleet_client::FleetClient;
use fleet::Behavior;
use hyper_util::rt::TokioIo;
use tonic::transport::Endpoint;
use tonic_balancer::{BalancedChannel, Error, ServedBy, Strategy};

/// Calls `n` times; returns who served each call, by the instance's reply and by `ServedBy`.
async fn served(client: &mut FleetClient<BalancedChannel>, n: u64) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for id in 0..n {
        let response = client
            .unary(fleet::req(id))
            .await
            .unwrap_or_else(|s| panic!("call {id}: {s:?}"));
        let by = response.extensions().get::<ServedBy>().unwrap().to_string();
        out.push((response.into_inner().instance, by));
    }
    out
}

/// A connector that reaches `addr` over TCP, whatever URI it is asked for.
fn tcp_to(
    addr: SocketAddr,
) -> impl tower::Service<
    http::Uri,
    Response = TokioIo<tokio::net::TcpStream>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: http::Uri| async move {
        Ok::<_, std::io::Error>(TokioIo::new(tokio::net::TcpStream::connect(addr).await?))
    })
}

/// Two instances behind `unix:` URIs (both of tonic's spellings), connected eagerly: calls
/// reach both, each answer names its socket, and `remove` by that URI takes one out.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_instances_share_the_calls() {
    let dir = std::env::temp_dir().join(format!("tonic-balancer-uds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut uris = Vec::new();
    for (name, spelling) in [("a", "unix:"), ("b", "unix://")] {
        let path = dir.join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let service = fleet::service(fleet::Shared::new(name, Behavior::Ok));
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        uris.push(format!("{spelling}{}", path.display()));
    }
    let channel = BalancedChannel::builder()
        .uris(&uris)
        .strategy(Strategy::RoundRobin)
        .connect()
        .await
        .expect("both sockets answer");
    let mut client = FleetClient::new(channel.clone());

    let calls = served(&mut client, 20).await;
    for (name, uri) in [("a", &uris[0]), ("b", &uris[1])] {
        assert!(
            calls.iter().any(|(n, by)| n == name && by == uri),
            "{uri} served nothing: {calls:?}"
        );
    }

    // tonic's two spellings name the same socket.
    let other_spelling = uris[0].replacen("unix:", "unix://", 1);
    assert_eq!(channel.remove(&other_spelling), Ok(true));
    let calls = served(&mut client, 10).await;
    assert!(
        calls.iter().all(|(n, _)| n == "b"),
        "a removed instance got calls: {calls:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two instances through connectors of the user's that share one placeholder URI: each is
/// known by its name (stats, `ServedBy`, `remove`), both get calls, and the requests carry
/// the endpoint's URI as `:authority`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_connectors_reach_their_own_instances() {
    let fleet = fleet::Fleet::start(2, Behavior::Ok);
    let placeholder = || Endpoint::from_static("http://service.placeholder");
    let channel = BalancedChannel::builder()
        .endpoint_with_connector("first", placeholder(), tcp_to(fleet.instances[0].addr))
        .endpoint_with_connector("second", placeholder(), tcp_to(fleet.instances[1].addr))
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let mut client = FleetClient::new(channel.clone());

    let calls = served(&mut client, 20).await;
    for (inst, name) in fleet.instances.iter().zip(["first", "second"]) {
        assert!(
            calls.iter().any(|(n, by)| n == inst.name() && by == name),
            "{name} served nothing: {calls:?}"
        );
        assert_eq!(
            inst.shared.authority.get().map(String::as_str),
            Some("service.placeholder")
        );
    }
    let mut names: Vec<String> = channel
        .endpoints()
        .iter()
        .map(|e| e.uri().to_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["first", "second"]);

    assert_eq!(channel.remove("first"), Ok(true));
    assert_eq!(channel.remove("first"), Ok(false));
    let calls = served(&mut client, 10).await;
    let second = fleet.instances[1].name();
    assert!(
        calls.iter().all(|(n, _)| n == second),
        "a removed instance got calls: {calls:?}"
    );

    // A connector's instance added while calls flow, and eager connect through a connector.
    let third = fleet::Instance::start("third", Behavior::Ok);
    let channel = BalancedChannel::builder()
        .endpoint_with_connector("third", placeholder(), tcp_to(third.addr))
        .connect()
        .await
        .expect("the connector reaches its instance");
    let calls = served(&mut FleetClient::new(channel), 3).await;
    assert!(
        calls.iter().all(|(n, by)| n == "third" && by == "third"),
        "{calls:?}"
    );
}

/// Connector instances are named, and the names are checked like URIs: none empty, none twice;
/// a `unix:` URI needs a path. Each refusal names what is wrong.
#[tokio::test]
async fn bad_transport_settings_are_refused_by_name() {
    let to = tcp_to("127.0.0.1:1".parse().unwrap());
    let placeholder = || Endpoint::from_static("http://service.placeholder");
    let twice = BalancedChannel::builder()
        .endpoint_with_connector("same", placeholder(), to.clone())
        .endpoint_with_connector("same", placeholder(), to.clone())
        .build()
        .unwrap_err();
    assert!(
        matches!(&twice, Error::DuplicateUri { uri, .. } if uri == "same"),
        "{twice:?}"
    );

    let unnamed = BalancedChannel::builder()
        .endpoint_with_connector("", placeholder(), to)
        .build()
        .unwrap_err();
    assert!(
        matches!(&unnamed, Error::InvalidUri { uri, reason, .. } if uri.is_empty() && reason.contains("name")),
        "{unnamed:?}"
    );

    let no_path = BalancedChannel::builder().uri("unix:").build().unwrap_err();
    assert!(
        matches!(&no_path, Error::InvalidUri { uri, reason, .. } if uri == "unix:" && reason.contains("path")),
        "{no_path:?}"
    );
}

/// A Unix socket that nothing listens on fails eager connect with an error naming the socket.
#[cfg(unix)]
#[tokio::test]
async fn a_missing_socket_fails_connect_naming_it() {
    let path = std::env::temp_dir().join(format!(
        "tonic-balancer-missing-{}.sock",
        std::process::id()
    ));
    let uri = format!("unix:{}", path.display());
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        BalancedChannel::builder().uri(&uri).connect(),
    )
    .await
    .expect("connect returns")
    .unwrap_err();
    assert!(
        matches!(&err, Error::NoUsableInstance { reason, .. } if reason.contains(&uri)),
        "{err:?}"
    );
}
