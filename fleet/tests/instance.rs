//! What the fleet's instances promise, against real servers on 127.0.0.1: `Instance` (start,
//! kill, restart, GOAWAY, graceful stop, refused connections, drop), `ServerOptions`, the
//! connection counts, `Fleet`, `Tally`, `served_by`, `stats`, `StateLog`, load reports (feature
//! `orca`), and the unreachable and black-hole addresses. The service is this file's own
//! Greeter (tonic's helloworld), called through tonic's plain `Channel` or a
//! `BalancedChannel`. Conditions are awaited by polling with generous limits (the machine may
//! be loaded); tests that kill or restart an instance (which joins its thread) run on two
//! worker threads.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fleet_proto::helloworld::greeter_client::GreeterClient;
use fleet_proto::helloworld::greeter_server::{Greeter, GreeterServer};
use fleet_proto::helloworld::{HelloReply, HelloRequest};
use tonic::service::Routes;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tonic_balancer::{Backoff, BalancedChannel, State, Strategy};
use tonic_balancer_fleet::{
    black_hole_uri, served_by, stats, unreachable_uri, wait_until, Faults, Fleet, Instance, Script,
    ServerOptions, StateLog, Tally,
};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const SAY_HELLO: &str = "/helloworld.Greeter/SayHello";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// What tonic's plain channel answers for a call whose connection the server closed before
/// HTTP/2 started (`hyper` "connection closed", a reset, a broken pipe), as the race goes.
const TURNED_AWAY: [Code; 3] = [Code::Cancelled, Code::Unknown, Code::Unavailable];

/// How long a condition may take to come true on a loaded machine.
const LIMIT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// The service, the clients, the sockets
// ---------------------------------------------------------------------------------------------

/// Greets, and says which instance it is: `Hello {name} from {instance}`.
struct Named(String);

#[tonic::async_trait]
impl Greeter for Named {
    async fn say_hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let message = format!("Hello {} from {}", req.into_inner().name, self.0);
        Ok(Response::new(HelloReply { message }))
    }
}

fn greeter(instance: &str) -> GreeterServer<Named> {
    GreeterServer::new(Named(instance.to_owned()))
}

fn hello(deadline: Duration) -> Request<HelloRequest> {
    let mut request = Request::new(HelloRequest {
        name: "test".into(),
    });
    request.set_timeout(deadline);
    request
}

/// The reply an instance called `instance` gives.
fn greeting(instance: &str) -> String {
    format!("Hello test from {instance}")
}

/// A client on a plain tonic `Channel` of its own (its connection opens at its first call).
fn plain(uri: &str) -> GreeterClient<Channel> {
    let channel = Channel::from_shared(uri.to_owned())
        .expect("a valid URI")
        .connect_lazy();
    GreeterClient::new(channel)
}

/// One call through `client` with a 10 s deadline; the reply's message.
async fn call(client: &mut GreeterClient<Channel>) -> Result<String, Status> {
    let reply = client.say_hello(hello(Duration::from_secs(10))).await?;
    Ok(reply.into_inner().message)
}

fn balanced(fleet: &Fleet) -> BalancedChannel {
    BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .build()
        .expect("a balanced channel")
}

/// The address of an `http://127.0.0.1:port` URI.
fn addr_of(uri: &str) -> SocketAddr {
    uri.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("{uri} is not http://ip:port: {e}"))
}

/// A plain TCP connect, which must neither succeed nor fail later than 10 s.
async fn tcp_connect(addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(addr),
    )
    .await
    .unwrap_or_else(|_| panic!("a connect to {addr} took more than 10 s"))
}

async fn assert_refused(addr: SocketAddr) {
    match tcp_connect(addr).await {
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
        Err(e) => panic!("a connect to {addr} failed, but not refused: {e}"),
        Ok(_) => panic!("a connect to {addr} succeeded: something still listens"),
    }
}

// ---------------------------------------------------------------------------------------------
// Starting
// ---------------------------------------------------------------------------------------------

/// `Instance::start` serves the service on a free port of 127.0.0.1, with its name, address,
/// URI and endpoint, and counts its calls and connection.
#[tokio::test]
async fn start_serves_on_localhost() {
    let instance = Instance::start("a", greeter("a"));
    assert_eq!(instance.name(), "a");
    let addr = instance.addr();
    assert_eq!(addr.ip(), std::net::Ipv4Addr::LOCALHOST);
    assert_ne!(addr.port(), 0);
    assert_eq!(instance.uri(), format!("http://{addr}"));
    let endpoint = instance.endpoint().uri().to_string();
    assert_eq!(endpoint.trim_end_matches('/'), instance.uri());
    assert!(instance.is_running());

    let channel = instance.endpoint().connect().await.expect("a connection");
    let mut client = GreeterClient::new(channel);
    assert_eq!(call(&mut client).await.unwrap(), greeting("a"));
    assert_eq!(instance.faults().calls(), 1);
    assert_eq!(instance.faults().method(SAY_HELLO).calls, 1);
    assert_eq!(instance.connections(), 1);
    assert_eq!(instance.open_connections(), 1);
}

