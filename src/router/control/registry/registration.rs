//! What an agent declares when it registers ([`Registration`]): plain data the control service
//! builds from the agent's message, and the registry and its per-agent history read.
//!
//! Must not: hold session state (readiness, heartbeats, routability): that is the registry's.

use crate::base::ids::Capability;

/// What an agent declared when it registered.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    pub models: Vec<String>,
    pub capability: Capability,
    pub capacity: u32,
    pub engine: String,
    pub region: String,
    pub tags: Vec<String>,
    pub version: String,
    /// The tenant metrics' `deployment_id` for requests this agent serves; empty: `unset`.
    pub deployment_id: String,
    /// The agent's stable replica identifier (`--replica-id`); with `deployment_id`, the external
    /// scheduler's join key on `/admin/registration-stream`. Empty when the agent gave none.
    pub replica_id: String,
    /// `--organization` and `--machine`: labels of the per-agent metrics (`Unknown` when the
    /// agent sent none).
    pub organization: String,
    pub machine: String,
}
