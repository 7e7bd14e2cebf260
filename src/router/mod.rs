//! The router binary's cores and the services beside them.

pub mod accounting;
pub mod api;
pub mod audit;
pub mod config;
pub mod control;
pub mod error;
pub mod front;
pub mod metrics;
pub mod provider;
pub mod readiness;
pub mod shard;
pub mod sync;
