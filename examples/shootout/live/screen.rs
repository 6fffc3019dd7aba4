//! Where the live view goes: a terminal, redrawn in place on the alternate screen (and put
//! back on every way out), or plain lines when stdout is not a terminal.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::picture::{Line, Picture, Style};
use super::RunInfo;

/// How often the plain (non-terminal) output prints every instance's line.
const PLAIN_EVERY: Duration = Duration::from_secs(1);

/// Set once the terminal has been put back: no frame is drawn after it.
static CLOSED: AtomicBool = AtomicBool::new(false);

const ENTER: &str = "\x1b[?1049h\x1b[?25l\x1b[2J";
const LEAVE: &str = "\x1b[0m\x1b[?25h\x1b[?1049l";

/// Puts the terminal back, once (from the run's end, a signal or a panic), under stdout's lock
/// so that no frame is half-drawn around it. Returns whether this call did it.
fn restore() -> bool {
    let mut out = std::io::stdout().lock();
    if CLOSED.swap(true, Ordering::SeqCst) {
        return false;
    }
    let _ = out.write_all(LEAVE.as_bytes());
    let _ = out.flush();
    true
}

/// Where the picture goes: a terminal (redrawn in place) or plain lines.
pub(super) struct Screen {
    tty: bool,
    pub(super) color: bool,
    pub(super) unicode: bool,
    /// Rows and columns, checked about once a second (the terminal can be resized).
    size: (usize, usize),
    size_checked: Option<Instant>,
    /// Plain output: when every instance's line was last printed, and events already printed.
    last_plain: Option<Duration>,
    printed: Vec<bool>,
}

impl Screen {
    pub(super) fn open(rt: &tokio::runtime::Runtime) -> Screen {
        let tty =
            std::io::stdout().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
        let locale = ["LC_ALL", "LC_CTYPE", "LANG"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
            .unwrap_or_default()
            .to_ascii_lowercase();
        let screen = Screen {
            tty,
            color: tty && std::env::var_os("NO_COLOR").is_none(),
            unicode: locale.contains("utf-8") || locale.contains("utf8"),
            size: (24, 80),
            size_checked: None,
            last_plain: None,
            printed: vec![],
        };
        if tty {
            // Registered before the screen changes, so that no signal finds it changed and
            // unwatched.
            let _rt = rt.enter();
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                for (kind, name, code) in [
                    (SignalKind::interrupt(), "Ctrl-C", 130),
                    (SignalKind::terminate(), "SIGTERM", 143),
                ] {
                    let mut s = signal(kind).expect("signal handler");
                    rt.spawn(async move {
                        s.recv().await;
                        restore();
                        eprintln!("live view stopped ({name})");
                        std::process::exit(code);
                    });
                }
            }
            #[cfg(not(unix))]
            rt.spawn(async {
                let _ = tokio::signal::ctrl_c().await;
                restore();
                eprintln!("live view stopped (Ctrl-C)");
                std::process::exit(130);
            });
            // A panic's message comes after the terminal is back, where it stays readable.
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |p| {
                restore();
                hook(p);
            }));
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(ENTER.as_bytes());
            let _ = out.flush();
        }
        screen
    }

    /// The terminal's rows and columns (`stty size` on the controlling terminal), checked at
    /// most once a second; 24 x 80 if it cannot tell.
    fn size(&mut self) -> (usize, usize) {
        if self
            .size_checked
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return self.size;
        }
        self.size_checked = Some(Instant::now());
        let asked = std::fs::File::open("/dev/tty").ok().and_then(|tty| {
            let out = std::process::Command::new("stty")
                .arg("size")
                .stdin(tty)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()?;
            let text = String::from_utf8(out.stdout).ok()?;
            let mut it = text.split_whitespace().map(|v| v.parse::<usize>().ok());
            Some((it.next()??, it.next()??))
        });
        if let Some((rows, cols)) = asked.filter(|&(r, c)| r > 0 && c > 0) {
            self.size = (rows, cols);
        }
        self.size
    }

    pub(super) fn show(
        &mut self,
        pic: &Picture,
        t: Duration,
        done: &[Option<Duration>],
        info: &RunInfo,
        finished: bool,
    ) {
        if self.tty {
            let rows = self.size().0;
            self.draw(&pic.fit(rows));
        } else {
            self.plain(pic, t, done, info, finished);
        }
    }

    /// Redraws the picture in place: from the top left, each line cleared to its end, the rest
    /// of the screen cleared; cut to the terminal's size (a line one column short of the
    /// width, so that the cursor never wraps).
    fn draw(&mut self, lines: &[Line]) {
        let (rows, cols) = self.size();
        let width = cols.saturating_sub(1).max(1);
        let mut buf = String::from("\x1b[H");
        let fit = lines.len() <= rows;
        let shown = if fit {
            lines.len()
        } else {
            rows.saturating_sub(1)
        };
        for (k, line) in lines.iter().take(shown).enumerate() {
            if k > 0 {
                buf.push_str("\r\n");
            }
            line.render(&mut buf, width, self.color);
            buf.push_str("\x1b[K");
        }
        if !fit {
            buf.push_str("\r\n");
            Line::of(
                format!(
                    "({} more lines: a taller terminal shows them)",
                    lines.len() - shown
                ),
                Style::Dim,
            )
            .render(&mut buf, width, self.color);
            buf.push_str("\x1b[K");
        }
        buf.push_str("\x1b[J");
        let mut out = std::io::stdout().lock();
        if CLOSED.load(Ordering::SeqCst) {
            return;
        }
        let _ = out.write_all(buf.as_bytes());
        let _ = out.flush();
    }

    /// Plain output: a run's heading once, each event when it has happened, and the status and
    /// every instance's row once a second and at the end of the run.
    fn plain(
        &mut self,
        pic: &Picture,
        t: Duration,
        done: &[Option<Duration>],
        info: &RunInfo,
        finished: bool,
    ) {
        let mut out = String::new();
        let stamp = format!("[{:6.1} s]", t.as_secs_f64());
        if self.last_plain.is_none() {
            for l in &pic.head {
                out.push_str(&l.text());
                out.push('\n');
            }
            self.printed = vec![false; done.len()];
        }
        for (k, d) in done.iter().enumerate() {
            if let (Some(at), false) = (d, self.printed[k]) {
                self.printed[k] = true;
                let _ = writeln!(
                    out,
                    "[{:6.1} s] event: {}",
                    at.as_secs_f64(),
                    info.plan.events[k].text
                );
            }
        }
        if finished || self.last_plain.is_none_or(|p| t >= p + PLAIN_EVERY) {
            self.last_plain = Some(t);
            for l in pic.status.iter().chain(&pic.table) {
                let _ = writeln!(out, "{stamp} {}", l.text().trim_end());
            }
        }
        if finished {
            // The next run prints its heading.
            self.last_plain = None;
            out.push('\n');
        }
        if !out.is_empty() {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(out.as_bytes());
            let _ = o.flush();
        }
    }

    /// Puts the terminal back if this screen changed it; returns whether it did.
    pub(super) fn close(&mut self) -> bool {
        self.tty && restore()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.close();
    }
}
