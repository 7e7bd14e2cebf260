//! Proves that, fed exact usage from the simulated engine, the estimator's online estimates of a
//! varied chat corpus converge to within a stated error of that usage.
//!
//! Ground truth is the simulated engine's own rule, [`crate::simulated_engine::request::prompt_tokens`],
//! applied to each body as the sim parses it: `ceil(text bytes / 4) + 4 per message` (the
//! Anthropic `system` being one more message). That rule is naive: a fixed 0.25 tokens per byte,
//! the same overhead constant as [`TOKENS_PER_MESSAGE`], and it bills nothing for `tools` or
//! `tool_calls`. So what this test shows is:
//! - the ratio moves from the seed's starting 1/3.2 (25 % high for this engine) to the engine's
//!   0.25 within a few dozen observations;
//! - after that, on tool-free requests the estimate is within a token or two of exact (the sim's
//!   `ceil` and ours), so within a fraction of a percent;
//! - on tool-bearing requests the estimator over-estimates, because it counts tool JSON as text
//!   (as the seed requires; real engines render tool schemas into the prompt) while the sim
//!   bills none of it; those requests also drag the learned ratio below 0.25, which makes
//!   tool-free requests slightly under-estimated. The bounds below are set with that mixture in.
//!
//! The corpus is generated from a fixed seed; a failure prints it.

use crate::simulated_engine::request::{ChatRequest, MessagesRequest, prompt_tokens};
use crate::wire::http::fields::extract_fields;
use serde_json::{Value, json};

use super::*;

const SEED: u64 = 0x5eed_e571_0a7e;
/// Requests in the corpus; the first [`WARM_UP`] are observed but not scored.
const CORPUS_REQUESTS: usize = 1200;
const WARM_UP: usize = 50;

/// One generated request: its body, whether it carries JSON the sim bills nothing for (`tools`
/// or `tool_calls`), and whether it carries images.
struct Case {
    body: String,
    has_tools: bool,
    has_images: bool,
}

const WORDS: &[&str] = &[
    "the",
    "router",
    "shards",
    "requests",
    "by",
    "core",
    "and",
    "never",
    "shares",
    "a",
    "lock",
    "token",
    "budget",
    "résumé",
    "naïve",
    "café",
    "数据",
    "模型",
    "🙂",
    "\"quoted\"",
    "line\nbreak",
    "tab\there",
    "x = y + 1;",
    "fn main() {}",
    "https://example.com/a?b=c",
    "1234567890",
    "Qwen3-32B",
    "occupancy",
    "admission",
    "estimate",
    "—",
    "…",
    "{\"json\": true}",
];

fn text(rng: &mut fastrand::Rng, bytes_min: usize, bytes_max: usize) -> String {
    let target = rng.usize(bytes_min..=bytes_max);
    let mut text = String::new();
    while text.len() < target {
        if !text.is_empty() {
            text.push(if rng.u8(0..12) == 0 { '\n' } else { ' ' });
        }
        text.push_str(WORDS[rng.usize(0..WORDS.len())]);
    }
    text
}

fn tools(rng: &mut fastrand::Rng) -> Value {
    let tools: Vec<Value> = (0..rng.usize(1..=5))
        .map(|index| {
            json!({
                "type": "function",
                "function": {
                    "name": format!("tool_{index}"),
                    "description": text(rng, 40, 300),
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "query": {"type": "string", "description": text(rng, 10, 80)},
                            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                        },
                        "required": ["query"],
                    },
                },
            })
        })
        .collect();
    Value::Array(tools)
}

