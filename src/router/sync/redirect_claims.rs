//! The sync core's side of redirect tokens spent once for the whole site: it claims each nonce
//! the shards hand over ([`crate::router::shard::redirect_claims::SiteTokens`]) in the store, on a
//! connection of its own.

use tokio::sync::mpsc;

use super::store::Store;
use crate::router::shard::redirect_claims::Claim;

/// The sync core's side: claims each nonce in the store until the process ends. Runs on its own
/// connection, so a redirect never waits behind a round.
pub async fn serve(mut store: Store, mut claims: mpsc::Receiver<Claim>) {
    while let Some(claim) = claims.recv().await {
        let nonce = hex::encode(claim.nonce);
        match store.spend_token(&nonce, claim.ttl_ms).await {
            Ok(fresh) => {
                let _ = claim.reply.send(fresh);
            }
            // Dropping the reply leaves the decision to the router's own check.
            Err(error) => tracing::debug!(%error, "redirect token not checked in the sync store"),
        }
    }
}