/// `Instance::start_routes` serves several services on one port: Greeter and tonic-health.
#[tokio::test]
async fn start_routes_serves_two_services() {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let routes = Routes::new(greeter("two")).add_service(health);
    let instance = Instance::start_routes("two", routes);
    assert_eq!(instance.name(), "two");

    let channel = Channel::from_shared(instance.uri()).unwrap().connect_lazy();
    let mut greeter = GreeterClient::new(channel.clone());
    assert_eq!(call(&mut greeter).await.unwrap(), greeting("two"));
    let mut health = HealthClient::new(channel);
    let answer = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("the health service answers")
        .into_inner();
    assert_eq!(answer.status, ServingStatus::Serving as i32);
    assert_eq!(instance.faults().method(SAY_HELLO).calls, 1);
    assert_eq!(instance.faults().method(HEALTH_CHECK).calls, 1);
    assert_eq!(instance.faults().calls(), 2);
}

/// `Instance::start_with` binds the address it is given (any 127.x.y.z on Linux) and takes the
/// server options.
#[tokio::test]
async fn start_with_binds_the_given_address() {
    let at: SocketAddr = "127.0.0.3:0".parse().unwrap();
    let options = ServerOptions::new().max_connections(1);
    let instance = Instance::start_with("x", at, Routes::new(greeter("x")), options);
    assert_eq!(instance.addr().ip().to_string(), "127.0.0.3");
    assert_ne!(instance.addr().port(), 0);
    assert!(instance.uri().starts_with("http://127.0.0.3:"));
    let mut client = plain(&instance.uri());
    assert_eq!(call(&mut client).await.unwrap(), greeting("x"));
    // The option is in force: a second connection is turned away.
    assert!(call(&mut plain(&instance.uri())).await.is_err());
    assert_eq!(instance.turned_away(), 1);
}

/// `Instance::start_with` panics, naming the address, when it cannot bind it.
#[test]
#[should_panic(expected = "bind 127.0.0.1:")]
fn start_with_panics_on_an_address_taken() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap();
    let _instance = Instance::start_with(
        "taken",
        at,
        Routes::new(greeter("taken")),
        ServerOptions::new(),
    );
}

// ---------------------------------------------------------------------------------------------
// Kill, restart, drop
// ---------------------------------------------------------------------------------------------

/// `kill`: a call in flight fails, the port refuses connections, and the instance says it is
/// not running; new calls fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_fails_calls_in_flight_and_refuses_connections() {
    let mut instance = Instance::start("k", greeter("k"));
    instance.faults().set(Script::new().hold());
    let mut client = plain(&instance.uri());
    let mut held = client.clone();
    let in_flight = tokio::spawn(async move { call(&mut held).await });
    let faults = instance.faults().clone();
    wait_until("the call is held", LIMIT, || faults.held() == 1).await;

    instance.kill();
    assert!(!instance.is_running());
    let outcome = tokio::time::timeout(LIMIT, in_flight)
        .await
        .expect("the call in flight ends when its instance is killed")
        .unwrap();
    assert!(
        outcome.is_err(),
        "a call in flight survived a kill: {outcome:?}"
    );
    assert_refused(instance.addr()).await;
    let after = call(&mut client).await;
    assert!(after.is_err(), "a call after the kill: {after:?}");
    assert_eq!(instance.open_connections(), 0);
    // Killing it again does nothing.
    instance.kill();
    assert!(!instance.is_running());
}

/// `restart`: the same port serves again, with the same faults handle (a script set before the
/// kill still applies, and the counts go on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_serves_on_the_same_port_with_the_same_faults() {
    let mut instance = Instance::start("r", greeter("r"));
    let (addr, uri) = (instance.addr(), instance.uri());
    assert_eq!(call(&mut plain(&uri)).await.unwrap(), greeting("r"));
    instance
        .faults()
        .set(Script::new().fail(Code::PermissionDenied, "scripted before the kill"));
    instance.kill();
    assert_refused(addr).await;

    instance.restart();
    assert!(instance.is_running());
    assert_eq!(instance.addr(), addr);
    assert_eq!(instance.uri(), uri);
    let mut client = plain(&uri);
    let refused = call(&mut client).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(refused.message(), "scripted before the kill");
    instance.faults().clear();
    assert_eq!(call(&mut client).await.unwrap(), greeting("r"));
    // The handle's counts span the restart, and so do the connection counts.
    assert_eq!(instance.faults().calls(), 3);
    assert_eq!(instance.connections(), 2);
    assert_eq!(instance.open_connections(), 1);

    // A restart of a running instance kills it first and serves again.
    instance.restart();
    assert!(instance.is_running());
    assert_eq!(call(&mut plain(&uri)).await.unwrap(), greeting("r"));
}

/// Dropping an instance stops it: its port refuses connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_instance_stops_it() {
    let instance = Instance::start("d", greeter("d"));
    let addr = instance.addr();
    let mut client = plain(&instance.uri());
    assert_eq!(call(&mut client).await.unwrap(), greeting("d"));
    drop(instance);
    assert_refused(addr).await;
    assert!(call(&mut client).await.is_err());
}

