//! Several routers, one site: the limits every router enforces are shared through a Valkey store
//! (seed `run-several-routers.md`).
//!
//! # Key components
//! - [`config`]: the `--sync-*` flags, checked.
//! - [`entry`]: one router's usage of one round, in the compact versioned encoding the store
//!   carries (pure).
//! - [`counted`]: what this router counts of the other routers' daily usage, and which of their
//!   batches each count holds (pure).
//! - [`round`]: the shards' usage into an entry and back, the backlog held while the store is
//!   unreachable, the daily totals' fields (pure).
//! - [`site`]: live and silent routers, the store's health, and the share of each limit they leave
//!   this router (pure).
//! - [`whole`]: whether another router's daily totals, as read, hold all its usage of the day:
//!   the epoch each heartbeat says its totals are whole in, and the routers read whole (pure).
//! - [`store`]: the Valkey connection (direct or through Sentinel, password, TLS), the commands
//!   of a round, and the check that the store's ACL allows every one of them.
//! - [`claim`]: one process per router ID: the claim each process holds in the store, and what
//!   a start-up or a round does when another process holds it (pure).
//! - [`core`]: the sync core's thread, running the round every `--sync-interval`.
//! - [`tokens`]: redirect tokens spent once for the whole site.
//!
//! # Architecture
//! ```text
//! shards ──TakeUsage──► sync core ──one transaction per round──► Valkey
//!        ◄─ApplyRemote,Share─┘   ◄──heartbeats, other routers' entries─┘
//! ```
//! The request path never waits on the store: admission runs against the shard's buckets and the
//! [`crate::logic::limits::Share`] the last round left it. The buckets' arithmetic lives in
//! `crate::logic::limits`; how usage maps onto the owner shards' holders in
//! `crate::router::shard::owner::quotas`.

pub mod claim;
pub mod core;
pub mod counted;
pub mod daily_fields;
pub mod entry;
pub mod journal;
pub mod levels;
pub mod pool_store;
pub mod pools;
pub mod redirect_claims;
pub mod republish;
pub mod round;
#[cfg(test)]
mod simulation;
pub mod site;
pub mod store;
pub mod whole;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::logic::limits::Share;
use crate::router::metrics::histogram::cumulative;
use crate::router::metrics::{Collect, Family};

/// `hivenet_sync_tick_seconds` buckets.
pub const TICK_SECONDS_BUCKETS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];

/// The sync core's metrics (seed, "Monitor"), written by the sync core only.
#[derive(Debug, Default)]
pub struct SyncMetrics {
    /// 1 while the store answers.
    pub up: AtomicI64,
    /// Other live routers, as last seen.
    pub peers: AtomicI64,
    /// Silent routers whose share the limits keep free (`Share::Shared`'s `silent`).
    pub silent_routers: AtomicI64,
    /// What of each limit is left to silent routers, in millionths (`silent / (live + silent)`).
    pub silent_share_ppm: AtomicI64,
    /// Live routers that missed their last heartbeat (`Share::Shared`'s `late`): daily budgets
    /// leave them their part, as they do silent routers'. Kept through an outage, as that part is.
    pub late_routers: AtomicI64,
    /// Router records in the store this router could not read, each bad value once.
    pub malformed_records_total: AtomicU64,
    /// Age of the latest peer usage when applied, in milliseconds.
    pub lag_ms: AtomicI64,
    /// Until the occupancy credits' settle window ends, in milliseconds, as of the last round.
    pub settle_remaining_ms: AtomicI64,
    /// Rounds that failed to reach the store (`hivenet_sync_errors_total{kind="unreachable"}`).
    pub errors_total: AtomicU64,
    /// Commands the store's ACL refused, in a round, a credit call, or the check of a new
    /// connection (`hivenet_sync_errors_total{kind="permission"}`).
    pub permission_errors_total: AtomicU64,
    /// 1 while another process holds this router's ID and this one has stepped down.
    pub router_id_conflict: AtomicI64,
    /// Routers the agents report a connection to that the store does not list.
    pub unknown_routers: AtomicI64,
    /// Routers `--sync-min-routers` counts past those the store lists (`Share::Shared`'s
    /// `unlisted`): daily budgets leave each its part of the whole budget.
    pub unlisted_routers: AtomicI64,
    /// Live routers whose daily totals this router has not read whole since the store lost its
    /// data (`Share::Shared`'s `unread`, `sync::whole`); in an outage, those of the last round
    /// the store answered, whose daily budgets are held.
    pub unread_routers: AtomicI64,
    /// Bytes of usage entries published (for the benchmark's bytes per round).
    pub published_bytes_total: AtomicU64,
    /// `--sync-journal` writes after a failed round, and writes or removals that failed.
    pub journal_writes_total: AtomicU64,
    /// Checkpoints of this router's daily totals written to `--sync-journal`.
    pub journal_checkpoints_total: AtomicU64,
    pub journal_errors_total: AtomicU64,
    /// Bytes of every command the sync core sent the store: rounds, pools, credit grants and
    /// releases, checks (not the redirect claims' connection).
    pub store_written_bytes_total: AtomicU64,
    /// Bytes of every reply the store sent the sync core for those commands.
    pub store_read_bytes_total: AtomicU64,
    pub tick_seconds: Histogram,
    /// Occupancy credits: the duration of each refill (`hivenet_occupancy_credit_seconds`,
    /// `op="refill"`).
    pub credit_refill_seconds: Histogram,
    /// Credit calls to the store that failed.
    pub credit_errors_total: AtomicU64,
    /// Routers given up early because no agent was connected to them.
    pub credit_reclaims_total: AtomicU64,
}

