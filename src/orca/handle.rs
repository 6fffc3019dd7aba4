//! What a server knows of its own load, for its load reports and its answers to probes: the
//! calls in flight, the queries and errors per second, the latency estimate, and the
//! utilizations the application sets. [`OrcaLayer`](super::OrcaLayer) counts the calls through
//! it, [`OobService`](super::OobService) streams its report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::time::Instant;

use super::latency::{bucket, LatencyEstimator};
use super::rate::SlidingRate;
use super::{LoadReport, IN_FLIGHT_METRIC, TRAILER};
use crate::headers::grpc_status;
use crate::instance::events::is_server_fault;
use crate::probe::ProbeAnswer;

/// What a server reports of its load: its calls in flight, its queries and errors per second
/// (both counted by [`OrcaLayer`](super::OrcaLayer)), and the utilizations the application
/// sets. Clones share one state: keep one in the application to set the utilization, give one
/// to the layer.
///
/// ```
/// let handle = tonic_balancer::orca::OrcaHandle::new();
/// handle.set_application_utilization(0.42);
/// let report = handle.report();
/// assert_eq!(report.application_utilization, 0.42);
/// assert_eq!(report.calls_in_flight(), Some(0.0));
/// ```
#[derive(Clone, Debug, Default)]
pub struct OrcaHandle {
    shared: Arc<ServerLoad>,
}

/// The state the clones of one [`OrcaHandle`] share.
#[derive(Debug)]
struct ServerLoad {
    epoch: Instant,
    in_flight: AtomicU64,
    cpu: AtomicU64,
    mem: AtomicU64,
    app: AtomicU64,
    queries: SlidingRate,
    errors: SlidingRate,
    latency: LatencyEstimator,
}

impl Default for ServerLoad {
    fn default() -> ServerLoad {
        ServerLoad {
            epoch: Instant::now(),
            in_flight: AtomicU64::new(0),
            cpu: AtomicU64::new(0),
            mem: AtomicU64::new(0),
            app: AtomicU64::new(0),
            queries: SlidingRate::default(),
            errors: SlidingRate::default(),
            latency: LatencyEstimator::default(),
        }
    }
}

impl ServerLoad {
    /// Nanoseconds since the handle was made, on tokio's clock.
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// Stores a utilization, refusing values that are not finite or below 0 (they are reported
/// as 0).
fn store_utilization(cell: &AtomicU64, v: f64) {
    let v = if v.is_finite() && v > 0.0 { v } else { 0.0 };
    cell.store(v.to_bits(), Ordering::Relaxed);
}

impl OrcaHandle {
    /// A handle with nothing set and no calls.
    pub fn new() -> OrcaHandle {
        OrcaHandle::default()
    }

    /// Sets the CPU utilization reported from now on (a fraction of the CPU available; may
    /// exceed 1). Weighted round robin uses it when no application utilization is set.
    pub fn set_cpu_utilization(&self, v: f64) {
        store_utilization(&self.shared.cpu, v);
    }

    /// Sets the memory utilization reported from now on (a fraction).
    pub fn set_mem_utilization(&self, v: f64) {
        store_utilization(&self.shared.mem, v);
    }

    /// Sets the application utilization reported from now on (for example the higher of CPU
    /// and memory utilization); weighted round robin prefers it to the CPU's.
    pub fn set_application_utilization(&self, v: f64) {
        store_utilization(&self.shared.app, v);
    }

    /// The calls the layer has in flight now.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The answer to a load probe (see [`crate::probe`]) as it would be sent now: the calls in
    /// flight, and the latency estimate at one more than that: a moving average of the latencies
    /// (to the response head) of the calls that arrived with about as many in flight (0, 1, 2,
    /// 3, 4-7, 8-15, 16 and more), or of the nearest such group with a call; calls that failed
    /// at once are left out. One more, because the client that probes is about to send a call,
    /// and others may be too: with the estimate at the current count, an idle instance whose
    /// latency climbs steeply with its load looked as good as any idle one, and the many
    /// clients that probed it sent it calls together.
    ///
    /// ```
    /// let handle = tonic_balancer::orca::OrcaHandle::new();
    /// let answer = handle.probe_answer();
    /// assert_eq!((answer.requests_in_flight, answer.latency), (0, None));
    /// ```
    pub fn probe_answer(&self) -> ProbeAnswer {
        // What one more changed in the many-clients scenario: docs/design.md, "The probe
        // answer's latency at one call more".
        let rif = self.in_flight();
        ProbeAnswer::new(rif, self.shared.latency.estimate(rif + 1))
    }

