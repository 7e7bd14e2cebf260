//! Engine signals read from a backend's Prometheus text exposition: KV-cache utilization, running
//! and waiting requests. Pure: text in, [`EngineSnapshot`] out; the poller in `agent::poller`
//! does the scraping.
//!
//! Which samples count: when any sample of a metric carries a `model_name` label equal to one of
//! the served models, only those samples count; otherwise (an aliased `--model`, or llama.cpp,
//! which labels nothing) every sample counts. Request counts are summed over the counted label
//! sets; KV-cache utilization is averaged, because vLLM data-parallel ranks each expose their own
//! fraction (`engine="0"`, `engine="1"`) and a sum could exceed 1.
//!
//! A metric the engine does not expose stays `None`; the router treats a missing signal as "pass".

use super::config::Engine;

/// One sample line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    pub labels: Vec<(&'a str, String)>,
    pub value: f64,
}

impl Sample<'_> {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(name, _)| *name == key)
            .map(|(_, value)| value.as_str())
    }
}

/// Parses one exposition line. Comments, blank lines and malformed lines give `None`: a scrape
/// must not fail because the engine added a metric this parser does not understand.
pub fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after_brace) = rest.strip_prefix('{') {
        rest = parse_labels(after_brace, &mut labels)?;
    }
    let value_text = rest.split_ascii_whitespace().next()?;
    let value = parse_value(value_text)?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// Parses `key="value",…}` and returns what follows the closing brace.
fn parse_labels<'a>(mut rest: &'a str, labels: &mut Vec<(&'a str, String)>) -> Option<&'a str> {
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some(after);
        }
        let equals = rest.find('=')?;
        let key = rest[..equals].trim();
        rest = rest[equals + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let close = loop {
            let (index, c) = chars.next()?;
            match c {
                '"' => break index,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        };
        labels.push((key, value));
        rest = &rest[close + 1..];
    }
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

/// The engine signals of one scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineSnapshot {
    /// Fraction `0.0..=1.0` of the KV (token) cache in use.
    pub kv_cache_utilization: Option<f64>,
    pub running_requests: Option<f64>,
    pub waiting_requests: Option<f64>,
}

impl EngineSnapshot {
    pub fn has_any(&self) -> bool {
        self.kv_cache_utilization.is_some()
            || self.running_requests.is_some()
            || self.waiting_requests.is_some()
    }
}

/// Metric names per engine; for KV cache, names in order of preference.
struct MetricNames {
    kv_cache: &'static [&'static str],
    running: &'static str,
    waiting: &'static str,
}

fn metric_names(engine: Engine) -> Option<MetricNames> {
    match engine {
        Engine::Vllm => Some(MetricNames {
            // `gpu_cache_usage_perc` is the name before vLLM 0.10; newer builds expose both for a
            // while, and the new one wins.
            kv_cache: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            running: "vllm:num_requests_running",
            waiting: "vllm:num_requests_waiting",
        }),
        Engine::Sglang => Some(MetricNames {
            kv_cache: &["sglang:token_usage"],
            running: "sglang:num_running_reqs",
            waiting: "sglang:num_queue_reqs",
        }),
        Engine::Llamacpp => Some(MetricNames {
            kv_cache: &["llamacpp:kv_cache_usage_ratio"],
            running: "llamacpp:requests_processing",
            waiting: "llamacpp:requests_deferred",
        }),
        Engine::Ollama | Engine::Infinity | Engine::Custom => None,
    }
}

/// Whether this engine exposes metrics the agent reads (and so whether to scrape at all).
pub fn engine_has_metrics(engine: Engine) -> bool {
    metric_names(engine).is_some()
}

/// Extracts the engine signals from a whole exposition text.
pub fn extract(text: &str, engine: Engine, models: &[String]) -> EngineSnapshot {
    let Some(names) = metric_names(engine) else {
        return EngineSnapshot::default();
    };
    let samples: Vec<Sample<'_>> = text.lines().filter_map(parse_line).collect();
    let kv_cache_utilization = names
        .kv_cache
        .iter()
        .find_map(|name| aggregate(&samples, name, models, Aggregate::Mean))
        .map(|value| value.clamp(0.0, 1.0));
    EngineSnapshot {
        kv_cache_utilization,
        running_requests: aggregate(&samples, names.running, models, Aggregate::Sum),
        waiting_requests: aggregate(&samples, names.waiting, models, Aggregate::Sum),
    }
}

#[derive(Clone, Copy)]
enum Aggregate {
    Sum,
    Mean,
}