/// Dropping a fleet stops every instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_fleet_stops_every_instance() {
    let fleet = Fleet::start(3, |i| greeter(&format!("i{i}")));
    let addrs: Vec<SocketAddr> = fleet.instances().iter().map(Instance::addr).collect();
    for uri in fleet.uris() {
        assert!(call(&mut plain(&uri)).await.is_ok());
    }
    drop(fleet);
    for addr in addrs {
        assert_refused(addr).await;
    }
}

// ---------------------------------------------------------------------------------------------
// GOAWAY, graceful stop, refused connections
// ---------------------------------------------------------------------------------------------

/// `goaway`: the open connection gets a GOAWAY; its call in flight (held) still completes
/// once released, the next calls go on a new connection, the old one closes once its call has
/// ended, and the instance keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_moves_new_calls_to_a_new_connection() {
    let fleet = Fleet::start(1, |_| greeter("g"));
    // One connection per instance. With the default (4), a call that the GOAWAY'd connection
    // fails before it left is sent again "preferably on another connection", which opens an
    // extra connection; the channel's own connection reconnects later anyway, and the count
    // ends at 3 in some runs (about 3 in 20 here): the channel's doing, not the instance's.
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .max_connections_per_instance(1)
        .build()
        .unwrap();
    let faults = fleet[0].faults().clone();
    faults.set(Script::new().hold());
    let mut held = GreeterClient::new(channel.clone());
    let in_flight =
        tokio::spawn(async move { held.say_hello(hello(Duration::from_secs(60))).await });
    wait_until("the call is held", LIMIT, || faults.held() == 1).await;
    faults.clear();
    assert_eq!(fleet[0].connections(), 1);
    assert_eq!(fleet[0].open_connections(), 1);

    fleet[0].goaway();
    // Calls made before the client has read the GOAWAY may still go on the old connection
    // (the server takes them): call until one has opened the new connection. None may fail.
    let mut client = GreeterClient::new(channel.clone());
    let start = Instant::now();
    while fleet[0].connections() < 2 {
        assert!(start.elapsed() < LIMIT, "no new connection after a GOAWAY");
        let reply = client.say_hello(hello(Duration::from_secs(10))).await;
        assert_eq!(reply.unwrap().into_inner().message, greeting("g"));
    }
    assert_eq!(fleet[0].connections(), 2);
    assert_eq!(
        fleet[0].open_connections(),
        2,
        "the old connection closed under its call"
    );
    assert!(
        !in_flight.is_finished(),
        "the held call ended before its release"
    );

    assert_eq!(faults.release(1), 1);
    let reply = tokio::time::timeout(LIMIT, in_flight)
        .await
        .expect("the held call ends once released")
        .unwrap()
        .expect("the call in flight at the GOAWAY completes");
    assert_eq!(reply.into_inner().message, greeting("g"));
    wait_until("the old connection closes", LIMIT, || {
        fleet[0].open_connections() == 1
    })
    .await;

    assert!(fleet[0].is_running());
    for _ in 0..5 {
        let reply = client.say_hello(hello(Duration::from_secs(10))).await;
        assert_eq!(reply.unwrap().into_inner().message, greeting("g"));
    }
    assert_eq!(
        fleet[0].connections(),
        2,
        "calls after the GOAWAY opened more connections"
    );
    assert_eq!(fleet[0].peak_connections(), 2);
}

/// `stop_gracefully`: a held call in flight completes once released (before the limit), then
/// the instance is stopped: its port refuses connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_gracefully_lets_calls_in_flight_finish() {
    let mut instance = Instance::start("s", greeter("s"));
    let faults = instance.faults().clone();
    faults.set(Script::new().hold());
    let mut held = plain(&instance.uri());
    let in_flight = tokio::spawn(async move { call(&mut held).await });
    wait_until("the call is held", LIMIT, || faults.held() == 1).await;

    let limit = Duration::from_secs(60);
    let start = Instant::now();
    let ((), released) = tokio::join!(instance.stop_gracefully(limit), async {
        // `stop_gracefully` has asked the instance for its GOAWAY and the listener's close
        // by now (join! polls it first); release the call it waits for.
        tokio::task::yield_now().await;
        faults.release(1)
    });
    let took = start.elapsed();
    assert_eq!(released, 1);
    assert!(
        took < limit,
        "stop_gracefully waited for its limit ({took:?}) though the call ended"
    );
    let outcome = in_flight.await.unwrap();
    assert_eq!(outcome.unwrap(), greeting("s"));
    assert!(!instance.is_running());
    assert_eq!(instance.open_connections(), 0);
    assert_refused(instance.addr()).await;

    // A restart serves again.
    instance.restart();
    faults.clear();
    assert_eq!(
        call(&mut plain(&instance.uri())).await.unwrap(),
        greeting("s")
    );
}

