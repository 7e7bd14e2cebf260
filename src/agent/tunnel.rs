//! The agent's end of the data tunnel: one agent-dialed TCP connection per router shard, opened
//! with the preamble (`crate::net::tunnel::preamble`) and then served with the agent as the server: the
//! lean tunnel (`crate::net::tunnel::link`), or HTTP/2 with a router older than it, which answers the
//! lean tunnel's preamble as malformed; the agent then dials again offering HTTP/2. Each
//! tunnelled stream is handed to `agent::forward`. When the router's tunnel address
//! ends in `/tls`, the preamble and everything after it travel inside TLS (`crate::net::tunnel::tls`).
//!
//! Each shard connection lives in its own task and reconnects on its own with the reconnect
//! backoff. The control session owns those tasks and aborts them when it ends; aborting a shard
//! task drops its connection and every request task on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::backoff::{Backoff, RECONNECT_RESET_AFTER};
use super::forward::{self, ForwardContext};
use super::multiaddr::TunnelAddr;
use super::stream::{Incoming, Reply};
use crate::net::tunnel::link;
use crate::net::tunnel::preamble::{self, Codec, Status};

/// Deadline for the TCP connect and for the router's status byte.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 receive windows (the lean tunnel's are protocol constants, `tunnel::mux::Windows`): a
/// stream window large enough for a big prompt in a few round trips, a connection window shared by
/// the requests of one shard.
const STREAM_WINDOW_BYTES: u32 = 1 << 20;
const CONNECTION_WINDOW_BYTES: u32 = 4 << 20;
/// Upper bound on concurrent streams per shard connection, the lean codec's (`mux::STREAMS_MAX`,
/// sized for 10,000 open streams a shard). The router admits at most `--capacity` requests per
/// agent and model; this only stops a faulty router from opening without limit.
const STREAMS_PER_CONNECTION_MAX: u32 = crate::net::tunnel::mux::STREAMS_MAX as u32;
/// Streams the router may reset before this agent has accepted them. h2's default (20) guards a
/// server from untrusted clients; the router is an authenticated peer that passes its clients'
/// cancellations on, so at 20 a burst of client resets would close the whole tunnel and every
/// stream of every client on it. The router bounds what its clients may reset; this only bounds a
/// faulty router.
const PENDING_ACCEPT_RESETS_MAX: usize = 4 * STREAMS_PER_CONNECTION_MAX as usize;

#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("timed out connecting to {0}")]
    ConnectTimeout(String),
    #[error("tunnel handshake failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("router did not answer the preamble in time")]
    StatusTimeout,
    #[error("router refused the tunnel: {}", .0.describe())]
    Refused(Status),
    #[error("router answered an unknown tunnel status {0}")]
    UnknownStatus(u8),
    #[error("HTTP/2 on the tunnel failed: {0}")]
    Http2(#[from] h2::Error),
    #[error("the tunnel failed: {0}")]
    Lean(#[from] link::LinkError),
    #[error("the tunnel address {0:?} is not a name a TLS certificate can carry")]
    TlsName(String),
    #[error("TLS handshake with the router failed: {0}")]
    Tls(std::io::Error),
}

/// Keeps shard `shard` connected to `addr` until the task is aborted, offering `offer`
/// (`--p2p-codec`) on each connection.
pub async fn run_shard(
    router: Arc<str>,
    shard: u16,
    addr: TunnelAddr,
    session_token: watch::Receiver<String>,
    forward: Arc<ForwardContext>,
    tls: Arc<rustls::ClientConfig>,
    offer: Codec,
) {
    let mut backoff = Backoff::reconnect();
    // Every connection offers `offer` first: a router upgraded since the last one gets it.
    let mut codec = offer;
    loop {
        let started = Instant::now();
        match connect_and_serve(shard, codec, &addr, &session_token, &forward, &tls).await {
            Ok(()) => info!(%router, shard, "tunnel closed by the router"),
            Err(TunnelError::Refused(Status::Malformed)) if codec == Codec::Lean => {
                info!(
                    %router,
                    shard,
                    "the router predates the lean tunnel: dialing again with HTTP/2"
                );
                codec = Codec::Http2;
                continue;
            }
            Err(error) => warn!(%router, shard, %error, "tunnel down"),
        }
        codec = offer;
        if started.elapsed() > RECONNECT_RESET_AFTER {
            backoff.reset();
        }
        let delay = backoff.next_delay_random();
        debug!(%router, shard, ?delay, "reconnecting tunnel");
        tokio::time::sleep(delay).await;
    }
}

async fn connect_and_serve(
    shard: u16,
    codec: Codec,
    addr: &TunnelAddr,
    session_token: &watch::Receiver<String>,
    forward: &Arc<ForwardContext>,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<(), TunnelError> {
    let target = addr.dial_target();
    let mut socket = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(&target))
        .await
        .map_err(|_| TunnelError::ConnectTimeout(target.clone()))?
        .map_err(|source| TunnelError::Connect {
            addr: target.clone(),
            source,
        })?;
    socket.set_nodelay(true)?;
    if !addr.tls {
        open(&mut socket, codec, shard, session_token).await?;
        info!(shard, addr = %target, ?codec, "tunnel up");
        return serve(shard, codec, socket, forward).await;
    }
    // TLS: a plaintext hint naming the shard, the router's go-ahead, then the handshake; the
    // preamble and its token travel inside.
    let name = crate::net::tunnel::tls::server_name(&addr.host)
        .ok_or_else(|| TunnelError::TlsName(addr.host.clone()))?;
    socket
        .write_all(&crate::net::tunnel::tls::encode_hint(shard))
        .await?;
    read_status(&mut socket).await?;
    let mut socket = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_rustls::TlsConnector::from(tls.clone()).connect(name, socket),
    )
    .await
    .map_err(|_| TunnelError::StatusTimeout)?
    .map_err(TunnelError::Tls)?;
    open(&mut socket, codec, shard, session_token).await?;
    info!(shard, addr = %target, ?codec, "tunnel up (TLS)");
    serve(shard, codec, socket, forward).await
}

