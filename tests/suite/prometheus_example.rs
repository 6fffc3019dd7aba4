//! The `prometheus` example as a person runs it: built, started as a process of its own on a
//! free port, and scraped over HTTP at the address its `curl` line prints. Every instrument of
//! the `metrics` feature must be in the scrape with its unit suffix, its kind, its labels and
//! values that make sense for the example's scenario.
//!
//! The example is built by this test with the features this test was built with (so that the
//! library is not compiled again): `cargo test` builds the examples already, and then that build
//! finds nothing to do; `cargo test --test suite prometheus_example` alone builds it here.
#![cfg(feature = "metrics")]
use fleet_service as fleet;

use fleet::prom::Scrape;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest the build of the example may take (it builds the example alone when `cargo test`
/// built it already; on a loaded machine, a cold build of it and its dependencies is minutes).
const BUILD_LIMIT: Duration = Duration::from_secs(900);
/// Longest the example may take to print where it serves.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Longest to wait for every instrument to show in a scrape (the scenario's round is 12 s).
const SCRAPE_LIMIT: Duration = Duration::from_secs(150);
/// The example exits by itself after this many seconds, should this test die without killing
/// it.
const EXAMPLE_SECONDS: u64 = 240;

const TARGET: &str = "fleet.example";
const UNARY: &str = "fleet.v1.Fleet/Unary";
const SERVER_STREAM: &str = "fleet.v1.Fleet/ServerStream";

/// A child process killed (and reaped) when dropped, on every path out of the test.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `child` to exit, at most `limit`; returns its stdout and stderr.
fn finish(child: Child, limit: Duration, what: &str) -> (String, String) {
    let mut child = Killed(child);
    let mut out = child.0.stdout.take().expect("piped stdout");
    let mut err = child.0.stderr.take().expect("piped stderr");
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("wait for the child") {
            break status;
        }
        assert!(start.elapsed() < limit, "{what}: not done after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    assert!(status.success(), "{what} failed ({status}):\n{err}");
    (out, err)
}

/// Builds the example with this test's features and profile; returns its executable.
fn build_example() -> PathBuf {
    let mut features = vec!["metrics"];
    if cfg!(feature = "hickory-dns") {
        features.push("hickory-dns");
    }
    if cfg!(feature = "health-check") {
        features.push("health-check");
    }
    if cfg!(feature = "orca") {
        features.push("orca");
    }
    if cfg!(feature = "service-config") {
        features.push("service-config");
    }
    // This test runs from `<target dir>/<profile>/deps/`: the example goes in the same target
    // directory, with the same profile, so that what `cargo test` built is used as it is.
    let exe = std::env::current_exe().expect("the test's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("<profile>/deps");
    let target_dir = profile_dir.parent().expect("<target dir>/<profile>");
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // Without the variables cargo sets for this test's own run: build scripts that watch one
    // (ring watches CARGO_MANIFEST_DIR) would see a change, and cargo would build them and
    // everything above them again, here and in the next `cargo test`.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_by_cargo = key.starts_with("CARGO_PKG_")
            || [
                "CARGO_MANIFEST_DIR",
                "CARGO_MANIFEST_PATH",
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&&*key);
        if set_by_cargo {
            cmd.env_remove(&*key);
        }
    }
    cmd.args(["build", "--example", "prometheus", "--message-format=json"])
        .arg("--manifest-path")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--features")
        .arg(features.join(","));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run cargo");
    let (out, _) = finish(child, BUILD_LIMIT, "cargo build --example prometheus");
    // The artifact message of the example names its executable.
    let exe = out
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && l.contains("\"prometheus\""))
        .find_map(|l| {
            let rest = &l[l.find("\"executable\":\"")? + "\"executable\":\"".len()..];
            Some(PathBuf::from(&rest[..rest.find('"')?]))
        })
        .unwrap_or_else(|| panic!("no executable for the example in cargo's output:\n{out}"));
    assert!(exe.is_file(), "{} is not there", exe.display());
    exe
}

/// One GET of `/metrics` over HTTP/1.0 (no chunked answer): the body.
async fn get(addr: &str) -> Result<String, String> {
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(Duration::from_secs(20), io)
        .await
        .map_err(|_| "no answer in 20 s".to_owned())?
        .map_err(|e| e.to_string())?;
    let answer = String::from_utf8(answer).map_err(|e| e.to_string())?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    if !head.starts_with("HTTP/1.") || !head.lines().next().unwrap_or("").contains(" 200 ") {
        return Err(format!("not 200 OK: {head}"));
    }
    Ok(body.to_owned())
}

/// The instruments, as Prometheus names them (`.` as `_`, the unit's suffix, `_total` for
/// counters), with their kind, the labels every sample must carry, and whether the scenario
/// must have made them count something (a counter above 0, a histogram with samples).
const INSTRUMENTS: &[(&str, &str, &[&str])] = &[
    // A66, per attempt and per call.
    (
        "grpc_client_attempt_started_total",
        "counter",
        &["grpc_method", "grpc_target"],
    ),
    (
        "grpc_client_attempt_duration_seconds",
        "histogram",
        &["grpc_method", "grpc_target", "grpc_status"],
    ),
    (
        "grpc_client_attempt_sent_total_compressed_message_size_bytes",
        "histogram",
        &["grpc_method", "grpc_target", "grpc_status"],
    ),
    (
        "grpc_client_attempt_rcvd_total_compressed_message_size_bytes",
        "histogram",
        &["grpc_method", "grpc_target", "grpc_status"],
    ),
    (
        "grpc_client_call_duration_seconds",
        "histogram",
        &["grpc_method", "grpc_target", "grpc_status"],
    ),
    // A96.
    (
        "grpc_client_call_retries",
        "histogram",
        &["grpc_method", "grpc_target"],
    ),
    (
        "grpc_client_call_transparent_retries",
        "histogram",
        &["grpc_method", "grpc_target"],
    ),
    (
        "grpc_client_call_retry_delay_seconds",
        "histogram",
        &["grpc_method", "grpc_target"],
    ),
    (
        "grpc_client_call_hedges",
        "histogram",
        &["grpc_method", "grpc_target"],
    ),
    (
        "tonic_balancer_client_call_refused_total",
        "counter",
        &["grpc_method", "grpc_target"],
    ),
    (
        "tonic_balancer_client_retry_budget_exhausted_total",
        "counter",
        &["grpc_target"],
    ),
    // A94.
    (
        "grpc_subchannel_connection_attempts_succeeded_total",
        "counter",
        &["grpc_target"],
    ),
    (
        "grpc_subchannel_connection_attempts_failed_total",
        "counter",
        &["grpc_target"],
    ),
    (
        "grpc_subchannel_disconnections_total",
        "counter",
        &["grpc_target", "grpc_disconnect_error"],
    ),
    (
        "grpc_subchannel_open_connections",
        "gauge",
        &["grpc_target"],
    ),
    // A91.
    (
        "grpc_lb_outlier_detection_ejections_enforced_total",
        "counter",
        &["grpc_target", "tonic_balancer_ejection_reason"],
    ),
    (
        "grpc_lb_outlier_detection_ejections_overflow_total",
        "counter",
        &["grpc_target", "tonic_balancer_ejection_reason"],
    ),
    (
        "grpc_lb_outlier_detection_ejections_enforced_success_rate_total",
        "counter",
        &["grpc_target"],
    ),
    (
        "grpc_lb_outlier_detection_ejections_detected_success_rate_total",
        "counter",
        &["grpc_target"],
    ),
    // The instances, per target (the default: no instance label, no latency gauge).
    (
        "tonic_balancer_instance_calls_in_flight",
        "gauge",
        &["grpc_target"],
    ),
    (
        "tonic_balancer_instance_state",
        "gauge",
        &["grpc_target", "tonic_balancer_state"],
    ),
    // Discovery.
    (
        "tonic_balancer_discovery_lookups_total",
        "counter",
        &["grpc_target"],
    ),
    (
        "tonic_balancer_discovery_failures_total",
        "counter",
        &["grpc_target"],
    ),
    (
        "tonic_balancer_instances_added_total",
        "counter",
        &["grpc_target"],
    ),
    (
        "tonic_balancer_instances_removed_total",
        "counter",
        &["grpc_target"],
    ),
];

/// What is missing from a scrape: each instrument that has no sample yet with the labels it
/// must carry, or (counters, histograms) only zeros; gauges must have samples.
fn missing(s: &Scrape) -> Vec<String> {
    let mut missing = Vec::new();
    for (name, kind, labels) in INSTRUMENTS {
        let sample = if *kind == "histogram" {
            format!("{name}_count")
        } else {
            (*name).to_owned()
        };
        let with = [("grpc_target", TARGET)];
        let samples: Vec<_> = s
            .matching(&sample, &with)
            .filter(|(l, _)| labels.iter().all(|k| l.contains_key(*k)))
            .collect();
        let counted = match *kind {
            "gauge" => !samples.is_empty(),
            _ => samples.iter().any(|(_, v)| *v > 0.0),
        };
        if !counted {
            missing.push(format!("{name} ({kind})"));
        }
    }
    missing
}

/// The example, run with a scenario round of 12 s: within a few rounds, a scrape at its `curl`
/// line's address shows every instrument of A66, A94, A91 and A96 and the balancer's own
/// instance and discovery ones, each with its unit suffix (`_seconds`, `_bytes`), its kind,
/// its default labels (`grpc_method`, `grpc_target`, `grpc_status`, the state, the reasons; no
/// instance label), A66's buckets, and values that fit the scenario: durations in seconds under a
/// bound, message sizes of the example's few-byte messages, gauges in their range, counts that
/// agree with each other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_serves_every_standard_instrument_with_sane_values() {
    let built = Instant::now();
    let exe = tokio::task::spawn_blocking(build_example).await.unwrap();
    eprintln!("example built in {:?}", built.elapsed());
    let child = Command::new(&exe)
        .args(["--port", "0", "--phase", "2", "--seconds"])
        .arg(EXAMPLE_SECONDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example");
    let mut child = Killed(child);
    // Its lines, read as they come (and read to the end, so that its pipe never fills).
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = child.0.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // Once nobody listens, the lines are only drained.
            let _ = tx.send(line);
        }
    });
    let curl = loop {
        let line = lines
            .recv_timeout(START_LIMIT)
            .expect("the example prints a curl line");
        if line.starts_with("curl ") {
            break line;
        }
    };
    let url = curl
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {curl:?}"));
    let addr = url
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("not http://host:port/metrics: {url}"));
    assert!(addr.starts_with("127.0.0.1:"), "served on loopback: {addr}");

    // Scrape until every instrument has counted something (the scenario's phases take turns).
    let start = Instant::now();
    let mut open_seen = false;
    let s = loop {
        let text = match get(addr).await {
            Ok(text) => text,
            Err(e) => {
                assert!(
                    child.0.try_wait().unwrap().is_none(),
                    "the example exited: {e}"
                );
                assert!(start.elapsed() < SCRAPE_LIMIT, "no scrape answered: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let s = Scrape::parse(text);
        // An open connection at some point (the gauge may be 0 everywhere in the "down" phase).
        open_seen |= s.sum(
            "grpc_subchannel_open_connections",
            &[("grpc_target", TARGET)],
        ) >= 1.0;
        let missing = missing(&s);
        if missing.is_empty() && open_seen {
            eprintln!("every instrument seen after {:?}", start.elapsed());
            break s;
        }
        assert!(
            start.elapsed() < SCRAPE_LIMIT,
            "after {SCRAPE_LIMIT:?}, missing (open connection seen: {open_seen}): {missing:#?}\n{}",
            s.text
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // Kinds, and the labels of every sample.
    let t = ("grpc_target", TARGET);
    for (name, kind, labels) in INSTRUMENTS {
        assert_eq!(s.kind(name), Some(*kind), "# TYPE of {name}");
        let sample = if *kind == "histogram" {
            format!("{name}_count")
        } else {
            (*name).to_owned()
        };
        for (l, v) in s.matching(&sample, &[t]) {
            for k in *labels {
                assert!(l.contains_key(*k), "{name} without {k}: {l:?}");
            }
            assert!(v.is_finite() && v >= 0.0, "{name} {l:?} = {v}");
            if let Some(m) = l.get("grpc_method") {
                let calls = [UNARY, SERVER_STREAM];
                assert!(
                    calls.contains(&m.as_str()),
                    "{name} of {m}: the example calls {calls:?}"
                );
            }
            assert!(
                !l.contains_key("tonic_balancer_instance"),
                "{name}: an instance label by default: {l:?}"
            );
        }
    }

    // The example runs while it is scraped, and a scrape reads one family after another while
    // calls end: values are compared within a family (one histogram's buckets and count are
    // read together), never across two. `tests/suite/metrics.rs` checks the relations across
    // families on a channel at rest.
    // A66: every call that ended OK did so in a sane time, in seconds.
    let ok = [("grpc_method", UNARY), t, ("grpc_status", "OK")];
    let unary = [("grpc_method", UNARY), t];
    let calls_ok = s.sum("grpc_client_call_duration_seconds_count", &ok);
    let calls = s.sum("grpc_client_call_duration_seconds_count", &unary);
    assert!(
        calls_ok > 0.0 && calls_ok <= calls,
        "{calls_ok} OK of {calls}"
    );
    assert!(s.sum("grpc_client_attempt_started_total", &unary) > 0.0);
    let mean = s.sum("grpc_client_call_duration_seconds_sum", &ok) / calls_ok;
    assert!(mean > 0.0 && mean < 5.0, "mean OK call: {mean} s");
    let statuses: Vec<_> = s
        .matching("grpc_client_attempt_duration_seconds_count", &unary)
        .map(|(l, _)| l["grpc_status"].clone())
        .collect();
    assert!(statuses.iter().any(|c| c == "UNAVAILABLE"), "{statuses:?}");
    // A66's buckets: latency, and sizes in bytes; the top bucket holds every sample.
    let bucket = |family: &str, le: &str| {
        s.matching(&format!("{family}_bucket"), &ok)
            .find(|(l, _)| l.get("le").map(String::as_str) == Some(le))
            .map(|(_, v)| v)
    };
    for le in ["0", "0.00001", "0.0003", "0.013", "0.065", "1", "100"] {
        let le: f64 = le.parse().unwrap();
        let found = s
            .matching("grpc_client_call_duration_seconds_bucket", &ok)
            .any(|(l, _)| l.get("le").and_then(|v| v.parse::<f64>().ok()) == Some(le));
        assert!(found, "no latency bucket le={le}");
    }
    assert_eq!(
        bucket("grpc_client_call_duration_seconds", "+Inf"),
        Some(calls_ok)
    );
    for family in [
        "grpc_client_attempt_sent_total_compressed_message_size_bytes",
        "grpc_client_attempt_rcvd_total_compressed_message_size_bytes",
    ] {
        for le in [0.0, 1024.0, 65536.0, 16777216.0, 4294967296.0] {
            let found = s
                .matching(&format!("{family}_bucket"), &ok)
                .any(|(l, _)| l.get("le").and_then(|v| v.parse::<f64>().ok()) == Some(le));
            assert!(found, "no size bucket le={le} for {family}");
        }
        // The example's messages: a request of an id (a few bytes), a reply of the instance's
        // name and the id; never empty, never near a kilobyte.
        let n = s.sum(&format!("{family}_count"), &ok);
        let mean = s.sum(&format!("{family}_sum"), &ok) / n;
        assert!((2.0..=64.0).contains(&mean), "{family}: mean {mean} bytes");
        assert_eq!(
            bucket(family, "1024"),
            Some(n),
            "{family}: every message < 1 KiB"
        );
        assert_eq!(
            bucket(family, "0"),
            Some(0.0),
            "{family}: no OK attempt without a message"
        );
    }

    // A96: retries were made, after some backoff; A66's count buckets, with most calls in the
    // first one (no retry) and every call in the top one.
    assert!(s.sum("grpc_client_call_retries_sum", &unary) > 0.0);
    assert!(s.sum("grpc_client_call_retry_delay_seconds_sum", &unary) > 0.0);
    for family in [
        "grpc_client_call_retries",
        "grpc_client_call_transparent_retries",
    ] {
        let n = s.sum(&format!("{family}_count"), &unary);
        let le = |le: &str| {
            s.matching(&format!("{family}_bucket"), &unary)
                .find(|(l, _)| l.get("le").map(String::as_str) == Some(le))
                .map(|(_, v)| v)
        };
        assert_eq!(le("+Inf"), Some(n), "{family}: every call");
        assert!(
            le("0").is_some_and(|z| z > n / 2.0),
            "{family}: most calls have none"
        );
        assert!(le("65536").is_some(), "{family}: A66's count buckets");
    }

    // A96: the hedged method's calls were hedged, counted in A66's count buckets; no other
    // method's (each call records its count, 0 included).
    let hedged = [("grpc_method", SERVER_STREAM), t];
    assert!(s.sum("grpc_client_call_hedges_sum", &hedged) > 0.0);
    assert!(
        s.matching("grpc_client_call_hedges_bucket", &hedged)
            .any(|(l, _)| l.get("le").map(String::as_str) == Some("65536")),
        "grpc_client_call_hedges: A66's count buckets"
    );
    assert_eq!(s.sum("grpc_client_call_hedges_sum", &unary), 0.0);

    // A94: disconnection reasons are A94's; open connections per instance in range.
    let a94 = [
        "connection reset",
        "connection timed out",
        "connection aborted",
        "socket error",
        "subchannel shutdown",
        "unknown",
    ];
    for (l, _) in s.matching("grpc_subchannel_disconnections_total", &[t]) {
        let why = &l["grpc_disconnect_error"];
        assert!(
            a94.contains(&why.as_str()) || why.starts_with("GOAWAY "),
            "{why}"
        );
    }
    // Summed over the example's six instances.
    let max_conns = 6.0 * tonic_balancer::DEFAULT_MAX_CONNECTIONS as f64;
    for (l, v) in s.matching("grpc_subchannel_open_connections", &[t]) {
        assert!(
            v.fract() == 0.0 && (0.0..=max_conns).contains(&v),
            "{l:?}: {v}"
        );
    }

    // A91: the reasons.
    for (l, _) in s.matching("grpc_lb_outlier_detection_ejections_enforced_total", &[t]) {
        let why = l["tonic_balancer_ejection_reason"].as_str();
        assert!(
            ["consecutive_failures", "probation", "success_rate"].contains(&why),
            "{why}"
        );
    }

    // Per target: calls in flight within the example's 16, the six instances counted in their
    // states (each in one; a removed one may still drain).
    let in_flight = s.sum("tonic_balancer_instance_calls_in_flight", &[t]);
    assert!((0.0..=32.0).contains(&in_flight), "{in_flight} in flight");
    let states = [
        "connecting",
        "ready",
        "failing",
        "ejected",
        "unhealthy",
        "draining",
    ];
    let mut counted = 0.0;
    for (l, v) in s.matching("tonic_balancer_instance_state", &[t]) {
        assert!(
            states.contains(&l["tonic_balancer_state"].as_str()),
            "{l:?}"
        );
        assert!(v.fract() == 0.0 && (0.0..=6.0).contains(&v), "{l:?}: {v}");
        counted += v;
    }
    // Five or six instances (`i4` is left out for a phase); a scrape may read the states while a
    // sample writes them, so one instance moving may show in two states or none.
    assert!((4.0..=7.0).contains(&counted), "{counted} instances");
    assert_eq!(
        s.matching("tonic_balancer_instance_state", &[t]).count(),
        states.len()
    );
    assert_eq!(
        s.matching("tonic_balancer_instance_latency_seconds", &[t])
            .count(),
        0,
        "no latency gauge without the instance label"
    );

    // Discovery: failures among the lookups; the six instances and `i4` again, one removal
    // per round.
    let lookups = s.sum("tonic_balancer_discovery_lookups_total", &[t]);
    let failures = s.sum("tonic_balancer_discovery_failures_total", &[t]);
    assert!(
        failures > 0.0 && failures < lookups,
        "{failures} of {lookups}"
    );
    let added = s.sum("tonic_balancer_instances_added_total", &[t]);
    let removed = s.sum("tonic_balancer_instances_removed_total", &[t]);
    assert!(
        added >= 6.0 + removed - 1.0 && removed >= 1.0,
        "{added} added, {removed} removed"
    );

    // And the example is still running: it was scraped under load, not after it.
    assert!(child.0.try_wait().unwrap().is_none(), "the example exited");
}
