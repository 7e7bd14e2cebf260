//! Proves that the router's `/metrics` carries the `hivenet_agent_*` families from what a real
//! agent reports and what the router saw of its requests: lifetime counts that match the requests
//! sent, with the catalog's labels (`organization` and `machine` as the agent was started with);
//! SRTT/RTTVAR; capacity utilization; the engine's gauges, finish reasons and raw TTFT histogram
//! read from the simulator's vLLM exposition; the host's CPU and memory; and no GPU series on a
//! host without NVML (absent, not zero). Then that the lifetime counts continue when the agent
//! connects again, and that `POST /admin/metrics/reset` clears them.

mod common;

use common::{
    Options, Site, metric_absent, metric_sum, metric_sum_present, poll, request, write_temp,
};

const MODEL: &str = "sim-model";
const ADMIN_KEY: &str = "agent-metrics-admin-1";
const REQUESTS: usize = 5;
/// The simulator's time to first token. Without one its first token follows admission within a
/// microsecond, below the resolution of its histogram's sum, and the engine's mean reads 0.
const ENGINE_TTFT_SECONDS: f64 = 0.002;

fn labels() -> [(&'static str, &'static str); 4] {
    [
        ("model", MODEL),
        ("engine", "vllm"),
        ("organization", "ml-team"),
        ("machine", "box-1"),
    ]
}

/// A router whose admin API takes [`ADMIN_KEY`] (clients need no key).
fn start() -> Site {
    let auth = write_temp(
        "agent-metrics-auth.yaml",
        "api:\n  mode: none\nadmin:\n  mode: api-key\n",
    );
    let options = Options::new()
        .router_args(&["--auth-config-file", &auth])
        .router_env("HIVENET_ROUTER_ADMIN_API_KEYS", ADMIN_KEY);
    Site::start(
        "agent_metrics",
        options
            .sim(&[
                "--models",
                MODEL,
                "--ttft",
                "2ms",
                "--prefix-cache-blocks",
                "64",
                "--block-tokens",
                "2",
            ])
            .agent(
                0,
                &[
                    "--organization",
                    "ml-team",
                    "--machine",
                    "box-1",
                    "--region",
                    "eu-test",
                    "--engine-sample-interval",
                    "100ms",
                ],
            ),
    )
}

/// Polls the router's `/metrics` until `name` with the agent's labels satisfies `predicate`.
fn wait_agent_metric(site: &Site, name: &str, predicate: impl Fn(f64) -> bool) -> String {
    poll(common::WAIT, || {
        let text = site.router_metrics();
        let value = metric_sum_present(&text, name, &labels())?;
        predicate(value).then_some(text)
    })
    .unwrap_or_else(|| {
        panic!(
            "{name}{:?} never satisfied the wait\n{}\n{}",
            labels(),
            site.router_metrics(),
            site.logs()
        )
    })
}

