//! The rest of an engine's `/metrics` the router re-exports (engine-metrics reference, "Metric
//! availability"): preemptions, average and P90 TTFT and ITL, finish reasons, llama.cpp
//! throughput, and vLLM's raw histograms. Pure: text in, [`EngineReport`] out; the poller sends
//! it with the routing signals.
//!
//! Mapping per engine (which samples count, as in `engine_metrics`: the served model's when the
//! engine labels one, else all, summed over data-parallel ranks):
//!
//! | report field | vLLM | SGLang | llama.cpp |
//! | --- | --- | --- | --- |
//! | `preemptions_total` | `vllm:num_preemptions_total` | – | – |
//! | TTFT avg/P90 | `vllm:time_to_first_token_seconds` | `sglang:time_to_first_token_seconds` | – |
//! | ITL avg/P90 | `vllm:inter_token_latency_seconds` (before 0.11: `vllm:time_per_output_token_seconds`) | – | – |
//! | `finished` | `vllm:request_success_total{finished_reason}` | – | – |
//! | `predicted_tps`, `prompt_tps` | – | – | `llamacpp:predicted_tokens_seconds`, `llamacpp:prompt_tokens_seconds` |
//! | raw histograms | TTFT, ITL, `vllm:request_prompt_tokens`, `vllm:request_generation_tokens` | – | – |
//! | prefix-cache queries and hits | `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total` (tokens; before 0.10: `vllm:gpu_prefix_cache_*_total`) | – | – |
//! | prefix-cache hit rate | hits over queries (before V1: `vllm:gpu_prefix_cache_hit_rate`) | `sglang:cache_hit_rate` | – |
//!
//! Raw histograms are re-exported for vLLM only, as the reference says; SGLang's TTFT histogram
//! gives its scalars. llama.cpp exposes no latency histogram, so its TTFT and ITL stay absent.
//! Averages are `sum / count`; P90 is interpolated inside the bucket that holds the 90th
//! percentile, as Prometheus' `histogram_quantile` does. A metric the engine does not expose is
//! absent.

use std::collections::BTreeMap;

use super::config::Engine;
use super::engine_metrics::{Sample, parse_line};
use crate::wire::proto::{EngineHistogram, EngineReport, FinishReason, HistogramBucket};

/// A histogram read from an exposition: cumulative counts by upper bound, sum and count.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Ascending bounds, `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    /// `sum / count`; `None` before any observation.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    /// The `q` quantile (`0.0..=1.0`), interpolated linearly inside its bucket (the first bucket
    /// starts at 0); when it falls in the `+Inf` bucket, the highest finite bound. `None` before
    /// any observation.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total == 0 {
            return None;
        }
        let rank = q * total as f64;
        let mut lower = (0.0, 0u64);
        for &(bound, cumulative) in &self.buckets {
            if cumulative as f64 >= rank {
                if bound.is_infinite() {
                    return Some(lower.0);
                }
                let in_bucket = (cumulative - lower.1) as f64;
                if in_bucket == 0.0 {
                    return Some(bound);
                }
                return Some(lower.0 + (bound - lower.0) * (rank - lower.1 as f64) / in_bucket);
            }
            lower = (bound, cumulative);
        }
        Some(lower.0)
    }

    fn to_proto(&self, name: &str) -> EngineHistogram {
        EngineHistogram {
            name: name.to_owned(),
            buckets: self
                .buckets
                .iter()
                .map(|&(le, count)| HistogramBucket { le, count })
                .collect(),
            sum: self.sum,
            count: self.count,
        }
    }
}

/// The samples that count for the served models: those labelled with one of them when any is,
/// else every sample (an aliased model, or an engine that labels none).
fn counted<'s, 'a>(
    samples: &'s [Sample<'a>],
    name: &'s str,
    models: &'s [String],
) -> impl Iterator<Item = &'s Sample<'a>> + Clone + 's {
    let serves = move |sample: &Sample<'_>| {
        sample
            .label("model_name")
            .is_some_and(|model| models.iter().any(|served| served == model))
    };
    let any_matching = samples
        .iter()
        .any(|sample| sample.name == name && serves(sample));
    samples.iter().filter(move |sample| {
        sample.name == name && sample.value.is_finite() && (!any_matching || serves(sample))
    })
}

