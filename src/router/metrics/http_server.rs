//! `http_server_request_duration_seconds{method,route,status_code}` and
//! `http_server_active_requests{method,route}` (the reference's "HTTP server metrics"), kept per
//! shard in relaxed atomics only that shard writes and summed over the shards at scrape time,
//! as the catalog defines one series per label set.
//!
//! A request is counted once it matched a route (`api::serve`); one refused before that (an
//! unknown path, a malformed head) has no `route` to carry and is counted in
//! `hivenet_shard_responses_total` only.
//!
//! Owns the status codes the router answers with (`STATUS_CODES`); the parent's
//! `hivenet_shard_responses_total` labels its `code` with the same list.
//!
//! Memory: [`ENDPOINTS`] × ([`STATUS_LABELS`] histograms of 17 words + one gauge), about 34 KB
//! per shard, allocated once with the shard's metrics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Family;
use super::histogram::{REQUEST_SECONDS_BUCKETS, cumulative};

/// The `(method, route)` pairs a request can match: each API route with the method it accepts
/// (`HEAD` too for the two `GET` routes), and the admin routes by method. `route` is the path
/// template, so label values stay bounded.
pub const ENDPOINTS: [(&str, &str); 16] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/rerank"),
    ("GET", "/v1/models"),
    ("HEAD", "/v1/models"),
    ("GET", "/health"),
    ("HEAD", "/health"),
    ("GET", "/ready"),
    ("HEAD", "/ready"),
    ("GET", "/admin/*"),
    ("POST", "/admin/*"),
    ("PUT", "/admin/*"),
    ("DELETE", "/admin/*"),
    ("OTHER", "/admin/*"),
];

/// HTTP statuses the router answers with, for the `code` label; anything else is counted as other.
pub(super) const STATUS_CODES: [u16; 17] = [
    200, 307, 400, 401, 403, 404, 405, 408, 413, 429, 431, 499, 500, 502, 503, 504, 505,
];

/// The `status_code` values: the codes the router answers with, and `other` for any else.
const STATUS_LABELS: usize = STATUS_CODES.len() + 1;

/// One of [`ENDPOINTS`], by index (`api::endpoint` maps a route and method to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint(pub(crate) u8);

impl Endpoint {
    /// The endpoint at `index` of [`ENDPOINTS`]; panics past the end (a programming error).
    pub const fn at(index: usize) -> Endpoint {
        assert!(index < ENDPOINTS.len());
        Endpoint(index as u8)
    }
}

