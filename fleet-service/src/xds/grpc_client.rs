//! gRPC's own client: the grpcio xDS client peer ([`GrpcXdsClient`],
//! `peers/python/xds_client.py`).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use super::process::{Process, COMMAND_LIMIT};
use crate::peers::{built, peers_source, Kind, START_LIMIT};

/// A call's deadline in [`GrpcXdsClient::calls`].
const CALL_DEADLINE: Duration = Duration::from_secs(5);

/// gRPC's own xDS client (C-core through grpcio, `peers/python/xds_client.py`): a channel to an
/// `xds:` target, calling the fleet's `fleet.v1.Fleet/Unary` on command. Killed when dropped.
pub struct GrpcXdsClient {
    target: String,
    process: Process,
}

impl GrpcXdsClient {
    /// A client of `target` (`xds:///svc`) whose bootstrap is `bootstrap_json` (given as
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`; `GRPC_XDS_BOOTSTRAP`, which C-core would read first, is
    /// removed from its environment). `None` (after a loud message) when Python is missing,
    /// unless `CI=true`. Returns once the process has made its channel (its xDS resources may
    /// still be on their way: the first calls wait for them, up to their deadline).
    pub fn start(bootstrap_json: &str, target: &str) -> Option<GrpcXdsClient> {
        let python = built(Kind::Python)?;
        let mut cmd = Command::new(python);
        cmd.arg("-u")
            .arg(peers_source().join("python/xds_client.py"))
            .arg("--target")
            .arg(target)
            .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap_json)
            .env_remove("GRPC_XDS_BOOTSTRAP");
        let what = format!("grpcio xDS client of {target}");
        let mut process = Process::spawn(what, cmd).unwrap_or_else(|e| panic!("{e}"));
        match process.line(START_LIMIT) {
            Ok(line) if line == "READY" => {}
            Ok(line) => panic!(
                "{}",
                process.failed(&format!("its first line {line:?}, not READY"))
            ),
            Err(e) => panic!("{e}"),
        }
        Some(GrpcXdsClient {
            target: target.to_owned(),
            process,
        })
    }

    /// Makes `n` sequential unary calls to `fleet.v1.Fleet/Unary`, each with a deadline of 5 s,
    /// and returns how many each instance answered (by the name in its reply) and how many
    /// failed (each failure's status is on the client's stderr). Blocking: from async code, use
    /// `spawn_blocking` or `block_in_place`.
    pub fn calls(&mut self, n: usize) -> (BTreeMap<String, u64>, u64) {
        self.calls_within(n, CALL_DEADLINE)
    }

    /// [`calls`](GrpcXdsClient::calls) with this deadline for each call.
    pub fn calls_within(&mut self, n: usize, deadline: Duration) -> (BTreeMap<String, u64>, u64) {
        let limit = deadline * n as u32 + COMMAND_LIMIT;
        let command = format!("calls {n} deadline_ms={}", deadline.as_millis().max(1));
        let answer = self
            .process
            .ask(&command, limit)
            .unwrap_or_else(|e| panic!("{e}"));
        match parse_counts(&answer) {
            Some(counts) => counts,
            None => panic!(
                "{}",
                self.process
                    .failed(&format!("{command:?} answered {answer:?}"))
            ),
        }
    }

    /// Starts sequential calls (deadline 1 s each) that go on until instance `name` answers
    /// one, or for at most `limit`; returns once the first of them has ended, so that what
    /// the caller does next (a push) finds the client calling. [`until_first`] reads the
    /// outcome. Blocking.
    ///
    /// [`until_first`]: GrpcXdsClient::until_first
    pub fn start_until(&mut self, name: &str, limit: Duration) {
        let command = format!("until {name} limit_ms={}", limit.as_millis().max(1));
        let answer = self
            .process
            .ask(&command, COMMAND_LIMIT + Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("{e}"));
        if answer != "STARTED" {
            panic!(
                "{}",
                self.process
                    .failed(&format!("{command:?} answered {answer:?}"))
            );
        }
    }

    /// The outcome of [`start_until`](GrpcXdsClient::start_until): when the instance's first
    /// answer came (the wall clock, read in the client's process), the calls made and those
    /// that failed; `None` for the time if it did not answer within the limit. Blocking.
    pub fn until_first(&mut self, limit: Duration) -> (Option<std::time::SystemTime>, u64, u64) {
        let answer = self
            .process
            .line(limit + COMMAND_LIMIT)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut words = answer.split_whitespace();
        let when = match words.next() {
            Some("FIRST") => words
                .next()
                .and_then(|ns| ns.parse::<u64>().ok())
                .map(|ns| std::time::UNIX_EPOCH + Duration::from_nanos(ns)),
            Some("NONE") => None,
            _ => panic!("{}", self.process.failed(&format!("until: {answer:?}"))),
        };
        let count = |key: &str| {
            answer
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("until: no {key} in {answer:?}"))
        };
        (when, count("calls="), count("failed="))
    }

    /// The channel's connectivity state as grpcio sees it: `IDLE`, `CONNECTING`, `READY`,
    /// `TRANSIENT_FAILURE`, `SHUTDOWN` (`UNKNOWN` before the first report).
    pub fn state(&mut self) -> String {
        let answer = self
            .process
            .ask("state", COMMAND_LIMIT)
            .unwrap_or_else(|e| panic!("{e}"));
        match answer.strip_prefix("STATE ") {
            Some(state) => state.to_owned(),
            None => panic!("{}", self.process.failed(&format!("state: {answer:?}"))),
        }
    }

    pub fn target(&self) -> &str {
        &self.target
    }

    /// What the process wrote to stderr so far (the last 64 KiB): each failed call's status,
    /// and C-core's logs (more with `GRPC_TRACE=xds_client,...` and `GRPC_VERBOSITY=debug` in
    /// the test's environment, which it inherits).
    pub fn stderr(&self) -> String {
        self.process.stderr()
    }
}

impl std::fmt::Debug for GrpcXdsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcXdsClient")
            .field("target", &self.target)
            .finish()
    }
}

/// `COUNTS a=3 b%20c=2 failed=1` as ({a: 3, "b c": 2}, 1): names percent-escaped, `failed` the
/// last pair.
fn parse_counts(line: &str) -> Option<(BTreeMap<String, u64>, u64)> {
    let mut pairs: Vec<&str> = line.strip_prefix("COUNTS ")?.split(' ').collect();
    let failed = pairs.pop()?.strip_prefix("failed=")?.parse().ok()?;
    let mut counts = BTreeMap::new();
    for pair in pairs {
        let (name, n) = pair.rsplit_once('=')?;
        counts.insert(percent_decode(name)?, n.parse().ok()?);
    }
    Some((counts, failed))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_lines_parse() {
        let (counts, failed) = parse_counts("COUNTS a=3 b%20c%3D=2 failed=1").unwrap();
        assert_eq!(failed, 1);
        assert_eq!(counts["a"], 3);
        assert_eq!(counts["b c="], 2);
        assert_eq!(
            parse_counts("COUNTS failed=0").unwrap(),
            (BTreeMap::new(), 0)
        );
        assert_eq!(parse_counts("COUNTS a=1"), None);
    }
}
