//! Proves on the real binaries that the router and the agent run with transparent huge pages off
//! (`base::huge_pages`: mimalloc's arenas would otherwise make 2 MiB resident per region a shard's
//! heap touches), read from the kernel's own view of each process, and that
//! `MIMALLOC_ALLOW_THP=1` keeps them.

mod common;

use common::{Options, Site};

/// The kernel's `THP_enabled` of a process: `false` once it (or its parent, before starting it)
/// set `PR_SET_THP_DISABLE`.
fn huge_pages_enabled(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the status");
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .expect("THP_enabled in the status (Linux 5.0 and later)");
    value.trim() == "1"
}

#[test]
fn the_router_and_the_agent_run_without_transparent_huge_pages() {
    let site = Site::start(
        "huge-pages-off",
        Options::new().sim(&["--models", "sim-model"]).agent(0, &[]),
    );
    let router = site.router.pid().expect("the router runs");
    let agent = site.agents[0].pid().expect("the agent runs");
    assert!(!huge_pages_enabled(router), "the router has them");
    assert!(!huge_pages_enabled(agent), "the agent has them");
}

#[test]
fn mimallocs_switch_keeps_them() {
    let site = Site::start(
        "huge-pages-kept",
        Options::new()
            .skip_model_wait()
            .router_env("MIMALLOC_ALLOW_THP", "1"),
    );
    let router = site.router.pid().expect("the router runs");
    // A child inherits the flag: the router keeps whatever this test process has.
    assert_eq!(
        huge_pages_enabled(router),
        huge_pages_enabled(std::process::id()),
        "MIMALLOC_ALLOW_THP=1 was not honoured"
    );
}
