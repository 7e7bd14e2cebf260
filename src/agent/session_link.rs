//! What a session task and the session driver (`sessions`) say to each other: the reports a
//! session sends ([`SessionToDriver`]) and the session's end of the driver ([`Link`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::config::grpc_uri;
use super::discovery::{Admit, LIST_ENTRIES_MAX, Listed, SessionId};

/// What a session task tells the driver.
#[derive(Debug)]
pub enum SessionToDriver {
    Authenticated {
        session: SessionId,
        peer_id: String,
        reply: oneshot::Sender<Admit>,
    },
    Down {
        session: SessionId,
    },
    Listed {
        session: SessionId,
        routers: Vec<Listed>,
    },
}

/// A session task's end of the driver.
#[derive(Debug, Clone)]
pub struct Link {
    session: SessionId,
    to_driver: mpsc::Sender<SessionToDriver>,
    /// Peer IDs of the routers with an admitted session, sorted.
    connected: watch::Receiver<Arc<[String]>>,
}

impl Link {
    /// The link of session `session`: its reports go to `to_driver`.
    pub fn new(
        session: SessionId,
        to_driver: mpsc::Sender<SessionToDriver>,
        connected: watch::Receiver<Arc<[String]>>,
    ) -> Link {
        Link {
            session,
            to_driver,
            connected,
        }
    }

    /// The session authenticated with `peer_id`: may it register?
    pub async fn authenticated(&self, peer_id: &str) -> Admit {
        let (reply, answer) = oneshot::channel();
        let report = SessionToDriver::Authenticated {
            session: self.session,
            peer_id: peer_id.to_owned(),
            reply,
        };
        if self.to_driver.send(report).await.is_err() {
            return Admit::Duplicate;
        }
        answer.await.unwrap_or(Admit::Duplicate)
    }

    /// The session ended; the task reconnects unless aborted.
    pub async fn down(&self) {
        let _ = self
            .to_driver
            .send(SessionToDriver::Down {
                session: self.session,
            })
            .await;
    }

    /// The routers a router listed (`routers_known` was true).
    pub fn listed(&self, routers: &[crate::wire::proto::SiteRouter]) {
        let routers = routers
            .iter()
            .take(LIST_ENTRIES_MAX)
            .map(|router| Listed {
                peer_id: router.peer_id.trim().to_owned(),
                uri: match router.grpc_addr.trim() {
                    "" => String::new(),
                    address => grpc_uri(address),
                },
            })
            .collect();
        // Dropped when the driver is behind: the next heartbeat ack lists them again.
        let _ = self.to_driver.try_send(SessionToDriver::Listed {
            session: self.session,
            routers,
        });
    }

    /// Peer IDs of the routers this agent has a live session with now.
    pub fn connected_peer_ids(&self) -> Vec<String> {
        self.connected.borrow().to_vec()
    }

    /// Waits until `peer_id` is no longer reached by any session, or `at_most`.
    pub async fn wait_released(&self, peer_id: &str, at_most: Duration) {
        let mut connected = self.connected.clone();
        let released = connected.wait_for(|peers| !peers.iter().any(|peer| peer == peer_id));
        let _ = tokio::time::timeout(at_most, released).await;
    }
}