fn sum(samples: &[Sample<'_>], name: &str, models: &[String]) -> Option<f64> {
    let mut matched = counted(samples, name, models).peekable();
    matched.peek()?;
    Some(matched.map(|sample| sample.value).sum())
}

/// A rate the engine reports per data-parallel rank, averaged over them.
fn mean(samples: &[Sample<'_>], name: &str, models: &[String]) -> Option<f64> {
    let (total, count) = counted(samples, name, models)
        .fold((0.0, 0u32), |(total, count), sample| {
            (total + sample.value, count + 1)
        });
    (count > 0).then(|| total / f64::from(count))
}

/// The histogram `name` (its `_bucket`, `_sum` and `_count` series) summed over the counted
/// label sets; `None` when the engine does not expose it.
pub fn histogram(samples: &[Sample<'_>], name: &str, models: &[String]) -> Option<Histogram> {
    let bucket_name = format!("{name}_bucket");
    let mut by_bound: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    let buckets = counted(samples, &bucket_name, models).filter(|sample| sample.value >= 0.0);
    for sample in buckets {
        let Some(bound) = sample.label("le").and_then(parse_bound) else {
            continue;
        };
        // Bounds are ordered by their bit pattern, which for non-negative floats (and +Inf)
        // is their numeric order.
        let entry = by_bound.entry(bound.to_bits()).or_insert((bound, 0));
        entry.1 += sample.value as u64;
    }
    if by_bound.is_empty() {
        return None;
    }
    let buckets: Vec<(f64, u64)> = by_bound.into_values().collect();
    let count = sum(samples, &format!("{name}_count"), models)
        .map_or(buckets.last().map_or(0, |last| last.1), |count| {
            count as u64
        });
    Some(Histogram {
        buckets,
        sum: sum(samples, &format!("{name}_sum"), models).unwrap_or(0.0),
        count,
    })
}

fn parse_bound(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        _ => text.parse::<f64>().ok().filter(|bound| *bound >= 0.0),
    }
}

/// The report of one scrape of `engine`'s exposition `text`.
pub fn extract(text: &str, engine: Engine, models: &[String]) -> EngineReport {
    let samples: Vec<Sample<'_>> = text.lines().filter_map(parse_line).collect();
    match engine {
        Engine::Vllm => vllm(&samples, models),
        Engine::Sglang => {
            let ttft = histogram(&samples, "sglang:time_to_first_token_seconds", models);
            EngineReport {
                avg_ttft_seconds: ttft.as_ref().and_then(Histogram::mean),
                p90_ttft_seconds: ttft.as_ref().and_then(|ttft| ttft.quantile(0.9)),
                prefix_cache_hit_rate: mean(&samples, "sglang:cache_hit_rate", models),
                ..EngineReport::default()
            }
        }
        Engine::Llamacpp => EngineReport {
            predicted_tps: sum(&samples, "llamacpp:predicted_tokens_seconds", models),
            prompt_tps: sum(&samples, "llamacpp:prompt_tokens_seconds", models),
            ..EngineReport::default()
        },
        Engine::Ollama | Engine::Infinity | Engine::Custom => EngineReport::default(),
    }
}

fn vllm(samples: &[Sample<'_>], models: &[String]) -> EngineReport {
    let ttft = histogram(samples, "vllm:time_to_first_token_seconds", models);
    let itl = histogram(samples, "vllm:inter_token_latency_seconds", models)
        .or_else(|| histogram(samples, "vllm:time_per_output_token_seconds", models));
    let prompt = histogram(samples, "vllm:request_prompt_tokens", models);
    let generation = histogram(samples, "vllm:request_generation_tokens", models);
    let mut finished: BTreeMap<String, f64> = BTreeMap::new();
    for sample in counted(samples, "vllm:request_success_total", models) {
        if let Some(reason) = sample.label("finished_reason") {
            *finished.entry(reason.to_owned()).or_default() += sample.value;
        }
    }
    let prefix_cache = |name: &str| {
        sum(samples, &format!("vllm:prefix_cache_{name}_total"), models).or_else(|| {
            sum(
                samples,
                &format!("vllm:gpu_prefix_cache_{name}_total"),
                models,
            )
        })
    };
    let (queries, hits) = (prefix_cache("queries"), prefix_cache("hits"));
    let hit_rate = match (hits, queries) {
        (Some(hits), Some(queries)) if queries > 0.0 => Some(hits / queries),
        (Some(_), Some(_)) => None,
        _ => mean(samples, "vllm:gpu_prefix_cache_hit_rate", models),
    };
    let raw = [
        ("ttft_seconds", &ttft),
        ("itl_seconds", &itl),
        ("request_prompt_tokens", &prompt),
        ("request_generation_tokens", &generation),
    ];
    EngineReport {
        preemptions_total: sum(samples, "vllm:num_preemptions_total", models),
        avg_ttft_seconds: ttft.as_ref().and_then(Histogram::mean),
        p90_ttft_seconds: ttft.as_ref().and_then(|ttft| ttft.quantile(0.9)),
        avg_itl_seconds: itl.as_ref().and_then(Histogram::mean),
        p90_itl_seconds: itl.as_ref().and_then(|itl| itl.quantile(0.9)),
        predicted_tps: None,
        prompt_tps: None,
        finished: finished
            .into_iter()
            .map(|(reason, count)| FinishReason { reason, count })
            .collect(),
        histograms: raw
            .into_iter()
            .filter_map(|(name, histogram)| Some(histogram.as_ref()?.to_proto(name)))
            .collect(),
        prefix_cache_queries_total: queries,
        prefix_cache_hits_total: hits,
        prefix_cache_hit_rate: hit_rate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
vllm:num_preemptions_total{engine="1",model_name="m"} 1.0
vllm:num_preemptions_total{engine="0",model_name="other"} 50.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 8.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.5",model_name="m"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 0.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 5.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.025
vllm:time_per_output_token_seconds_count{model_name="m"} 5.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 7.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0
"#;

    fn models() -> Vec<String> {
        vec!["m".to_owned()]
    }

    #[test]
    fn vllm_scalars_sum_ranks_of_the_served_model() {
        let report = extract(VLLM, Engine::Vllm, &models());
        assert_eq!(report.preemptions_total, Some(3.0));
        assert_eq!(report.avg_ttft_seconds, Some(0.3));
        // Rank 9 of 10 falls in (0.5, +Inf]: the highest finite bound.
        assert_eq!(report.p90_ttft_seconds, Some(0.5));
        // The pre-0.11 ITL name is read when the new one is missing.
        assert_eq!(report.avg_itl_seconds, Some(0.005));
        assert_eq!(report.p90_itl_seconds, Some(0.009));
        let finished: Vec<(&str, f64)> = report
            .finished
            .iter()
            .map(|reason| (reason.reason.as_str(), reason.count))
            .collect();
        assert_eq!(finished, [("length", 2.0), ("stop", 8.0)]);
        assert_eq!(report.predicted_tps, None);
    }

    #[test]
    fn vllm_histograms_are_forwarded_cumulative() {
        let report = extract(VLLM, Engine::Vllm, &models());
        let names: Vec<&str> = report.histograms.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["ttft_seconds", "itl_seconds"]);
        let ttft = &report.histograms[0];
        let buckets: Vec<(f64, u64)> = ttft.buckets.iter().map(|b| (b.le, b.count)).collect();
        assert_eq!(buckets, [(0.1, 2), (0.5, 8), (f64::INFINITY, 10)]);
        assert_eq!((ttft.sum, ttft.count), (3.0, 10));
    }

    #[test]
    fn quantile_interpolates_inside_its_bucket() {
        let histogram = Histogram {
            buckets: vec![(1.0, 10), (2.0, 20), (f64::INFINITY, 20)],
            sum: 25.0,
            count: 20,
        };
        assert_eq!(histogram.quantile(0.5), Some(1.0));
        assert_eq!(histogram.quantile(0.75), Some(1.5));
        assert_eq!(histogram.mean(), Some(1.25));
        let empty = Histogram {
            buckets: vec![(1.0, 0), (f64::INFINITY, 0)],
            sum: 0.0,
            count: 0,
        };
        assert_eq!(empty.quantile(0.9), None);
        assert_eq!(empty.mean(), None);
    }

    #[test]
    fn sglang_gives_ttft_scalars_only_and_llamacpp_throughput() {
        let sglang = "sglang:time_to_first_token_seconds_bucket{le=\"1.0\",model_name=\"m\"} 4\nsglang:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 4\nsglang:time_to_first_token_seconds_sum{model_name=\"m\"} 2\nsglang:time_to_first_token_seconds_count{model_name=\"m\"} 4\n";
        let report = extract(sglang, Engine::Sglang, &models());
        assert_eq!(report.avg_ttft_seconds, Some(0.5));
        assert_eq!(report.p90_ttft_seconds, Some(0.9));
        assert!(report.histograms.is_empty());
        let llama = "llamacpp:predicted_tokens_seconds 42.5\nllamacpp:prompt_tokens_seconds 310\n";
        let report = extract(llama, Engine::Llamacpp, &models());
        assert_eq!(report.predicted_tps, Some(42.5));
        assert_eq!(report.prompt_tps, Some(310.0));
        assert_eq!(report.avg_ttft_seconds, None);
        assert_eq!(
            extract(VLLM, Engine::Ollama, &models()),
            EngineReport::default()
        );
    }

    /// vLLM's prefix-cache counters (tokens, summed over ranks) and their ratio; the names
    /// before 0.10, and the V0 gauge; SGLang's own rate, averaged over ranks.
    #[test]
    fn prefix_cache_lookups_hits_and_rate_per_engine() {
        let vllm = "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 600\nvllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 200\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 500\nvllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 100\nvllm:prefix_cache_hits_total{engine=\"0\",model_name=\"other\"} 9000\n";
        let report = extract(vllm, Engine::Vllm, &models());
        assert_eq!(report.prefix_cache_queries_total, Some(800.0));
        assert_eq!(report.prefix_cache_hits_total, Some(600.0));
        assert_eq!(report.prefix_cache_hit_rate, Some(0.75));
        let older = "vllm:gpu_prefix_cache_queries_total{model_name=\"m\"} 40\nvllm:gpu_prefix_cache_hits_total{model_name=\"m\"} 10\n";
        let report = extract(older, Engine::Vllm, &models());
        assert_eq!(report.prefix_cache_hit_rate, Some(0.25));
        // Nothing looked up yet: no rate, the counters as they are.
        let idle = "vllm:prefix_cache_queries_total{model_name=\"m\"} 0\nvllm:prefix_cache_hits_total{model_name=\"m\"} 0\n";
        let report = extract(idle, Engine::Vllm, &models());
        assert_eq!(report.prefix_cache_queries_total, Some(0.0));
        assert_eq!(report.prefix_cache_hit_rate, None);
        let v0 = "vllm:gpu_prefix_cache_hit_rate{model_name=\"m\"} 0.4\n";
        assert_eq!(
            extract(v0, Engine::Vllm, &models()).prefix_cache_hit_rate,
            Some(0.4)
        );
        assert_eq!(
            extract(VLLM, Engine::Vllm, &models()).prefix_cache_hit_rate,
            None
        );
        let sglang = "sglang:cache_hit_rate{model_name=\"m\",dp_rank=\"0\"} 0.5\nsglang:cache_hit_rate{model_name=\"m\",dp_rank=\"1\"} 0.7\n";
        let rate = extract(sglang, Engine::Sglang, &models()).prefix_cache_hit_rate;
        assert!((rate.unwrap() - 0.6).abs() < 1e-12, "{rate:?}");
    }
}
