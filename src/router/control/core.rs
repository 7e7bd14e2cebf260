//! The control core's start: its listeners (agent gRPC, tunnels, `/metrics`), its watchers
//! (`auth.yaml`, policies, agent health) and the loop that answers the shards' messages, all on
//! the control core's `tokio` runtime. The state they share is [`ControlShared`].

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use super::{
    ControlShared, admin, auth_reload, metrics_http, policy_reload, service, tunnel_accept,
};
use crate::router::shard::messages::{AdminCall, ControlToShard, ShardToControl};
use crate::router::shard::queues::QueueFullCounts;

/// Runs the control core until the process ends. Returns once every listener is bound, so the
/// caller can report start-up errors; the services keep running on `runtime`.
pub fn start(
    runtime: &tokio::runtime::Runtime,
    shared: Arc<ControlShared>,
    mut from_shards: mpsc::Receiver<ShardToControl>,
) -> anyhow::Result<()> {
    let settings = shared.settings.clone();
    let grpc_listener = runtime
        .block_on(tokio::net::TcpListener::bind(settings.grpc_address))
        .map_err(|error| {
            anyhow::anyhow!("cannot bind --grpc-port {}: {error}", settings.grpc_address)
        })?;
    let tunnel_listener = runtime
        .block_on(tokio::net::TcpListener::bind(settings.tunnel_address))
        .map_err(|error| {
            anyhow::anyhow!(
                "cannot bind --p2p-port {}: {error}",
                settings.tunnel_address
            )
        })?;
    let metrics_listener = runtime
        .block_on(tokio::net::TcpListener::bind(settings.metrics_address))
        .map_err(|error| {
            anyhow::anyhow!(
                "cannot bind --metrics-port {}: {error}",
                settings.metrics_address
            )
        })?;

    let service = crate::wire::proto::agent_control_server::AgentControlServer::new(
        service::ControlService {
            shared: shared.clone(),
        },
    );
    runtime.spawn(async move {
        let incoming = tokio_listener_stream(grpc_listener);
        if let Err(error) = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!(%error, "agent gRPC server stopped");
        }
    });
    runtime.spawn(tunnel_accept::run(tunnel_listener, shared.clone()));
    runtime.spawn(metrics_http::run(metrics_listener, shared.clone()));
    if let Some(path) = settings.auth_config_file.clone() {
        let mode = if shared.dynamic_keys.is_some() {
            crate::logic::auth::config::ApiMode::Dynamic
        } else {
            crate::logic::auth::config::ApiMode::ApiKey
        };
        runtime.spawn(auth_reload::watch(path, mode, shared.clone()));
    }
    runtime.spawn(policy_reload::watch(shared.clone()));
    // A new policy set changes every model's effective policy: republish the snapshot.
    let mut policy_changes = shared.policies.subscribe();
    let publisher = shared.clone();
    runtime.spawn(async move {
        // The first snapshot goes out at start-up: models whose policy names a provider are
        // resolvable before any agent registers.
        loop {
            let policies = policy_changes.borrow_and_update().clone();
            publisher.publish_snapshot(&policies).await;
            if policy_changes.changed().await.is_err() {
                break;
            }
        }
    });

    let health_shared = shared.clone();
    runtime.spawn(async move {
        let mut ticker = tokio::time::interval(health_shared.settings.health_check_interval);
        loop {
            ticker.tick().await;
            let events = health_shared.registry().check_health(Instant::now());
            health_shared.apply(events).await;
        }
    });

    // Admin calls, one at a time, each on a blocking thread: a body is parsed and
    // validated there (up to 16 MiB, `doc_guard` bounds its shape), so neither the parse nor the
    // checks against every key stall agent gRPC or `/metrics`, which this thread serves.
    let (to_admin, mut admin_calls) =
        mpsc::channel::<AdminCall>(crate::router::shard::queues::ADMIN_QUEUE_CAPACITY);
    let admin_shared = shared.clone();
    runtime.spawn(async move {
        while let Some(call) = admin_calls.recv().await {
            let shared = admin_shared.clone();
            let handled = tokio::task::spawn_blocking(move || {
                let reply = admin::handle(&shared, call.method, &call.target, &call.body);
                let _ = call.reply.send(reply);
            })
            .await;
            if let Err(error) = handled {
                // The shard answers 503 when the reply is dropped.
                tracing::error!(%error, "an admin call failed");
            }
        }
    });

    runtime.spawn(async move {
        while let Some(message) = from_shards.recv().await {
            let now = Instant::now();
            let events = match message {
                ShardToControl::Admin(call) => {
                    queue_admin_call(&to_admin, &shared.queue_full, call);
                    continue;
                }
                ShardToControl::TunnelUp { agent, shard } => {
                    let up = {
                        let mut registry = shared.registry();
                        registry
                            .is_session_live(agent)
                            .then(|| registry.tunnel_up(agent, shard, now))
                    };
                    match up {
                        Some(events) => events,
                        None => {
                            // A TLS tunnel's token was checked on its shard, which cannot see
                            // the sessions: one whose session has ended goes at once.
                            shared.tunnel_refusals.refused(
                                None,
                                Some(agent.0),
                                "session not live (TLS tunnel)",
                            );
                            shared
                                .send_to_shard(shard, ControlToShard::CloseTunnel { agent })
                                .await;
                            Vec::new()
                        }
                    }
                }
                ShardToControl::TunnelDown { agent, shard } => {
                    tracing::info!(session = agent.0, shard, "agent tunnel closed");
                    shared.registry().tunnel_down(agent, shard, now)
                }
            };
            shared.apply(events).await;
        }
    });
    Ok(())
}