/// `stop_gracefully` with a call that never ends returns after its limit (wall time) anyway,
/// and the instance is stopped: the call fails, the port refuses connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_gracefully_gives_up_after_its_limit() {
    let mut instance = Instance::start("h", greeter("h"));
    let faults = instance.faults().clone();
    faults.set(Script::new().hang());
    let mut hanging = plain(&instance.uri());
    let in_flight = tokio::spawn(async move {
        // No deadline: the call never ends on its own.
        hanging
            .say_hello(Request::new(HelloRequest { name: "h".into() }))
            .await
    });
    wait_until("the call hangs", LIMIT, || faults.in_flight() == 1).await;

    let limit = Duration::from_millis(500);
    let start = Instant::now();
    tokio::time::timeout(LIMIT, instance.stop_gracefully(limit))
        .await
        .expect("stop_gracefully returns after its limit");
    let took = start.elapsed();
    assert!(took >= limit, "stop_gracefully returned after {took:?}");
    assert!(!instance.is_running());
    assert_refused(instance.addr()).await;
    let outcome = tokio::time::timeout(LIMIT, in_flight)
        .await
        .expect("the hanging call ends when the instance stops")
        .unwrap();
    assert!(outcome.is_err(), "{outcome:?}");
}

/// `refuse_connections(true)`: new connections are turned away (counted; a plain channel's
/// call fails UNAVAILABLE) while an open one keeps working; `false` serves new ones again.
#[tokio::test]
async fn refuse_connections_turns_new_connections_away() {
    let instance = Instance::start("f", greeter("f"));
    let uri = instance.uri();
    let mut open = plain(&uri);
    assert_eq!(call(&mut open).await.unwrap(), greeting("f"));

    instance.refuse_connections(true);
    // tonic's plain channel reports the connection closed under its first request as
    // CANCELLED ("connection closed") or UNKNOWN (reset, broken pipe), as the race goes; a
    // BalancedChannel as UNAVAILABLE.
    let refused = call(&mut plain(&uri)).await.unwrap_err();
    assert!(TURNED_AWAY.contains(&refused.code()), "{refused:?}");
    assert_eq!(instance.turned_away(), 1);
    let balanced = BalancedChannel::builder()
        .endpoint(instance.endpoint())
        .build()
        .unwrap();
    let refused = GreeterClient::new(balanced)
        .say_hello(hello(Duration::from_secs(10)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(instance.turned_away() >= 2);
    assert_eq!(
        instance.connections(),
        1,
        "a refused connection counted as served"
    );
    assert_eq!(call(&mut open).await.unwrap(), greeting("f"));
    assert_eq!(
        instance.faults().calls(),
        2,
        "a refused connection's call reached the service"
    );

    instance.refuse_connections(false);
    let turned_away = instance.turned_away();
    assert_eq!(call(&mut plain(&uri)).await.unwrap(), greeting("f"));
    assert_eq!(instance.connections(), 2);
    assert_eq!(instance.open_connections(), 2);
    assert_eq!(instance.turned_away(), turned_away);
}

// ---------------------------------------------------------------------------------------------
// Server options
// ---------------------------------------------------------------------------------------------

fn start_with(name: &str, options: ServerOptions) -> Instance {
    let at: SocketAddr = "127.0.0.1:0".parse().unwrap();
    Instance::start_with(name, at, Routes::new(greeter(name)), options)
}

/// `max_connections(1)`: a second connection is turned away while the first is open; once the
/// first has closed, a new one is served.
#[tokio::test]
async fn max_connections_turns_away_the_connection_too_many() {
    let instance = start_with("m", ServerOptions::new().max_connections(1));
    let uri = instance.uri();
    let mut first = plain(&uri);
    assert_eq!(call(&mut first).await.unwrap(), greeting("m"));
    let mut second = plain(&uri);
    let refused = call(&mut second).await.unwrap_err();
    assert!(TURNED_AWAY.contains(&refused.code()), "{refused:?}");
    assert_eq!(instance.turned_away(), 1);
    assert_eq!(instance.connections(), 1);
    assert_eq!(call(&mut first).await.unwrap(), greeting("m"));

    drop(first);
    wait_until("the first connection closes", LIMIT, || {
        instance.open_connections() == 0
    })
    .await;
    assert_eq!(call(&mut second).await.unwrap(), greeting("m"));
    assert_eq!(instance.connections(), 2);
    assert_eq!(instance.peak_connections(), 1);
}

/// `max_concurrent_streams(1)`: the client sends one call at a time on its connection; the
/// others wait for it (none fails), so the instance never has two at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_streams_serves_one_call_at_a_time() {
    let instance = start_with("c", ServerOptions::new().max_concurrent_streams(1));
    let faults = instance.faults().clone();
    let client = plain(&instance.uri());
    // The connection opens first, so that the client knows the limit before the calls go.
    assert_eq!(call(&mut client.clone()).await.unwrap(), greeting("c"));
    faults.set(Script::new().delay(Duration::from_millis(100)));
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { call(&mut client).await })
        })
        .collect();
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), greeting("c"));
    }
    assert_eq!(faults.calls(), 6);
    assert_eq!(
        faults.peak_in_flight(),
        1,
        "two calls at once on one stream's room"
    );
    assert_eq!(instance.connections(), 1);
}

