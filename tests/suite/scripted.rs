//! Servers whose answers the test scripts call by call, across instances: the n-th call that
//! reaches any of them gets the n-th answer of the script (a status with its metadata, as a
//! trailers-only response; or the fleet's own answer), and each call's request head is kept.
//! For what the fleet's behaviours do not say: a pushback on the second attempt only, what the
//! headers of each attempt were.
use fleet_service as fleet;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use fleet::{Behavior, Faulted};
use tonic::body::Body;
use tonic::Status;

/// The script that the instances share: the answers to come, and the requests seen.
#[derive(Default)]
pub struct Script {
    /// The next calls' answers, in order: a status, or `None` for the fleet's own answer.
    answers: Mutex<VecDeque<Option<Status>>>,
    /// The head of every call that reached an instance, in order.
    seen: Mutex<Vec<http::HeaderMap>>,
}

impl Script {
    /// A script whose calls get `answers` in order, then the fleet's own answer.
    pub fn new(answers: impl IntoIterator<Item = Option<Status>>) -> Arc<Script> {
        Arc::new(Script {
            answers: Mutex::new(answers.into_iter().collect()),
            seen: Mutex::default(),
        })
    }

    /// The calls that reached an instance.
    pub fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The value of header `name` on each call, in order (`None` where it was absent).
    pub fn header(&self, name: &str) -> Vec<Option<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|h| h.get(name).map(|v| v.to_str().unwrap().to_owned()))
            .collect()
    }
}

/// A status with one metadata entry (a trailers-only answer's header), such as a pushback.
#[cfg_attr(not(feature = "service-config"), allow(dead_code))]
pub fn status_with(status: Status, key: &'static str, value: &str) -> Status {
    let mut status = status;
    status.metadata_mut().insert(key, value.parse().unwrap());
    status
}

/// The fleet's service behind the script.
#[derive(Clone)]
struct Scripted {
    inner: Faulted,
    script: Arc<Script>,
}

impl tonic::server::NamedService for Scripted {
    const NAME: &'static str = <Faulted as tonic::server::NamedService>::NAME;
}

impl tower::Service<http::Request<Body>> for Scripted {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        self.script.seen.lock().unwrap().push(req.headers().clone());
        let answer = self.script.answers.lock().unwrap().pop_front().flatten();
        match answer {
            Some(status) => {
                // The whole request first, as a server's handler reads it: so that the client
                // has sent it whole, and kept it for another attempt.
                let mut body = req.into_body();
                Box::pin(async move {
                    use http_body::Body as _;
                    let mut body = Pin::new(&mut body);
                    while let Some(Ok(_)) =
                        std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await
                    {
                    }
                    Ok(status.into_http())
                })
            }
            None => self.inner.call(req),
        }
    }
}

/// `n` instances on 127.0.0.1 (`s0`, `s1`, ...) that answer as `script` says, then as the
/// fleet's service does with `Behavior::Ok`.
pub fn start(n: usize, script: &Arc<Script>) -> Vec<fleet::fleet::Instance> {
    (0..n)
        .map(|i| {
            let name = format!("s{i}");
            let shared = fleet::Shared::new(&name, Behavior::Ok);
            let service = Scripted {
                inner: fleet::service(shared),
                script: script.clone(),
            };
            fleet::fleet::Instance::start(name, service)
        })
        .collect()
}
