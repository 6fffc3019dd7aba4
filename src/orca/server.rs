//! The server side: a tower layer for tonic servers that attaches a load report to every
//! response, and answers load probes (`crate::probe`).
//!
//! # The latency estimate of a probe's answer
//!
//! A probe asks what a call received now would take. The layer keeps, for each bucket of the
//! calls in flight when a call arrived (0, 1, 2, 3, 4-7, 8-15, 16 and more, the call itself not
//! counted), a moving average of the calls' latencies: each new latency moves the bucket's
//! average an eighth of the way towards it (the first sets it), so that the estimate follows a
//! change within twenty calls or so and one outlier moves it little. A probe is answered with
//! the average of the bucket of the calls in flight now (the bucket a call received now would
//! count in); if that bucket has no call yet, the nearest bucket with one (the higher of two
//! at the same distance: the estimate errs on the slow side); none at all, no estimate.
//!
//! A call's latency runs from its request reaching the layer to its response head leaving the
//! inner service. For a unary call (tonic sends the head with the message) that is the whole
//! call; for a stream it is the time to its start, so a long-lived stream does not count as a
//! slow call. Calls answered at once with a failure (UNAVAILABLE, RESOURCE_EXHAUSTED, or
//! CANCELLED, DEADLINE_EXCEEDED in a trailers-only head) are left out: a server shedding load
//! fast would otherwise look fast. Out-of-band report streams and probes are not calls.
//!
//! The cost on the call path: one read of the clock when a call arrives and one when its head
//! returns, one atomic update of the bucket's average; no lock.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::Status;

use super::{LoadReport, IN_FLIGHT_METRIC, TRAILER};
use crate::headers::{grpc_status, GRPC_STATUS};
use crate::instance::events::is_server_fault;
use crate::probe::{self, ProbeAnswer};

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
    latency: Latency,
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
            latency: Latency::default(),
        }
    }
}

impl Shared {
    /// Nanoseconds since the handle was made, on tokio's clock.
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// The buckets of calls in flight the latency is kept by: 0, 1, 2, 3, 4-7, 8-15, 16+.
const BUCKETS: usize = 7;

/// The bucket of `rif` calls in flight.
fn bucket(rif: u64) -> usize {
    match rif {
        0..=3 => rif as usize,
        4..=7 => 4,
        8..=15 => 5,
        _ => 6,
    }
}

/// The latency of calls by the calls in flight when they arrived: per bucket, a moving average
/// in nanoseconds (0: no call yet). See the module's documentation.
#[derive(Debug, Default)]
struct Latency {
    average_ns: [AtomicU64; BUCKETS],
}

impl Latency {
    /// A call that arrived in `bucket` took `ns`.
    fn record(&self, bucket: usize, ns: u64) {
        // At least 1 ns, so that a bucket with a call is never taken for one without.
        let sample = ns.max(1);
        let _ = self.average_ns[bucket].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |avg| {
            Some(if avg == 0 {
                sample
            } else {
                // An eighth of the way from the average to the sample.
                let moved = i128::from(avg) + (i128::from(sample) - i128::from(avg)) / 8;
                moved.max(1) as u64
            })
        });
    }