#[test]
fn agent_families_are_on_the_router_with_the_catalog_labels() {
    let site = start();
    for _ in 0..REQUESTS {
        site.assert_chat_ok(MODEL);
    }
    // The engine's finish-reason counter starts from the agent's first report (the baseline):
    // wait until the router has seen the completions counted after it.
    let text = wait_agent_metric(&site, "hivenet_agent_engine_ttft_seconds_count", |count| {
        count >= REQUESTS as f64
    });
    let agent = labels();

    // Router-side lifetime counters: every request succeeded on the one agent.
    assert_eq!(
        metric_sum(&text, "hivenet_agent_requests_success_total", &agent),
        REQUESTS as f64
    );
    assert_eq!(
        metric_sum(&text, "hivenet_agent_requests_failed_total", &agent),
        0.0
    );
    assert_eq!(metric_sum(&text, "hivenet_agent_success_rate", &agent), 1.0);
    assert!(metric_sum(&text, "hivenet_agent_input_tokens_total", &agent) > 0.0);
    assert!(metric_sum(&text, "hivenet_agent_output_tokens_total", &agent) > 0.0);
    let srtt = metric_sum(&text, "hivenet_agent_srtt_ms", &agent);
    assert!(srtt > 0.0, "srtt {srtt}");
    assert!(metric_sum(&text, "hivenet_agent_rttvar_ms", &agent) >= 0.0);
    assert_eq!(
        metric_sum(&text, "hivenet_agent_disconnections_total", &agent),
        0.0
    );
    assert_eq!(
        metric_sum(&text, "hivenet_agent_failure_total", &agent),
        0.0
    );
    // Nothing refused or cut: both families are there, at zero, per reason for the resets.
    assert_eq!(
        metric_sum(&text, "hivenet_agent_rejected_requests_total", &agent),
        0.0
    );
    for reason in ["tunnel", "engine"] {
        assert_eq!(
            metric_sum(
                &text,
                "hivenet_agent_connection_resets_total",
                &[("model", MODEL), ("reason", reason)]
            ),
            0.0
        );
    }
    let utilization = metric_sum(&text, "hivenet_agent_capacity_utilization", &agent);
    assert!((0.0..=1.0).contains(&utilization), "{utilization}");
    // Every per-agent series names its agent.
    assert!(
        text.lines()
            .filter(|line| line.starts_with("hivenet_agent_requests_success_total{"))
            .all(|line| line.contains("peer_id=\"12D3KooW")),
        "{text}"
    );

    // Engine values the simulator's vLLM exposition carries.
    assert!(
        metric_sum_present(&text, "hivenet_agent_engine_kv_cache_utilization", &agent).is_some()
    );
    assert_eq!(
        metric_sum(&text, "hivenet_agent_engine_preemptions_total", &agent),
        0.0
    );
    let avg_ttft = metric_sum(&text, "hivenet_agent_engine_avg_ttft_seconds", &agent);
    assert!(
        (ENGINE_TTFT_SECONDS..1.0).contains(&avg_ttft),
        "the engine's mean time to first token {avg_ttft} s, its delay {ENGINE_TTFT_SECONDS} s"
    );
    assert!(metric_sum_present(&text, "hivenet_agent_engine_p90_ttft_seconds", &agent).is_some());
    let inf_bucket = [
        ("model", MODEL),
        ("engine", "vllm"),
        ("organization", "ml-team"),
        ("machine", "box-1"),
        ("le", "+Inf"),
    ];
    assert!(
        metric_sum(
            &text,
            "hivenet_agent_engine_ttft_seconds_bucket",
            &inf_bucket
        ) >= REQUESTS as f64
    );
    // Every finished generation has its prompt and generated lengths in the engine's histograms.
    for name in [
        "hivenet_agent_engine_request_prompt_tokens_bucket",
        "hivenet_agent_engine_request_generation_tokens_bucket",
    ] {
        assert!(
            metric_sum(&text, name, &inf_bucket) >= REQUESTS as f64,
            "{name}\n{text}"
        );
    }
    // The engine's prefix cache: the same prompt again finds its blocks. The router shows the
    // engine's own counts once the agent has reported them.
    let queries = site.sim_metric(0, "vllm:prefix_cache_queries_total");
    let hits = site.sim_metric(0, "vllm:prefix_cache_hits_total");
    assert!(hits > 0.0 && hits < queries, "{hits} of {queries}");
    let text = wait_agent_metric(
        &site,
        "hivenet_agent_engine_prefix_cache_queries_total",
        |seen| seen == queries,
    );
    assert_eq!(
        metric_sum(
            &text,
            "hivenet_agent_engine_prefix_cache_hits_total",
            &agent
        ),
        hits
    );
    let rate = metric_sum(&text, "hivenet_agent_engine_prefix_cache_hit_rate", &agent);
    assert!((rate - hits / queries).abs() < 1e-9, "{rate}");

    // Answers that are not streamed come in one piece: no inter-token latency. llama.cpp's
    // throughput is not in vLLM's exposition. Absent, not zero.
    for name in [
        "hivenet_agent_engine_avg_itl_seconds",
        "hivenet_agent_engine_p90_itl_seconds",
        "hivenet_agent_engine_predicted_tps",
    ] {
        assert!(metric_absent(&text, name, &[]), "{name} is exposed");
    }

    // The finish-reason counter counts completions after the first report: it reaches the
    // requests sent once their completions have been reported.
    let finished = [
        ("model", MODEL),
        ("engine", "vllm"),
        ("finished_reason", "stop"),
    ];
    let counted = poll(common::WAIT, || {
        let text = site.router_metrics();
        let value = metric_sum_present(
            &text,
            "hivenet_agent_engine_request_success_total",
            &finished,
        )?;
        (value >= REQUESTS as f64).then_some(value)
    });
    assert_eq!(counted, Some(REQUESTS as f64), "{}", site.router_metrics());

    // Host CPU and memory from /proc, with `region`; no GPU series without NVML.
    let text = wait_agent_metric(&site, "hivenet_agent_cpu_usage_percent", |cpu| {
        (0.0..=100.0).contains(&cpu)
    });
    let host = [("region", "eu-test"), ("organization", "ml-team")];
    let total = metric_sum(&text, "hivenet_agent_memory_total_bytes", &host);
    let available = metric_sum(&text, "hivenet_agent_memory_available_bytes", &host);
    assert!(total > 0.0 && available <= total, "{available} of {total}");
    let used = metric_sum(&text, "hivenet_agent_memory_used_percent", &host);
    assert!((0.0..=100.0).contains(&used), "{used}");
    if !std::path::Path::new("/proc/driver/nvidia").exists() {
        assert!(
            !text.contains("hivenet_agent_gpu_"),
            "GPU series on a host without an NVIDIA driver:\n{text}"
        );
    }
    // The routing table's `hardware` section: the same snapshot, the reference's fields.
    let row = routing_row(&site);
    let hardware = &row["hardware"];
    assert!(
        hardware["memory"]["total_bytes"].as_f64().unwrap() > 0.0,
        "{row}"
    );
    assert!(
        hardware["memory"]["used_percent"].as_f64().is_some(),
        "{row}"
    );
    assert!(hardware["cpu"]["usage_percent"].as_f64().is_some(), "{row}");
    assert!(hardware["gpu"].is_array(), "{row}");
    assert!(
        hardware["timestamp"].as_str().unwrap().ends_with('Z'),
        "{row}"
    );
}

