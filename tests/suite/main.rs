//! The crate's integration tests: one test binary (linked once, run once), one module per
//! topic, each test named `<module>::<test>` (`cargo test --test suite orca::` runs a topic).
//!
//! The modules share one process, and run in parallel with each other's tests: what is the
//! process's (a panic hook, the `metrics` recorder) is installed once for the suite, and each
//! test keeps to what is its own (its instances on ports of their own, its metrics under a
//! target of its own). A module whose tests need an optional part says so at its top
//! (`#![cfg(feature = "...")]`): without the feature, the module is not there.
//!
//! proptest keeps a module's saved failure cases in `tests/proptest-regressions/<module>.txt`:
//! next to the directory that has this `main.rs`, where it looks for them (not next to the
//! module's file).

mod common;

/// Runs each test of a module whose tests run against the test peers for both implementations:
/// `<module>::go::<test>` and `<module>::python::<test>`; each test is an `async fn(Kind)` of
/// the module, which has `Kind` (`fleet_service::peers::Kind`) in scope.
macro_rules! for_both {
    ($($test:ident),* $(,)?) => {
        mod go {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test(super::Kind::Go).await })*
        }
        mod python {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() { super::$test(super::Kind::Python).await })*
        }
    };
}

mod answers_in_time;
mod api;
mod call_path;
mod calls;
mod conformance;
mod connections;
mod connectivity;
mod correctness;
mod drop_in;
mod durations;
mod edge_cases;
mod failures;
mod health_check; // feature health-check
mod hedging;
mod membership;
mod metrics; // feature metrics
mod migration;
mod observe;
mod orca; // feature orca
mod orca_oob; // feature orca
mod orca_wire;
mod peers;
mod probe;
mod probed_pick;
mod prometheus_example; // feature metrics
mod retry;
mod routing;
mod scripted;
mod service_config; // feature service-config
mod smoke;
mod soak;
mod subset;
mod tiebreak;
mod timers;
mod tls; // feature hickory-dns
mod transports;
mod wait_for_ready;
mod wrr;
mod xds;
mod xds_peers;
mod xds_policy; // feature xds
mod xds_split; // feature xds
mod xds_tls; // feature xds-tls
