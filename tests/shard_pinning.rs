//! Proves on the real router that `--pin-shards` decides whether each shard thread is pinned to
//! one core (the default) or may run on any core the process may (`--pin-shards false`, for a
//! host whose cores the router shares), read from the kernel's own view of each thread.

mod common;

use common::{Options, Site};

/// The CPUs a task may run on, as `/proc` lists them (`0-1`, `0,2`, ...), expanded.
fn allowed_cpus(status_path: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(status_path).expect("the task's status");
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in the status")
        .trim();
    list.split(',')
        .flat_map(|range| match range.split_once('-') {
            Some((first, last)) => {
                (first.parse::<u32>().unwrap()..=last.parse::<u32>().unwrap()).collect::<Vec<_>>()
            }
            None => vec![range.parse().unwrap()],
        })
        .collect()
}

/// Each shard thread's allowed CPUs, by shard, and the process's own.
fn shard_cpus(site: &Site) -> (Vec<Vec<u32>>, Vec<u32>) {
    let pid = site.router.pid().expect("the router runs");
    let mut shards = vec![Vec::new(); site.shards];
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if let Some(index) = name.trim().strip_prefix("shard-") {
            let index: usize = index.parse().unwrap();
            shards[index] = allowed_cpus(task.join("status").to_str().unwrap());
        }
    }
    assert!(shards.iter().all(|cpus| !cpus.is_empty()), "{shards:?}");
    (shards, allowed_cpus(&format!("/proc/{pid}/status")))
}

#[test]
fn shards_are_pinned_one_core_each_unless_told_not_to() {
    let pinned = Site::start("pinned", Options::new().skip_model_wait());
    let (shards, process) = shard_cpus(&pinned);
    for (index, cpus) in shards.iter().enumerate() {
        assert_eq!(cpus.len(), 1, "shard {index} runs on one core: {cpus:?}");
        assert!(process.contains(&cpus[0]), "{cpus:?} of {process:?}");
    }
    if process.len() >= 2 {
        assert_ne!(shards[0], shards[1], "two shards, two cores");
    }
    drop(pinned);

    let free = Site::start(
        "unpinned",
        Options::new()
            .skip_model_wait()
            .router_args(&["--pin-shards", "false"]),
    );
    let (shards, process) = shard_cpus(&free);
    for (index, cpus) in shards.iter().enumerate() {
        assert_eq!(
            cpus, &process,
            "shard {index} may run wherever the router may"
        );
    }
    assert!(
        process.len() >= 2,
        "this test needs two cores to tell pinned from free (CI has two): {process:?}"
    );
}
