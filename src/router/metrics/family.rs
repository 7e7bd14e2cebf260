//! Metric families built at scrape time and their text exposition.
//!
//! A [`Family`] is one `prometheus::proto::MetricFamily` (the crate's plain model, no protobuf)
//! filled from plain counters when `/metrics` is scraped; each area of the router implements
//! [`Collect`] to add its families, and [`encode`] turns them into the text format 0.0.4 with the
//! crate's `TextEncoder`, which also escapes label values and help text. Nothing here runs on the
//! request path: the shards only add to relaxed atomics, and the control core builds the families.
//!
//! Invariants: a family with no samples is left out of the output (an absent series is not a zero);
//! families that share a name are merged into one, in the order they were first collected, so two
//! areas may both add series to one name without printing its header twice.
//!
//! Cost: one allocation per label pair and per sample; bounded by the series the router holds.

use prometheus::Encoder as _;
use prometheus::proto::{self, MetricFamily, MetricType};

/// The `Content-Type` of the text exposition.
pub const CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// One metric family being built: a name, a help line, a type and its samples.
#[derive(Debug, Clone)]
pub struct Family {
    family: MetricFamily,
}

impl Family {
    /// A counter family; samples are its running totals.
    pub fn counter(name: &str, help: &str) -> Family {
        Family::new(name, help, MetricType::COUNTER)
    }

    /// A gauge family; samples are current values.
    pub fn gauge(name: &str, help: &str) -> Family {
        Family::new(name, help, MetricType::GAUGE)
    }

    /// A histogram family; samples come from [`Family::histogram_sample`].
    pub fn histogram(name: &str, help: &str) -> Family {
        Family::new(name, help, MetricType::HISTOGRAM)
    }

    fn new(name: &str, help: &str, kind: MetricType) -> Family {
        let mut family = MetricFamily::default();
        family.set_name(name.to_owned());
        family.set_help(help.to_owned());
        family.set_field_type(kind);
        Family { family }
    }

    /// The family's name, as it is exposed.
    pub fn name(&self) -> &str {
        self.family.name()
    }

    /// Whether no sample was added (such a family is not exposed).
    pub fn is_empty(&self) -> bool {
        self.family.get_metric().is_empty()
    }

    /// One counter or gauge sample with `labels` in the order given.
    ///
    /// Panics (a programming error) when called on a histogram family.
    pub fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let mut metric = proto::Metric::from_label(label_pairs(labels));
        match self.family.get_field_type() {
            MetricType::COUNTER => {
                let mut counter = proto::Counter::default();
                counter.set_value(value);
                metric.set_counter(counter);
            }
            MetricType::GAUGE => {
                let mut gauge = proto::Gauge::default();
                gauge.set_value(value);
                metric.set_gauge(gauge);
            }
            kind => panic!("{}: sample() on a {kind:?} family", self.family.name()),
        }
        self.family.mut_metric().push(metric);
    }

    /// One histogram sample: `buckets` are (upper bound, cumulative count) in increasing order,
    /// without `+Inf` (the encoder adds it from `count`); `sum` is the sum of observed values.
    ///
    /// Panics (a programming error) when called on a counter or gauge family.
    pub fn histogram_sample(
        &mut self,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    ) {
        assert_eq!(
            self.family.get_field_type(),
            MetricType::HISTOGRAM,
            "{}: histogram_sample() on a non-histogram family",
            self.family.name()
        );
        let mut histogram = proto::Histogram::default();
        histogram.set_bucket(
            buckets
                .iter()
                .map(|&(upper_bound, cumulative_count)| {
                    let mut bucket = proto::Bucket::default();
                    bucket.set_upper_bound(upper_bound);
                    bucket.set_cumulative_count(cumulative_count);
                    bucket
                })
                .collect(),
        );
        histogram.set_sample_sum(sum);
        histogram.set_sample_count(count);
        let mut metric = proto::Metric::from_label(label_pairs(labels));
        metric.set_histogram(histogram);
        self.family.mut_metric().push(metric);
    }
}

