//! What an answer teaches: every write that an instance's answer makes to what the channel
//! knows of its load, in one place. A call's guard hands each answer here
//! ([`ChannelLoad::answered`], [`ChannelLoad::failed`], [`ChannelLoad::take_report`]); the
//! records it writes (the latency estimates of `latency.rs`, the tie-break's record of `tie/`,
//! the load reports of `reported.rs`) keep their reads, for the pick, in their own files.
//!
//! Sources: Finagle's
//! [`PeakEwma`](https://github.com/twitter/finagle/blob/develop/finagle-core/src/main/scala/com/twitter/finagle/loadbalancer/PeakEwma.scala),
//! [gRFC A51](https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::channel::ChannelLoad;
use super::latency::Latency;
use super::report::{LoadReport, TRAILER};
use super::reported::{OthersInFlight, Reported};
use super::tie::{
    GateRule, Method, Noise, TieBreak, FAILED_AS, FIRST_CHARGE_TURNS, GATE_AT, GATE_TURNS,
    MAX_GATE, MAX_OWED, MAX_WEIGHT, SCALE_ONE, UNIT, WEIGHT_ONE,
};

impl ChannelLoad {
    /// An answer to a call to `method`, taken at `at`, took `elapsed`: the latency estimates,
    /// the tie-break's record and the pick's coarse clock move.
    #[inline]
    pub(crate) fn answered(
        &self,
        tie: &TieBreak,
        latency: &Latency,
        method: Method,
        elapsed: Duration,
        at: Instant,
    ) {
        let now = self.ns_at(at);
        let sent = now.saturating_sub(elapsed.as_nanos() as u64);
        self.sample(tie, latency, method, elapsed, sent, now);
    }

    /// A call to `method`, sent at `sent` (nanoseconds since the channel's epoch), taken at
    /// `now`, counts as having taken `sample`.
    pub(crate) fn sample(
        &self,
        tie: &TieBreak,
        latency: &Latency,
        method: Method,
        sample: Duration,
        sent: u64,
        now: u64,
    ) {
        let sample = sample.as_nanos() as u64 as f64;
        latency.observe(sample, now, self.latency_decay);
        let reference = self.methods.reference(method, sample);
        self.observe_tie(tie, sample, reference, sent, now, self.gate());
    }

    /// A failed answer to a call to `method` that took `elapsed`, taken at `at`: the tie-break
    /// counts it as an answer [`FAILED_AS`] times the method's reference (a slow answer,
    /// gated as [`GateRule::FAILED`] says), whatever it took: the failure is the evidence,
    /// while its time on a busy client is the client's own noise (counted as is, a slow failure
    /// was slowness confirmed under the default's long gates, and with errors that every
    /// instance answers alike, three in ten, one instance of five drew 183 calls of 2,000
    /// beside two spinning processes). The latency estimate takes it only if it is slower
    /// (evidence of slowness for the strategies that weigh latency); the method's reference
    /// does not move. Nothing is counted for a method no instance has answered yet.
    pub(crate) fn failed(
        &self,
        tie: &TieBreak,
        latency: &Latency,
        method: Method,
        elapsed: Duration,
        at: Instant,
    ) {
        let now = self.ns_at(at);
        let took = elapsed.as_nanos() as u64;
        let usual = latency.last_ns();
        if usual > 0.0 && took as f64 > usual {
            latency.observe(took as f64, now, self.latency_decay);
        }
        let reference = self.methods.current(method);
        if reference > 0.0 {
            let sent = now.saturating_sub(took);
            let sample = FAILED_AS * reference;
            self.observe_tie(tie, sample, reference, sent, now, GateRule::FAILED);
        }
    }

    /// The tie-break's record and the pick's coarse clock move with an answer that counts as
    /// `sample` where its method's reference is `reference`; a gate it sets follows `rule`.
    #[inline]
    fn observe_tie(
        &self,
        tie: &TieBreak,
        sample: f64,
        reference: f64,
        sent: u64,
        now: u64,
        rule: GateRule,
    ) {
        let gated = tie.observe_gated(sample, reference, sent, now, rule, &self.methods.noise);
        if gated > 0 {
            self.gate_until(gated);
        }
        self.advance_clock(now);
    }

