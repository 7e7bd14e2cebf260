//! The agent's HTTP/1.1 client to its engine: keep-alive connections, one exchange at a time on
//! each, kept in a small pool of idle ones. Built on hyper's connection-level client.
//!
//! Why not hyper-util's pooled `Client`: profiled under callgrind (issue 14), its pool hashed
//! its key with SipHash three times per request, spawned a task per request to take the
//! connection back, and moved its large futures around: about 15 % of the agent's instructions
//! per request. The agent talks to one engine at one address; a vector of idle senders does.
//!
//! A connection goes back to the pool only when its response was read to the end
//! ([`Lease::give_back`]). A request abandoned midway (the router's client left, a timeout)
//! drops its lease: hyper closes the connection, which is how engines learn to stop generating.
//!
//! Bounds: at most [`IDLE_MAX`] idle connections (a connection given back beyond that is
//! closed), none reused after [`IDLE_TIMEOUT`] idle (looked at on each checkout), and a
//! connection not ready again within [`READY_WAIT_MAX`] of its response's end is closed.
//!
//! Error handling: a connection that cannot be made is [`SendError::Connect`] (the caller answers
//! 503 `backend_unavailable`); an exchange that fails after it is [`SendError::Failed`] (502). A
//! pooled connection the engine closed while idle hands the request back unsent, and the next
//! connection takes it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

/// Idle connections kept; the router's concurrency to this agent is bounded by `--capacity`, so
/// more would only hold sockets.
pub const IDLE_MAX: usize = 64;
/// An idle connection older than this is closed rather than reused (engines close idle
/// keep-alive connections after a while; the request would race that close).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long a connection whose response was read may take to be ready for another exchange
/// (the request body still being sent, say) before it is closed instead of pooled.
pub const READY_WAIT_MAX: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },
    #[error("{0}")]
    Failed(hyper::Error),
}

/// Keep-alive HTTP/1.1 connections to one `host:port`, sending request bodies of type `B`
/// (the agent's: `forward::TunnelBody`).
pub struct EngineClient<B> {
    target: String,
    connect_timeout: Duration,
    idle: Pool<B>,
}

type Pool<B> = Arc<Mutex<Vec<Idle<B>>>>;

struct Idle<B> {
    sender: SendRequest<B>,
    since: Instant,
}

/// The connection a response came on, until the response was read to the end.
pub struct Lease<B> {
    sender: SendRequest<B>,
    idle: Pool<B>,
}

