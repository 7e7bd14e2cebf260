//! Proves that a running router (two agents, two sims, API keys with limits, a model policy)
//! exposes every metric of the reference catalog `observability-prometheus-metrics.mdx` with the
//! catalog's type and label names, once requests that succeed, are refused by a limit and time out
//! have gone through. The list of names, types and labels is read from the catalog itself (its
//! code blocks, label blocks, tables and queries), not from the router's code.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use common::{Options, Site, chat, request};
use sha2::{Digest, Sha256};

/// The reference's catalog page, copied verbatim from the product reference (MIT, see
/// `tests/reference/LICENSE`) so that the test runs from a clean checkout.
const CATALOG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/reference/observability-prometheus-metrics.mdx"
);

/// Agent families a site without a GPU and with a vLLM-like engine (the sim) has no value for:
/// absent, not zero, as the catalog's "A metric is missing" says. Each is checked for type and
/// labels when present; the unit tests of `agent::gpu` and `agent::engine_report` map them.
const ABSENT_ON_THIS_SITE: [(&str, &str); 8] = [
    (
        "hivenet_agent_gpu_power_watts",
        "no GPU (NVML) on the agent's host",
    ),
    (
        "hivenet_agent_gpu_temperature_celsius",
        "no GPU (NVML) on the agent's host",
    ),
    (
        "hivenet_agent_gpu_utilization_percent",
        "no GPU (NVML) on the agent's host",
    ),
    (
        "hivenet_agent_gpu_vram_free_bytes",
        "no GPU (NVML) on the agent's host",
    ),
    (
        "hivenet_agent_gpu_vram_total_bytes",
        "no GPU (NVML) on the agent's host",
    ),
    (
        "hivenet_agent_gpu_vram_used_bytes",
        "no GPU (NVML) on the agent's host",
    ),
    (
        "hivenet_agent_engine_predicted_tps",
        "llama.cpp only; the sim speaks vLLM's metrics",
    ),
    (
        "hivenet_agent_engine_prompt_tps",
        "llama.cpp only; the sim speaks vLLM's metrics",
    ),
];

/// Router families of the catalog this router does not expose yet (`docs/metrics.md` says why). The
/// test fails once one of them is exposed: drop it from here then.
const NOT_YET_EXPOSED: [&str; 0] = [];

/// Families this router exposes, whose first series needs an event this test does not cause:
/// the catalog's "A metric is missing" ("policy counters appear after routing activity"). Each
/// is proved by the test named beside it; here only its absence is allowed, and a series that is
/// there must still have the catalog's type and labels.
const NEEDS_ANOTHER_EVENT: [(&str, &str); 5] = [
    // A request that waited in a model's capacity queue: tests/capacity_queue.rs.
    ("hivenet_queue_wait_seconds", "capacity_queue"),
    // A fallback step that served: tests/policies.rs.
    ("hivenet_policy_fallback_routed_total", "policies"),
    // A provider answering for the model: tests/provider_fallback.rs.
    (
        "hivenet_policy_provider_fallback_total",
        "provider_fallback",
    ),
    ("http_client_request_duration_seconds", "provider_fallback"),
    // Every step of a policy unable to serve: tests/policies.rs.
    ("hivenet_policy_exhausted_total", "policies"),
];

// ---------------------------------------------------------------------------------------------
// The catalog, read from its markdown.

/// One metric as the catalog defines it.
#[derive(Debug, Default, Clone)]
struct Definition {
    kind: &'static str,
    /// The label names the catalog gives.
    labels: BTreeSet<String>,
    /// Whether `labels` is the complete list (a label block or table) rather than the labels
    /// the catalog's queries group by.
    labels_complete: bool,
}

/// Index of a `##` section and of a `###` section (`None` before the first `###` of its `##`).
type Section = (usize, Option<usize>);

/// A fenced code block with where it sits in the page.
struct Block {
    lines: Vec<String>,
    /// The last non-empty line before the fence.
    intro: String,
    section: Section,
}