fn aggregate(samples: &[Sample<'_>], name: &str, models: &[String], how: Aggregate) -> Option<f64> {
    let of_metric = || {
        samples
            .iter()
            .filter(move |sample| sample.name == name && sample.value.is_finite())
    };
    let serves = |sample: &&Sample<'_>| {
        sample
            .label("model_name")
            .is_some_and(|model| models.iter().any(|served| served == model))
    };
    let any_matching = of_metric().any(|sample| serves(&sample));
    let (count, total) = of_metric()
        .filter(|sample| !any_matching || serves(sample))
        .fold((0usize, 0.0f64), |(count, total), sample| {
            (count + 1, total + sample.value)
        });
    if count == 0 {
        return None;
    }
    Some(match how {
        Aggregate::Sum => total,
        Aggregate::Mean => total / count as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 14.0
python_gc_objects_collected_total{generation="0"} 1234.0
"#;

    const VLLM_OLD: &str = r#"# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="qwen"} 0.125
vllm:num_requests_running{model_name="qwen"} 4.0
vllm:num_requests_waiting{model_name="qwen"} 7.0
"#;

    const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0",pp_rank="0"} 6.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0",pp_rank="0"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0",pp_rank="0"} 0.37
sglang:gen_throughput{model_name="Qwen/Qwen2.5-7B-Instruct",tp_rank="0",pp_rank="0"} 512.3
"#;

    const LLAMACPP: &str = r#"# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.0625
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"#;

    fn models(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn vllm_sums_counts_and_averages_cache_over_ranks() {
        let snapshot = extract(
            VLLM,
            Engine::Vllm,
            &models(&["meta-llama/Llama-3.1-8B-Instruct"]),
        );
        assert_eq!(snapshot.running_requests, Some(5.0));
        assert_eq!(snapshot.waiting_requests, Some(1.0));
        assert_eq!(snapshot.kv_cache_utilization, Some(0.375));
    }

    #[test]
    fn vllm_falls_back_to_the_old_cache_name() {
        let snapshot = extract(VLLM_OLD, Engine::Vllm, &models(&["qwen"]));
        assert_eq!(snapshot.kv_cache_utilization, Some(0.125));
        assert_eq!(snapshot.running_requests, Some(4.0));
        assert_eq!(snapshot.waiting_requests, Some(7.0));
    }

    #[test]
    fn other_models_are_excluded_and_aliases_count_everything() {
        let text = "vllm:num_requests_running{model_name=\"a\"} 1\nvllm:num_requests_running{model_name=\"b\"} 10\n";
        let only_a = extract(text, Engine::Vllm, &models(&["a"]));
        assert_eq!(only_a.running_requests, Some(1.0));
        let alias = extract(text, Engine::Vllm, &models(&["public-alias"]));
        assert_eq!(alias.running_requests, Some(11.0));
        assert_eq!(alias.kv_cache_utilization, None);
    }

    #[test]
    fn sglang_and_llamacpp() {
        let sglang = extract(
            SGLANG,
            Engine::Sglang,
            &models(&["Qwen/Qwen2.5-7B-Instruct"]),
        );
        assert_eq!(
            sglang,
            EngineSnapshot {
                kv_cache_utilization: Some(0.37),
                running_requests: Some(6.0),
                waiting_requests: Some(2.0),
            }
        );
        let llama = extract(LLAMACPP, Engine::Llamacpp, &models(&["any"]));
        assert_eq!(llama.kv_cache_utilization, Some(0.0625));
        assert_eq!(llama.running_requests, Some(1.0));
        assert_eq!(llama.waiting_requests, Some(0.0));
    }

    #[test]
    fn missing_metrics_and_engines_without_metrics() {
        assert!(!extract("", Engine::Vllm, &models(&["m"])).has_any());
        assert!(!extract(VLLM, Engine::Sglang, &models(&["m"])).has_any());
        assert!(!extract(VLLM, Engine::Ollama, &models(&["m"])).has_any());
        assert!(!engine_has_metrics(Engine::Custom));
        let nan = extract(
            "vllm:num_requests_running NaN\n",
            Engine::Vllm,
            &models(&["m"]),
        );
        assert_eq!(nan.running_requests, None);
    }

    #[test]
    fn line_parser_handles_escapes_timestamps_and_garbage() {
        let sample =
            parse_line(r#"m{a="x\"y,}z",b="1\\2" , } 4.5e1 1700000000000"#).expect("parses");
        assert_eq!(sample.name, "m");
        assert_eq!(sample.label("a"), Some("x\"y,}z"));
        assert_eq!(sample.label("b"), Some("1\\2"));
        assert_eq!(sample.value, 45.0);
        assert_eq!(parse_line("plain 3").unwrap().value, 3.0);
        assert_eq!(parse_line("inf +Inf").unwrap().value, f64::INFINITY);
        assert!(parse_line("# TYPE x gauge").is_none());
        assert!(parse_line("broken{a=\"x\" 1").is_none());
        assert!(parse_line("novalue").is_none());
        assert!(parse_line("m{a=x} 1").is_none());
        assert!(parse_line("m notanumber").is_none());
    }
}