    /// The latency of a call arriving with `rif` calls in flight: its bucket's average, or the
    /// nearest bucket's with one (the higher at equal distance); `None` if no bucket has any.
    fn estimate(&self, rif: u64) -> Option<Duration> {
        let at = bucket(rif);
        (0..BUCKETS)
            .flat_map(|d| [at.checked_add(d), at.checked_sub(d)])
            .flatten()
            .filter(|&b| b < BUCKETS)
            .map(|b| self.average_ns[b].load(Ordering::Relaxed))
            .find(|&ns| ns != 0)
            .map(Duration::from_nanos)
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

    /// The answer to a load probe (see [`crate::probe`]) as it would be sent now: the calls in
    /// flight, and the latency estimate at one more than that (see the module's documentation: a
    /// moving average of the latencies of the calls that arrived with about as many in flight).
    /// One more, because the client that probes is about to send a call, and others may be
    /// too: with the estimate at the current count, an idle instance whose latency climbs
    /// steeply with its load looked as good as any idle one, and 50 clients that probed it
    /// sent it calls together (the many-clients overload case: 7-9% of the calls to the
    /// overloaded instances; with one more, none).
    ///
    /// ```
    /// let handle = tonic_balancer::orca::OrcaHandle::new();
    /// let answer = handle.probe_answer();
    /// assert_eq!((answer.requests_in_flight, answer.latency), (0, None));
    /// ```
    pub fn probe_answer(&self) -> ProbeAnswer {
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

/// Holds one call's place in the server's in-flight count, and when it arrived.
#[derive(Debug)]
struct InFlight {
    handle: OrcaHandle,
    /// The latency bucket of the calls in flight when it arrived (itself not counted).
    bucket: usize,
    /// When it arrived, on the handle's clock.
    start_ns: u64,
}

impl InFlight {
    fn new(handle: &OrcaHandle) -> InFlight {
        let before = handle.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            handle: handle.clone(),
            bucket: bucket(before),
            start_ns: handle.shared.now_ns(),
        }
    }

    /// Its response head is out, with this status if the head is trailers-only: its latency
    /// counts, unless it is a fault of the server answered at once (a handler that threw, a
    /// refusal) or a call the client ended (CANCELLED, DEADLINE_EXCEEDED): those say nothing of
    /// how long the service takes. An application's answer (NOT_FOUND) is the service's work.
    fn head(&self, status: Option<tonic::Code>) {
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
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.handle.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A [`tower::Layer`] for tonic servers that puts a load report ([`TRAILER`]) in the
/// trailers of every response (or in the head of a trailers-only one): the server's calls in
/// flight (the named metric [`IN_FLIGHT_METRIC`]), its queries and errors per second over the
/// last second (an error: UNAVAILABLE, RESOURCE_EXHAUSTED, or an answer without a gRPC status),
/// and the utilizations set through the [`OrcaHandle`]. Out-of-band report streams
/// ([`OobService`](super::OobService)) pass through it uncounted.
///
/// It also answers load probes ([`crate::probe`], the method [`probe::PATH`]) itself, without
/// passing them to the service it wraps and without counting them as calls: with the calls in
/// flight and a latency estimate ([`OrcaHandle::probe_answer`]; the module's documentation
/// says how the estimate is made). The answer is a plain gRPC response (status OK in the
/// trailers), made once the probe's request has been read; a malformed request is answered
/// with INTERNAL.
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
    ReqBody: HttpBody + Send + 'static,
    ResBody: HttpBody,
    ResBody::Data: From<Bytes>,
{
    type Response = http::Response<OrcaBody<ResBody>>;
    type Error = S::Error;
    type Future = OrcaFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        let path = req.uri().path();
        if path == probe::PATH {
            // Answered here, once its request is read: not a call.
            let read: ReadRequest = Box::pin(read_request(req.into_body()));
            return OrcaFuture {
                inner: None,
                call: None,
                probe: Some(Probe {
                    handle: self.handle.clone(),
                    read,
                }),
            };
        }
        // An out-of-band report stream is no call: not counted, and no report of its own.
        let call = (path != super::oob::PATH).then(|| InFlight::new(&self.handle));
        OrcaFuture {
            inner: Some(self.inner.call(req)),
            call,
            probe: None,
        }
    }
}

/// The largest probe request read (the message has no field yet; a later one will be small):
/// larger is answered with RESOURCE_EXHAUSTED.
const MAX_PROBE_REQUEST: usize = 16 * 1024;

/// Reading a probe's request: whether it was one well-formed `ProbeRequest`, and if not, the
/// status to answer with.
type ReadRequest = Pin<Box<dyn Future<Output = Result<(), Status>> + Send>>;

/// Reads a probe's request body to its end and checks it.
async fn read_request<B: HttpBody + Send + 'static>(body: B) -> Result<(), Status> {
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let Some(frame) = frame else { break };
        let Ok(mut data) = frame
            .map_err(|_| Status::cancelled("the probe's request broke off"))?
            .into_data()
        else {
            continue;
        };
        if bytes.len() + data.remaining() > MAX_PROBE_REQUEST {
            return Err(Status::resource_exhausted("probe request too large"));
        }
        while data.has_remaining() {
            let chunk = data.chunk();
            bytes.extend_from_slice(chunk);
            let n = chunk.len();
            data.advance(n);
        }
    }
    check_request(&bytes)
}

/// Checks a unary gRPC request body: exactly one message (a flag byte, its length in four
/// bytes big-endian, the message), uncompressed, a well-formed `ProbeRequest`.
fn check_request(body: &[u8]) -> Result<(), Status> {
    let (head, message) = body
        .split_at_checked(5)
        .ok_or_else(|| Status::internal("the probe request has no message"))?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    match head[0] {
        0 => {}
        // gRPC's rule for a compression the server does not support.
        1 => {
            return Err(Status::unimplemented(
                "compressed probe requests are not supported",
            ))
        }
        _ => return Err(Status::internal("malformed gRPC message frame")),
    }
    if message.len() != len {
        return Err(Status::internal(if message.len() < len {
            "the probe request's message is cut short"
        } else {
            "more than one message in a unary probe request"
        }));
    }
    if !probe::is_request(message) {
        return Err(Status::internal("malformed ProbeRequest"));
    }
    Ok(())
}

/// A probe being answered: its request is being read.
struct Probe {
    handle: OrcaHandle,
    read: ReadRequest,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe").finish_non_exhaustive()
    }
}

