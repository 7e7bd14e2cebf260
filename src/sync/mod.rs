//! Several routers, one site: the limits every router enforces are shared through a Valkey store
//! (seed `run-several-routers.md`).
//!
//! # Key components
//! - [`config`]: the `--sync-*` flags, checked.
//! - [`entry`]: one router's usage of one round, in the compact versioned encoding the store
//!   carries (pure).
//! - [`round`]: the shards' usage into an entry and back, the backlog held while the store is
//!   unreachable, the daily totals' fields (pure).
//! - [`site`]: live and silent routers, the store's health, and the share of each limit they leave
//!   this router (pure).
//! - [`store`]: the Valkey connection (direct or through Sentinel, password, TLS) and the
//!   commands of a round.
//! - [`core`]: the sync core's thread, running the round every `--sync-interval`.
//! - [`tokens`]: redirect tokens spent once for the whole site.
//!
//! # Architecture
//! ```text
//! shards ──TakeUsage──► sync core ──one transaction per round──► Valkey
//!        ◄─ApplyRemote,Share─┘   ◄──heartbeats, other routers' entries─┘
//! ```
//! The request path never waits on the store: admission runs against the shard's buckets and the
//! [`crate::limits::Share`] the last round left it. The buckets' arithmetic lives in
//! `crate::limits`; how usage maps onto the owner shards' holders in
//! `crate::shard::owner::quotas`.

pub mod config;
pub mod core;
pub mod credits;
pub mod entry;
pub mod pool_store;
pub mod round;
pub mod site;
pub mod store;
pub mod tokens;

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::metrics::family;

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
    /// Age of the latest peer usage when applied, in milliseconds.
    pub lag_ms: AtomicI64,
    pub errors_total: AtomicU64,
    /// Routers the agents report a connection to that the store does not list.
    pub unknown_routers: AtomicI64,
    /// Bytes of usage entries published (for the benchmark's bytes per round).
    pub published_bytes_total: AtomicU64,
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

    /// `labels`: the series' own labels, each followed by a comma (or empty).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (bound, count) in TICK_SECONDS_BUCKETS.iter().zip(&self.counts) {
            cumulative += count.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {cumulative}");
        }
        cumulative += self.counts[TICK_SECONDS_BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let series = labels.trim_end_matches(',');
        if series.is_empty() {
            let _ = writeln!(out, "{name}_sum {sum}");
            let _ = writeln!(out, "{name}_count {cumulative}");
        } else {
            let _ = writeln!(out, "{name}_sum{{{series}}} {sum}");
            let _ = writeln!(out, "{name}_count{{{series}}} {cumulative}");
        }
    }
}

impl SyncMetrics {
    pub fn render(&self, out: &mut String) {
        let gauges: [(&str, &str, i64); 3] = [
            (
                "hivenet_sync_up",
                "1 while the sync store answers; 0 while each router enforces its share alone.",
                self.up.load(Ordering::Relaxed),
            ),
            (
                "hivenet_sync_peers",
                "Other live routers of the site, as last seen.",
                self.peers.load(Ordering::Relaxed),
            ),
            (
                "hivenet_sync_unknown_routers",
                "Routers the agents report a connection to that the sync store does not list.",
                self.unknown_routers.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, value) in gauges {
            family(out, name, "gauge", help);
            let _ = writeln!(out, "{name} {value}");
        }
        let name = "hivenet_sync_lag_seconds";
        family(
            out,
            name,
            "gauge",
            "Age of the latest peer usage when applied.",
        );
        let lag = self.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        let _ = writeln!(out, "{name} {lag}");
        let name = "hivenet_sync_errors_total";
        family(
            out,
            name,
            "counter",
            "Sync rounds that failed to reach the store.",
        );
        let _ = writeln!(out, "{name} {}", self.errors_total.load(Ordering::Relaxed));
        let name = "hivenet_sync_published_bytes_total";
        family(
            out,
            name,
            "counter",
            "Bytes of usage entries this router published to the sync store.",
        );
        let _ = writeln!(
            out,
            "{name} {}",
            self.published_bytes_total.load(Ordering::Relaxed)
        );
        let name = "hivenet_sync_tick_seconds";
        family(out, name, "histogram", "Duration of one sync round.");
        self.tick_seconds.render(out, name, "");
        let name = "hivenet_occupancy_credit_seconds";
        family(
            out,
            name,
            "histogram",
            "Duration of one occupancy credit call to the store.",
        );
        self.credit_refill_seconds
            .render(out, name, "op=\"refill\",");
        let counters = [
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
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {}", value.load(Ordering::Relaxed));
        }
    }
}

#[cfg(test)]
mod tests;
