//! Per-shard counters, and the families they give at scrape time ([`family`] builds and encodes them).
//!
//! Each shard owns one [`ShardMetrics`] and is its only writer (relaxed atomic adds on a cache line
//! no other core writes), so counting costs no contention; the control core reads them when
//! `/metrics` is scraped and labels every series with `shard`.

pub mod family;
pub mod histogram;
pub mod http_server;

pub use family::{Collect, Family, encode};

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use histogram::cumulative;
use http_server::STATUS_CODES;

#[derive(Debug, Default)]
#[repr(align(128))]
pub struct ShardMetrics {
    pub connections_accepted_total: AtomicU64,
    pub connections_open: AtomicI64,
    /// Connections this shard accepted and gave to the owner of their key (`shard::handoff`).
    pub connections_handed_off_total: AtomicU64,
    pub requests_total: AtomicU64,
    responses_by_status: [AtomicU64; STATUS_CODES.len()],
    responses_other_total: AtomicU64,
    pub upstream_errors_total: AtomicU64,
    pub client_disconnects_total: AtomicU64,
    pub queued_total: AtomicU64,
    pub queue_timeouts_total: AtomicU64,
    pub input_tokens_total: AtomicU64,
    pub output_tokens_total: AtomicU64,
    pub usage_missing_total: AtomicU64,
    /// Visits refused because this shard's messages to other shards were backed up.
    pub mesh_full_total: AtomicU64,
    /// Messages to other shards waiting for room in a full ring (`shard::outbox`).
    pub mesh_deferred: AtomicI64,
    /// Messages to other shards dropped because the deferred queue was at its bound.
    pub mesh_dropped_total: AtomicU64,
    pub tunnels_open: AtomicI64,
    /// Requests forwarded and not yet finished on this shard.
    pub in_flight: AtomicI64,
    /// Requests being served on this shard, from their head to their last byte (queued, held
    /// and forwarded alike): what a graceful shutdown waits for.
    pub requests_open: AtomicI64,
    /// Requests that did not fit B2 at once and parked (counted on the model's owner).
    pub admission_parked_total: AtomicU64,
    /// Occupancy reservations the reaper released because their release was lost.
    pub admission_reaped_total: AtomicU64,
    /// Forwards that failed retryably and were tried again (another agent or step).
    pub forward_retries_total: AtomicU64,
    /// Hold at zero: how holds ended and how long they lasted (counted on the requester).
    pub holds: crate::logic::hold::HoldMetrics,
    /// `http_server_*`: requests by method, route and status (`http_server`).
    pub http_server: http_server::HttpServerMetrics,
}

impl ShardMetrics {
    pub fn count_response(&self, status: u16) {
        match STATUS_CODES.iter().position(|code| *code == status) {
            Some(index) => self.responses_by_status[index].fetch_add(1, Ordering::Relaxed),
            None => self.responses_other_total.fetch_add(1, Ordering::Relaxed),
        };
    }

