//! Proves that the Grafana dashboard of `deploy/grafana/` and the alert rules of
//! `deploy/prometheus/` query only metrics a running router exposes (one router with an agent, a
//! sim and `--sync-store valkey`, scraped once), that the rule files are valid Prometheus rules,
//! and that `deploy/kubernetes/prometheusrule.yaml` carries exactly their groups.
//!
//! The rules are checked by `promtool check rules` when `promtool` is on `PATH` (`scripts/test`
//! installs Debian's `prometheus` package, which ships it). Without it the test checks their
//! structure itself (groups, rules, alert, expr, for, labels, annotations) and says so on stderr
//! (`promtool` is used where it installs; a machine without Debian's packages still gets the
//! structural check).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::valkey::Valkey;
use common::{Options, Site};
use serde::Deserialize;
use serde_json::Value;

const DASHBOARDS: &str = "deploy/grafana";
const RULES: &str = "deploy/prometheus";
const PROMETHEUS_RULE: &str = "deploy/kubernetes/prometheusrule.yaml";

/// Metrics the reference's alerts query that this test's router does not expose: GPU gauges
/// come from NVML and are absent on a host without a GPU, as here. Their rules ship so that
/// operators keep the reference's alerts. The live test fails once one of them is exposed: then
/// remove it here.
const PENDING: [&str; 1] = ["hivenet_agent_gpu_temperature_celsius"];

/// Metrics the router exposes whose first series needs an event this site does not cause (a
/// family without series is not exposed, as the catalog says: "A metric is missing ... policy
/// counters appear after routing activity"), with the test that causes it and checks the family.
const EVENT_ONLY: [(&str, &str); 14] = [
    // A request served on an agent (this site's wallet refuses its request).
    ("hivenet_routing_requests_routed_total", "metrics_catalog"),
    ("hivenet_policy_primary_routed_total", "metrics_catalog"),
    // A request the router could not forward.
    ("hivenet_routing_requests_failed_total", "metrics_catalog"),
    // A key over its requests per minute, over its daily budget.
    ("hivenet_tenant_rate_limited_total", "metrics_catalog"),
    ("hivenet_tenant_token_limited_total", "metrics_catalog"),
    // A sibling map placing a model here with scale_from_zero.
    ("hivenet_pending_demand", "hold_at_zero"),
    // A fallback step serving, a provider answering, every step failing.
    ("hivenet_policy_fallback_routed_total", "policies"),
    (
        "hivenet_policy_provider_fallback_total",
        "provider_fallback",
    ),
    ("hivenet_policy_exhausted_total", "policies"),
    // A prompt ranked by a prefix-aware step.
    ("hivenet_prefix_index_hits_total", "routing_strategies"),
    ("hivenet_prefix_index_misses_total", "routing_strategies"),
    ("hivenet_prefix_matched_ratio_sum", "routing_strategies"),
    ("hivenet_prefix_matched_ratio_count", "routing_strategies"),
    ("hivenet_prefix_index_blocks", "routing_strategies"),
];

/// Metrics a dashboard panel reads from another exporter than the router, with that exporter.
const EXTERNAL: [(&str, &str); 1] = [(
    // The router exposes no process CPU counter: CPU per request divides the kubelet's
    // per-container CPU by the router's request rate.
    "container_cpu_usage_seconds_total",
    "the kubelet's cAdvisor",
)];

// ---------------------------------------------------------------------------------------------
// A small PromQL scan: the metric names an expression selects.

/// Aggregation operators, which may be followed by `by (...)` / `without (...)` before their
/// parenthesis.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Keywords followed by a list of label names in parentheses.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Binary operators and modifiers spelled as words.
const KEYWORDS: [&str; 9] = [
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start",
];

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The index after the string literal that starts at `at`.
fn skip_string(chars: &[char], at: usize) -> usize {
    let quote = chars[at];
    let mut index = at + 1;
    while index < chars.len() {
        match chars[index] {
            '\\' if quote != '`' => index += 2,
            c if c == quote => return index + 1,
            _ => index += 1,
        }
    }
    index
}