    /// Reads the load report in a response's trailers (or trailers-only head) `map`, if there
    /// is one, and keeps what the pick needs of it in `others` and `reported`; `own`: this
    /// channel's calls in flight on the instance (`name`), the one that carried the report
    /// included, as the server counted them (read only when there is a report). The one place where per-call load reports are
    /// taken.
    #[inline]
    pub(crate) fn take_report(
        &self,
        map: &mut http::HeaderMap,
        others: &OthersInFlight,
        reported: &Reported,
        own: impl FnOnce() -> usize,
        name: &str,
    ) {
        // Most responses have none: one lookup, and the rest out of line.
        if map.contains_key(&TRAILER_NAME) {
            self.take_report_slow(map, others, reported, own(), name);
        }
    }

    #[inline(never)]
    fn take_report_slow(
        &self,
        map: &mut http::HeaderMap,
        others: &OthersInFlight,
        reported: &Reported,
        own: usize,
        name: &str,
    ) {
        let Some(report) = read(map) else { return };
        let now = self.ns_at(Instant::now());
        tracing::trace!(server.address = %name, own, in_flight = ?report.calls_in_flight(), "load report");
        self.keep_report(others, reported, report, own, now);
    }

    /// Takes in a report received at `now_ns` while this channel had `own` calls in flight on
    /// its instance: the others' calls (a report of calls in flight), the report itself, and
    /// the pick's coarse clock.
    pub(crate) fn keep_report(
        &self,
        others: &OthersInFlight,
        reported: &Reported,
        report: LoadReport,
        own: usize,
        now_ns: u64,
    ) {
        self.advance_clock(now_ns);
        if let Some(total) = report.calls_in_flight() {
            let count = (total.round() - own as f64).clamp(0.0, f64::from(u32::MAX)) as u64;
            let fresh_until = others.set(count, now_ns, self.reports.max_age_ticks);
            self.reports_fresh.note(fresh_until);
        }
        reported.record(report, now_ns, &self.reports);
    }
}

/// A name made once: looking up a `&str` would parse and check it on every response.
static TRAILER_NAME: http::HeaderName = http::HeaderName::from_static(TRAILER);

/// Reads and decodes the report in these headers or trailers, if any. Takes the map apart to
/// reuse tonic's base64 decoding, and puts it back as it was.
fn read(map: &mut http::HeaderMap) -> Option<LoadReport> {
    if !map.contains_key(&TRAILER_NAME) {
        return None;
    }
    let md = tonic::metadata::MetadataMap::from_headers(std::mem::take(map));
    let report = md
        .get_bin(TRAILER)
        .and_then(|v| v.to_bytes().ok())
        .and_then(|b| LoadReport::decode(&b));
    *map = md.into_headers();
    report
}

impl Latency {
    /// Folds one sample into the estimates: a sample above the estimate replaces it (peak), a
    /// lower one pulls it down exponentially with time constant `decay`.
    pub(crate) fn observe(&self, sample_ns: f64, now_ns: u64, decay: Duration) {
        let prev = f64::from_bits(self.estimate_ns.load(Ordering::Relaxed));
        let next = if prev == 0.0 || sample_ns > prev {
            sample_ns
        } else {
            let at = self.at.load(Ordering::Relaxed);
            let elapsed = now_ns.saturating_sub(at) as f64;
            // Weight of the new sample grows with the time since the last one, as in
            // Finagle's PeakEwma (which uses 1 - e^(-t/decay); t / (t + decay) has the same
            // shape for a fraction of the cost); at least 5% so that a busy instance still
            // moves.
            let w = (elapsed / (elapsed + decay.as_nanos() as u64 as f64)).max(0.05);
            prev * (1.0 - w) + sample_ns * w
        };
        self.estimate_ns.store(next.to_bits(), Ordering::Relaxed);
        let steady = f64::from_bits(self.steady_ns.load(Ordering::Relaxed));
        let steady = if steady == 0.0 {
            sample_ns
        } else {
            steady + 0.5 * (sample_ns.min(4.0 * steady) - steady)
        };
        self.steady_ns.store(steady.to_bits(), Ordering::Relaxed);
        self.at.store(now_ns, Ordering::Relaxed);
    }
}

