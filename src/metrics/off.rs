//! Without the `metrics` feature: nothing is recorded, and nothing costs anything.

use std::sync::Arc;

use crate::instance::Instance;
use crate::set::Set;

/// Without the feature, there are no labels to keep.
#[derive(Debug, Clone, Default)]
pub(crate) struct Labels;

/// Without the feature, no method is pinned.
pub(crate) fn unmatched_methods(_: &Labels) -> Vec<String> {
    Vec::new()
}

#[inline(always)]
pub(crate) fn budget_exhausted(_: &Labels) {}
#[inline(always)]
pub(crate) fn ejection(_: &Labels, _: &Instance, _: &'static str, _: bool) {}
pub(crate) fn outlier_detected(_: &Labels, _: &Instance, _: &'static str) {}
#[inline(always)]
pub(crate) fn discovery_answer(_: &Labels, _: bool) {}
#[inline(always)]
pub(crate) fn membership(_: &Labels, _: usize, _: usize) {}
#[inline(always)]
pub(crate) fn connection_succeeded(_: &Labels, _: &Instance) {}
#[inline(always)]
pub(crate) fn connection_failed(_: &Labels, _: &Instance) {}
#[inline(always)]
pub(crate) fn disconnected(_: &Labels, _: &Instance, _: &(dyn std::error::Error + 'static)) {}
#[inline(always)]
pub(crate) fn spawn<T: AsRef<Set> + Send + Sync + 'static>(_: &Arc<T>, _: &Labels) {}
#[cfg(feature = "xds")]
#[inline(always)]
pub(crate) fn xds_connected(_: &str, _: bool) {}
#[cfg(feature = "xds")]
#[inline(always)]
pub(crate) fn xds_server_failure(_: &str) {}
#[cfg(feature = "xds")]
#[inline(always)]
pub(crate) fn xds_updates(_: &str, _: &str, _: u64, _: u64) {}
#[cfg(feature = "xds")]
#[inline(always)]
pub(crate) fn xds_resources(_: &str, _: &'static str, _: f64) {}
