//! Occupancy credits: how the routers of a site share an occupancy budget (B2
//! `admit_budget_tokens` / `max_inflight`, each key's B4 `max_occupancy_share`) so that together they never
//! hold more than it, not even for a moment (seed `run-several-routers.md`, "Occupancy credits").
//!
//! # Key components
//! - [`pool`]: one budget's pool as the store keeps it, with the grant script's rules (pure).
//! - [`wallet`]: one router's credits for one budget, on the owner shard (pure).
//! - [`view`]: one router's view of one budget's pool and its guard after the store lost its
//!   data: the ceiling every grant is held to (pure).
//! - [`may_reclaim`]: when the others may give a router up and take its credits back (pure).
//!
//! - `sim` (tests): a deterministic simulation of routers, a store and clients under faults
//!   (data loss, routers cut off, crashes and restarts), checking after every step that the
//!   routers together never run more than the budget beyond the seed's stated excess. It holds
//!   the protocol the sync core runs around the pool and the wallets, and the rules the
//!   simulation showed the seed's wording needs (see its module doc).
//!
//! # Where the rest lives
//! This module is the protocol's pure core. The store's grant script is `sync::pool_store`, the
//! sync core's refills and per-round rewrites `sync::pools`, the owner shard's wallets
//! `shard::owner::wallets`, and admission keeps within them in `admission::occupancy`
//! (`Limits::credits`).

use std::borrow::Cow;

use crate::base::ids::KeyId;

pub mod pool;
pub mod view;
pub mod wallet;

#[cfg(test)]
mod simulation;

/// The occupancy budgets of a model that routers share: B2's token budget
/// (`admit_budget_tokens`) and its request backstop (`max_inflight`), and each key's B4 share of
/// the token budget (`max_occupancy_share`), one pool per key with a share in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetKind {
    Tokens,
    Requests,
    /// The key's `max_occupancy_share` of the model's tokens (`share × admit_budget_tokens ×
    /// healthy`): what the key's requests in flight may use on all routers together.
    Share(KeyId),
}

impl BudgetKind {
    /// The budget's part of its pool's name in the store: `tokens`, `requests`, or `share-`
    /// and the key's ID in hex (the same ID on every router of the site).
    pub fn name(self) -> Cow<'static, str> {
        match self {
            BudgetKind::Tokens => Cow::Borrowed("tokens"),
            BudgetKind::Requests => Cow::Borrowed("requests"),
            BudgetKind::Share(key) => Cow::Owned(format!("share-{key}")),
        }
    }
}

/// Heartbeats a router may miss before the others consider giving it up (about three sync
/// intervals).
pub const MISSED_HEARTBEATS: u32 = 3;

/// What the agents a router served say of their connection to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentSays {
    /// The agent reports a connection to the router.
    Connected,
    /// The agent reports to the others and names no connection to the router.
    NotConnected,
    /// The agent reports to no router the others hear from (a network split, or it stopped
    /// with the router): nobody can tell whether it still serves the router.
    Unheard,
}

/// Whether the others may take `served`'s router's credits back (seed, "A router that stops"):
/// it missed [`MISSED_HEARTBEATS`] heartbeats and every agent it served reports no connection to
/// it. An agent still connected, or one nobody hears from, keeps the credits where they are: that
/// router may still be admitting within them.
pub fn may_reclaim(
    missed_heartbeats: u32,
    served: &[String],
    says: impl Fn(&str) -> AgentSays,
) -> bool {
    missed_heartbeats >= MISSED_HEARTBEATS
        && served
            .iter()
            .all(|agent| says(agent) == AgentSays::NotConnected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn a_crashed_router_is_given_up_once_every_agent_it_served_says_so() {
        let served = agents(&["a1", "a2"]);
        let none = |_: &str| AgentSays::NotConnected;
        assert!(
            !may_reclaim(2, &served, none),
            "not before three missed heartbeats"
        );
        assert!(may_reclaim(3, &served, none));
    }

    #[test]
    fn an_agent_still_connected_or_unheard_keeps_the_credits() {
        let served = agents(&["a1", "a2"]);
        let one_connected = |agent: &str| {
            if agent == "a2" {
                AgentSays::Connected
            } else {
                AgentSays::NotConnected
            }
        };
        assert!(
            !may_reclaim(10, &served, one_connected),
            "cut off from the store, still serving"
        );
        let one_unheard = |agent: &str| {
            if agent == "a2" {
                AgentSays::Unheard
            } else {
                AgentSays::NotConnected
            }
        };
        assert!(
            !may_reclaim(10, &served, one_unheard),
            "a split: nobody can tell"
        );
    }
}
