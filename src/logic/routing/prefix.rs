//! The prompt prefixes a model's owner shard routed to each agent (`prefix-aware`, issue 34): a
//! bounded index of chained block hashes, asked which agents hold the longest leading run of a
//! new prompt's blocks.
//!
//! A prompt arrives as its chain: block `i`'s hash covers blocks `0..=i` (the caller hashes
//! fixed-size blocks of the canonical prompt, each hash seeded with the one before), so a block
//! matches only where everything before it matched, as an engine's prefix cache keys its blocks.
//! An agent's match is the number of leading blocks of the chain it holds.
//!
//! Bounds: each agent holds at most `blocks_per_agent` blocks, the least recently routed evicted
//! first, and at most [`AGENT_SLOTS`] agents are indexed (an agent beyond them matches nothing
//! until a slot frees). A route records the chain deepest block first, so the shallow blocks,
//! those other prompts share, are the most recent and the last evicted. An agent that leaves is
//! forgotten whole ([`PrefixIndex::forget`]).
//!
//! Cost: a lookup is one hash-map probe per matched block and one more; a record is one probe
//! per block recorded (at most `blocks_per_agent`). Nothing allocates once every agent's blocks
//! are at their bound.

pub mod chain;

use std::collections::HashMap;

use crate::base::ids::AgentId;

/// How `prefix-aware` weighs a prompt's match against load, named as SGLang's model gateway
/// names its cache-aware thresholds (`--cache-threshold`, `--balance-abs-threshold`,
/// `--balance-rel-threshold`), with its defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixSettings {
    /// The least fraction of a prompt's blocks an agent must hold for the prompt to go there;
    /// below it, least-loaded.
    pub cache_threshold: f64,
    /// Load is unbalanced when the most loaded eligible agent carries more than this many
    /// requests over the least loaded...
    pub balance_abs_threshold: u32,
    /// ...and more than this many times its load: then least-loaded, whatever the matches.
    pub balance_rel_threshold: f64,
    /// Blocks indexed per agent at most, the least recently routed evicted first.
    pub blocks_per_agent: usize,
}

impl Default for PrefixSettings {
    fn default() -> PrefixSettings {
        PrefixSettings {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            blocks_per_agent: 16_384,
        }
    }
}

impl PrefixSettings {
    /// Whether loads from `least` to `most` (requests on the eligible agents) are unbalanced.
    pub fn unbalanced(&self, least: u32, most: u32) -> bool {
        most.saturating_sub(least) > self.balance_abs_threshold
            && f64::from(most) > f64::from(least) * self.balance_rel_threshold
    }

    /// Whether `matched` of `blocks` is enough to follow the match.
    pub fn follows(&self, matched: usize, blocks: usize) -> bool {
        matched > 0 && matched as f64 >= self.cache_threshold * blocks as f64
    }
}

/// Upper bounds of the matched-fraction histogram (`hivenet_prefix_matched_ratio`).
pub const MATCHED_RATIO_BUCKETS: [f64; 6] = [0.0, 0.25, 0.5, 0.75, 0.9, 1.0];

/// What `prefix-aware` routing found, per model: a hit is a prompt sent to an agent this router
/// had sent some of its leading blocks before; the matched fraction is of the agent chosen.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrefixStats {
    pub hits: u64,
    pub misses: u64,
    /// Per bucket of [`MATCHED_RATIO_BUCKETS`], the last above every bound (never used: a
    /// fraction is at most 1).
    pub ratio_counts: [u64; MATCHED_RATIO_BUCKETS.len() + 1],
    pub ratio_sum: f64,
    /// Blocks indexed now, every agent's together.
    pub blocks: u64,
}

