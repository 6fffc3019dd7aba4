//! What the live view keeps between frames: per instance, the channel's last record of it,
//! the mean of its in-flight samples and its calls over the last second; and what the callers
//! saw over the last second.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic_balancer::EndpointStats;

use super::Tally;

/// The window of the shares and of the callers' rates.
const WINDOW: Duration = Duration::from_secs(1);

/// One instance, as sampled.
pub(super) struct Track {
    pub(super) uri: String,
    /// Its index in the fleet (None: an address of no instance, such as an unreachable one).
    pub(super) index: Option<usize>,
    pub(super) last: EndpointStats,
    /// In-flight samples since the last frame.
    sum: u64,
    samples: u32,
    /// Their mean, as of the last frame.
    pub(super) mean: f64,
    /// `started` at each frame within the window (and the one just before it).
    history: VecDeque<(Instant, u64)>,
}

impl Track {
    pub(super) fn routed_in_window(&self) -> u64 {
        match (self.history.front(), self.history.back()) {
            (Some(a), Some(b)) => b.1.saturating_sub(a.1),
            _ => 0,
        }
    }
}

pub(super) struct View {
    fleet_uris: Vec<String>,
    pub(super) tracks: Vec<Track>,
    pub(super) tally: Arc<Tally>,
    /// (when, ok, failed) at each frame within the window.
    callers: VecDeque<(Instant, u64, u64)>,
    /// The largest mean in flight seen so far, for the bars' scale.
    peak: f64,
}

pub(super) fn trim(uri: &str) -> &str {
    uri.trim_end_matches('/')
}

/// Drops the entries older than the window, but the newest of them (the window's start).
fn prune<T>(history: &mut VecDeque<(Instant, T)>, now: Instant) {
    while history.len() > 1 && now.duration_since(history[1].0) >= WINDOW {
        history.pop_front();
    }
}

impl View {
    pub(super) fn new(fleet_uris: &[String], tally: Arc<Tally>) -> View {
        View {
            fleet_uris: fleet_uris.to_vec(),
            tracks: vec![],
            tally,
            callers: VecDeque::new(),
            peak: 0.0,
        }
    }

    pub(super) fn sample(&mut self, endpoints: &[EndpointStats]) {
        for e in endpoints {
            let track = match self.tracks.iter().position(|t| t.uri == e.uri()) {
                Some(k) => &mut self.tracks[k],
                None => {
                    let index = self
                        .fleet_uris
                        .iter()
                        .position(|u| trim(u) == trim(e.uri()));
                    self.tracks.push(Track {
                        uri: e.uri().to_owned(),
                        index,
                        last: e.clone(),
                        sum: 0,
                        samples: 0,
                        mean: 0.0,
                        history: VecDeque::new(),
                    });
                    // Fleet order; addresses of no instance after them.
                    self.tracks
                        .sort_by_key(|t| (t.index.is_none(), t.index, t.uri.clone()));
                    let k = self.tracks.iter().position(|t| t.uri == e.uri()).unwrap();
                    &mut self.tracks[k]
                }
            };
            track.sum += e.in_flight() as u64;
            track.samples += 1;
            track.last = e.clone();
        }
    }

    /// Closes the samples of one frame.
    pub(super) fn roll(&mut self, now: Instant) {
        for t in &mut self.tracks {
            if t.samples > 0 {
                t.mean = t.sum as f64 / f64::from(t.samples);
            }
            t.sum = 0;
            t.samples = 0;
            self.peak = self.peak.max(t.mean);
            t.history.push_back((now, t.last.started()));
            prune(&mut t.history, now);
        }
        let (ok, failed) = (
            self.tally.ok.load(Ordering::Relaxed),
            self.tally.failed.load(Ordering::Relaxed),
        );
        self.callers.push_back((now, ok, failed));
        while self.callers.len() > 1 && now.duration_since(self.callers[1].0) >= WINDOW {
            self.callers.pop_front();
        }
    }

    /// Calls that succeeded and failed per second, over the window.
    pub(super) fn caller_rates(&self) -> (f64, f64) {
        match (self.callers.front(), self.callers.back()) {
            (Some(a), Some(b)) if b.0 > a.0 => {
                let s = (b.0 - a.0).as_secs_f64();
                ((b.1 - a.1) as f64 / s, (b.2 - a.2) as f64 / s)
            }
            _ => (0.0, 0.0),
        }
    }

    /// The bars' full scale: 4 calls, or the power of two above the largest mean seen.
    pub(super) fn scale(&self) -> f64 {
        let mut s = 4.0;
        while s < self.peak {
            s *= 2.0;
        }
        s
    }
}
