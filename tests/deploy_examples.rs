//! Proves that every YAML document in `deploy/keda/` and `deploy/kubernetes/` parses and says what
//! `deploy/README.md` promises: a KEDA ScaledObject that wakes on the pending demand and idles at
//! zero, aimed at a LeaderWorkerSet whose leader runs vLLM with a health probe and the agent with
//! real flags only; three routers that share limits through Valkey behind Sentinel, probed for
//! readiness on `/ready` and liveness on `/health`, with agents that list every router by pod
//! name, and the seed's alerts.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

const KEDA: &str = "deploy/keda";
const KUBERNETES: &str = "deploy/kubernetes";

/// Every document of every `*.yaml` in `dir` (relative to the repository), with its file.
fn documents_in(dir: &str) -> Vec<(PathBuf, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("a readable directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        documents.extend(
            documents_of(&file)
                .into_iter()
                .map(|document| (file.clone(), document)),
        );
    }
    documents
}

fn documents_of(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).expect("a readable example");
    yaml_serde::Deserializer::from_str(&text)
        .map(|document| {
            Value::deserialize(document)
                .unwrap_or_else(|error| panic!("{}: {error}", file.display()))
        })
        .collect()
}

/// The one document of this kind in `dir`.
fn only(dir: &str, kind: &str) -> Value {
    let mut found: Vec<Value> = documents_in(dir)
        .into_iter()
        .filter(|(_, document)| document["kind"] == kind)
        .map(|(_, document)| document)
        .collect();
    assert_eq!(found.len(), 1, "exactly one {kind} in {dir}");
    found.remove(0)
}

/// The document of this kind and name in `dir`.
fn named(dir: &str, kind: &str, name: &str) -> Value {
    documents_in(dir)
        .into_iter()
        .map(|(_, document)| document)
        .find(|document| document["kind"] == kind && document["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {dir}"))
}

/// The container called `name` of a workload's pod template.
fn container(workload: &Value, name: &str) -> Value {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|container| container["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
        .clone()
}

fn args_of(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| arg.as_str().expect("string args").to_owned())
        .collect()
}

/// The value after `flag` in `args`.
fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|arg| arg == flag)?;
    args.get(at + 1).map(String::as_str)
}

/// The long flags `binary --help` lists as options (not flags its descriptions mention).
fn flags_of(binary: &str) -> Vec<String> {
    let output = Command::new(binary)
        .arg("--help")
        .output()
        .unwrap_or_else(|error| panic!("{binary}: {error}"));
    assert!(output.status.success(), "{binary} --help failed");
    let help = String::from_utf8(output.stdout).expect("help is UTF-8");
    help.lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split([' ', ',']).find(|word| word.starts_with("--")))
        .map(str::to_owned)
        .collect()
}

fn agent_flags() -> Vec<String> {
    flags_of(env!("CARGO_BIN_EXE_hivenet-agent"))
}

/// Asserts every `--flag` in `args` is one `binary --help` lists.
fn assert_known_flags(binary: &str, args: &[String]) {
    let known = flags_of(binary);
    for arg in args.iter().filter(|arg| arg.starts_with("--")) {
        let flag = arg.split('=').next().unwrap_or(arg);
        assert!(
            known.iter().any(|known| known == flag),
            "{binary} has no {flag}"
        );
    }
}

#[test]
fn every_document_parses_and_names_its_kind() {
    for (dir, at_least) in [(KEDA, 2), (KUBERNETES, 9)] {
        let documents = documents_in(dir);
        assert!(documents.len() >= at_least, "{dir}: {documents:?}");
        check_kinds_and_names(&documents);
    }
}

