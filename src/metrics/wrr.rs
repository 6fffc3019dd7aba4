//! Weighted round robin's instruments (gRFC A78), recorded at each of its schedule updates.
//!
//! Sources:
//! [gRFC A78](https://github.com/grpc/proposal/blob/master/A78-grpc-metrics-wrr-pf-xds.md).

use metrics::{Label, SharedString};

use super::names::*;
use crate::pick::wrr::{Observe, Update};
use crate::pick::Picker;

/// Records A78's instruments for the channel of `picker`, labelled with its `target`.
pub(super) fn attach(picker: &Picker, target: SharedString) {
    picker.wrr.observe(Box::new(WrrMetrics { target }));
}

struct WrrMetrics {
    target: SharedString,
}

impl Observe for WrrMetrics {
    /// As A78 has it: at every update, the instances without a usable weight yet and those
    /// whose weight is stale are counted, the update itself if it fell back to round robin,
    /// and each instance's weight (0 without a usable one) goes into the histogram. The
    /// counters are touched at every update, so that they show (at 0) from the first one.
    fn update(&self, update: &Update<'_>) {
        let labels = [Label::new(LABEL_TARGET, self.target.clone())];
        metrics::counter!(WRR_RR_FALLBACK, labels.iter()).increment(u64::from(update.round_robin));
        metrics::counter!(WRR_ENDPOINT_WEIGHT_NOT_YET_USABLE, labels.iter())
            .increment(update.not_yet_usable as u64);
        metrics::counter!(WRR_ENDPOINT_WEIGHT_STALE, labels.iter()).increment(update.stale as u64);
        let weights = metrics::histogram!(WRR_ENDPOINT_WEIGHTS, labels.iter());
        for &w in update.weights {
            weights.record(w);
        }
    }
}