fn is_metric(word: &str) -> bool {
    (word.starts_with("hivenet_") || word.starts_with("http_"))
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

fn is_label(word: &str) -> bool {
    !word.is_empty()
        && !is_metric(word)
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The blocks of the page, and its prose lines with their sections.
fn blocks(text: &str) -> (Vec<Block>, Vec<(String, Section)>) {
    let mut blocks = Vec::new();
    let mut prose = Vec::new();
    let (mut h2, mut h3) = (0usize, None);
    let mut h3_count = 0usize;
    let mut intro = String::new();
    let mut open: Option<Vec<String>> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(lines) = open.as_mut() {
            if trimmed.starts_with("```") {
                blocks.push(Block {
                    lines: open.take().unwrap(),
                    intro: intro.clone(),
                    section: (h2, h3),
                });
            } else {
                lines.push(trimmed.to_owned());
            }
            continue;
        }
        if trimmed.starts_with("```") {
            open = Some(Vec::new());
        } else if trimmed.starts_with("## ") {
            h2 += 1;
            h3 = None;
        } else if trimmed.starts_with("### ") {
            h3_count += 1;
            h3 = Some(h3_count);
        } else if !trimmed.is_empty() {
            intro = trimmed.to_owned();
            prose.push((trimmed.to_owned(), (h2, h3)));
        }
    }
    (blocks, prose)
}

/// Every metric the catalog defines: names listed alone in a code block, with the labels of the
/// label blocks of their section (or of their `##` section), the tables' type and labels, and
/// the labels their section's queries group by.
fn catalog() -> BTreeMap<String, Definition> {
    let text = std::fs::read_to_string(CATALOG).expect("the reference catalog");
    let (blocks, prose) = blocks(&text);
    let mut defined: BTreeMap<String, Section> = BTreeMap::new();
    // Label blocks by scope: a `###` section's, or a `##` section's own (before its first `###`).
    let mut scoped: BTreeMap<Section, BTreeSet<String>> = BTreeMap::new();
    let mut additional: BTreeMap<Section, BTreeSet<String>> = BTreeMap::new();
    for block in &blocks {
        let words: Vec<&str> = block
            .lines
            .iter()
            .map(String::as_str)
            .filter(|l| !l.is_empty())
            .collect();
        if !words.is_empty() && words.iter().all(|word| is_metric(word)) {
            for word in words {
                defined.entry(word.to_owned()).or_insert(block.section);
            }
        } else if !words.is_empty() && words.iter().all(|word| is_label(word)) {
            let intro = block.intro.as_str();
            let labels = words.iter().map(|w| w.to_string());
            if intro == "Additional label:" {
                additional.entry(block.section).or_default().extend(labels);
            } else if intro.ends_with("use:") || intro == "Labels:" || intro == "Label:" {
                scoped.entry(block.section).or_default().extend(labels);
            }
        }
    }
    let mut catalog = BTreeMap::new();
    for (name, section) in &defined {
        let mut definition = Definition::default();
        let own = scoped.get(section);
        let parent = scoped.get(&(section.0, None));
        if let Some(labels) = own.or(parent) {
            definition.labels = labels.clone();
            definition.labels_complete = true;
        }
        for scope in [*section, (section.0, None)] {
            if let Some(labels) = additional.get(&scope) {
                definition.labels.extend(labels.iter().cloned());
            }
        }
        // "All use the `model` label."
        for (line, at) in &prose {
            if at == section
                && let Some(rest) = line.split("use the `").nth(1)
                && let Some((label, tail)) = rest.split_once('`')
                && tail.trim_start().starts_with("label")
            {
                definition.labels.insert(label.to_owned());
                definition.labels_complete = true;
            }
        }
        // The labels the section's queries group by.
        for block in blocks.iter().filter(|b| b.section == *section) {
            let query = block.lines.join(" ");
            if !query.contains(name.as_str()) {
                continue;
            }
            for grouped in query.split("by (").skip(1) {
                let list = grouped.split(')').next().unwrap_or("");
                for label in list.split(',').map(str::trim) {
                    if is_label(label) && label != "le" {
                        definition.labels.insert(label.to_owned());
                    }
                }
            }
        }
        let in_section = |needle: &str| {
            prose
                .iter()
                .any(|(l, at)| at == section && l.contains(needle))
        };
        definition.kind = if text.contains(&format!("{name}_bucket")) {
            "histogram"
        } else if in_section("exported as a gauge") {
            "gauge"
        } else if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        catalog.insert(name.clone(), definition);
    }
    // Tables with a Type and a Labels column (admission control) give both exactly.
    let mut columns: Option<(usize, usize)> = None;
    for line in text.lines().map(str::trim) {
        if !line.starts_with('|') {
            columns = None;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if columns.is_none() {
            let kind = cells.iter().position(|c| *c == "Type");
            let labels = cells.iter().position(|c| *c == "Labels");
            if let (Some(kind), Some(labels)) = (kind, labels) {
                columns = Some((kind, labels));
            }
            continue;
        }
        let (Some((kind, labels)), Some(name)) = (columns, cells.first()) else {
            continue;
        };
        let name = name.trim_matches('`');
        if !is_metric(name) {
            continue;
        }
        let definition = catalog.entry(name.to_owned()).or_default();
        definition.kind = if cells[kind].eq_ignore_ascii_case("counter") {
            "counter"
        } else if cells[kind].eq_ignore_ascii_case("histogram") {
            "histogram"
        } else {
            "gauge"
        };
        definition.labels = cells[labels]
            .split(',')
            .map(|label| label.trim().trim_matches('`').to_owned())
            .filter(|label| is_label(label))
            .collect();
        definition.labels_complete = true;
    }
    catalog
}

// ---------------------------------------------------------------------------------------------
// The scrape.

/// Families by name: type, and the label names of each series (`le` left out).
fn scraped(text: &str) -> BTreeMap<String, (String, BTreeSet<BTreeSet<String>>)> {
    let mut families: BTreeMap<String, (String, BTreeSet<BTreeSet<String>>)> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            families.insert(name.to_owned(), (kind.to_owned(), BTreeSet::new()));
            current = name.to_owned();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((_, label_text)) = line.split_once('{') else {
            if let Some(family) = families.get_mut(&current) {
                family.1.insert(BTreeSet::new());
            }
            continue;
        };
        let label_text = label_text.rsplit_once('}').map_or("", |(labels, _)| labels);
        let mut names = BTreeSet::new();
        let mut rest = label_text;
        while let Some((name, after)) = rest.split_once("=\"") {
            names.insert(name.trim_start_matches(',').to_owned());
            // Skip the value, honouring escaped quotes.
            let mut end = 0;
            let bytes = after.as_bytes();
            while end < bytes.len() && bytes[end] != b'"' {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
            rest = &after[(end + 1).min(after.len())..];
        }
        names.remove("le");
        if let Some(family) = families.get_mut(&current) {
            family.1.insert(names);
        }
    }
    families
}

#[test]
fn the_catalog_is_read_from_the_reference() {
    let catalog = catalog();
    // Spot checks that the reading works; the live test below checks every name.
    assert!(catalog.len() > 60, "{} names", catalog.len());
    let info = &catalog["hivenet_routing_agent_info"];
    assert_eq!(info.kind, "gauge");
    assert!(info.labels_complete);
    assert!(info.labels.contains("capacity") && info.labels.contains("machine"));
    assert_eq!(catalog["hivenet_queue_wait_seconds"].kind, "histogram");
    assert_eq!(
        catalog["hivenet_agent_engine_preemptions_total"].kind,
        "gauge"
    );
    assert_eq!(
        catalog["hivenet_admission_rejections_total"].kind,
        "counter"
    );
    assert_eq!(
        catalog["hivenet_admission_rejections_total"].labels,
        ["model", "reason"].map(String::from).into()
    );
    assert!(
        catalog["hivenet_agent_engine_request_success_total"]
            .labels
            .contains("finished_reason")
    );
    assert_eq!(
        catalog["hivenet_policy_exhausted_total"].labels,
        ["model"].map(String::from).into()
    );
    assert!(catalog.contains_key("http_client_request_duration_seconds"));
    let events = NEEDS_ANOTHER_EVENT.map(|(name, _)| name);
    let absent = ABSENT_ON_THIS_SITE.map(|(name, _)| name);
    for name in absent.iter().chain(&NOT_YET_EXPOSED).chain(&events) {
        assert!(catalog.contains_key(*name), "{name} is not in the catalog");
    }
}

// ---------------------------------------------------------------------------------------------
// Against a running router.

const FAST_KEY: &str = "sk-catalog-fast";
const LIMITED_KEY: &str = "sk-catalog-limited";
const NO_TOKENS_KEY: &str = "sk-catalog-no-tokens";
const PER_MODEL_KEY: &str = "sk-catalog-per-model";

/// Three keys of tenant `acme` (one with a high limit, one allowed two requests a minute, one
/// with a daily budget of one token) and one of `globex` with a per-model quota.
fn auth_file() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("metrics-catalog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let entry = |raw: &str, name: &str, quota: &str| {
        let owner = if raw == PER_MODEL_KEY {
            "globex"
        } else {
            "acme"
        };
        format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...{name}\"\n      metadata:\n        name: \"{name}\"\n        owner: \"{owner}\"\n      quota:\n{quota}",
            hex::encode(Sha256::digest(raw.as_bytes()))
        )
    };
    let text = format!(
        "api:\n  mode: api-key\n  keys:\n{}{}{}{}",
        entry(FAST_KEY, "fast", "        requests_per_minute: 1000\n"),
        entry(LIMITED_KEY, "limited", "        requests_per_minute: 2\n"),
        entry(NO_TOKENS_KEY, "no-tokens", "        tokens_per_day: 1\n"),
        entry(
            PER_MODEL_KEY,
            "per-model",
            "        per_model:\n          sim-model: {requests_per_minute_per_replica: 100, tokens_per_day: 1000000}\n"
        ),
    );
    let path = dir.join("auth.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// A model policy with a token budget and a concurrency limit, so the admission gauges exist.
fn policy_dir() -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("metrics-catalog-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sim-model.yaml"),
        "models:\n  - sim-model\nrouting_policy:\n  strategy: least-loaded\n\
         admit_budget_tokens: 100000\nmax_inflight: 4\n",
    )
    .unwrap();
    dir.display().to_string()
}