impl PrefixStats {
    /// A prompt of `blocks` blocks went to an agent holding `matched` of them.
    pub fn observe(&mut self, matched: usize, blocks: usize) {
        if matched > 0 {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        let ratio = matched as f64 / blocks.max(1) as f64;
        let bucket = MATCHED_RATIO_BUCKETS
            .iter()
            .position(|bound| ratio <= *bound)
            .unwrap_or(MATCHED_RATIO_BUCKETS.len());
        self.ratio_counts[bucket] += 1;
        self.ratio_sum += ratio;
    }

    /// Adds another shard's counts of the same model.
    pub fn merge(&mut self, other: &PrefixStats) {
        self.hits += other.hits;
        self.misses += other.misses;
        for (total, count) in self.ratio_counts.iter_mut().zip(other.ratio_counts) {
            *total += count;
        }
        self.ratio_sum += other.ratio_sum;
        self.blocks += other.blocks;
    }
}

/// Agents indexed per model at most: one bit each in a block's holders.
pub const AGENT_SLOTS: usize = 64;

/// No node: the end of a list.
const NONE: u32 = u32::MAX;

/// The prefixes routed to each agent of one model.
#[derive(Debug)]
pub struct PrefixIndex {
    blocks_per_agent: usize,
    /// Each block hash held by some agent, with the slots of the agents that hold it.
    holders: HashMap<u64, u64>,
    /// One per slot; `None` for a free slot.
    agents: Vec<Option<AgentBlocks>>,
}

/// One agent's blocks, least recently routed first: a fixed-capacity list of nodes threaded by
/// index, so touching and evicting allocate nothing.
#[derive(Debug)]
struct AgentBlocks {
    agent: AgentId,
    nodes: Vec<Node>,
    /// Block hash to its node.
    position: HashMap<u64, u32>,
    /// Least recently routed.
    oldest: u32,
    /// Most recently routed.
    newest: u32,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    hash: u64,
    older: u32,
    newer: u32,
}

impl PrefixIndex {
    /// An index holding at most `blocks_per_agent` blocks per agent (at least 1).
    pub fn new(blocks_per_agent: usize) -> PrefixIndex {
        PrefixIndex {
            blocks_per_agent: blocks_per_agent.clamp(1, NONE as usize - 1),
            holders: HashMap::new(),
            agents: Vec::new(),
        }
    }

    /// Blocks held, every agent's together (each block counted once per agent holding it).
    pub fn blocks(&self) -> usize {
        self.agents
            .iter()
            .flatten()
            .map(|blocks| blocks.nodes.len())
            .sum()
    }

    /// The agents that hold a leading run of `chain`, with its length in blocks, into `out`
    /// (cleared first), longest first; agents holding none are left out.
    pub fn matches(&self, chain: &[u64], out: &mut Vec<(AgentId, usize)>) {
        out.clear();
        let mut still: u64 = u64::MAX;
        for (depth, hash) in chain.iter().enumerate() {
            let held = self.holders.get(hash).copied().unwrap_or(0);
            self.push_dropped(still & !held, depth, out);
            still &= held;
            if still == 0 {
                break;
            }
        }
        self.push_dropped(still, chain.len(), out);
        out.sort_by_key(|(_, depth)| std::cmp::Reverse(*depth));
    }

    /// The agents of `slots` matched `depth` blocks (none when `depth` is 0).
    fn push_dropped(&self, slots: u64, depth: usize, out: &mut Vec<(AgentId, usize)>) {
        if depth == 0 {
            return;
        }
        let mut slots = slots;
        while slots != 0 {
            let slot = slots.trailing_zeros() as usize;
            slots &= slots - 1;
            if let Some(Some(blocks)) = self.agents.get(slot) {
                out.push((blocks.agent, depth));
            }
        }
    }

    /// `chain` was routed to `agent`: its blocks become the agent's most recent, deepest first,
    /// within the agent's bound (a chain longer than it records its leading blocks). False when
    /// every slot is taken by other agents (nothing recorded).
    pub fn record(&mut self, agent: AgentId, chain: &[u64]) -> bool {
        let Some(slot) = self.slot_for(agent) else {
            return false;
        };
        let bound = self.blocks_per_agent;
        let blocks = self.agents[slot].as_mut().expect("a taken slot");
        let bit = 1u64 << slot;
        for &hash in chain[..chain.len().min(bound)].iter().rev() {
            if let Some(evicted) = blocks.touch(hash, bound) {
                release(&mut self.holders, evicted, bit);
            }
            *self.holders.entry(hash).or_insert(0) |= bit;
        }
        true
    }

    /// Forgets every block of `agent` (it left the model's pool).
    pub fn forget(&mut self, agent: AgentId) {
        let Some(slot) = self.slot_of(agent) else {
            return;
        };
        let blocks = self.agents[slot].take().expect("a taken slot");
        for node in &blocks.nodes {
            release(&mut self.holders, node.hash, 1u64 << slot);
        }
    }

    fn slot_of(&self, agent: AgentId) -> Option<usize> {
        self.agents
            .iter()
            .position(|blocks| blocks.as_ref().is_some_and(|blocks| blocks.agent == agent))
    }

