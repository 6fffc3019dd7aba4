//! The least-pending tie-break over time, on a virtual clock: calls to instances whose answer
//! times are scripted, made one after another or several at once, through the channel's own
//! pick and the instances' own records of each answer. No socket and no scheduler take part,
//! so each scenario runs the same way every time, however loaded the machine, and a gate of
//! seconds costs no waiting. (`tests/suite/tiebreak.rs` checks with real servers that real answers
//! reach these records.)

use std::sync::Arc;
use std::time::Duration;

use super::dispatch::pick_now;
use super::Picker;
use crate::instance::context::Context;
use crate::instance::Instance;
use crate::load::tie::{Method, GATE_AT, GATE_FACTOR, MAX_GATE};
use crate::set::Set;
use crate::target::Target;
use crate::Strategy;

const MS: Duration = Duration::from_millis(1);
pub(super) const UNARY: &str = "/fleet.Fleet/Unary";
const STREAM: &str = "/fleet.Fleet/ClientStream";

/// A call on its way: it ends at `end` (nanoseconds on the virtual clock).
pub(super) struct Pending {
    end: u64,
    sent: u64,
    instance: usize,
    method: Method,
}

/// A channel's pick over `n` instances (never connected: no call is sent), and a virtual
/// clock.
pub(super) struct Sim {
    picker: Picker,
    pub(super) instances: Vec<Arc<Instance>>,
    /// Now, in nanoseconds since the channel's epoch.
    pub(super) now: u64,
    /// Calls picked for each instance so far.
    pub(super) served: Vec<u64>,
    pending: Vec<Pending>,
}

impl Sim {
    fn new(n: usize) -> Sim {
        Sim::with(n, Context::for_tests())
    }

    /// With the settings of `ctx`, and least pending.
    fn with(n: usize, ctx: Context) -> Sim {
        Sim::with_strategy(n, ctx, Strategy::LeastPending)
    }

    /// With the settings of `ctx` and `strategy` (least pending or fewest then fastest).
    pub(super) fn with_strategy(n: usize, ctx: Context, strategy: Strategy) -> Sim {
        if strategy == Strategy::FewestThenFastest {
            ctx.load
                .set_gate(crate::load::tie::GateRule::FEWEST_THEN_FASTEST);
        }
        // The pick's draws come from this thread's random source: a fixed seed, so that each
        // scenario runs the same way every time (seeded from the OS, the slow-start scenario
        // failed once in a hog loop's run, and passed 1,900 runs alone).
        crate::rng::Rng::seeded(0x5EED_5EED).store();
        let set = Set::new(Arc::new(ctx));
        for k in 0..n {
            let uri = format!("http://127.0.0.1:{}", 1 + k);
            set.insert(Target::uri(&uri, Duration::from_secs(1)).unwrap());
        }
        let instances = set.snapshot().to_vec();
        Sim {
            picker: Picker::new(set, strategy),
            instances,
            // Well after the epoch, as on a channel that has run for a while.
            now: 10_000_000_000,
            served: vec![0; n],
            pending: Vec::new(),
        }
    }

    /// Picks an instance for a call to `method` and sends it: it will take what `took` says
    /// for the instance picked. Returns which one.
    pub(super) fn start(&mut self, method: &str, took: impl FnOnce(usize) -> Duration) -> usize {
        self.start_with(method, |_, instance, _| took(instance))
    }

    /// As [`start`](Self::start), `took` told the instance picked and its calls in flight then
    /// (this one not counted).
    pub(super) fn start_with(
        &mut self,
        method: &str,
        took: impl FnOnce(&mut Sim, usize, usize) -> Duration,
    ) -> usize {
        let method = Method::of(method);
        let (instance, busy) = {
            let (snap, picked) = pick_now(&self.picker, &[], method);
            let chosen = &snap[picked.expect("a usable instance")];
            let instance = self
                .instances
                .iter()
                .position(|i| Arc::ptr_eq(i, chosen))
                .expect("one of the set");
            let busy = chosen.in_flight();
            chosen.standing.enter();
            (instance, busy)
        };
        self.served[instance] += 1;
        let t = took(self, instance, busy);
        self.pending.push(Pending {
            end: self.now + t.as_nanos() as u64,
            sent: self.now,
            instance,
            method,
        });
        instance
    }

