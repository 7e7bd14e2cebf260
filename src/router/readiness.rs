//! Readiness: whether this router can serve what it would otherwise serve, for `GET /ready` on
//! the API port and on `--metrics-port` (a load balancer's or Kubernetes' readiness probe).
//! `/health` stays liveness: 200 while the process runs, 503 only while it drains.
//!
//! Owns one flag per reason a running router is not ready; every core that learns something
//! sets it, the probes read it. It must not decide anything about a request: a request that
//! reaches a router that is not ready is served (or refused) as usual.
//!
//! # Rules
//! - With `--sync-store valkey`, a router is not ready until a sync round has reached the store
//!   and read today's totals. Before that it refuses every key with a daily budget
//!   (`429 token_limit_exceeded`) and admits nothing on a model with an occupancy budget: it
//!   started during a store outage, or its first round has not run yet.
//! - Once it has reached the store it stays ready through later outages: it then serves within
//!   its share (seed `run-several-routers.md`, "When the store is unreachable"), as every other
//!   router of the site does, so steering traffic away would only move it.
//! - A draining router (SIGTERM) is not ready.
//!
//! Cost: two relaxed atomic loads per probe; nothing on the request path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Why a router is not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// SIGTERM: the router drains and leaves.
    Draining,
    /// No sync round has reached the store since start: daily budgets and occupancy budgets
    /// cannot be served yet.
    SyncStoreNotReached,
    /// `GET /ready/budgets` only: the store is younger than the settle window, or lost its data
    /// less than a window ago; no occupancy credit is granted on a budget until it ends.
    Settling,
}

impl NotReady {
    /// The reason, as the probe's JSON body names it.
    pub fn reason(self) -> &'static str {
        match self {
            NotReady::Draining => "draining",
            NotReady::SyncStoreNotReached => "sync_store_not_reached",
            NotReady::Settling => "settling",
        }
    }

    /// The probe's whole `503` body: `{"status":"not_ready","reason":…,"message":…}`.
    pub fn body(self) -> &'static [u8] {
        match self {
            NotReady::Draining => {
                b"{\"status\":\"not_ready\",\"reason\":\"draining\",\"message\":\"the router is shutting down\"}"
            }
            NotReady::SyncStoreNotReached => {
                b"{\"status\":\"not_ready\",\"reason\":\"sync_store_not_reached\",\"message\":\"no sync round has reached the store since start: keys with a daily budget and models with an occupancy budget cannot be served yet\"}"
            }
            NotReady::Settling => {
                b"{\"status\":\"not_ready\",\"reason\":\"settling\",\"message\":\"the store is younger than the settle window or lost its data: models with an occupancy budget admit nothing until it ends\"}"
            }
        }
    }

    /// [`NotReady::body`] with `seconds_left` of a settle window added.
    pub fn body_with_seconds_left(self, seconds_left: u64) -> Vec<u8> {
        let mut body = self.body().to_vec();
        if self == NotReady::Settling {
            body.pop();
            body.extend_from_slice(b",\"seconds_left\":");
            body.extend_from_slice(itoa::Buffer::new().format(seconds_left).as_bytes());
            body.push(b'}');
        }
        body
    }
}

/// The `200` body of a ready router.
pub const READY_BODY: &[u8] = b"{\"status\":\"ready\"}";

/// The router's readiness, shared by the cores (one per process).
#[derive(Debug)]
pub struct Readiness {
    /// Set at start with `--sync-store valkey`, cleared by the sync core's first round that
    /// reached the store.
    store_not_reached: AtomicBool,
    draining: AtomicBool,
    /// When the occupancy credits' settle window ends (unix ms; 0: none), set by the sync core
    /// each round: `GET /ready/budgets` on `--metrics-port`.
    budgets_settle_at_ms: AtomicU64,
}

