//! A raw HTTP/2 server (h2, not tonic) that refuses streams unprocessed (RST_STREAM
//! REFUSED_STREAM, or a GOAWAY that names none of them) by a rule of the test's, and answers the
//! others as a gRPC server answers `Unary` (a `Reply` naming it "refusing", grpc-status 0). It
//! runs on the test's runtime.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Which streams it refuses.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// The first this many streams it is sent, over all its connections (`usize::MAX`: every
    /// one).
    First(usize),
    /// As a server whose count of a connection's streams lags behind its client's (gRPC's
    /// C-core counts a stream until it is closed on both sides): it announces `limit`
    /// concurrent streams per connection, counts each stream for `linger` after its answer
    /// went out, and refuses a stream that arrives while `limit` are counted. Each answer
    /// takes `service`.
    Lagging {
        limit: u32,
        linger: Duration,
        service: Duration,
    },
    /// Its first `connections` connections are closed at once with a GOAWAY of this reason
    /// whose last stream id is 0: no stream on them was processed, as when a server closes a
    /// connection it will not serve (grpc-go and grpc-java send ENHANCE_YOUR_CALM,
    /// `too_many_pings`, to a client that pings more often than their keepalive policy
    /// allows). Later connections are served.
    GoAway {
        reason: h2::Reason,
        connections: usize,
    },
}

pub struct Refusing {
    pub addr: std::net::SocketAddr,
    /// Streams opened by clients, refused or not.
    pub streams: Arc<AtomicUsize>,
    pub refused: Arc<AtomicUsize>,
    /// TCP connections open now.
    pub open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// Counts a connection open while it lives.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Refusing {
    pub async fn start(rule: Rule) -> Refusing {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let streams = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (s, r, o) = (streams.clone(), refused.clone(), open.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            let mut nth = 0;
            while let Ok((io, _)) = listener.accept().await {
                let _ = io.set_nodelay(true);
                o.fetch_add(1, Ordering::SeqCst);
                let open = Open(o.clone());
                match rule {
                    Rule::GoAway {
                        reason,
                        connections,
                    } if nth < connections => {
                        conns.spawn(Self::go_away(io, reason, open));
                    }
                    _ => {
                        conns.spawn(Self::serve(io, rule, s.clone(), r.clone(), open));
                    }
                }
                nth += 1;
            }
        });
        Refusing {
            addr,
            streams,
            refused,
            open,
            task,
        }
    }

    /// Closes the connection with a GOAWAY of `reason` before processing any stream. The
    /// socket lingers: it reads what the client sent until the client closes it, so that the
    /// client reads the GOAWAY before the connection ends (a socket closed with unread data
    /// sends a TCP reset, which may reach the client before the GOAWAY does, and that is a
    /// broken connection, not a GOAWAY).
    async fn go_away(io: tokio::net::TcpStream, reason: h2::Reason, _open: Open) {
        let Ok(mut conn) = h2::server::handshake(Linger(Some(io))).await else {
            return;
        };
        // No stream processed yet: the GOAWAY's last stream id is 0.
        conn.abrupt_shutdown(reason);
        // Drives the connection until it closes; h2 ignores the streams that come after its
        // GOAWAY, so none is accepted here.
        while let Some(Ok(_)) = conn.accept().await {}
    }

    async fn serve(
        io: tokio::net::TcpStream,
        rule: Rule,
        streams: Arc<AtomicUsize>,
        refused: Arc<AtomicUsize>,
        _open: Open,
    ) {
        let mut builder = h2::server::Builder::new();
        if let Rule::Lagging { limit, .. } = rule {
            builder.max_concurrent_streams(limit);
        }
        let Ok(mut conn) = builder.handshake::<_, bytes::Bytes>(io).await else {
            return;
        };
        // The streams this connection counts (a lagging count).
        let counted = Arc::new(AtomicUsize::new(0));
        let mut answers = tokio::task::JoinSet::new();
        while let Some(Ok((req, mut respond))) = conn.accept().await {
            let nth = streams.fetch_add(1, Ordering::SeqCst);
            let (refuse, service, linger) = match rule {
                Rule::First(n) => (nth < n, Duration::ZERO, Duration::ZERO),
                Rule::GoAway { .. } => (false, Duration::ZERO, Duration::ZERO),
                Rule::Lagging {
                    limit,
                    linger,
                    service,
                } => (
                    counted.load(Ordering::SeqCst) >= limit as usize,
                    service,
                    linger,
                ),
            };
            if refuse {
                refused.fetch_add(1, Ordering::SeqCst);
                respond.send_reset(h2::Reason::REFUSED_STREAM);
                continue;
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let counted = counted.clone();
            answers.spawn(async move {
                let mut body = req.into_body();
                while let Some(Ok(chunk)) = body.data().await {
                    let _ = body.flow_control().release_capacity(chunk.len());
                }
                if !service.is_zero() {
                    tokio::time::sleep(service).await;
                }
                answer(respond);
                if !linger.is_zero() {
                    tokio::time::sleep(linger).await;
                }
                counted.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }

    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// A connection's socket that, when dropped, is kept open for reading until its peer closes
/// it (or 10 s pass): the peer reads all that was written before the connection ends.
struct Linger(Option<tokio::net::TcpStream>);

impl Drop for Linger {
    fn drop(&mut self) {
        let Some(mut io) = self.0.take() else { return };
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            let drained = async {
                use tokio::io::AsyncReadExt;
                while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
            };
            let _ = tokio::time::timeout(Duration::from_secs(10), drained).await;
        });
    }
}

impl tokio::io::AsyncRead for Linger {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let io = self.0.as_mut().expect("open until dropped");
        std::pin::Pin::new(io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Linger {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let io = self.0.as_mut().expect("open until dropped");
        std::pin::Pin::new(io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let io = self.0.as_mut().expect("open until dropped");
        std::pin::Pin::new(io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let io = self.0.as_mut().expect("open until dropped");
        std::pin::Pin::new(io).poll_shutdown(cx)
    }
}

/// Answers as a gRPC server answers `Unary`: one `Reply`, then grpc-status 0.
fn answer(mut respond: h2::server::SendResponse<bytes::Bytes>) {
    let head = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    let msg = prost::Message::encode_to_vec(&super::pb::Reply {
        instance: "refusing".into(),
        ..Default::default()
    });
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let _ = send.send_data(frame.into(), false);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let _ = send.send_trailers(trailers);
}

impl Drop for Refusing {
    fn drop(&mut self) {
        self.task.abort();
    }
}
