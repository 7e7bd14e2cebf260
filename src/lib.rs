//! hivenet-router: an OpenAI- and Anthropic-compatible LLM router for self-hosted inference
//! engines, its agents (`hivenet-agent`) and a simulated engine (`hivenet-sim`).

pub mod agent;
pub mod base;
pub mod logic;
pub mod net;
pub mod router;
pub mod simulated_engine;
pub mod wire;
