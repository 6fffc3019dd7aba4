//! The tie-break's record: its stride, its gates, its levels, and the method references.

use super::*;

const MS: f64 = 1e6;

/// An instance back in service starts at the turns of the instances in service: with most
/// of the set still out (their passes stopped where they left), their passes do not count.
#[tokio::test]
async fn a_returning_instance_starts_at_the_turns_of_those_in_service() {
    use crate::State;
    let ch = crate::BalancedChannel::builder()
        .uris((1..=5).map(|p| format!("http://127.0.0.1:{p}")))
        .build()
        .unwrap();
    let snap = ch.shared.snapshot();
    let ahead = 50 * UNIT;
    for (k, inst) in snap.iter().enumerate() {
        if k < 4 {
            inst.set_state(State::Ejected);
            inst.tie.pass.store(0, Ordering::Relaxed);
        } else {
            inst.set_state(State::Ready);
            inst.tie.pass.store(ahead, Ordering::Relaxed);
        }
    }
    // Back (the median of all four others would be a pass of 0).
    snap[0].set_state(State::Ready);
    assert_eq!(snap[0].tie.pass.load(Ordering::Relaxed), ahead);
    // With none in service, no level: the pass stays where it was.
    for inst in snap.iter() {
        inst.set_state(State::Ejected);
    }
    snap[1].set_state(State::Ready);
    assert_eq!(snap[1].tie.pass.load(Ordering::Relaxed), 0);
    // A pass further on than the set's stays.
    snap[0].tie.pass.store(2 * ahead, Ordering::Relaxed);
    snap[0].set_state(State::Ready);
    assert_eq!(snap[0].tie.pass.load(Ordering::Relaxed), 2 * ahead);
}

#[test]
fn method_keys_differ_and_are_stable() {
    let a = Method::of("/fleet.Fleet/Unary");
    let b = Method::of("/fleet.Fleet/ClientStream");
    assert_eq!(a, Method::of("/fleet.Fleet/Unary"));
    assert_ne!(a, b);
    assert_ne!(Method::of(""), Method::NONE);
}

/// The reference follows fast answers and a rare slow one barely moves it; each method
/// has its own.
#[test]
fn a_method_is_expensive_against_the_typical_call() {
    let m = Methods::new();
    let cheap = Method::of("/s.S/Cheap");
    let expensive = Method::of("/s.S/Expensive");
    let twice = Method::of("/s.S/Twice");
    assert!(!m.is_expensive(expensive), "nothing known yet");
    // Nine cheap calls in ten: the typical call is a cheap one.
    for k in 0..400 {
        match k % 10 {
            3 => m.reference(expensive, 100.0 * MS),
            7 => m.reference(twice, 10.0 * MS),
            _ => m.reference(cheap, 5.0 * MS),
        };
    }
    assert!(m.is_expensive(expensive), "20x the typical call");
    assert!(!m.is_expensive(twice), "2x is not expensive");
    assert!(!m.is_expensive(cheap));
    assert!(!m.is_expensive(Method::of("/s.S/Unseen")));
    assert!(!m.is_expensive(Method::NONE));
    // A service of expensive calls only: none is expensive against the typical call, itself.
    let alone = Methods::new();
    for _ in 0..100 {
        alone.reference(expensive, 100.0 * MS);
    }
    assert!(!alone.is_expensive(expensive));
}

#[test]
fn expensive_calls_take_turns_of_their_own() {
    // Two equal instances; the expensive pass decides expensive ties, the pass the others, and a
    // expensive call is a turn of the pass too.
    let a = TieBreak::new();
    let b = TieBreak::new();
    a.advance(0);
    assert!(a.turn(0).pass > b.turn(0).pass, "b's turn for a cheap call");
    assert_eq!(
        a.expensive_turn(0).pass,
        b.expensive_turn(0).pass,
        "no expensive call yet"
    );
    a.advance_expensive(0);
    assert!(
        a.expensive_turn(0).pass > b.expensive_turn(0).pass,
        "b's turn for an expensive one"
    );
    assert_eq!(
        a.turn(0).pass,
        2 * UNIT,
        "an expensive call advances the pass too"
    );
    // Gated: no expensive tie at all while the gate's time runs, whatever the passes.
    a.observe(100.0 * MS, 5.0 * MS, 0, 0);
    assert_eq!(a.expensive_turn(1).gate, u64::MAX);
    assert_eq!(a.turn_for(true, 1), a.expensive_turn(1));
    assert_eq!(a.turn_for(false, 1), a.turn(1));
    assert_eq!(b.expensive_turn(1).gate, 0);
}

