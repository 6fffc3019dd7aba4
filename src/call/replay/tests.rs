use super::*;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame};
use proptest::prelude::*;
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Poll, Waker};

/// A request body of fixed frames; `Err` items are the caller's errors.
struct Frames(VecDeque<Result<Bytes, tonic::Status>>);

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Poll::Ready(self.0.pop_front().map(|d| d.map(Frame::data)))
    }
}

fn request(frames: &[&'static str]) -> http::Request<Body> {
    let body = Frames(
        frames
            .iter()
            .map(|f| Ok(Bytes::from_static(f.as_bytes())))
            .collect(),
    );
    http::Request::new(Body::new(body))
}

/// Polls one frame: `Some(Ok(data))`, `Some(Err(_))` or `None` at the end.
fn next(body: &mut Body) -> Option<Result<Bytes, tonic::Status>> {
    futures::executor::block_on(std::future::poll_fn(|cx| {
        Pin::new(&mut *body).poll_frame(cx)
    }))
    .map(|r| r.map(|f| f.into_data().unwrap_or_default()))
}

fn read_all(body: &mut Body) -> Vec<Bytes> {
    let mut out = Vec::new();
    while let Some(frame) = next(body) {
        out.push(frame.expect("a frame"));
    }
    out
}

fn copy(replay: &Replay) -> Copied {
    let mut cx = Context::from_waker(Waker::noop());
    replay.copy(None, 0, &mut cx)
}

fn copied(replay: &Replay) -> Body {
    match copy(replay) {
        Copied::Ready(req, _) => req.into_body(),
        _ => panic!("no copy"),
    }
}

#[test]
fn every_attempt_sends_the_body_once_as_the_caller_sent_it() {
    let (req, replay) = Replay::wrap(request(&["a", "b", "c"]), true, 1024);
    let mut first = req.into_body();
    assert_eq!(read_all(&mut first), ["a", "b", "c"]);
    // A policy retry sends the recording; it is not recorded again.
    let mut second = replay.request(None, 0).unwrap().0.into_body();
    assert_eq!(read_all(&mut second), ["a", "b", "c"]);
    // An attempt that never left (dropped unread), then another one.
    drop(replay.request(None, 0).unwrap());
    let mut fourth = replay.request(None, 0).unwrap().0.into_body();
    assert_eq!(read_all(&mut fourth), ["a", "b", "c"]);
}

#[test]
fn an_attempt_given_up_on_cannot_send_the_body_later() {
    let (req, replay) = Replay::wrap(request(&["a"]), false, 1024);
    let mut stale = req.into_body();
    assert!(replay.unsent(0));
    let (next_req, id) = replay.request(None, 0).unwrap();
    let mut next_attempt = next_req.into_body();
    assert!(
        next(&mut stale).unwrap().is_err(),
        "the stale attempt must fail"
    );
    assert!(replay.was_read(0), "the stale attempt was polled");
    assert!(!replay.was_read(id));
    assert_eq!(read_all(&mut next_attempt), ["a"]);
    assert!(replay.was_read(id));
}

#[test]
fn a_partly_sent_body_is_never_sent_again() {
    let (req, replay) = Replay::wrap(request(&["a", "b"]), false, 1024);
    let mut body = req.into_body();
    assert_eq!(next(&mut body).unwrap().unwrap(), "a");
    assert!(!replay.replayable());
    assert!(!replay.unsent(0));
    assert!(replay.request(None, 0).is_none());
    drop(body);
    assert!(replay.instead_of(0, None, 0).is_none());
}

#[test]
fn a_body_never_polled_to_a_result_goes_back_to_the_slot() {
    let (req, replay) = Replay::wrap(request(&["a"]), true, 1024);
    drop(req);
    assert!(replay.unsent(0), "an attempt never polled sent nothing");
    let (again, id) = replay.instead_of(0, None, 0).unwrap();
    assert_eq!(read_all(&mut again.into_body()), ["a"]);
    assert!(replay.was_read(id));
}

/// An empty request stream whose end was polled may have reached the server whole (its
/// END_STREAM went out): not handed back as unsent.
#[test]
fn an_empty_body_polled_to_its_end_was_sent() {
    let (req, replay) = Replay::wrap(request(&[]), false, 1024);
    let mut body = req.into_body();
    assert!(next(&mut body).is_none());
    drop(body);
    assert!(!replay.unsent(0));
    assert!(replay.was_read(0));
}

/// A connection sends the body as `is_end_stream` says: hyper sends a body that says it is over
/// with its head (END_STREAM) and never polls it. Sends `body` so, and says whether it was
/// polled.
fn send_as_hyper_does(body: &mut Body) -> bool {
    if body.is_end_stream() {
        return false;
    }
    read_all(body);
    true
}

/// A copy of an empty recording (a hedge or a retry of a client stream with no message) goes
/// out as the others do, and then counts as sent: were it to say it is over before it is
/// polled, its connection would send it unpolled, and the call would take it for never sent
/// (and could send it again: the server would run it twice).
#[test]
fn a_copy_of_an_empty_body_that_went_out_was_sent() {
    let (req, replay) = Replay::wrap(request(&[]), true, 1024);
    let mut first = req.into_body();
    assert!(send_as_hyper_does(&mut first));
    let Copied::Ready(hedge, id) = copy(&replay) else {
        panic!("an empty recording is whole");
    };
    let mut hedge = hedge.into_body();
    assert!(send_as_hyper_does(&mut hedge), "sent without being polled");
    assert!(
        replay.was_read(id),
        "an empty body that went out reads as never sent"
    );
    assert!(hedge.is_end_stream(), "over once sent");
    let (again, id) = replay.request(None, 0).unwrap();
    let mut again = again.into_body();
    assert!(send_as_hyper_does(&mut again));
    assert!(replay.was_read(id));
}

/// The caller's own body failing (an encoder refusing a message) is the call's answer:
/// the body is not handed back, nothing can be sent again, and the error is kept.
#[test]
fn a_caller_body_error_is_kept_and_nothing_is_sent_again() {
    let body = Frames(
        [
            Ok(Bytes::from_static(b"a")),
            Err(tonic::Status::out_of_range("message too large")),
        ]
        .into_iter()
        .collect(),
    );
    let (req, replay) = Replay::wrap(http::Request::new(Body::new(body)), true, 1024);
    let mut first = req.into_body();
    assert_eq!(next(&mut first).unwrap().unwrap(), "a");
    assert!(next(&mut first).unwrap().is_err());
    drop(first);
    let kept = replay.caller_error().expect("the caller's error kept");
    assert_eq!(kept.code(), tonic::Code::OutOfRange);
    assert!(!replay.replayable());
    assert!(replay.request(None, 0).is_none());
    assert!(replay.instead_of(0, None, 0).is_none());
    assert!(matches!(copy(&replay), Copied::Never));
}

/// An error on the very first poll (nothing yielded) is the caller's too: the body is not
/// handed back to be sent empty.
#[test]
fn a_caller_body_error_on_the_first_poll_is_not_handed_back() {
    let body = Frames(
        [Err(tonic::Status::out_of_range("message too large"))]
            .into_iter()
            .collect(),
    );
    let (req, replay) = Replay::wrap(http::Request::new(Body::new(body)), true, 1024);
    let mut first = req.into_body();
    assert!(next(&mut first).unwrap().is_err());
    drop(first);
    assert!(replay.caller_error().is_some());
    assert!(!replay.unsent(0));
    assert!(replay.instead_of(0, None, 0).is_none());
}

#[test]
fn a_body_larger_than_the_limit_is_not_recorded() {
    let (req, replay) = Replay::wrap(request(&["aaaa", "bbbb"]), true, 6);
    let mut body = req.into_body();
    assert_eq!(read_all(&mut body).len(), 2);
    assert!(!replay.replayable());
}

#[test]
fn recording_stops_once_the_response_has_started() {
    let (req, replay) = Replay::wrap(request(&["a", "b", "c"]), true, 1024);
    let mut body = req.into_body();
    assert_eq!(next(&mut body).unwrap().unwrap(), "a");
    replay.commit();
    assert_eq!(read_all(&mut body), ["b", "c"]);
    let slot = lock(&replay.slot);
    assert!(
        slot.frames.is_empty() && !slot.complete,
        "recorded after the commit"
    );
    drop(slot);
    assert!(replay.request(None, 0).is_none());
}

#[test]
fn a_hedge_sends_the_recording_alongside_the_first_attempt() {
    let (req, replay) = Replay::wrap(request(&["a", "b"]), true, 1024);
    let mut first = req.into_body();
    assert!(matches!(copy(&replay), Copied::Unread), "nothing read yet");
    assert_eq!(next(&mut first).unwrap().unwrap(), "a");
    assert!(
        matches!(copy(&replay), Copied::Later),
        "the recording is not whole yet"
    );
    assert_eq!(read_all(&mut first), ["b"]);
    // Two hedges, each with the whole body; the slot stays the first attempt's.
    let (second_req, second_id) = match copy(&replay) {
        Copied::Ready(req, id) => (req, id),
        _ => panic!("no copy"),
    };
    let mut second = second_req.into_body();
    let mut third = copied(&replay);
    assert!(!replay.was_read(second_id));
    assert_eq!(read_all(&mut third), ["a", "b"]);
    assert_eq!(read_all(&mut second), ["a", "b"]);
    assert!(replay.was_read(second_id), "a copy read is marked");
    // A copy refused by its server is sent again from the recording.
    assert!(replay.instead_of(second_id, None, 0).is_some());
    replay.commit();
    assert!(
        matches!(copy(&replay), Copied::Never),
        "no attempt after the commit"
    );
}

#[test]
fn a_waiting_hedge_is_woken_when_the_recording_is_whole() {
    struct Flag(std::sync::atomic::AtomicBool);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let flag = Arc::new(Flag(Default::default()));
    let waker = Waker::from(flag.clone());
    let (req, replay) = Replay::wrap(request(&["a", "b"]), true, 1024);
    let mut first = req.into_body();
    assert_eq!(next(&mut first).unwrap().unwrap(), "a");
    let mut cx = Context::from_waker(&waker);
    assert!(matches!(replay.copy(None, 0, &mut cx), Copied::Later));
    assert!(!flag.0.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(read_all(&mut first), ["b"]);
    assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
}

#[test]
fn a_body_over_the_limit_is_never_copied() {
    let (req, replay) = Replay::wrap(request(&["aaaa", "bbbb"]), true, 6);
    let mut first = req.into_body();
    assert_eq!(read_all(&mut first).len(), 2);
    assert!(matches!(copy(&replay), Copied::Never));
}

#[test]
fn a_replayed_attempt_carries_the_time_left() {
    let (req, replay) = Replay::wrap(request(&["a"]), false, 1024);
    drop(req);
    let (again, _) = replay.request(Some(Duration::from_millis(250)), 0).unwrap();
    let timeout = again.headers().get("grpc-timeout").unwrap();
    assert_eq!(
        crate::deadline::parse(timeout.as_bytes()),
        Some(Duration::from_millis(250))
    );
}

/// One step of a call's attempts over the slot.
#[derive(Debug, Clone)]
enum Op {
    /// A new attempt that takes the slot over (a retry).
    Request,
    /// A hedge beside the attempts in flight.
    Copy,
    /// An attempt in place of attempt `k`, which the server did not process.
    InsteadOf(usize),
    /// Attempt `k`'s connection polls one frame of its body.
    Poll(usize),
    /// Attempt `k`'s connection reads its body to the end.
    ReadAll(usize),
    /// Attempt `k` is dropped (its request gone, sent or not).
    Drop(usize),
    /// The response started.
    Commit,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Request),
        Just(Op::Copy),
        (0usize..6).prop_map(Op::InsteadOf),
        (0usize..6).prop_map(Op::Poll),
        (0usize..6).prop_map(Op::ReadAll),
        (0usize..6).prop_map(Op::Drop),
        Just(Op::Commit),
    ]
}