fn label_pairs(labels: &[(&str, &str)]) -> Vec<proto::LabelPair> {
    labels
        .iter()
        .map(|&(name, value)| {
            let mut pair = proto::LabelPair::default();
            pair.set_name(name.to_owned());
            pair.set_value(value.to_owned());
            pair
        })
        .collect()
}

/// What renders families at scrape time (each area of the router implements it).
pub trait Collect {
    fn collect(&self, out: &mut Vec<Family>);
}

/// The text exposition (0.0.4) of the families, by the `prometheus` crate's `TextEncoder`:
/// empty families are left out, families of one name are merged (the first one's help and type).
pub fn encode(families: Vec<Family>) -> String {
    let mut merged: Vec<MetricFamily> = Vec::with_capacity(families.len());
    let mut index_by_name: std::collections::HashMap<String, usize> =
        std::collections::HashMap::with_capacity(families.len());
    for Family { mut family } in families {
        if family.get_metric().is_empty() {
            continue;
        }
        match index_by_name.get(family.name()) {
            Some(&index) => merged[index].mut_metric().append(family.mut_metric()),
            None => {
                index_by_name.insert(family.name().to_owned(), merged.len());
                merged.push(family);
            }
        }
    }
    let mut text = Vec::with_capacity(16 * 1024);
    prometheus::TextEncoder::new()
        .encode(&merged, &mut text)
        .expect("every family encoded is named and has samples");
    String::from_utf8(text).expect("the text encoder writes UTF-8 from UTF-8 input")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_and_gauge_samples_keep_label_order() {
        let mut requests = Family::counter("x_requests_total", "Requests.");
        requests.sample(&[("shard", "0"), ("code", "200")], 3.0);
        let mut open = Family::gauge("x_open", "Open.");
        open.sample(&[], -1.0);
        let text = encode(vec![requests, open]);
        assert_eq!(
            text,
            "# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\n\
             x_requests_total{shard=\"0\",code=\"200\"} 3\n\
             # HELP x_open Open.\n# TYPE x_open gauge\nx_open -1\n"
        );
    }

    #[test]
    fn empty_family_is_left_out() {
        let empty = Family::gauge("x_gpu", "GPU.");
        let mut kept = Family::gauge("x_kept", "Kept.");
        kept.sample(&[], 0.0);
        let text = encode(vec![empty, kept]);
        assert!(!text.contains("x_gpu"), "{text}");
        assert!(text.contains("x_kept 0\n"), "{text}");
        assert_eq!(encode(Vec::new()), "");
    }

    #[test]
    fn histogram_gets_inf_sum_and_count() {
        let mut seconds = Family::histogram("x_seconds", "Seconds.");
        seconds.histogram_sample(&[("model", "m")], &[(0.5, 1), (1.0, 2)], 2.25, 3);
        let text = encode(vec![seconds]);
        assert!(
            text.contains("x_seconds_bucket{model=\"m\",le=\"0.5\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model=\"m\",le=\"1\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("x_seconds_bucket{model=\"m\",le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("x_seconds_sum{model=\"m\"} 2.25\n"), "{text}");
        assert!(text.contains("x_seconds_count{model=\"m\"} 3\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped_by_the_encoder() {
        let mut info = Family::gauge("x_info", "Info.");
        info.sample(&[("name", "a\"b\\c\nd")], 1.0);
        assert!(encode(vec![info]).contains("x_info{name=\"a\\\"b\\\\c\\nd\"} 1\n"));
    }

    #[test]
    fn families_of_one_name_are_merged() {
        let mut first = Family::counter("x_total", "Total.");
        first.sample(&[("shard", "0")], 1.0);
        let mut second = Family::counter("x_total", "Total.");
        second.sample(&[("shard", "1")], 2.0);
        let text = encode(vec![first, second]);
        assert_eq!(text.matches("# TYPE x_total counter").count(), 1, "{text}");
        assert!(text.contains("x_total{shard=\"1\"} 2\n"), "{text}");
    }
}
