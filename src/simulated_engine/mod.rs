//! `hivenet-sim`: a simulated inference engine that speaks the OpenAI and Anthropic HTTP APIs,
//! streams like vLLM, reports vLLM-style `/metrics`, and lets tests steer its health and KV-cache
//! pressure through `/sim/control`. It stands behind the router in the demo, the integration tests
//! and the benchmarks, so it must never be the bottleneck: zero delays cost no timers, responses are
//! written by hand into one buffer, and per-model state is a few atomics plus, with prefix caching
//! on, a cache behind a lock taken once per generation request.
//!
//! Key components:
//! - [`request`]: parses request bodies and estimates prompt and output tokens (pure).
//! - [`engine`]: per-model admission queue, KV-cache model, prefix cache and counters.
//! - [`prefix_cache`]: chained block keys and a bounded LRU set of them, after vLLM's automatic
//!   prefix caching (pure).
//! - [`render`]: response bytes for both dialects, whole and streamed (pure).
//! - [`body`]: the response body, including the live generation stream.
//! - [`retrieval`]: deterministic embeddings and rerank scores (pure).
//! - [`metrics`]: Prometheus text (pure).
//! - [`error`]: refusals and their HTTP envelopes.
//! - [`server`]: accept loop and routing.
//!
//! Cancellation: a request's admission guard lives in the handler future (while queued or
//! generating a whole answer) or in the streamed body; hyper drops both when the client goes away,
//! which releases the concurrency permit and counts the request in `sim_cancelled_total`.

pub mod body;
pub mod engine;
pub mod error;
pub mod metrics;
pub mod prefix_cache;
pub mod render;
pub mod request;
pub mod retrieval;
pub mod server;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::simulated_engine::body::Pacing;
use crate::simulated_engine::engine::ModelEngine;
use crate::simulated_engine::server::SimState;

/// Command line of `hivenet-sim`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "hivenet-sim",
    about = "Simulated OpenAI/Anthropic-compatible inference engine"
)]
pub struct SimArgs {
    /// Address to listen on (`host:port`). Port 0 picks a free port; the bound address is printed.
    #[arg(long, default_value = "127.0.0.1:8888")]
    pub listen: String,
    /// Comma-separated model names served at once; each behaves as its own engine (own concurrency
    /// limit, queue and KV cache).
    #[arg(long, value_delimiter = ',', default_value = "sim-model")]
    pub models: Vec<String>,
    /// Time to first token, Go duration (`250ms`): from admission to the first token, which is also
    /// the first body byte of a stream. Applies to every generation request; `--prefill-per-token`
    /// adds to it.
    #[arg(long = "ttft", value_parser = crate::base::duration::parse_arg, default_value = "0ms")]
    pub time_to_first_token: Duration,
    /// Prefill time per prompt token not found in the prefix cache, Go duration: added to the time
    /// to first token of every generation request. A prompt's tail shorter than one block is never
    /// cached and always costs; with prefix caching off, every prompt token costs.
    #[arg(long, value_parser = crate::base::duration::parse_arg, default_value = "0ms")]
    pub prefill_per_token: Duration,
    /// Tokens per prefix-cache block, at least 1, as vLLM's `--block-size`. A prompt is cut into
    /// blocks of this many tokens, a token being 4 bytes of prompt text as in the prompt-token
    /// estimate; only whole blocks are cached.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    pub block_tokens: u64,
    /// Blocks each model's prefix cache holds at most; beyond it the least recently used block is
    /// evicted. 0 turns prefix caching off. Each model has its own cache.
    #[arg(long, default_value_t = 0)]
    pub prefix_cache_blocks: usize,
    /// Inter-token latency, Go duration, between consecutive generated tokens.
    #[arg(long = "itl", value_parser = crate::base::duration::parse_arg, default_value = "0ms")]
    pub inter_token_latency: Duration,
    /// Natural answer length in tokens; a smaller `max_tokens`/`max_completion_tokens` cuts it.
    #[arg(long, default_value_t = 16)]
    pub output_tokens: u64,
    /// Requests generating at once per model; 0 means unlimited. Beyond it requests wait in FIFO.
    #[arg(long = "max-concurrency", default_value_t = 0)]
    pub concurrency_max: usize,
    /// Requests allowed to wait per model when `--max-concurrency` is set; one more is refused
    /// with 503 at once.
    #[arg(long = "max-waiting", default_value_t = 1024)]
    pub waiting_max: usize,
    /// KV cache size per model, in tokens: usage = (prompt + generated tokens of running
    /// requests) / this.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_capacity_tokens: u64,
    /// Components of each embedding vector returned by `/v1/embeddings`.
    #[arg(long = "embedding-dim", default_value_t = 8)]
    pub embedding_dimension: usize,
    /// File to write the bound address to once listening (for test harnesses).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Tokio worker threads. 1 runs a single-threaded runtime (fastest per core).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub threads: u64,
}

impl SimArgs {
    fn state(&self) -> SimState {
        let models = self
            .models
            .iter()
            .map(|name| {
                ModelEngine::new(
                    name.clone(),
                    self.concurrency_max,
                    self.waiting_max,
                    self.kv_capacity_tokens,
                )
                .with_prefix_cache(self.block_tokens, self.prefix_cache_blocks)
            })
            .collect();
        SimState::new(
            models,
            Pacing {
                time_to_first_token: self.time_to_first_token,
                inter_token_latency: self.inter_token_latency,
            },
            self.prefill_per_token,
            self.output_tokens,
            self.embedding_dimension,
        )
    }
}

/// Runs the simulator until the process is killed.
pub fn run(args: SimArgs) -> anyhow::Result<()> {
    if args.models.iter().any(|name| name.is_empty()) {
        anyhow::bail!("--models contains an empty model name");
    }
    for (index, name) in args.models.iter().enumerate() {
        if args.models[..index].contains(name) {
            anyhow::bail!("--models names {name} twice");
        }
    }
    let runtime = if args.threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads as usize)
            .enable_all()
            .build()
    }
    .context("building the tokio runtime")?;
    // Lives for the whole process; leaking it lets connections and bodies borrow it for 'static.
    let state: &'static SimState = Box::leak(Box::new(args.state()));
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let address = listener.local_addr().context("reading the bound address")?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "hivenet-sim listening on {address}")?;
        stdout.flush()?;
        drop(stdout);
        if let Some(path) = &args.ready_file {
            // Write then rename, so a harness polling the file never reads a partial address.
            let partial = path.with_extension("partial");
            std::fs::write(&partial, address.to_string())
                .with_context(|| format!("writing {}", partial.display()))?;
            std::fs::rename(&partial, path)
                .with_context(|| format!("renaming to {}", path.display()))?;
        }
        server::serve(listener, state)
            .await
            .context("serving connections")
    })
}
