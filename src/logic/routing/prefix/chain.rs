//! A prompt's chain (`prefix-aware`): the hashes of its fixed-size blocks, each seeded with the
//! one before, so block `i`'s hash stands for every byte up to the end of block `i`.
//!
//! The bytes are the prompt as the client sent it, its parts in the order chat templates render
//! them (the Anthropic `system`, the `tools`, then `messages`): a conversation that grows by
//! turns sends the same leading bytes again, and so the same leading blocks. Two clients that
//! format the same conversation differently (whitespace, key order) share no block; an engine's
//! cache, keyed on tokens after its template, would. A trailing part-block is left out: only
//! whole blocks are cached alike by every engine.
//!
//! Cost: one pass of `foldhash` over at most [`MAX_BLOCKS`] × [`BLOCK_BYTES`] bytes, into a
//! [`Chain`] of fixed size that a shard's [`ChainPool`] hands out again once the request that
//! made it is done: nothing allocates in steady state.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

/// Bytes of the prompt in one block: about 64 tokens of English text, four of vLLM's default
/// 16-token blocks.
pub const BLOCK_BYTES: usize = 256;

/// Blocks hashed at most: the first 64 KiB of a prompt. A longer prompt matches as deep as this
/// at most, which ranks it as well (its first 64 KiB are what a replica has cached or not).
pub const MAX_BLOCKS: usize = 256;

/// Idle chains a shard keeps for its next requests. A shard with more prefix-aware requests in
/// flight than this allocates the difference once, and frees what comes back beyond it.
pub const POOLED_CHAINS: usize = 64;

/// The hasher's fixed seed: every shard and every run hashes a prompt alike.
const SEED: u64 = 0x6869_7665_6e65_7430;

/// A prompt's chain: up to [`MAX_BLOCKS`] block hashes in a buffer of that size (2 KiB), so a
/// buffer serves any prompt again.
#[derive(Clone, PartialEq, Eq)]
pub struct Chain {
    len: usize,
    blocks: [u64; MAX_BLOCKS],
}

impl Chain {
    pub const fn new() -> Chain {
        Chain {
            len: 0,
            blocks: [0; MAX_BLOCKS],
        }
    }

    /// The block hashes, first block first.
    pub fn blocks(&self) -> &[u64] {
        &self.blocks[..self.len]
    }

    fn push(&mut self, hash: u64) {
        self.blocks[self.len] = hash;
        self.len += 1;
    }
}

impl Default for Chain {
    fn default() -> Chain {
        Chain::new()
    }
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_list().entries(self.blocks()).finish()
    }
}

/// The chain of the prompt made of `parts`, in order, into `out` (cleared first). A block's
/// hash is of its bytes and the block before, wherever the parts split it.
pub fn chain_of(parts: &[&[u8]], out: &mut Chain) {
    out.len = 0;
    let state = foldhash::fast::FixedState::with_seed(SEED);
    let mut previous = 0u64;
    // A block that spans two parts is gathered here; one inside a part is hashed in place.
    let mut spanning = [0u8; BLOCK_BYTES];
    let mut filled = 0;
    for part in parts {
        let mut rest = *part;
        while !rest.is_empty() && out.len < MAX_BLOCKS {
            let block = if filled == 0 && rest.len() >= BLOCK_BYTES {
                let (block, after) = rest.split_at(BLOCK_BYTES);
                rest = after;
                block
            } else {
                let take = rest.len().min(BLOCK_BYTES - filled);
                spanning[filled..filled + take].copy_from_slice(&rest[..take]);
                rest = &rest[take..];
                filled += take;
                if filled < BLOCK_BYTES {
                    break;
                }
                filled = 0;
                &spanning[..]
            };
            let mut hasher = state.build_hasher();
            hasher.write_u64(previous);
            hasher.write(block);
            previous = hasher.finish();
            out.push(previous);
        }
    }
}

/// A shard's idle chains. A chain is shared between the request that made it and the model's
/// owner (its ask, a waiter) through an `Arc`; the request gives it back when it is done, and a
/// chain the owner still holds (a cancel not yet handled) is left to the owner to free.
#[derive(Debug, Default)]
pub struct ChainPool {
    free: Vec<Arc<Chain>>,
    /// Chains this pool allocated, for the test that steady state allocates none.
    allocated: u64,
}

impl ChainPool {
    /// The chain of the prompt made of `parts` in a chain from the pool; `None` for a prompt
    /// shorter than one block.
    pub fn chain_of(&mut self, parts: &[&[u8]]) -> Option<Arc<Chain>> {
        let mut chain = loop {
            match self.free.pop() {
                // Dropped, not kept, when the owner still holds it: the owner frees it.
                Some(idle) if Arc::strong_count(&idle) == 1 => break idle,
                Some(_) => continue,
                None => {
                    self.allocated += 1;
                    break Arc::new(Chain::new());
                }
            }
        };
        chain_of(
            parts,
            Arc::get_mut(&mut chain).expect("an idle chain is not shared"),
        );
        if chain.blocks().is_empty() {
            self.give_back(chain);
            return None;
        }
        Some(chain)
    }

