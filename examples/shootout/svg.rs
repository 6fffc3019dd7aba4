//! The charts, as SVG written by hand: the percentiles of each scenario's contenders as bars,
//! and the sweep's p99 against the rate as lines.

use std::fmt::Write as _;
use std::time::Duration;

use crate::contenders::Contender;
use crate::options::Opts;
use crate::report::{ms, pct_cell, Row, QUANTILE_NAMES};
use crate::scenarios::{exceptions, Scenario};
use crate::SweepResults;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The start of an SVG chart: the document, a white background, a title and a grey subtitle.
fn svg_open(width: f64, height: f64, left: f64, title: &str, subtitle: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="22" font-size="16" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="40" fill="#666">{}</text>"##,
        esc(subtitle)
    );
    s
}

/// A logarithmic latency axis from 1 ms to `hi` ms, drawn over `height` pixels from `top`.
struct LogAxis {
    hi: f64,
    top: f64,
    height: f64,
}

impl LogAxis {
    const LO: f64 = 1.0;

    /// The y of a latency in milliseconds (clamped to the axis).
    fn y(&self, v_ms: f64) -> f64 {
        let f = (v_ms.clamp(Self::LO, self.hi).log10() - Self::LO.log10())
            / (self.hi.log10() - Self::LO.log10());
        self.top + self.height * (1.0 - f)
    }

    /// The grid lines at each power of ten with their labels, and the deadline as a dashed red
    /// line, from x `left` to `right`.
    fn grid(&self, s: &mut String, left: f64, right: f64, deadline: Duration) {
        let mut tick = 1.0;
        while tick <= self.hi {
            let ty = self.y(tick);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" x2="{right}" y1="{ty:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end" fill="#666">{}</text>"##,
                left - 6.0,
                ty + 4.0,
                if tick >= 1000.0 {
                    format!("{} s", tick / 1000.0)
                } else {
                    format!("{tick} ms")
                }
            );
            tick *= 10.0;
        }
        let dl = self.y(deadline.as_secs_f64() * 1e3);
        let _ = writeln!(
            s,
            r##"<line x1="{left}" x2="{right}" y1="{dl:.1}" y2="{dl:.1}" stroke="#d62728" stroke-dasharray="4 3"/><text x="{right}" y="{:.1}" text-anchor="end" fill="#d62728">deadline</text>"##,
            dl - 3.0
        );
    }
}