#[test]
fn references_follow_the_fast_answers_per_method() {
    let m = Methods::new();
    let cheap = Method::of("/s.S/Cheap");
    let expensive = Method::of("/s.S/Expensive");
    assert_eq!(m.reference(cheap, 5.0 * MS), 5.0 * MS);
    assert_eq!(m.reference(expensive, 100.0 * MS), 100.0 * MS);
    for _ in 0..20 {
        m.reference(cheap, 5.0 * MS);
        m.reference(expensive, 100.0 * MS);
    }
    let before = m.reference(cheap, 100.0 * MS);
    let after = m.reference(cheap, 5.0 * MS);
    assert!((before - 5.0 * MS).abs() < 0.01 * MS, "{before}");
    assert!(after < 5.2 * MS, "one slow answer moved it to {after}");
    // A slow first answer is soon forgotten.
    let late = Method::of("/s.S/Late");
    m.reference(late, 50.0 * MS);
    let r = (0..40).fold(0.0, |_, _| m.reference(late, 5.0 * MS));
    assert!(r < 5.5 * MS, "{r}");
    assert!((m.reference(expensive, 100.0 * MS) - 100.0 * MS).abs() < 0.1 * MS);
}

/// Equal answers: one turn, never gated. A slow one: a longer stride, a gate that grows
/// while the answers stay slow, and both gone at the first fast answer.
#[test]
fn slowness_sets_stride_and_gate() {
    let t = TieBreak::new();
    t.observe(5.0 * MS, 5.0 * MS, 0, 0);
    assert_eq!(t.stride.load(Ordering::Relaxed), UNIT as u32);
    assert_eq!(t.turn(0).gate, 0);
    // 10x slower: counted as 4x (slowness 2.5: 4 turns), gated for 4 x (50 - 10) ms.
    t.observe(50.0 * MS, 5.0 * MS, 900, 1_000);
    assert_eq!(t.stride.load(Ordering::Relaxed), 4 * UNIT as u32);
    let gate1 = t.recheck_at.load(Ordering::Relaxed) - 1_000;
    assert_eq!(gate1, (GATE_FACTOR * 40.0 * MS) as u64);
    // ...or until the others took GATE_TURNS turns.
    assert_eq!(t.turn(1_000 + gate1 - 1).gate, GATE_TURNS * UNIT);
    assert_eq!(t.turn(1_000 + gate1).gate, 0);
    // An answer to a call sent before the gate: no strike.
    t.observe(50.0 * MS, 5.0 * MS, 999, 1_500);
    assert_eq!(t.recheck_at.load(Ordering::Relaxed) - 1_500, gate1);
    // Slow again when re-checked: the longest stride, and the gate doubles.
    t.observe(50.0 * MS, 5.0 * MS, 1_600, 2_000);
    assert_eq!(
        t.stride.load(Ordering::Relaxed),
        (MAX_TURNS * UNIT as f64) as u32
    );
    let gate2 = t.recheck_at.load(Ordering::Relaxed) - 2_000;
    assert_eq!(gate2, 2 * gate1);
    assert_eq!(t.turn(2_000).gate, 2 * GATE_TURNS * UNIT);
    // Fast again: open at once, one turn.
    t.observe(5.0 * MS, 5.0 * MS, 2_900, 3_000);
    assert_eq!(t.turn(3_000).gate, 0);
    assert_eq!(t.stride.load(Ordering::Relaxed), UNIT as u32);
    assert_eq!(t.slowness(), Some(1.0));
}