/// Without the stream limit, the same calls overlap at the instance (what the test above
/// relies on to mean something).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_stream_limit_calls_overlap() {
    let instance = start_with("o", ServerOptions::new());
    let faults = instance.faults().clone();
    let client = plain(&instance.uri());
    assert_eq!(call(&mut client.clone()).await.unwrap(), greeting("o"));
    faults.set(Script::new().hold());
    let calls: Vec<_> = (0..5)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { call(&mut client).await })
        })
        .collect();
    wait_until("5 calls held at once", LIMIT, || faults.held() == 5).await;
    faults.release(5);
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap(), greeting("o"));
    }
    assert_eq!(faults.peak_in_flight(), 5);
}

/// `max_connection_age`: the instance rotates its connections (GOAWAY once they are that old):
/// the connections it served grow over time while calls succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connection_age_rotates_connections() {
    let options = ServerOptions::new().max_connection_age(Duration::from_millis(200));
    let fleet = Fleet::start_with(1, |i| {
        (Routes::new(greeter(&format!("i{i}"))), options.clone())
    });
    let mut client = GreeterClient::new(balanced(&fleet));
    let start = Instant::now();
    let mut calls = 0;
    while fleet[0].connections() < 3 {
        assert!(
            start.elapsed() < LIMIT,
            "{} connections after {calls} calls",
            fleet[0].connections()
        );
        let reply = client.say_hello(hello(Duration::from_secs(10))).await;
        assert_eq!(reply.unwrap().into_inner().message, greeting("i0"));
        calls += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `ServerOptions::faults`: two instances sharing one handle count their calls together, and a
/// script set through one applies to the other.
#[tokio::test]
async fn a_faults_handle_shared_by_two_instances() {
    let faults = Faults::new();
    let a = start_with("a", ServerOptions::new().faults(faults.clone()));
    let b = start_with("b", ServerOptions::new().faults(faults.clone()));
    assert_eq!(call(&mut plain(&a.uri())).await.unwrap(), greeting("a"));
    assert_eq!(call(&mut plain(&b.uri())).await.unwrap(), greeting("b"));
    assert_eq!(faults.calls(), 2);
    assert_eq!(a.faults().calls(), 2);
    assert_eq!(b.faults().method(SAY_HELLO).calls, 2);

    a.faults().set(Script::new().fail(Code::Aborted, "shared"));
    let failed = call(&mut plain(&b.uri())).await.unwrap_err();
    assert_eq!((failed.code(), failed.message()), (Code::Aborted, "shared"));
    assert_eq!(faults.calls(), 3);
}

/// `connections`, `open_connections`, `peak_connections`: three clients make three
/// connections; two go away, the open count falls to one, and the others stay.
#[tokio::test]
async fn connection_counts() {
    let instance = Instance::start("n", greeter("n"));
    assert_eq!(
        (
            instance.connections(),
            instance.open_connections(),
            instance.peak_connections()
        ),
        (0, 0, 0)
    );
    let mut clients: Vec<_> = (0..3).map(|_| plain(&instance.uri())).collect();
    for client in &mut clients {
        assert_eq!(call(client).await.unwrap(), greeting("n"));
    }
    // A second call on a client reuses its connection.
    assert_eq!(call(&mut clients[0]).await.unwrap(), greeting("n"));
    assert_eq!(instance.connections(), 3);
    assert_eq!(instance.open_connections(), 3);
    assert_eq!(instance.peak_connections(), 3);

    clients.truncate(1);
    wait_until("two connections close", LIMIT, || {
        instance.open_connections() == 1
    })
    .await;
    assert_eq!(instance.connections(), 3);
    assert_eq!(instance.peak_connections(), 3);
    assert_eq!(instance.turned_away(), 0);
}

// ---------------------------------------------------------------------------------------------
// Fleet
// ---------------------------------------------------------------------------------------------

/// `Fleet::start`: instances `i0..i{n-1}`, each serving what `service(i)` made; `uris`,
/// `endpoints`, `by_name`, `by_uri`, `calls`, indexing, `len`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_names_and_finds_its_instances() {
    let mut fleet = Fleet::start(3, |i| greeter(&format!("made {i}")));
    assert_eq!(fleet.len(), 3);
    assert!(!fleet.is_empty());
    let names: Vec<&str> = fleet.instances().iter().map(Instance::name).collect();
    assert_eq!(names, ["i0", "i1", "i2"]);
    let uris = fleet.uris();
    assert_eq!(uris.len(), 3);
    for (i, uri) in uris.iter().enumerate() {
        assert_eq!(*uri, fleet[i].uri());
        assert_eq!(
            fleet.endpoints()[i].uri().to_string().trim_end_matches('/'),
            uri
        );
        assert_eq!(fleet.by_name(&format!("i{i}")).uri(), *uri);
        assert_eq!(fleet.by_uri(uri).map(Instance::name), Some(fleet[i].name()));
        assert_eq!(
            fleet.by_uri(&format!("{uri}/")).map(Instance::name),
            Some(fleet[i].name())
        );
        // The i-th instance serves what `service(i)` made.
        assert_eq!(
            call(&mut plain(uri)).await.unwrap(),
            greeting(&format!("made {i}"))
        );
    }
    let distinct: std::collections::BTreeSet<&String> = uris.iter().collect();
    assert_eq!(distinct.len(), 3, "{uris:?}");
    assert!(fleet.by_uri(&unreachable_uri()).is_none());

    let mut second = plain(&uris[1]);
    for _ in 0..2 {
        call(&mut second).await.unwrap();
    }
    assert_eq!(fleet.calls(), [1, 3, 1]);

    // IndexMut (and instances_mut): kill and restart through the fleet.
    fleet[1].kill();
    assert!(!fleet[1].is_running());
    assert_refused(fleet[1].addr()).await;
    fleet.instances_mut()[1].restart();
    assert!(fleet.by_name("i1").is_running());
    assert_eq!(
        call(&mut plain(&uris[1])).await.unwrap(),
        greeting("made 1")
    );
}