/// The index after the bracket that closes the one at `at` (strings inside are skipped).
fn skip_group(chars: &[char], at: usize) -> usize {
    let (open, close) = (chars[at], closing(chars[at]));
    let mut depth = 0;
    let mut index = at;
    while index < chars.len() {
        match chars[index] {
            '"' | '\'' | '`' => {
                index = skip_string(chars, index);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return index + 1;
                }
            }
            _ => {}
        }
        index += 1;
    }
    index
}

fn closing(open: char) -> char {
    match open {
        '(' => ')',
        '[' => ']',
        '{' => '}',
        other => panic!("no closing bracket for {other:?}"),
    }
}

/// The metric names `expr` selects, in order, without functions, aggregations, keywords, label
/// names (inside `{}` and in `by`/`without`/`on`/`ignoring`/`group_*` lists), durations, numbers
/// and Grafana variables (`$x`, `${x}`).
fn metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut index = 0;
    while index < chars.len() {
        let c = chars[index];
        if c == '"' || c == '\'' || c == '`' {
            index = skip_string(&chars, index);
        } else if c == '{' || c == '[' {
            index = skip_group(&chars, index);
        } else if c == '#' {
            while index < chars.len() && chars[index] != '\n' {
                index += 1;
            }
        } else if c == '$' {
            index += 1;
            if chars.get(index) == Some(&'{') {
                index = skip_group(&chars, index);
            } else {
                while index < chars.len() && is_name_char(chars[index]) {
                    index += 1;
                }
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(index + 1).is_some_and(char::is_ascii_digit))
        {
            // A number or a duration (`0.90`, `1e3`, `5m`).
            while index < chars.len() && (is_name_char(chars[index]) || chars[index] == '.') {
                index += 1;
            }
        } else if is_name_start(c) {
            let start = index;
            while index < chars.len() && is_name_char(chars[index]) {
                index += 1;
            }
            let word: String = chars[start..index].iter().collect();
            let mut next = index;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let followed_by_paren = chars.get(next) == Some(&'(');
            let lower = word.to_ascii_lowercase();
            if LABEL_LISTS.contains(&lower.as_str()) {
                if followed_by_paren {
                    index = skip_group(&chars, next);
                }
            } else if !followed_by_paren
                && !AGGREGATIONS.contains(&lower.as_str())
                && !KEYWORDS.contains(&lower.as_str())
            {
                names.push(word);
            }
        } else {
            index += 1;
        }
    }
    names
}

#[test]
fn the_scan_finds_metric_names_only() {
    let cases: [(&str, &[&str]); 6] = [
        ("hivenet_sync_up == 0", &["hivenet_sync_up"]),
        (
            "sum by (le, peer_id) (rate(x_bucket{a=\"b}\", model=~\"$model\"}[5m] offset 1h))",
            &["x_bucket"],
        ),
        ("(a / b) and on (model) b > 0.90", &["a", "b", "b"]),
        (
            "clamp_min(delta(c_total[$__rate_interval]), 0) > 1e3",
            &["c_total"],
        ),
        (
            "sum without (shard) (rate(d[5m])) / on (pod) group_left (node) e * bool 2",
            &["d", "e"],
        ),
        ("avg by(model)(f) > 750 unless g", &["f", "g"]),
    ];
    for (expr, expected) in cases {
        assert_eq!(metric_names(expr), expected, "{expr}");
    }
}

// ---------------------------------------------------------------------------------------------
// The documents.