/// A quiet client's: a thousand answers, all fast.
fn quiet_client() -> Noise {
    let quiet = Noise::default();
    quiet.settle_quiet();
    quiet
}

/// The default's gates wait for confirmation where answers come often: one slow answer
/// after fast ones sets none (the tail every instance has); a second in a row gates for ten
/// times its excess; a third in a row, or a slow re-check, for at least two hundred usual
/// call times. Where answers come rarely, the first slow one gates at once.
#[test]
fn the_default_gates_after_two_slow_answers_in_a_row() {
    let rule = GateRule::FEWEST_THEN_FASTEST;
    let t = TieBreak::new();
    let quiet = quiet_client();
    t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    assert_eq!(
        t.observe_gated(15.0 * MS, 5.0 * MS, 1_000, 2_000, rule, &quiet),
        0
    );
    assert_eq!(t.weight(2_000), WEIGHT_ONE, "open");
    // A fast answer in between: the next slow one is the first again.
    t.observe_gated(5.0 * MS, 5.0 * MS, 2_000, 3_000, rule, &quiet);
    assert_eq!(
        t.observe_gated(15.0 * MS, 5.0 * MS, 3_000, 4_000, rule, &quiet),
        0
    );
    let until = t.observe_gated(15.0 * MS, 5.0 * MS, 4_000, 5_000, rule, &quiet);
    assert_eq!(
        until - 5_000,
        (10.0 * 5.0 * MS) as u64,
        "ten times the excess"
    );
    assert!(t.weight(5_000) > WEIGHT_ONE, "gated, its calls weigh more");
    let until = t.observe_gated(15.0 * MS, 5.0 * MS, 4_500, 6_000, rule, &quiet);
    assert_eq!(until - 6_000, (200.0 * 5.0 * MS) as u64, "the long minimum");
    // Where answers come rarely (the call sent more than 50 usual call times after the
    // previous answer), one slow answer sets the long gate at once: no second one would come
    // in time.
    let t = TieBreak::new();
    let quiet = quiet_client();
    t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    let sent = 1_000 + (50.0 * 5.0 * MS) as u64 + 1;
    let until = t.observe_gated(15.0 * MS, 5.0 * MS, sent, sent + 1, rule, &quiet);
    assert_eq!(until - (sent + 1), (200.0 * 5.0 * MS) as u64);
    // A call sent at once that took that long itself is no rare answer: its own time is no
    // gap (a client that stalled for 20 ms gated the instance for 200 ms at its first slow
    // answer, and with weights 3:1 the heavier one's share fell to 65%).
    let t = TieBreak::new();
    t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    let later = 1_000 + (60.0 * 5.0 * MS) as u64;
    assert_eq!(
        t.observe_gated(300.0 * MS, 5.0 * MS, 1_000, later, rule, &quiet),
        0
    );
}

/// Moderately slower: a stride that grows smoothly with the slowness, no cliff.
#[test]
fn the_stride_grows_smoothly() {
    let mut last = 0;
    for k in 0..40 {
        let t = TieBreak::new();
        let x = 1.0 + k as f64 * 0.1;
        t.observe(x * MS, MS, 0, 0);
        let stride = t.stride.load(Ordering::Relaxed);
        assert!(stride >= last, "stride fell at {x}");
        assert!(u64::from(stride) - u64::from(last) <= UNIT, "a step at {x}");
        last = stride;
    }
}

/// One hiccup (a sample 20x the estimate) counts for 4x at most.
#[test]
fn one_hiccup_counts_little() {
    let t = TieBreak::new();
    t.observe(5.0 * MS, 5.0 * MS, 0, 0);
    t.observe(100.0 * MS, 5.0 * MS, 0, 0);
    assert_eq!(t.slowness(), Some(2.5));
}

