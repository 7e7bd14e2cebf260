//! Proves that the real `hivenet-agent` binary retries a refused authentication, registers and
//! heartbeats over the gRPC control session, dials the tunnel with its session token, serves a
//! request the router sends over the HTTP/2 tunnel by forwarding it to the backend, reports engine
//! metrics in routing signals, drops the backend response when the router resets a stream
//! mid-response, closes its tunnel and reconnects when the router ends the session, and exits
//! cleanly on SIGTERM.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::Stream;
use hivenet_router::base::credentials::Secret;
use hivenet_router::net::tunnel::preamble;
use hivenet_router::wire::proto::agent_control_server::{AgentControl, AgentControlServer};
use hivenet_router::wire::proto::agent_message::Kind as AgentKind;
use hivenet_router::wire::proto::router_message::Kind as RouterKind;
use hivenet_router::wire::proto::{
    AgentMessage, AuthRequest, AuthResponse, ChallengeRequest, ChallengeResponse, Heartbeat,
    Register, RouterMessage, RoutingSignal,
};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

const SECRET: &str = "agent-tunnel-test-secret";
/// The token of the first accepted authentication; call `n` gets `session-token-{n}`.
const SESSION_TOKEN: &str = "session-token-1";
const MODEL: &str = "test-model";
const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"pong"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
const METRICS: &str = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"test-model\"} 2.0\nvllm:num_requests_waiting{model_name=\"test-model\"} 1.0\nvllm:kv_cache_usage_perc{model_name=\"test-model\"} 0.5\n";
const WAIT: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// The backend: a tiny OpenAI-ish engine.

#[derive(Debug)]
enum BackendEvent {
    Completion { host: String, body: Bytes },
    StreamDropped,
}

/// Sends `StreamDropped` when the streaming response body is dropped, i.e. when hyper gave up on
/// the connection because the agent closed it.
struct DropNotice(mpsc::UnboundedSender<BackendEvent>);

impl Drop for DropNotice {
    fn drop(&mut self) {
        let _ = self.0.send(BackendEvent::StreamDropped);
    }
}

type Body = BoxBody<Bytes, Infallible>;

async fn backend_route(
    request: hyper::Request<Incoming>,
    events: mpsc::UnboundedSender<BackendEvent>,
) -> Result<hyper::Response<Body>, Infallible> {
    let full = |status: u16, text: &'static str| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(text.as_bytes())).boxed())
            .unwrap()
    };
    let response = match request.uri().path() {
        "/health" => full(200, "{}"),
        "/v1/models" => full(
            200,
            r#"{"object":"list","data":[{"id":"test-model","object":"model","owned_by":"test"}]}"#,
        ),
        "/metrics" => full(200, METRICS),
        "/v1/chat/completions" => {
            let host = request
                .headers()
                .get("host")
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let _ = events.send(BackendEvent::Completion { host, body });
            full(200, COMPLETION)
        }
        path @ ("/v1/stream" | "/v1/stall") => {
            // Like an engine generating: a chunk every 50 ms until nobody reads. `/v1/stall`
            // sends two chunks then goes silent (a long prefill), so only the agent noticing the
            // router's reset can end it.
            let stall = path == "/v1/stall";
            let notice = DropNotice(events.clone());
            let ticks =
                futures_util::stream::unfold((notice, 0u32), move |(notice, sent)| async move {
                    if stall && sent >= 2 {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let frame: Result<Frame<Bytes>, Infallible> =
                        Ok(Frame::data(Bytes::from_static(b"data: tick\n\n")));
                    Some((frame, (notice, sent + 1)))
                });
            hyper::Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(StreamBody::new(ticks).boxed())
                .unwrap()
        }
        _ => full(404, r#"{"error":"not found"}"#),
    };
    Ok(response)
}

async fn start_backend() -> (SocketAddr, mpsc::UnboundedReceiver<BackendEvent>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (events, from_backend) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let events = events.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| backend_route(request, events.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    });
    (addr, from_backend)
}

// ---------------------------------------------------------------------------------------------
// The router's control plane: a fixed AgentControl.

#[derive(Debug)]
// A test's channel of a few messages: unboxed, so the tests can match on the message directly.
#[allow(clippy::large_enum_variant)]
enum ControlEvent {
    Auth { peer_id: String, accepted: bool },
    SessionOpened { authorization: String },
    Message(AgentMessage),
}