/// Writes the preamble with the newest session token and waits for the router's acceptance.
async fn open<IO: AsyncRead + AsyncWrite + Unpin>(
    io: &mut IO,
    codec: Codec,
    shard: u16,
    session_token: &watch::Receiver<String>,
) -> Result<(), TunnelError> {
    // The newest token: after a session refresh, new connections present the refreshed one.
    let token = session_token.borrow().clone();
    io.write_all(&preamble::encode(codec, shard, &token))
        .await?;
    io.flush().await?;
    read_status(io).await
}

/// The router's one status byte: accepted, or why not.
async fn read_status<IO: AsyncRead + Unpin>(io: &mut IO) -> Result<(), TunnelError> {
    let mut status = [0u8; 1];
    tokio::time::timeout(HANDSHAKE_TIMEOUT, io.read_exact(&mut status))
        .await
        .map_err(|_| TunnelError::StatusTimeout)??;
    match Status::from_byte(status[0]) {
        Some(Status::Accepted) => Ok(()),
        Some(refused) => Err(TunnelError::Refused(refused)),
        None => Err(TunnelError::UnknownStatus(status[0])),
    }
}

/// Serves `codec` (the agent as server) on an opened tunnel until it ends.
async fn serve<IO: AsyncRead + AsyncWrite + Unpin>(
    shard: u16,
    codec: Codec,
    socket: IO,
    forward: &Arc<ForwardContext>,
) -> Result<(), TunnelError> {
    // Request tasks live in this set: when the shard task is aborted, they go with it.
    let mut requests = JoinSet::new();
    // Boxed: the task cell then holds a pointer, not the request's whole state, which tokio
    // would copy four times over on spawn and on completion.
    let start = |incoming: Incoming, reply: Reply| {
        Box::pin(forward::serve(incoming, reply, forward.clone()))
    };
    match codec {
        Codec::Lean => {
            let (mut acceptor, connection) = link::server(socket);
            let mut connection = std::pin::pin!(connection);
            loop {
                tokio::select! {
                    ended = &mut connection => return Ok(ended?),
                    Some((request, body, reply)) = acceptor.accept() => {
                        requests.spawn(start(Incoming::lean(request, body), Reply::Lean(reply)));
                    }
                    Some(joined) = requests.join_next(), if !requests.is_empty() => {
                        note_joined(shard, joined);
                    }
                }
            }
        }
        Codec::Http2 => {
            let mut connection = h2::server::Builder::new()
                .initial_window_size(STREAM_WINDOW_BYTES)
                .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
                .max_concurrent_streams(STREAMS_PER_CONNECTION_MAX)
                .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS_MAX)
                .handshake(socket)
                .await?;
            loop {
                tokio::select! {
                    accepted = connection.accept() => match accepted {
                        Some(Ok((request, respond))) => {
                            requests.spawn(start(Incoming::http2(request), Reply::http2(respond)));
                        }
                        Some(Err(error)) => return Err(TunnelError::Http2(error)),
                        None => return Ok(()),
                    },
                    Some(joined) = requests.join_next(), if !requests.is_empty() => {
                        note_joined(shard, joined);
                    }
                }
            }
        }
    }
}

fn note_joined(shard: u16, joined: Result<(), tokio::task::JoinError>) {
    if joined.is_err_and(|error| error.is_panic()) {
        warn!(shard, "a request task panicked");
    }
}