/// OpenAI chat: optional system message, 1-20 turns, some assistant turns textless with tool
/// calls, optional image parts and tools.
fn openai(rng: &mut fastrand::Rng, long: bool, with_tools: bool) -> Case {
    let mut messages = Vec::new();
    if rng.bool() {
        messages.push(json!({"role": "system", "content": text(rng, 20, 600)}));
    }
    let turns = if long { 1 } else { rng.usize(1..=20) };
    let has_images = !long && rng.u8(0..10) == 0;
    let mut has_tool_calls = false;
    for turn in 0..turns {
        let user = turn % 2 == 0;
        let content = if long {
            json!(text(rng, 4_000, 40_000))
        } else if has_images && turn == 0 {
            json!([
                {"type": "text", "text": text(rng, 10, 200)},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"}},
            ])
        } else if user && rng.u8(0..4) == 0 {
            json!([{"type": "text", "text": text(rng, 5, 800)}, {"type": "text", "text": text(rng, 5, 300)}])
        } else {
            json!(text(rng, 2, 1500))
        };
        if with_tools && !user && rng.u8(0..4) == 0 {
            has_tool_calls = true;
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "tool_0", "arguments": "{\"query\":\"x\"}"}},
            ]}));
            messages.push(
                json!({"role": "tool", "tool_call_id": "call_1", "content": text(rng, 10, 400)}),
            );
        } else {
            messages
                .push(json!({"role": if user { "user" } else { "assistant" }, "content": content}));
        }
    }
    let mut body = json!({"model": "sim-model", "messages": messages, "max_tokens": 256});
    let has_tools = with_tools && rng.u8(0..4) == 0;
    if has_tools {
        body["tools"] = tools(rng);
    }
    Case {
        body: body.to_string(),
        has_tools: has_tools || has_tool_calls,
        has_images,
    }
}

