//! What a round's outcome tells the rest of the router: the site's routers for the agents'
//! discovery, and the routers agents report that the store does not list; the routers
//! `--sync-min-routers` counts that it does not list; a failover noticed; a router reached by an
//! agent while cut off from the store; the store's bytes.

use super::*;

impl Round {
    /// Says once, from the round a run can tell a silent router (before it, the others may not
    /// have written their first record), that `--sync-min-routers` counts routers the store
    /// does not list, and what that holds back.
    pub(super) fn log_unlisted(&mut self) {
        let Share::Shared {
            round, unlisted, ..
        } = self.health.share()
        else {
            return;
        };
        if unlisted == 0 {
            self.unlisted_logged = false;
        } else if !self.unlisted_logged && round >= SILENCE_SHOWS_FROM_ROUND {
            self.unlisted_logged = true;
            tracing::warn!(
                unlisted,
                min_routers = self.settings.min_routers,
                "the sync store lists fewer routers than --sync-min-routers: each daily budget leaves every missing router its part of the whole budget, and each rate limit is split with it counted, until it is listed (set --sync-min-routers to the number of routers)"
            );
        }
    }

    /// Hands agents the live routers that advertise an address (none while the store is
    /// unreachable), and counts the routers agents report that the store does not list.
    pub(super) fn publish_site(&mut self) {
        let Some(peers) = self.health.peers() else {
            self.shared.site_routers.publish(None);
            self.metrics.unknown_routers.store(0, Ordering::Relaxed);
            return;
        };
        self.shared.site_routers.publish(Some(
            peers
                .advertised
                .iter()
                .map(|(peer_id, grpc_addr)| SiteRouter {
                    peer_id: peer_id.clone(),
                    grpc_addr: grpc_addr.clone(),
                })
                .collect(),
        ));
        let unknown = self
            .shared
            .reported_routers()
            .into_iter()
            .filter(|peer_id| peers.listed.binary_search(peer_id).is_err())
            .count();
        self.unknown_routers = unknown > 0;
        self.metrics
            .unknown_routers
            .store(unknown as i64, Ordering::Relaxed);
    }

    /// The store's primary has a new replication ID since the last connect: a failover (or a
    /// restart) that may have lost the latest writes.
    pub(super) fn notice_failover(&mut self, now_ms: u64) {
        let failovers = self.store.failovers();
        if failovers != self.failovers_seen {
            self.failovers_seen = failovers;
            tracing::warn!(
                "the sync store failed over or restarted: occupancy grants lost with it are guarded for the settle window, this router's daily totals are written again whole, and its rate usage of the last minute is published again"
            );
            self.credits.failed_over(now_ms);
            // Usage this router published that the others had not read yet may be gone.
            self.recent.store_may_have_lost();
            // Increments the promoted replica had not received are lost with the old primary and
            // no later increment brings them back: the totals are written whole once (the seed:
            // "a write lost in a failover is healed by the next one") and read again, as after a
            // data loss (`sync::simulation`).
            self.ledger.lost();
            self.remember_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            self.rewrite_daily = true;
            self.resync_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            // The promoted replica's levels miss the decrements it had not received: stale high,
            // every router anchored up to them (`sync::simulation`, seed 1,329). For a few
            // rounds they only lower the views, and the views lower them.
            self.anchor_lower_only_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
        }
    }

    /// A router cut off from the store admits nothing more once an agent connects to it again
    /// (seed, "A router that stops"): that agent may have reported it gone meanwhile, and the
    /// others may have taken its credits back. It admits again once the store answers.
    pub(super) async fn close_if_reached_while_cut_off(&mut self, answered: bool) {
        let sessions = self.shared.sessions_started();
        let closed = if answered {
            self.sessions_at_last_answer = sessions;
            false
        } else {
            self.closed || sessions > self.sessions_at_last_answer
        };
        if closed != self.closed {
            self.closed = closed;
            if closed {
                tracing::warn!(
                    "an agent connected while the sync store is unreachable: no request on a model with an occupancy budget is admitted until the store answers"
                );
            }
            self.shared
                .broadcast(|| ControlToShard::Credits(CreditNews::Closed(closed)))
                .await;
        }
    }

    /// `hivenet_sync_store_written_bytes_total` and `hivenet_sync_store_read_bytes_total`: the
    /// round's store, which also makes the credit calls between rounds.
    pub(super) fn count_store_bytes(&self) {
        self.metrics
            .store_written_bytes_total
            .store(self.store.written_bytes(), Ordering::Relaxed);
        self.metrics
            .store_read_bytes_total
            .store(self.store.read_bytes(), Ordering::Relaxed);
    }

    /// Takes the store's epoch as known. A new one means the store lost its data (restarted
    /// empty, or a failover to a replica that had not synced): today's totals are read again
    /// and this router's written again, whole.
    pub(super) async fn take_epoch(&mut self, epoch: &str) {
        if self.epoch.as_deref().is_some_and(|known| known != epoch) {
            tracing::warn!(
                "the sync store lost its data: reading today's totals again, writing this router's again and publishing its rate usage of the last minute again"
            );
            self.shared.broadcast(|| ControlToShard::RewriteDaily).await;
            self.ledger.lost();
            self.recent.store_may_have_lost();
            self.remember_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            self.resync = true;
            self.resync_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            // The other routers' records went with it: they age into silence as they were.
            self.sightings.store_lost_data();
        }
        self.epoch = Some(epoch.to_owned());
        self.whole_claim.learned(epoch);
        self.whole_reads.in_epoch(epoch);
    }
}
