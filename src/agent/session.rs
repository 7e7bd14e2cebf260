//! One control session per router: challenge the router (it must prove it holds the site secret
//! before it is sent anything, `base::challenge`), authenticate, register, heartbeats and routing
//! signals on the `Session` stream, session renewal at 80 % of the TTL, and the shard tunnels that
//! live exactly as long as the session.
//!
//! ## Error handling
//! Any failure (router unreachable, authentication refused, stream ended or errored, `Refused`
//! message) ends the session: its tunnels are aborted and the whole sequence starts over after the
//! reconnect backoff (1 s to 30 s with jitter), which resets after a session that stayed up longer
//! than 30 s. Neither the shared secret nor any token is ever logged.
//!
//! Discovery: after authenticating, the session asks the driver (`sessions::Link`) whether another
//! session already reaches this router (same peer ID); if so it stops before registering and
//! tries again once that session is down. The routers listed in the authentication response and
//! in every heartbeat ack go to the driver; heartbeats carry the peer IDs of every router reached.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::transport::{Channel, Endpoint};
use tracing::{info, warn};

use super::backoff::{Backoff, RECONNECT_RESET_AFTER, SESSION_MAX};
use super::discovery::Admit;
use super::multiaddr;
use super::session_link::Link;
use super::shared::Shared;
use super::tunnel;
use crate::base::challenge;
use crate::wire::proto::agent_control_client::AgentControlClient;
use crate::wire::proto::agent_message::Kind as AgentKind;
use crate::wire::proto::router_message::Kind as RouterKind;
use crate::wire::proto::{
    AgentMessage, AuthRequest, AuthResponse, ChallengeRequest, Heartbeat, Leaving, Register,
    RoutingSignal, SessionRefresh,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of one `Authenticate` call.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Used when neither the flag nor the router gives an interval.
const HEARTBEAT_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
const ROUTING_SIGNAL_INTERVAL_DEFAULT: Duration = Duration::from_millis(500);
/// Refresh the session token at this fraction of its TTL.
const REFRESH_AT_TTL_FRACTION: f64 = 0.8;
/// Messages queued towards the router; a full queue waits, it never grows.
const OUTBOUND_QUEUE_CAPACITY: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("router address is invalid: {0}")]
    BadAddress(String),
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("authentication refused: {0}")]
    Unauthenticated(String),
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("authentication timed out")]
    AuthTimeout,
    #[error("the router did not prove it belongs to the site, and was sent no credential: {0}")]
    Unproven(String),
    #[error("router announced no dialable tunnel address among {0:?}")]
    NoTunnelAddr(Vec<String>),
    #[error("router announced zero shards")]
    NoShards,
    #[error("cannot open the session stream: {0}")]
    Open(String),
    #[error("session stream failed: {0}")]
    Stream(String),
    #[error("router refused the session: {0}")]
    Refused(String),
    #[error("router ended the session stream")]
    Ended,
    #[error("router {0} is already reached by another session")]
    Duplicate(String),
}

/// Keeps a session with `router` (a gRPC URI) alive until the driver aborts the task,
/// reconnecting with backoff.
pub async fn run_router(router: String, shared: Arc<Shared>, link: Link) {
    let label: Arc<str> = Arc::from(router.as_str());
    let mut backoff = Backoff::session();
    loop {
        let mut established: Option<Instant> = None;
        let error = run_session(&label, &shared, &link, &mut established).await;
        link.down().await;
        match &error {
            SessionError::Unauthenticated(_) => {
                warn!(router = %label, %error, "check that the agent and router share the same secret")
            }
            SessionError::Unproven(_) => {
                shared.unproven_routers.fetch_add(1, Ordering::Relaxed);
                warn!(router = %label, %error, "check the address: a router of this site holds the same secret as this agent")
            }
            SessionError::Duplicate(_) => {
                info!(router = %label, %error, "no second session: waiting until the other one is down")
            }
            _ => warn!(router = %label, %error, "session down"),
        }
        if *shared.draining.borrow() {
            // Shutting down: a new session would register the agent again.
            return;
        }
        if let SessionError::Duplicate(peer_id) = &error {
            // Looked at again at least every SESSION_MAX: the address may reach another router
            // by then (a DNS name).
            link.wait_released(peer_id, SESSION_MAX).await;
            backoff.reset();
        }
        if established.is_some_and(|at| at.elapsed() > RECONNECT_RESET_AFTER) {
            backoff.reset();
        }
        let delay = backoff.next_delay_random();
        info!(router = %label, ?delay, "reconnecting session");
        tokio::time::sleep(delay).await;
    }
}