/// A slow answer to a call sent more than this many times its method's reference after the
/// instance's previous answer gates at once (the gap before the call: the call's own time is
/// no sign that answers come rarely), without waiting for a second one: a client that
/// sees an instance rarely (one of many clients, or a low rate) would get its confirmation after
/// the slow spell is over (50 clients sharing 2,000 calls/s see each of 20 instances about
/// twice a second; what waiting for two cost there: `docs/design.md`, the default's section).
const SPARSE_REFS: f64 = 50.0;
/// In [`TieBreak`]'s `strikes`: the gate set last was a failed answer's ([`GateRule::failure`]).
const FAILURE_GATE: u32 = 1 << 8;

/// What an answer does to the tie-break's record (its reads are in `tie/`).
impl TieBreak {
    /// As [`observe_gated`](Self::observe_gated) with least pending's gates.
    #[cfg(test)]
    pub(crate) fn observe(&self, sample_ns: f64, reference_ns: f64, sent_ns: u64, now_ns: u64) {
        self.observe_gated(
            sample_ns,
            reference_ns,
            sent_ns,
            now_ns,
            GateRule::LEAST_PENDING,
            &Noise::default(),
        );
    }

    /// One answer to a call sent at `sent_ns`: it took `sample_ns`, where the method's
    /// reference is `reference_ns`, at `now_ns` on the channel's clock. A gate it sets lasts as
    /// `rule` says. Returns when the gate it set ends (0: it set none).
    pub(crate) fn observe_gated(
        &self,
        sample_ns: f64,
        reference_ns: f64,
        sent_ns: u64,
        now_ns: u64,
        rule: GateRule,
        noise: &Noise,
    ) -> u64 {
        if !(reference_ns > 0.0 && sample_ns.is_finite()) {
            return 0;
        }
        // How many slow answers in a row it takes is judged before this answer counts.
        let before = noise.word();
        if !rule.failure && self.slow_run.load(Ordering::Relaxed) == 0 {
            noise.observe(before, sample_ns > GATE_AT * reference_ns);
        }
        let prev = self.learn(sample_ns / reference_ns);
        let excess = sample_ns - GATE_AT * reference_ns;
        // The instance's first answer says nothing of how often answers come (and is often a
        // warm-up's: a new connection, a cold server). Every answer counts for how often they
        // come, whatever its rule (a failed answer's too: an instance gated by failures is
        // answering often, and its next slow answer is no rare one).
        let last = self.answered_at.swap(now_ns, Ordering::Relaxed);
        let sparse = rule.confirm
            && last != 0
            && sent_ns.saturating_sub(last) as f64 > SPARSE_REFS * reference_ns;
        if excess > 0.0 {
            let gated_at = self.gated_at.load(Ordering::Relaxed);
            let strikes = self.strikes_so_far(rule);
            if strikes.is_none() {
                // An answer, slow but not failed, ends a run of failed re-checks (the failure's
                // gate stays one: the answers slow by chance after it are no re-checks).
                self.strikes.store(FAILURE_GATE, Ordering::Relaxed);
            }
            let (strikes, floor) = if rule.confirm {
                let confirm = Noise::run_for(before);
                let shared = noise.slow_shared(self as *const TieBreak as u64);
                let Some(gate) = self.confirmed(
                    now_ns,
                    sent_ns,
                    reference_ns,
                    rule,
                    (confirm, sparse, shared),
                ) else {
                    return 0;
                };
                gate
            } else {
                // A strike: slow again when re-checked after a gate (answers to calls that
                // were already on their way when the gate was set add none).
                let strikes = match strikes {
                    Some(_) if prev < GATE_AT => 0,
                    Some(n) if sent_ns >= gated_at => (n + 1).min(rule.max_strikes),
                    Some(n) => n,
                    None => 0,
                };
                (strikes, rule.min_refs * reference_ns)
            };
            self.close(excess, floor, strikes, rule, before, now_ns)
        } else {
            if rule.confirm {
                noise.fast();
            }
            self.slow_run.store(0, Ordering::Relaxed);
            if self.recheck_at.swap(0, Ordering::Relaxed) != 0 {
                self.gate_ended(before);
            } else if self.forgiven.load(Ordering::Relaxed) != 0 {
                // Open: the turns forgiven since the last answer were a busy instance's.
                self.forgiven.store(0, Ordering::Relaxed);
            }
            self.strikes.store(0, Ordering::Relaxed);
            0
        }
    }

