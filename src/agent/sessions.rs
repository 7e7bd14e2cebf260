//! The session driver: one task that owns [`Discovery`] and the session tasks it asks for. It
//! spawns a task per `Open`, aborts it on `Close` (its tunnels go with it), answers the session
//! tasks' reports, and publishes the peer IDs of the routers reached for heartbeats.
//!
//! Must not: decide anything itself — every rule lives in `discovery`, which is pure.
//!
//! Error handling: nothing here fails. A session task reports through [`Link`]; a list that finds
//! the driver's queue full is dropped (the next heartbeat ack brings another), while the reports
//! that change state (authenticated, down) wait for room.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};
use tracing::info;

use super::discovery::{Action, Discovery, SessionId};
use super::session;
use super::session_link::{Link, SessionToDriver};
use super::shared::Shared;

/// Reports queued towards the driver; a list finding it full is dropped, the rest wait.
const TO_DRIVER_QUEUE_CAPACITY: usize = 64;
/// How often the two-minute expiry of discovered routers is looked at.
const EXPIRY_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Runs the sessions of `starting` (the `--routers` list) and of every router discovered from
/// them, forever.
pub async fn run(shared: Arc<Shared>, starting: Vec<String>) {
    let (to_driver, mut reports) = mpsc::channel(TO_DRIVER_QUEUE_CAPACITY);
    let (publish_connected, connected) = watch::channel::<Arc<[String]>>(Arc::from(Vec::new()));
    let mut discovery = Discovery::new(&starting);
    let mut tasks = JoinSet::new();
    let mut handles: HashMap<SessionId, AbortHandle> = HashMap::new();
    let mut expiry = tokio::time::interval(EXPIRY_CHECK_INTERVAL);
    let mut warned_over_limit = false;
    loop {
        for action in discovery.poll_actions() {
            match action {
                Action::Open { session, uri } => {
                    if *shared.draining.borrow() {
                        // Shutting down: a new session would register the agent again.
                        continue;
                    }
                    info!(router = %uri, session = session.0, "connecting to router");
                    let link = Link::new(session, to_driver.clone(), connected.clone());
                    let handle = tasks.spawn(session::run_router(uri, shared.clone(), link));
                    handles.insert(session, handle);
                }
                Action::Close { session } => {
                    if let Some(handle) = handles.remove(&session) {
                        info!(
                            session = session.0,
                            "closing the session of a discovered router"
                        );
                        handle.abort();
                    }
                }
            }
        }
        let peers = discovery.connected_peer_ids();
        if **connected.borrow() != *peers {
            publish_connected.send_replace(Arc::from(peers));
        }
        // Once: a site over the limit lists the same routers again in every heartbeat ack.
        if !warned_over_limit && discovery.ignored_over_limit() > 0 {
            warned_over_limit = true;
            tracing::warn!(
                kept = super::discovery::DISCOVERED_MAX,
                "the routers list more routers than an agent keeps: the rest get no session from this agent"
            );
        }
        tokio::select! {
            report = reports.recv() => match report {
                Some(SessionToDriver::Authenticated { session, peer_id, reply }) => {
                    let _ = reply.send(discovery.handle_authenticated(session, &peer_id));
                }
                Some(SessionToDriver::Down { session }) => {
                    discovery.handle_down(session, std::time::Instant::now());
                }
                Some(SessionToDriver::Listed { session, routers }) => {
                    discovery.handle_list(session, Some(&routers), std::time::Instant::now());
                }
                // The driver holds a sender itself: never closed.
                None => return,
            },
            _ = expiry.tick() => discovery.handle_tick(std::time::Instant::now()),
            Some(joined) = tasks.join_next() => {
                if let Err(error) = joined
                    && error.is_panic()
                {
                    tracing::error!(%error, "a session task panicked");
                }
            }
        }
    }
}