    /// The first call in flight to end ends: the clock moves to its end and its instance
    /// records the answer. Returns which instance answered.
    pub(super) fn finish_next(&mut self) -> usize {
        let k = (0..self.pending.len())
            .min_by_key(|&k| self.pending[k].end)
            .expect("a call in flight");
        let call = self.pending.swap_remove(k);
        self.now = self.now.max(call.end);
        let instance = &self.instances[call.instance];
        instance.standing.leave();
        instance.sample(
            call.method,
            Duration::from_nanos(call.end - call.sent),
            call.sent,
            self.now,
        );
        call.instance
    }

    /// One call, waited for.
    pub(super) fn call(&mut self, method: &str, took: impl FnOnce(usize) -> Duration) -> usize {
        let instance = self.start(method, took);
        self.finish_next();
        instance
    }

    /// `n` unary calls one after another, each taking what `took` says; the calls each
    /// instance got.
    pub(super) fn calls(&mut self, n: usize, mut took: impl FnMut(usize) -> Duration) -> Vec<u64> {
        let before = self.served.clone();
        for _ in 0..n {
            self.call(UNARY, &mut took);
        }
        self.since(&before)
    }

    /// Open loop: a call to `method` every `1 / rate` s for `secs` s, each taking what
    /// `took` says for the instance picked and its calls in flight then (this one not
    /// counted); the answers that fall due meanwhile arrive in order, and the pick's clock
    /// moves with the calls. The calls each instance got.
    pub(super) fn open_loop(
        &mut self,
        rate: f64,
        secs: f64,
        mut took: impl FnMut(&mut Sim, usize, usize) -> Duration,
    ) -> Vec<u64> {
        let before = self.served.clone();
        let gap = (1e9 / rate) as u64;
        let calls = (rate * secs) as u64;
        for _ in 0..calls {
            self.advance_to(self.now + gap);
            self.start_with(UNARY, &mut took);
        }
        self.since(&before)
    }

    /// The clock moves on to `at`: the answers that fall due meanwhile arrive in order, and the
    /// pick's clock moves with it.
    pub(super) fn advance_to(&mut self, at: u64) {
        while self.pending.iter().any(|p| p.end <= at) {
            self.finish_next();
        }
        self.now = at;
        self.picker.set.ctx.load.advance_clock(at);
    }

    pub(super) fn since(&self, before: &[u64]) -> Vec<u64> {
        self.served.iter().zip(before).map(|(a, b)| a - b).collect()
    }

    fn slowness(&self, instance: usize) -> f64 {
        self.instances[instance]
            .tie
            .slowness()
            .expect("it answered")
    }
}

/// One caller, one call at a time, over 5 equal instances (5 ms), one of which answers its
/// first 3 calls 10x slower (a cold start): over 300 calls every instance gets at least 80% of
/// its fair share.
#[tokio::test]
async fn a_cold_start_does_not_shut_an_instance_out() {
    let mut sim = Sim::new(5);
    let mut cold = 0;
    let got = sim.calls(300, |i| {
        if i == 0 && cold < 3 {
            cold += 1;
            50 * MS
        } else {
            5 * MS
        }
    });
    assert!(got.iter().all(|&n| n >= 48), "{got:?}");
}

