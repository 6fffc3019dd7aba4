//! The scenarios: what goes wrong in the fleet (its instances' behaviours, a kill, a cold
//! start), and the schedule of each scenario's load.

use std::time::Duration;

use tonic::Code;

use crate::contenders::{Contender, STALL_CONTENDERS};
use crate::fleet::{self, Behavior, Fleet, ServerOptions};
use crate::load::Load;
use crate::options::Opts;
use crate::report::ms;

pub(crate) const FAST: Duration = Duration::from_millis(5);
const SLOW: Duration = Duration::from_millis(100);

/// low-concurrency: the instances it uses, the cold instance's first calls and their time.
const LOW_CONCURRENCY_INSTANCES: usize = 5;
pub(crate) const COLD_CALLS: u64 = 3;
pub(crate) const COLD: Duration = Duration::from_millis(50);
/// mixed-methods: the expensive method's time and one call in this many goes to it.
const COSTLY: Duration = Duration::from_millis(100);
const COSTLY_ONE_IN: u64 = 10;
/// The least measured time of the scenarios that report each instance's share of the calls:
/// a share needs calls to be more than noise.
const SHARE_MIN_DURATION: Duration = Duration::from_secs(2);
/// stalls: how long a stall lasts, and the share of calls that stall.
pub(crate) const STALL: Duration = Duration::from_millis(500);
const STALL_P: f64 = 0.02;

/// The fleet of a run: `n` instances answering in `FAST`; with `load_reports`, each reports its
/// load (ORCA) on every response, as with `OrcaLayer` (the options accept it with the `orca`
/// feature only).
pub(crate) fn start_fleet(n: usize, load_reports: bool) -> Fleet {
    assert!(
        cfg!(feature = "orca") || !load_reports,
        "load reports need the orca feature"
    );
    Fleet::start_with(n, Behavior::Delay(FAST), || ServerOptions {
        #[cfg(feature = "orca")]
        orca: load_reports.then(tonic_balancer::orca::OrcaHandle::new),
        ..ServerOptions::default()
    })
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scenario {
    Uniform,
    Heterogeneous,
    FailFast,
    Unreachable,
    Hang,
    Overload,
    KillRestart,
    LowConcurrency,
    MixedMethods,
    Stalls,
}

pub(crate) const SCENARIOS: [Scenario; 10] = [
    Scenario::Uniform,
    Scenario::Heterogeneous,
    Scenario::FailFast,
    Scenario::Unreachable,
    Scenario::Hang,
    Scenario::Overload,
    Scenario::KillRestart,
    Scenario::LowConcurrency,
    Scenario::MixedMethods,
    Scenario::Stalls,
];

/// What the sweep runs when `--scenario` does not say.
pub(crate) const SWEEP_SCENARIOS: [Scenario; 2] = [Scenario::Heterogeneous, Scenario::Overload];

const OVERLOAD_PER_CALL: Duration = Duration::from_millis(20);

/// What a scenario does to the fleet.
pub(crate) struct Setup {
    pub(crate) behaviors: Vec<Behavior>,
    pub(crate) uris: Vec<String>,
    /// The misbehaving instances (indices into the fleet), whose share of calls is reported.
    pub(crate) bad: Vec<usize>,
    /// Stop `bad[0]` at this fraction of the measured window, restart it at the second.
    pub(crate) kill: Option<(f64, f64)>,
    /// An instance whose cold start (`COLD_CALLS` calls in `COLD`) the reset arms afresh for
    /// each contender.
    pub(crate) cold: Option<usize>,
    /// The instances whose share of the calls is reported (empty: none is).
    pub(crate) shares: Vec<usize>,
    /// One caller, one call at a time (closed loop), instead of the open-loop schedule.
    pub(crate) closed_loop: bool,
    /// One call in `COSTLY_ONE_IN` is a ClientStream call (the expensive method).
    pub(crate) mixed: bool,
}

impl Scenario {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Scenario::Uniform => "uniform",
            Scenario::Heterogeneous => "heterogeneous",
            Scenario::FailFast => "fail-fast",
            Scenario::Unreachable => "unreachable",
            Scenario::Hang => "hang",
            Scenario::Overload => "overload",
            Scenario::KillRestart => "kill-restart",
            Scenario::LowConcurrency => "low-concurrency",
            Scenario::MixedMethods => "mixed-methods",
            Scenario::Stalls => "stalls",
        }
    }

    /// The rate, measured time and warm-up of this scenario's runs.
    pub(crate) fn load(self, opts: &Opts) -> Load {
        let base = Load {
            rate: opts.rate,
            duration: opts.duration,
            warmup: opts.warmup,
        };
        match self {
            // No warm-up: the measured run starts with the fresh channel and the cold start.
            Scenario::LowConcurrency => Load {
                duration: opts.duration.max(SHARE_MIN_DURATION),
                warmup: Duration::ZERO,
                ..base
            },
            Scenario::MixedMethods => Load {
                duration: opts.duration.max(SHARE_MIN_DURATION),
                ..base
            },
            _ => base,
        }
    }

    pub(crate) fn describe(self, n: usize) -> String {
        let k = fifth(n).len();
        match self {
            Scenario::Uniform => format!("all {n} instances answer in {}", ms(FAST)),
            Scenario::Heterogeneous => format!(
                "{k} of {n} instances answer in {}, the others in {}",
                ms(SLOW),
                ms(FAST)
            ),
            Scenario::FailFast => {
                format!("1 of {n} instances answers UNAVAILABLE at once, the others in {}", ms(FAST))
            }
            Scenario::Unreachable => format!(
                "2 of {n} addresses refuse connections, the others answer in {}",
                ms(FAST)
            ),
            Scenario::Hang => {
                format!("1 of {n} instances never answers, the others answer in {}", ms(FAST))
            }
            Scenario::Overload => format!(
                "{k} of {n} instances take {} + {} per call already in flight, the others {}",
                ms(FAST),
                ms(OVERLOAD_PER_CALL),
                ms(FAST)
            ),
            Scenario::KillRestart => format!(
                "1 of {n} instances is killed at 1/3 of the run and restarted at 2/3, all answer in {}",
                ms(FAST)
            ),
            Scenario::LowConcurrency => format!(
                "one caller, one call at a time, over {} of the {n} instances (i0-i{}) answering in {}; i0's first {COLD_CALLS} calls take {} (a cold start)",
                low_concurrency_n(n),
                low_concurrency_n(n) - 1,
                ms(FAST),
                ms(COLD)
            ),
            Scenario::MixedMethods => format!(
                "all {n} instances answer Unary in {} and ClientStream (one message) in {}; 1 call in {COSTLY_ONE_IN} is a ClientStream call",
                ms(FAST),
                ms(COSTLY)
            ),
            Scenario::Stalls => format!(
                "all {n} instances answer in {}, but each call stalls {} with {:.0}% probability, on any instance alike",
                ms(FAST),
                ms(STALL),
                STALL_P * 100.0
            ),
        }
    }

    pub(crate) fn setup(self, uris: &[String]) -> Setup {
        let n = uris.len();
        let mut behaviors = vec![Behavior::Delay(FAST); n];
        let mut uris = uris.to_vec();
        let mut kill = None;
        let mut cold = None;
        let mut shares = vec![];
        let bad = match self {
            Scenario::Uniform => vec![],
            Scenario::Heterogeneous => {
                let bad = fifth(n);
                for &i in &bad {
                    behaviors[i] = Behavior::Delay(SLOW);
                }
                bad
            }
            Scenario::FailFast => {
                behaviors[0] = Behavior::Fail(Code::Unavailable);
                vec![0]
            }
            Scenario::Unreachable => {
                // Their instances keep running but are not in the list: they serve nothing.
                for u in uris.iter_mut().take(2.min(n - 1)) {
                    *u = fleet::unreachable_uri();
                }
                vec![]
            }
            Scenario::Hang => {
                behaviors[0] = Behavior::Hang;
                vec![0]
            }
            Scenario::Overload => {
                let bad = fifth(n);
                for &i in &bad {
                    behaviors[i] = Behavior::Overload {
                        base: FAST,
                        per_call: OVERLOAD_PER_CALL,
                    };
                }
                bad
            }
            Scenario::KillRestart => {
                kill = Some((1.0 / 3.0, 2.0 / 3.0));
                vec![0]
            }
            Scenario::LowConcurrency => {
                uris.truncate(low_concurrency_n(n));
                cold = Some(0);
                shares = (0..uris.len()).collect();
                vec![]
            }
            Scenario::MixedMethods => {
                behaviors.fill(Behavior::MethodCost {
                    other: FAST,
                    client_stream: COSTLY,
                });
                shares = (0..n).collect();
                vec![]
            }
            Scenario::Stalls => {
                behaviors.fill(Behavior::Stall {
                    p: STALL_P,
                    stall: STALL,
                    base: FAST,
                });
                vec![]
            }
        };
        Setup {
            behaviors,
            uris,
            bad,
            kill,
            cold,
            shares,
            closed_loop: self == Scenario::LowConcurrency,
            mixed: self == Scenario::MixedMethods,
        }
    }
}

