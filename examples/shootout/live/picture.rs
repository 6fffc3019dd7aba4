//! The picture of a live run at one moment: lines of styled text (the run, what the callers
//! saw, a row per instance, the events), drawn by the screen.

use std::fmt::Write as _;
use std::time::Duration;

use tonic_balancer::State;

use super::view::{trim, Track, View};
use super::{RunInfo, EJECTION};
use crate::contenders::Contender;
use crate::report::ms;

/// The width of the in-flight bar, in cells.
const BAR: usize = 20;

#[derive(Clone, Copy, PartialEq)]
pub(super) enum Style {
    Plain,
    Bold,
    Dim,
    /// An SGR foreground colour (31 red ... 36 cyan).
    Fg(u8),
}

/// One line of the picture: pieces of text, each with a style.
#[derive(Clone, Default)]
pub(super) struct Line(Vec<(String, Style)>);

impl Line {
    fn new() -> Line {
        Line(vec![])
    }

    pub(super) fn of(text: impl Into<String>, style: Style) -> Line {
        Line(vec![(text.into(), style)])
    }

    fn push(mut self, text: impl Into<String>, style: Style) -> Line {
        self.0.push((text.into(), style));
        self
    }

    pub(super) fn text(&self) -> String {
        self.0.iter().map(|(t, _)| t.as_str()).collect()
    }

    /// Appends the line to `out`, cut at `width` characters, with colours if `color`.
    pub(super) fn render(&self, out: &mut String, width: usize, color: bool) {
        let mut left = width;
        for (text, style) in &self.0 {
            if left == 0 {
                break;
            }
            let n = text.chars().count();
            let piece: String = if n > left {
                text.chars().take(left).collect()
            } else {
                text.clone()
            };
            left -= n.min(left);
            let sgr = match style {
                _ if !color => None,
                Style::Plain => None,
                Style::Bold => Some("1".to_owned()),
                Style::Dim => Some("2".to_owned()),
                Style::Fg(c) => Some(c.to_string()),
            };
            match sgr {
                Some(s) => {
                    let _ = write!(out, "\x1b[{s}m{piece}\x1b[0m");
                }
                None => out.push_str(&piece),
            }
        }
    }
}

fn state_style(s: State) -> Style {
    match s {
        State::Ready => Style::Fg(32),
        State::Connecting => Style::Fg(33),
        State::Failing | State::Unhealthy => Style::Fg(31),
        State::Ejected => Style::Fg(35),
        _ => Style::Fg(36),
    }
}

/// `value` of `full` as a bar of `BAR` cells, in eighths of a cell where the terminal shows
/// block characters.
fn bar(value: f64, full: f64, unicode: bool) -> String {
    let eighths = ((value / full).clamp(0.0, 1.0) * (BAR * 8) as f64).round() as usize;
    let mut s = String::new();
    if unicode {
        const PARTS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
        s.extend(std::iter::repeat_n('█', eighths / 8));
        if !eighths.is_multiple_of(8) {
            s.push(PARTS[eighths % 8]);
        }
    } else {
        s.extend(std::iter::repeat_n('#', (eighths + 4) / 8));
    }
    let n = s.chars().count();
    s.extend(std::iter::repeat_n(' ', BAR - n));
    s
}

fn latency_cell(l: Option<Duration>) -> String {
    match l {
        None => "-".to_owned(),
        Some(d) if d >= Duration::from_secs(10) => ">10 s".to_owned(),
        Some(d) => {
            let m = d.as_secs_f64() * 1e3;
            if m >= 100.0 {
                format!("{m:.0} ms")
            } else {
                format!("{m:.1} ms")
            }
        }
    }
}

/// The port of an `http://host:port` URI, or the URI.
fn port(uri: &str) -> String {
    match trim(uri).rsplit_once(':') {
        Some((_, p)) if p.chars().all(|c| c.is_ascii_digit()) => format!(":{p}"),
        _ => trim(uri).to_owned(),
    }
}

fn instance_label(t: &Track) -> String {
    t.index.map_or_else(|| "--".to_owned(), |i| format!("i{i}"))
}

