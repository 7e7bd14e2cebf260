//! hivenet-router: an OpenAI- and Anthropic-compatible LLM router for self-hosted inference
//! engines, its agents (`hivenet-agent`) and a simulated engine (`hivenet-sim`).
//!
//! Module map, in the order a request meets them: `http` (wire codec and body fields), `shard`
//! (the thread-per-core data plane and its mesh), `api` (request phases), `routing` (per-model
//! agent choice and capacity queues, pure), `tunnel` (router <-> agent HTTP/2 over agent-dialed
//! sockets), `usage` (exact token usage read from responses), `error` (the one place rejections
//! become HTTP), `provider` (OpenAI/Anthropic fallback once local routing is exhausted). Around
//! them: `control` (agent gRPC, registry, the daily-total flush), `disk_db` (the router's disk
//! database: daily totals that survive a restart), `metrics`, `agent`, `sim`. Pure policy:
//! `limits` (per-key buckets), `admission` (the input estimate and admission gates), `sibling`
//! (the sibling map, the cross-site redirect decision and its signed tokens).

pub mod accounting;
pub mod admission;
pub mod agent;
pub mod api;
pub mod audit;
pub mod auth;
pub mod clock;
pub mod config;
pub mod control;
pub mod credits;
pub mod disk_db;
pub mod doc_guard;
pub mod duration;
pub mod error;
pub mod fatal;
pub mod front;
pub mod hold;
pub mod http;
pub mod identity;
pub mod ids;
pub mod limits;
pub mod log_limit;
pub mod metrics;
pub mod policy;
pub mod provider;
pub mod proto {
    //! Generated from `proto/hivenet.proto`.
    tonic::include_proto!("hivenet.v1");
}
pub mod routing;
pub mod shard;
pub mod sibling;
pub mod sim;
pub mod snapshot;
pub mod sync;
pub mod telemetry;
pub mod tokens;
pub mod tunnel;
pub mod usage;