fn repository(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The files of `dir` whose name ends with `suffix`, sorted.
fn files(dir: &str, suffix: &str) -> Vec<PathBuf> {
    let dir = repository(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no *{suffix} in {}", dir.display());
    files
}

fn yaml(file: &Path) -> Value {
    let text = std::fs::read_to_string(file).expect("a readable file");
    let mut documents: Vec<Value> = yaml_serde::Deserializer::from_str(&text)
        .map(|document| {
            Value::deserialize(document)
                .unwrap_or_else(|error| panic!("{}: {error}", file.display()))
        })
        .collect();
    assert_eq!(documents.len(), 1, "{}: one document", file.display());
    documents.remove(0)
}

fn dashboards() -> Vec<(PathBuf, Value)> {
    files(DASHBOARDS, ".json")
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).expect("a readable dashboard");
            let dashboard = serde_json::from_str(&text)
                .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
            (file, dashboard)
        })
        .collect()
}

/// Every panel of a dashboard, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        if let Some(nested) = panel["panels"].as_array() {
            all.extend(nested);
        }
    }
    all
}

/// The PromQL a template variable runs: the selector of `label_values(selector, label)`, or
/// its query as is.
fn variable_promql(variable: &Value) -> Option<String> {
    let query = match &variable["query"] {
        Value::String(query) => query.clone(),
        Value::Object(query) => query.get("query")?.as_str()?.to_owned(),
        _ => return None,
    };
    let query = query.trim();
    match query.strip_prefix("label_values(") {
        Some(arguments) => {
            let arguments = arguments.strip_suffix(')').expect("label_values(...)");
            // label_values(label) queries no metric; label_values(selector, label) one.
            arguments
                .rsplit_once(',')
                .map(|(selector, _)| selector.to_owned())
        }
        None => Some(query.to_owned()),
    }
}

/// Every PromQL expression of the dashboards and rules, with where it comes from.
fn expressions() -> Vec<(String, String)> {
    let mut all = Vec::new();
    for (file, dashboard) in dashboards() {
        let file = file.display();
        for panel in panels(&dashboard) {
            if panel["type"] == "row" {
                continue;
            }
            let title = panel["title"].as_str().expect("a panel title");
            let targets = panel["targets"].as_array().expect("panel targets");
            assert!(!targets.is_empty(), "{file}: panel {title:?} has no query");
            for target in targets {
                let expr = target["expr"].as_str().expect("a target expr");
                all.push((format!("{file}: panel {title:?}"), expr.to_owned()));
            }
        }
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let Some(promql) = variable_promql(variable) {
                all.push((format!("{file}: variable {}", variable["name"]), promql));
            }
        }
    }
    for (file, rules) in rule_files() {
        for group in rules["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                let name = rule["alert"].as_str().or(rule["record"].as_str());
                let expr = rule["expr"].as_str().expect("a rule expr");
                all.push((format!("{}: {name:?}", file.display()), expr.to_owned()));
            }
        }
    }
    all
}

fn rule_files() -> Vec<(PathBuf, Value)> {
    files(RULES, ".rules.yaml")
        .into_iter()
        .map(|file| {
            let rules = yaml(&file);
            (file, rules)
        })
        .collect()
}

