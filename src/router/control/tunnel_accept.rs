//! Accepts agent-dialed tunnel sockets on `--p2p-port`, checks the preamble's session token and
//! shard index, answers the status byte, and hands the socket to the shard it names. With
//! `--p2p-tls-cert` the port speaks TLS: the plaintext preamble is refused, and a socket whose
//! hint (`tunnel::tls`) names a shard goes to that shard, which terminates the TLS.
//!
//! Error handling: a socket that does not finish its preamble within [`PREAMBLE_TIMEOUT`], or
//! presents a bad token or shard, is answered (when possible) and closed; nothing else is affected.
//! Anyone who can reach the port can cause refusals at will, so they are logged through
//! [`RefusalLog`](super::tunnel_refusals::RefusalLog): at most one WARN line per [`REFUSAL_LOG_INTERVAL`], which counts the refusals
//! left out since the previous line (`suppressed`).

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::logic::routing::AgentId;
use crate::net::tunnel::preamble::{self, Status};
use crate::net::tunnel::tls;
use crate::router::control::ControlShared;
use crate::router::shard::conn_limit::ConnPermit;
use crate::router::shard::messages::ControlToShard;

pub const PREAMBLE_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(listener: tokio::net::TcpListener, shared: Arc<ControlShared>) {
    loop {
        let (socket, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                shared.tunnel_refusals.accept_failed(&error);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // `--p2p-max-conns-per-ip`: the permit travels with the socket and is given back when
        // the connection closes, here on refusal or on its shard when the tunnel ends.
        let Some(permit) = shared.tunnel_conns.admit(remote.ip()) else {
            shared.tunnel_refusals.refused(
                Some(remote),
                None,
                "too many connections from this address (--p2p-max-conns-per-ip)",
            );
            drop(socket);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(PREAMBLE_TIMEOUT, handshake(socket, permit, &shared)).await {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => shared.tunnel_refusals.refused(Some(remote), None, reason),
                Err(_) => shared
                    .tunnel_refusals
                    .refused(Some(remote), None, "preamble timed out"),
            }
        });
    }
}

async fn handshake(
    mut socket: tokio::net::TcpStream,
    permit: ConnPermit,
    shared: &ControlShared,
) -> Result<(), &'static str> {
    let mut magic = [0u8; 4];
    socket
        .read_exact(&mut magic)
        .await
        .map_err(|_| "connection closed during preamble")?;
    let tls_on = shared.settings.tunnel_tls;
    if &magic == tls::MAGIC {
        return secure_handshake(socket, permit, shared).await;
    }
    if tls_on && preamble::Codec::from_magic(&magic).is_some() {
        let _ = socket.write_all(&[Status::TlsRequired as u8]).await;
        return Err("plaintext preamble on a TLS tunnel port");
    }
    let (codec, shard, claims) = preamble::read_claims(
        &mut socket,
        &magic,
        &shared.secret,
        &shared.settings.session_issuer,
    )
    .await?;
    let status = match claims {
        None => Status::BadToken,
        Some(claims) => {
            let agent = AgentId(claims.sid as u32);
            if !shared.registry().is_session_live(agent) {
                Status::BadToken
            } else if usize::from(shard) >= shared.settings.shard_count {
                Status::BadShard
            } else {
                return hand_to_shard(socket, shard, shared, |socket| ControlToShard::Tunnel {
                    agent,
                    codec,
                    socket,
                    permit,
                })
                .await;
            }
        }
    };
    let _ = socket.write_all(&[status as u8]).await;
    Err(status.describe())
}

/// A TLS tunnel: the hint names the shard, which terminates the TLS and checks the preamble
/// inside it (`shard::tunnels::run_secure`).
async fn secure_handshake(
    mut socket: tokio::net::TcpStream,
    permit: ConnPermit,
    shared: &ControlShared,
) -> Result<(), &'static str> {
    if !shared.settings.tunnel_tls {
        let _ = socket.write_all(&[Status::TlsNotOffered as u8]).await;
        return Err("TLS asked for, but the router has no tunnel certificate");
    }
    let mut shard = [0u8; 2];
    socket
        .read_exact(&mut shard)
        .await
        .map_err(|_| "connection closed during the TLS hint")?;
    let shard = tls::decode_hint_shard(shard);
    if usize::from(shard) >= shared.settings.shard_count {
        let _ = socket.write_all(&[Status::BadShard as u8]).await;
        return Err(Status::BadShard.describe());
    }
    hand_to_shard(socket, shard, shared, |socket| {
        ControlToShard::SecureTunnel { socket, permit }
    })
    .await
}

/// Answers `Accepted` and hands the socket to the shard it names, in the message `message` makes.
async fn hand_to_shard(
    mut socket: tokio::net::TcpStream,
    shard: u16,
    shared: &ControlShared,
    message: impl FnOnce(std::net::TcpStream) -> ControlToShard,
) -> Result<(), &'static str> {
    socket
        .write_all(&[Status::Accepted as u8])
        .await
        .map_err(|_| "connection closed before acceptance")?;
    let _ = socket.set_nodelay(true);
    let socket = socket.into_std().map_err(|_| "cannot detach socket")?;
    shared
        .send_to_shard(usize::from(shard), message(socket))
        .await;
    Ok(())
}
