//! The sync core's side of redirect tokens spent once for the whole site: it claims each nonce
//! the shards hand over ([`crate::router::shard::redirect_claims::SiteTokens`]) in the store, on a
//! connection of its own, up to
//! [`BATCH_MAX`](crate::router::shard::redirect_claims::BATCH_MAX) claims in one pipeline.
//!
//! # Performance
//! One round trip per batch: while the store answers a batch, the next one gathers in the
//! queue, so the claims a router can make per second grow with the batch, not with the round
//! trip (`benches/redirect_claims.rs` drives this path at 10,000 tokens a second).

use tokio::sync::mpsc;

use super::store::Store;
use crate::router::shard::redirect_claims::{BATCH_MAX, Claim};

/// The sync core's side: claims the nonces in the store until the process ends. Runs on its own
/// connection, so a redirect never waits behind a round.
pub async fn serve(mut store: Store, mut claims: mpsc::Receiver<Claim>) {
    let mut batch: Vec<Claim> = Vec::with_capacity(BATCH_MAX);
    let mut nonces: Vec<(String, u64)> = Vec::with_capacity(BATCH_MAX);
    while claims.recv_many(&mut batch, BATCH_MAX).await > 0 {
        // A request that stopped waiting was refused: its nonce stays unclaimed, so the token
        // is still good once, elsewhere.
        batch.retain(|claim| !claim.reply.is_closed());
        nonces.clear();
        nonces.extend(
            batch
                .iter()
                .map(|claim| (hex::encode(claim.nonce), claim.ttl_ms)),
        );
        match store.spend_tokens(&nonces).await {
            Ok(fresh) => {
                for (claim, fresh) in batch.drain(..).zip(fresh) {
                    let _ = claim.reply.send(fresh);
                }
            }
            // Dropping the replies refuses the claims while the store counts as up, and leaves
            // them to the router's own check once it does not (`SiteTokens::spend`).
            Err(error) => {
                tracing::debug!(%error, claims = batch.len(), "redirect tokens not checked in the sync store");
            }
        }
        batch.clear();
    }
}