/// The router's proof that it holds the site secret (`base::challenge`), checked before the agent
/// sends it anything but a random nonce. Returns the proven router's peer ID and its nonce.
async fn challenge_router(
    client: &mut AgentControlClient<Channel>,
    shared: &Shared,
) -> Result<(String, Vec<u8>), SessionError> {
    let agent_nonce = challenge::random_bytes::<{ challenge::AGENT_NONCE_LEN }>();
    let request = ChallengeRequest {
        agent_nonce: agent_nonce.to_vec(),
    };
    let answer = tokio::time::timeout(AUTH_TIMEOUT, client.challenge(request))
        .await
        .map_err(|_| SessionError::AuthTimeout)?;
    let answer = match answer {
        Ok(answer) => answer.into_inner(),
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            return Err(SessionError::Unproven(
                "it answers no challenge (a router older than this agent, or not a hivenet router)"
                    .to_owned(),
            ));
        }
        Err(status) => {
            return Err(SessionError::Auth(format!(
                "challenge: {:?}: {}",
                status.code(),
                status.message()
            )));
        }
    };
    if !shared.secret.proof_key().router_proof_holds(
        &agent_nonce,
        &answer.router_nonce,
        &answer.router_peer_id,
        &answer.proof,
    ) {
        return Err(SessionError::Unproven(format!(
            "its proof for peer ID {:?} does not verify with the site secret",
            answer.router_peer_id
        )));
    }
    Ok((answer.router_peer_id, answer.router_nonce))
}

