//! `hivenet-sim`: the simulated inference engine; see `hivenet_router::simulated_engine`.

/// mimalloc: the request path allocates small, short-lived buffers on every core; glibc malloc
/// measured several percent of CPU per request under load. The `system-allocator` feature keeps
/// the system's instead, for heap profilers that cannot see mimalloc (`perf/heap-profile.sh`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    hivenet_router::simulated_engine::run(hivenet_router::simulated_engine::SimArgs::parse())
}
