//! The crate's own decoder and encoder of ORCA load reports, checked against prost's encoding
//! of the published message (`xds.data.orca.v3.OrcaLoadReport`, field numbers from cncf/xds).

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use prost::Message;
use tonic_balancer::orca::LoadReport;

/// The published message, derived by prost (the reference encoding).
#[derive(Clone, PartialEq, prost::Message)]
struct OrcaLoadReport {
    #[prost(double, tag = "1")]
    cpu_utilization: f64,
    #[prost(double, tag = "2")]
    mem_utilization: f64,
    #[prost(uint64, tag = "3")]
    rps: u64,
    #[prost(map = "string, double", tag = "4")]
    request_cost: HashMap<String, f64>,
    #[prost(map = "string, double", tag = "5")]
    utilization: HashMap<String, f64>,
    #[prost(double, tag = "6")]
    rps_fractional: f64,
    #[prost(double, tag = "7")]
    eps: f64,
    #[prost(map = "string, double", tag = "8")]
    named_metrics: HashMap<String, f64>,
    #[prost(double, tag = "9")]
    application_utilization: f64,
}

/// A map's values as bits: a damaged report can hold a NaN, which equals nothing as a float.
fn bits<'a>(m: impl IntoIterator<Item = (&'a String, &'a f64)>) -> BTreeMap<String, u64> {
    m.into_iter()
        .map(|(k, v)| (k.clone(), same_bits(*v)))
        .collect()
}

/// -0.0 as 0.0 (protobuf does not write a field at its default), any NaN as one NaN.
fn same_bits(v: f64) -> u64 {
    if v == 0.0 {
        0
    } else if v.is_nan() {
        f64::NAN.to_bits()
    } else {
        v.to_bits()
    }
}

/// Whether our report holds what prost's does (`rps`, deprecated, is not kept; -0.0 is 0.0,
/// as in protobuf, which does not write a field at its default; a NaN, which a damaged report
/// can hold, is the same NaN).
fn same(ours: &LoadReport, theirs: &OrcaLoadReport) -> bool {
    let f = |a: f64, b: f64| same_bits(a) == same_bits(b);
    f(ours.cpu_utilization, theirs.cpu_utilization)
        && f(ours.mem_utilization, theirs.mem_utilization)
        && f(ours.rps_fractional, theirs.rps_fractional)
        && f(ours.eps, theirs.eps)
        && f(ours.application_utilization, theirs.application_utilization)
        && bits(&ours.request_cost) == bits(&theirs.request_cost)
        && bits(&ours.utilization) == bits(&theirs.utilization)
        && bits(&ours.named_metrics) == bits(&theirs.named_metrics)
}

fn arb_value() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        0.0f64..2.0,
        any::<f64>().prop_filter("finite", |v| v.is_finite())
    ]
}

fn arb_map() -> impl Strategy<Value = HashMap<String, f64>> {
    prop::collection::hash_map("\\PC{0,12}", arb_value(), 0..4)
}

prop_compose! {
    fn arb_report()(
        cpu in arb_value(), mem in arb_value(), rps in any::<u64>(),
        request_cost in arb_map(), utilization in arb_map(),
        rps_fractional in arb_value(), eps in arb_value(),
        named_metrics in arb_map(), app in arb_value(),
    ) -> OrcaLoadReport {
        OrcaLoadReport {
            cpu_utilization: cpu, mem_utilization: mem, rps, request_cost, utilization,
            rps_fractional, eps, named_metrics, application_utilization: app,
        }
    }
}

proptest! {
    /// Whatever prost encodes, we decode to the same report.
    #[test]
    fn decodes_what_prost_encodes(report in arb_report()) {
        let bytes = report.encode_to_vec();
        let ours = LoadReport::decode(&bytes).expect("a well-formed report");
        prop_assert!(same(&ours, &report), "{:?} vs {:?}", ours, report);
    }

    /// What we encode, prost decodes to the same report (and we decode it back).
    #[test]
    fn prost_decodes_what_we_encode(report in arb_report()) {
        let bytes = report.encode_to_vec();
        let ours = LoadReport::decode(&bytes).unwrap();
        let again = ours.encode();
        let theirs = OrcaLoadReport::decode(&again[..]).expect("prost accepts our encoding");
        prop_assert!(same(&ours, &theirs));
        prop_assert_eq!(LoadReport::decode(&again), Some(ours));
    }

    /// Arbitrary bytes never panic the decoder, and whatever it accepts prost accepts too,
    /// with the same content.
    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Some(ours) = LoadReport::decode(&bytes) {
            let theirs = OrcaLoadReport::decode(&bytes[..]);
            prop_assert!(theirs.is_ok(), "we accept what prost refuses: {:x?}", bytes);
            prop_assert!(same(&ours, &theirs.unwrap()));
        }
    }

    /// A valid report with garbage appended or a byte flipped: no panic; if it still decodes,
    /// prost agrees.
    #[test]
    fn damaged_reports_never_panic(report in arb_report(), at: prop::sample::Index, byte: u8,
                                   tail in prop::collection::vec(any::<u8>(), 0..16)) {
        let mut bytes = report.encode_to_vec();
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        bytes.extend(tail);
        if let Some(ours) = LoadReport::decode(&bytes) {
            let theirs = OrcaLoadReport::decode(&bytes[..]);
            prop_assert!(theirs.is_ok(), "we accept what prost refuses: {:x?}", bytes);
            let theirs = theirs.unwrap();
            prop_assert!(same(&ours, &theirs), "{:x?}: {:?} vs {:?}", bytes, ours, theirs);
        }
    }
}