    /// Closes the instance to the ties after an answer `excess` over [`GATE_AT`] times its
    /// method's reference: for `rule`'s time (at least `floor`), doubled `strikes` times, and
    /// for as many of the others' turns; `before`: the channel's noise word before the answer.
    /// Returns when the gate ends.
    fn close(
        &self,
        excess: f64,
        floor: f64,
        strikes: u32,
        rule: GateRule,
        before: u64,
        now_ns: u64,
    ) -> u64 {
        let mark = if rule.failure { FAILURE_GATE } else { 0 };
        self.strikes.store(strikes | mark, Ordering::Relaxed);
        // A lighter instance (a weight the membership gives it) answers fewer calls, so it
        // is gated less often: its gates are as much longer as its turns are, so that every
        // instance loses the same share of its calls to gates (the heaviest's gates, three
        // times as many for 3:1, shortened nothing; its share was diluted towards equal).
        let scale = self.scale.load(Ordering::Relaxed);
        let stretch = f64::from(scale) / f64::from(SCALE_ONE);
        let gate = ((rule.factor * excess).max(floor) * f64::from(1u32 << strikes) * stretch)
            .min(MAX_GATE);
        let turns = (GATE_TURNS << strikes) * UNIT * u64::from(scale) / u64::from(SCALE_ONE);
        let pass = self.pass.load(Ordering::Relaxed);
        self.gate_pass
            .store(pass.saturating_add(turns), Ordering::Relaxed);
        if rule.confirm && !Noise::is_known(before) {
            // Before the channel knows how often its answers are slow by chance (its first
            // answers: new connections, a client that may be busy), a gate keeps the
            // instance out of the ties but does not weigh its calls: an instance with fewer
            // calls in flight never loses on such evidence (docs/design.md, the default's
            // section, has what it cost).
            self.weight.store(WEIGHT_ONE as u32, Ordering::Relaxed);
        }
        let until = now_ns.saturating_add(gate as u64);
        self.recheck_at.store(until, Ordering::Relaxed);
        self.gated_at.store(now_ns, Ordering::Relaxed);
        self.gate_end.store(until, Ordering::Relaxed);
        until
    }

    /// A fast answer ended a gate; `noise`: the channel's noise word before it. Where the
    /// client is noisy (its answers are slow by chance often enough, see [`Noise::is_noisy`]),
    /// a gate for slowness (not a failure's) whose slow re-checks chance could give ended
    /// the way a gate the client's own delays set ends: a busy client holds up answers from
    /// every instance alike, and a run of them on one instance gates it. The turns the floor
    /// forgave it while gated are owed back (see `TieBreak::owed`), so that such a gate moves
    /// calls in time but not in share. On a quiet client a gate is the instance's own
    /// slowness, and an instance that was slow under load is not handed more calls for it.
    #[cold]
    fn gate_ended(&self, noise: u64) {
        let forgiven = self.forgiven.swap(0, Ordering::Relaxed);
        let strikes = self.strikes.load(Ordering::Relaxed);
        if forgiven > 0 && strikes & FAILURE_GATE == 0 && Noise::is_noisy(noise, strikes) {
            let owed = self.owed.load(Ordering::Relaxed);
            self.owed
                .store((owed + forgiven).min(MAX_OWED), Ordering::Relaxed);
        }
    }

    /// The slow re-checks in a row so far, as an answer under `rule` counts them; `None` if
    /// this answer can be no slow re-check: an answer that did not fail, after a failed
    /// answer's gate (a failure's gate is no slowness, and an answer slow by chance after it
    /// is no slow re-check: under the default's rule it would gate for 200 references at once,
    /// shutting out for a second an instance that answers NOT_FOUND as often as the rest).
    fn strikes_so_far(&self, rule: GateRule) -> Option<u32> {
        let word = self.strikes.load(Ordering::Relaxed);
        (word & FAILURE_GATE == 0 || rule.failure).then_some(word & !FAILURE_GATE)
    }

