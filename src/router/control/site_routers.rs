//! The site's routers as agents find them (seed, run-several-routers, "Let agents find every
//! router"): the live routers of the site that advertise a gRPC address (`--advertise-grpc-addr`).
//! The sync core writes the list once per round ([`SiteRouters::publish`]); the control service
//! reads it for every authentication response and heartbeat ack ([`SiteRouters::current`]).
//!
//! Owns only the last published list. Must not: decide which routers are live (the sync core's
//! heartbeats in the store do), or hand out a list while the store is unreachable — `None` then,
//! which agents read as "change nothing".
//!
//! Without a sync store the router is its own site: start-up publishes just this router when it
//! advertises an address ([`SiteRouters::single`]). A sync core, when configured, replaces that
//! with `publish(None)` until its first round reaches the store.
//!
//! Cost: `current()` takes a read lock for an `Arc` clone; `publish` runs once a round.

use std::sync::{Arc, RwLock};

/// One router of the site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteRouter {
    /// The router's peer ID (its `AuthResponse.router_peer_id`).
    pub peer_id: String,
    /// `host:port` agents dial for its gRPC service (`--advertise-grpc-addr`).
    pub grpc_addr: String,
}

/// The last published list; `None` until one is published, and while the store is unreachable.
#[derive(Debug, Default)]
pub struct SiteRouters {
    current: RwLock<Option<Arc<[SiteRouter]>>>,
}

impl SiteRouters {
    /// A router without a sync store: it alone, when it advertises an address; else an empty
    /// list (nothing to find, but known).
    pub fn single(router_peer_id: &str, advertise_grpc_addr: Option<&str>) -> SiteRouters {
        let routers = SiteRouters::default();
        let own = advertise_grpc_addr.map(|grpc_addr| SiteRouter {
            peer_id: router_peer_id.to_owned(),
            grpc_addr: grpc_addr.to_owned(),
        });
        routers.publish(Some(own.into_iter().collect()));
        routers
    }

    /// Called by the sync core each round: `Some(list)` = the live routers that advertise an
    /// address (including this one if it advertises); `None` = store unreachable (hand out no
    /// list).
    pub fn publish(&self, routers: Option<Vec<SiteRouter>>) {
        let routers = routers.map(Arc::from);
        *self.current.write().expect("site routers lock poisoned") = routers;
    }

    /// What the agents are handed now.
    pub fn current(&self) -> Option<Arc<[SiteRouter]>> {
        self.current
            .read()
            .expect("site routers lock poisoned")
            .clone()
    }

    /// [`SiteRouters::current`] as the protocol carries it: `(routers, routers_known)`.
    pub fn to_proto(&self) -> (Vec<crate::wire::proto::SiteRouter>, bool) {
        match self.current() {
            None => (Vec::new(), false),
            Some(routers) => (
                routers
                    .iter()
                    .map(|router| crate::wire::proto::SiteRouter {
                        peer_id: router.peer_id.clone(),
                        grpc_addr: router.grpc_addr.clone(),
                    })
                    .collect(),
                true,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_router_without_a_store_lists_itself_when_it_advertises() {
        let routers = SiteRouters::single("12D3router", Some("router-0.headless:50051"));
        let current = routers.current().expect("known");
        assert_eq!(
            &*current,
            &[SiteRouter {
                peer_id: "12D3router".to_owned(),
                grpc_addr: "router-0.headless:50051".to_owned(),
            }]
        );
        let (listed, known) = routers.to_proto();
        assert!(known);
        assert_eq!(listed[0].grpc_addr, "router-0.headless:50051");
        let quiet = SiteRouters::single("12D3router", None);
        assert_eq!(quiet.current().as_deref(), Some(&[][..]));
    }

    #[test]
    fn no_list_is_not_an_empty_list() {
        let routers = SiteRouters::default();
        assert_eq!(routers.current(), None);
        assert_eq!(routers.to_proto(), (Vec::new(), false));
        routers.publish(Some(Vec::new()));
        assert_eq!(routers.to_proto(), (Vec::new(), true));
        routers.publish(None);
        assert_eq!(routers.to_proto(), (Vec::new(), false), "store unreachable");
    }
}