/// A failed answer ([`FAILED_AS`] times the reference) gates at its first, for least
/// pending's short time, under any strategy; failed re-checks in a row double it twice at
/// most; an answer after it that did not fail, slow by chance, is no slow re-check (no long
/// gate) and ends the run of failed re-checks.
#[test]
fn a_failed_answer_gates_briefly() {
    let quiet = quiet_client();
    let failed = FAILED_AS * 5.0 * MS;
    let short = (GATE_FACTOR * (FAILED_AS - GATE_AT) * 5.0 * MS) as u64;
    let t = TieBreak::new();
    t.observe_gated(
        5.0 * MS,
        5.0 * MS,
        0,
        1_000,
        GateRule::FEWEST_THEN_FASTEST,
        &quiet,
    );
    let until = t.observe_gated(failed, 5.0 * MS, 1_000, 2_000, GateRule::FAILED, &quiet);
    assert_eq!(until - 2_000, short, "gated at the first failure");
    // Re-checks (sent after the gate) that fail: doubled, twice at most.
    let mut now = 2_000;
    for doubled in [2, 4, 4, 4] {
        now += 1_000;
        let until = t.observe_gated(failed, 5.0 * MS, now - 500, now, GateRule::FAILED, &quiet);
        assert_eq!(until - now, doubled * short);
    }
    // Slow by chance, twice in a row (the default's confirmation on a quiet client): its
    // short gate, not the long minimum of a slow re-check.
    let rule = GateRule::FEWEST_THEN_FASTEST;
    t.observe_gated(15.0 * MS, 5.0 * MS, now, now + 1_000, rule, &quiet);
    let until = t.observe_gated(15.0 * MS, 5.0 * MS, now + 1_000, now + 2_000, rule, &quiet);
    assert_eq!(until - (now + 2_000), (10.0 * 5.0 * MS) as u64);
    // The failures' run ended: a failure that re-checks the slow answers' gate is the first
    // failed re-check again.
    let (sent, at) = (now + 2_500, now + 3_000);
    let until = t.observe_gated(failed, 5.0 * MS, sent, at, GateRule::FAILED, &quiet);
    assert_eq!(until - at, 2 * short);
}

/// Before the channel knows how often answers are slow by chance, a gate keeps the instance
/// out of the ties but weighs none of its calls: an instance with fewer calls in flight does
/// not lose on a new channel's evidence. Once it knows, a gate weighs them by the slowness.
#[test]
fn a_gate_weighs_calls_only_once_chance_is_known() {
    let rule = GateRule::FEWEST_THEN_FASTEST;
    let t = TieBreak::new();
    let fresh = Noise::default();
    t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &fresh);
    // Slow answers in a row until one gates (three at least, as chance is not known).
    let (mut k, mut until) = (1, 0);
    while until == 0 && k <= 8 {
        until = t.observe_gated(
            30.0 * MS,
            5.0 * MS,
            k * 1_000,
            (k + 1) * 1_000,
            rule,
            &fresh,
        );
        k += 1;
    }
    assert!(k > 3 && until > 0, "gated after {} slow answers", k - 1);
    assert_eq!(
        t.weight(k * 1_000),
        WEIGHT_ONE,
        "but its calls weigh one each"
    );
    let t = TieBreak::new();
    let quiet = quiet_client();
    t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    t.observe_gated(30.0 * MS, 5.0 * MS, 1_000, 2_000, rule, &quiet);
    t.observe_gated(30.0 * MS, 5.0 * MS, 2_000, 3_000, rule, &quiet);
    assert!(t.weight(3_000) > WEIGHT_ONE);
}

