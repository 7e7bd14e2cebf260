//! Proves `--tenant-metrics-max-tenants` through the real router: with a cap of 2 and four tenants
//! that sent 4, 3, 2 and 1 requests, `/metrics` names the two most active tenants and sums the
//! other two under `tenant_id="_other"` (their keys and deployments `"_other"` too), so totals over
//! tenants stay exact; the folded tenants' quota gauges are left out, and without the cap every
//! tenant is named.

mod common;

use std::path::PathBuf;

use common::{Options, Site, chat, metric_absent, metric_sum, request};
use sha2::{Digest, Sha256};

const TENANTS: [(&str, usize); 4] = [("t0", 4), ("t1", 3), ("t2", 2), ("t3", 1)];

fn raw_key(tenant: &str) -> String {
    format!("sk-cap-{tenant}")
}

fn auth_file(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("hivenet-tenant-cap")
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("auth.yaml");
    let mut text = String::from("api:\n  mode: api-key\n  keys:\n");
    for (tenant, _) in TENANTS {
        text.push_str(&format!(
            "    - key_hash: \"{}\"\n      key_preview: \"sk-...{tenant}\"\n      metadata:\n        name: \"{tenant}\"\n        owner: \"{tenant}\"\n      quota:\n        requests_per_minute: 1000\n",
            hex::encode(Sha256::digest(raw_key(tenant).as_bytes()))
        ));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn site(name: &str, cap: &str) -> Site {
    let auth = auth_file(name);
    let site = Site::start(
        name,
        Options::new()
            .sim(&["--models", "sim-model"])
            .agent(0, &["--capacity", "8"])
            .api_key(&raw_key("t0"))
            .router_args(&[
                "--auth-config-file",
                auth.to_str().unwrap(),
                "--tenant-metrics-max-tenants",
                cap,
            ]),
    );
    let body = chat("sim-model", false).to_string();
    for (tenant, count) in TENANTS {
        for _ in 0..count {
            let raw = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                raw_key(tenant),
                body.len()
            );
            assert_eq!(request(site.http, raw.as_bytes()).status, 200);
        }
    }
    site
}

#[test]
fn a_capped_scrape_names_the_busiest_tenants_and_sums_the_rest() {
    let site = site("tenant-cap", "2");
    let metrics = site.router_metrics();
    let success = |tenant: &str| {
        metric_sum(
            &metrics,
            "hivenet_tenant_requests_success_total",
            &[("tenant_id", tenant)],
        )
    };
    assert_eq!(success("t0"), 4.0, "{metrics}");
    assert_eq!(success("t1"), 3.0, "{metrics}");
    assert_eq!(success("_other"), 3.0, "{metrics}");
    assert_eq!(
        metric_sum(&metrics, "hivenet_tenant_requests_success_total", &[]),
        10.0
    );
    for folded in ["t2", "t3"] {
        assert!(
            !metrics.contains(&format!("tenant_id=\"{folded}\"")),
            "{folded} is folded: {metrics}"
        );
    }
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_tenant_request_duration_seconds_count",
            &[("tenant_id", "_other"), ("key_id", "_other")]
        ),
        3.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "hivenet_tenant_quota_rpm_limit",
            &[("tenant_id", "t0")]
        ),
        1000.0
    );
    assert!(metric_absent(
        &metrics,
        "hivenet_tenant_quota_rpm_limit",
        &[("tenant_id", "_other")]
    ));
}

#[test]
fn without_a_cap_every_tenant_is_named() {
    let site = site("tenant-uncapped", "0");
    let metrics = site.router_metrics();
    for (tenant, count) in TENANTS {
        assert_eq!(
            metric_sum(
                &metrics,
                "hivenet_tenant_requests_success_total",
                &[("tenant_id", tenant)]
            ),
            count as f64
        );
    }
    assert!(!metrics.contains("_other"), "{metrics}");
}
