//! Proves that the official OpenAI and Anthropic Python SDKs work against the router unchanged:
//! chat and messages, streamed and not, usage, count_tokens, and the error envelope on a 404.

mod common;

use common::{Options, Site};

#[test]
fn openai_and_anthropic_sdks_work_end_to_end() {
    let site = Site::start(
        "sdk",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "6"])
            .agent(0, &["--capacity", "4"]),
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/clients.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .arg(format!("http://{}", site.http))
        .arg("sim-model")
        .output()
        .expect("python3 must be installed (./scripts/test installs the SDKs)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK checks failed\nstdout:\n{stdout}\nstderr:\n{stderr}\nrouter logs:\n{}",
        site.logs()
    );
    for check in [
        "openai chat ok",
        "openai stream ok",
        "openai stream with usage ok",
        "openai 404 ok",
        "anthropic message ok",
        "anthropic stream ok",
        "anthropic count_tokens ok",
    ] {
        assert!(stdout.contains(check), "missing {check:?} in:\n{stdout}");
    }
}
