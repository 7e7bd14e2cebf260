//! The data plane: one pinned `monoio` runtime per core, each accepting on the shared HTTP port.
//!
//! Key components: `mesh` (SPSC rings between shards), `messages` (what flows between the control
//! core and shards, and between shards), `state` (what one shard owns), `quotas` (per-owner limit
//! state), `connection` / `h2c` (client connections), `runtime` (thread start-up, driver choice,
//! pinning).
//!
//! Ownership: a model's routing state lives on shard `model id % shards`
//! (`state::owner_of_model`), a key owner's quota state on `tenant id % shards`; other shards ask
//! the owner over the mesh. Both ids are dense or hash-derived, so ownership spreads evenly. A
//! client connection stays on the shard that accepted it for its whole life, and so does its
//! response stream: each shard has its own tunnel connection to every agent.

pub mod clients;
pub mod guards;
pub mod inbox;
pub mod latch;
pub mod lifecycle;
pub mod mesh;
pub mod messages;
pub mod outbox;
pub mod owner;
pub mod state;
pub mod visit;

/// The maps a shard looks up on every request, keyed by the router's own ids (models, agents,
/// tickets, keys): foldhash, seeded per process, instead of the standard library's SipHash.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