    /// The report as it would be sent now.
    pub fn report(&self) -> LoadReport {
        let s = &*self.shared;
        let now = s.now_ns();
        let mut r = LoadReport {
            cpu_utilization: f64::from_bits(s.cpu.load(Ordering::Relaxed)),
            mem_utilization: f64::from_bits(s.mem.load(Ordering::Relaxed)),
            rps_fractional: s.queries.per_second(now),
            eps: s.errors.per_second(now),
            application_utilization: f64::from_bits(s.app.load(Ordering::Relaxed)),
            ..LoadReport::default()
        };
        r.named_metrics
            .insert(IN_FLIGHT_METRIC.to_owned(), self.in_flight() as f64);
        r
    }

    /// One call is over: counted in the rates, with its status.
    fn finished(&self, ok: bool) {
        let s = &*self.shared;
        let now = s.now_ns();
        s.queries.add(now);
        if !ok {
            s.errors.add(now);
        }
    }

    /// Ends a call whose status is in `map` (trailers, or a trailers-only head): counts it,
    /// then puts the report in `map` (the call still counted in flight, as the client counts
    /// it).
    fn attach(&self, map: &mut http::HeaderMap) {
        let ok = grpc_status(map).is_some_and(|code| !is_server_fault(code));
        self.finished(ok);
        let bytes = self.report().encode();
        let mut md = tonic::metadata::MetadataMap::from_headers(std::mem::take(map));
        md.insert_bin(
            TRAILER,
            tonic::metadata::BinaryMetadataValue::from_bytes(&bytes),
        );
        *map = md.into_headers();
    }
}

/// One call's place in the server's in-flight count, and when it arrived; dropped when the
/// call is over.
#[derive(Debug)]
pub(super) struct CallInFlight {
    handle: OrcaHandle,
    /// The latency bucket of the calls in flight when it arrived (itself not counted).
    bucket: usize,
    /// When it arrived, on the handle's clock.
    start_ns: u64,
}

impl CallInFlight {
    pub(super) fn new(handle: &OrcaHandle) -> CallInFlight {
        let before = handle.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        CallInFlight {
            handle: handle.clone(),
            bucket: bucket(before),
            start_ns: handle.shared.now_ns(),
        }
    }

    /// Its response head is out, with this status if the head is trailers-only: its latency
    /// counts, unless it is a fault of the server answered at once (a handler that threw, a
    /// refusal) or a call the client ended (CANCELLED, DEADLINE_EXCEEDED): those say nothing of
    /// how long the service takes. An application's answer (NOT_FOUND) is the service's work.
    pub(super) fn head(&self, status: Option<tonic::Code>) {
        let not_service_time = status.is_some_and(|code| {
            is_server_fault(code)
                || matches!(code, tonic::Code::Cancelled | tonic::Code::DeadlineExceeded)
        });
        if not_service_time {
            return;
        }
        let s = &*self.handle.shared;
        s.latency
            .record(self.bucket, s.now_ns().saturating_sub(self.start_ns));
    }

    /// It ended with the status in `map` (trailers, or a trailers-only head): counted, and the
    /// report put in `map` (see [`OrcaHandle::attach`]).
    pub(super) fn attach_report(&self, map: &mut http::HeaderMap) {
        self.handle.attach(map);
    }

    /// It ended without a gRPC status (its body broke, or ended without trailers): counted as
    /// an error.
    pub(super) fn broken(&self) {
        self.handle.finished(false);
    }
}

impl Drop for CallInFlight {
    fn drop(&mut self) {
        self.handle.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The probe's answer: the calls in flight (probes are not calls) and the estimate at that
    /// many.
    #[tokio::test(start_paused = true)]
    async fn probe_answer_counts_calls() {
        let h = OrcaHandle::new();
        let first = CallInFlight::new(&h);
        assert_eq!(first.bucket, 0);
        tokio::time::advance(Duration::from_millis(30)).await;
        first.head(None);
        let second = CallInFlight::new(&h);
        assert_eq!(second.bucket, 1);
        assert_eq!(
            h.probe_answer(),
            ProbeAnswer::new(2, Some(Duration::from_millis(30)))
        );
        // A failure at once is no latency; an application's error is one.
        second.head(Some(tonic::Code::Unavailable));
        assert_eq!(
            h.shared.latency.estimate(1),
            Some(Duration::from_millis(30))
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        second.head(Some(tonic::Code::NotFound));
        assert_eq!(
            h.shared.latency.estimate(1),
            Some(Duration::from_millis(10))
        );
        drop((first, second));
        assert_eq!(h.probe_answer().requests_in_flight, 0);
    }

    /// A utilization that is not a finite value ≥ 0 is reported as 0.
    #[test]
    fn nonsense_utilization_is_zero() {
        let h = OrcaHandle::new();
        h.set_cpu_utilization(f64::NAN);
        h.set_application_utilization(-3.0);
        h.set_mem_utilization(0.5);
        let r = h.report();
        assert_eq!(
            (
                r.cpu_utilization,
                r.application_utilization,
                r.mem_utilization
            ),
            (0.0, 0.0, 0.5)
        );
    }
}
