//! The data plane: one pinned `monoio` runtime per core, each accepting on the shared HTTP port.
//!
//! Key components: `mesh` (SPSC rings between shards), `messages` (what flows between the control
//! core and shards, and between shards), `state` (what one shard owns), `runtime` (thread start-up,
//! driver choice, pinning).
//!
//! Ownership: a model's routing state lives on `owner_of(model name)`; other shards ask it over the
//! mesh. A client connection stays on the shard that accepted it for its whole life, and so does its
//! response stream: each shard has its own tunnel connection to every agent.

pub mod connection;
pub mod h2c;
pub mod latch;
pub mod mesh;
pub mod messages;
pub mod quotas;
pub mod runtime;
pub mod snapshot;
pub mod state;

/// FNV-1a: a stable, dependency-free hash so every router process agrees on ownership.
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The shard that owns the state named `name` (a model name, later an API key ID).
pub fn owner_of(name: &str, shard_count: usize) -> usize {
    (stable_hash(name.as_bytes()) % shard_count as u64) as usize
}