#[test]
fn lifetime_counts_survive_a_reconnect_and_a_reset_clears_them() {
    let mut site = start();
    for _ in 0..2 {
        site.assert_chat_ok(MODEL);
    }
    // The agent goes away and comes back with the same identity: the harness names the key file
    // by the agent's index, which is 0 again once the old process is dropped.
    site.agents[0].terminate();
    wait_agent_metric(&site, "hivenet_agent_disconnections_total", |count| {
        count >= 1.0
    });
    site.agents.pop();
    site.spawn_agent(0, &["--organization", "ml-team", "--machine", "box-1"]);
    site.wait_models(&[MODEL]);
    let text = poll(common::WAIT, || {
        // The model is listed as soon as the agent is pooled; a chat may still race its tunnels.
        let (status, _, _) = site.post_json("/v1/chat/completions", &common::chat(MODEL, false));
        let text = site.router_metrics();
        let success = metric_sum_present(&text, "hivenet_agent_requests_success_total", &labels())?;
        (status == 200 && success >= 3.0).then_some(text)
    })
    .unwrap_or_else(|| panic!("no success after the reconnect\n{}", site.logs()));
    assert!(metric_sum(&text, "hivenet_agent_requests_success_total", &labels()) >= 3.0);
    assert_eq!(
        metric_sum(&text, "hivenet_agent_disconnections_total", &labels()),
        1.0
    );
    // The routing table's `universal` section carries the same history.
    let row = routing_row(&site);
    let universal = &row["universal"];
    let served = universal["successful_requests_total"].as_u64().unwrap();
    assert!(served >= 3, "{row}");
    assert_eq!(universal["disconnections_total"], 1, "{row}");
    assert_eq!(universal["rejected_requests_total"], 0, "{row}");
    assert_eq!(universal["success_rate"], 1.0, "{row}");
    assert!(
        universal["input_tokens_total"].as_u64().unwrap() > 0,
        "{row}"
    );
    assert_eq!(universal["latency_state"], "KNOWN", "{row}");
    assert!(universal["srtt_ms"].as_f64().unwrap() > 0.0, "{row}");
    assert_eq!(row["metadata"]["organization"], "ml-team", "{row}");
    assert_eq!(row["metadata"]["machine"], "box-1", "{row}");
    // The admin reference's recipe, `.agents[] | {model: .metadata.model, region:
    // .metadata.region, srtt_ms: .universal.srtt_ms}`, reads these paths.
    assert_eq!(row["metadata"]["model"], MODEL, "{row}");
    assert!(row["metadata"]["region"].is_string(), "{row}");

    let reset = request(
        site.http,
        format!("POST /admin/metrics/reset HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(reset.status, 200, "{}", reset.text());
    let text = site.router_metrics();
    assert_eq!(
        metric_sum(&text, "hivenet_agent_requests_success_total", &labels()),
        0.0
    );
    assert_eq!(
        metric_sum(&text, "hivenet_agent_disconnections_total", &labels()),
        0.0
    );
    assert!(metric_absent(&text, "hivenet_agent_srtt_ms", &[]));
    // The reset clears the table's history too, and nothing else of the row.
    let row = routing_row(&site);
    assert_eq!(row["universal"]["successful_requests_total"], 0, "{row}");
    assert_eq!(row["universal"]["disconnections_total"], 0, "{row}");
    assert_eq!(row["universal"]["latency_state"], "UNKNOWN", "{row}");
    assert_eq!(
        row["universal"]["srtt_ms"],
        serde_json::Value::Null,
        "{row}"
    );
    assert_eq!(row["status"]["healthy"], true, "{row}");
    assert_eq!(row["metadata"]["organization"], "ml-team", "{row}");
}

/// The one agent's row of `GET /admin/routing-table`.
fn routing_row(site: &common::Site) -> serde_json::Value {
    let response = request(
        site.http,
        format!("GET /admin/routing-table HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {ADMIN_KEY}\r\nconnection: close\r\n\r\n").as_bytes(),
    );
    assert_eq!(response.status, 200, "{}", response.text());
    let table = response.json();
    assert_eq!(table["total"], 1, "{table}");
    table["agents"][0].clone()
}