/// An instance that served a few long calls (three at once, 300 ms, where 2 ms is usual) is
/// seen as slow and gated; once it is as fast as the rest again it wins its turns back within
/// the gate's time (4 x the excess: 1.2 s) or the others' 32 turns, whichever comes first, and
/// then gets its fair share.
#[tokio::test]
async fn a_slow_spell_is_forgotten_once_the_instance_is_fast_again() {
    let mut sim = Sim::new(4);
    sim.calls(20, |_| 2 * MS);
    // Twelve calls at once: three on each instance, those on instance 0 long.
    for _ in 0..12 {
        sim.start(UNARY, |i| if i == 0 { 300 * MS } else { 2 * MS });
    }
    assert_eq!(sim.served, [8, 8, 8, 8]);
    while !sim.pending.is_empty() {
        sim.finish_next();
    }
    assert!(sim.slowness(0) > 2.0, "slowness {}", sim.slowness(0));
    // 32 turns of the other three come first (96 calls of 2 ms: 192 ms), then it is open.
    let got = sim.calls(96, |_| 2 * MS);
    assert_eq!(got[0], 0, "{got:?}");
    let got = sim.calls(200, |_| 2 * MS);
    assert!(
        got[0] >= 45,
        "the formerly slow instance got {got:?} of 200"
    );
    assert!(sim.slowness(0) < 1.25, "slowness {}", sim.slowness(0));
}

/// With calls far apart in time, the gate's time comes first: one answer of 50 ms where 5 ms
/// is usual closes the instance to ties for 4 x (50 - 2 x 5) = 160 ms, and the next call after
/// that goes to it.
#[tokio::test]
async fn a_gate_lasts_its_time() {
    let mut sim = Sim::new(4);
    sim.calls(40, |_| 5 * MS);
    // Instance 0 next in turn takes one slow call; the rest stay fast.
    let slow_at = loop {
        let i = sim.call(UNARY, |i| if i == 0 { 50 * MS } else { 5 * MS });
        if i == 0 {
            break sim.now;
        }
    };
    let reference = 5.0;
    let gate = GATE_FACTOR * (50.0 - GATE_AT * reference);
    assert_eq!(gate, 160.0);
    // One call every 20 ms (an idle gap of 15 ms after each): 8 calls before the gate ends,
    // fewer than the others' 32 turns.
    let mut first_back = None;
    for _ in 0..40 {
        let i = sim.call(UNARY, |_| 5 * MS);
        if i == 0 {
            first_back = Some(sim.now - 5_000_000 - slow_at);
            break;
        }
        sim.now += 15_000_000;
    }
    let back = Duration::from_nanos(first_back.expect("never re-checked"));
    let gate = Duration::from_millis(gate as u64);
    assert!(
        back >= gate && back <= gate + 20 * MS,
        "re-checked {back:?} after its slow answer (gate {gate:?})"
    );
}

/// An instance that stays slow (50 ms where the rest take 2 ms) gets few calls, each a
/// re-check: the gate doubles with each slow re-check, up to its longest (10 s of time, or
/// 32 x 2^7 of the others' turns), and it keeps being re-checked at least that often.
#[tokio::test]
async fn a_slow_instance_is_re_checked_ever_more_rarely_but_always() {
    let mut sim = Sim::new(4);
    let mut checks = Vec::new();
    // One call every 10 ms for 120 s (virtual): 12,000 calls.
    for _ in 0..12_000 {
        let i = sim.call(UNARY, |i| if i == 3 { 50 * MS } else { 2 * MS });
        if i == 3 {
            checks.push(sim.now);
        }
        sim.now += 8_000_000;
    }
    let total = sim.served[3];
    assert!(total >= 5, "re-checked {total} times");
    assert!(
        total * 100 <= 12_000,
        "the slow instance got {total} of 12,000 calls"
    );
    let gaps: Vec<u64> = checks
        .windows(2)
        .map(|w| (w[1] - w[0]) / 1_000_000)
        .collect();
    // The gaps grow (doubling, give or take a call), then stay under the cap: 10 s of time,
    // or 32 << 7 turns of each other instance (4,096 turns x 3: 12,288 calls, 123 s here),
    // whichever first, plus the slow call itself (50 ms) and one gap between calls (10 ms).
    let cap = Duration::from_nanos(MAX_GATE as u64).as_millis() as u64 + 50 + 10;
    for w in gaps.windows(2) {
        assert!(
            w[1] + 60 >= w[0] * 3 / 2 || w[0] * 2 > cap,
            "the gaps did not grow: {gaps:?}"
        );
    }
    assert!(
        gaps.iter().all(|&g| g <= cap),
        "gaps {gaps:?} ms, cap {cap}"
    );
    let later = gaps.iter().filter(|&&g| g + 60 >= cap).count();
    assert!(
        later >= 5,
        "the cap reached only {later} times: {gaps:?} ms"
    );
    assert!(sim.slowness(3) > 5.0, "slowness {}", sim.slowness(3));
}