pub(crate) fn shootout_svg(results: &[(Scenario, Vec<Row>)], opts: &Opts) -> String {
    const W: f64 = 1100.0;
    const PANEL_H: f64 = 250.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 60.0;
    const COLORS: [&str; 3] = ["#9ecae1", "#4292c6", "#08306b"];
    let plot_top = 34.0;
    let plot_h = 160.0;
    let axis = LogAxis {
        hi: (opts.deadline.as_secs_f64() * 1e3 * 2.0).max(10.0),
        top: plot_top,
        height: plot_h,
    };
    let y = |v_ms: f64| axis.y(v_ms);
    let hi = axis.hi;
    let h = TOP + PANEL_H * results.len() as f64 + 20.0;
    let mut s = svg_open(
        W,
        h,
        LEFT,
        "tonic-balancer shootout: latency from scheduled start, per contender (log scale)",
        &format!(
            "{} instances, {:.0} calls/s open loop, {:.1} s per contender, deadline {}; red = the percentile falls on failed calls",
            opts.instances,
            opts.rate,
            opts.duration.as_secs_f64(),
            ms(opts.deadline)
        ),
    );
    let notes = exceptions(opts);
    if !notes.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="54" fill="#666">{}</text>"##,
            esc(notes.trim())
        );
    }
    for (qi, name) in QUANTILE_NAMES.iter().enumerate() {
        let x = W - RIGHT - 220.0 + qi as f64 * 70.0;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="30" width="12" height="12" fill="{}"/><text x="{}" y="40">{name}</text>"#,
            COLORS[qi],
            x + 16.0
        );
    }
    for (pi, (scenario, rows)) in results.iter().enumerate() {
        let oy = TOP + PANEL_H * pi as f64;
        let _ = writeln!(s, r#"<g transform="translate(0,{oy})">"#);
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{}</text><text x="{}" y="16" fill="#666">{}</text>"##,
            esc(scenario.key()),
            // Bold 13 px text is about 8 px a character.
            LEFT + 20.0 + 8.5 * scenario.key().len() as f64,
            esc(&scenario.describe(opts.instances))
        );
        axis.grid(&mut s, LEFT, W - RIGHT, opts.deadline);
        let group_w = (W - LEFT - RIGHT) / rows.len().max(1) as f64;
        let bar_w = (group_w * 0.7 / 3.0).min(22.0);
        for (ci, row) in rows.iter().enumerate() {
            let gx = LEFT + group_w * ci as f64;
            let x0 = gx + (group_w - bar_w * 3.0) / 2.0;
            for (qi, p) in row.pcts.iter().enumerate() {
                let x = x0 + bar_w * qi as f64;
                let (top, fill, title) = match p {
                    Some(d) => {
                        let v = d.as_secs_f64() * 1e3;
                        (
                            y(v),
                            COLORS[qi],
                            format!("{}: {}", QUANTILE_NAMES[qi], ms(*d)),
                        )
                    }
                    None => (
                        y(hi),
                        "#d62728",
                        format!("{}: failed calls", QUANTILE_NAMES[qi]),
                    ),
                };
                let base = plot_top + plot_h;
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{fill}"><title>{} {}</title></rect>"#,
                    bar_w - 1.0,
                    (base - top).max(0.5),
                    esc(row.contender.name()),
                    esc(&title)
                );
            }
            let cx = gx + group_w / 2.0;
            let _ = writeln!(
                s,
                r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text><text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="{}">ok {:.2}%</text>"##,
                plot_top + plot_h + 15.0,
                esc(row.contender.name()),
                plot_top + plot_h + 29.0,
                if row.ok_pct < 99.9 {
                    "#d62728"
                } else {
                    "#2ca02c"
                },
                row.ok_pct
            );
        }
        let _ = writeln!(s, "</g>");
    }
    let _ = writeln!(s, "</svg>");
    s
}

pub(crate) fn write_svg(path: &str, chart: &str) {
    let path = std::path::Path::new(path);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(path, chart) {
        Ok(()) => println!("\nchart: {}", path.display()),
        Err(e) => eprintln!("\ncould not write {}: {e}", path.display()),
    }
}

