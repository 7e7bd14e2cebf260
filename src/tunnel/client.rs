//! The router side of one tunnel: HTTP/2 client over an agent-dialed socket, on the shard the agent
//! named in its preamble.
//!
//! Performance: `monoio-compat`'s wrapper copies through its own buffers; they are sized to hold a
//! full HTTP/2 frame batch so one syscall carries many frames. The wrapper reports a write done
//! before it reaches the socket, so a dead peer shows on the next write or as a closed connection,
//! which ends the connection task below and takes the tunnel out of the shard at once.

use std::rc::Rc;
use std::time::Duration;

use futures_util::future::Either;

use monoio_compat::StreamWrapper;

use crate::routing::AgentId;
use crate::shard::latch::race;
use crate::shard::state::{Shard, Tunnel};

/// Buffer sizes of the compat wrapper around the tunnel socket.
const TUNNEL_BUFFER_BYTES: usize = 64 * 1024;
/// HTTP/2 windows: large enough that a streamed response or a big request body never stalls on
/// window updates over loopback or a LAN.
const STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
const CONNECTION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;
/// Keepalive ping cadence on an idle or busy tunnel, and how long an answer may take.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// `_permit` is the connection's place under `--p2p-max-conns-per-ip`, given back when this task
/// (and so the tunnel) ends.
pub async fn run(
    shard: Rc<Shard>,
    agent: AgentId,
    generation: u64,
    socket: std::net::TcpStream,
    _permit: crate::control::conn_limit::ConnPermit,
) {
    let stream = match monoio::net::TcpStream::from_std(socket) {
        Ok(stream) => stream,
        Err(error) => {
            tracing::warn!(shard = shard.id, session = agent.0, %error, "tunnel socket unusable");
            shard.tunnel_down(agent, generation);
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let io = StreamWrapper::new_with_buffer_size(stream, TUNNEL_BUFFER_BYTES, TUNNEL_BUFFER_BYTES);
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
            shard.tunnel_down(agent, generation);
            return;
        }
    };
    let pings = connection.ping_pong();
    shard.tunnel_up(agent, Tunnel { send, generation });
    tracing::debug!(shard = shard.id, session = agent.0, "tunnel up");
    match race(connection, keepalive(pings)).await {
        Either::Left(Err(error)) => {
            tracing::info!(shard = shard.id, session = agent.0, %error, "tunnel connection ended");
        }
        Either::Left(Ok(())) => {}
        Either::Right(()) => {
            tracing::warn!(
                shard = shard.id,
                session = agent.0,
                "tunnel silent: no ping answer, closing it"
            );
        }
    }
    shard.tunnel_down(agent, generation);
}

/// Pings the agent every [`PING_INTERVAL`]; returns when one goes unanswered for [`PING_TIMEOUT`],
/// so a peer that vanished without a reset (a partition, a frozen host) leaves the shard promptly.
/// h2 sends no keepalive pings by itself.
async fn keepalive(pings: Option<h2::PingPong>) {
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