fn check_kinds_and_names(documents: &[(PathBuf, Value)]) {
    for (file, document) in documents {
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
    let scaled = only(KEDA, "ScaledObject");
    let lws = only(KEDA, "LeaderWorkerSet");
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
    let lws = only(KEDA, "LeaderWorkerSet");
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

// ---------------------------------------------------------------------------------------------
// deploy/kubernetes: several routers sharing limits through Valkey

/// The router StatefulSet's replica count.
fn router_replicas() -> u64 {
    named(KUBERNETES, "StatefulSet", "router")["spec"]["replicas"]
        .as_u64()
        .expect("router replicas")
}

/// The secret a workload mounts at the directory holding `path`.
fn secret_holding(workload: &Value, container: &Value, path: &str) -> String {
    let mount = container["volumeMounts"]
        .as_array()
        .expect("volume mounts")
        .iter()
        .find(|mount| {
            mount["mountPath"]
                .as_str()
                .is_some_and(|dir| path.starts_with(&format!("{dir}/")))
        })
        .unwrap_or_else(|| panic!("no volume mounted above {path}"));
    let volume = workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|volume| volume["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    volume["secret"]["secretName"]
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not in a Secret"))
        .to_owned()
}

/// One script of the Valkey ConfigMap.
fn valkey_script(name: &str) -> String {
    named(KUBERNETES, "ConfigMap", "valkey-scripts")["data"][name]
        .as_str()
        .unwrap_or_else(|| panic!("no script {name}"))
        .to_owned()
}

#[test]
fn three_routers_share_limits_through_the_sentinels_of_the_site() {
    let router = named(KUBERNETES, "StatefulSet", "router");
    let replicas = router_replicas();
    assert_eq!(replicas, 3);
    assert_eq!(router["spec"]["serviceName"], "router-headless");
    let labels = &router["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&router["spec"]["selector"]["matchLabels"], labels);

    let headless = named(KUBERNETES, "Service", "router-headless");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    assert_eq!(&headless["spec"]["selector"], labels);
    let client = named(KUBERNETES, "Service", "hivenet-router");
    assert!(client["spec"]["clusterIP"].is_null(), "{client}");
    assert_eq!(&client["spec"]["selector"], labels);
    assert_eq!(client["spec"]["ports"][0]["port"], 8080);

    let container = container(&router, "hivenet-router");
    let pod_name = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|var| var["name"] == "POD_NAME")
        .expect("POD_NAME in env");
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );

    // Readiness steers traffic away from a router that cannot serve its limits yet; liveness
    // restarts only a router that stopped answering.
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], 8080);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/health");

    let args = args_of(&container);
    assert_eq!(value_of(&args, "--router-id"), Some("$(POD_NAME)"));
    assert_eq!(
        value_of(&args, "--advertise-grpc-addr"),
        Some("$(POD_NAME).router-headless:50051")
    );
    assert_eq!(
        value_of(&args, "--p2p-announce-addr"),
        Some("/dns4/$(POD_NAME).router-headless/tcp/9000")
    );
    assert_eq!(value_of(&args, "--grpc-port"), Some(":50051"));
    assert_eq!(value_of(&args, "--sync-store"), Some("valkey"));
    assert_eq!(
        value_of(&args, "--sync-min-routers"),
        Some(replicas.to_string().as_str())
    );
    let site = value_of(&args, "--sync-site").expect("--sync-site");
    assert!(
        (1..=64).contains(&site.len())
            && site
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
        "{site}"
    );

    // The Sentinels, each by its pod name, and the master name they monitor.
    let sentinels = named(KUBERNETES, "StatefulSet", "valkey-sentinel");
    let service = sentinels["spec"]["serviceName"]
        .as_str()
        .expect("serviceName");
    let expected: Vec<String> = (0..sentinels["spec"]["replicas"].as_u64().expect("replicas"))
        .map(|i| format!("valkey-sentinel-{i}.{service}:26379"))
        .collect();
    assert_eq!(
        value_of(&args, "--sync-valkey-addrs"),
        Some(expected.join(",").as_str())
    );
    let master = value_of(&args, "--sync-valkey-sentinel-master").expect("master name");
    assert_eq!(master, "hivenet");
    assert!(
        valkey_script("sentinel.sh").contains(&format!("sentinel monitor {master} $PRIMARY 6379")),
        "the Sentinels monitor {master}"
    );

    // The password file is the Secret Valkey and the Sentinels run with.
    let password = value_of(&args, "--sync-valkey-password-file").expect("password file");
    let secret = secret_holding(&router, &container, password);
    for (name, container_name) in [("valkey", "valkey"), ("valkey-sentinel", "sentinel")] {
        let workload = named(KUBERNETES, "StatefulSet", name);
        let store = crate::container(&workload, container_name);
        assert_eq!(
            secret_holding(&workload, &store, "/run/secrets/valkey/password"),
            secret,
            "{name}"
        );
    }

    // The journal of usage held back in an outage lives on the pod's own claim, which
    // outlives restarts and reschedules under the same pod name (`--router-id`).
    let journal = value_of(&args, "--sync-journal").expect("--sync-journal");
    let claims: Vec<&str> = router["spec"]["volumeClaimTemplates"]
        .as_array()
        .expect("volumeClaimTemplates")
        .iter()
        .filter_map(|claim| claim["metadata"]["name"].as_str())
        .collect();
    let on_a_claim = container["volumeMounts"]
        .as_array()
        .expect("volumeMounts")
        .iter()
        .any(|mount| {
            claims.contains(&mount["name"].as_str().unwrap_or_default())
                && journal.starts_with(&format!("{}/", mount["mountPath"].as_str().unwrap_or("?")))
        });
    assert!(
        on_a_claim,
        "--sync-journal {journal} is not on a volume claim"
    );

    assert_known_flags(env!("CARGO_BIN_EXE_hivenet-router"), &args);
}