/// Challenges the router, then authenticates with a token bound to it and its nonce, and the
/// identity key's signature. `renewing`: the session's current token, when renewing it.
async fn authenticate(
    client: &mut AgentControlClient<Channel>,
    shared: &Shared,
    renewing: Option<String>,
) -> Result<AuthResponse, SessionError> {
    let (router_peer_id, router_nonce) = challenge_router(client, shared).await?;
    let proof = challenge::agent_proof(&shared.keypair, &router_nonce, &router_peer_id);
    let request = AuthRequest {
        token: shared.secret.auth_token(
            &shared.peer_id,
            &router_peer_id,
            &router_nonce,
            SystemTime::now(),
        ),
        peer_id: shared.peer_id.clone(),
        capacity: shared.config.capacity,
        router_nonce,
        public_key: proof.public_key,
        signature: proof.signature,
        session_token: renewing.unwrap_or_default(),
    };
    let response = tokio::time::timeout(AUTH_TIMEOUT, client.authenticate(request))
        .await
        .map_err(|_| SessionError::AuthTimeout)?;
    match response {
        Ok(response) if response.get_ref().router_peer_id != router_peer_id => {
            Err(SessionError::Auth(format!(
                "the router proved peer ID {router_peer_id:?} and then answered as {:?}",
                response.get_ref().router_peer_id
            )))
        }
        Ok(response) => Ok(response.into_inner()),
        // Only the status message: the router does not echo tokens, and neither do we.
        Err(status) if status.code() == tonic::Code::Unauthenticated => {
            Err(SessionError::Unauthenticated(status.message().to_owned()))
        }
        Err(status) => Err(SessionError::Auth(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
    }
}

fn register_message(shared: &Shared) -> AgentMessage {
    let config = &shared.config;
    AgentMessage {
        kind: Some(AgentKind::Register(Register {
            models: shared.models.clone(),
            capability: config.capability.as_str().to_owned(),
            capacity: config.capacity,
            engine: config.engine.as_str().to_owned(),
            tags: config.tags.clone(),
            region: config.region.clone(),
            version: config.version.clone(),
            deployment_id: config.deployment_id.clone(),
            replica_id: config.replica_id.clone(),
            organization: config.organization.clone(),
            machine: config.machine.clone(),
        })),
    }
}

fn heartbeat_message(shared: &Shared, link: &Link) -> AgentMessage {
    let sent_at_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    AgentMessage {
        kind: Some(AgentKind::Heartbeat(Heartbeat {
            sent_at_unix_ms,
            in_flight: shared.forward.in_flight.get(),
            backend_unhealthy: !*shared.backend_healthy.borrow(),
            connected_router_peer_ids: link.connected_peer_ids(),
            host: shared.host.borrow().clone(),
            unproven_routers: shared.unproven_routers.load(Ordering::Relaxed),
        })),
    }
}

fn signal_message(shared: &Shared) -> AgentMessage {
    let snapshot = *shared.engine.borrow();
    let count = |value: Option<f64>| value.unwrap_or(0.0).clamp(0.0, u32::MAX as f64) as u32;
    AgentMessage {
        kind: Some(AgentKind::Signal(RoutingSignal {
            in_flight: shared.forward.in_flight.get(),
            has_engine_metrics: snapshot.has_any(),
            kv_cache_utilization: snapshot.kv_cache_utilization.unwrap_or(0.0),
            running_requests: count(snapshot.running_requests),
            waiting_requests: count(snapshot.waiting_requests),
            engine: shared.engine_report.borrow().clone(),
        })),
    }
}

fn nonzero_ms(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// When to refresh a session of `ttl_ms`; `None` when the router gives no TTL.
fn refresh_after(ttl_ms: u64) -> Option<Duration> {
    nonzero_ms(ttl_ms).map(|ttl| ttl.mul_f64(REFRESH_AT_TTL_FRACTION))
}

/// One session from connect to its end; always returns why it ended.
async fn run_session(
    router: &Arc<str>,
    shared: &Arc<Shared>,
    link: &Link,
    established: &mut Option<Instant>,
) -> SessionError {
    match session_inner(router, shared, link, established).await {
        Ok(never) => match never {},
        Err(error) => error,
    }
}

enum Never {}

async fn session_inner(
    router: &Arc<str>,
    shared: &Arc<Shared>,
    link: &Link,
    established: &mut Option<Instant>,
) -> Result<Never, SessionError> {
    let endpoint = Endpoint::from_shared(router.to_string())
        .map_err(|error| SessionError::BadAddress(error.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let channel = endpoint.connect().await?;
    let mut client = AgentControlClient::new(channel);
    let auth = authenticate(&mut client, shared, None).await?;
    let tunnel_addr = multiaddr::first_dialable(&auth.tunnel_addrs)
        .ok_or_else(|| SessionError::NoTunnelAddr(auth.tunnel_addrs.clone()))?;
    if auth.shard_count == 0 {
        return Err(SessionError::NoShards);
    }
    let shard_count = u16::try_from(auth.shard_count).unwrap_or(u16::MAX);
    if link.authenticated(&auth.router_peer_id).await == Admit::Duplicate {
        return Err(SessionError::Duplicate(auth.router_peer_id));
    }
    if auth.routers_known {
        link.listed(&auth.routers);
    }

    let (to_router, outbound) = mpsc::channel::<AgentMessage>(OUTBOUND_QUEUE_CAPACITY);
    to_router
        .send(register_message(shared))
        .await
        .map_err(|_| SessionError::Ended)?;
    let outbound = futures_util::stream::unfold(outbound, |mut outbound| async move {
        outbound.recv().await.map(|message| (message, outbound))
    });
    let mut request = tonic::Request::new(outbound);
    let bearer = format!("Bearer {}", auth.session_token)
        .parse()
        .map_err(|_| SessionError::Open("session token is not a valid header value".to_owned()))?;
    request.metadata_mut().insert("authorization", bearer);
    let mut inbound = client
        .session(request)
        .await
        .map_err(|status| SessionError::Open(format!("{:?}: {}", status.code(), status.message())))?
        .into_inner();
    *established = Some(Instant::now());
    info!(
        %router,
        router_peer_id = %auth.router_peer_id,
        tunnel = %tunnel_addr,
        shards = shard_count,
        models = ?shared.models,
        "session open, registered"
    );

    let (token_to_tunnels, session_token) = watch::channel(auth.session_token.clone());
    // Dropped on every exit from this function: the tunnels close with the session.
    let mut tunnels = JoinSet::new();
    for shard in 0..shard_count {
        tunnels.spawn(tunnel::run_shard(
            router.clone(),
            shard,
            tunnel_addr.clone(),
            session_token.clone(),
            shared.forward.clone(),
            shared.tunnel_tls.clone(),
            shared.config.p2p_codec,
        ));
    }

    let heartbeat_every = shared
        .config
        .heartbeat_interval
        .or(nonzero_ms(auth.heartbeat_interval_ms))
        .unwrap_or(HEARTBEAT_INTERVAL_DEFAULT);
    let signal_every = shared
        .config
        .routing_signal_interval
        .or(nonzero_ms(auth.routing_signal_interval_ms))
        .unwrap_or(ROUTING_SIGNAL_INTERVAL_DEFAULT);
    let mut heartbeat = tokio::time::interval(heartbeat_every);
    heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut signal = tokio::time::interval(signal_every);
    signal.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut refresh_backoff = Backoff::reconnect();
    let mut refresh_at = refresh_after(auth.session_ttl_ms).map(|after| Instant::now() + after);
    let mut draining = shared.draining.clone();
    let mut left = false;
    let mut backend_healthy = shared.backend_healthy.clone();

    loop {
        tokio::select! {
            _ = async { drop(draining.wait_for(|draining| *draining).await) }, if !left => {
                // Heartbeats go on, so the session and its tunnels stay up for what is in flight.
                let leaving = AgentMessage { kind: Some(AgentKind::Leaving(Leaving {})) };
                to_router.send(leaving).await.map_err(|_| SessionError::Ended)?;
                left = true;
                info!(%router, "told the router this agent is leaving");
            }
            _ = heartbeat.tick() => {
                to_router.send(heartbeat_message(shared, link)).await.map_err(|_| SessionError::Ended)?;
            }
            // The backend's health changed: tell the router now, not at the next heartbeat.
            Ok(()) = backend_healthy.changed() => {
                to_router.send(heartbeat_message(shared, link)).await.map_err(|_| SessionError::Ended)?;
            }
            _ = signal.tick() => {
                to_router.send(signal_message(shared)).await.map_err(|_| SessionError::Ended)?;
            }
            _ = sleep_until_or_never(refresh_at) => {
                let current = token_to_tunnels.borrow().clone();
                match authenticate(&mut client, shared, Some(current)).await {
                    Ok(renewed) => {
                        let refresh = AgentMessage {
                            kind: Some(AgentKind::Refresh(SessionRefresh {
                                session_token: renewed.session_token.clone(),
                            })),
                        };
                        to_router.send(refresh).await.map_err(|_| SessionError::Ended)?;
                        token_to_tunnels.send_replace(renewed.session_token);
                        refresh_backoff.reset();
                        refresh_at = refresh_after(renewed.session_ttl_ms)
                            .map(|after| Instant::now() + after);
                        info!(%router, "session token refreshed");
                    }
                    Err(error) => {
                        let delay = refresh_backoff.next_delay_random();
                        warn!(%router, %error, ?delay, "session refresh failed, retrying");
                        refresh_at = Some(Instant::now() + delay);
                    }
                }
            }
            message = inbound.message() => match message {
                Ok(Some(message)) => match message.kind {
                    Some(RouterKind::Refused(refused)) => {
                        return Err(SessionError::Refused(refused.reason));
                    }
                    Some(RouterKind::Registered(registered)) => {
                        info!(%router, agent_id = %registered.agent_id, "router confirmed registration");
                    }
                    Some(RouterKind::HeartbeatAck(ack)) if ack.routers_known => {
                        link.listed(&ack.routers);
                    }
                    Some(RouterKind::HeartbeatAck(_)) | None => {}
                },
                Ok(None) => return Err(SessionError::Ended),
                Err(status) => {
                    return Err(SessionError::Stream(format!("{:?}: {}", status.code(), status.message())));
                }
            },
            Some(joined) = tunnels.join_next() => {
                // Shard tasks loop forever; one ending means it panicked.
                if let Err(error) = joined {
                    warn!(%router, %error, "a tunnel task ended unexpectedly");
                }
            }
        }
    }
}

async fn sleep_until_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_happens_at_eighty_percent_of_the_ttl() {
        assert_eq!(refresh_after(60_000), Some(Duration::from_secs(48)));
        assert_eq!(refresh_after(0), None);
        assert_eq!(nonzero_ms(0), None);
        assert_eq!(nonzero_ms(250), Some(Duration::from_millis(250)));
    }
}
