//! The server-side layer: [`OrcaLayer`] counts a tonic server's calls through an
//! [`OrcaHandle`], puts a load report in every response's trailers (the per-call reports of
//! [gRFC A51]), and hands load probes to `probe_server`.
//!
//! [gRFC A51]: https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::handle::CallInFlight;
use super::probe_server::{PendingProbe, ProbeResponseBody};
use super::OrcaHandle;
use crate::headers::grpc_status;
use crate::probe;

/// A [`tower::Layer`] for tonic servers that puts a load report
/// ([`TRAILER`](super::TRAILER)) in the trailers of every response (or in the head of a
/// trailers-only one): the server's calls in flight (the named metric
/// [`IN_FLIGHT_METRIC`](super::IN_FLIGHT_METRIC)), its queries and errors per second over the
/// last second (an error: UNAVAILABLE, RESOURCE_EXHAUSTED, or an answer without a gRPC status),
/// and the utilizations set through the [`OrcaHandle`]. Out-of-band report streams
/// ([`OobService`](super::OobService)) pass through it uncounted.
///
/// It also answers load probes ([`crate::probe`], the method [`probe::PATH`]) itself, without
/// passing them to the service it wraps and without counting them as calls: with the calls in
/// flight and a latency estimate ([`OrcaHandle::probe_answer`], which says how the estimate is
/// made). The answer is a plain gRPC response (status OK in the trailers), made once the
/// probe's request has been read; a malformed request is answered with INTERNAL.
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
            return OrcaFuture {
                inner: None,
                call: None,
                probe: Some(PendingProbe::new(self.handle.clone(), req.into_body())),
            };
        }
        // An out-of-band report stream is no call: not counted, and no report of its own.
        let call = (path != super::oob::PATH).then(|| CallInFlight::new(&self.handle));
        OrcaFuture {
            inner: Some(self.inner.call(req)),
            call,
            probe: None,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`OrcaService`].
    #[derive(Debug)]
    pub struct OrcaFuture<F> {
        // The inner service's response; none for a probe, which is answered here.
        #[pin]
        inner: Option<F>,
        call: Option<CallInFlight>,
        probe: Option<PendingProbe>,
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
            let read = ready!(probe.poll_read(cx));
            let probe = this.probe.take().expect("just seen");
            return Poll::Ready(Ok(probe.respond(read).map(OrcaBody::answer)));
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
                c.attach_report(resp.headers_mut());
            }
            None
        } else {
            call
        };
        Poll::Ready(Ok(resp.map(|inner| OrcaBody {
            inner: Some(inner),
            call,
            answer: ProbeResponseBody::default(),
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
        call: Option<CallInFlight>,
        answer: ProbeResponseBody,
    }
}

impl<B> OrcaBody<B> {
    fn answer(answer: ProbeResponseBody) -> OrcaBody<B> {
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
            return Poll::Ready(this.answer.next_frame().map(Ok));
        };
        match inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(mut frame))) => {
                if let Some(trailers) = frame.trailers_mut() {
                    if let Some(call) = this.call.take() {
                        call.attach_report(trailers);
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(call) = this.call.take() {
                    call.broken();
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                // Ended without trailers: not a gRPC answer.
                if let Some(call) = this.call.take() {
                    call.broken();
                }
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(inner) => inner.is_end_stream(),
            None => self.answer.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(inner) => inner.size_hint(),
            None => self.answer.size_hint(),
        }
    }
}