impl<B> EngineClient<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// `target` is the engine's `host:port`.
    pub fn new(target: String, connect_timeout: Duration) -> EngineClient<B> {
        EngineClient {
            target,
            connect_timeout,
            idle: Arc::default(),
        }
    }

    /// The `host:port` this client dials.
    #[cfg(test)]
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Sends `request` (its URI in origin form, its `host` header set) on an idle connection, or
    /// on a new one.
    pub async fn send(
        &self,
        mut request: Request<B>,
    ) -> Result<(Response<Incoming>, Lease<B>), SendError> {
        while let Some(mut sender) = self.checkout() {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, self.lease(sender))),
                Err(mut failed) => match failed.take_message() {
                    // Not sent: the connection had closed. The next one takes it.
                    Some(unsent) => request = unsent,
                    None => return Err(SendError::Failed(failed.into_error())),
                },
            }
        }
        let mut sender = self.connect().await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(SendError::Failed)?;
        Ok((response, self.lease(sender)))
    }

    fn lease(&self, sender: SendRequest<B>) -> Lease<B> {
        Lease {
            sender,
            idle: self.idle.clone(),
        }
    }

    /// The most recently used idle connection that is still open and fresh.
    fn checkout(&self) -> Option<SendRequest<B>> {
        let mut idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        while let Some(Idle { sender, since }) = idle.pop() {
            if since.elapsed() > IDLE_TIMEOUT {
                // Given back in order: every one left is older still.
                idle.clear();
                return None;
            }
            if sender.is_ready() {
                return Some(sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<B>, SendError> {
        let failed = |reason: String| SendError::Connect {
            target: self.target.clone(),
            reason,
        };
        let stream = tokio::time::timeout(
            self.connect_timeout,
            tokio::net::TcpStream::connect(&self.target),
        )
        .await
        .map_err(|_| failed(format!("timed out after {:?}", self.connect_timeout)))?
        .map_err(|error| failed(error.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Failed)?;
        // Ends when the connection closes: the engine closed it, or its last sender is gone.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }
}

impl<B: Send + 'static> Lease<B> {
    /// The response was read to the end: the connection goes back to the pool once it is ready
    /// for another exchange (at once, usually; else a small task waits for it, at most
    /// [`READY_WAIT_MAX`]).
    pub fn give_back(self) {
        let Lease { mut sender, idle } = self;
        if sender.is_ready() {
            put(&idle, sender);
        } else if !sender.is_closed() {
            tokio::spawn(async move {
                if let Ok(Ok(())) = tokio::time::timeout(READY_WAIT_MAX, sender.ready()).await {
                    put(&idle, sender);
                }
            });
        }
    }
}

fn put<B>(idle: &Mutex<Vec<Idle<B>>>, sender: SendRequest<B>) {
    let mut idle = idle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if idle.len() < IDLE_MAX {
        idle.push(Idle {
            sender,
            since: Instant::now(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::{BodyExt, Empty};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An engine answering every request with `ok`; counts the connections it accepted. With
    /// `close_after_answer`, it closes each connection after its first answer without saying so
    /// (as an engine's idle timeout does).
    async fn engine(close_after_answer: bool) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 4096];
                    let mut held = Vec::new();
                    loop {
                        let Ok(read) = socket.read(&mut buffer).await else {
                            return;
                        };
                        if read == 0 {
                            return;
                        }
                        held.extend_from_slice(&buffer[..read]);
                        while let Some(end) = held.windows(4).position(|w| w == b"\r\n\r\n") {
                            held.drain(..end + 4);
                            let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if socket.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                            if close_after_answer {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (target, accepted)
    }

    /// A client of a fresh [`engine`], and the engine's count of accepted connections.
    async fn client_of_engine(
        close_after_answer: bool,
    ) -> (EngineClient<Empty<Bytes>>, Arc<AtomicUsize>) {
        let (target, accepted) = engine(close_after_answer).await;
        (EngineClient::new(target, Duration::from_secs(1)), accepted)
    }

    fn get() -> Request<Empty<Bytes>> {
        Request::get("/v1/models")
            .header("host", "engine")
            .body(Empty::new())
            .unwrap()
    }

    /// One exchange, its body read to the end; gives the connection back when `give_back`.
    async fn exchange(client: &EngineClient<Empty<Bytes>>, give_back: bool) {
        let (response, lease) = client.send(get()).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "ok");
        if give_back {
            lease.give_back();
        }
        // The connection task notes the exchange's end.
        tokio::task::yield_now().await;
    }

    #[tokio::test]
    async fn a_connection_given_back_serves_the_next_request() {
        let (client, accepted) = client_of_engine(false).await;
        for _ in 0..5 {
            exchange(&client, true).await;
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_lease_not_given_back_takes_its_connection_with_it() {
        let (client, accepted) = client_of_engine(false).await;
        exchange(&client, false).await;
        exchange(&client, true).await;
        exchange(&client, true).await;
        assert_eq!(accepted.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_pooled_connection_the_engine_closed_is_not_used() {
        let (client, accepted) = client_of_engine(true).await;
        for _ in 0..3 {
            exchange(&client, true).await;
            // The engine's close reaches the pooled connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::Relaxed), 3);
    }

    #[tokio::test]
    async fn at_most_idle_max_connections_are_kept() {
        let (client, _) = client_of_engine(false).await;
        let mut leases = Vec::new();
        for _ in 0..IDLE_MAX + 3 {
            let (response, lease) = client.send(get()).await.unwrap();
            response.into_body().collect().await.unwrap();
            leases.push(lease);
        }
        tokio::task::yield_now().await;
        for lease in leases {
            lease.give_back();
        }
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!(client.idle.lock().unwrap().len(), IDLE_MAX);
    }

    #[tokio::test]
    async fn the_wait_for_a_connection_to_be_ready_again_is_bounded() {
        use http_body_util::StreamBody;
        // The engine answers at once; the request body never ends, so the connection never
        // becomes ready for another exchange.
        let (target, _) = engine(false).await;
        let client = EngineClient::new(target, Duration::from_secs(1));
        let endless = StreamBody::new(futures_util::stream::pending::<
            Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
        >());
        let request = Request::post("/v1/chat/completions")
            .header("host", "engine")
            .body(endless)
            .unwrap();
        let (response, lease) = client.send(request).await.unwrap();
        response.into_body().collect().await.unwrap();
        let tasks = || {
            tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks()
        };
        let before = tasks();
        lease.give_back();
        assert_eq!(tasks(), before + 1, "a task waits for the connection");
        tokio::time::sleep(READY_WAIT_MAX + Duration::from_millis(500)).await;
        assert_eq!(tasks(), before, "the waiting task gave up");
        assert!(client.idle.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let client = EngineClient::<Empty<Bytes>>::new(closed.to_string(), Duration::from_secs(1));
        assert!(matches!(
            client.send(get()).await,
            Err(SendError::Connect { .. })
        ));
    }
}