/// A fixed-bucket histogram written by one thread and read at scrape time.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; TICK_SECONDS_BUCKETS.len() + 1],
    /// The sum, in microseconds.
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let index = TICK_SECONDS_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(TICK_SECONDS_BUCKETS.len());
        self.counts[index].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    /// One sample of the histogram with `labels`.
    fn sample_into(&self, family: &mut Family, labels: &[(&str, &str)]) {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect();
        let (buckets, count) = cumulative(&TICK_SECONDS_BUCKETS, &counts);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        family.histogram_sample(labels, &buckets, sum, count);
    }
}

impl SyncMetrics {
    /// The silent routers the share counts, and what of each limit it leaves them: none while
    /// each router enforces its share alone.
    pub fn set_share(&self, share: Share) {
        let (silent, ppm) = match share {
            Share::Shared { live, silent, .. } if silent > 0 => {
                let routers = u64::from(live.max(1)) + u64::from(silent);
                (silent, u64::from(silent) * 1_000_000 / routers)
            }
            _ => (0, 0),
        };
        let (late, unlisted, unread) = match share {
            Share::Shared {
                late,
                unlisted,
                unread,
                ..
            } => (i64::from(late), unlisted, unread),
            // Daily budgets keep the late routers' part of the last round the store answered
            // through the outage that follows (`limits::daily`): so does the gauge.
            Share::Alone { unread, .. } => (self.late_routers.load(Ordering::Relaxed), 0, unread),
            Share::Whole => (0, 0, 0),
        };
        self.late_routers.store(late, Ordering::Relaxed);
        self.unread_routers
            .store(i64::from(unread), Ordering::Relaxed);
        self.unlisted_routers
            .store(i64::from(unlisted), Ordering::Relaxed);
        self.silent_routers
            .store(i64::from(silent), Ordering::Relaxed);
        self.silent_share_ppm.store(ppm as i64, Ordering::Relaxed);
    }
}