    /// The slowness estimate moves with an answer `x` times the method's reference (see the
    /// module docs), and the stride and the weight of a gated instance's calls with it.
    /// Returns the estimate before.
    fn learn(&self, x: f64) -> f64 {
        let prev = f64::from(f32::from_bits(self.slowness.load(Ordering::Relaxed)));
        let s = if prev <= 0.0 || x < 0.5 * prev {
            x
        } else {
            prev + 0.5 * (x.min(4.0 * prev) - prev)
        };
        self.slowness.store((s as f32).to_bits(), Ordering::Relaxed);
        let weight = s.clamp(1.0, f64::from(MAX_WEIGHT)) * WEIGHT_ONE as f64;
        self.weight.store(weight as u32, Ordering::Relaxed);
        let before = self.stride();
        self.store_stride(s);
        // The first answer's stride charges the turn that call was won at, too (at most
        // FIRST_CHARGE_TURNS more): that turn was won at one turn's stride, slowness unknown,
        // and without this an instance is handed its second call as soon as the others have
        // had one each, however slow its first answer was (with many clients starting
        // together, every client's second call to a slow instance within the same second:
        // docs/design.md, "Many clients starting together"). Later answers' strides apply from
        // the next turn on, as the gates expect.
        let after = self.stride();
        if prev <= 0.0 && after > before {
            let charge = (after - before).min(FIRST_CHARGE_TURNS * UNIT);
            self.pass.fetch_add(charge, Ordering::Relaxed);
        }
        prev
    }

