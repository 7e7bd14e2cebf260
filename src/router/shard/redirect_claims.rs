//! Redirect tokens spent once for the whole site (seed `run-several-routers.md`, "What is
//! shared"): while the store answers, a token's nonce is claimed there (`SET NX`) after the
//! owner shard's local check; while it does not, each router checks single use on its own
//! ("Redirect tokens while the store is unreachable").
//!
//! A redirect request is the one request that waits on the store here, for at most
//! [`SPEND_WAIT`]; without an answer in time the local check decides, as during an outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// The longest a redirect request waits for the store.
pub const SPEND_WAIT: Duration = Duration::from_millis(200);
/// Claims waiting for the store at most; beyond it a claim is decided locally.
const QUEUE: usize = 256;

/// One claim: the token's nonce, how long to remember it, and where the answer goes (`true`:
/// first use in the site).
#[derive(Debug)]
pub struct Claim {
    pub nonce: [u8; 16],
    pub ttl_ms: u64,
    pub reply: oneshot::Sender<bool>,
}

/// The shards' handle (cheap to clone).
#[derive(Debug, Clone)]
pub struct SiteTokens {
    claims: mpsc::Sender<Claim>,
    /// Whether the store answers (the sync core's view, each round).
    up: Arc<AtomicBool>,
}

impl SiteTokens {
    /// The handle and the end the sync core serves.
    pub fn new() -> (SiteTokens, mpsc::Receiver<Claim>, Arc<AtomicBool>) {
        let (claims, served) = mpsc::channel(QUEUE);
        let up = Arc::new(AtomicBool::new(false));
        (
            SiteTokens {
                claims,
                up: up.clone(),
            },
            served,
            up,
        )
    }

    /// `Some(first use)` from the store; `None` when it cannot tell now (unreachable, slow, or
    /// too many claims waiting): the caller's local check decides.
    pub async fn spend(&self, nonce: [u8; 16], ttl_ms: u64) -> Option<bool> {
        if !self.up.load(Ordering::Relaxed) {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        self.claims
            .try_send(Claim {
                nonce,
                ttl_ms,
                reply,
            })
            .ok()?;
        monoio::time::timeout(SPEND_WAIT, answer).await.ok()?.ok()
    }
}
