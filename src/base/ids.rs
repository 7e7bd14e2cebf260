//! The router's ids: small `Copy` values every layer names things by. A leaf module: it imports
//! nothing from the crate, so the pure modules (limits, admission, routing, hold, sibling) and the
//! data plane can all depend on it without depending on each other.
//!
//! Process-local ids (`ModelId`, `AgentId`, `Ticket`, `Generation`) mean nothing to another
//! process; what crosses routers names models by name and keys by their key ID.

use std::fmt;

/// A model as the router serves it: a name for one capability. Assigned by the control core the
/// first time a (name, capability) is seen and never reused in this process: the name's
/// [`ModelNameId`] times three plus the capability, so every capability of one name has the same
/// owner shard (DESIGN: "model M lives on shard hash(M) % N") and what the seeds count per model
/// across kinds (the hold limits) is counted in one place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

impl ModelId {
    /// The id of `name` for `capability`.
    pub fn new(name: ModelNameId, capability: Capability) -> ModelId {
        ModelId(name.0 * 3 + capability as u32)
    }

    /// The model's name, whatever the capability.
    pub fn name(self) -> ModelNameId {
        ModelNameId(self.0 / 3)
    }

    pub fn capability(self) -> Capability {
        Capability::ALL[(self.0 % 3) as usize]
    }

    /// The shard that owns the model's routing, occupancy and hold state: the owner of its
    /// name, so every capability of a name has the same.
    pub fn owner(self, shard_count: usize) -> usize {
        self.name().0 as usize % shard_count
    }
}

/// A model name, whatever the capability: dense, assigned by the control core the first time the
/// name is seen and never reused in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelNameId(pub u32);

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

/// The maps looked up on every request, keyed by the router's own ids or by digests (models,
/// agents, tickets, keys, key hashes): foldhash, seeded per process, instead of the standard
/// library's SipHash. None of these keys can be chosen by a client to land in one bucket.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Positions in a vector, found by a hash of what is stored there: 4 bytes a slot, the entries
/// themselves compared in the vector. A map keyed by the entries would hold each key a second
/// time (the key registry's 32-byte hashes, the metric series' labels). Bounded by the vector it
/// indexes; positions fit in `u32`.
#[derive(Debug, Clone, Default)]
pub struct PositionTable(hashbrown::HashTable<u32>);

impl PositionTable {
    pub fn with_capacity(capacity: usize) -> PositionTable {
        PositionTable(hashbrown::HashTable::with_capacity(capacity))
    }

    /// How many positions are filed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The position under `hash` whose entry `is_entry` accepts.
    #[inline]
    pub fn find(&self, hash: u64, is_entry: impl Fn(usize) -> bool) -> Option<usize> {
        self.0
            .find(hash, |at| is_entry(*at as usize))
            .map(|at| *at as usize)
    }

    /// Records `position` under `hash` (the caller found no equal entry) and returns it;
    /// `rehash` gives the hash of the entry at a position when the table grows.
    pub fn insert(&mut self, hash: u64, position: usize, rehash: impl Fn(usize) -> u64) -> usize {
        let slot = u32::try_from(position).expect("positions fit in u32");
        self.0.insert_unique(hash, slot, |at| rehash(*at as usize));
        position
    }

    /// Forgets `position`, filed under `hash`; panics when it is not there (the caller's tables
    /// and vector disagree).
    pub fn remove(&mut self, hash: u64, position: usize) {
        self.0
            .find_entry(hash, |at| *at as usize == position)
            .expect("the position is filed under its hash")
            .remove();
    }

    /// Files under `hash` the entry that moved from position `from` to `to`.
    pub fn repoint(&mut self, hash: u64, from: usize, to: usize) {
        let slot = self
            .0
            .find_mut(hash, |at| *at as usize == from)
            .expect("the position is filed under its hash");
        *slot = u32::try_from(to).expect("positions fit in u32");
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

impl KeyId {
    /// The id as 8 lowercase hex digits, its text everywhere (`Display`, the audit line).
    pub fn hex(self) -> [u8; 8] {
        let mut digits = [0u8; 8];
        for (slot, shift) in digits.iter_mut().zip((0..8).rev()) {
            *slot = b"0123456789abcdef"[(self.0 >> (shift * 4)) as usize & 0xf];
        }
        digits
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.hex();
        f.write_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_id_shows_as_eight_lowercase_hex_digits() {
        assert_eq!(KeyId(0).to_string(), "00000000");
        assert_eq!(KeyId(0x0a1b_2c3d).to_string(), "0a1b2c3d");
        assert_eq!(KeyId(u32::MAX).to_string(), "ffffffff");
        assert_eq!(&KeyId(0xbeef).hex(), b"0000beef");
    }

    #[test]
    fn every_capability_of_a_name_has_the_names_owner() {
        for name in [ModelNameId(0), ModelNameId(1), ModelNameId(7)] {
            let ids = Capability::ALL.map(|capability| ModelId::new(name, capability));
            for (id, capability) in ids.iter().zip(Capability::ALL) {
                assert_eq!(id.name(), name);
                assert_eq!(id.capability(), capability);
                for shards in 1..5 {
                    assert_eq!(id.owner(shards), ids[0].owner(shards));
                }
            }
        }
        // Names spread over the shards.
        let owners: Vec<usize> = (0..4)
            .map(|name| ModelId::new(ModelNameId(name), Capability::Llm).owner(4))
            .collect();
        assert_eq!(owners, [0, 1, 2, 3]);
    }
}
