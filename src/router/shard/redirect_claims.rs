//! Redirect tokens spent once for the whole site (seed `run-several-routers.md`, "What is
//! shared"): while the store answers, a token's nonce is claimed there (`SET NX`) after the
//! owner shard's local check; while it does not, each router checks single use on its own
//! ("Redirect tokens while the store is unreachable").
//!
//! A redirect request is the one request that waits on the store here, for at most
//! [`SPEND_WAIT`]. The local check stands in for the store only during an outage (the sync
//! core's view: three failed rounds). While the store is up, a claim that cannot be made in
//! time — the queue to the sync core is full, the store is slow, or its answer is lost — is
//! [`Spend::Refused`]: deciding it locally is what let a flood of fresh tokens replay one on
//! several routers (issue 37, finding 5).
//!
//! # Bounds
//! At most [`QUEUE`] claims wait for the sync core; it sends up to [`BATCH_MAX`] of them to the
//! store in one pipeline (`sync::redirect_claims`), so the store sees one round trip per batch,
//! not per token.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// The longest a redirect request waits for the store.
pub const SPEND_WAIT: Duration = Duration::from_millis(200);
/// Claims waiting for the sync core at most; a claim beyond it is refused while the store is up.
/// Two batches: the one in flight to the store and the next.
pub const QUEUE: usize = 2 * BATCH_MAX;
/// Claims sent to the store in one pipeline at most.
pub const BATCH_MAX: usize = 1024;

/// One claim: the token's nonce, how long to remember it, and where the answer goes (`true`:
/// first use in the site).
#[derive(Debug)]
pub struct Claim {
    pub nonce: [u8; 16],
    pub ttl_ms: u64,
    pub reply: oneshot::Sender<bool>,
}

/// What the site says of a token's nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// The store took the claim: the first use in the site.
    First,
    /// The store has it already: used elsewhere in the site.
    Again,
    /// The store is unreachable (the sync core's view): the router's own check decides.
    Unchecked,
    /// The store is up but the claim was not made in time: the request is refused.
    Refused,
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

    /// Claims `nonce` for the whole site, waiting at most [`SPEND_WAIT`].
    pub async fn spend(&self, nonce: [u8; 16], ttl_ms: u64) -> Spend {
        if !self.up.load(Ordering::Relaxed) {
            return Spend::Unchecked;
        }
        let (reply, answer) = oneshot::channel();
        if self
            .claims
            .try_send(Claim {
                nonce,
                ttl_ms,
                reply,
            })
            .is_err()
        {
            return Spend::Refused;
        }
        match monoio::time::timeout(SPEND_WAIT, answer).await {
            Ok(Ok(true)) => Spend::First,
            Ok(Ok(false)) => Spend::Again,
            // The store failed the claim or did not answer in time. Once the sync core counts
            // the store as unreachable the local check decides; until then, refused.
            Ok(Err(_)) | Err(_) if !self.up.load(Ordering::Relaxed) => Spend::Unchecked,
            Ok(Err(_)) | Err(_) => Spend::Refused,
        }
    }
}
