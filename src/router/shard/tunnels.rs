//! The router side of one tunnel: the client of the codec the agent's preamble named (the lean
//! tunnel, or HTTP/2 for older agents) over an agent-dialed socket, on the shard the agent named
//! in its preamble — in the clear ([`run`], the control core checked the preamble), or inside TLS
//! that this shard terminates ([`run_secure`], which checks the preamble itself).
//!
//! Performance: `monoio-compat`'s wrapper copies through its own buffers; they are sized to hold a
//! full frame batch so one syscall carries many frames. The wrapper reports a write done
//! before it reaches the socket, so a dead peer shows on the next write or as a closed connection,
//! which ends the connection task below and takes the tunnel out of the shard at once.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_util::future::Either;

use monoio_compat::StreamWrapper;

use crate::base::latch::race;
use crate::base::log_limit::LogLimit;
use crate::logic::routing::AgentId;
use crate::net::tunnel::link;
use crate::net::tunnel::preamble::Codec;
use crate::net::tunnel::upstream::{Http2Tunnel, Sender, StreamIds};
use crate::router::shard::state::{Shard, Tunnel};

/// At most one "tunnel refused" (and one "tunnel accept failed") line per this long.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Buffer sizes of the compat wrapper around the tunnel socket.
const TUNNEL_BUFFER_BYTES: usize = 64 * 1024;
/// HTTP/2 windows (the lean tunnel's are protocol constants, `tunnel::mux::Windows::TUNNEL`):
/// large enough that a streamed response or a big request body never stalls on window updates
/// over loopback or a LAN.
const STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
const CONNECTION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Keepalive ping cadence on an idle or busy tunnel, and how long an answer may take.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a retiring HTTP/2 tunnel's requests may take past the request timeout to finish.
const RETIRE_GRACE: Duration = Duration::from_secs(5);

/// The streams an HTTP/2 tunnel opens before it retires: what HTTP/2 allows, or, in a debug
/// build, `HIVENET_TEST_HTTP2_TUNNEL_STREAMS` (the integration tests' way to reach the end of a
/// tunnel's ids in a few requests instead of a billion).
fn http2_tunnel_streams() -> u32 {
    #[cfg(debug_assertions)]
    if let Some(streams) = std::env::var("HIVENET_TEST_HTTP2_TUNNEL_STREAMS")
        .ok()
        .and_then(|value| value.parse().ok())
    {
        return streams;
    }
    StreamIds::HTTP2_CLIENT
}

/// How long an agent has to finish the TLS handshake and its preamble.
const SECURE_OPEN_TIMEOUT: Duration = Duration::from_secs(5);

thread_local! {
    /// This shard's refused-TLS-tunnel lines: anyone who reaches the tunnel port can cause them,
    /// so at most one per `REFUSAL_LOG_INTERVAL` per shard, counting the ones left out.
    static TLS_REFUSALS: RefCell<LogLimit> =
        const { RefCell::new(LogLimit::new(REFUSAL_LOG_INTERVAL)) };
}

fn log_tls_refusal(shard: usize, reason: &str) {
    if let Some(suppressed) = TLS_REFUSALS.with_borrow_mut(|limit| limit.note(Instant::now())) {
        tracing::warn!(
            shard,
            reason,
            suppressed,
            "TLS tunnel refused (at most one such line per 10 s per shard; suppressed: refusals since the previous line)"
        );
    }
}

type Io = StreamWrapper<monoio::net::TcpStream>;

fn wrap(socket: std::net::TcpStream) -> std::io::Result<Io> {
    let stream = monoio::net::TcpStream::from_std(socket)?;
    let _ = stream.set_nodelay(true);
    Ok(StreamWrapper::new_with_buffer_size(
        stream,
        TUNNEL_BUFFER_BYTES,
        TUNNEL_BUFFER_BYTES,
    ))
}