    /// A chain whose request is done.
    pub fn give_back(&mut self, chain: Arc<Chain>) {
        if self.free.len() < POOLED_CHAINS {
            self.free.push(chain);
        }
    }

    /// Chains allocated since the pool was made.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(parts: &[&[u8]]) -> Vec<u64> {
        let mut out = Chain::new();
        chain_of(parts, &mut out);
        out.blocks().to_vec()
    }

    #[test]
    fn only_whole_blocks_count_and_each_covers_all_before_it() {
        let text = vec![b'a'; BLOCK_BYTES * 3 + 10];
        let blocks = chain(&[&text]);
        assert_eq!(blocks.len(), 3);
        assert!(chain(&[&text[..BLOCK_BYTES - 1]]).is_empty());
        // Same bytes in every block, different hashes: each is seeded with the one before.
        assert_ne!(blocks[0], blocks[1]);
        assert_ne!(blocks[1], blocks[2]);
    }

    #[test]
    fn a_conversation_that_grows_keeps_its_leading_blocks() {
        let system = vec![b's'; 300];
        let first = format!(
            r#"[{{"role":"user","content":"{}"}}]"#,
            "question one ".repeat(60)
        );
        let second = format!(
            r#"[{{"role":"user","content":"{}"}},{{"role":"assistant","content":"{}"}}]"#,
            "question one ".repeat(60),
            "an answer ".repeat(80)
        );
        let before = chain(&[&system, first.as_bytes()]);
        let after = chain(&[&system, second.as_bytes()]);
        assert!(before.len() >= 3);
        assert!(after.len() > before.len());
        // Every block but the last of the first turn (it holds the closing `]`) is shared.
        let shared = before
            .iter()
            .zip(&after)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(shared >= before.len() - 1, "{shared} of {}", before.len());
        // Another first block changes every block after it.
        let other = chain(&[b"x", &system, first.as_bytes()]);
        assert!(other.iter().zip(&before).all(|(a, b)| a != b));
    }

    #[test]
    fn a_long_prompt_hashes_its_first_blocks_only() {
        let text = vec![b'z'; BLOCK_BYTES * (MAX_BLOCKS + 40)];
        let blocks = chain(&[&text]);
        assert_eq!(blocks.len(), MAX_BLOCKS);
        assert_eq!(chain(&[&text[..BLOCK_BYTES * MAX_BLOCKS]]), blocks);
    }

    #[test]
    fn parts_split_anywhere_hash_as_their_bytes_in_order() {
        let text: Vec<u8> = (0..BLOCK_BYTES * 2).map(|i| i as u8).collect();
        let whole = chain(&[&text]);
        assert_eq!(whole.len(), 2);
        for split in [1, 100, BLOCK_BYTES - 1, BLOCK_BYTES, BLOCK_BYTES + 7] {
            assert_eq!(chain(&[&text[..split], &text[split..]]), whole, "{split}");
        }
        assert_eq!(
            chain(&[&text[..3], &[], &text[3..300], &text[300..]]),
            whole
        );
    }

    #[test]
    fn a_pool_hands_its_chains_out_again_and_leaves_shared_ones() {
        let text = vec![b'p'; BLOCK_BYTES * 3];
        let mut pool = ChainPool::default();
        assert!(pool.chain_of(&[&text[..BLOCK_BYTES - 1]]).is_none());
        for _ in 0..1_000 {
            let chain = pool.chain_of(&[&text]).expect("three blocks");
            assert_eq!(chain.blocks(), chain_of_vec(&text));
            pool.give_back(chain);
        }
        assert_eq!(pool.allocated(), 1);
        // An owner still holds the chain given back: the pool does not write over it.
        let chain = pool.chain_of(&[&text]).expect("three blocks");
        let held = Arc::clone(&chain);
        pool.give_back(chain);
        let other = pool.chain_of(&[&text[BLOCK_BYTES..]]).expect("two blocks");
        assert_eq!(held.blocks(), chain_of_vec(&text));
        assert_eq!(other.blocks().len(), 2);
        assert_eq!(pool.allocated(), 2);
        // Bounded: what comes back beyond the pool's size is freed.
        let many: Vec<_> = (0..POOLED_CHAINS + 10)
            .map(|_| pool.chain_of(&[&text]).expect("three blocks"))
            .collect();
        many.into_iter().for_each(|chain| pool.give_back(chain));
        assert_eq!(pool.free.len(), POOLED_CHAINS);
    }

    fn chain_of_vec(text: &[u8]) -> Vec<u64> {
        chain(&[text])
    }
}