/// A line chart per scenario: p99 (log scale) against the rate, one line per contender (solid:
/// this crate's strategies, dashed: the others). A p99 that falls on failed calls is drawn in
/// the `fail` band above the plot, clipped, with a cross.
pub(crate) fn sweep_svg(results: &SweepResults, opts: &Opts) -> String {
    const W: f64 = 1100.0;
    const PANEL_H: f64 = 360.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 230.0;
    const TOP: f64 = 60.0;
    const COLORS: [&str; 8] = [
        "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#7f7f7f",
    ];
    let fail_y = 40.0;
    let plot_top = 60.0;
    let plot_h = 250.0;
    let axis = LogAxis {
        hi: (opts.deadline.as_secs_f64() * 1e3 * 1.5).max(10.0),
        top: plot_top,
        height: plot_h,
    };
    let y = |v_ms: f64| axis.y(v_ms);
    let (rmin, rmax) = opts
        .rates
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &r| (a.min(r), b.max(r)));
    let plot_w = W - LEFT - RIGHT;
    let x = |rate: f64| -> f64 {
        if rmax > rmin {
            LEFT + 20.0 + (plot_w - 40.0) * (rate - rmin) / (rmax - rmin)
        } else {
            LEFT + plot_w / 2.0
        }
    };
    let h = TOP + PANEL_H * results.len() as f64 + 10.0;
    let mut s = svg_open(
        W,
        h,
        LEFT,
        "tonic-balancer load sweep: p99 latency from scheduled start against the rate (log scale)",
        &format!(
            "{} instances, open loop, {:.1} s per contender and rate, deadline {}; solid: BalancedChannel's strategies, dashed: the others; x in the top band: p99 on failed calls",
            opts.instances,
            opts.duration.as_secs_f64(),
            ms(opts.deadline)
        ),
    );
    for (pi, (scenario, by_rate)) in results.iter().enumerate() {
        let oy = TOP + PANEL_H * pi as f64;
        let _ = writeln!(s, r#"<g transform="translate(0,{oy})">"#);
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="16" font-size="13" font-weight="bold">{}</text><text x="{LEFT}" y="31" fill="#666">{}</text>"##,
            esc(scenario.key()),
            esc(&scenario.describe(opts.instances))
        );
        // The fail band, the grid, the axes.
        let _ = writeln!(
            s,
            r##"<rect x="{LEFT}" y="{:.1}" width="{plot_w}" height="14" fill="#fdecea"/><text x="{}" y="{:.1}" text-anchor="end" fill="#d62728">fail</text>"##,
            fail_y - 7.0,
            LEFT - 6.0,
            fail_y + 4.0
        );
        axis.grid(&mut s, LEFT, LEFT + plot_w, opts.deadline);
        for &r in &opts.rates {
            let tx = x(r);
            let _ = writeln!(
                s,
                r##"<line x1="{tx:.1}" x2="{tx:.1}" y1="{plot_top}" y2="{:.1}" stroke="#eee"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#666">{r:.0}/s</text>"##,
                plot_top + plot_h,
                plot_top + plot_h + 15.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#666">calls per second</text>"##,
            LEFT + plot_w / 2.0,
            plot_top + plot_h + 30.0
        );
        // One line per contender.
        let fail_dx = 9.0;
        let mid = (opts.contenders.len() as f64 - 1.0) / 2.0;
        for (ci, c) in opts.contenders.iter().enumerate() {
            let color = COLORS[ci % COLORS.len()];
            let dash = if matches!(c, Contender::Ours(_)) {
                ""
            } else {
                r#" stroke-dasharray="6 3""#
            };
            let points: Vec<(f64, f64, Option<Duration>)> = opts
                .rates
                .iter()
                .zip(by_rate)
                .map(|(&r, rows)| {
                    let p = rows[ci].pcts[1];
                    match p {
                        Some(d) => (x(r), y(d.as_secs_f64() * 1e3), p),
                        // Side by side in the band, so that every failed contender shows.
                        None => (x(r) + fail_dx * (ci as f64 - mid), fail_y, p),
                    }
                })
                .collect();
            let path: Vec<String> = points
                .iter()
                .map(|(px, py, _)| format!("{px:.1},{py:.1}"))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for ((px, py, p), &r) in points.iter().zip(&opts.rates) {
                let title = format!("{} at {r:.0}/s: p99 {}", c.name(), pct_cell(*p));
                if p.is_some() {
                    let _ = writeln!(
                        s,
                        r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{color}"><title>{}</title></circle>"#,
                        esc(&title)
                    );
                } else {
                    let _ = writeln!(
                        s,
                        r#"<path d="M{:.1},{:.1} l8,8 m0,-8 l-8,8" stroke="{color}" stroke-width="2.5"><title>{}</title></path>"#,
                        px - 4.0,
                        py - 4.0,
                        esc(&title)
                    );
                }
            }
            // Legend.
            let ly = plot_top + 4.0 + 18.0 * ci as f64;
            let lx = LEFT + plot_w + 20.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx}" x2="{}" y1="{ly:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{}" y="{:.1}">{}</text>"#,
                lx + 24.0,
                lx + 30.0,
                ly + 4.0,
                esc(c.name())
            );
        }
        let _ = writeln!(s, "</g>");
    }
    let _ = writeln!(s, "</svg>");
    s
}