/// Observations per bucket of [`REQUEST_SECONDS_BUCKETS`] (the last above every bound), and
/// their sum in microseconds.
#[derive(Debug, Default)]
struct AtomicDurations {
    buckets: [AtomicU64; REQUEST_SECONDS_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl AtomicDurations {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = REQUEST_SECONDS_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(REQUEST_SECONDS_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

/// One shard's HTTP server counts (inside [`super::ShardMetrics`]).
#[derive(Debug)]
pub struct HttpServerMetrics {
    active: [AtomicI64; ENDPOINTS.len()],
    durations: Box<[[AtomicDurations; STATUS_LABELS]; ENDPOINTS.len()]>,
}

impl Default for HttpServerMetrics {
    fn default() -> Self {
        HttpServerMetrics {
            active: Default::default(),
            durations: Box::new(std::array::from_fn(|_| {
                std::array::from_fn(|_| AtomicDurations::default())
            })),
        }
    }
}

impl HttpServerMetrics {
    /// Counts a request as active until the returned guard drops, then observes its duration
    /// from `received_at` with the status the guard holds by then (499, the client left, unless
    /// the caller set one).
    pub fn begin(&self, endpoint: Endpoint, received_at: Instant) -> Exchange<'_> {
        self.active[usize::from(endpoint.0)].fetch_add(1, Ordering::Relaxed);
        Exchange {
            metrics: self,
            endpoint,
            received_at,
            status: 499,
        }
    }

    fn end(&self, endpoint: Endpoint, status: u16, elapsed: Duration) {
        let index = usize::from(endpoint.0);
        self.active[index].fetch_sub(1, Ordering::Relaxed);
        let status = STATUS_CODES
            .iter()
            .position(|code| *code == status)
            .unwrap_or(STATUS_CODES.len());
        self.durations[index][status].observe(elapsed);
    }
}

/// A request being served: active until dropped (see [`HttpServerMetrics::begin`]).
pub struct Exchange<'m> {
    metrics: &'m HttpServerMetrics,
    endpoint: Endpoint,
    received_at: Instant,
    /// The status answered; set it before the guard drops.
    pub status: u16,
}

impl Drop for Exchange<'_> {
    fn drop(&mut self) {
        self.metrics
            .end(self.endpoint, self.status, self.received_at.elapsed());
    }
}

/// The two families, summed over `shards`: every endpoint's active gauge (0 included, so a
/// dashboard sees the route), and a duration series per status it answered with.
pub fn families<'s>(shards: impl Iterator<Item = &'s HttpServerMetrics> + Clone) -> [Family; 2] {
    let mut active = Family::gauge(
        "http_server_active_requests",
        "Requests being served, by method and route.",
    );
    let mut durations = Family::histogram(
        "http_server_request_duration_seconds",
        "Time from a request's head to the end of its answer, by method, route and status.",
    );
    for (index, (method, route)) in ENDPOINTS.iter().enumerate() {
        let open: i64 = shards
            .clone()
            .map(|shard| shard.active[index].load(Ordering::Relaxed))
            .sum();
        active.sample(&[("method", method), ("route", route)], open as f64);
        for status in 0..STATUS_LABELS {
            let mut counts = [0u64; REQUEST_SECONDS_BUCKETS.len() + 1];
            let mut sum_micros = 0u64;
            for shard in shards.clone() {
                let series = &shard.durations[index][status];
                for (total, bucket) in counts.iter_mut().zip(&series.buckets) {
                    *total += bucket.load(Ordering::Relaxed);
                }
                sum_micros = sum_micros.saturating_add(series.sum_micros.load(Ordering::Relaxed));
            }
            if counts.iter().all(|count| *count == 0) {
                continue;
            }
            let code = STATUS_CODES
                .get(status)
                .map_or_else(|| "other".to_string(), u16::to_string);
            let (buckets, count) = cumulative(&REQUEST_SECONDS_BUCKETS, &counts);
            durations.histogram_sample(
                &[("method", method), ("route", route), ("status_code", &code)],
                &buckets,
                sum_micros as f64 / 1e6,
                count,
            );
        }
    }
    [active, durations]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exchange_is_active_until_dropped_and_observed_with_its_status() {
        let shards = [HttpServerMetrics::default(), HttpServerMetrics::default()];
        let chat = Endpoint::at(0);
        let mut exchange = shards[0].begin(chat, Instant::now());
        let text = encode_of(&shards);
        assert!(
            text.contains(
                "http_server_active_requests{method=\"POST\",route=\"/v1/chat/completions\"} 1\n"
            ),
            "{text}"
        );
        exchange.status = 429;
        drop(exchange);
        drop(shards[1].begin(chat, Instant::now()));
        drop(shards[1].begin(Endpoint::at(15), Instant::now()));
        let text = encode_of(&shards);
        assert!(
            text.contains(
                "http_server_active_requests{method=\"POST\",route=\"/v1/chat/completions\"} 0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("http_server_request_duration_seconds_count{method=\"POST\",route=\"/v1/chat/completions\",status_code=\"429\"} 1\n"),
            "{text}"
        );
        // A guard dropped without a status: the client left.
        assert!(
            text.contains("http_server_request_duration_seconds_count{method=\"POST\",route=\"/v1/chat/completions\",status_code=\"499\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("http_server_request_duration_seconds_count{method=\"OTHER\",route=\"/admin/*\",status_code=\"499\"} 1\n"),
            "{text}"
        );
        assert!(!text.contains("status_code=\"200\""), "{text}");
    }

    #[test]
    fn an_unlisted_status_is_counted_as_other() {
        let shard = HttpServerMetrics::default();
        let mut exchange = shard.begin(Endpoint::at(5), Instant::now());
        exchange.status = 418;
        drop(exchange);
        let text = encode_of(std::slice::from_ref(&shard));
        assert!(
            text.contains("http_server_request_duration_seconds_count{method=\"GET\",route=\"/v1/models\",status_code=\"other\"} 1\n"),
            "{text}"
        );
    }

    fn encode_of(shards: &[HttpServerMetrics]) -> String {
        crate::router::metrics::encode(families(shards.iter()).into())
    }
}