#[test]
fn the_dashboard_reads_one_prometheus_input_and_every_panel_queries_a_metric() {
    for (file, dashboard) in dashboards() {
        let file = file.display();
        let inputs = dashboard["__inputs"].as_array().expect("__inputs");
        assert!(
            inputs
                .iter()
                .any(|input| input["name"] == "DS_PROMETHEUS" && input["pluginId"] == "prometheus"),
            "{file}: no DS_PROMETHEUS input"
        );
        let mut ids = BTreeSet::new();
        for panel in panels(&dashboard) {
            let title = panel["title"].as_str().expect("a panel title");
            assert!(
                ids.insert(panel["id"].as_u64()),
                "{file}: panel {title:?}: duplicate id"
            );
            if panel["type"] == "row" {
                continue;
            }
            assert_eq!(
                panel["datasource"]["uid"], "${DS_PROMETHEUS}",
                "{file}: {title:?}"
            );
            for target in panel["targets"].as_array().expect("targets") {
                assert_eq!(
                    target["datasource"]["uid"], "${DS_PROMETHEUS}",
                    "{file}: {title:?}"
                );
                let expr = target["expr"].as_str().expect("expr");
                assert!(
                    !metric_names(expr).is_empty(),
                    "{file}: panel {title:?} queries no metric: {expr}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The rules.

/// `5m`, `1h30m`, `500ms`: a Prometheus duration.
fn is_duration(text: &str) -> bool {
    let mut rest = text;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|unit| rest.starts_with(unit));
        match unit {
            Some(unit) => rest = &rest[unit.len()..],
            None => return false,
        }
    }
    true
}

fn is_string_map(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|map| map.values().all(Value::is_string))
}

/// What `promtool check rules` checks of the structure, plus this project's conventions: every
/// alert has a severity of `warning` or `critical`, names are unique across the files.
fn check_structure(file: &Path, rules: &Value, alerts: &mut BTreeMap<String, PathBuf>) {
    let file_name = file.display();
    let top = rules.as_object().expect("a map");
    assert_eq!(top.keys().collect::<Vec<_>>(), ["groups"], "{file_name}");
    let groups = rules["groups"].as_array().expect("groups");
    assert!(!groups.is_empty(), "{file_name}: no group");
    for group in groups {
        let name = group["name"].as_str().expect("a group name");
        for key in group.as_object().expect("a group").keys() {
            assert!(
                ["name", "interval", "limit", "rules"].contains(&key.as_str()),
                "{file_name}: group {name}: unknown field {key}"
            );
        }
        let rules = group["rules"].as_array().expect("rules");
        assert!(!rules.is_empty(), "{file_name}: group {name}: no rule");
        for rule in rules {
            let alert = rule["alert"].as_str().expect("an alert name");
            for key in rule.as_object().expect("a rule").keys() {
                assert!(
                    [
                        "alert",
                        "expr",
                        "for",
                        "keep_firing_for",
                        "labels",
                        "annotations"
                    ]
                    .contains(&key.as_str()),
                    "{file_name}: {alert}: unknown field {key}"
                );
            }
            assert!(
                alert.chars().all(|c| c.is_ascii_alphanumeric()) && alert.starts_with("Hivenet"),
                "{file_name}: alert name {alert}"
            );
            if let Some(previous) = alerts.insert(alert.to_owned(), file.to_owned()) {
                panic!("{alert} in {} and {file_name}", previous.display());
            }
            let expr = rule["expr"].as_str().expect("expr");
            assert!(!metric_names(expr).is_empty(), "{alert}: {expr}");
            let parens = expr.matches('(').count() == expr.matches(')').count();
            assert!(parens, "{file_name}: {alert}: unbalanced parentheses");
            if let Some(duration) = rule.get("for") {
                let duration = duration.as_str().expect("for: a string");
                assert!(
                    is_duration(duration),
                    "{file_name}: {alert}: for: {duration}"
                );
            }
            assert!(
                is_string_map(&rule["labels"]),
                "{file_name}: {alert}: labels"
            );
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("warning" | "critical")),
                "{file_name}: {alert}: severity {severity:?}"
            );
            if let Some(annotations) = rule.get("annotations") {
                assert!(
                    is_string_map(annotations),
                    "{file_name}: {alert}: annotations"
                );
            }
        }
    }
}

fn promtool() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("promtool"))
            .find(|candidate| candidate.is_file())
    })
}

