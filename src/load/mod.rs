//! What the channel learns of each instance's load, kept in the instance for the pick to read:
//! its latency estimates (`latency.rs`), the tie-break's turns and slowness (`tie/`), its load
//! reports (`report.rs`, `reported.rs`, `wire.rs`: ORCA) and the weighted-round-robin weight
//! they give (`weight.rs`); and what the instances learn in common (`channel.rs`: the
//! per-method references, the pick's clock). Every write an answer makes is in `learn.rs`.
//!
//! The pick (`crate::pick`) reads these records, and what an instance answers feeds them; the
//! instance holds each by value, in the cache lines the pick reads. So they sit below the
//! instance, in a module of their own that names neither the instance nor the pick, as tower's
//! [`load`](https://docs.rs/tower/latest/tower/load/index.html) (`PeakEwma` owns its
//! `RttEstimate`) sits below its `balance`. Each record's fields are its own, written only
//! through its methods.
//!
//! Sources:
//! [gRFC A51](https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md),
//! [gRFC A58](https://github.com/grpc/proposal/blob/master/A58-client-side-weighted-round-robin-lb-policy.md).

pub(crate) mod channel;
pub(crate) mod latency;
mod learn;
pub(crate) mod report;
pub(crate) mod reported;
pub(crate) mod tie;
pub(crate) mod weight;
pub(crate) mod wire;

pub(crate) use channel::ChannelLoad;
pub(crate) use latency::Latency;