/// A service whose methods differ in cost: 1 call in 10 is a client stream that takes 20x
/// longer, on every instance alike. Sequential calls still spread evenly: whichever instance
/// served the expensive calls is not taken for slow, each answer being compared with answers to the
/// same method.
#[tokio::test]
async fn an_expensive_method_does_not_make_an_instance_look_slow() {
    let mut sim = Sim::new(4);
    for k in 0..400 {
        if k % 10 == 3 {
            sim.call(STREAM, |_| 40 * MS);
        } else {
            sim.call(UNARY, |_| 2 * MS);
        }
    }
    assert!(sim.served.iter().all(|&n| n >= 90), "{:?}", sim.served);
    for i in 0..4 {
        assert!(sim.slowness(i) < 1.25, "instance {i}: {}", sim.slowness(i));
    }
}

/// Expensive calls take turns of their own: with every fourth call expensive over four instances, one
/// rotation for all calls would put every expensive call on the same instance; with turns per kind
/// each instance gets a quarter of them.
#[tokio::test]
async fn expensive_calls_are_shared_like_the_rest() {
    let mut sim = Sim::new(4);
    sim.calls(40, |_| 2 * MS);
    let mut expensive = [0u32; 4];
    for k in 0..160 {
        if k % 4 == 3 {
            expensive[sim.call(STREAM, |_| 40 * MS)] += 1;
        } else {
            sim.call(UNARY, |_| 2 * MS);
        }
    }
    assert!(
        expensive.iter().all(|&n| (9..=11).contains(&n)),
        "expensive calls: {expensive:?}"
    );
}

/// Slow start: an instance warming up (a 10 s window) takes a share of the calls that grows
/// with its time in the window, from a twentieth of its fair share to all of it, among 4
/// instances as among 20 (why a tie it wins costs it 1/share turns: docs/design.md, "Decisions",
/// slow start).
#[tokio::test]
async fn slow_start_ramps_an_instance_up_to_its_share() {
    let window = Duration::from_secs(10);
    for n in [4usize, 20] {
        let mut ctx = Context::for_tests();
        ctx.slow_start_ns = window.as_nanos() as u64;
        let mut sim = Sim::with(n, ctx);
        sim.calls(20 * n, |_| MS);
        let warm = n - 1;
        sim.instances[warm].warm_up_at(sim.now);
        // 500 calls a second, one after another (1 ms each, 1 ms apart): its share of each
        // second of the window, and of the second after it, against its fair share.
        let mut shares = Vec::new();
        for _ in 0..11 {
            let before = sim.served.clone();
            for _ in 0..500 {
                sim.call(UNARY, |_| MS);
                sim.now += 1_000_000;
            }
            let got = sim.since(&before);
            shares.push(got[warm] as f64 * n as f64 / 500.0);
        }
        for (k, share) in shares.iter().enumerate() {
            // Second k of the window: the ramp goes from k/10 to (k+1)/10 (at least 0.05).
            let (lo, hi) = ((k as f64 / 10.0).min(1.0), ((k + 1) as f64 / 10.0).min(1.0));
            assert!(
                *share >= lo - 0.12 && *share <= hi + 0.12,
                "{n} instances, second {k} of the window: {share:.2} of its fair share \
                 (the ramp: {lo:.1} to {hi:.1}): {shares:.2?}"
            );
        }
    }
}
