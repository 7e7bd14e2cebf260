//! `/metrics` in the Prometheus text format, with vLLM's metric names and `model_name` label so the
//! agent's engine-metrics poller reads the simulator exactly as it reads vLLM. Pure: renders
//! snapshots it is given.

use std::fmt::Write;

use crate::simulated_engine::engine::{ModelEngine, kv_usage_fraction};

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
}

const FAMILIES: [Family; 7] = [
    Family {
        name: "vllm:num_requests_running",
        kind: "gauge",
        help: "Number of requests currently running on GPU.",
    },
    Family {
        name: "vllm:num_requests_waiting",
        kind: "gauge",
        help: "Number of requests waiting to be processed.",
    },
    Family {
        name: "vllm:kv_cache_usage_perc",
        kind: "gauge",
        help: "KV-cache usage. 1 means 100 percent usage.",
    },
    Family {
        name: "sim_requests_total",
        kind: "counter",
        help: "Requests accepted by the simulator.",
    },
    Family {
        name: "sim_cancelled_total",
        kind: "counter",
        help: "Requests whose client went away before the answer was complete.",
    },
    Family {
        name: "sim_in_flight",
        kind: "gauge",
        help: "Requests waiting or running.",
    },
    Family {
        name: "sim_running_peak",
        kind: "gauge",
        help: "The most requests that were ever running at once.",
    },
];

/// Renders every family for every model. `kv_usage_pinned` is the control endpoint's override.
pub fn render(models: &[ModelEngine], kv_usage_pinned: Option<f64>) -> String {
    let mut out = String::with_capacity(512 + models.len() * 512);
    let snapshots: Vec<_> = models.iter().map(ModelEngine::snapshot).collect();
    for (family_index, family) in FAMILIES.iter().enumerate() {
        let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
        let _ = writeln!(out, "# TYPE {} {}", family.name, family.kind);
        for (model, snapshot) in models.iter().zip(&snapshots) {
            let value = match family_index {
                0 => snapshot.running as f64,
                1 => snapshot.waiting as f64,
                2 => kv_usage_fraction(
                    snapshot.kv_tokens,
                    model.kv_capacity_tokens,
                    kv_usage_pinned,
                ),
                3 => snapshot.requests_total as f64,
                4 => snapshot.cancelled_total as f64,
                5 => (snapshot.waiting + snapshot.running) as f64,
                _ => snapshot.running_peak as f64,
            };
            // Model names come from the command line.
            let label = label(&model.name);
            let _ = writeln!(out, "{}{{model_name=\"{}\"}} {}", family.name, label, value);
        }
    }
    render_vllm_request_families(&mut out, models);
    out
}

/// A model name as a label value, escaped as the exposition format requires.
fn label(name: &str) -> String {
    name.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// vLLM's per-request families: preemptions (always 0: the simulator never preempts), finished
/// requests by reason (always `stop`), prefix-cache queries and hits in tokens, and the histograms
/// of time to first token, inter-token latency, prompt and generation length.
fn render_vllm_request_families(out: &mut String, models: &[ModelEngine]) {
    use std::sync::atomic::Ordering;
    let _ = writeln!(out, "# TYPE vllm:num_preemptions_total counter");
    for model in models {
        let label = label(&model.name);
        let _ = writeln!(
            out,
            "vllm:num_preemptions_total{{model_name=\"{label}\"}} 0"
        );
    }
    let _ = writeln!(out, "# TYPE vllm:request_success_total counter");
    for model in models {
        let label = label(&model.name);
        let finished = model.counters.finished_total.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "vllm:request_success_total{{finished_reason=\"stop\",model_name=\"{label}\"}} {finished}"
        );
    }
    // vLLM's names and help texts; both count tokens, not requests, and stay 0 with caching off.
    render_counter(
        out,
        models,
        "vllm:prefix_cache_queries_total",
        "Prefix cache queries, in terms of number of queried tokens.",
        |model| {
            model
                .counters
                .prefix_cache_queries_total
                .load(Ordering::Relaxed)
        },
    );
    render_counter(
        out,
        models,
        "vllm:prefix_cache_hits_total",
        "Prefix cache hits, in terms of number of cached tokens.",
        |model| {
            model
                .counters
                .prefix_cache_hits_total
                .load(Ordering::Relaxed)
        },
    );
    render_histogram(out, models, "vllm:time_to_first_token_seconds", |model| {
        &model.counters.ttft
    });
    render_histogram(out, models, "vllm:inter_token_latency_seconds", |model| {
        &model.counters.itl
    });
    render_histogram(out, models, "vllm:request_prompt_tokens", |model| {
        &model.counters.prompt_tokens
    });
    render_histogram(out, models, "vllm:request_generation_tokens", |model| {
        &model.counters.generation_tokens
    });
}