    fn slot_for(&mut self, agent: AgentId) -> Option<usize> {
        if let Some(slot) = self.slot_of(agent) {
            return Some(slot);
        }
        let fresh = AgentBlocks::new(agent);
        match self.agents.iter().position(Option::is_none) {
            Some(slot) => {
                self.agents[slot] = Some(fresh);
                Some(slot)
            }
            None if self.agents.len() < AGENT_SLOTS => {
                self.agents.push(Some(fresh));
                Some(self.agents.len() - 1)
            }
            None => None,
        }
    }
}

/// `bit`'s agent no longer holds `hash`.
fn release(holders: &mut HashMap<u64, u64>, hash: u64, bit: u64) {
    if let Some(held) = holders.get_mut(&hash) {
        *held &= !bit;
        if *held == 0 {
            holders.remove(&hash);
        }
    }
}

impl AgentBlocks {
    fn new(agent: AgentId) -> AgentBlocks {
        AgentBlocks {
            agent,
            nodes: Vec::new(),
            position: HashMap::new(),
            oldest: NONE,
            newest: NONE,
        }
    }

    /// Makes `hash` the most recent; returns the block evicted to stay within `bound`.
    fn touch(&mut self, hash: u64, bound: usize) -> Option<u64> {
        if let Some(&index) = self.position.get(&hash) {
            self.unlink(index);
            self.link_newest(index);
            return None;
        }
        if self.nodes.len() < bound {
            let index = self.nodes.len() as u32;
            self.nodes.push(Node {
                hash,
                older: NONE,
                newer: NONE,
            });
            self.position.insert(hash, index);
            self.link_newest(index);
            return None;
        }
        // Full: the oldest node takes the new block.
        let index = self.oldest;
        let evicted = self.nodes[index as usize].hash;
        self.unlink(index);
        self.position.remove(&evicted);
        self.nodes[index as usize].hash = hash;
        self.position.insert(hash, index);
        self.link_newest(index);
        Some(evicted)
    }

    fn unlink(&mut self, index: u32) {
        let Node { older, newer, .. } = self.nodes[index as usize];
        match older {
            NONE => self.oldest = newer,
            older => self.nodes[older as usize].newer = newer,
        }
        match newer {
            NONE => self.newest = older,
            newer => self.nodes[newer as usize].older = older,
        }
    }