/// The scenarios of this run whose schedule is not the common one, as a note for the headers.
pub(crate) fn exceptions(opts: &Opts) -> String {
    let mut notes = vec![];
    for s in &opts.scenarios {
        let load = s.load(opts);
        if *s == Scenario::LowConcurrency {
            notes.push(format!(
                "{}: closed loop, {:.1} s, no warm-up",
                s.key(),
                load.duration.as_secs_f64()
            ));
        } else if load.duration != opts.duration {
            notes.push(format!("{}: {:.1} s", s.key(), load.duration.as_secs_f64()));
        }
    }
    if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    }
}

/// The contenders of a scenario: stalls always compares the default strategy without and with
/// hedging; the others run the ones chosen.
pub(crate) fn contenders_of(scenario: Scenario, opts: &Opts) -> Vec<Contender> {
    if scenario == Scenario::Stalls && !opts.sweep {
        STALL_CONTENDERS.to_vec()
    } else {
        opts.contenders.clone()
    }
}

/// The instances low-concurrency uses: 5, or the whole fleet if it is smaller.
fn low_concurrency_n(n: usize) -> usize {
    LOW_CONCURRENCY_INSTANCES.min(n)
}

/// Whether call `i` goes to the expensive method: a fixed pseudo-random pattern (splitmix64),
/// the same for every contender, one call in `COSTLY_ONE_IN` on average. A pattern with a
/// period (every tenth call) would line up with a round robin's.
pub(crate) fn costly(i: u64) -> bool {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z.is_multiple_of(COSTLY_ONE_IN)
}

/// A fifth of `0..n` (at least one), spread out.
fn fifth(n: usize) -> Vec<usize> {
    let k = (n / 5).max(1);
    (0..k).map(|j| j * n / k).collect()
}
