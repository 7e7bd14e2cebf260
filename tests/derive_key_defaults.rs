//! Proves `hivenet-router derive-key-defaults` through the real binary: certified limits in,
//! a key fragment out whose values satisfy the cross-config invariant; bad input refused with a
//! message and a non-zero exit.

use std::path::PathBuf;
use std::process::Command;

fn limits_file(text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hivenet-derive");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("router_limits-{}.yaml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn derive(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hivenet-router"))
        .arg("derive-key-defaults")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn prints_a_key_fragment_from_certified_limits() {
    let limits = limits_file(
        "model: Qwen/Qwen3.6-27B\nmax_input_tokens: 131072\nadmit_budget_tokens: 262144\nprefill_tokens_per_second: 20000\ndecode_tokens_per_second: 2500\n",
    );
    let output = derive(&[
        "--limits",
        limits.to_str().unwrap(),
        "--keys",
        "64",
        "--replicas",
        "2",
    ]);
    assert!(output.status.success(), "{output:?}");
    let text = String::from_utf8(output.stdout).unwrap();
    let fragment: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let share = fragment["max_occupancy_share"].as_f64().unwrap();
    assert!(share > 0.0 && share <= 1.0, "{text}");
    assert!(
        fragment["quota"]["input_tokens_per_minute"]
            .as_u64()
            .unwrap()
            >= 131072
    );
    assert!(
        fragment["quota"]["output_tokens_per_minute"]
            .as_u64()
            .unwrap()
            > 0
    );

    let unknown = limits_file("model: m\nmax_input_tokens: 1\nbogus: 2\n");
    let refused = derive(&["--limits", unknown.to_str().unwrap(), "--keys", "1"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not valid certified limits"));
}