/// A plaintext tunnel whose preamble the control core accepted. `_permit` is the connection's
/// place under `--p2p-max-conns-per-ip`, given back when this task (and so the tunnel) ends.
/// Starts serving a tunnel socket the control core handed `shard` (the shard's tunnel starter).
pub fn start(shard: &Rc<Shard>, socket: crate::router::shard::inbox::TunnelSocket) {
    use crate::router::shard::inbox::TunnelSocket;
    let generation = shard.new_tunnel_generation();
    match socket {
        TunnelSocket::Plain {
            agent,
            codec,
            socket,
            permit,
        } => {
            monoio::spawn(run(shard.clone(), agent, codec, generation, socket, permit));
        }
        TunnelSocket::Secure { socket, permit } => {
            monoio::spawn(run_secure(shard.clone(), generation, socket, permit));
        }
    }
}

pub async fn run(
    shard: Rc<Shard>,
    agent: AgentId,
    codec: Codec,
    generation: u64,
    socket: std::net::TcpStream,
    _permit: crate::router::shard::conn_limit::ConnPermit,
) {
    match wrap(socket) {
        Ok(io) => serve(&shard, agent, codec, generation, io).await,
        Err(error) => {
            tracing::warn!(shard = shard.id, session = agent.0, %error, "tunnel socket unusable");
            shard.tunnel_down(agent, generation).await;
        }
    }
}

/// A TLS tunnel: the TLS handshake, then the preamble inside it, checked here (the token's
/// signature and this shard's index; the control core checks the session is live when the tunnel
/// comes up), then the codec it named, as for [`run`].
pub async fn run_secure(
    shard: Rc<Shard>,
    generation: u64,
    socket: std::net::TcpStream,
    _permit: crate::router::shard::conn_limit::ConnPermit,
) {
    let Some(security) = shard.settings.tunnel_tls.clone() else {
        return;
    };
    let io = match wrap(socket) {
        Ok(io) => io,
        Err(_) => {
            log_tls_refusal(shard.id, "tunnel socket unusable");
            return;
        }
    };
    let opened =
        monoio::time::timeout(SECURE_OPEN_TIMEOUT, open_secure(&shard, &security, io)).await;
    match opened {
        Ok(Ok((agent, codec, tls))) => serve(&shard, agent, codec, generation, tls).await,
        Ok(Err(reason)) => log_tls_refusal(shard.id, reason),
        Err(_) => log_tls_refusal(shard.id, "handshake or preamble timed out"),
    }
}

async fn open_secure(
    shard: &Shard,
    security: &crate::net::tunnel::tls::TunnelSecurity,
    io: Io,
) -> Result<(AgentId, Codec, tokio_rustls::server::TlsStream<Io>), &'static str> {
    use crate::net::tunnel::preamble::{self, Status};
    use tokio::io::AsyncWriteExt;
    let mut tls = tokio_rustls::TlsAcceptor::from(security.config.clone())
        .accept(io)
        .await
        .map_err(|_| "TLS handshake failed")?;
    let (codec, claimed, claims) =
        preamble::read_claims(&mut tls, &[], &security.secret, &security.session_issuer).await?;
    let status = match &claims {
        None => Status::BadToken,
        Some(_) if usize::from(claimed) != shard.id => Status::BadShard,
        Some(_) => Status::Accepted,
    };
    tls.write_all(&[status as u8])
        .await
        .map_err(|_| "connection closed before acceptance")?;
    tls.flush()
        .await
        .map_err(|_| "connection closed before acceptance")?;
    match (status, claims) {
        (Status::Accepted, Some(claims)) => Ok((AgentId(claims.sid as u32), codec, tls)),
        _ => Err(status.describe()),
    }
}