#[test]
fn the_store_is_a_primary_two_replicas_and_three_sentinels_with_aof_and_a_password() {
    let valkey = named(KUBERNETES, "StatefulSet", "valkey");
    let sentinels = named(KUBERNETES, "StatefulSet", "valkey-sentinel");
    assert_eq!(valkey["spec"]["replicas"], 3, "one primary, two replicas");
    assert_eq!(sentinels["spec"]["replicas"], 3);
    for workload in [&valkey, &sentinels] {
        let anti = &workload["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0];
        assert_eq!(
            anti["topologyKey"], "kubernetes.io/hostname",
            "separate hosts"
        );
        assert_eq!(
            anti["labelSelector"]["matchLabels"],
            workload["spec"]["template"]["metadata"]["labels"]
        );
    }
    assert!(
        valkey["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data",
        "the AOF lives on a persistent volume"
    );

    let server = valkey_script("valkey.sh");
    for line in [
        "appendonly yes",
        "dir /data",
        "requirepass \"$PASSWORD\"",
        "masterauth \"$PASSWORD\"",
    ] {
        assert!(
            server.lines().any(|l| l.trim() == line),
            "valkey.sh: {line}"
        );
    }
    let sentinel = valkey_script("sentinel.sh");
    for line in [
        // Quorum 2 of 3.
        "sentinel monitor hivenet $PRIMARY 6379 2",
        "sentinel auth-pass hivenet \"$PASSWORD\"",
        "requirepass \"$PASSWORD\"",
    ] {
        assert!(
            sentinel.lines().any(|l| l.trim() == line),
            "sentinel.sh: {line}"
        );
    }

    // The scripts are valid shell.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("deploy-examples");
    std::fs::create_dir_all(&dir).expect("a temp dir");
    for name in ["find-primary.sh", "valkey.sh", "sentinel.sh"] {
        let path = dir.join(format!("{}-{name}", std::process::id()));
        std::fs::write(&path, valkey_script(name)).expect("write the script");
        let checked = Command::new("sh")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("sh");
        assert!(
            checked.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}

#[test]
fn agents_list_every_router_by_its_pod_name() {
    let agents = only(KUBERNETES, "Deployment");
    let agent = container(&agents, "hivenet-agent");
    let args = args_of(&agent);
    let expected: Vec<String> = (0..router_replicas())
        .map(|i| format!("router-{i}.router-headless:50051"))
        .collect();
    assert_eq!(
        value_of(&args, "--routers"),
        Some(expected.join(",").as_str())
    );
    assert_eq!(value_of(&args, "--engine"), Some("vllm"));
    assert_eq!(
        value_of(&args, "--backend-url"),
        Some("http://127.0.0.1:8000")
    );

    // The agents and routers share the site's JWT secret.
    let secret_file = value_of(&args, "--jwt-secret-file").expect("--jwt-secret-file");
    let router = named(KUBERNETES, "StatefulSet", "router");
    let router_container = container(&router, "hivenet-router");
    let router_secret_file = value_of(&args_of(&router_container), "--jwt-secret-file")
        .expect("router --jwt-secret-file")
        .to_owned();
    assert_eq!(
        secret_holding(&agents, &agent, secret_file),
        secret_holding(&router, &router_container, &router_secret_file)
    );

    assert_known_flags(env!("CARGO_BIN_EXE_hivenet-agent"), &args);
}

/// The alerts of the seed's "Monitor" section, with the peers threshold for `routers` routers.
fn seed_alerts(routers: u64) -> Value {
    serde_json::json!([
        {
            "alert": "HivenetSyncDown",
            "expr": "hivenet_sync_up == 0",
            "for": "1m",
            "labels": {"severity": "critical"},
        },
        {
            "alert": "HivenetOccupancyLeak",
            "expr": "increase(hivenet_admission_reaped_total[1h]) > 0",
            "labels": {"severity": "warning"},
        },
        {
            "alert": "HivenetSyncPeersMissing",
            "expr": format!("hivenet_sync_peers < {}", routers - 1),
            "for": "5m",
            "labels": {"severity": "warning"},
        },
    ])
}

/// The first rules of the group `hivenet-sync` of `groups` (the seed's come first; the
/// group may add more).
fn sync_rules(groups: &Value, count: usize) -> Value {
    let group = groups
        .as_array()
        .expect("groups")
        .iter()
        .find(|group| group["name"] == "hivenet-sync")
        .expect("a hivenet-sync group");
    let rules = group["rules"].as_array().expect("rules");
    Value::Array(rules.iter().take(count).cloned().collect())
}

#[test]
fn the_seed_alerts_ship_for_the_prometheus_operator_and_for_plain_prometheus() {
    let expected = seed_alerts(router_replicas());
    let count = expected.as_array().expect("alerts").len();
    let rule = only(KUBERNETES, "PrometheusRule");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sync_rules(&rule["spec"]["groups"], count), expected);

    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/hivenet-sync.rules.yaml");
    let documents = documents_of(&plain);
    assert_eq!(documents.len(), 1);
    assert_eq!(sync_rules(&documents[0]["groups"], count), expected);
}
