//! Proves that every YAML document in `deploy/keda/` parses and says what `deploy/keda/README.md`
//! promises: a KEDA ScaledObject that wakes on the pending demand and idles at zero, aimed at a
//! LeaderWorkerSet whose leader runs vLLM with a health probe and the agent with real flags only.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

/// Every document of every `deploy/keda/*.yaml`, with the file it came from.
fn documents() -> Vec<(PathBuf, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/keda");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a readable example");
        for document in yaml_serde::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
            documents.push((file.clone(), value));
        }
    }
    documents
}

/// The one document of this kind.
fn only(kind: &str) -> Value {
    let mut found: Vec<Value> = documents()
        .into_iter()
        .filter(|(_, document)| document["kind"] == kind)
        .map(|(_, document)| document)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind}");
    found.remove(0)
}

/// The long flags `hivenet-agent --help` lists as options (not flags its descriptions mention).
fn agent_flags() -> Vec<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_hivenet-agent"))
        .arg("--help")
        .output()
        .expect("hivenet-agent runs");
    assert!(output.status.success(), "hivenet-agent --help failed");
    let help = String::from_utf8(output.stdout).expect("help is UTF-8");
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split([' ', ',']).find(|word| word.starts_with("--")))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_document_parses_and_names_its_kind() {
    let documents = documents();
    assert!(documents.len() >= 2, "{documents:?}");
    for (file, document) in &documents {
        for field in ["apiVersion", "kind"] {
            assert!(document[field].is_string(), "{}: {field}", file.display());
        }
        assert!(
            document["metadata"]["name"].is_string(),
            "{}: metadata.name",
            file.display()
        );
    }
}

#[test]
fn the_scaled_object_wakes_on_pending_demand_and_idles_at_zero() {
    let scaled = only("ScaledObject");
    let lws = only("LeaderWorkerSet");
    assert_eq!(scaled["apiVersion"], "keda.sh/v1alpha1");
    let spec = &scaled["spec"];
    let target = &spec["scaleTargetRef"];
    assert_eq!(target["apiVersion"], lws["apiVersion"]);
    assert_eq!(target["kind"], "LeaderWorkerSet");
    assert_eq!(target["name"], lws["metadata"]["name"]);
    assert_eq!(spec["minReplicaCount"], 1);
    assert_eq!(spec["maxReplicaCount"], 1);
    assert_eq!(spec["idleReplicaCount"], 0);
    assert_eq!(spec["pollingInterval"], 5);
    assert_eq!(spec["cooldownPeriod"], 1800);

    let triggers = spec["triggers"].as_array().expect("triggers");
    assert_eq!(triggers.len(), 1);
    assert_eq!(triggers[0]["type"], "prometheus");
    let metadata = &triggers[0]["metadata"];
    assert_eq!(metadata["threshold"], "1");
    assert_eq!(metadata["activationThreshold"], "0.5");
    let query = metadata["query"].as_str().expect("query");
    let compact: String = query.split_whitespace().collect();
    let model = lws["metadata"]["name"].as_str().expect("name");
    assert_eq!(
        compact,
        format!(
            "clamp_max((sum(hivenet_pending_demand{{model=\"{model}\"}})orvector(0))\
             +(sum(increase(hivenet_routing_requests_routed_total{{model=\"{model}\"}}[2m]))orvector(0)),1)"
        )
    );
    assert!(query.contains("hivenet_pending_demand") && query.matches("or vector(0)").count() == 2);
}

#[test]
fn the_leader_runs_vllm_with_a_health_probe_and_the_agent_beside_it() {
    let lws = only("LeaderWorkerSet");
    assert_eq!(lws["apiVersion"], "leaderworkerset.x-k8s.io/v1");
    let containers = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"]
        .as_array()
        .expect("leader containers");

    let vllm = containers
        .iter()
        .find(|container| {
            container["image"]
                .as_str()
                .is_some_and(|image| image.starts_with("vllm/"))
        })
        .expect("a vLLM container");
    let probe = &vllm["readinessProbe"]["httpGet"];
    assert_eq!(probe["path"], "/health");
    assert_eq!(probe["port"], 8000);

    let agent = containers
        .iter()
        .find(|container| container["name"] == "hivenet-agent")
        .expect("the agent sidecar");
    let args: Vec<&str> = agent["args"]
        .as_array()
        .expect("agent args")
        .iter()
        .map(|arg| arg.as_str().expect("string args"))
        .collect();
    let value_of = |flag: &str| {
        let at = args.iter().position(|arg| *arg == flag)?;
        args.get(at + 1).copied()
    };
    assert_eq!(value_of("--engine"), Some("vllm"));
    assert_eq!(value_of("--backend-url"), Some("http://127.0.0.1:8000"));
    assert_eq!(value_of("--model"), lws["metadata"]["name"].as_str());

    let known = agent_flags();
    assert!(
        known.iter().any(|flag| flag == "--backend-url"),
        "{known:?}"
    );
    for arg in args.iter().filter(|arg| arg.starts_with("--")) {
        let flag = arg.split('=').next().unwrap_or(arg);
        assert!(
            known.iter().any(|known| known == flag),
            "hivenet-agent has no {flag}"
        );
    }
}
