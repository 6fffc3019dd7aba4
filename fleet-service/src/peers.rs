//! Test peers: servers of other gRPC implementations (grpc-go in `peers/go`, grpcio in
//! `peers/python`), started as real processes on 127.0.0.1, for what only another
//! implementation shows (its GOAWAYs, its keepalive enforcement, its answer to a handler that
//! throws, its stream limits).
//!
//! One line each in a test:
//!
//! ```no_run
//! # async fn t() {
//! use fleet_service::peers::Peer;
//! let Some(go) = Peer::go(&["--mode", "status UNAVAILABLE"]) else { return }; // skipped
//! let Some(py) = Peer::python(&[]) else { return };
//! go.control("ok delay=5ms").await; // the peer's commands: peers/go/main.go, `control`
//! # let _ = (py.uri(), go.addr()); }
//! ```
//!
//! **Building** happens once per process and kind ([`OnceLock`]), under a file lock (several
//! test binaries may start at once): `go build` of `peers/go` into `target/peers/peer-go`, and
//! a virtualenv in `target/peers/venv` with `peers/python/requirements.txt` installed (again
//! only when the requirements changed). `target` is `CARGO_TARGET_DIR` when set. `.ci/run`
//! builds both before the tests (`scripts/build-peers.sh`), so that the test run downloads
//! nothing.
//!
//! **A missing peer** (no `go` or `python3`, or no network for the first download) is not a
//! failure on a developer's machine: a loud message on stderr (not captured by the test
//! harness) says what is missing and how to get it, and [`Peer::go`] returns `None`, so the test
//! returns early. With `CI=true` it panics: CI must run them.
//!
//! **No orphans**: a [`Peer`] kills its process when dropped (also when a test panics), and
//! each peer exits by itself when its stdin closes, which the kernel does when the test process
//! dies however it dies (a `kill -9`, an abort).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::pb::peer::control_client::ControlClient;
use crate::pb::peer::Command as ControlCommand;

/// How long a peer may take to say it listens (Python imports grpcio first; a busy machine).
pub(crate) const START_LIMIT: Duration = Duration::from_secs(60);
/// The most of a peer's stderr kept for error messages.
const STDERR_KEPT: usize = 64 * 1024;

/// Which implementation a peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// grpc-go (`peers/go`).
    Go,
    /// grpcio, Python's gRPC on gRPC's C core (`peers/python`).
    Python,
}

impl Kind {
    /// Both, in the order the conformance table prints them.
    pub const ALL: [Kind; 2] = [Kind::Go, Kind::Python];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Go => "grpc-go",
            Kind::Python => "grpcio",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A peer's settings in the words of both implementations: [`Settings::args`] spells them as
/// each one's command line takes them.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The initial mode (`ok delay=5ms`, `status UNAVAILABLE`, `hang`, ...); `ok` when `None`.
    pub mode: Option<String>,
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: Option<u32>,
    /// GOAWAY after this long (each implementation adds ±10% jitter), and close the connection
    /// `.1` after that.
    pub max_connection_age: Option<(Duration, Duration)>,
    /// Keepalive enforcement: the least time between a client's pings without data between
    /// (grpc-go's `EnforcementPolicy.MinTime`, C-core's
    /// `grpc.http2.min_ping_interval_without_data_ms`). Both default to 5 minutes already.
    pub keepalive_min_time: Option<Duration>,
}

impl Settings {
    pub fn mode(mode: &str) -> Settings {
        Settings {
            mode: Some(mode.to_owned()),
            ..Settings::default()
        }
    }

    /// The command line of a peer of `kind` with these settings.
    pub fn args(&self, kind: Kind) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        if let Some(mode) = &self.mode {
            a.extend(["--mode".into(), mode.clone()]);
        }
        if let Some(n) = self.max_concurrent_streams {
            a.extend(["--max-concurrent-streams".into(), n.to_string()]);
        }
        match kind {
            Kind::Go => {
                if let Some((age, grace)) = self.max_connection_age {
                    a.extend([
                        "--max-connection-age".into(),
                        format!("{}ms", age.as_millis()),
                    ]);
                    a.extend([
                        "--max-connection-age-grace".into(),
                        format!("{}ms", grace.as_millis()),
                    ]);
                }
                if let Some(t) = self.keepalive_min_time {
                    a.extend([
                        "--keepalive-min-time".into(),
                        format!("{}ms", t.as_millis()),
                    ]);
                }
            }
            Kind::Python => {
                if let Some((age, grace)) = self.max_connection_age {
                    a.extend([
                        "--max-connection-age-ms".into(),
                        age.as_millis().to_string(),
                    ]);
                    a.extend([
                        "--max-connection-age-grace-ms".into(),
                        grace.as_millis().to_string(),
                    ]);
                }
                if let Some(t) = self.keepalive_min_time {
                    a.extend(["--min-ping-interval-ms".into(), t.as_millis().to_string()]);
                }
            }
        }
        a
    }
}