    fn link_newest(&mut self, index: u32) {
        let node = &mut self.nodes[index as usize];
        node.older = self.newest;
        node.newer = NONE;
        match self.newest {
            NONE => self.oldest = index,
            newest => self.nodes[newest as usize].newer = index,
        }
        self.newest = index;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The chain of `blocks` (each a small number standing for a block's content): block `i`'s
    /// hash covers blocks `0..=i`.
    fn chain(blocks: &[u8]) -> Vec<u64> {
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        blocks
            .iter()
            .map(|&block| {
                hash = (hash ^ u64::from(block)).wrapping_mul(0x0000_0100_0000_01b3);
                hash = hash.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
                hash
            })
            .collect()
    }

    fn matches(index: &PrefixIndex, blocks: &[u8]) -> Vec<(AgentId, usize)> {
        let mut out = Vec::new();
        index.matches(&chain(blocks), &mut out);
        out
    }

    #[test]
    fn a_prompt_matches_where_its_blocks_lead_the_same() {
        let mut index = PrefixIndex::new(16);
        index.record(AgentId(1), &chain(&[1, 2, 3, 4]));
        index.record(AgentId(2), &chain(&[1, 2, 9]));
        assert_eq!(
            matches(&index, &[1, 2, 3, 4, 5]),
            [(AgentId(1), 4), (AgentId(2), 2)]
        );
        assert_eq!(
            matches(&index, &[1, 2, 9]),
            [(AgentId(2), 3), (AgentId(1), 2)]
        );
        // The same block after a different first block is another block.
        assert_eq!(matches(&index, &[7, 2, 3, 4]), []);
        assert_eq!(matches(&index, &[]), []);
    }

    #[test]
    fn the_least_recently_routed_blocks_go_first_deepest_first() {
        let mut index = PrefixIndex::new(4);
        index.record(AgentId(1), &chain(&[1, 2, 3]));
        // Two more blocks, one past the bound: the deepest of the first chain goes (recorded
        // deepest first, it is its oldest).
        index.record(AgentId(1), &chain(&[5, 6]));
        assert_eq!(index.blocks(), 4);
        assert_eq!(matches(&index, &[1, 2, 3]), [(AgentId(1), 2)]);
        assert_eq!(matches(&index, &[5, 6]), [(AgentId(1), 2)]);
        // A chain longer than the bound records its leading blocks.
        index.record(AgentId(2), &chain(&[1, 2, 3, 4, 5, 6]));
        assert_eq!(
            matches(&index, &[1, 2, 3, 4, 5, 6]),
            [(AgentId(2), 4), (AgentId(1), 2)]
        );
    }

    #[test]
    fn an_agent_forgotten_holds_nothing_and_frees_its_slot() {
        let mut index = PrefixIndex::new(8);
        for agent in 0..AGENT_SLOTS as u32 {
            assert!(index.record(AgentId(agent), &chain(&[1, 2])));
        }
        assert!(!index.record(AgentId(999), &chain(&[1, 2])), "no slot left");
        index.forget(AgentId(3));
        assert!(index.record(AgentId(999), &chain(&[1, 2, 3])));
        let found = matches(&index, &[1, 2, 3]);
        assert_eq!(found[0], (AgentId(999), 3));
        assert!(!found.iter().any(|(agent, _)| *agent == AgentId(3)));
        assert_eq!(found.len(), AGENT_SLOTS);
        for agent in (0..AGENT_SLOTS as u32).chain([999]) {
            index.forget(AgentId(agent));
        }
        assert_eq!(index.blocks(), 0);
        assert!(index.holders.is_empty(), "every block released");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Record(u32, Vec<u8>),
        Forget(u32),
        Match(Vec<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        let blocks = proptest::collection::vec(0u8..4, 0..7);
        prop_oneof![
            4 => (0u32..5, blocks.clone()).prop_map(|(agent, blocks)| Op::Record(agent, blocks)),
            1 => (0u32..5).prop_map(Op::Forget),
            3 => blocks.prop_map(Op::Match),
        ]
    }

    /// The reference: per agent, its blocks least recently routed first, searched linearly.
    #[derive(Default)]
    struct Reference {
        agents: Vec<(AgentId, Vec<u64>)>,
    }

    impl Reference {
        fn record(&mut self, agent: AgentId, chain: &[u64], bound: usize) {
            let position = match self.agents.iter().position(|(known, _)| *known == agent) {
                Some(position) => position,
                None => {
                    self.agents.push((agent, Vec::new()));
                    self.agents.len() - 1
                }
            };
            let list = &mut self.agents[position].1;
            for &hash in chain[..chain.len().min(bound)].iter().rev() {
                list.retain(|held| *held != hash);
                list.push(hash);
                if list.len() > bound {
                    list.remove(0);
                }
            }
        }

        fn matches(&self, chain: &[u64]) -> Vec<(AgentId, usize)> {
            let mut out: Vec<(AgentId, usize)> = self
                .agents
                .iter()
                .map(|(agent, list)| {
                    let depth = chain.iter().take_while(|hash| list.contains(hash)).count();
                    (*agent, depth)
                })
                .filter(|(_, depth)| *depth > 0)
                .collect();
            out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            out
        }
    }

    proptest! {
        /// The longest matches agree with a brute-force reference whatever the course, and no
        /// agent ever holds more than its bound.
        #[test]
        fn matches_agree_with_a_brute_force_reference(
            bound in 1usize..6,
            ops in proptest::collection::vec(op(), 0..120),
        ) {
            let mut index = PrefixIndex::new(bound);
            let mut reference = Reference::default();
            let mut found = Vec::new();
            for op in ops {
                match op {
                    Op::Record(agent, blocks) => {
                        index.record(AgentId(agent), &chain(&blocks));
                        reference.record(AgentId(agent), &chain(&blocks), bound);
                    }
                    Op::Forget(agent) => {
                        index.forget(AgentId(agent));
                        reference.agents.retain(|(known, _)| *known != AgentId(agent));
                    }
                    Op::Match(blocks) => {
                        index.matches(&chain(&blocks), &mut found);
                        found.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                        prop_assert_eq!(&found, &reference.matches(&chain(&blocks)));
                    }
                }
                for blocks in index.agents.iter().flatten() {
                    prop_assert!(blocks.nodes.len() <= bound);
                    prop_assert_eq!(blocks.position.len(), blocks.nodes.len());
                }
                let held: usize = index.holders.values().map(|slots| slots.count_ones() as usize).sum();
                prop_assert_eq!(held, index.blocks());
            }
        }
    }
}