/// The codec the agent named (the router as client) over an opened tunnel, until it ends.
async fn serve<IO>(shard: &Rc<Shard>, agent: AgentId, codec: Codec, generation: u64, io: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    match codec {
        Codec::Lean => {
            let (opener, connection) = link::client(io);
            let pings = opener.pinger();
            let tunnel = Tunnel {
                send: Sender::Lean(opener),
                generation,
            };
            let keepalive = async move {
                loop {
                    monoio::time::sleep(PING_INTERVAL).await;
                    match monoio::time::timeout(PING_TIMEOUT, pings.ping()).await {
                        Ok(Ok(())) => {}
                        // The connection itself is failing, and says why.
                        Ok(Err(_)) => return std::future::pending().await,
                        Err(_elapsed) => return,
                    }
                }
            };
            let retire = std::future::pending();
            serve_until_down(shard, agent, tunnel, connection, keepalive, retire).await;
        }
        Codec::Http2 => {
            let handshake = h2::client::Builder::new()
                .initial_window_size(STREAM_WINDOW_BYTES)
                .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                .max_concurrent_reset_streams(1024)
                .handshake::<_, bytes::Bytes>(io)
                .await;
            let (send, mut connection) = match handshake {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(shard = shard.id, session = agent.0, %error, "tunnel HTTP/2 handshake failed");
                    shard.tunnel_down(agent, generation).await;
                    return;
                }
            };
            let pings = connection.ping_pong();
            let http2 = Rc::new(Http2Tunnel {
                send,
                ids: StreamIds::new(http2_tunnel_streams()),
            });
            let tunnel = Tunnel {
                send: Sender::Http2(http2.clone()),
                generation,
            };
            let retire = async move { http2.ids.retiring().await };
            let keepalive = keepalive_http2(pings);
            serve_until_down(shard, agent, tunnel, connection, keepalive, retire).await;
        }
    }
}

/// Puts `tunnel` in the shard and drives its `connection` until it ends, the router's drain ends,
/// or `keepalive` finds the agent silent; then takes the tunnel out. When `retire` resolves (an
/// HTTP/2 tunnel whose stream ids are nearly spent, `upstream::StreamIds`), the tunnel is taken
/// out at once, so that no request is sent on it and the agent leaves the pool, and the
/// connection is driven until its requests in flight have finished (at most the request timeout
/// and [`RETIRE_GRACE`]); closing it then makes the agent dial a fresh tunnel.
async fn serve_until_down<E: std::fmt::Display>(
    shard: &Rc<Shard>,
    agent: AgentId,
    tunnel: Tunnel,
    connection: impl std::future::Future<Output = Result<(), E>>,
    keepalive: impl std::future::Future<Output = ()>,
    retire: impl std::future::Future<Output = ()>,
) {
    let generation = tunnel.generation;
    shard.tunnel_up(agent, tunnel).await;
    tracing::debug!(shard = shard.id, session = agent.0, "tunnel up");
    let mut connection = std::pin::pin!(connection);
    let mut keepalive = std::pin::pin!(keepalive);
    // The router's drain ended: the connection goes, and every request still on it ends.
    let ending = shard.lifecycle.ending();
    let watched = race(keepalive.as_mut(), retire);
    match race(race(connection.as_mut(), ending), watched).await {
        Either::Right(Either::Right(())) => {
            tracing::info!(
                shard = shard.id,
                session = agent.0,
                "tunnel retiring: its HTTP/2 stream ids are nearly spent; its requests finish, then the agent dials a new one"
            );
            shard.tunnel_down(agent, generation).await;
            let finished = race(connection, shard.lifecycle.ending());
            let bound = monoio::time::sleep(shard.settings.request_timeout + RETIRE_GRACE);
            let _ = race(finished, race(keepalive, bound)).await;
            return;
        }
        Either::Left(Either::Left(Err(error))) => {
            tracing::info!(shard = shard.id, session = agent.0, %error, "tunnel connection ended");
        }
        Either::Left(Either::Left(Ok(()))) => {}
        Either::Left(Either::Right(())) => {
            tracing::info!(
                shard = shard.id,
                session = agent.0,
                "tunnel closed: the router is shutting down"
            );
        }
        Either::Right(Either::Left(())) => {
            tracing::warn!(
                shard = shard.id,
                session = agent.0,
                "tunnel silent: no ping answer, closing it"
            );
        }
    }
    shard.tunnel_down(agent, generation).await;
}

/// HTTP/2: pings the agent every [`PING_INTERVAL`]; returns when one goes unanswered for
/// [`PING_TIMEOUT`], so a peer that vanished without a reset (a partition, a frozen host) leaves
/// the shard promptly. h2 sends no keepalive pings by itself.
async fn keepalive_http2(pings: Option<h2::PingPong>) {
    let Some(mut pings) = pings else {
        return std::future::pending().await;
    };
    loop {
        monoio::time::sleep(PING_INTERVAL).await;
        match monoio::time::timeout(PING_TIMEOUT, pings.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(_)) => return std::future::pending().await, // the connection itself is failing
            Err(_elapsed) => return,
        }
    }
}