fn post(site: &Site, key: &str, model: &str) -> (u16, String) {
    post_as(site, key, model, false)
}

fn post_as(site: &Site, key: &str, model: &str, stream: bool) -> (u16, String) {
    let body = chat(model, stream).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let response = request(site.http, raw.as_bytes());
    (
        response.status,
        String::from_utf8_lossy(&response.body).into_owned(),
    )
}

fn expect(site: &Site, key: &str, model: &str, status: u16) {
    let (got, body) = post(site, key, model);
    assert_eq!(got, status, "{model} with {key}: {body}\n{}", site.logs());
}

#[test]
fn a_running_router_exposes_the_whole_catalog() {
    let auth = auth_file();
    let policies = policy_dir();
    let site = Site::start(
        "metrics-catalog",
        Options::new()
            .sim(&["--models", "sim-model"])
            // The slow model answers after the router's deadline: a request it cannot forward.
            .sim(&["--models", "slow-model", "--ttft", "30s"])
            .agent(0, &["--deployment-id", "deploy-42"])
            .agent(1, &[])
            .api_key(FAST_KEY)
            .router_args(&[
                "--auth-config-file",
                auth.to_str().unwrap(),
                "--request-timeout",
                "2s",
                "--policy-model-dir",
                &policies,
            ]),
    );
    site.wait_models(&["sim-model", "slow-model"]);
    expect(&site, FAST_KEY, "sim-model", 200);
    // A streamed answer comes token by token: the engine's inter-token latency has samples.
    let (status, body) = post_as(&site, FAST_KEY, "sim-model", true);
    assert_eq!(status, 200, "{body}");
    // The limit is split over the shards: ask until one refuses.
    let refused = (0..20).any(|_| post(&site, LIMITED_KEY, "sim-model").0 == 429);
    assert!(refused, "no 429 for a key allowed 2 requests a minute");
    expect(&site, NO_TOKENS_KEY, "sim-model", 429);
    expect(&site, FAST_KEY, "slow-model", 504);
    // The engine families come with the agent's next engine report after a served request.
    site.wait_metric("hivenet_agent_engine_p90_itl_seconds", |_| true);
    // The host's CPU use needs two samples of `/proc/stat`, a few seconds apart.
    site.wait_metric("hivenet_agent_cpu_usage_percent", |_| true);
    let scrape = site.router_metrics();
    let families = scraped(&scrape);

    let mut problems = Vec::new();
    for (name, definition) in catalog() {
        if NOT_YET_EXPOSED.contains(&name.as_str()) {
            continue;
        }
        let Some((kind, series)) = families.get(&name) else {
            let allowed = NEEDS_ANOTHER_EVENT.iter().any(|(event, _)| *event == name)
                || ABSENT_ON_THIS_SITE
                    .iter()
                    .any(|(absent, _)| *absent == name);
            if !allowed {
                problems.push(format!("{name}: absent"));
            }
            continue;
        };
        if kind != definition.kind {
            problems.push(format!("{name}: type {kind}, catalog {}", definition.kind));
        }
        for labels in series {
            let mut labels = labels.clone();
            // Series kept per shard carry `shard` besides the catalog's labels.
            labels.remove("shard");
            let fits = if definition.labels_complete {
                labels == definition.labels
            } else {
                labels.is_superset(&definition.labels)
            };
            if !fits {
                problems.push(format!(
                    "{name}: labels {labels:?}, catalog {:?}{}",
                    definition.labels,
                    if definition.labels_complete {
                        ""
                    } else {
                        " at least"
                    }
                ));
            }
        }
    }
    for name in NOT_YET_EXPOSED {
        if families.contains_key(name) {
            problems.push(format!(
                "{name} is exposed now: remove it from NOT_YET_EXPOSED"
            ));
        }
    }
    assert!(problems.is_empty(), "{}\n\n{scrape}", problems.join("\n"));
}