/// One counter family with its help text, a series per model.
fn render_counter(
    out: &mut String,
    models: &[ModelEngine],
    name: &str,
    help: &str,
    value_of: impl Fn(&ModelEngine) -> u64,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    for model in models {
        let label = label(&model.name);
        let value = value_of(model);
        let _ = writeln!(out, "{name}{{model_name=\"{label}\"}} {value}");
    }
}

/// One vLLM histogram family, a series per model.
fn render_histogram(
    out: &mut String,
    models: &[ModelEngine],
    name: &str,
    histogram_of: impl Fn(&ModelEngine) -> &crate::simulated_engine::engine::Histogram,
) {
    let _ = writeln!(out, "# TYPE {name} histogram");
    for model in models {
        let label = label(&model.name);
        let histogram = histogram_of(model);
        let (cumulative, sum) = histogram.cumulative();
        for (bound, count) in histogram.bounds.iter().zip(&cumulative) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\",model_name=\"{label}\"}} {count}"
            );
        }
        let total = cumulative[cumulative.len() - 1];
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"+Inf\",model_name=\"{label}\"}} {total}"
        );
        let _ = writeln!(out, "{name}_sum{{model_name=\"{label}\"}} {sum}");
        let _ = writeln!(out, "{name}_count{{model_name=\"{label}\"}} {total}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family_per_model() {
        let models = [
            ModelEngine::new("a".into(), 0, 0, 100),
            ModelEngine::new("b\"x".into(), 0, 0, 100),
        ];
        let text = render(&models, Some(0.5));
        assert!(text.contains("# TYPE vllm:num_requests_running gauge\n"));
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"a\"} 0.5\n"));
        assert!(text.contains("sim_cancelled_total{model_name=\"b\\\"x\"} 0\n"));
        assert_eq!(
            text.lines().filter(|line| !line.starts_with('#')).count(),
            18 + 2
                * ((2 + crate::simulated_engine::engine::TTFT_BOUNDS_SECONDS.len() + 3)
                    + (crate::simulated_engine::engine::ITL_BOUNDS_SECONDS.len() + 3)
                    + 2 * (crate::simulated_engine::engine::TOKEN_BOUNDS.len() + 3))
        );
        assert!(
            text.contains(
                "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"a\"} 0\n"
            )
        );
    }

    #[test]
    fn renders_prefix_cache_counters_in_tokens() {
        use crate::simulated_engine::prefix_cache::BlockKey;
        let models = [
            ModelEngine::new("a".into(), 0, 0, 100).with_prefix_cache(4, 8),
            ModelEngine::new("off".into(), 0, 0, 100),
        ];
        models[0].look_up_prefix(&[BlockKey(1), BlockKey(2)], 10);
        models[0].look_up_prefix(&[BlockKey(1), BlockKey(2)], 10);
        models[1].look_up_prefix(&[BlockKey(1)], 10);
        let text = render(&models, None);
        for expected in [
            "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.\n",
            "# TYPE vllm:prefix_cache_queries_total counter\n",
            "vllm:prefix_cache_queries_total{model_name=\"a\"} 20\n",
            "vllm:prefix_cache_queries_total{model_name=\"off\"} 0\n",
            "# TYPE vllm:prefix_cache_hits_total counter\n",
            "vllm:prefix_cache_hits_total{model_name=\"a\"} 8\n",
            "vllm:prefix_cache_hits_total{model_name=\"off\"} 0\n",
        ] {
            assert!(text.contains(expected), "{expected:?} in\n{text}");
        }
    }
}
