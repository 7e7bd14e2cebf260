//! The router side of one tunnel: HTTP/2 client over an agent-dialed socket, on the shard the agent
//! named in its preamble.
//!
//! Performance: `monoio-compat`'s wrapper copies through its own buffers; they are sized to hold a
//! full HTTP/2 frame batch so one syscall carries many frames. The wrapper reports a write done
//! before it reaches the socket, so a dead peer shows on the next write or as a closed connection,
//! which ends the connection task below and takes the tunnel out of the shard at once.

use std::rc::Rc;

use monoio_compat::StreamWrapper;

use crate::routing::AgentId;
use crate::shard::state::{Shard, Tunnel};

/// Buffer sizes of the compat wrapper around the tunnel socket.
const TUNNEL_BUFFER_BYTES: usize = 64 * 1024;
/// HTTP/2 windows: large enough that a streamed response or a big request body never stalls on
/// window updates over loopback or a LAN.
const STREAM_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
const CONNECTION_WINDOW_BYTES: u32 = 16 * 1024 * 1024;

pub async fn run(shard: Rc<Shard>, agent: AgentId, generation: u64, socket: std::net::TcpStream) {
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
    let (send, connection) = match handshake {
        Ok(pair) => pair,
        Err(error) => {
            tracing::warn!(shard = shard.id, session = agent.0, %error, "tunnel HTTP/2 handshake failed");
            shard.tunnel_down(agent, generation);
            return;
        }
    };
    shard.tunnel_up(agent, Tunnel { send, generation });
    tracing::debug!(shard = shard.id, session = agent.0, "tunnel up");
    if let Err(error) = connection.await {
        tracing::info!(shard = shard.id, session = agent.0, %error, "tunnel connection ended");
    }
    shard.tunnel_down(agent, generation);
}