/// A running peer: a process serving `peer.Peer`, `peer.Control` and `grpc.health.v1.Health`
/// on 127.0.0.1. Killed when dropped.
pub struct Peer {
    kind: Kind,
    program: PathBuf,
    args: Vec<String>,
    addr: SocketAddr,
    child: Child,
    /// Held open: the peer exits when it closes.
    _stdin: ChildStdin,
    stderr: Arc<Mutex<String>>,
    /// The thread that reads stderr: it ends at the pipe's end, after the process exits.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Peer {
    /// A grpc-go peer with these command-line arguments (`peers/go/main.go`'s flags), on a free
    /// port; `None` (after a loud message) when Go is missing, unless `CI=true`.
    pub fn go(args: &[&str]) -> Option<Peer> {
        Peer::start(Kind::Go, args)
    }

    /// A grpcio peer with these command-line arguments (`peers/python/server.py`'s), on a free
    /// port; `None` (after a loud message) when Python is missing, unless `CI=true`.
    pub fn python(args: &[&str]) -> Option<Peer> {
        Peer::start(Kind::Python, args)
    }

    /// A peer of `kind` with these arguments, on a free port.
    pub fn start(kind: Kind, args: &[&str]) -> Option<Peer> {
        let program = built(kind)?;
        let args = args.iter().map(|a| a.to_string()).collect();
        Some(Peer::spawn(kind, program, args, 0).unwrap_or_else(|e| panic!("{e}")))
    }

    /// A peer of `kind` with these settings, on a free port.
    pub fn with(kind: Kind, settings: &Settings) -> Option<Peer> {
        let args = settings.args(kind);
        Peer::start(kind, &args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Whether peers of `kind` can run here (building them if need be); prints the loud message
    /// (or panics, with `CI=true`) when not.
    pub fn available(kind: Kind) -> bool {
        built(kind).is_some()
    }

    fn spawn(kind: Kind, program: PathBuf, args: Vec<String>, port: u16) -> Result<Peer, String> {
        let mut cmd = match kind {
            Kind::Go => Command::new(&program),
            Kind::Python => {
                let mut c = Command::new(&program);
                c.arg("-u").arg(peers_source().join("python/server.py"));
                c
            }
        };
        cmd.arg("--port")
            .arg(port.to_string())
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("starting {kind} peer {}: {e}", program.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_reader = keep_tail(child.stderr.take().expect("piped stderr"), stderr.clone());
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref() {
                let Ok(line) = line else { return };
                if let Some(port) = line.strip_prefix("LISTENING ") {
                    let _ = tx.send(port.trim().parse::<u16>());
                    break;
                }
            }
            // Keep reading, so that the peer never blocks on a full pipe.
            for _ in lines {}
        });
        let mut peer = Peer {
            kind,
            program,
            args,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            _stdin: stdin,
            stderr,
            stderr_reader: Some(stderr_reader),
        };
        match rx.recv_timeout(START_LIMIT) {
            Ok(Ok(port)) => {
                peer.addr.set_port(port);
                Ok(peer)
            }
            Ok(Err(e)) => Err(peer.failed(&format!("its LISTENING line: {e}"))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(peer.failed(&format!("no LISTENING line within {START_LIMIT:?}")))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = peer.child.wait();
                peer.read_all_stderr();
                Err(peer.failed("it exited before listening"))
            }
        }
    }

    /// An error naming the peer, with its stderr.
    fn failed(&self, what: &str) -> String {
        format!(
            "{} peer {:?} on port {}: {what}\n--- its stderr ---\n{}",
            self.kind,
            self.args,
            self.addr.port(),
            self.stderr()
        )
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the peer wrote to stderr so far (the last 64 KiB).
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Kills the process (SIGKILL: its connections close at once, with no GOAWAY) and waits
    /// for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the peer again, on the same port with the same arguments (killing it first if it
    /// still runs). The new process serves the initial mode and counts from zero.
    pub fn restart(&mut self) {
        self.kill();
        let port = self.addr.port();
        let start = Instant::now();
        // The port is free once the process is gone (both set SO_REUSEADDR); a few tries in
        // case the kernel is slow to release it.
        loop {
            match Peer::spawn(self.kind, self.program.clone(), self.args.clone(), port) {
                Ok(new) => {
                    *self = new;
                    return;
                }
                Err(e) if start.elapsed() > Duration::from_secs(5) => panic!("restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Waits up to `limit` for the process to exit by itself (and then for the end of its
    /// stderr).
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.read_all_stderr();
                return Some(status);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Once the process has exited: waits for its stderr reader to reach the pipe's end, so
    /// that [`stderr`](Peer::stderr) has all the process wrote.
    fn read_all_stderr(&mut self) {
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
    }

    /// Sends a command to `peer.Control/Set` (on a connection of its own, not through the
    /// test's channel) and returns the answer; panics, with the peer's stderr, if it fails.
    pub async fn control(&self, command: &str) -> String {
        match self.try_control(command).await {
            Ok(answer) => answer,
            Err(e) => panic!("{}", self.failed(&format!("control {command:?}: {e}"))),
        }
    }

    /// [`control`](Peer::control), returning the error.
    pub async fn try_control(&self, command: &str) -> Result<String, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(self.uri())
            .expect("peer URI")
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
        let answer = ControlClient::new(channel)
            .set(ControlCommand {
                command: command.to_owned(),
            })
            .await?;
        Ok(answer.into_inner().answer)
    }

    /// The calls to `peer.Peer` it served, by the mode that served them, and `total`.
    pub async fn counts(&self) -> BTreeMap<String, u64> {
        parse_pairs(&self.control("count").await)
    }

    /// Its calls to `peer.Peer` served in all.
    pub async fn served(&self) -> u64 {
        self.counts().await["total"]
    }

    /// Its calls to `peer.Peer` in flight now, and the most there ever were at once.
    pub async fn inflight(&self) -> (u64, u64) {
        let pairs = parse_pairs(&self.control("inflight").await);
        (pairs["inflight"], pairs["peak"])
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.kill();
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("kind", &self.kind)
            .field("addr", &self.addr)
            .field("args", &self.args)
            .finish()
    }
}

/// "a=1 b=2" as a map.
fn parse_pairs(s: &str) -> BTreeMap<String, u64> {
    s.split_whitespace()
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// Reads `from` to its end on a thread of its own, keeping the last [`STDERR_KEPT`] bytes.
pub(crate) fn keep_tail(
    mut from: impl Read + Send + 'static,
    into: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                return;
            }
            let mut s = into.lock().unwrap();
            s.push_str(&String::from_utf8_lossy(&buf[..n]));
            if s.len() > STDERR_KEPT {
                let mut cut = s.len() - STDERR_KEPT;
                while !s.is_char_boundary(cut) {
                    cut += 1;
                }
                s.drain(..cut);
            }
        }
    })
}

/// Waits until `cond` holds, checking every 5 ms; panics after `limit`.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !cond().await {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// Building.

/// The workspace's `peers/` directory (the sources).
pub(crate) fn peers_source() -> PathBuf {
    workspace().join("peers")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fleet-service is in the workspace")
        .to_owned()
}

/// `target/peers` (in `CARGO_TARGET_DIR` when set, relative to the workspace when relative).
pub fn build_dir() -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace().join(dir),
        None => workspace().join("target"),
    };
    target.join("peers")
}