/// The answer to an admin call that finds the admin queue full: `503` in the admin envelope, at
/// once, rather than an answer after its caller gave up.
const ADMIN_QUEUE_FULL: &[u8] = b"{\"error\":\"too many admin calls waiting, retry later\"}";

/// Queues an admin call for the blocking thread that serves them, or answers it `503` when
/// [`crate::router::shard::queues::ADMIN_QUEUE_CAPACITY`] calls already wait (counted).
fn queue_admin_call(
    to_admin: &mpsc::Sender<AdminCall>,
    queue_full: &QueueFullCounts,
    call: AdminCall,
) {
    match to_admin.try_send(call) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(call)) => {
            queue_full.to_admin();
            let _ = call.reply.send(crate::router::shard::messages::AdminReply {
                status: 503,
                body: ADMIN_QUEUE_FULL.to_vec(),
                stream: None,
            });
        }
        // The admin task is gone (the process is stopping): the shard answers 503 when the
        // reply is dropped.
        Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
}

fn tokio_listener_stream(
    listener: tokio::net::TcpListener,
) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| {
            let _ = stream.set_nodelay(true);
            stream
        });
        Some((accepted, listener))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::oneshot;

    fn call() -> (
        AdminCall,
        oneshot::Receiver<crate::router::shard::messages::AdminReply>,
    ) {
        let (reply, answer) = oneshot::channel();
        let call = AdminCall {
            method: crate::wire::http::request::Method::Get,
            target: bytes::Bytes::from_static(b"/admin/api-keys"),
            body: bytes::Bytes::new(),
            reply,
        };
        (call, answer)
    }

    #[test]
    fn an_admin_call_that_finds_the_admin_queue_full_is_answered_503_at_once() {
        let full = QueueFullCounts::default();
        let (to_admin, mut admin_calls) = mpsc::channel(1);
        let (first, mut first_answer) = call();
        queue_admin_call(&to_admin, &full, first);
        let (second, mut second_answer) = call();
        queue_admin_call(&to_admin, &full, second);
        let reply = second_answer.try_recv().expect("answered at once");
        assert_eq!(reply.status, 503);
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": "too many admin calls waiting, retry later"})
        );
        let counted: Vec<_> = full.series().filter(|(_, _, count)| *count > 0).collect();
        assert_eq!(counted, vec![("to_admin", "admin", 1)]);
        // The first call is queued, unanswered, for the admin thread.
        assert!(first_answer.try_recv().is_err());
        assert!(admin_calls.try_recv().is_ok());
    }
}