impl Probe {
    /// The response to the probe, its request read with this result: the answer as of now in
    /// one gRPC message, then the trailers of status OK; or a trailers-only response with the
    /// status the request deserves.
    fn respond<B>(self, read: Result<(), Status>) -> http::Response<OrcaBody<B>> {
        if let Err(status) = read {
            let (head, ()) = status.into_http::<()>().into_parts();
            return http::Response::from_parts(head, OrcaBody::answer(Answer::default()));
        }
        let message = self.handle.probe_answer().encode();
        let mut frame = Vec::with_capacity(5 + message.len());
        frame.push(0);
        frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
        frame.extend_from_slice(&message);
        let mut trailers = http::HeaderMap::with_capacity(1);
        trailers.insert(GRPC_STATUS.clone(), http::HeaderValue::from_static("0"));
        let mut resp = http::Response::new(OrcaBody::answer(Answer {
            data: Some(Bytes::from(frame)),
            trailers: Some(trailers),
        }));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        resp
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`OrcaService`].
    #[derive(Debug)]
    pub struct OrcaFuture<F> {
        // The inner service's response; none for a probe, which is answered here.
        #[pin]
        inner: Option<F>,
        call: Option<InFlight>,
        probe: Option<Probe>,
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
        let Some(inner) = this.inner.as_pin_mut() else {
            let probe = this
                .probe
                .as_mut()
                .expect("OrcaFuture polled after it completed");
            let read = ready!(probe.read.as_mut().poll(cx));
            let probe = this.probe.take().expect("just seen");
            return Poll::Ready(Ok(probe.respond(read)));
        };
        let mut resp = match inner.poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => {
                this.call.take();
                return Poll::Ready(Err(e));
            }
            Poll::Ready(Ok(resp)) => resp,
        };
        let call = this.call.take();
        let status = grpc_status(resp.headers());
        if let Some(c) = &call {
            c.head(status);
        }
        let call = if status.is_some() {
            // Trailers-only: the call is over with this head.
            if let Some(c) = &call {
                c.handle.attach(resp.headers_mut());
            }
            None
        } else {
            call
        };
        Poll::Ready(Ok(resp.map(|inner| OrcaBody {
            inner: Some(inner),
            call,
            answer: Answer::default(),
        })))
    }
}

pin_project_lite::pin_project! {
    /// The response body of [`OrcaService`]: the inner body, with the report added to its
    /// trailers; or the answer to a probe.
    #[derive(Debug)]
    pub struct OrcaBody<B> {
        // The inner service's body; none for the answer to a probe.
        #[pin]
        inner: Option<B>,
        call: Option<InFlight>,
        answer: Answer,
    }
}