/// What a kind needs that is not here: printed loud, or a panic with `CI=true`.
#[derive(Debug, Clone)]
pub(crate) struct Missing(pub(crate) String);

/// The peer's program, built once per process: the Go binary, or the venv's Python.
pub(crate) fn built(kind: Kind) -> Option<PathBuf> {
    static GO: OnceLock<Result<PathBuf, Missing>> = OnceLock::new();
    static PYTHON: OnceLock<Result<PathBuf, Missing>> = OnceLock::new();
    let cell = match kind {
        Kind::Go => &GO,
        Kind::Python => &PYTHON,
    };
    match cell.get_or_init(|| with_build_lock(|| build(kind))) {
        Ok(path) => Some(path.clone()),
        Err(Missing(what)) => {
            report_missing(&kind.to_string(), what);
            None
        }
    }
}

/// Says loud on stderr that the `peer` test peer cannot run here and why (`what`), or panics
/// with that message when `CI=true`.
pub(crate) fn report_missing(peer: &str, what: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let verdict = if ci {
        "With CI=true the tests that need it fail."
    } else {
        "The tests that need it pass without running (with CI=true they fail)."
    };
    let message = format!(
        "\n=====================================================================\n\
         The {peer} test peer cannot run here.\n{what}\n{verdict}\n\
         =====================================================================\n"
    );
    if ci {
        panic!("{message}");
    }
    // Straight to the process's stderr: the test harness captures `eprintln!`.
    let _ = std::io::stderr().write_all(message.as_bytes());
}