impl Readiness {
    /// `sync_store`: the router shares its limits through a store (`--sync-store valkey`).
    pub fn new(sync_store: bool) -> Readiness {
        Readiness {
            store_not_reached: AtomicBool::new(sync_store),
            draining: AtomicBool::new(false),
            budgets_settle_at_ms: AtomicU64::new(0),
        }
    }

    /// The sync core: the settle window ends at `unix_ms` (0 or past: none).
    pub fn budgets_settle_until(&self, unix_ms: u64) {
        self.budgets_settle_at_ms.store(unix_ms, Ordering::Relaxed);
    }

    /// `GET /ready/budgets`: whether models with an occupancy budget can be admitted on (the
    /// router is ready, and no settle window holds their credits back), else the reason and,
    /// while a window holds, the whole seconds left.
    pub fn check_budgets(&self, now_ms: u64) -> Result<(), (NotReady, u64)> {
        self.check().map_err(|not_ready| (not_ready, 0))?;
        let settles_at = self.budgets_settle_at_ms.load(Ordering::Relaxed);
        match settles_at.checked_sub(now_ms) {
            Some(left) if left > 0 => Err((NotReady::Settling, left.div_ceil(1000))),
            _ => Ok(()),
        }
    }

    /// The sync core: a round reached the store and today's totals are read.
    pub fn store_reached(&self) {
        self.store_not_reached.store(false, Ordering::Relaxed);
    }

    /// The control core: SIGTERM, the drain begins.
    pub fn draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Ready, or the first reason it is not (draining before the store).
    pub fn check(&self) -> Result<(), NotReady> {
        if self.draining.load(Ordering::Relaxed) {
            Err(NotReady::Draining)
        } else if self.store_not_reached.load(Ordering::Relaxed) {
            Err(NotReady::SyncStoreNotReached)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_store_a_router_is_ready_until_it_drains() {
        let readiness = Readiness::new(false);
        assert_eq!(readiness.check(), Ok(()));
        readiness.draining();
        assert_eq!(readiness.check(), Err(NotReady::Draining));
    }

    #[test]
    fn with_a_store_a_router_is_ready_once_a_round_reached_it() {
        let readiness = Readiness::new(true);
        assert_eq!(readiness.check(), Err(NotReady::SyncStoreNotReached));
        readiness.store_reached();
        assert_eq!(readiness.check(), Ok(()));
        readiness.draining();
        assert_eq!(readiness.check(), Err(NotReady::Draining));
    }

    #[test]
    fn budgets_are_ready_once_the_settle_window_ends() {
        let readiness = Readiness::new(true);
        assert_eq!(
            readiness.check_budgets(1_000),
            Err((NotReady::SyncStoreNotReached, 0))
        );
        readiness.store_reached();
        assert_eq!(readiness.check_budgets(1_000), Ok(()));
        readiness.budgets_settle_until(301_000);
        assert_eq!(
            readiness.check_budgets(1_000),
            Err((NotReady::Settling, 300))
        );
        assert_eq!(
            readiness.check_budgets(300_001),
            Err((NotReady::Settling, 1))
        );
        assert_eq!(readiness.check_budgets(301_000), Ok(()));
        // `/ready` itself is not held back by the window.
        assert_eq!(readiness.check(), Ok(()));
        let body: serde_json::Value =
            serde_json::from_slice(&NotReady::Settling.body_with_seconds_left(42)).unwrap();
        assert_eq!(body["reason"], "settling");
        assert_eq!(body["seconds_left"], 42);
    }

    #[test]
    fn every_body_is_json_naming_its_reason() {
        for reason in [
            NotReady::Draining,
            NotReady::SyncStoreNotReached,
            NotReady::Settling,
        ] {
            let body: serde_json::Value = serde_json::from_slice(reason.body()).unwrap();
            assert_eq!(body["status"], "not_ready");
            assert_eq!(body["reason"], reason.reason());
        }
        let ready: serde_json::Value = serde_json::from_slice(READY_BODY).unwrap();
        assert_eq!(ready["status"], "ready");
    }
}
