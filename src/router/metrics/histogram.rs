//! Plain per-shard histogram counts: the shard that owns them adds to them with no lock and no
//! atomic (they live in the shard's single-threaded state), the control core sums the shards'
//! copies at scrape time. Memory: 17 words per series; series are bounded by their owner.
//!
//! Also here, [`cumulative`]: per-bucket counts as the exposition's cumulative buckets, for every
//! histogram family the router builds.

use std::time::Duration;

use super::Family;

/// Upper bounds, in seconds, of the request-duration histograms (`hivenet_request_duration_seconds`,
/// `hivenet_tenant_request_duration_seconds`, `http_server_request_duration_seconds`): the
/// Prometheus client's default buckets, which the reference's families use, extended to 5 minutes
/// because a long generation outlasts 10 s.
pub const REQUEST_SECONDS_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// Observations per bucket of [`REQUEST_SECONDS_BUCKETS`] (the last one above every bound) and
/// their sum in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DurationCounts {
    counts: [u64; REQUEST_SECONDS_BUCKETS.len() + 1],
    sum_micros: u64,
}

impl DurationCounts {
    pub fn observe(&mut self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = REQUEST_SECONDS_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(REQUEST_SECONDS_BUCKETS.len());
        self.counts[bucket] += 1;
        self.sum_micros = self
            .sum_micros
            .saturating_add(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    /// Adds another shard's counts of the same series.
    pub fn merge(&mut self, other: &DurationCounts) {
        for (total, count) in self.counts.iter_mut().zip(other.counts) {
            *total += count;
        }
        self.sum_micros = self.sum_micros.saturating_add(other.sum_micros);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds this histogram to `family` as the series with `labels`.
    pub fn sample_into(&self, family: &mut Family, labels: &[(&str, &str)]) {
        let (buckets, count) = cumulative(&REQUEST_SECONDS_BUCKETS, &self.counts);
        family.histogram_sample(labels, &buckets, self.sum_micros as f64 / 1e6, count);
    }
}

/// Per-bucket counts (the last one above every bound) as (upper bound, cumulative count) pairs
/// without `+Inf`, and the total count.
pub fn cumulative(bounds: &[f64], counts: &[u64]) -> (Vec<(f64, u64)>, u64) {
    let mut running = 0;
    let buckets = bounds
        .iter()
        .zip(counts)
        .map(|(bound, count)| {
            running += count;
            (*bound, running)
        })
        .collect();
    (buckets, counts.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_merge() {
        let mut a = DurationCounts::default();
        a.observe(Duration::from_millis(5));
        a.observe(Duration::from_secs(600));
        let mut b = DurationCounts::default();
        b.observe(Duration::from_millis(200));
        a.merge(&b);
        assert_eq!(a.count(), 3);
        let mut family = Family::histogram("x_seconds", "x");
        a.sample_into(&mut family, &[]);
        let text = crate::router::metrics::encode(vec![family]);
        assert!(
            text.contains("x_seconds_bucket{le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("x_seconds_bucket{le=\"0.25\"} 2\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"300\"} 2\n"), "{text}");
        assert!(text.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{text}");
        assert!(text.contains("x_seconds_sum 600.205\n"), "{text}");
    }

    #[test]
    fn cumulative_adds_up_and_counts_the_overflow() {
        let (buckets, count) = cumulative(&[1.0, 2.0], &[1, 0, 3]);
        assert_eq!(buckets, vec![(1.0, 1), (2.0, 1)]);
        assert_eq!(count, 4);
    }
}
