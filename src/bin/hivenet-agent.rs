//! `hivenet-agent`: flag parsing, logging, identity and secret loading, then `agent::run` until
//! SIGTERM or SIGINT.

/// mimalloc: the request path allocates small, short-lived buffers on every core; glibc malloc
/// measured several percent of CPU per request under load. The `system-allocator` feature keeps
/// the system's instead, for heap profilers that cannot see mimalloc (`perf/heap-profile.sh`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::Parser;
use hivenet_router::agent::{self, config::Args};
use hivenet_router::base::credentials::Secret;
use hivenet_router::base::identity::Identity;
use tracing::{Instrument, error, info};

/// Usage errors exit with the code clap uses for its own.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let args = Args::parse();
    let args_worker_threads = args.worker_threads;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    hivenet_router::base::huge_pages::keep_off_at_start();
    let config = match args.validate() {
        Ok(config) => config,
        Err(problem) => {
            eprintln!("hivenet-agent: {problem}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let secret = match Secret::from_file_or_env(config.jwt_secret_file.as_deref()) {
        Ok(secret) => secret,
        Err(problem) => {
            eprintln!("hivenet-agent: {problem}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let identity = match Identity::load_or_create(&config.identity_path) {
        Ok(identity) => identity,
        Err(problem) => {
            eprintln!("hivenet-agent: {problem}");
            return ExitCode::FAILURE;
        }
    };
    let peer_id = identity.peer_id.to_string();
    let built = if args_worker_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args_worker_threads)
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(runtime) => runtime,
        Err(problem) => {
            eprintln!("hivenet-agent: cannot start the runtime: {problem}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        info!(%peer_id, engine = config.engine.as_str(), backend = %config.backend_url, "hivenet-agent starting");
        let span = tracing::info_span!("agent", %peer_id);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let run = agent::run(config, secret, identity, stopped).instrument(span);
        tokio::pin!(run);
        let finished = |result: anyhow::Result<()>| match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(problem) => {
                error!(%problem, "agent stopped");
                ExitCode::FAILURE
            }
        };
        tokio::select! {
            result = &mut run => return finished(result),
            signal = shutdown_signal() => info!(signal, "shutting down"),
        }
        // The first signal drains (see `agent::run`); a second one exits at once.
        stop.send_replace(true);
        tokio::select! {
            result = &mut run => finished(result),
            signal = shutdown_signal() => {
                info!(signal, "second signal: exiting without waiting for requests in flight");
                ExitCode::SUCCESS
            }
        }
    })
}

/// Resolves on SIGTERM or SIGINT with the signal's name.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = terminate.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