/// What is left to send of the answer to a probe.
#[derive(Debug, Default)]
struct Answer {
    data: Option<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl<B> OrcaBody<B> {
    fn answer(answer: Answer) -> OrcaBody<B> {
        OrcaBody {
            inner: None,
            call: None,
            answer,
        }
    }
}

impl<B> HttpBody for OrcaBody<B>
where
    B: HttpBody,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let Some(inner) = this.inner.as_pin_mut() else {
            let answer = this.answer;
            let frame = match (answer.data.take(), answer.trailers.take()) {
                (Some(data), trailers) => {
                    answer.trailers = trailers;
                    Frame::data(B::Data::from(data))
                }
                (None, Some(trailers)) => Frame::trailers(trailers),
                (None, None) => return Poll::Ready(None),
            };
            return Poll::Ready(Some(Ok(frame)));
        };
        match inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(trailers) = frame.trailers_mut() {
                    if let Some(call) = this.call.take() {
                        call.handle.attach(trailers);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(call) = this.call.take() {
                    call.handle.finished(false);
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                // Ended without trailers: not a gRPC answer.
                if let Some(call) = this.call.take() {
                    call.handle.finished(false);
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(inner) => inner.is_end_stream(),
            None => self.answer.data.is_none() && self.answer.trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) => inner.size_hint(),
            None => SizeHint::with_exact(self.answer.data.as_ref().map_or(0, |d| d.len() as u64)),
        }
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

    /// The buckets: 0, 1, 2, 3, 4-7, 8-15, 16 and more.
    #[test]
    fn buckets_of_calls_in_flight() {
        let at: Vec<usize> = [0, 1, 2, 3, 4, 7, 8, 15, 16, 1_000, u64::MAX]
            .into_iter()
            .map(bucket)
            .collect();
        assert_eq!(at, [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6]);
    }

    /// The first latency sets a bucket's average, each later one moves it an eighth of the way;
    /// 0 ns still counts as a call.
    #[test]
    fn latency_moving_average() {
        let l = Latency::default();
        assert_eq!(l.estimate(0), None);
        l.record(0, 80_000);
        assert_eq!(l.estimate(0), Some(Duration::from_micros(80)));
        l.record(0, 160_000);
        assert_eq!(l.estimate(0), Some(Duration::from_micros(90)));
        l.record(0, 10_000);
        assert_eq!(l.estimate(0), Some(Duration::from_micros(80)));
        l.record(6, 0);
        assert_eq!(l.estimate(100), Some(Duration::from_nanos(1)));
        l.record(3, u64::MAX);
        l.record(3, u64::MAX);
        assert_eq!(l.estimate(3), Some(Duration::from_nanos(u64::MAX)));
    }

    /// With no call in its bucket, the estimate is the nearest bucket's, the higher of two at
    /// the same distance.
    #[test]
    fn latency_falls_back_to_the_nearest_bucket() {
        let l = Latency::default();
        l.record(1, 1_000);
        for rif in [0, 1, 2, 3, 5, 9, 40] {
            assert_eq!(l.estimate(rif), Some(Duration::from_nanos(1_000)), "{rif}");
        }
        l.record(5, 5_000);
        let at = |rif| l.estimate(rif).map(|d| d.as_nanos());
        assert_eq!(at(0), Some(1_000));
        assert_eq!(at(2), Some(1_000));
        // Bucket 3: buckets 1 and 5 both two away; the higher wins.
        assert_eq!(at(3), Some(5_000));
        assert_eq!(at(4), Some(5_000));
        assert_eq!(at(20), Some(5_000));
    }

    /// The probe's answer: the calls in flight (probes are not calls) and the estimate at that
    /// many.
    #[tokio::test(start_paused = true)]
    async fn probe_answer_counts_calls() {
        let h = OrcaHandle::new();
        let first = InFlight::new(&h);
        assert_eq!(first.bucket, 0);
        tokio::time::advance(Duration::from_millis(30)).await;
        first.head(None);
        let second = InFlight::new(&h);
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

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut b = vec![flag];
        b.extend((message.len() as u32).to_be_bytes());
        b.extend(message);
        b
    }

    /// A probe request must be one uncompressed, well-formed `ProbeRequest` (fields unknown to
    /// the server skipped).
    #[test]
    fn probe_request_checks() {
        let code = |b: &[u8]| check_request(b).map_err(|s| s.code());
        assert_eq!(code(&framed(0, &[])), Ok(()));
        assert_eq!(code(&framed(0, &[0x08, 1, 0x12, 1, b'x'])), Ok(()));
        let mut two = framed(0, &[]);
        two.extend(framed(0, &[]));
        let cases: [(&[u8], tonic::Code); 7] = [
            (&[], tonic::Code::Internal),
            (&[0, 0, 0, 0], tonic::Code::Internal),
            (&[0, 0, 0, 0, 2], tonic::Code::Internal),
            (&two, tonic::Code::Internal),
            (&framed(0, &[0x08]), tonic::Code::Internal),
            (&framed(1, &[]), tonic::Code::Unimplemented),
            (&framed(2, &[]), tonic::Code::Internal),
        ];
        for (bytes, expected) in cases {
            assert_eq!(code(bytes), Err(expected), "{bytes:x?}");
        }
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