/// Runs `f` holding an exclusive lock on `target/peers/build.lock`: test binaries that start
/// at once build one after the other, and the later ones find the work done.
pub(crate) fn with_build_lock<T>(f: impl FnOnce() -> T) -> T {
    let dir = build_dir();
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let lock = File::create(dir.join("build.lock")).expect("the build lock file");
    lock.lock().expect("locking the build lock file");
    let out = f();
    drop(lock); // unlocks
    out
}

fn build(kind: Kind) -> Result<PathBuf, Missing> {
    match kind {
        Kind::Go => build_go(),
        Kind::Python => build_python(),
    }
}

/// Runs `cmd`; `Ok(stdout)` if it succeeded, else `Err` with what it printed. `None`: the
/// program was not found.
fn run(cmd: &mut Command) -> Option<Result<String, String>> {
    let out = match cmd.stdin(Stdio::null()).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(Err(format!("{cmd:?}: {e}"))),
    };
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    if out.status.success() {
        Some(Ok(text(&out.stdout)))
    } else {
        Some(Err(format!(
            "{cmd:?}: {}\n{}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        )))
    }
}

/// `go build` of `peers/go` into `target/peers/peer-go` (a no-op when it is up to date).
fn build_go() -> Result<PathBuf, Missing> {
    build_go_module("go", "peer-go")
}

/// `go build` of the Go module in `peers/<module>` into `target/peers/<binary>` (a no-op when it
/// is up to date).
pub(crate) fn build_go_module(module: &str, binary: &str) -> Result<PathBuf, Missing> {
    let src = peers_source().join(module);
    let out = build_dir().join(binary);
    let go = |args: &[&str]| {
        let mut c = Command::new("go");
        // The toolchain that is here: never download another one (go.mod says which it needs).
        c.args(args).current_dir(&src).env("GOTOOLCHAIN", "local");
        run(&mut c)
    };
    const GET_GO: &str = "Install Go 1.26 or later: https://go.dev/dl/ (or your package manager), \
                          with `go` on the PATH.";
    match go(&["version"]) {
        None => {
            return Err(Missing(format!(
                "Go is missing: no `go` on the PATH. {GET_GO}"
            )))
        }
        Some(Err(e)) => return Err(Missing(format!("`go version` failed: {e}\n{GET_GO}"))),
        Some(Ok(_)) => {}
    }
    // The modules (grpc-go), from the module proxy on the first run; a failure here is the
    // network's or the toolchain's (too old for go.mod), not the peer's.
    if let Some(Err(e)) = go(&["mod", "download"]) {
        return Err(Missing(format!(
            "the peer's Go modules could not be downloaded (the first run needs the Go module \
             proxy), or this Go is too old for peers/{module}/go.mod:\n{e}\n{GET_GO}"
        )));
    }
    let out_str = out.to_str().expect("a UTF-8 target path");
    match go(&["build", "-o", out_str, "."]) {
        Some(Ok(_)) => Ok(out),
        // The sources are the project's: a failure to build them is a failure.
        other => panic!("go build of peers/{module} failed: {other:?}"),
    }
}

/// A virtualenv in `target/peers/venv` with `peers/python/requirements.txt` installed; made
/// again only when the requirements change (a copy of them in the venv says what it has).
fn build_python() -> Result<PathBuf, Missing> {
    const GET_PYTHON: &str = "Install Python 3.9 or later with its venv module (Debian: `apt-get \
                              install python3 python3-venv`), with `python3` on the PATH.";
    let requirements = peers_source().join("python/requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("peers/python/requirements.txt");
    let venv = build_dir().join("venv");
    let python = venv.join("bin/python");
    let stamp = venv.join("requirements.txt");
    if python.exists() && std::fs::read_to_string(&stamp).is_ok_and(|had| had == wanted) {
        return Ok(python);
    }
    match run(Command::new("python3").arg("--version")) {
        None => {
            return Err(Missing(format!(
                "Python is missing: no `python3` on the PATH. {GET_PYTHON}"
            )))
        }
        Some(Err(e)) => return Err(Missing(format!("`python3 --version` failed: {e}"))),
        Some(Ok(_)) => {}
    }
    let _ = std::fs::remove_dir_all(&venv);
    if let Some(Err(e)) = run(Command::new("python3").arg("-m").arg("venv").arg(&venv)) {
        return Err(Missing(format!(
            "`python3 -m venv` failed (is the venv module installed?): {e}\n{GET_PYTHON}"
        )));
    }
    let pip = run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "-q",
            "-r",
        ])
        .arg(&requirements));
    if let Some(Err(e)) = pip {
        let _ = std::fs::remove_dir_all(&venv);
        return Err(Missing(format!(
            "pip could not install peers/python/requirements.txt (the first run downloads \
             grpcio from PyPI): {e}"
        )));
    }
    std::fs::write(&stamp, wanted).expect("the venv's copy of the requirements");
    Ok(python)
}
