//! The server side of out-of-band load reports: `xds.service.orca.v3.OpenRcaService`, a
//! service a tonic server adds next to its own, that streams an [`OrcaHandle`]'s report at the
//! interval each client asks for ([gRFC A51]). Its minimum interval is gRPC's, as in
//! [grpc-go's ORCA service].
//!
//! [gRFC A51]: https://github.com/grpc/proposal/blob/master/A51-custom-backend-metrics.md
//! [grpc-go's ORCA service]: https://github.com/grpc/grpc-go/blob/master/orca/service.go

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::codegen::tokio_stream::Stream;
use tonic::Status;

use super::oob::{ReportRequest, PATH};
use super::{LoadReport, OrcaHandle};
use crate::codec::HandCodec;

/// The shortest interval an [`OobService`] sends reports at unless told otherwise: 30 s, gRPC's
/// default (gRFC A51; grpc-go, grpc-java and gRPC C++ use it).
pub const DEFAULT_MIN_REPORT_INTERVAL: Duration = Duration::from_secs(30);

/// The floor of [`OobService::min_interval`]: a report every few milliseconds would no longer
/// be out of band, and would cost the server a timer and an encoding per client that often.
const FLOOR: Duration = Duration::from_millis(10);

/// Out-of-band load reports for tonic servers (gRFC A51): the ORCA service
/// `xds.service.orca.v3.OpenRcaService`, whose `StreamCoreMetrics` streams the
/// [`OrcaHandle`]'s report (see [`OrcaHandle::report`]) to each client that asks, at the
/// interval the client asks for, never more often than [`min_interval`](Self::min_interval)
/// (30 s by default, as gRPC's). The first report goes out at once.
///
/// Add it to the server next to [`OrcaLayer`](super::OrcaLayer), with the same handle: the
/// layer counts the calls in flight and puts a report on each response, the service sends the
/// same report to clients that have no call in flight (a channel with
/// [`Builder::load_reports_out_of_band`](crate::Builder::load_reports_out_of_band)). The layer
/// does not count the report streams as calls.
///
/// ```no_run
/// # async fn demo(router: tonic::service::Routes) -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tonic_balancer::orca::{OobService, OrcaHandle, OrcaLayer};
///
/// let load = OrcaHandle::new();
/// tonic::transport::Server::builder()
///     .layer(OrcaLayer::new(load.clone()))
///     .add_routes(router)
///     .add_service(OobService::new(load).min_interval(Duration::from_secs(1)))
///     .serve("0.0.0.0:50051".parse()?)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct OobService {
    handle: OrcaHandle,
    min_interval: Duration,
}

impl OobService {
    /// The service, sending the reports of `handle`, at most once per
    /// [`DEFAULT_MIN_REPORT_INTERVAL`] per client.
    pub fn new(handle: OrcaHandle) -> OobService {
        OobService {
            handle,
            min_interval: DEFAULT_MIN_REPORT_INTERVAL,
        }
    }

    /// The shortest interval it sends reports at (default 30 s): a client that asks for less,
    /// or for no interval, gets one report per `min`. Values below 10 ms are taken as 10 ms.
    #[must_use]
    pub fn min_interval(mut self, min: Duration) -> OobService {
        self.min_interval = crate::time::cap(min.max(FLOOR));
        self
    }

    /// The interval a client asking for `asked` gets (at most 30 years, whatever it asks).
    fn interval(&self, asked: Option<Duration>) -> Duration {
        crate::time::cap(asked.map_or(self.min_interval, |d| d.max(self.min_interval)))
    }
}

impl tonic::server::NamedService for OobService {
    const NAME: &'static str = "xds.service.orca.v3.OpenRcaService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<B> tower::Service<http::Request<B>> for OobService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != PATH {
            let answer = Status::unimplemented("no such method of OpenRcaService").into_http();
            return Box::pin(async move { Ok(answer) });
        }
        let svc = Streamer(self.clone());
        Box::pin(async move {
            let mut grpc =
                tonic::server::Grpc::new(HandCodec::<LoadReport, ReportRequest>::default());
            Ok(grpc.server_streaming(svc, req).await)
        })
    }
}

/// `StreamCoreMetrics` itself: a stream of reports for one request.
struct Streamer(OobService);

impl tower::Service<tonic::Request<ReportRequest>> for Streamer {
    type Response = tonic::Response<Reports>;
    type Error = Status;
    type Future = std::future::Ready<Result<Self::Response, Status>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<ReportRequest>) -> Self::Future {
        let every = self.0.interval(req.get_ref().interval);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        std::future::ready(Ok(tonic::Response::new(Reports {
            handle: self.0.handle.clone(),
            tick,
        })))
    }
}

/// The reports of one stream: one per tick, the first at once. Dropped (its timer with it)
/// when the client goes.
struct Reports {
    handle: OrcaHandle,
    tick: tokio::time::Interval,
}

impl Stream for Reports {
    type Item = Result<LoadReport, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.tick.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(self.handle.report()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client gets the interval it asks for, never below the server's minimum; no interval
    /// means the minimum; the minimum has a floor of 10 ms.
    #[test]
    fn interval_respects_the_minimum() {
        let s = OobService::new(OrcaHandle::new());
        assert_eq!(s.interval(None), DEFAULT_MIN_REPORT_INTERVAL);
        assert_eq!(
            s.interval(Some(Duration::from_secs(1))),
            DEFAULT_MIN_REPORT_INTERVAL
        );
        assert_eq!(
            s.interval(Some(Duration::from_secs(60))),
            Duration::from_secs(60)
        );
        let s = s.min_interval(Duration::from_secs(1));
        assert_eq!(
            s.interval(Some(Duration::from_millis(200))),
            Duration::from_secs(1)
        );
        assert_eq!(
            s.interval(Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
        let s = s.min_interval(Duration::ZERO);
        assert_eq!(s.interval(None), FLOOR);
    }
}