/// A slow answer right after another instance's slow answer starts the run of slow answers
/// again: a busy client holds up whatever answers are on their way, whichever instance sent
/// them. Two instances
/// whose slow answers come by turns are not gated; one whose slow answers come between the
/// other's fast answers is, at its second in a row.
#[test]
fn slowness_the_instances_share_gates_none() {
    let rule = GateRule::FEWEST_THEN_FASTEST;
    let quiet = quiet_client();
    let (a, b) = (TieBreak::new(), TieBreak::new());
    a.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    b.observe_gated(5.0 * MS, 5.0 * MS, 1_000, 2_000, rule, &quiet);
    let mut at = 2_000;
    for _ in 0..4 {
        for t in [&a, &b] {
            at += 1_000;
            let until = t.observe_gated(15.0 * MS, 5.0 * MS, at - 1_000, at, rule, &quiet);
            assert_eq!(until, 0, "slow by turns, at {at}");
        }
    }
    let quiet = quiet_client();
    let (a, b) = (TieBreak::new(), TieBreak::new());
    a.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    b.observe_gated(5.0 * MS, 5.0 * MS, 1_000, 2_000, rule, &quiet);
    assert_eq!(
        a.observe_gated(15.0 * MS, 5.0 * MS, 2_000, 3_000, rule, &quiet),
        0
    );
    b.observe_gated(5.0 * MS, 5.0 * MS, 3_000, 4_000, rule, &quiet);
    assert!(a.observe_gated(15.0 * MS, 5.0 * MS, 4_000, 5_000, rule, &quiet) > 0);
}

/// A slow answer to a call sent while the instance was gated (it went there because every
/// instance was gated, or the open ones were busy) is no slow re-check: the gate stays as it
/// was, neither set afresh nor doubled. A slow answer to a call sent after the gate ended is
/// one: the long minimum, doubled.
#[test]
fn only_a_call_sent_after_the_gate_is_a_re_check() {
    let rule = GateRule::FEWEST_THEN_FASTEST;
    let quiet = quiet_client();
    let t = TieBreak::new();
    t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &quiet);
    t.observe_gated(15.0 * MS, 5.0 * MS, 1_000, 2_000, rule, &quiet);
    let first = t.observe_gated(15.0 * MS, 5.0 * MS, 2_000, 3_000, rule, &quiet);
    assert_eq!(first - 3_000, (10.0 * 5.0 * MS) as u64);
    // Sent while gated: the gate stays.
    assert_eq!(
        t.observe_gated(15.0 * MS, 5.0 * MS, 3_500, 4_000, rule, &quiet),
        0
    );
    assert_eq!(t.recheck_at.load(Ordering::Relaxed), first);
    // Sent after that gate ended: a slow re-check.
    let (sent, at) = (first + 1, first + 1_000);
    assert_eq!(
        t.observe_gated(15.0 * MS, 5.0 * MS, sent, at, rule, &quiet) - at,
        2 * (200.0 * 5.0 * MS) as u64
    );
}

/// On a noisy client (one answer in ten slow by chance), a gate whose re-check answers fast
/// was as likely the client's delays as the instance's: the turns the floor forgave the
/// instance while gated are owed back, paid as half a stride off each tie it wins (twice its
/// share of the ties until paid). On a quiet client a gate is the instance's own slowness,
/// and nothing is owed.
#[test]
fn a_false_gate_on_a_noisy_client_is_paid_back() {
    let rule = GateRule::FEWEST_THEN_FASTEST;
    for (share, owed) in [(0.1, 100 * UNIT), (0.0, 0)] {
        let noise = Noise::default();
        noise.settle_at(share);
        let t = TieBreak::new();
        t.observe_gated(5.0 * MS, 5.0 * MS, 0, 1_000, rule, &noise);
        let (mut at, mut until) = (1_000, 0);
        while until == 0 {
            until = t.observe_gated(15.0 * MS, 5.0 * MS, at, at + 1_000, rule, &noise);
            at += 1_000;
        }
        // The others took 100 turns more than it while it was gated: the re-check that wins
        // a tie after the gate starts at the floor.
        t.advance(100 * UNIT);
        let (sent, at) = (until + 1, until + 1_000);
        assert_eq!(
            t.observe_gated(5.0 * MS, 5.0 * MS, sent, at, rule, &noise),
            0
        );
        assert_eq!(t.owed.load(Ordering::Relaxed), owed, "a share of {share}");
        let pass = t.pass.load(Ordering::Relaxed);
        t.advance(0);
        let step = t.pass.load(Ordering::Relaxed) - pass;
        assert_eq!(step, if owed > 0 { UNIT / 2 } else { UNIT });
        assert_eq!(
            t.owed.load(Ordering::Relaxed),
            owed.saturating_sub(UNIT / 2)
        );
    }
}
