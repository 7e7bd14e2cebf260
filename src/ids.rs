//! The router's ids: small `Copy` values every layer names things by. A leaf module: it imports
//! nothing from the crate, so the pure modules (limits, admission, routing, hold, sibling) and the
//! data plane can all depend on it without depending on each other.
//!
//! Process-local ids (`ModelId`, `AgentId`, `Ticket`, `Generation`) mean nothing to another
//! process; what crosses routers names models by name and keys by their key ID.

use std::fmt;

/// Dense model index, assigned by the control core the first time a (name, capability) is seen and
/// never reused in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

impl ModelId {
    /// The shard that owns the model's routing, occupancy and hold state.
    pub fn owner(self, shard_count: usize) -> usize {
        self.0 as usize % shard_count
    }
}

/// What an agent serves a model for. The router combines name and capability to pick an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    Llm = 0,
    Embedding = 1,
    Reranker = 2,
}

impl Capability {
    pub const ALL: [Capability; 3] = [Capability::Llm, Capability::Embedding, Capability::Reranker];

    pub fn parse(text: &str) -> Option<Capability> {
        match text {
            "llm" => Some(Capability::Llm),
            "embedding" => Some(Capability::Embedding),
            "reranker" => Some(Capability::Reranker),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Llm => "llm",
            Capability::Embedding => "embedding",
            Capability::Reranker => "reranker",
        }
    }
}

/// A client key, as limits and metrics know it. Derived from the key's hash or its dynamic ID
/// (`auth::keys`), so it is the same in every router of a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub u32);

impl KeyId {
    /// The anonymous key of `api.mode: none`; never assigned to a real key.
    pub const ANONYMOUS: KeyId = KeyId(0);
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// An owner (tenant), the scope of flat quota buckets. Derived from the owner string like
/// [`KeyId`]; `TenantId(0)` is the anonymous tenant `default`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub u32);

impl TenantId {
    pub const DEFAULT: TenantId = TenantId(0);

    /// The shard that owns the tenant's quota holder.
    pub fn owner(self, shard_count: usize) -> usize {
        self.0 as usize % shard_count
    }
}

/// Dense agent index assigned by the control core; stable for the life of an agent session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(pub u32);

/// One stay of an agent in the routing pool, from joining to leaving. The control core numbers
/// every join of every agent (it outlives any model's state on a shard), so a slot granted in an
/// earlier stay is told apart from one of the current stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Generation(pub u32);

/// A request's visit to an owner: the requesting shard and its per-shard sequence. The owner
/// names whatever the request holds or waits for by it (a queue place, a reservation, a hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    pub shard: u16,
    pub sequence: u64,
}

/// Which wire format a route's responses (and streams) use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
}
