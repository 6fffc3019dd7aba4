//! The server side: a tower layer for tonic servers that attaches a load report to every
//! response.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;

use http_body::{Body as HttpBody, Frame, SizeHint};

use super::{LoadReport, IN_FLIGHT_METRIC, TRAILER};
use crate::headers::grpc_status;
use crate::instance::events::{classify_status, Outcome};

/// What a server reports of its load: its calls in flight, its queries and errors per second
/// (both counted by [`OrcaLayer`]), and the utilizations the application sets. Clones share
/// one state: keep one in the application to set the utilization, give one to the layer.
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
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    epoch: Instant,
    in_flight: AtomicU64,
    cpu: AtomicU64,
    mem: AtomicU64,
    app: AtomicU64,
    queries: Rate,
    errors: Rate,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            epoch: Instant::now(),
            in_flight: AtomicU64::new(0),
            cpu: AtomicU64::new(0),
            mem: AtomicU64::new(0),
            app: AtomicU64::new(0),
            queries: Rate::default(),
            errors: Rate::default(),
        }
    }
}

/// Events per second over a sliding second: the count of the current second plus the
/// previous second's count for the part of it still inside the window.
#[derive(Debug, Default)]
struct Rate {
    second: AtomicU64,
    current: AtomicU64,
    previous: AtomicU64,
}

impl Rate {
    fn roll(&self, now_ns: u64) {
        let sec = now_ns / 1_000_000_000;
        let at = self.second.load(Ordering::Acquire);
        if at >= sec {
            return;
        }
        if self
            .second
            .compare_exchange(at, sec, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let last = self.current.swap(0, Ordering::AcqRel);
            let prev = if sec == at + 1 { last } else { 0 };
            self.previous.store(prev, Ordering::Release);
        }
    }

    fn add(&self, now_ns: u64) {
        self.roll(now_ns);
        self.current.fetch_add(1, Ordering::AcqRel);
    }

    fn per_second(&self, now_ns: u64) -> f64 {
        self.roll(now_ns);
        let into = (now_ns % 1_000_000_000) as f64 * 1e-9;
        self.previous.load(Ordering::Acquire) as f64 * (1.0 - into)
            + self.current.load(Ordering::Acquire) as f64
    }
}

