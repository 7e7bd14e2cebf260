//! One model's prefix cache, after vLLM's automatic prefix caching: a prompt is cut into blocks of
//! a fixed number of tokens, each block is known by a key that covers everything before it too,
//! and a request reuses the longest run of leading blocks that an earlier request left cached.
//!
//! Key components: [`BlockHasher`] turns a byte stream into chained block keys; [`PrefixCache`]
//! holds a bounded set of keys, evicting the least recently used.
//!
//! Owns the cached keys and their recency. It does not know what a prompt is: the byte stream that
//! stands for a prompt's tokens is defined next to the prompt-token estimate, in
//! [`request`](super::request). Pure: no lock, no clock (recency is a counter), no I/O.
//!
//! Invariants: a cache never holds more than its capacity in keys; `stamp_by_key` and
//! `key_by_stamp` are inverse maps of each other, so each key has exactly one recency stamp.
//!
//! Performance: looking up and recording a prompt of n blocks costs O(n log capacity); memory
//! grows to at most `capacity_blocks` entries and no further.

use std::collections::{BTreeMap, HashMap};

/// The key of one cache block: a hash of the block and of every block before it, so equal keys
/// mean equal prefixes (up to a 64-bit hash collision), as with vLLM's block hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub u64);

/// FNV-1a, 64-bit: offset basis and prime.
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Cuts a byte stream into blocks of `block_bytes` bytes and keys each full block.
///
/// Block i's key is the 64-bit FNV-1a hash of bytes `0..(i + 1) × block_bytes`: one hash runs over
/// the whole stream and its state is read at each block boundary, which chains every key to all
/// the blocks before it. FNV-1a is used because its result does not depend on how the stream is
/// split across [`write`](BlockHasher::write) calls (so a caller can feed a prompt piece by piece
/// without copying it), it is the same on every run and build, and it needs no dependency. Bytes
/// after the last full block have no key: a partial block is never cached.
#[derive(Debug)]
pub struct BlockHasher {
    block_bytes: u64,
    state: u64,
    /// Bytes written into the current, not yet full, block.
    filled_bytes: u64,
    keys: Vec<BlockKey>,
}

impl BlockHasher {
    /// Panics when `block_bytes` is 0: a block must hold something.
    pub fn new(block_bytes: u64) -> BlockHasher {
        assert!(block_bytes >= 1, "a cache block holds at least one byte");
        BlockHasher {
            block_bytes,
            state: FNV_OFFSET_BASIS,
            filled_bytes: 0,
            keys: Vec::new(),
        }
    }

    pub fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.state = (self.state ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
            self.filled_bytes += 1;
            if self.filled_bytes == self.block_bytes {
                self.keys.push(BlockKey(self.state));
                self.filled_bytes = 0;
            }
        }
    }

    /// The keys of the full blocks written, in stream order.
    pub fn finish(self) -> Vec<BlockKey> {
        self.keys
    }
}

/// A bounded set of block keys with least-recently-used eviction.
#[derive(Debug)]
pub struct PrefixCache {
    /// Most keys held at once (`--prefix-cache-blocks`).
    capacity_blocks: usize,
    stamp_by_key: HashMap<BlockKey, u64>,
    /// The same entries ordered by recency: the first is the least recently used.
    key_by_stamp: BTreeMap<u64, BlockKey>,
    /// Stamp of the next touch; only grows.
    next_stamp: u64,
}

impl PrefixCache {
    pub fn new(capacity_blocks: usize) -> PrefixCache {
        PrefixCache {
            capacity_blocks,
            stamp_by_key: HashMap::new(),
            key_by_stamp: BTreeMap::new(),
            next_stamp: 0,
        }
    }

    /// Looks up a prompt's block keys (in prompt order) and then records them all as cached.
    /// Returns the hit: how many leading blocks were cached before this call. A block after the
    /// first miss does not count even when present, because its key only says that the prefix
    /// matched, and the missing block must be computed before it can be used.
    ///
    /// The blocks are touched from the last to the first, so a prompt's first block becomes the
    /// most recently used and eviction takes a prompt's tail before its head: whatever survives is
    /// still a usable prefix. vLLM frees a finished request's blocks in reverse order for the same
    /// reason.
    pub fn look_up_and_record(&mut self, keys: &[BlockKey]) -> usize {
        let hit_blocks = keys
            .iter()
            .take_while(|key| self.stamp_by_key.contains_key(key))
            .count();
        for &key in keys.iter().rev() {
            self.touch(key);
        }
        hit_blocks
    }