    pub fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    pub fn gauge(gauge: &AtomicI64, delta: i64) {
        gauge.fetch_add(delta, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicI64, value: i64) {
        gauge.store(value, Ordering::Relaxed);
    }
}

/// Every shard's series, each labelled with its `shard`.
impl Collect for [std::sync::Arc<ShardMetrics>] {
    fn collect(&self, out: &mut Vec<Family>) {
        for (name, kind, help, get) in SHARD_SERIES {
            let mut family = match kind {
                Kind::Counter => Family::counter(name, help),
                Kind::Gauge => Family::gauge(name, help),
            };
            for (shard, metrics) in self.iter().enumerate() {
                family.sample(&[("shard", &shard.to_string())], get(metrics) as f64);
            }
            out.push(family);
        }
        out.push(responses(self));
        out.extend(holds(self));
        out.extend(http_server::families(
            self.iter().map(|metrics| &metrics.http_server),
        ));
    }
}

/// `hivenet_shard_responses_total{shard,code}`: only the codes a shard answered with.
fn responses(shards: &[std::sync::Arc<ShardMetrics>]) -> Family {
    let mut family = Family::counter("hivenet_shard_responses_total", "Responses by HTTP status.");
    for (shard, metrics) in shards.iter().enumerate() {
        let shard = shard.to_string();
        for (index, code) in STATUS_CODES.iter().enumerate() {
            let value = metrics.responses_by_status[index].load(Ordering::Relaxed);
            if value > 0 {
                family.sample(
                    &[("shard", &shard), ("code", &code.to_string())],
                    value as f64,
                );
            }
        }
        let other = metrics.responses_other_total.load(Ordering::Relaxed);
        if other > 0 {
            family.sample(&[("shard", &shard), ("code", "other")], other as f64);
        }
    }
    family
}

/// `hivenet_wake_holds_total{outcome}` and the `hivenet_wake_hold_seconds` histogram, summed
/// over the shards (a hold is one router's, whichever shard held it).
fn holds(shards: &[std::sync::Arc<ShardMetrics>]) -> [Family; 2] {
    use crate::logic::hold::{HOLD_SECONDS_BUCKETS, HoldEnded};
    let mut outcomes = Family::counter(
        "hivenet_wake_holds_total",
        "Hold-at-zero requests by how their hold ended (released, expired, full, cancelled).",
    );
    for outcome in HoldEnded::ALL {
        let total: u64 = shards
            .iter()
            .map(|metrics| metrics.holds.outcome(outcome))
            .sum();
        outcomes.sample(&[("outcome", outcome.as_str())], total as f64);
    }
    let mut counts = [0u64; HOLD_SECONDS_BUCKETS.len() + 1];
    let mut sum = 0.0;
    for metrics in shards {
        let (shard_counts, seconds) = metrics.holds.durations();
        for (total, count) in counts.iter_mut().zip(shard_counts) {
            *total += count;
        }
        sum += seconds;
    }
    let mut seconds = Family::histogram(
        "hivenet_wake_hold_seconds",
        "How long requests were held for a model waking from zero.",
    );
    let (buckets, count) = cumulative(&HOLD_SECONDS_BUCKETS, &counts);
    seconds.histogram_sample(&[], &buckets, sum, count);
    [outcomes, seconds]
}

enum Kind {
    Counter,
    Gauge,
}

type Getter = fn(&ShardMetrics) -> i128;

/// The plain per-shard series: name, type, help and how to read it.
const SHARD_SERIES: [(&str, Kind, &str, Getter); 19] = [
    (
        "hivenet_shard_connections_accepted_total",
        Kind::Counter,
        "Client connections accepted by the shard.",
        |m| m.connections_accepted_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_connections_open",
        Kind::Gauge,
        "Client connections open on the shard.",
        |m| m.connections_open.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_connections_handed_off_total",
        Kind::Counter,
        "Client connections the shard accepted and gave to the shard that owns their first request's key.",
        |m| m.connections_handed_off_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_requests_total",
        Kind::Counter,
        "Client requests parsed by the shard.",
        |m| m.requests_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_upstream_errors_total",
        Kind::Counter,
        "Forwards that failed on the tunnel or at the agent.",
        |m| m.upstream_errors_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_client_disconnects_total",
        Kind::Counter,
        "Requests whose client went away before the response ended.",
        |m| m.client_disconnects_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_queued_total",
        Kind::Counter,
        "Requests that waited in a model capacity queue (counted on the model's owner shard).",
        |m| m.queued_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_queue_timeouts_total",
        Kind::Counter,
        "Requests whose capacity wait reached the request timeout.",
        |m| m.queue_timeouts_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_input_tokens_total",
        Kind::Counter,
        "Exact input tokens read from responses.",
        |m| m.input_tokens_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_output_tokens_total",
        Kind::Counter,
        "Exact output tokens read from responses.",
        |m| m.output_tokens_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_usage_missing_total",
        Kind::Counter,
        "Successful responses that carried no usage.",
        |m| m.usage_missing_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_mesh_full_total",
        Kind::Counter,
        "Visits to other shards refused because this shard's messages to them were backed up (4,096 waiting for room in their rings).",
        |m| m.mesh_full_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_mesh_deferred",
        Kind::Gauge,
        "Messages to other shards waiting for room in a full mesh ring.",
        |m| m.mesh_deferred.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_mesh_dropped_total",
        Kind::Counter,
        "Messages to other shards dropped because the deferred queue was at its bound.",
        |m| m.mesh_dropped_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_tunnels_open",
        Kind::Gauge,
        "Tunnel connections from agents held by the shard.",
        |m| m.tunnels_open.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_in_flight",
        Kind::Gauge,
        "Requests forwarded by the shard and not yet finished.",
        |m| m.in_flight.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_admission_parked_total",
        Kind::Counter,
        "Requests that waited for room in a model's occupancy budget (B2).",
        |m| m.admission_parked_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_admission_reaped_total",
        Kind::Counter,
        "Occupancy reservations released by the reaper because their release was lost.",
        |m| m.admission_reaped_total.load(Ordering::Relaxed) as i128,
    ),
    (
        "hivenet_shard_forward_retries_total",
        Kind::Counter,
        "Forwards that failed before answering and were tried again on another agent or step.",
        |m| m.forward_retries_total.load(Ordering::Relaxed) as i128,
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn shard_series_carry_the_shard_label() {
        let metrics = Arc::new(ShardMetrics::default());
        metrics.count_response(200);
        metrics.count_response(418);
        let shards = [metrics.clone(), Arc::new(ShardMetrics::default())];
        let mut families = Vec::new();
        shards[..].collect(&mut families);
        let out = encode(families);
        assert!(out.contains("hivenet_shard_responses_total{shard=\"0\",code=\"200\"} 1"));
        assert!(out.contains("hivenet_shard_responses_total{shard=\"0\",code=\"other\"} 1"));
        assert!(out.contains("hivenet_shard_requests_total{shard=\"1\"} 0"));
        assert!(out.contains("hivenet_wake_hold_seconds_bucket{le=\"+Inf\"} 0"));
    }
}
