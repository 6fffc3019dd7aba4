//! The processes: a peer process ([`Process`]) that takes commands on its stdin and answers one
//! line each on its stdout, its stderr kept; the plumbing of [`ControlPlane`](super::ControlPlane)
//! and [`GrpcXdsClient`](super::GrpcXdsClient).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::peers::keep_tail;

/// How long the control plane may take to answer a command.
pub(super) const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// A peer process: commands on its stdin, one answer a line on its stdout, its stderr kept.
/// Killed when dropped.
pub(super) struct Process {
    /// What it is, for messages.
    pub(super) what: String,
    child: Child,
    /// Held open: the process exits when it closes.
    stdin: ChildStdin,
    /// Its stdout, line by line (a thread reads it, so that it never blocks on a full pipe).
    lines: mpsc::Receiver<String>,
    stderr: Arc<Mutex<String>>,
    /// The thread that reads stderr: it ends at the pipe's end, after the process exits.
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Process {
    pub(super) fn spawn(what: String, mut cmd: Command) -> Result<Process, String> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("starting {what}: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_reader = keep_tail(child.stderr.take().expect("piped stderr"), stderr.clone());
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                // The receiver gone (the handle dropped): keep reading to the pipe's end.
                let _ = tx.send(line);
            }
        });
        Ok(Process {
            what,
            child,
            stdin,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }

    /// The next line it prints, within `limit`.
    pub(super) fn line(&mut self, limit: Duration) -> Result<String, String> {
        match self.lines.recv_timeout(limit) {
            Ok(line) => Ok(line),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(self.failed(&format!("no answer within {limit:?}")))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.wait();
                self.read_all_stderr();
                Err(self.failed(&format!("it exited ({status:?})")))
            }
        }
    }

    /// Sends one command line and returns the line that answers it.
    pub(super) fn ask(&mut self, command: &str, limit: Duration) -> Result<String, String> {
        debug_assert!(!command.contains('\n'));
        if let Err(e) = writeln!(self.stdin, "{command}").and_then(|()| self.stdin.flush()) {
            let status = self.child.wait();
            self.read_all_stderr();
            return Err(self.failed(&format!("writing a command: {e} (it exited: {status:?})")));
        }
        self.line(limit)
    }

    /// SIGKILL, and waits for it.
    pub(super) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub(super) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Once the process has exited: waits for its stderr reader to reach the pipe's end.
    fn read_all_stderr(&mut self) {
        if let Some(reader) = self.stderr_reader.take() {
            let _ = reader.join();
        }
    }

    /// An error naming the process, with its stderr.
    pub(super) fn failed(&self, what: &str) -> String {
        format!(
            "{}: {what}\n--- its stderr ---\n{}",
            self.what,
            self.stderr()
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
