//! Weighted round robin's pick as the channel makes it (over real instance records, no
//! network): shares in proportion to the weights, unusable instances skipped, round robin
//! while fewer than two instances have a weight.

use std::time::Duration;

use tonic_balancer::__bench::BenchPicker;
use tonic_balancer::Strategy;

fn shares(p: &BenchPicker, n: usize, picks: usize) -> Vec<usize> {
    let mut counts = vec![0; n];
    for _ in 0..picks {
        counts[p.pick().expect("a usable instance")] += 1;
    }
    counts
}

/// Weights 1, 1, 2, 4: over 8,000 picks each instance gets its share (1/8, 1/8, 1/4, 1/2)
/// within 2%; an instance made unusable gets nothing and the others keep their proportions.
#[tokio::test]
async fn picks_follow_the_weights_and_skip_unusable() {
    let p = BenchPicker::new(4, Strategy::WeightedRoundRobin);
    p.set_weights(&[1.0, 1.0, 2.0, 4.0]);
    let c = shares(&p, 4, 8000);
    for (got, want) in c.iter().zip([1000, 1000, 2000, 4000]) {
        assert!(got.abs_diff(want) <= 160, "{c:?}");
    }
    p.set(3, 0, Duration::from_millis(1), false);
    let c = shares(&p, 4, 4000);
    assert_eq!(c[3], 0, "{c:?}");
    for (got, want) in c[..3].iter().zip([1000, 1000, 2000]) {
        assert!(got.abs_diff(want) <= 100, "{c:?}");
    }
}

/// With one weight only (or none), the pick is plain round robin: every instance in turn.
#[tokio::test]
async fn round_robin_until_two_weights() {
    let p = BenchPicker::new(3, Strategy::WeightedRoundRobin);
    assert_eq!(shares(&p, 3, 300), vec![100, 100, 100]);
    p.set_weights(&[0.0, 0.0, 9.0]);
    assert_eq!(shares(&p, 3, 300), vec![100, 100, 100]);
    p.set_weights(&[3.0, 0.0, 9.0]);
    // The instance without a weight gets the mean (6): shares 3/18, 6/18, 9/18.
    let c = shares(&p, 3, 1800);
    for (got, want) in c.iter().zip([300, 600, 900]) {
        assert!(got.abs_diff(want) <= 40, "{c:?}");
    }
}

/// Settings that make no sense are refused by `build()`, naming the setting: a penalty that
/// is negative or not finite, an expiration period of zero.
#[tokio::test]
async fn bad_settings_are_refused() {
    use tonic_balancer::orca::WrrConfig;
    use tonic_balancer::{BalancedChannel, Error};
    let build = |cfg: WrrConfig| {
        BalancedChannel::builder()
            .uri("http://127.0.0.1:1")
            .weighted_round_robin(cfg)
            .build()
    };
    for (cfg, setting) in [
        (
            WrrConfig::default().error_utilization_penalty(-1.0),
            "weighted_round_robin.error_utilization_penalty",
        ),
        (
            WrrConfig::default().error_utilization_penalty(f64::NAN),
            "weighted_round_robin.error_utilization_penalty",
        ),
        (
            WrrConfig::default().weight_expiration_period(Duration::ZERO),
            "weighted_round_robin.weight_expiration_period",
        ),
    ] {
        match build(cfg) {
            Err(Error::InvalidSetting { name, .. }) => assert_eq!(name, setting),
            other => panic!("{setting}: {other:?}"),
        }
    }
    assert!(build(WrrConfig::default()).is_ok());
}

/// An instance that leaves service loses its weight: back in service, it gets the mean of
/// the others' weights until it reports again (gRPC resets an endpoint that leaves READY).
#[tokio::test]
async fn leaving_service_resets_the_weight() {
    let p = BenchPicker::new(4, Strategy::WeightedRoundRobin);
    p.set_weights(&[1.0, 1.0, 2.0, 4.0]);
    p.set(3, 0, Duration::from_millis(1), false);
    p.set(3, 0, Duration::from_millis(1), true);
    // Rebuild only (weights of 0 are no report): 1, 1, 2 and the mean 4/3.
    p.set_weights(&[0.0; 4]);
    let c = shares(&p, 4, 8000);
    let total = 1.0 + 1.0 + 2.0 + 4.0 / 3.0;
    for (got, w) in c.iter().zip([1.0, 1.0, 2.0, 4.0 / 3.0]) {
        let want = (8000.0 * w / total) as usize;
        assert!(got.abs_diff(want) <= 160, "{c:?}");
    }
}

/// An instance removed and taken back (a discovery answer that drops it, then names it again)
/// left service in between: its weight is reset as for any instance that leaves service.
#[tokio::test]
async fn an_instance_taken_back_does_not_keep_its_weight() {
    let p = BenchPicker::new(4, Strategy::WeightedRoundRobin);
    p.set_weights(&[1.0, 1.0, 2.0, 4.0]);
    p.remove_and_take_back_last();
    // Rebuild only: 1, 1, 2 and the mean 4/3 for the one taken back.
    p.set_weights(&[0.0; 4]);
    let c = shares(&p, 4, 8000);
    let total = 1.0 + 1.0 + 2.0 + 4.0 / 3.0;
    for (got, w) in c.iter().zip([1.0, 1.0, 2.0, 4.0 / 3.0]) {
        let want = (8000.0 * w / total) as usize;
        assert!(got.abs_diff(want) <= 160, "{c:?}");
    }
}
