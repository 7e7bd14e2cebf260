//! The network plumbing both binaries share: the agent tunnel (router and agent ends) and the
//! export of trace spans.

pub mod telemetry;
pub mod tunnel;