/// Splits `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![];
    let mut cur = String::new();
    for word in text.split(' ') {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// The picture of a run at one moment, in parts: a terminal shows them all, the plain output
/// picks from them.
pub(super) struct Picture {
    /// The run's title and what it does.
    pub(super) head: Vec<Line>,
    /// The time, and what the callers saw.
    pub(super) status: Vec<Line>,
    /// The column names, then one row per instance.
    pub(super) table: Vec<Line>,
    /// The events, done (with when) and to come.
    events: Vec<Line>,
    foot: Vec<Line>,
}

impl Picture {
    /// The whole picture if it fits in `rows`; else without what matters least (the notes,
    /// the description, the blank lines, then the events), so that the instances' rows stay.
    pub(super) fn fit(&self, rows: usize) -> Vec<Line> {
        let all = self.lines();
        if all.len() <= rows {
            return all;
        }
        let mut v = vec![self.head[0].clone()];
        v.extend(self.status.iter().cloned());
        v.extend(self.table.iter().cloned());
        if v.len() + self.events.len() <= rows {
            v.extend(self.events.iter().cloned());
        }
        v
    }

    pub(super) fn lines(&self) -> Vec<Line> {
        let mut v = self.head.clone();
        v.extend(self.status.iter().cloned());
        v.push(Line::new());
        v.extend(self.table.iter().cloned());
        if !self.events.is_empty() {
            v.push(Line::new());
            v.extend(self.events.iter().cloned());
        }
        v.push(Line::new());
        v.extend(self.foot.iter().cloned());
        v
    }
}

/// The picture of a run at `t`.
pub(super) fn frame(
    info: &RunInfo<'_>,
    view: &View,
    t: Duration,
    done: &[Option<Duration>],
    finished: bool,
    unicode: bool,
) -> Picture {
    let dot = if unicode { " \u{b7} " } else { " - " };
    let (k, total) = info.run;
    let mut title = format!(
        "tonic-balancer live{dot}{}{dot}{}",
        info.plan.title,
        Contender::Ours(info.strategy).name()
    );
    if total > 1 {
        let _ = write!(title, "{dot}run {k} of {total}");
    }
    let mut head = vec![Line::of(title, Style::Bold)];
    for l in wrap(&info.plan.about, 78) {
        head.push(Line::of(l, Style::Dim));
    }
    let load = if info.plan.setup.closed_loop {
        "one call at a time".to_owned()
    } else {
        format!("{:.0} calls/s", info.rate)
    };
    head.push(Line::of(
        format!(
            "{} instances{dot}{load}{dot}deadline {}{dot}ejection {:.0} s (default 30 s)",
            info.instances,
            ms(info.deadline),
            EJECTION.as_secs_f64()
        ),
        Style::Dim,
    ));

    let (ok, failed) = view.caller_rates();
    let when = if finished {
        format!("t {:5.1} s, done", t.as_secs_f64())
    } else if t > info.duration {
        format!("t {:5.1} s, last calls", t.as_secs_f64())
    } else {
        format!(
            "t {:5.1} s of {:.1} s",
            t.as_secs_f64(),
            info.duration.as_secs_f64()
        )
    };
    let status = vec![
        Line::of(when, Style::Bold)
            .push(
                format!("   callers, last second: {ok:.0} ok/s, "),
                Style::Plain,
            )
            .push(
                format!("{failed:.0} failed/s"),
                if failed > 0.0 {
                    Style::Fg(31)
                } else {
                    Style::Plain
                },
            ),
        Line::of(
            format!("failed so far: {}", view.tally.failures()),
            Style::Dim,
        ),
    ];

    let scale = view.scale();
    let mut table = vec![Line::of(
        format!(
            "{:<4} {:<7}{:<11}{:<width$} {:>7} {:>8} {:>6} {:>3}",
            "",
            "port",
            "state",
            format!("in flight (full bar: {scale:.0})"),
            "share",
            "latency",
            "failed",
            "ej",
            // The bar, a space and the mean.
            width = BAR + 5
        ),
        Style::Bold,
    )];
    let routed: u64 = view.tracks.iter().map(Track::routed_in_window).sum();
    for tr in &view.tracks {
        let e = &tr.last;
        let share = if routed > 0 {
            format!(
                "{:.1}%",
                100.0 * tr.routed_in_window() as f64 / routed as f64
            )
        } else {
            "-".to_owned()
        };
        table.push(
            Line::of(
                format!("{:<4} {:<7}", instance_label(tr), port(&tr.uri)),
                Style::Plain,
            )
            .push(
                format!("{:<11}", e.state().to_string()),
                state_style(e.state()),
            )
            .push(bar(tr.mean, scale, unicode), Style::Fg(36))
            .push(
                format!(
                    " {:>4.1} {:>7} {:>8} {:>6} {:>3}",
                    tr.mean,
                    share,
                    latency_cell(e.latency()),
                    e.failed(),
                    e.ejections()
                ),
                Style::Plain,
            ),
        );
    }

    let events = info
        .plan
        .events
        .iter()
        .zip(done)
        .map(|(ev, d)| match d {
            Some(at) => Line::of(format!("[x] {:5.1} s  ", at.as_secs_f64()), Style::Bold)
                .push(&ev.text, Style::Plain),
            None => Line::of(
                format!(
                    "[ ] {:5.1} s  {}",
                    info.duration.mul_f64(ev.at).as_secs_f64(),
                    ev.text
                ),
                Style::Dim,
            ),
        })
        .collect();

    let mut foot = vec![Line::of(
        "share: of the calls routed in the last second; latency: the channel's estimate",
        Style::Dim,
    )];
    if !finished {
        foot.push(Line::of("Ctrl-C stops", Style::Dim));
    }
    Picture {
        head,
        status,
        table,
        events,
        foot,
    }
}