struct Control {
    secret: Secret,
    tunnel_port: u16,
    auth_calls: AtomicU32,
    session_ttl_ms: u64,
    to_test: mpsc::UnboundedSender<ControlEvent>,
    /// Bumping the generation ends every open session from the router side.
    end_sessions: watch::Receiver<u32>,
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<RouterMessage, tonic::Status>> + Send>>;

const ROUTER_PEER_ID: &str = "12D3KooWtestrouter";

#[tonic::async_trait]
impl AgentControl for Control {
    async fn challenge(
        &self,
        request: tonic::Request<ChallengeRequest>,
    ) -> Result<tonic::Response<ChallengeResponse>, tonic::Status> {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let (router_nonce, proof) =
            self.secret
                .proof_key()
                .answer(ROUTER_PEER_ID, &request.get_ref().agent_nonce, now_ms);
        Ok(tonic::Response::new(ChallengeResponse {
            router_peer_id: ROUTER_PEER_ID.to_owned(),
            router_nonce: router_nonce.to_vec(),
            proof: proof.to_vec(),
        }))
    }

    async fn authenticate(
        &self,
        request: tonic::Request<AuthRequest>,
    ) -> Result<tonic::Response<AuthResponse>, tonic::Status> {
        let request = request.into_inner();
        let claims = self.secret.verify_auth(
            &request.token,
            ROUTER_PEER_ID,
            &request.router_nonce,
            std::time::SystemTime::now(),
            std::time::Duration::from_secs(60),
        );
        // The first call is refused to prove the agent retries.
        let call = self.auth_calls.fetch_add(1, Ordering::SeqCst);
        let first = call == 0;
        let accepted = !first && claims.is_ok_and(|claims| claims.sub == request.peer_id);
        let _ = self.to_test.send(ControlEvent::Auth {
            peer_id: request.peer_id.clone(),
            accepted,
        });
        if !accepted {
            return Err(tonic::Status::unauthenticated("test refuses this token"));
        }
        Ok(tonic::Response::new(AuthResponse {
            session_token: format!("session-token-{call}"),
            session_ttl_ms: self.session_ttl_ms,
            router_peer_id: ROUTER_PEER_ID.to_owned(),
            tunnel_addrs: vec![
                "/ip4/127.0.0.1/udp/1/quic-v1".to_owned(),
                format!("/ip4/127.0.0.1/tcp/{}", self.tunnel_port),
            ],
            shard_count: 1,
            heartbeat_interval_ms: 5_000,
            routing_signal_interval_ms: 0,
            ..Default::default()
        }))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: tonic::Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<SessionStream>, tonic::Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let _ = self
            .to_test
            .send(ControlEvent::SessionOpened { authorization });
        let mut inbound = request.into_inner();
        let (to_agent, outbound) = mpsc::channel::<Result<RouterMessage, tonic::Status>>(4);
        let to_test = self.to_test.clone();
        let mut end_sessions = self.end_sessions.clone();
        end_sessions.borrow_and_update();
        tokio::spawn(async move {
            // The reader owns `to_agent`: the response stream stays open as long as the agent's.
            let registered = RouterMessage {
                kind: Some(RouterKind::Registered(
                    hivenet_router::wire::proto::Registered {
                        agent_id: "agent-1".to_owned(),
                    },
                )),
            };
            let _ = to_agent.send(Ok(registered)).await;
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(message)) => {
                            let _ = to_test.send(ControlEvent::Message(message));
                        }
                        _ => break,
                    },
                    _ = end_sessions.changed() => break,
                }
            }
            // Ends the response stream: the agent sees the router close the session.
            drop(to_agent);
        });
        let outbound = futures_util::stream::unfold(outbound, |mut outbound| async move {
            outbound.recv().await.map(|message| (message, outbound))
        });
        Ok(tonic::Response::new(Box::pin(outbound)))
    }
}

// ---------------------------------------------------------------------------------------------
// The agent process.

