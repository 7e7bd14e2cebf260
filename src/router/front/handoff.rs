//! A client connection's move to the shard that owns its first request's key
//! (`shard::handoff`), the giving side: whether the first head asks for it, and the socket out of
//! this shard's runtime. The owner serves it with `connection::adopt`. Off with
//! `--connection-handoff off`.

use bytes::BytesMut;
use monoio::net::TcpStream;

use crate::router::api::authenticate::now_unix_ms;
use crate::router::shard::handoff::Handoff;
use crate::router::shard::state::Shard;
use crate::wire::http::request::{HeadLimits, parse_head};

/// When the first request's key is limited and owned by another shard (`shard::handoff`), gives
/// the connection there with what was read of it, before anything of the request has run: the
/// owner serves it from that request on. Hands the connection back when it stays here (no
/// complete head yet, no such key, an owner too busy, a full ring).
pub(super) fn hand_off(
    shard: &Shard,
    stream: TcpStream,
    first: BytesMut,
) -> Option<(TcpStream, BytesMut)> {
    if shard.settings.handoff.is_none() {
        return Some((stream, first));
    }
    let Ok(Some(head)) = parse_head(&first, &HeadLimits::default()) else {
        return Some((stream, first));
    };
    let presented = crate::logic::auth::keys::presented_key(
        head.authorization.map(|span| span.get(&first)),
        head.x_api_key.map(|span| span.get(&first)),
    );
    let keys = shard.keys();
    let owner = match keys.authenticate(presented, now_unix_ms()) {
        crate::logic::auth::keys::AuthOutcome::Authenticated { key, .. } => {
            shard.handoff_target(key)
        }
        _ => None,
    };
    let Some(owner) = owner else {
        return Some((stream, first));
    };
    let peer = stream.peer_addr().ok().map(|address| address.ip());
    let socket = into_std(stream);
    let handoff = Handoff {
        socket,
        read: first,
        peer,
    };
    match shard.hand_off(owner, handoff) {
        Ok(()) => None,
        Err(handoff) => match TcpStream::from_std(handoff.socket) {
            Ok(stream) => Some((stream, handoff.read)),
            Err(error) => {
                tracing::warn!(shard = shard.id, %error, "a client connection that could not move could not be served here either");
                None
            }
        },
    }
}

/// The socket out of this shard's runtime (deregistered from its poller under epoll), for another
/// shard's. Only between requests' reads: no operation of the runtime holds it then.
fn into_std(stream: TcpStream) -> std::net::TcpStream {
    use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
    let fd = stream.into_raw_fd();
    // SAFETY: `into_raw_fd` gives up the runtime's ownership of `fd` without closing it; the
    // `OwnedFd` is its only owner from here on.
    std::net::TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) })
}