/// Anthropic messages: top-level system as a string or text blocks, 1-12 turns of text blocks,
/// optional tools.
fn anthropic(rng: &mut fastrand::Rng, with_tools: bool) -> Case {
    let mut body = json!({"model": "sim-model", "max_tokens": 256});
    match rng.u8(0..3) {
        0 => body["system"] = json!(text(rng, 20, 2000)),
        1 => {
            body["system"] = json!([
                {"type": "text", "text": text(rng, 20, 800), "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": text(rng, 5, 200)},
            ])
        }
        _ => {}
    }
    let messages: Vec<Value> = (0..rng.usize(1..=12))
        .map(|turn| {
            let role = if turn % 2 == 0 { "user" } else { "assistant" };
            if rng.bool() {
                json!({"role": role, "content": text(rng, 2, 2000)})
            } else {
                json!({"role": role, "content": [{"type": "text", "text": text(rng, 2, 2000)}]})
            }
        })
        .collect();
    body["messages"] = Value::Array(messages);
    let has_tools = with_tools && rng.u8(0..5) == 0;
    if has_tools {
        body["tools"] = json!([{"name": "weather", "description": text(rng, 40, 300),
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    }
    Case {
        body: body.to_string(),
        has_tools,
        has_images: false,
    }
}

/// 10 % long single-turn OpenAI requests, 50 % multi-turn OpenAI, 40 % Anthropic; with
/// `with_tools`, a quarter of OpenAI requests carry `tools`, a quarter of their assistant turns
/// are tool calls, and a fifth of Anthropic requests carry `tools`.
fn corpus(seed: u64, with_tools: bool) -> Vec<Case> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..CORPUS_REQUESTS)
        .map(|_| match rng.u8(0..10) {
            0 => openai(&mut rng, true, with_tools),
            1..=5 => openai(&mut rng, false, with_tools),
            _ => anthropic(&mut rng, with_tools),
        })
        .collect()
}

/// What the simulated engine bills for `body`: it parses OpenAI bodies as chat requests and
/// Anthropic ones (top-level `system`) as messages requests, as its two endpoints do.
fn sim_prompt_tokens(body: &str) -> u64 {
    if body.contains("\"system\":") {
        let request: MessagesRequest<'_> = serde_json::from_str(body).expect("sim parses");
        prompt_tokens(&request.messages, request.system.as_ref())
    } else {
        let request: ChatRequest<'_> = serde_json::from_str(body).expect("sim parses");
        prompt_tokens(&request.messages, None)
    }
}

/// Relative errors of scored estimates, and their totals.
#[derive(Default)]
struct Errors {
    relative: Vec<f64>,
    estimated_total: u64,
    exact_total: u64,
}

impl Errors {
    fn push(&mut self, estimated: u64, exact: u64) {
        self.relative
            .push((estimated as f64 - exact as f64).abs() / exact.max(1) as f64);
        self.estimated_total += estimated;
        self.exact_total += exact;
    }

    fn mean(&self) -> f64 {
        self.relative.iter().sum::<f64>() / self.relative.len().max(1) as f64
    }

    fn quantile(&self, quantile: f64) -> f64 {
        let mut sorted = self.relative.clone();
        sorted.sort_by(f64::total_cmp);
        let index = ((sorted.len() as f64 - 1.0) * quantile).round() as usize;
        sorted.get(index).copied().unwrap_or(0.0)
    }

    /// Signed error of the totals: what a budget charged from estimates would be off by.
    fn total_bias(&self) -> f64 {
        if self.exact_total == 0 {
            return 0.0;
        }
        self.estimated_total as f64 / self.exact_total as f64 - 1.0
    }

    fn summary(&self, name: &str) -> String {
        format!(
            "{name}: {} requests, mean {:.2} %, p95 {:.2} %, max {:.2} %, total bias {:+.2} %",
            self.relative.len(),
            self.mean() * 100.0,
            self.quantile(0.95) * 100.0,
            self.quantile(1.0) * 100.0,
            self.total_bias() * 100.0
        )
    }
}

/// Errors of one online run over a corpus, scored after the warm-up.
struct Run {
    text_only: Errors,
    with_tools: Errors,
    with_images: Errors,
    /// Every scored request, estimated at the starting ratio instead.
    unlearned: Errors,
    tokens_per_byte: f64,
}

impl Run {
    fn report(&self, name: &str) -> String {
        [
            format!("{name}, seed {SEED:#x}"),
            self.text_only.summary("text only"),
            self.with_tools.summary("with tools or tool calls"),
            self.with_images.summary("with images (not trained)"),
            self.unlearned.summary("all, at the starting ratio"),
            format!("learned ratio {:.4}", self.tokens_per_byte),
        ]
        .join("\n")
    }
}

/// Estimate each request as admission does, then observe its exact sim usage.
fn run(cases: &[Case]) -> Run {
    let model = ModelId(3);
    let mut estimator = Estimator::default();
    let mut run = Run {
        text_only: Errors::default(),
        with_tools: Errors::default(),
        with_images: Errors::default(),
        unlearned: Errors::default(),
        tokens_per_byte: 0.0,
    };
    for (index, case) in cases.iter().enumerate() {
        let shape = extract_fields(case.body.as_bytes())
            .unwrap_or_else(|error| panic!("seed {SEED:#x} case {index}: {error}"))
            .prompt;
        assert_eq!(
            shape.images > 0,
            case.has_images,
            "seed {SEED:#x} case {index}"
        );
        let exact = sim_prompt_tokens(&case.body);
        let estimated = estimator.estimate(model, &shape);
        if index >= WARM_UP {
            run.unlearned
                .push(Estimator::default().estimate(model, &shape), exact);
            match (case.has_images, case.has_tools) {
                (true, _) => run.with_images.push(estimated, exact),
                (false, true) => run.with_tools.push(estimated, exact),
                (false, false) => run.text_only.push(estimated, exact),
            }
        }
        estimator.observe(model, &shape, exact);
    }
    run.tokens_per_byte = estimator.tokens_per_byte(model);
    run
}

/// The bound: after a warm-up of 50 observations, tool-free requests are estimated on average
/// within 0.5 % of what the sim bills, 95 % of them within 1 %, every one within 5 %, and the
/// estimates' total within 0.5 % of the exact total — the error a budget charged from estimates
/// carries before the exact-usage true-up. (Measured at this seed: mean 0.05 %, p95 0.14 %, max
/// 2.4 %, total +0.04 %.) What error remains comes from short texts, where the sim's `ceil`
/// makes the true ratio of a 10-byte message 0.3 rather than 0.25.
#[test]
fn tool_free_corpus_converges_to_simulated_usage() {
    let run = run(&corpus(SEED, false));
    let context = run.report("tool-free corpus");
    println!("{context}");
    assert!(run.text_only.relative.len() > 900, "{context}");
    assert!(run.with_tools.relative.is_empty(), "{context}");
    assert!(run.text_only.mean() < 0.005, "{context}");
    assert!(run.text_only.quantile(0.95) < 0.01, "{context}");
    assert!(run.text_only.quantile(1.0) < 0.05, "{context}");
    assert!(run.text_only.total_bias().abs() < 0.005, "{context}");
    // Images are not trained on, and their text is estimated like any other.
    assert!(run.with_images.total_bias().abs() < 0.01, "{context}");
    // Learning matters: at the starting ratio the same requests are about 25 % high.
    assert!(run.unlearned.total_bias() > 0.15, "{context}");
    assert!((0.245..0.26).contains(&run.tokens_per_byte), "{context}");
}

/// With tools: the estimator counts `tools` and `tool_calls` JSON as text (seed; real engines
/// render them into the prompt) while the sim bills none of it. The learned ratio is pulled
/// under 0.25, so tool-free requests come out low and tool-bearing ones high. The bounds state
/// how far: tool-free totals within 8 % low, tool-bearing totals high but within 15 %, the
/// whole corpus within 3 % (measured at this seed: -4.6 %, +2.7 %, learned ratio 0.235) — an
/// artefact of the sim's billing that the integrator should know, not an estimator fault.
#[test]
fn tool_bearing_corpus_stays_within_stated_bias() {
    let run = run(&corpus(SEED, true));
    let context = run.report("corpus with tools");
    println!("{context}");
    assert!(run.text_only.relative.len() > 300, "{context}");
    assert!(run.with_tools.relative.len() > 300, "{context}");
    let text_bias = run.text_only.total_bias();
    let tools_bias = run.with_tools.total_bias();
    assert!((-0.08..0.0).contains(&text_bias), "{context}");
    assert!((0.0..0.15).contains(&tools_bias), "{context}");
    let mut all = Errors::default();
    for errors in [&run.text_only, &run.with_tools, &run.with_images] {
        all.estimated_total += errors.estimated_total;
        all.exact_total += errors.exact_total;
    }
    assert!(all.total_bias().abs() < 0.03, "{context}");
    assert!((0.2..0.25).contains(&run.tokens_per_byte), "{context}");
}

#[test]
fn tool_free_text_converges_to_the_simulated_ratio() {
    // Long tool-free requests only: the sim's ceil is negligible, so the ratio converges to 0.25
    // and the estimate to within one token of exact (the two ceilings).
    let model = ModelId(4);
    let mut estimator = Estimator::default();
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut last_errors = Vec::new();
    for index in 0..200 {
        let body = json!({"model": "sim-model", "messages": [
            {"role": "system", "content": text(&mut rng, 200, 400)},
            {"role": "user", "content": text(&mut rng, 8_000, 20_000)},
        ]})
        .to_string();
        let shape = extract_fields(body.as_bytes()).unwrap().prompt;
        let exact = sim_prompt_tokens(&body);
        if index >= 100 {
            last_errors.push(estimator.estimate(model, &shape).abs_diff(exact));
        }
        estimator.observe(model, &shape, exact);
    }
    let ratio = estimator.tokens_per_byte(model);
    assert!((ratio - 0.25).abs() < 1e-3, "seed {SEED:#x}: ratio {ratio}");
    // Within 2 tokens on 8-20 KB prompts (about 2 000-5 000 tokens): the two ceilings plus the
    // sub-1e-3 ratio residue the per-request +1/bytes of the sim's ceil leaves.
    let worst = last_errors.iter().max().copied().unwrap_or(0);
    assert!(worst <= 6, "seed {SEED:#x}: worst error {worst} tokens");
}