impl Collect for SyncMetrics {
    fn collect(&self, out: &mut Vec<Family>) {
        let gauges: [(&str, &str, f64); 11] = [
            (
                "hivenet_sync_up",
                "1 while the sync store answers; 0 while each router enforces its share alone.",
                self.up.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_peers",
                "Other live routers of the site, as last seen.",
                self.peers.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_silent_routers",
                "Routers that stopped heartbeating without leaving, whose share of every limit the live routers keep free.",
                self.silent_routers.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_late_routers",
                "Live routers that missed their last heartbeat; daily budgets leave them their part, as they do silent routers'.",
                self.late_routers.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_silent_share_ratio",
                "Fraction of each rate limit and daily budget the live routers leave to silent routers: silent / (live + silent).",
                self.silent_share_ppm.load(Ordering::Relaxed) as f64 / 1e6,
            ),
            (
                "hivenet_sync_unlisted_routers",
                "Routers --sync-min-routers counts that the sync store lists in no state; daily budgets leave each its part of the whole budget.",
                self.unlisted_routers.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_unread_routers",
                "Live routers whose daily totals this router has not read whole since the sync store lost its data; daily budgets leave each its part of the whole budget, and spend nothing in an outage that follows.",
                self.unread_routers.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_unknown_routers",
                "Routers the agents report a connection to that the sync store does not list.",
                self.unknown_routers.load(Ordering::Relaxed) as f64,
            ),
            (
                "hivenet_sync_lag_seconds",
                "Age of the latest peer usage when applied.",
                self.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0,
            ),
            (
                "hivenet_sync_settle_seconds_remaining",
                "Seconds until the occupancy credits' settle window ends (a store younger than the window, or one that lost its data); 0 when none holds.",
                self.settle_remaining_ms.load(Ordering::Relaxed) as f64 / 1000.0,
            ),
            (
                "hivenet_sync_router_id_conflict",
                "1 while another process holds this router's --router-id in the sync store and this one has stepped down.",
                self.router_id_conflict.load(Ordering::Relaxed) as f64,
            ),
        ];
        for (name, help, value) in gauges {
            let mut family = Family::gauge(name, help);
            family.sample(&[], value);
            out.push(family);
        }
        let mut errors = Family::counter(
            "hivenet_sync_errors_total",
            "Sync store failures: kind=unreachable, rounds that did not reach the store; kind=permission, commands the store's ACL refused.",
        );
        errors.sample(
            &[("kind", "unreachable")],
            self.errors_total.load(Ordering::Relaxed) as f64,
        );
        errors.sample(
            &[("kind", "permission")],
            self.permission_errors_total.load(Ordering::Relaxed) as f64,
        );
        out.push(errors);
        let counters = [
            (
                "hivenet_sync_malformed_records_total",
                "Router records in the sync store this router ignored because it could not read them, each bad value once.",
                &self.malformed_records_total,
            ),
            (
                "hivenet_sync_store_written_bytes_total",
                "Bytes of every command the sync core sent the store: rounds with their entries, daily totals and heartbeat, pools, credit grants and releases, permission checks.",
                &self.store_written_bytes_total,
            ),
            (
                "hivenet_sync_store_read_bytes_total",
                "Bytes of every reply the sync store sent the sync core: the round's reads (heartbeats, other routers' entries, pools), credit grants and releases, permission checks.",
                &self.store_read_bytes_total,
            ),
            (
                "hivenet_sync_published_bytes_total",
                "Bytes of usage entries this router published to the sync store.",
                &self.published_bytes_total,
            ),
            (
                "hivenet_sync_journal_writes_total",
                "Times this router wrote the usage it held back to its --sync-journal (after a round that did not reach the store).",
                &self.journal_writes_total,
            ),
            (
                "hivenet_sync_journal_checkpoints_total",
                "Times this router checkpointed its own daily totals in its --sync-journal (after a round that published them): a run that starts after the store lost its data writes them again.",
                &self.journal_checkpoints_total,
            ),
            (
                "hivenet_sync_journal_errors_total",
                "Writes, checkpoints or removals of the --sync-journal that failed: a crash before the store answers loses the usage held back since.",
                &self.journal_errors_total,
            ),
            (
                "hivenet_occupancy_credit_errors_total",
                "Occupancy credit calls to the store that failed.",
                &self.credit_errors_total,
            ),
            (
                "hivenet_occupancy_credit_reclaims_total",
                "Routers given up early because no agent was connected to them.",
                &self.credit_reclaims_total,
            ),
        ];
        for (name, help, value) in counters {
            let mut family = Family::counter(name, help);
            family.sample(&[], value.load(Ordering::Relaxed) as f64);
            out.push(family);
        }
        let mut tick =
            Family::histogram("hivenet_sync_tick_seconds", "Duration of one sync round.");
        self.tick_seconds.sample_into(&mut tick, &[]);
        out.push(tick);
        let mut credit = Family::histogram(
            "hivenet_occupancy_credit_seconds",
            "Duration of one occupancy credit call to the store.",
        );
        self.credit_refill_seconds
            .sample_into(&mut credit, &[("op", "refill")]);
        out.push(credit);
    }
}

#[cfg(test)]
mod tests;
