//! hivenet-router: an OpenAI- and Anthropic-compatible LLM router for self-hosted inference
//! engines, its agents (`hivenet-agent`) and a simulated engine (`hivenet-sim`).
//!
//! One module per layer or binary; imports run down this list and never back
//! (`tests/architecture.rs` holds the table and checks every import):
//! - `router`: the router's cores, in the order a request meets them (`front`, `api`, `sync`,
//!   `control`, `shard`), and the services beside them (`accounting`, `audit`, `config`,
//!   `error`, `metrics`, `provider`);
//! - `agent`: the agent, which dials every router and carries the traffic to its engine;
//! - `simulated_engine`: the simulated inference engine the demo, tests and benchmarks run;
//! - `net`: what the binaries share: the agent tunnel (both ends) and trace export;
//! - `logic`: pure decisions, which take `now` as an argument and do no I/O (`limits`,
//!   `admission`, `routing`, `hold`, `credits`, `sibling`, `policy`, `usage`, `auth`,
//!   `snapshot`);
//! - `wire`: wire formats (the HTTP/1.1 codec and body fields, API routes, the control
//!   protocol);
//! - `base`: leaves (ids, clock, durations, identity, credentials, the latch).

pub mod agent;
pub mod base;
pub mod logic;
pub mod net;
pub mod router;
pub mod simulated_engine;
pub mod wire;