fn promtool_check(promtool: &Path, file: &Path) {
    let output = Command::new(promtool)
        .args(["check", "rules"])
        .arg(file)
        .output()
        .unwrap_or_else(|error| panic!("{}: {error}", promtool.display()));
    assert!(
        output.status.success(),
        "promtool check rules {}:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_rules_parse_and_the_prometheus_rule_carries_them_all() {
    let mut alerts = BTreeMap::new();
    let mut groups = Vec::new();
    for (file, rules) in rule_files() {
        check_structure(&file, &rules, &mut alerts);
        groups.extend(rules["groups"].as_array().expect("groups").iter().cloned());
    }

    let operator = yaml(&repository(PROMETHEUS_RULE));
    assert_eq!(operator["kind"], "PrometheusRule");
    assert_eq!(
        operator["spec"]["groups"],
        Value::Array(groups.clone()),
        "{PROMETHEUS_RULE} differs from {RULES}/*.rules.yaml: run scripts/gen-prometheusrule"
    );

    if let Some(promtool) = promtool_or_structure_only("the rules") {
        for file in files(RULES, ".rules.yaml") {
            promtool_check(&promtool, &file);
        }
        // The operator's groups as a plain rules file (JSON is YAML).
        promtool_check_groups(&promtool, "prometheusrule", &operator["spec"]["groups"]);
    }
}

/// `promtool`, or `None` after saying on stderr that only `what`'s structure is checked.
fn promtool_or_structure_only(what: &str) -> Option<PathBuf> {
    let found = promtool();
    if found.is_none() {
        eprintln!(
            "promtool not on PATH: checked {what}' structure only (apt-get install prometheus)"
        );
    }
    found
}

/// Runs `promtool check rules` on `groups` written to a temporary rules file.
fn promtool_check_groups(promtool: &Path, name: &str, groups: &Value) {
    let file = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}.rules.yaml", std::process::id()));
    let plain = serde_json::json!({ "groups": groups });
    std::fs::write(&file, plain.to_string()).expect("a writable temp file");
    promtool_check(promtool, &file);
    let _ = std::fs::remove_file(&file);
}

/// A dashboard query as Prometheus receives it: Grafana's interval variables become `5m`, the
/// others (`$instance`, `$shard`, `$model`, all "All") `.*`.
fn substitute_variables(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let end = after
            .find(|c: char| !is_name_char(c))
            .unwrap_or(after.len());
        let name = &after[..end];
        out.push_str(if name.starts_with("__") { "5m" } else { ".*" });
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn the_dashboard_queries_are_valid_promql() {
    let mut rules = Vec::new();
    for (_, dashboard) in dashboards() {
        for panel in panels(&dashboard) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().expect("expr");
                let expr = substitute_variables(expr);
                assert!(!expr.contains('$'), "{expr}");
                let record = format!("dashboard:query_{}:{}", panel["id"], rules.len());
                rules.push(serde_json::json!({ "record": record, "expr": expr }));
            }
        }
    }
    // Each query as a recording rule: promtool parses its PromQL.
    if let Some(promtool) = promtool_or_structure_only("the dashboard queries") {
        let groups = serde_json::json!([{ "name": "dashboard", "rules": rules }]);
        promtool_check_groups(&promtool, "dashboard", &groups);
    }
}

// ---------------------------------------------------------------------------------------------
// Against a running router.

/// The metric families a scrape exposes (`# TYPE` lines, which a family has before its first
/// sample), by name, with their type; plus the names of every sample.
fn exposed(scrape: &str) -> (BTreeMap<String, String>, BTreeSet<String>) {
    let mut families = BTreeMap::new();
    let mut samples = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            families.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            samples.insert(line[..end].to_owned());
        }
    }
    (families, samples)
}

/// Whether `name`, as a query writes it, is exposed: a family, a sample, or a histogram's
/// `_bucket`/`_sum`/`_count` series, or a counter whose family drops `_total` (OpenMetrics).
fn is_exposed(name: &str, families: &BTreeMap<String, String>, samples: &BTreeSet<String>) -> bool {
    if families.contains_key(name) || samples.contains(name) {
        return true;
    }
    let histogram = ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix).is_some_and(|family| {
            matches!(
                families.get(family).map(String::as_str),
                Some("histogram" | "summary")
            )
        })
    });
    let counter = name
        .strip_suffix("_total")
        .is_some_and(|family| families.get(family).is_some_and(|kind| kind == "counter"));
    histogram || counter
}

/// A model policy with a token budget and a concurrency limit, so the admission gauges exist.
fn policy_dir() -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dashboards-policies-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a writable temp dir");
    std::fs::write(
        dir.join("sim-model.yaml"),
        "models:\n  - sim-model\nrouting_policy:\n  strategy: least-loaded\n\
         admit_budget_tokens: 100000\nmax_inflight: 4\n",
    )
    .expect("a writable policy");
    dir.display().to_string()
}