/// `Fleet::by_name` panics on a name it does not have, naming it.
#[test]
#[should_panic(expected = "no instance called i7")]
fn by_name_panics_on_an_unknown_name() {
    let fleet = Fleet::start(2, |i| greeter(&format!("i{i}")));
    let _ = fleet.by_name("i7");
}

/// `Fleet::start_with` makes each instance's routes and options with `make(i)`;
/// `Fleet::from_instances` takes instances started elsewhere.
#[tokio::test]
async fn a_fleet_with_options_and_from_instances() {
    let fleet = Fleet::start_with(2, |i| {
        let options = ServerOptions::new().max_connections(i + 1);
        (Routes::new(greeter(&format!("w{i}"))), options)
    });
    assert_eq!(fleet[1].name(), "i1");
    for i in 0..2 {
        let mut first = plain(&fleet[i].uri());
        assert_eq!(call(&mut first).await.unwrap(), greeting(&format!("w{i}")));
        // i0 takes one connection, i1 two.
        let second = call(&mut plain(&fleet[i].uri())).await;
        assert_eq!(second.is_ok(), i == 1, "instance {i}: {second:?}");
    }

    let fleet = Fleet::from_instances(vec![Instance::start("solo", greeter("solo"))]);
    assert_eq!(fleet.len(), 1);
    assert_eq!(fleet.by_name("solo").name(), "solo");
    assert!(Fleet::from_instances(Vec::new()).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Tally, served_by, stats
// ---------------------------------------------------------------------------------------------

/// `Tally` over a `BalancedChannel`'s responses: what it counts per instance is what each
/// instance served, and sums to the calls; `share` is each one's part; `served_by` names the
/// instance that answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tally_counts_the_calls_each_instance_served() {
    let fleet = Fleet::start(3, |i| greeter(&format!("i{i}")));
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let mut client = GreeterClient::new(channel.clone());
    let tally = Tally::new();
    for _ in 0..30 {
        let outcome = client.say_hello(hello(Duration::from_secs(10))).await;
        let response = outcome.as_ref().expect("a call to a healthy fleet");
        let by = served_by(response).expect("a BalancedChannel's response names its instance");
        let instance = fleet
            .by_uri(by)
            .unwrap_or_else(|| panic!("{by} is not in the fleet"));
        assert_eq!(response.get_ref().message, greeting(instance.name()));
        tally.clone().record(&outcome);
    }
    assert_eq!(tally.total(), 30);
    assert_eq!(tally.failed(), 0);
    assert!(tally.failures().is_empty());
    let mut sum = 0;
    let mut shares = 0.0;
    for (i, uri) in fleet.uris().iter().enumerate() {
        let served = tally.served(uri);
        assert_eq!(
            served,
            fleet[i].faults().calls(),
            "{uri}: {:?}",
            tally.by_instance()
        );
        assert!(served >= 1, "round robin skipped {uri}");
        assert_eq!(tally.served(&format!("{uri}/")), served);
        assert!((tally.share(uri) - served as f64 / 30.0).abs() < 1e-9);
        assert_eq!(stats(&channel, uri).started(), served);
        sum += served;
        shares += tally.share(uri);
    }
    assert_eq!(sum, 30);
    assert!((shares - 1.0).abs() < 1e-9);
    assert_eq!(tally.by_instance().values().sum::<u64>(), 30);
    assert_eq!(tally.by_instance().len(), 3);
    assert_eq!(tally.share(&unreachable_uri()), 0.0);
    assert_eq!(Tally::new().share(&fleet[0].uri()), 0.0);
}

/// `Tally` with a failing instance: its failures are counted by status, and it served none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tally_counts_failures_by_status() {
    let fleet = Fleet::start(3, |i| greeter(&format!("i{i}")));
    fleet[0]
        .faults()
        .set(Script::new().fail(Code::PermissionDenied, "i0 says no"));
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .strategy(Strategy::RoundRobin)
        .build()
        .unwrap();
    let mut client = GreeterClient::new(channel);
    let tally = Tally::new();
    for _ in 0..30 {
        tally.record(&client.say_hello(hello(Duration::from_secs(10))).await);
    }
    let failed = fleet[0].faults().calls();
    assert!(failed >= 1, "round robin skipped the failing instance");
    assert_eq!(tally.failed(), failed);
    assert_eq!(
        tally.failures(),
        [(Code::PermissionDenied, "i0 says no".to_owned(), failed)]
    );
    assert_eq!(tally.served(&fleet[0].uri()), 0);
    assert_eq!(tally.total(), 30);
    assert_eq!(
        tally.served(&fleet[1].uri()) + tally.served(&fleet[2].uri()),
        30 - failed
    );
    assert!((tally.share(&fleet[0].uri())).abs() < 1e-9);
}

