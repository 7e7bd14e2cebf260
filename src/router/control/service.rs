//! The agent gRPC service (`AgentControl`): authentication and the session stream.
//!
//! Error handling: a refused credential is logged with the agent's claimed peer ID and the reason,
//! never with the token or the secret, and answered `Unauthenticated`.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::Stream;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::base::challenge;
use crate::base::credentials::{Claims, SESSION_AUDIENCE, TokenError, unix_seconds};
use crate::logic::routing::AgentId;
use crate::logic::routing::EngineSignals;
use crate::logic::snapshot::Capability;
use crate::router::control::ControlShared;
use crate::router::control::registry::Registration;
use crate::wire::proto::agent_control_server::AgentControl;
use crate::wire::proto::{
    AuthRequest, AuthResponse, ChallengeRequest, ChallengeResponse, HeartbeatAck, Refused,
    Registered, RouterMessage, agent_message, router_message,
};

pub struct ControlService {
    pub shared: std::sync::Arc<ControlShared>,
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<RouterMessage, Status>> + Send>>;

fn bearer(request_metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    request_metadata
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

impl ControlService {
    /// The session an authentication renews: the one its `session_token` names, when this run of
    /// the router issued it to the same peer and it is still live. An agent renews its session
    /// before the token expires (at 80 % of the TTL) and keeps its session serial, so its
    /// tunnels, which present the serial, stay attached.
    fn renewed_session(&self, request: &AuthRequest) -> Option<u64> {
        if request.session_token.is_empty() {
            return None;
        }
        let shared = &self.shared;
        let claims = shared
            .secret
            .verify_session(&request.session_token, &shared.settings.session_issuer)
            .ok()?;
        (claims.sub == request.peer_id
            && shared
                .registry()
                .is_session_live(AgentId(claims.sid as u32)))
        .then_some(claims.sid)
    }
}

fn reply(kind: router_message::Kind) -> RouterMessage {
    RouterMessage { kind: Some(kind) }
}

#[tonic::async_trait]
impl AgentControl for ControlService {
    async fn challenge(
        &self,
        request: Request<ChallengeRequest>,
    ) -> Result<Response<ChallengeResponse>, Status> {
        let request = request.into_inner();
        if request.agent_nonce.len() != challenge::AGENT_NONCE_LEN {
            return Err(Status::invalid_argument(format!(
                "agent_nonce must be {} bytes",
                challenge::AGENT_NONCE_LEN
            )));
        }
        let shared = &self.shared;
        let router_peer_id = &shared.settings.router_peer_id;
        let (router_nonce, proof) = shared.secret.proof_key().answer(
            router_peer_id,
            &request.agent_nonce,
            unix_ms(SystemTime::now()),
        );
        Ok(Response::new(ChallengeResponse {
            router_peer_id: router_peer_id.clone(),
            router_nonce: router_nonce.to_vec(),
            proof: proof.to_vec(),
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthRequest>,
    ) -> Result<Response<AuthResponse>, Status> {
        let remote = request.remote_addr();
        let request = request.into_inner();
        let shared = &self.shared;
        let refused = |counter: &std::sync::atomic::AtomicU64, reason: &dyn std::fmt::Display| {
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer_id = %request.peer_id, ?remote, %reason, "agent authentication refused");
            Status::unauthenticated(format!("authentication refused: {reason}"))
        };
        let refusals = &shared.auth_refusals;
        let router_peer_id = &shared.settings.router_peer_id;
        let now_wall = SystemTime::now();
        let claims = shared
            .secret
            .verify_auth(
                &request.token,
                router_peer_id,
                &request.router_nonce,
                now_wall,
                shared.settings.agent_token_max_lifetime,
            )
            .map_err(|error| match error {
                TokenError::Unbound => refused(&refusals.unbound, &error),
                _ => refused(&refusals.token, &error),
            })?;
        if claims.sub != request.peer_id {
            return Err(refused(
                &refusals.request,
                &"token subject does not match peer_id",
            ));
        }
        if request.capacity == 0 {
            refusals.request.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(peer_id = %request.peer_id, "agent authentication refused: capacity 0");
            return Err(Status::invalid_argument("capacity must be positive"));
        }
        challenge::check_agent_proof(
            &request.peer_id,
            &request.public_key,
            &request.signature,
            &request.router_nonce,
            router_peer_id,
        )
        .map_err(|error| refused(&refusals.identity, &error))?;
        // Spent last, so a request refused for another reason does not burn the agent's nonce;
        // spent before anything is granted, so it grants once.
        let now_ms = unix_ms(now_wall);
        shared
            .secret
            .proof_key()
            .check_nonce(&request.router_nonce, router_peer_id, now_ms)
            .and_then(|nonce| shared.spend_nonce(nonce, now_ms))
            .map_err(|error| refused(&refusals.nonce, &error))?;

        let ttl = shared.settings.session_ttl;
        let now = Instant::now();
        let session = match self.renewed_session(&request) {
            Some(session) => {
                shared
                    .registry()
                    .session_refreshed(AgentId(session as u32), now + ttl);
                tracing::info!(peer_id = %request.peer_id, session, "agent session renewed");
                session
            }
            None => {
                let session = shared.next_session();
                shared.registry().session_opened(
                    AgentId(session as u32),
                    request.peer_id.clone(),
                    now + ttl,
                    now,
                );
                tracing::info!(peer_id = %request.peer_id, session, "agent authenticated");
                session
            }
        };
        let session_token = shared.secret.sign(&Claims {
            sub: request.peer_id.clone(),
            aud: SESSION_AUDIENCE.to_owned(),
            iat: Some(unix_seconds(now_wall)),
            exp: unix_seconds(now_wall + ttl),
            sid: session,
            nonce: None,
            rtr: Some(shared.settings.session_issuer.clone()),
        });
        let (routers, routers_known) = shared.site_routers.to_proto();
        Ok(Response::new(AuthResponse {
            session_token,
            session_ttl_ms: ttl.as_millis() as u64,
            router_peer_id: router_peer_id.clone(),
            tunnel_addrs: vec![shared.settings.tunnel_announce.clone()],
            shard_count: shared.settings.shard_count as u32,
            heartbeat_interval_ms: shared.settings.heartbeat_interval.as_millis() as u64,
            routing_signal_interval_ms: shared.settings.routing_signal_interval.as_millis() as u64,
            routers,
            routers_known,
        }))
    }

    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<crate::wire::proto::AgentMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        let shared = self.shared.clone();
        let token = bearer(request.metadata())
            .ok_or_else(|| Status::unauthenticated("session token required"))?;
        let claims = shared
            .secret
            .verify_session(token, &shared.settings.session_issuer)
            .map_err(|error| {
                tracing::warn!(reason = %error, "agent session refused");
                Status::unauthenticated(format!("session refused: {error}"))
            })?;
        let agent = AgentId(claims.sid as u32);
        if !shared.registry().is_session_live(agent) {
            return Err(Status::unauthenticated("session unknown or closed"));
        }
        let Some(kill) = shared.attach_session(agent) else {
            return Err(Status::already_exists("session stream already open"));
        };
        let peer_id = claims.sub.clone();
        let mut inbound = request.into_inner();
        let (to_agent, from_router) = mpsc::channel::<Result<RouterMessage, Status>>(16);
        tokio::spawn(async move {
            let reason = run_session(&shared, agent, &peer_id, &mut inbound, &to_agent, kill).await;
            tracing::info!(%peer_id, session = agent.0, reason, "agent session ended");
            shared.close_session(agent).await;
        });
        let stream = futures_util::stream::unfold(from_router, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Serves one session stream until it ends; returns why it ended.
async fn run_session(
    shared: &std::sync::Arc<ControlShared>,
    agent: AgentId,
    peer_id: &str,
    inbound: &mut Streaming<crate::wire::proto::AgentMessage>,
    to_agent: &mpsc::Sender<Result<RouterMessage, Status>>,
    mut kill: tokio::sync::oneshot::Receiver<&'static str>,
) -> &'static str {
    loop {
        let message = tokio::select! {
            reason = &mut kill => return reason.unwrap_or("closed by router"),
            message = inbound.message() => message,
        };
        let message = match message {
            Ok(Some(message)) => message,
            Ok(None) => return "agent closed the stream",
            Err(_) => return "stream error",
        };
        let Some(kind) = message.kind else { continue };
        let now = Instant::now();
        match kind {
            agent_message::Kind::Register(register) => match validate_registration(register) {
                Ok(registration) => {
                    tracing::info!(%peer_id, session = agent.0, models = ?registration.models,
                        capability = registration.capability.as_str(), capacity = registration.capacity,
                        engine = %registration.engine, "agent registered");
                    let events = shared.registry().register(agent, registration, now);
                    shared.apply(events).await;
                    let registered = reply(router_message::Kind::Registered(Registered {
                        agent_id: peer_id.to_owned(),
                    }));
                    if to_agent.send(Ok(registered)).await.is_err() {
                        return "agent stopped reading";
                    }
                }
                Err(reason) => {
                    tracing::warn!(%peer_id, reason, "agent registration refused");
                    let refused = reply(router_message::Kind::Refused(Refused {
                        reason: reason.to_owned(),
                    }));
                    let _ = to_agent.send(Ok(refused)).await;
                    return "registration refused";
                }
            },
            agent_message::Kind::Leaving(_) => {
                tracing::info!(%peer_id, session = agent.0, "agent is shutting down: routing nothing new to it");
                let events = shared.registry().leaving(agent, now);
                shared.apply(events).await;
            }
            agent_message::Kind::Heartbeat(heartbeat) => {
                let events = {
                    let mut registry = shared.registry();
                    registry.routers_reported(agent, heartbeat.connected_router_peer_ids);
                    registry.unproven_routers_reported(agent, heartbeat.unproven_routers);
                    registry.host_reported(
                        agent,
                        heartbeat
                            .host
                            .map(crate::router::control::agent_reports::bound_host),
                    );
                    registry.heartbeat(
                        agent,
                        heartbeat.in_flight,
                        !heartbeat.backend_unhealthy,
                        now,
                    )
                };
                shared.apply(events).await;
                // The site's routers, so the agent finds every one (discovery).
                let (routers, routers_known) = shared.site_routers.to_proto();
                let ack = reply(router_message::Kind::HeartbeatAck(HeartbeatAck {
                    sent_at_unix_ms: heartbeat.sent_at_unix_ms,
                    routers,
                    routers_known,
                }));
                if to_agent.send(Ok(ack)).await.is_err() {
                    return "agent stopped reading";
                }
            }
            agent_message::Kind::Signal(signal) => {
                let engine = engine_signals(&signal);
                let events = {
                    let mut registry = shared.registry();
                    registry.engine_reported(
                        agent,
                        signal
                            .engine
                            .map(crate::router::control::agent_reports::bound_engine),
                    );
                    registry.signal(agent, signal.in_flight, engine)
                };
                shared.apply(events).await;
            }
            agent_message::Kind::Refresh(refresh) => {
                match shared
                    .secret
                    .verify_session(&refresh.session_token, &shared.settings.session_issuer)
                {
                    Ok(claims) if claims.sid == u64::from(agent.0) => {
                        let remaining = Duration::from_secs(
                            claims.exp.saturating_sub(unix_seconds(SystemTime::now())),
                        );
                        shared.registry().session_refreshed(agent, now + remaining);
                    }
                    _ => {
                        tracing::warn!(%peer_id, "session refresh refused");
                        return "session refresh refused";
                    }
                }
            }
        }
    }
}

/// Checks an agent's `Register` message and turns it into the registry's [`Registration`]: a
/// known capability, a positive capacity, 1 or more non-blank model IDs (trimmed) and IDs of at
/// most 256 bytes. The reason of a refusal is sent back to the agent in `Refused`. Pure: the
/// session stream and the fuzz target (`fuzz/fuzz_targets/grpc_control.rs`) call it.
/// The engine signals a routing signal carries; none when the agent's engine reports no metrics.
pub fn engine_signals(signal: &crate::wire::proto::RoutingSignal) -> EngineSignals {
    if signal.has_engine_metrics {
        let report = signal.engine.as_ref();
        EngineSignals {
            kv_cache_utilization: Some(signal.kv_cache_utilization),
            running_requests: Some(f64::from(signal.running_requests)),
            waiting_requests: Some(f64::from(signal.waiting_requests)),
            avg_ttft_seconds: report.and_then(|report| report.avg_ttft_seconds),
            avg_itl_seconds: report.and_then(|report| report.avg_itl_seconds),
        }
    } else {
        EngineSignals::default()
    }
}

/// `organization` or `machine` of a registration: a metric label value, so bounded like a model
/// ID; an agent that sends none (an older one) is `Unknown`, the agent's own default.
fn metadata_label(value: &str) -> Result<String, &'static str> {
    let value = value.trim();
    if value.len() > 256 {
        return Err("organization and machine are at most 256 characters");
    }
    Ok(if value.is_empty() { "Unknown" } else { value }.to_owned())
}

pub fn validate_registration(
    register: crate::wire::proto::Register,
) -> Result<Registration, &'static str> {
    let capability = Capability::parse(&register.capability)
        .ok_or("capability must be llm, embedding or reranker")?;
    if register.capacity == 0 {
        return Err("capacity must be positive");
    }
    let models: Vec<String> = register
        .models
        .into_iter()
        .map(|model| model.trim().to_owned())
        .filter(|model| !model.is_empty())
        .collect();
    if models.is_empty() {
        return Err("at least one model is required");
    }
    if models.iter().any(|model| model.len() > 256) {
        return Err("model IDs are at most 256 characters");
    }
    // A metric label value: bounded, like a model ID.
    let deployment_id = register.deployment_id.trim().to_owned();
    if deployment_id.len() > 256 {
        return Err("deployment ID is at most 256 characters");
    }
    let replica_id = register.replica_id.trim().to_owned();
    if replica_id.len() > 256 {
        return Err("replica ID is at most 256 characters");
    }
    let organization = metadata_label(&register.organization)?;
    let machine = metadata_label(&register.machine)?;
    Ok(Registration {
        models,
        capability,
        capacity: register.capacity,
        engine: register.engine,
        region: register.region,
        tags: register.tags,
        version: register.version,
        deployment_id,
        replica_id,
        organization,
        machine,
    })
}