/// The caller's body, counting every frame pulled from it.
struct Counted(
    VecDeque<Result<Bytes, tonic::Status>>,
    Arc<std::sync::atomic::AtomicUsize>,
);

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let next = self.0.pop_front();
        if next.is_some() {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Poll::Ready(next.map(|d| d.map(Frame::data)))
    }
}

/// An attempt's body as its connection reads it: the frames so far, and how it ended.
struct Reader {
    body: Option<Body>,
    got: Vec<Bytes>,
    /// `Some(true)`: read to its end; `Some(false)`: ended with an error.
    ended: Option<bool>,
}

impl Reader {
    fn new(req: http::Request<Body>) -> Reader {
        Reader {
            body: Some(req.into_body()),
            got: Vec::new(),
            ended: None,
        }
    }

    fn poll(&mut self) {
        let Some(body) = self.body.as_mut() else {
            return;
        };
        if self.ended.is_some() {
            return;
        }
        match next(body) {
            Some(Ok(data)) => self.got.push(data),
            Some(Err(_)) => self.ended = Some(false),
            None => self.ended = Some(true),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever its attempts do (retries, hedges, replays of unprocessed attempts, drops,
    /// reads, a commit), a request reaches every attempt exactly as the caller sent it: a
    /// body read to its end holds the caller's frames, in order, once; each frame of the
    /// caller's body is pulled from it once at most; and a caller's body that fails sends
    /// nothing whole, anywhere.
    #[test]
    fn every_attempt_sends_the_request_as_the_caller_sent_it(
        frames in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..6), 0..4),
        error_at in proptest::option::of(0usize..4),
        limit in 0usize..30,
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let mut body: VecDeque<Result<Bytes, tonic::Status>> =
            frames.iter().map(|f| Ok(Bytes::from(f.clone()))).collect();
        let fails = error_at.map(|at| at.min(body.len()));
        if let Some(at) = fails {
            body.insert(at, Err(tonic::Status::out_of_range("the caller's own error")));
            body.truncate(at + 1);
        }
        let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (req, replay) = Replay::wrap(
            http::Request::new(Body::new(Counted(body, pulled.clone()))),
            true,
            limit,
        );
        let mut attempts = vec![(Reader::new(req), 0)];
        for op in ops {
            match op {
                Op::Request => {
                    if let Some((req, id)) = replay.request(None, 0) {
                        attempts.push((Reader::new(req), id));
                    }
                }
                Op::Copy => {
                    if let Copied::Ready(req, id) = copy(&replay) {
                        attempts.push((Reader::new(req), id));
                    }
                }
                Op::InsteadOf(k) => {
                    if let Some((_, id)) = attempts.get(k % attempts.len()) {
                        if let Some((req, id)) = replay.instead_of(*id, None, 0) {
                            attempts.push((Reader::new(req), id));
                        }
                    }
                }
                Op::Poll(k) => {
                    let n = attempts.len();
                    attempts[k % n].0.poll();
                }
                Op::ReadAll(k) => {
                    let n = attempts.len();
                    for _ in 0..8 {
                        attempts[k % n].0.poll();
                    }
                }
                Op::Drop(k) => {
                    let n = attempts.len();
                    attempts[k % n].0.body = None;
                }
                Op::Commit => replay.commit(),
            }
        }
        let want: Vec<Bytes> = frames.iter().map(|f| Bytes::from(f.clone())).collect();
        for (r, id) in &attempts {
            if r.ended == Some(true) {
                prop_assert!(fails.is_none(), "attempt {id} sent a request the caller never finished");
                prop_assert_eq!(&r.got, &want, "attempt {}", id);
            }
        }
        let total = frames.len() + usize::from(fails.is_some());
        prop_assert!(pulled.load(std::sync::atomic::Ordering::SeqCst) <= total);
        if fails.is_some() && replay.caller_error().is_some() {
            prop_assert!(replay.request(None, 0).is_none());
            prop_assert!(matches!(copy(&replay), Copied::Never));
        }
    }
}