struct AgentProcess(std::process::Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Harness {
    agent: AgentProcess,
    end_sessions: watch::Sender<u32>,
    _identity_dir: TempDir,
    from_control: mpsc::UnboundedReceiver<ControlEvent>,
    from_backend: mpsc::UnboundedReceiver<BackendEvent>,
    tunnel: TcpListener,
    backend_addr: SocketAddr,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start(test_name: &str) -> Harness {
    start_with_ttl(test_name, 600_000).await
}

async fn start_with_ttl(test_name: &str, session_ttl_ms: u64) -> Harness {
    let (backend_addr, from_backend) = start_backend().await;
    let tunnel = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (to_test, from_control) = mpsc::unbounded_channel();
    let (end_sessions, end_sessions_rx) = watch::channel(0u32);
    let control = Control {
        end_sessions: end_sessions_rx,
        secret: Secret::new(SECRET.as_bytes()).unwrap(),
        tunnel_port: tunnel.local_addr().unwrap().port(),
        auth_calls: AtomicU32::new(0),
        session_ttl_ms,
        to_test,
    };
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let incoming = futures_util::stream::unfold(grpc, |grpc| async move {
        let accepted = grpc.accept().await.map(|(socket, _)| socket);
        Some((accepted, grpc))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(AgentControlServer::new(control))
            .serve_with_incoming(incoming),
    );

    let identity_dir = std::env::temp_dir().join(format!(
        "hivenet-agent-tunnel-{test_name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&identity_dir);
    let verbose = std::env::var_os("HIVENET_TEST_VERBOSE").is_some();
    let child = Command::new(env!("CARGO_BIN_EXE_hivenet-agent"))
        .args(["--engine", "vllm"])
        .args(["--backend-url", &format!("http://{backend_addr}")])
        .args(["--router-grpc", &grpc_addr.to_string()])
        .args([
            "--identity-path",
            identity_dir.join("agent.key").to_str().unwrap(),
        ])
        .args(["--capacity", "3"])
        .args(["--tags", "gpu, fast"])
        .args(["--region", "test-region"])
        .args(["--version", "1.2.3"])
        .args(["--deployment-id", "dep-1"])
        .args(["--replica-id", "rep-1"])
        .args(["--heartbeat-interval", "200ms"])
        .args(["--routing-signal-interval", "100ms"])
        .args(["--engine-sample-interval", "100ms"])
        .env("HIVENET_ROUTER_JWT_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdout(if verbose {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .stderr(if verbose {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .expect("hivenet-agent starts");
    Harness {
        agent: AgentProcess(child),
        end_sessions,
        _identity_dir: TempDir(identity_dir),
        from_control,
        from_backend,
        tunnel,
        backend_addr,
    }
}

impl Harness {
    async fn next_control(&mut self) -> ControlEvent {
        tokio::time::timeout(WAIT, self.from_control.recv())
            .await
            .expect("control event in time")
            .expect("control server alive")
    }

    async fn next_backend(&mut self) -> BackendEvent {
        tokio::time::timeout(WAIT, self.from_backend.recv())
            .await
            .expect("backend event in time")
            .expect("backend alive")
    }

    /// Waits for the refused then accepted authentication, the session and the registration.
    async fn expect_registration(&mut self) -> Register {
        let ControlEvent::Auth { accepted, peer_id } = self.next_control().await else {
            panic!("expected the first authentication");
        };
        assert!(!accepted);
        assert!(
            peer_id.starts_with("12D3KooW"),
            "libp2p peer id, got {peer_id}"
        );
        let ControlEvent::Auth { accepted, .. } = self.next_control().await else {
            panic!("expected the retried authentication");
        };
        assert!(accepted, "the retried authentication carries a valid JWT");
        let ControlEvent::SessionOpened { authorization } = self.next_control().await else {
            panic!("expected the session to open");
        };
        assert_eq!(authorization, format!("Bearer {SESSION_TOKEN}"));
        match self.next_control().await {
            ControlEvent::Message(AgentMessage {
                kind: Some(AgentKind::Register(register)),
            }) => register,
            other => panic!("first session message must be Register, got {other:?}"),
        }
    }

    /// The next heartbeat, skipping routing signals.
    async fn next_heartbeat(&mut self) -> Heartbeat {
        loop {
            if let ControlEvent::Message(AgentMessage {
                kind: Some(AgentKind::Heartbeat(heartbeat)),
            }) = self.next_control().await
            {
                return heartbeat;
            }
        }
    }

    /// The next routing signal that matches, skipping the rest.
    async fn signal_where(&mut self, wanted: impl Fn(&RoutingSignal) -> bool) -> RoutingSignal {
        loop {
            if let ControlEvent::Message(AgentMessage {
                kind: Some(AgentKind::Signal(signal)),
            }) = self.next_control().await
                && wanted(&signal)
            {
                return signal;
            }
        }
    }

    /// Accepts the agent's tunnel connection as a router of the previous release would and
    /// becomes its HTTP/2 client.
    async fn accept_tunnel(&mut self) -> h2::client::SendRequest<Bytes> {
        self.accept_tunnel_with_connection(SESSION_TOKEN).await.0
    }

    /// Like `accept_tunnel`, also returning the task driving the HTTP/2 connection, which ends
    /// when the agent closes the socket.
    async fn accept_tunnel_with_connection(
        &mut self,
        expected_token: &str,
    ) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
        // This router predates the lean tunnel: it refuses the agent's first offer as malformed
        // and speaks HTTP/2 on the agent's second dial, as a router of the previous release.
        let (mut socket, _) = tokio::time::timeout(WAIT, self.tunnel.accept())
            .await
            .expect("agent dials the tunnel")
            .unwrap();
        let mut head = [0u8; 8];
        socket.read_exact(&mut head).await.unwrap();
        assert_eq!(
            &head[..4],
            b"HNT2",
            "the agent offers the lean tunnel first"
        );
        socket
            .write_all(&[preamble::Status::Malformed as u8])
            .await
            .unwrap();
        drop(socket);
        let (mut socket, _) = tokio::time::timeout(WAIT, self.tunnel.accept())
            .await
            .expect("agent dials the tunnel again")
            .unwrap();
        socket.read_exact(&mut head).await.unwrap();
        let (codec, shard, token_len) = preamble::decode_head(&head).expect("valid preamble");
        assert_eq!(codec, preamble::Codec::Http2, "then HTTP/2, at once");
        let mut token = vec![0u8; token_len];
        socket.read_exact(&mut token).await.unwrap();
        assert_eq!(shard, 0);
        assert_eq!(preamble::decode_token(token).unwrap(), expected_token);
        socket
            .write_all(&[preamble::Status::Accepted as u8])
            .await
            .unwrap();
        let (send_request, connection) = h2::client::handshake(socket).await.unwrap();
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        (send_request, driver)
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_registers_heartbeats_and_serves_a_completion_through_the_tunnel() {
    let mut harness = start("completion").await;
    let register = harness.expect_registration().await;
    assert_eq!(register.models, vec![MODEL]);
    assert_eq!(register.capability, "llm");
    assert_eq!(register.capacity, 3);
    assert_eq!(register.engine, "vllm");
    assert_eq!(register.tags, vec!["gpu", "fast"]);
    assert_eq!(register.region, "test-region");
    assert_eq!(register.version, "1.2.3");
    assert_eq!(register.deployment_id, "dep-1");
    assert_eq!(register.replica_id, "rep-1");

    // --heartbeat-interval 200ms overrides the router's 5 s.
    let first = harness.next_heartbeat().await;
    let second = harness.next_heartbeat().await;
    assert!(second.sent_at_unix_ms >= first.sent_at_unix_ms);
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(now_ms.abs_diff(second.sent_at_unix_ms) < 60_000);
    assert_eq!(second.in_flight, 0);

    // Engine metrics from /metrics reach the routing signals.
    let signal = harness
        .signal_where(|signal| signal.has_engine_metrics)
        .await;
    assert_eq!(signal.running_requests, 2);
    assert_eq!(signal.waiting_requests, 1);
    assert_eq!(signal.kv_cache_utilization, 0.5);

    let mut router = harness.accept_tunnel().await;
    let request_body = format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"ping"}}],"max_tokens":1}}"#
    );
    let request = http::Request::builder()
        .method("POST")
        .uri("http://router.internal/v1/chat/completions")
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    router = router.ready().await.unwrap();
    let (response, mut send) = router.send_request(request, false).unwrap();
    send.send_data(Bytes::from(request_body.clone()), true)
        .unwrap();
    let response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let mut body = response.into_body();
    let mut received = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    assert_eq!(String::from_utf8(received).unwrap(), COMPLETION);

    let BackendEvent::Completion { host, body } = harness.next_backend().await else {
        panic!("expected the completion to reach the backend");
    };
    assert_eq!(host, harness.backend_addr.to_string(), "host is rewritten");
    assert_eq!(body, request_body.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_reset_mid_stream_drops_the_backend_response() {
    reset_mid_stream_drops_the_backend_response("/v1/stream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_reset_while_the_backend_is_silent_drops_the_backend_response() {
    reset_mid_stream_drops_the_backend_response("/v1/stall").await;
}

async fn reset_mid_stream_drops_the_backend_response(path: &str) {
    let mut harness = start(&path.replace('/', "-")).await;
    harness.expect_registration().await;
    let router = harness.accept_tunnel().await;
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://router.internal{path}"))
        .body(())
        .unwrap();
    let mut router = router.ready().await.unwrap();
    let (response, mut send) = router.send_request(request, true).unwrap();
    let response = tokio::time::timeout(WAIT, response).await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    for _ in 0..2 {
        let chunk = tokio::time::timeout(WAIT, body.data())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(&chunk[..], b"data: tick\n\n");
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    harness.signal_where(|signal| signal.in_flight == 1).await;

    // The client went away: the router resets the stream mid-response.
    send.send_reset(h2::Reason::CANCEL);
    assert!(matches!(
        harness.next_backend().await,
        BackendEvent::StreamDropped
    ));
    harness.signal_where(|signal| signal.in_flight == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_end_closes_the_tunnel_then_the_agent_reconnects_and_exits_on_sigterm() {
    let mut harness = start("reconnect").await;
    harness.expect_registration().await;
    let (_router, tunnel) = harness.accept_tunnel_with_connection(SESSION_TOKEN).await;

    // The router ends the session: the agent must close this router's tunnel...
    harness
        .end_sessions
        .send_modify(|generation| *generation += 1);
    tokio::time::timeout(WAIT, tunnel)
        .await
        .expect("the agent closes the tunnel when its session ends")
        .unwrap();

    // ...then authenticate, register and dial the tunnel again.
    let register = loop {
        match harness.next_control().await {
            ControlEvent::Auth { accepted, .. } => assert!(accepted),
            ControlEvent::SessionOpened { authorization } => {
                assert_eq!(authorization, "Bearer session-token-2");
            }
            ControlEvent::Message(AgentMessage {
                kind: Some(AgentKind::Register(register)),
            }) => break register,
            ControlEvent::Message(_) => {}
        }
    };
    assert_eq!(register.models, vec![MODEL]);
    let (router, _) = harness
        .accept_tunnel_with_connection("session-token-2")
        .await;
    router.ready().await.expect("the new tunnel speaks HTTP/2");

    // SIGTERM is a clean exit.
    let pid = harness.agent.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = harness.agent.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "agent exits after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_is_refreshed_and_new_tunnels_use_the_newest_token() {
    // A 1 s TTL: the agent re-authenticates after ~800 ms.
    let mut harness = start_with_ttl("refresh", 1_000).await;
    harness.expect_registration().await;
    let (router, tunnel) = harness.accept_tunnel_with_connection(SESSION_TOKEN).await;

    let refreshed = loop {
        if let ControlEvent::Message(AgentMessage {
            kind: Some(AgentKind::Refresh(refresh)),
        }) = harness.next_control().await
        {
            break refresh.session_token;
        }
    };
    assert_eq!(refreshed, "session-token-2");

    // The router drops the tunnel; the agent redials with the refreshed token (or a later one,
    // since refreshes keep coming every ~800 ms).
    drop(router);
    tunnel.abort();
    let (mut socket, _) = tokio::time::timeout(WAIT, harness.tunnel.accept())
        .await
        .expect("the agent redials the tunnel")
        .unwrap();
    let mut head = [0u8; 8];
    socket.read_exact(&mut head).await.unwrap();
    let (_, _, token_len) = preamble::decode_head(&head).unwrap();
    let mut token = vec![0u8; token_len];
    socket.read_exact(&mut token).await.unwrap();
    let token = preamble::decode_token(token).unwrap();
    let serial: u32 = token
        .strip_prefix("session-token-")
        .and_then(|serial| serial.parse().ok())
        .expect("a session token");
    assert!(
        serial >= 2,
        "redialed with {token}, not the refreshed token"
    );
}