/// A response that did not come through a `BalancedChannel` names no instance: `served_by` is
/// `None`, and a `Tally` counts it under `"?"`.
#[tokio::test]
async fn a_plain_channels_response_names_no_instance() {
    let instance = Instance::start("p", greeter("p"));
    let response = plain(&instance.uri())
        .say_hello(hello(Duration::from_secs(10)))
        .await;
    assert_eq!(served_by(response.as_ref().unwrap()), None);
    let tally = Tally::new();
    tally.record(&response);
    assert_eq!(
        tally.by_instance().into_iter().collect::<Vec<_>>(),
        [("?".to_owned(), 1)]
    );
    assert_eq!(tally.served(&instance.uri()), 0);
}

// ---------------------------------------------------------------------------------------------
// StateLog
// ---------------------------------------------------------------------------------------------

/// `StateLog`: an instance killed while a `BalancedChannel` calls it goes from Ready to
/// Failing, and back to Ready once restarted; the other stays out of Failing; an instance
/// removed from the channel leaves the log's set (`None`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_log_sees_a_kill_and_a_restart() {
    let mut fleet = Fleet::start(2, |i| greeter(&format!("i{i}")));
    let channel = BalancedChannel::builder()
        .endpoints(fleet.endpoints())
        .backoff(
            Backoff::default()
                .initial(Duration::from_millis(50))
                .max(Duration::from_millis(200)),
        )
        .build()
        .unwrap();
    let log = StateLog::start(channel.clone(), Duration::from_millis(5));
    let (uri0, uri1) = (fleet[0].uri(), fleet[1].uri());
    let tally = Tally::new();
    let (mut client, calls) = (GreeterClient::new(channel.clone()), tally.clone());
    let caller = tokio::spawn(async move {
        loop {
            calls.record(&client.say_hello(hello(Duration::from_secs(2))).await);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    wait_until("both instances are Ready", LIMIT, || {
        log.states(&uri0).last() == Some(&Some(State::Ready))
            && log.states(&uri1).last() == Some(&Some(State::Ready))
    })
    .await;

    fleet[0].kill();
    wait_until("the killed instance is Failing", LIMIT, || {
        log.went_through(&uri0, &[State::Ready, State::Failing])
    })
    .await;
    assert!(!log.went_through(&uri0, &[State::Failing, State::Ready]));
    let served = tally.served(&uri0);

    fleet[0].restart();
    wait_until("the restarted instance is Ready again", LIMIT, || {
        log.went_through(&uri0, &[State::Ready, State::Failing, State::Ready])
    })
    .await;
    wait_until("calls reach the restarted instance", LIMIT, || {
        tally.served(&uri0) > served
    })
    .await;
    assert_eq!(log.states(&uri0).last(), Some(&Some(State::Ready)));
    assert!(
        !log.states(&uri1).contains(&Some(State::Failing)),
        "the live instance failed: {:?}",
        log.states(&uri1)
    );

    // `changes` holds both instances' changes, in order of time, each a change.
    let changes = log.changes();
    assert!(
        changes.windows(2).all(|w| w[0].at <= w[1].at),
        "{changes:?}"
    );
    for uri in [&uri0, &uri1] {
        let states = log.states(uri);
        assert!(states.windows(2).all(|w| w[0] != w[1]), "{uri}: {states:?}");
        let of_uri: Vec<_> = changes
            .iter()
            .filter(|c| c.uri.trim_end_matches('/') == uri.as_str())
            .map(|c| c.state)
            .collect();
        assert_eq!(of_uri, states);
    }

    channel.remove(&uri1).unwrap();
    wait_until("the removed instance leaves the log's set", LIMIT, || {
        log.states(&uri1).last() == Some(&None)
    })
    .await;
    caller.abort();
}

// ---------------------------------------------------------------------------------------------
// Addresses that never serve
// ---------------------------------------------------------------------------------------------

/// `unreachable_uri`: every connection is refused at once; two calls give two addresses.
#[tokio::test]
async fn an_unreachable_uri_refuses_connections() {
    let (a, b) = (unreachable_uri(), unreachable_uri());
    assert_ne!(a, b);
    for uri in [&a, &b] {
        assert!(uri.starts_with("http://127.0.0.1:"), "{uri}");
        assert_refused(addr_of(uri)).await;
    }
    // Again: it stays refusing.
    assert_refused(addr_of(&a)).await;
}

/// `black_hole_uri`: a connection never completes (a connect with a timeout times out).
#[tokio::test]
async fn a_black_hole_uri_never_completes_a_connect() {
    let uri = black_hole_uri();
    assert!(uri.starts_with("http://127.0.0.1:"), "{uri}");
    let connect = tokio::net::TcpStream::connect(addr_of(&uri));
    let outcome = tokio::time::timeout(Duration::from_millis(300), connect).await;
    assert!(outcome.is_err(), "the connect did not hang: {outcome:?}");
    // A tonic channel's connect times out too.
    let endpoint = tonic::transport::Endpoint::from_shared(uri)
        .unwrap()
        .connect_timeout(Duration::from_millis(300));
    let start = Instant::now();
    let error = endpoint
        .connect()
        .await
        .expect_err("a connect to a black hole");
    assert!(start.elapsed() >= Duration::from_millis(300), "{error:?}");
}

// ---------------------------------------------------------------------------------------------
// Load reports (ORCA)
// ---------------------------------------------------------------------------------------------

#[cfg(feature = "orca")]
mod orca {
    use super::*;
    use tonic_balancer::orca::{LoadReport, OrcaHandle, TRAILER};

    const OOB: &str = "/xds.service.orca.v3.OpenRcaService/StreamCoreMetrics";

    /// The load report on a plain channel's response (tonic merges the trailers into a unary
    /// response's metadata), if any.
    async fn report_of(client: &mut GreeterClient<Channel>) -> Option<LoadReport> {
        let response = client
            .say_hello(hello(Duration::from_secs(10)))
            .await
            .expect("a call");
        let value = response.metadata().get_bin(TRAILER)?;
        let bytes = value.to_bytes().expect("base64 of a load report");
        Some(LoadReport::decode(&bytes).expect("a load report that decodes"))
    }

    /// `ServerOptions::orca`: each response carries the `endpoint-load-metrics-bin` trailer
    /// with the handle's report; `set_per_call_reports(false)` takes it off, `true` puts it
    /// back.
    #[tokio::test]
    async fn orca_reports_on_every_response() {
        let handle = OrcaHandle::new();
        handle.set_cpu_utilization(0.25);
        let instance = start_with("r", ServerOptions::new().orca(handle.clone()));
        let mut client = plain(&instance.uri());
        let report = report_of(&mut client).await.expect("a load report");
        assert_eq!(report.cpu_utilization, 0.25);
        handle.set_cpu_utilization(0.75);
        let report = report_of(&mut client).await.expect("a load report");
        assert_eq!(report.cpu_utilization, 0.75);

        instance.set_per_call_reports(false);
        assert_eq!(report_of(&mut client).await, None);
        assert_eq!(report_of(&mut plain(&instance.uri())).await, None);
        instance.set_per_call_reports(true);
        assert!(report_of(&mut client).await.is_some());
    }

    /// Without `orca`, no report.
    #[tokio::test]
    async fn no_report_without_orca() {
        let instance = Instance::start("n", greeter("n"));
        assert_eq!(report_of(&mut plain(&instance.uri())).await, None);
    }

    /// A `BalancedChannel` takes the per-call reports in: `stats(..).load_report()`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_balanced_channel_sees_the_per_call_reports() {
        let handles: Vec<OrcaHandle> = (0..2).map(|_| OrcaHandle::new()).collect();
        handles[0].set_cpu_utilization(0.2);
        handles[1].set_cpu_utilization(0.6);
        let fleet = Fleet::start_with(2, |i| {
            let options = ServerOptions::new().orca(handles[i].clone());
            (Routes::new(greeter(&format!("i{i}"))), options)
        });
        let channel = BalancedChannel::builder()
            .endpoints(fleet.endpoints())
            .strategy(Strategy::RoundRobin)
            .build()
            .unwrap();
        for uri in fleet.uris() {
            assert!(stats(&channel, &uri).load_report().is_none());
        }
        let mut client = GreeterClient::new(channel.clone());
        for _ in 0..6 {
            client
                .say_hello(hello(Duration::from_secs(10)))
                .await
                .unwrap();
        }
        for (i, cpu) in [(0, 0.2), (1, 0.6)] {
            let s = stats(&channel, &fleet[i].uri());
            let report = s
                .load_report()
                .unwrap_or_else(|| panic!("no report from i{i}"));
            assert_eq!(report.cpu_utilization, cpu);
        }
    }

    /// `orca_oob`: the instance serves OpenRcaService; a `BalancedChannel` asking for
    /// out-of-band reports gets them without a single call of its own (per-call reports off).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn orca_oob_serves_out_of_band_reports() {
        let handle = OrcaHandle::new();
        handle.set_cpu_utilization(0.5);
        let options = ServerOptions::new()
            .orca(handle.clone())
            .orca_oob(Duration::from_millis(50));
        let instance = start_with("o", options);
        instance.set_per_call_reports(false);
        let uri = instance.uri();
        let channel = BalancedChannel::builder()
            .endpoint(instance.endpoint())
            .load_reports_out_of_band(Duration::from_millis(100))
            .build()
            .unwrap();
        let cpu = |want: f64| {
            stats(&channel, &uri)
                .load_report()
                .is_some_and(|r| r.cpu_utilization == want)
        };
        wait_until("an out-of-band report", LIMIT, || cpu(0.5)).await;
        assert!(instance.faults().method(OOB).calls >= 1);
        assert_eq!(instance.faults().method(SAY_HELLO).calls, 0);
        // The stream goes on: a new load is reported.
        handle.set_cpu_utilization(0.9);
        wait_until("the next out-of-band report", LIMIT, || cpu(0.9)).await;
    }
}