    /// Marks `key` as the most recently used, inserting it if absent and evicting the least
    /// recently used key if that takes the cache over its capacity.
    fn touch(&mut self, key: BlockKey) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(previous) = self.stamp_by_key.insert(key, stamp) {
            self.key_by_stamp.remove(&previous);
        }
        self.key_by_stamp.insert(stamp, key);
        if self.stamp_by_key.len() > self.capacity_blocks {
            let (_, evicted) = self
                .key_by_stamp
                .pop_first()
                .expect("a cache over its capacity holds a key");
            self.stamp_by_key.remove(&evicted);
        }
        debug_assert_eq!(self.stamp_by_key.len(), self.key_by_stamp.len());
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.stamp_by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamp_by_key.is_empty()
    }

    /// Keys from the least to the most recently used.
    pub fn keys_by_recency(&self) -> impl Iterator<Item = BlockKey> + '_ {
        self.key_by_stamp.values().copied()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn keys_of(bytes: &[u8], block_bytes: u64) -> Vec<BlockKey> {
        let mut hasher = BlockHasher::new(block_bytes);
        hasher.write(bytes);
        hasher.finish()
    }

    #[test]
    fn only_full_blocks_get_keys() {
        assert_eq!(keys_of(b"", 4).len(), 0);
        assert_eq!(keys_of(b"abc", 4).len(), 0);
        assert_eq!(keys_of(b"abcd", 4).len(), 1);
        assert_eq!(keys_of(b"abcdefghi", 4).len(), 2);
    }

    #[test]
    fn keys_do_not_depend_on_how_the_stream_is_split() {
        let mut hasher = BlockHasher::new(3);
        for piece in [&b"ab"[..], b"", b"cdefg", b"h"] {
            hasher.write(piece);
        }
        assert_eq!(hasher.finish(), keys_of(b"abcdefgh", 3));
    }

    #[test]
    fn a_block_key_chains_everything_before_it() {
        let first = keys_of(b"aaaaXXXX", 4);
        let second = keys_of(b"bbbbXXXX", 4);
        // The same second block after a different first block has a different key.
        assert_ne!(first[1], second[1]);
        // A shared prefix has shared keys, up to where the streams differ.
        let third = keys_of(b"aaaaXXXXcccc", 4);
        assert_eq!(third[..2], first[..]);
    }

    #[test]
    fn a_repeated_prompt_hits_every_block() {
        let mut cache = PrefixCache::new(16);
        let keys = keys_of(b"0123456789abcdef", 4);
        assert_eq!(cache.look_up_and_record(&keys), 0);
        assert_eq!(cache.look_up_and_record(&keys), 4);
        assert_eq!(cache.len(), 4);
    }

    #[test]
    fn a_shared_prefix_hits_up_to_the_first_different_block() {
        let mut cache = PrefixCache::new(16);
        cache.look_up_and_record(&keys_of(b"aaaabbbbccccdddd", 4));
        assert_eq!(
            cache.look_up_and_record(&keys_of(b"aaaabbbbxxxxdddd", 4)),
            2
        );
        assert_eq!(
            cache.look_up_and_record(&keys_of(b"zaaabbbbccccdddd", 4)),
            0
        );
    }

    #[test]
    fn a_present_block_after_a_miss_does_not_count() {
        let mut cache = PrefixCache::new(16);
        let keys = [BlockKey(1), BlockKey(2), BlockKey(3)];
        cache.look_up_and_record(&keys[1..]);
        assert_eq!(cache.look_up_and_record(&keys), 0);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_and_a_prompt_tail_first() {
        let mut cache = PrefixCache::new(4);
        let a = [BlockKey(10), BlockKey(11)];
        let b = [BlockKey(20), BlockKey(21)];
        cache.look_up_and_record(&a);
        cache.look_up_and_record(&b);
        // A prompt's head is more recent than its tail.
        assert_eq!(
            cache.keys_by_recency().collect::<Vec<_>>(),
            [BlockKey(11), BlockKey(10), BlockKey(21), BlockKey(20)]
        );
        // Using `a` again makes `b` the least recently used; a new block evicts b's tail.
        assert_eq!(cache.look_up_and_record(&a), 2);
        cache.look_up_and_record(&[BlockKey(30)]);
        assert_eq!(
            cache.keys_by_recency().collect::<Vec<_>>(),
            [BlockKey(20), BlockKey(11), BlockKey(10), BlockKey(30)]
        );
        assert_eq!(cache.look_up_and_record(&b), 1);
    }

    #[test]
    fn a_prompt_longer_than_the_cache_keeps_its_head() {
        let mut cache = PrefixCache::new(3);
        let keys: Vec<BlockKey> = (0..5).map(BlockKey).collect();
        assert_eq!(cache.look_up_and_record(&keys), 0);
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.look_up_and_record(&keys), 3);
    }

    #[test]
    fn a_zero_capacity_cache_holds_nothing() {
        let mut cache = PrefixCache::new(0);
        let keys = [BlockKey(1), BlockKey(2)];
        cache.look_up_and_record(&keys);
        assert!(cache.is_empty());
        assert_eq!(cache.look_up_and_record(&keys), 0);
    }

    /// The reference the property test compares with: an LRU list, least recently used first.
    fn reference_look_up_and_record(
        list: &mut Vec<BlockKey>,
        capacity: usize,
        keys: &[BlockKey],
    ) -> usize {
        let hit_blocks = keys.iter().take_while(|key| list.contains(key)).count();
        for key in keys.iter().rev() {
            list.retain(|held| held != key);
            list.push(*key);
            if list.len() > capacity {
                list.remove(0);
            }
        }
        hit_blocks
    }

    proptest! {
        /// Whatever prompts arrive, the cache reports the same hits and holds the same keys in
        /// the same recency order as a plain LRU list, and never holds more than its capacity.
        #[test]
        fn matches_a_reference_lru_list(
            capacity in 0usize..8,
            prompts in prop::collection::vec(
                prop::collection::vec((0u64..12).prop_map(BlockKey), 0..6),
                0..40,
            ),
        ) {
            let mut cache = PrefixCache::new(capacity);
            let mut reference = Vec::new();
            for prompt in &prompts {
                let hit = cache.look_up_and_record(prompt);
                let expected = reference_look_up_and_record(&mut reference, capacity, prompt);
                prop_assert_eq!(hit, expected);
                prop_assert!(cache.len() <= capacity);
                prop_assert_eq!(cache.keys_by_recency().collect::<Vec<_>>(), reference.clone());
            }
        }
    }
}
