//! Redirect tokens spent once for the whole site (seed `run-several-routers.md`, "What is
//! shared"): while the store answers, a token's nonce is claimed there (`SET NX`) after the
//! owner shard's local check; while it does not, each router checks single use on its own
//! ("Redirect tokens while the store is unreachable").
//!
//! A redirect request is the one request that waits on the store here, for at most
//! [`SPEND_WAIT`]. Every claim goes to the store, whatever the sync core's view of it; the
//! local check stands in for the store only when the claim got no answer in time and the store
//! counts as unreachable (three failed rounds). While the store is up, a claim that cannot be
//! made in time — the queue to the sync core is full, the store is slow, or its answer is lost
//! — is [`Spend::Refused`]: deciding it locally is what let a flood of fresh tokens replay one
//! on several routers (issue 37, finding 5). Deciding locally on the view alone, without asking,
//! accepted a token the store would have refused from a router's start until its first round
//! (the view starts unreachable) and for up to a round after the store came back: a token
//! replayed on two routers was accepted twice while the store answered both (`sync::simulation`,
//! invariant 5: 397 of the first 400 seeds).
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

impl Spend {
    /// What the site says of a claim: the store's `answer` (`Some(true)`: taken now, first use;
    /// `None`: no answer in time, or the claim was not sent), and whether the store counts as
    /// `up` (the sync core's view) when the answer is due.
    pub fn of(answer: Option<bool>, up: bool) -> Spend {
        match answer {
            Some(true) => Spend::First,
            Some(false) => Spend::Again,
            None if up => Spend::Refused,
            None => Spend::Unchecked,
        }
    }

    /// Whether a token this router has not seen before is accepted: `None` refuses the request
    /// for now (`redirect_token_unchecked`), as accepting it unchecked could accept a replay on
    /// another router.
    pub fn accepts(self) -> Option<bool> {
        match self {
            Spend::First | Spend::Unchecked => Some(true),
            Spend::Again => Some(false),
            Spend::Refused => None,
        }
    }
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
        let (reply, answer) = oneshot::channel();
        let sent = self
            .claims
            .try_send(Claim {
                nonce,
                ttl_ms,
                reply,
            })
            .is_ok();
        let answer = if sent {
            // The store failed the claim, or did not answer in time: no answer.
            monoio::time::timeout(SPEND_WAIT, answer)
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        Spend::of(answer, self.up.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_decides_whenever_it_answers_and_the_local_check_only_when_it_is_unreachable() {
        for up in [true, false] {
            assert_eq!(Spend::of(Some(true), up).accepts(), Some(true));
            assert_eq!(Spend::of(Some(false), up).accepts(), Some(false));
        }
        assert_eq!(Spend::of(None, true).accepts(), None, "up: refused for now");
        assert_eq!(Spend::of(None, false), Spend::Unchecked);
    }
}