    /// A slow answer, under a rule that waits for confirmation: `None` if it sets no gate yet,
    /// else the gate's strikes and floor.
    ///
    /// One slow answer from an instance whose previous answer was fast is most often the tail
    /// every instance has (a pause, an expensive request): where answers come often, it sets no
    /// gate. `confirm` in a row (see [`Noise::run_for`]: two on a quiet client), within
    /// the longest gate, set a gate as long as the excess says; the long minimum waits for one
    /// more in a row or a slow re-check. Where answers come rarely (see [`SPARSE_REFS`]), one
    /// fewer sets the long gate at once. See
    /// `pick::fastest_scenarios::equal_instances_with_a_tail` for what a gate at every slow
    /// answer cost, and `a_client_that_stalls_gates_no_instance` for what a fixed two did on a
    /// busy client.
    fn confirmed(
        &self,
        now_ns: u64,
        sent_ns: u64,
        reference_ns: f64,
        rule: GateRule,
        (confirm, sparse, shared): (u32, bool, bool),
    ) -> Option<(u32, f64)> {
        let last = self.slow_at.swap(now_ns, Ordering::Relaxed);
        let run = if shared {
            // The client's, as likely, and so the run so far: it starts again (only lengthening
            // it less, a slow spell of the client's that lasted forty calls still gated the
            // heavier of two instances, whose answers came three in a row between the other's).
            0
        } else if last != 0 && now_ns.saturating_sub(last) <= MAX_GATE as u64 {
            self.slow_run.load(Ordering::Relaxed).saturating_add(1)
        } else {
            1
        };
        self.slow_run.store(run, Ordering::Relaxed);
        if shared || run < confirm - u32::from(sparse) {
            return None;
        }
        // A call sent to it while it was gated for slowness went there because every instance
        // was gated or the open ones were busy (a busy client's slow spell gates them all):
        // its slow answer leaves the gate as it is, to end when set and be re-checked then.
        // Each such answer set the gate afresh at the long minimum, doubled: one instance
        // stayed gated for 5 s by seven of them in a row while calls went on to it.
        let gated = self.recheck_at.load(Ordering::Relaxed) != 0
            && self.strikes.load(Ordering::Relaxed) & FAILURE_GATE == 0;
        if gated
            && sent_ns >= self.gated_at.load(Ordering::Relaxed)
            && sent_ns < self.gate_end.load(Ordering::Relaxed)
        {
            return None;
        }
        let strikes = match self.strikes_so_far(rule) {
            Some(_) if self.recheck_at.load(Ordering::Relaxed) == 0 => 0,
            // A slow re-check: a call sent once the gate was over (one on its way when the gate
            // was set adds none; one sent while it was gated returned above).
            Some(n) if sent_ns >= self.gate_end.load(Ordering::Relaxed) => {
                (n + 1).min(rule.max_strikes)
            }
            Some(n) => n,
            None => 0,
        };
        let long = strikes > 0 || run > confirm || sparse;
        Some((
            strikes,
            if long {
                rule.min_refs * reference_ns
            } else {
                0.0
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::report::IN_FLIGHT_METRIC;
    use crate::load::reported::{tick, ReportSettings};
    use crate::load::weight::WrrConfig;
    use std::time::Duration;

    fn channel(reports: ReportSettings) -> ChannelLoad {
        let second = Duration::from_secs(1);
        let expiry = Duration::from_secs(5);
        ChannelLoad::new(
            Instant::now(),
            expiry,
            second,
            GateRule::LEAST_PENDING,
            reports,
        )
    }

    /// A report's count of the other clients' calls is its total minus this channel's own
    /// (never below zero); a report without the metric leaves the estimate alone. The
    /// channel's `ReportsFresh` says some count is fresh exactly while one is.
    #[test]
    fn observe_subtracts_own_calls() {
        let s = ReportSettings::default();
        let max_age_ticks = s.max_age_ticks;
        let ch = channel(s);
        let f = &ch.reports_fresh;
        let r = Reported::default();
        let o = OthersInFlight::default();
        assert!(!f.any(tick(0)));
        // A report without the metric: nothing fresh.
        ch.keep_report(&o, &r, LoadReport::default(), 1, 1_000);
        assert!(!f.any(tick(1_000)));
        let mut rep = LoadReport::default();
        rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), 12.0);
        ch.keep_report(&o, &r, rep.clone(), 4, 1_000);
        assert_eq!(o.get(tick(1_000)), 8);
        assert!(f.any(tick(1_000)));
        rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), 2.0);
        ch.keep_report(&o, &r, rep, 4, 1_000);
        assert_eq!(o.get(tick(1_000)), 0);
        let mut other = LoadReport::default();
        other.named_metrics.insert(IN_FLIGHT_METRIC.into(), 9.0);
        ch.keep_report(&o, &r, other, 1, 1_000);
        ch.keep_report(&o, &r, LoadReport::default(), 1, 2_000);
        assert_eq!(o.get(tick(2_000)), 8);
        assert_eq!(r.last().as_deref(), Some(&LoadReport::default()));
        // Fresh for the max age (1 s) after the last count, and no longer.
        let until = tick(1_000) + u64::from(max_age_ticks);
        assert!(f.any(until));
        assert_eq!(o.get(until), 8);
        assert!(!f.any(until + 1));
        assert_eq!(o.get(until + 1), 0);
        // Reports not kept (max age 0): nothing fresh.
        let ch = channel(ReportSettings::new(Duration::ZERO, WrrConfig::default()));
        let f = &ch.reports_fresh;
        let mut rep = LoadReport::default();
        rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), 12.0);
        ch.keep_report(&o, &r, rep, 4, 1_000);
        assert!(!f.any(tick(1_000)));
    }

    /// A report with a negative, infinite or NaN in-flight metric is not used for the count.
    #[test]
    fn nonsense_in_flight_is_ignored() {
        for v in [-1.0, f64::NAN, f64::INFINITY] {
            let mut rep = LoadReport::default();
            rep.named_metrics.insert(IN_FLIGHT_METRIC.into(), v);
            assert_eq!(rep.calls_in_flight(), None);
        }
    }

    /// The latency estimate that Peak EWMA and power of two choices compare: a slower sample
    /// replaces it at once, a faster one pulls it down with time, and without a new sample it
    /// fades linearly to unknown (0) over the expiry, so that an instance that was slow once
    /// is tried again.
    #[test]
    fn the_latency_estimate_takes_peaks_and_fades_over_its_expiry() {
        let ch = channel(ReportSettings::default());
        let inst = Latency::new(0);
        let (expiry, inv) = (ch.latency_expiry_ns, ch.inv_latency_expiry);
        let t = 10_000_000_000;
        let ms = 1e6;
        inst.observe(10.0 * ms, t, ch.latency_decay);
        assert_eq!(inst.estimate(t, expiry, inv), 10.0 * ms);
        inst.observe(40.0 * ms, t, ch.latency_decay);
        assert_eq!(
            inst.estimate(t, expiry, inv),
            40.0 * ms,
            "a peak replaces it"
        );
        // A fast sample one decay (1 s) later moves it half way.
        let t = t + 1_000_000_000;
        inst.observe(20.0 * ms, t, ch.latency_decay);
        assert_eq!(inst.estimate(t, expiry, inv), 30.0 * ms);
        // Half the expiry (5 s) without a sample: half of it; the whole expiry: unknown.
        assert!((inst.estimate(t + expiry / 2, expiry, inv) - 15.0 * ms).abs() < 1.0);
        assert_eq!(inst.estimate(t + expiry - 1, expiry, inv).round(), 0.0);
        assert_eq!(inst.estimate(t + expiry, expiry, inv), 0.0);
    }
}