/// Stores a utilization, refusing values that are not finite or below 0 (they are reported
/// as 0).
fn store(cell: &AtomicU64, v: f64) {
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
        store(&self.shared.cpu, v);
    }

    /// Sets the memory utilization reported from now on (a fraction).
    pub fn set_mem_utilization(&self, v: f64) {
        store(&self.shared.mem, v);
    }

    /// Sets the application utilization reported from now on (for example the higher of CPU
    /// and memory utilization); weighted round robin prefers it to the CPU's.
    pub fn set_application_utilization(&self, v: f64) {
        store(&self.shared.app, v);
    }

    /// The calls the layer has in flight now.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The report as it would be sent now.
    pub fn report(&self) -> LoadReport {
        let s = &*self.shared;
        let now = s.epoch.elapsed().as_nanos() as u64;
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
        let now = s.epoch.elapsed().as_nanos() as u64;
        s.queries.add(now);
        if !ok {
            s.errors.add(now);
        }
    }

    /// Ends a call whose status is in `map` (trailers, or a trailers-only head): counts it,
    /// then puts the report in `map` (the call still counted in flight, as the client counts
    /// it).
    fn attach(&self, map: &mut http::HeaderMap) {
        let ok = classify_status(grpc_status(map)) != Outcome::Failure;
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

/// Holds one call's place in the server's in-flight count.
#[derive(Debug)]
struct InFlight(OrcaHandle);

impl InFlight {
    fn new(handle: &OrcaHandle) -> InFlight {
        handle.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(handle.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A [`tower::Layer`] for tonic servers that puts a load report ([`TRAILER`]) in the
/// trailers of every response (or in the head of a trailers-only one): the server's calls in
/// flight (the named metric [`IN_FLIGHT_METRIC`]), its queries and errors per second over the
/// last second (an error: UNAVAILABLE, RESOURCE_EXHAUSTED, or an answer without a gRPC status),
/// and the utilizations set through the [`OrcaHandle`]. Out-of-band report streams
/// ([`OobService`](super::OobService)) pass through it uncounted.
///
/// ```no_run
/// # async fn demo(router: tonic::service::Routes) -> Result<(), Box<dyn std::error::Error>> {
/// use tonic_balancer::orca::{OrcaHandle, OrcaLayer};
///
/// let load = OrcaHandle::new();
/// tonic::transport::Server::builder()
///     .layer(OrcaLayer::new(load.clone()))
///     .add_routes(router)
///     .serve("0.0.0.0:50051".parse()?)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct OrcaLayer {
    handle: OrcaHandle,
}

impl OrcaLayer {
    /// A layer that reports through this handle.
    pub fn new(handle: OrcaHandle) -> OrcaLayer {
        OrcaLayer { handle }
    }
}

impl<S> tower::Layer<S> for OrcaLayer {
    type Service = OrcaService<S>;

    fn layer(&self, inner: S) -> OrcaService<S> {
        OrcaService {
            inner,
            handle: self.handle.clone(),
        }
    }
}

/// The service [`OrcaLayer`] makes.
#[derive(Clone, Debug)]
pub struct OrcaService<S> {
    inner: S,
    handle: OrcaHandle,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for OrcaService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    ResBody: HttpBody,
{
    type Response = http::Response<OrcaBody<ResBody>>;
    type Error = S::Error;
    type Future = OrcaFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        // An out-of-band report stream is no call: not counted, and no report of its own.
        let call = (req.uri().path() != super::oob::PATH).then(|| InFlight::new(&self.handle));
        OrcaFuture {
            inner: self.inner.call(req),
            call,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`OrcaService`].
    #[derive(Debug)]
    pub struct OrcaFuture<F> {
        #[pin]
        inner: F,
        call: Option<InFlight>,
    }
}

impl<F, B, E> Future for OrcaFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    B: HttpBody,
{
    type Output = Result<http::Response<OrcaBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut resp = match this.inner.poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => {
                this.call.take();
                return Poll::Ready(Err(e));
            }
            Poll::Ready(Ok(resp)) => resp,
        };
        let call = this.call.take();
        let call = if grpc_status(resp.headers()).is_some() {
            // Trailers-only: the call is over with this head.
            if let Some(c) = &call {
                c.0.attach(resp.headers_mut());
            }
            None
        } else {
            call
        };
        Poll::Ready(Ok(resp.map(|inner| OrcaBody { inner, call })))
    }
}

pin_project_lite::pin_project! {
    /// The response body of [`OrcaService`]: the inner body, with the report added to its
    /// trailers.
    #[derive(Debug)]
    pub struct OrcaBody<B> {
        #[pin]
        inner: B,
        call: Option<InFlight>,
    }
}

impl<B: HttpBody> HttpBody for OrcaBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(trailers) = frame.trailers_mut() {
                    if let Some(call) = this.call.take() {
                        call.0.attach(trailers);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(call) = this.call.take() {
                    call.0.finished(false);
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                // Ended without trailers: not a gRPC answer.
                if let Some(call) = this.call.take() {
                    call.0.finished(false);
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rate over a sliding second: the current second's events plus the part of the
    /// previous second's still in the window; a gap of more than a second forgets them.
    #[test]
    fn rate_slides() {
        let r = Rate::default();
        let s = 1_000_000_000u64;
        for _ in 0..10 {
            r.add(5 * s + 100);
        }
        assert_eq!(r.per_second(5 * s + 500_000_000), 10.0);
        r.add(6 * s);
        // Half of the previous second's 10, plus 1.
        assert!((r.per_second(6 * s + 500_000_000) - 6.0).abs() < 1e-6);
        assert_eq!(r.per_second(9 * s), 0.0);
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