#[test]
fn every_metric_a_panel_or_rule_queries_is_exposed() {
    let store = Valkey::primary();
    let addrs = store.addr();
    let policies = policy_dir();
    let site = Site::start(
        "dashboards",
        Options::new()
            .sim(&["--models", "sim-model,plain-model"])
            .models(&["sim-model", "plain-model"])
            .agent(0, &[])
            .router_args(&[
                "--sync-store",
                "valkey",
                "--sync-valkey-addrs",
                &addrs,
                "--router-id",
                "dashboards",
                "--sync-interval",
                "200ms",
                "--policy-model-dir",
                &policies,
            ]),
    );
    // The sync families are there from the start; wait for the first round so the scrape shows
    // a router that reached its store.
    site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    // Families have no series (and are not exposed) until their first event. A request to
    // `sim-model` gives the admission ones theirs: this site's occupancy wallet, with no credit
    // granted through a store younger than the settle window, refuses it with 429, and the
    // refusal is the event. One answered request to `plain-model` (no policy) gives the request
    // and tenant families, the agent's latency (SRTT) and the engine's TTFT; wait for the
    // agent's engine report that follows it.
    let (status, _, body) =
        site.post_json("/v1/chat/completions", &common::chat("sim-model", false));
    assert!(status == 200 || status == 429, "{status} {body}");
    site.assert_chat_ok("plain-model");
    site.wait_metric("hivenet_agent_engine_p90_ttft_seconds", |_| true);
    let scrape = site.router_metrics();
    let (families, samples) = exposed(&scrape);

    let mut missing = Vec::new();
    let mut queried = BTreeSet::new();
    for (source, expr) in expressions() {
        for name in metric_names(&expr) {
            queried.insert(name.clone());
            let external = EXTERNAL.iter().any(|(external, _)| *external == name);
            let event_only = EVENT_ONLY.iter().any(|(event, _)| *event == name);
            if external || event_only || PENDING.contains(&name.as_str()) {
                continue;
            }
            if !is_exposed(&name, &families, &samples) {
                missing.push(format!("{source}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "queried but not exposed by the router:\n{}\n\nexposed families:\n{}",
        missing.join("\n"),
        families.keys().cloned().collect::<Vec<_>>().join("\n")
    );

    // The exceptions stay honest: each is still queried, and a pending one is still absent.
    for (name, exporter) in EXTERNAL {
        assert!(
            queried.contains(name),
            "{name} ({exporter}) is no longer queried"
        );
        assert!(
            !is_exposed(name, &families, &samples),
            "the router now exposes {name}"
        );
    }
    for (name, test) in EVENT_ONLY {
        assert!(
            queried.contains(name),
            "{name} (tests/{test}.rs) is no longer queried"
        );
    }
    for name in PENDING {
        assert!(
            queried.contains(name),
            "{name} is pending but no longer queried"
        );
        assert!(
            !is_exposed(name, &families, &samples),
            "{name} is exposed now: remove it from PENDING"
        );
    }
    // Every family the seeds' "Monitor" sections name is on a panel.
    for name in [
        "hivenet_sync_up",
        "hivenet_sync_peers",
        "hivenet_sync_lag_seconds",
        "hivenet_sync_tick_seconds_bucket",
        "hivenet_sync_errors_total",
        "hivenet_sync_unknown_routers",
        "hivenet_occupancy_credit_seconds_bucket",
        "hivenet_occupancy_credit_errors_total",
        "hivenet_occupancy_credit_reclaims_total",
        "hivenet_admission_reaped_total",
        "hivenet_pending_demand",
        "hivenet_wake_holds_total",
        "hivenet_wake_hold_seconds_bucket",
        "hivenet_admission_rejections_total",
        "hivenet_admission_occupancy_tokens",
    ] {
        assert!(queried.contains(name), "no panel or rule queries {name}");
    }
}
