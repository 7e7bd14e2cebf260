//! Per-model routing state, owned by the model's owner shard: the model's agents, this router's
//! in-flight count on each, and the model's capacity queue.
//!
//! Pure logic: no clock, no I/O, no runtime. The owner shard calls it directly for local requests
//! and on behalf of other shards' mesh messages; every decision is returned as data.
//!
//! Invariants:
//! - an agent's `own_in_flight` never exceeds its declared capacity, and equals the grants handed out
//!   for it minus the releases received;
//! - a release counts only against the generation that granted it: an agent that leaves and joins
//!   again under the same [`AgentId`] (a lost tunnel, redialled a second later) starts a new
//!   generation, and releases of slots granted before it left are ignored, never charged to it;
//! - a queued ticket is either granted exactly once, cancelled, or failed (agents gone) — never two;
//! - the queue never grows beyond `queue_depth`.
//!
//! Load: the larger of the agent's reported in-flight count and this router's own. The reported
//! count is up to one signal interval old, so after a release here the raw report would keep the
//! slot looking busy until the next signal. We therefore refresh it with our own changes since the
//! report: `others = reported - own at report time` (other routers' share, clamped at 0) and
//! `load = max(reported_refreshed, own) = own + others`. With one router this is exactly `own`.
//!
//! Steps: a model's policy has a primary step and fallback steps, each a filter over the agents
//! ([`StepFilter`], the policy's `match` and `exclude_if`). A request takes the first step, from
//! where it starts, that has an eligible agent: a free one is granted at once; when every eligible
//! agent is full the request waits in the queue for that step, and when the queue is full it moves
//! on to the next step. A waiter is granted the best agent its step allows (and its
//! exclusions, the agents that already failed it) as soon as one has room; waiters that cannot
//! use a free agent do not block those behind them that can.
//!
//! Ranking: by the step's [`Strategy`] (one signal, the lowest first, then least-loaded, then the
//! rotation); an agent that lacks the signal ranks after every agent that has it.

pub mod counters;
pub mod prefix;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::base::ids::ModelId;
pub use crate::base::ids::{AgentId, Generation, Ticket};

/// A ranking strategy the router implements: how a step picks among the agents that pass its
/// filter and have a free slot ([`ModelRoutes`], `docs/policies.md`, "Ranking strategies"). Each ranks by
/// one signal, the lowest first, then least-loaded among equals; an agent that lacks the signal
/// ranks after every agent that has it, least-loaded among those that lack it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strategy {
    /// Lowest `requests on the agent / declared capacity` first.
    #[default]
    LeastLoaded,
    /// Lowest smoothed latency this router measured on the agent for the model (SRTT).
    LowestSrtt,
    /// Each agent in turn, per model, whatever its load (among those with room).
    RoundRobin,
    /// Lowest KV-cache use the engine reports.
    LowestKvCache,
    /// Fewest requests waiting in the engine's own queue.
    LowestQueue,
    /// Lowest average time to first token the engine reports.
    BestTtft,
    /// Lowest average time between tokens the engine reports.
    BestItl,
    /// The agent this router sent the longest leading run of the prompt's blocks before, when
    /// it covers enough of the prompt and load is balanced; least-loaded otherwise
    /// ([`prefix::PrefixSettings`]). A request without a prompt chain ranks least-loaded.
    PrefixAware,
}

impl Strategy {
    /// Every strategy, in the order the policy reference lists them.
    pub const ALL: [Strategy; 8] = [
        Strategy::LeastLoaded,
        Strategy::LowestSrtt,
        Strategy::RoundRobin,
        Strategy::PrefixAware,
        Strategy::LowestKvCache,
        Strategy::LowestQueue,
        Strategy::BestTtft,
        Strategy::BestItl,
    ];

    /// The policy YAML's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::LeastLoaded => "least-loaded",
            Strategy::LowestSrtt => "lowest-srtt",
            Strategy::RoundRobin => "round-robin",
            Strategy::PrefixAware => "prefix-aware",
            Strategy::LowestKvCache => "lowest-kv-cache",
            Strategy::LowestQueue => "lowest-queue",
            Strategy::BestTtft => "best-ttft",
            Strategy::BestItl => "best-itl",
        }
    }

    pub fn parse(text: &str) -> Option<Strategy> {
        Strategy::ALL
            .into_iter()
            .find(|strategy| strategy.name() == text)
    }

    /// Every name, for messages.
    pub fn names() -> String {
        Strategy::ALL.map(Strategy::name).join(", ")
    }
}

/// An agent's engine signals from its last routing signal; `None` where the engine reports none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineSignals {
    /// KV-cache use, 0.0 to 1.0.
    pub kv_cache_utilization: Option<f64>,
    pub running_requests: Option<f64>,
    pub waiting_requests: Option<f64>,
    /// The engine's average time to first token and between tokens, in seconds (vLLM and
    /// SGLang report them; `best-ttft`, `best-itl`).
    pub avg_ttft_seconds: Option<f64>,
    pub avg_itl_seconds: Option<f64>,
}

/// What an agent registered: the static facts a step's `match` reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentProfile {
    /// The agent's libp2p-style peer ID (the audit log's `agent_id`).
    /// These four label metric series: shared (`Arc`), so a new series clones rather than
    /// copies them.
    pub peer_id: Arc<str>,
    pub engine: Arc<str>,
    pub region: Arc<str>,
    pub tags: Box<[String]>,
    /// `--deployment-id` as registered; empty when the agent gave none.
    pub deployment_id: Arc<str>,
    /// `--organization` and `--machine` as registered (`Unknown` when the agent gave none).
    pub organization: Box<str>,
    pub machine: Box<str>,
    /// The router's per-agent lifetime counters of each model it serves (`hivenet_agent_*`).
    pub counters: crate::logic::routing::counters::CountersByModel,
}

/// What a step filter sees of one candidate agent.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub profile: &'a AgentProfile,
    pub engine: &'a EngineSignals,
    /// Requests on the agent (ours and other routers') over its declared capacity.
    pub capacity_utilization: f64,
}

/// A model's routing steps (the policy's primary step, then its fallback chain).
pub trait StepFilter: Send + Sync {
    /// At least one.
    fn step_count(&self) -> usize;
    /// Whether step `step` may route to this candidate.
    fn allows(&self, step: usize, candidate: &Candidate<'_>) -> bool;
    /// How step `step` ranks the candidates it allows.
    fn strategy(&self, _step: usize) -> Strategy {
        Strategy::LeastLoaded
    }
}

/// One step that allows every agent: the routing of a model without a policy.
pub struct AnyAgent;

impl StepFilter for AnyAgent {
    fn step_count(&self) -> usize {
        1
    }

    fn allows(&self, _step: usize, _candidate: &Candidate<'_>) -> bool {
        true
    }
}

/// A slot granted on an agent, and the step that chose it. Release it with [`ModelRoutes::release`]
/// exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub agent: AgentId,
    /// The agent's stay that the slot belongs to.
    pub generation: Generation,
    pub step: u8,
}

/// Where a request starts looking, and the agents it must not get again (they failed it in this
/// step).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ask {
    pub start_step: u8,
    pub excluded: Box<[AgentId]>,
    /// Queue even when the queue is at `queue_depth` (hold at zero: a request released by a
    /// wake; the hold limits bound how many there are). Never when queueing is off.
    pub beyond_depth: bool,
    /// The prompt's chain of block hashes ([`prefix::chain::chain_of`]), for a step that ranks
    /// `prefix-aware`; `None` for every other request.
    pub prefix: Option<Arc<prefix::chain::Chain>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A slot on this agent is now held for the ticket; release it exactly once.
    Granted(Grant),
    /// Every agent is full; the ticket waits in the capacity queue.
    Queued,
    /// Every agent is full and the queue is at `queue_depth` (or queueing is off).
    QueueFull,
    /// The model has no agent at all.
    NoAgents,
}

#[derive(Debug, Clone)]
struct AgentLoad {
    agent: AgentId,
    generation: Generation,
    capacity: u32,
    own_in_flight: u32,
    /// Other routers' requests on this agent: its last report minus our own count at that moment.
    others_in_flight: u32,
    engine: EngineSignals,
    profile: Arc<AgentProfile>,
}

impl AgentLoad {
    fn load(&self) -> u32 {
        self.own_in_flight + self.others_in_flight
    }

    fn has_room(&self) -> bool {
        self.own_in_flight < self.capacity && self.load() < self.capacity
    }

    fn candidate(&self) -> Candidate<'_> {
        Candidate {
            profile: &self.profile,
            engine: &self.engine,
            capacity_utilization: if self.capacity == 0 {
                1.0
            } else {
                f64::from(self.load()) / f64::from(self.capacity)
            },
        }
    }
}

/// What a candidate ranks by: its strategy's signal (lower first; an agent with it before any
/// agent without it), then requests on it over its capacity (least-loaded, the policy
/// reference's "Ranking strategy"), compared by cross-multiplying (no floats, exact ties).
#[derive(Debug, Clone, Copy)]
struct Rank {
    signal: Option<f64>,
    load: u64,
    capacity: u64,
}

impl Rank {
    fn is_better_than(&self, other: &Rank) -> bool {
        match (self.signal, other.signal) {
            (Some(mine), Some(theirs)) if mine != theirs => mine < theirs,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            _ => self.load * other.capacity < other.load * self.capacity,
        }
    }
}

#[derive(Debug, Clone)]
struct Waiter {
    ticket: Ticket,
    step: u8,
    excluded: Box<[AgentId]>,
    prefix: Option<Arc<prefix::chain::Chain>>,
}

pub struct ModelRoutes {
    /// The model these routes serve: its agents' latency counters are this model's
    /// (`lowest-srtt`); `None` in tests that rank by other signals.
    model: Option<ModelId>,
    agents: Vec<AgentLoad>,
    queue: VecDeque<Waiter>,
    queue_depth: usize,
    /// Rotates the starting point among equally loaded agents so ties spread evenly.
    next_tie_break: usize,
    steps: Arc<dyn StepFilter>,
    /// `prefix-aware`: the prompts routed to each agent, built at the first prompt a step ranks
    /// by it; its thresholds, what it found, and the matches of the last lookup (kept, so a
    /// lookup allocates nothing).
    prefix: Option<prefix::PrefixIndex>,
    prefix_settings: prefix::PrefixSettings,
    prefix_stats: prefix::PrefixStats,
    matches: Vec<(AgentId, usize)>,
}

impl fmt::Debug for ModelRoutes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRoutes")
            .field("agents", &self.agents)
            .field("queue", &self.queue)
            .field("queue_depth", &self.queue_depth)
            .field("steps", &self.steps.step_count())
            .finish()
    }
}

impl ModelRoutes {
    pub fn new(queue_depth: usize) -> ModelRoutes {
        ModelRoutes {
            model: None,
            agents: Vec::new(),
            queue: VecDeque::new(),
            queue_depth,
            next_tie_break: 0,
            steps: Arc::new(AnyAgent),
            prefix: None,
            prefix_settings: prefix::PrefixSettings::default(),
            prefix_stats: prefix::PrefixStats::default(),
            matches: Vec::new(),
        }
    }

    /// `prefix-aware` steps rank by `settings`.
    pub fn with_prefix_settings(mut self, settings: prefix::PrefixSettings) -> ModelRoutes {
        self.prefix_settings = settings;
        self
    }

    /// What `prefix-aware` routing found here, and the blocks indexed now.
    pub fn prefix_stats(&self) -> prefix::PrefixStats {
        prefix::PrefixStats {
            blocks: self
                .prefix
                .as_ref()
                .map_or(0, |index| index.blocks() as u64),
            ..self.prefix_stats
        }
    }

    /// The routes of `model` (its agents' latency counters rank `lowest-srtt`).
    pub fn for_model(model: ModelId, queue_depth: usize) -> ModelRoutes {
        ModelRoutes {
            model: Some(model),
            ..ModelRoutes::new(queue_depth)
        }
    }

    /// The model's steps changed (a new policy): waiters keep their step index, clamped to the
    /// new chain, and whoever fits now is granted.
    pub fn set_steps(&mut self, steps: Arc<dyn StepFilter>) -> Vec<(Ticket, Grant)> {
        let last = steps
            .step_count()
            .saturating_sub(1)
            .min(usize::from(u8::MAX)) as u8;
        for waiter in &mut self.queue {
            waiter.step = waiter.step.min(last);
        }
        self.steps = steps;
        self.drain_queue()
    }

    // ----- queries -----

    pub fn agent_count(&self) -> usize {
        self.agents.len()
    }

    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    pub fn own_in_flight(&self, agent: AgentId) -> Option<u32> {
        self.find(agent)
            .map(|index| self.agents[index].own_in_flight)
    }

    pub fn total_own_in_flight(&self) -> u32 {
        self.agents.iter().map(|agent| agent.own_in_flight).sum()
    }

    /// Nothing is held or waiting: the owner may drop this state once the model has no agents.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.total_own_in_flight() == 0
    }

    // ----- inputs -----

    /// Adds the agent for its stay `generation`, or updates its capacity and profile within the
    /// same stay. A new stay of an agent still listed (its leaving was never seen) starts afresh:
    /// the old stay's slots are not this stay's. Newly free capacity is handed to waiting
    /// tickets, returned as grants to deliver.
    pub fn agent_up(
        &mut self,
        agent: AgentId,
        generation: Generation,
        capacity: u32,
        profile: Arc<AgentProfile>,
    ) -> Vec<(Ticket, Grant)> {
        let fresh = AgentLoad {
            agent,
            generation,
            capacity,
            own_in_flight: 0,
            others_in_flight: 0,
            engine: EngineSignals::default(),
            profile,
        };
        match self.find(agent) {
            Some(index) if self.agents[index].generation == generation => {
                let load = &mut self.agents[index];
                load.capacity = fresh.capacity;
                load.profile = fresh.profile;
            }
            Some(index) => {
                // A new stay: its engine may have restarted, its cache empty.
                self.forget_prefixes(agent);
                self.agents[index] = fresh;
            }
            None => self.agents.push(fresh),
        }
        self.drain_queue()
    }

    /// Removes the agent. Its outstanding slots vanish with it: their releases are ignored, even
    /// after the agent joins again (a new generation). When
    /// no agent remains, every waiter is failed and returned.
    pub fn agent_down(&mut self, agent: AgentId) -> Vec<Ticket> {
        if let Some(index) = self.find(agent) {
            self.agents.swap_remove(index);
        }
        self.forget_prefixes(agent);
        if self.agents.is_empty() {
            self.queue.drain(..).map(|waiter| waiter.ticket).collect()
        } else {
            Vec::new()
        }
    }

    /// The agent's own report of requests it is serving, from every router, and its engine's
    /// signals.
    pub fn signal(
        &mut self,
        agent: AgentId,
        reported_in_flight: u32,
        engine: EngineSignals,
    ) -> Vec<(Ticket, Grant)> {
        if let Some(index) = self.find(agent) {
            let load = &mut self.agents[index];
            load.others_in_flight = reported_in_flight.saturating_sub(load.own_in_flight);
            load.engine = engine;
        }
        self.drain_queue()
    }

    /// Each engine signal averaged over the agents that report it (seed, B3: "averages each
    /// available signal across healthy agents serving the requested model"); `None` where no
    /// agent reports it.
    pub fn pool_signals(&self) -> EngineSignals {
        let average = |signal: fn(&EngineSignals) -> Option<f64>| {
            let (sum, count) = self
                .agents
                .iter()
                .filter_map(|load| signal(&load.engine))
                .fold((0.0, 0u32), |(sum, count), value| (sum + value, count + 1));
            (count > 0).then(|| sum / f64::from(count))
        };
        EngineSignals {
            kv_cache_utilization: average(|engine| engine.kv_cache_utilization),
            running_requests: average(|engine| engine.running_requests),
            waiting_requests: average(|engine| engine.waiting_requests),
            avg_ttft_seconds: average(|engine| engine.avg_ttft_seconds),
            avg_itl_seconds: average(|engine| engine.avg_itl_seconds),
        }
    }

    /// The best agent with room from the first step, else the queue.
    pub fn acquire(&mut self, ticket: Ticket) -> Acquire {
        self.acquire_from(ticket, &Ask::default())
    }

    /// The best eligible agent with room, from `ask.start_step` on (see the module doc).
    pub fn acquire_from(&mut self, ticket: Ticket, ask: &Ask) -> Acquire {
        if self.agents.is_empty() {
            return Acquire::NoAgents;
        }
        let steps = self.steps.step_count().min(usize::from(u8::MAX) + 1);
        let mut any_eligible = false;
        for step in usize::from(ask.start_step)..steps {
            let step = step as u8;
            if !self.any_eligible(step, &ask.excluded) {
                continue;
            }
            any_eligible = true;
            // Waiters are served first: a new request never overtakes the queue.
            if self.queue.is_empty()
                && let Some(grant) = self.take_best(
                    step,
                    &ask.excluded,
                    ask.prefix.as_deref().map(prefix::chain::Chain::blocks),
                )
            {
                return Acquire::Granted(grant);
            }
            if self.queue.len() < self.queue_depth || (ask.beyond_depth && self.queue_depth > 0) {
                self.queue.push_back(Waiter {
                    ticket,
                    step,
                    excluded: ask.excluded.clone(),
                    prefix: ask.prefix.clone(),
                });
                return Acquire::Queued;
            }
        }
        if any_eligible {
            Acquire::QueueFull
        } else {
            Acquire::NoAgents
        }
    }

    /// Returns a slot. The freed capacity goes to the head of the queue first. A slot of an
    /// earlier generation of the agent (it left since) frees nothing.
    pub fn release(&mut self, grant: Grant) -> Vec<(Ticket, Grant)> {
        if let Some(index) = self.find(grant.agent) {
            let load = &mut self.agents[index];
            if load.generation == grant.generation {
                // Stays on in release builds: a release counted twice would hand the agent more
                // requests than its capacity.
                assert!(
                    load.own_in_flight > 0,
                    "release without a grant on {:?} {:?}",
                    grant.agent,
                    grant.generation
                );
                load.own_in_flight -= 1;
            }
        }
        self.drain_queue()
    }

    /// The agent's current generation, while it is in the pool.
    pub fn generation(&self, agent: AgentId) -> Option<Generation> {
        self.find(agent).map(|index| self.agents[index].generation)
    }

    /// Removes a waiting ticket (its request timed out or its client left). False when the ticket
    /// is no longer queued: it was granted already, and its grant must then be released.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        match self.queue.iter().position(|queued| queued.ticket == ticket) {
            Some(index) => {
                self.queue.remove(index);
                true
            }
            None => false,
        }
    }

    // ----- internals -----

    fn forget_prefixes(&mut self, agent: AgentId) {
        if let Some(index) = &mut self.prefix {
            index.forget(agent);
        }
    }

    fn find(&self, agent: AgentId) -> Option<usize> {
        self.agents.iter().position(|load| load.agent == agent)
    }

    fn eligible(&self, load: &AgentLoad, step: u8, excluded: &[AgentId]) -> bool {
        !excluded.contains(&load.agent) && self.steps.allows(usize::from(step), &load.candidate())
    }

    fn any_eligible(&self, step: u8, excluded: &[AgentId]) -> bool {
        self.agents
            .iter()
            .any(|load| self.eligible(load, step, excluded))
    }

    /// The signal `strategy` ranks `load` by, lowest first; `None` when the agent lacks it (or
    /// the strategy ranks by load alone). A value that is not finite is taken as lacking.
    fn ranking_signal(&self, load: &AgentLoad, strategy: Strategy) -> Option<f64> {
        let value = match strategy {
            Strategy::LeastLoaded | Strategy::RoundRobin | Strategy::PrefixAware => None,
            Strategy::LowestKvCache => load.engine.kv_cache_utilization,
            Strategy::LowestQueue => load.engine.waiting_requests,
            Strategy::BestTtft => load.engine.avg_ttft_seconds,
            Strategy::BestItl => load.engine.avg_itl_seconds,
            Strategy::LowestSrtt => self
                .model
                .and_then(|model| load.profile.counters.of(model))
                .and_then(counters::AgentCounters::srtt_ms),
        };
        value.filter(|value| value.is_finite())
    }

    /// Takes a slot on the best agent step `step` allows, by the step's strategy (see
    /// [`Strategy`]); `prefix`, the prompt's chain, for `prefix-aware`.
    fn take_best(
        &mut self,
        step: u8,
        excluded: &[AgentId],
        prefix: Option<&[u64]>,
    ) -> Option<Grant> {
        let strategy = self.steps.strategy(usize::from(step));
        let index = match prefix {
            Some(chain) if strategy == Strategy::PrefixAware && !chain.is_empty() => {
                self.best_by_prefix(step, excluded, chain)?
            }
            _ => self.best(step, excluded, strategy)?,
        };
        self.next_tie_break = index + 1;
        let chosen = &mut self.agents[index];
        chosen.own_in_flight += 1;
        Some(Grant {
            agent: chosen.agent,
            generation: chosen.generation,
            step,
        })
    }

    /// The best agent with room that step `step` allows, by `strategy`. Among equals the
    /// rotation decides, so ties spread evenly; `round-robin` is the rotation alone.
    fn best(&self, step: u8, excluded: &[AgentId], strategy: Strategy) -> Option<usize> {
        let count = self.agents.len();
        let start = self.next_tie_break % count.max(1);
        let mut best: Option<(usize, Rank)> = None;
        for offset in 0..count {
            let index = (start + offset) % count;
            let candidate = &self.agents[index];
            if !candidate.has_room() || !self.eligible(candidate, step, excluded) {
                continue;
            }
            let rank = Rank {
                signal: self.ranking_signal(candidate, strategy),
                load: u64::from(candidate.load()),
                capacity: u64::from(candidate.capacity),
            };
            let better = match &best {
                None => true,
                Some(_) if strategy == Strategy::RoundRobin => false,
                Some((_, best_rank)) => rank.is_better_than(best_rank),
            };
            if better {
                best = Some((index, rank));
            }
        }
        best.map(|(index, _)| index)
    }

    /// `prefix-aware`: the agent with room holding the longest leading run of `chain` (the
    /// least loaded of those holding as much), when the run covers the cache threshold of the
    /// prompt and the step's agents' loads are balanced; the least-loaded agent otherwise. The
    /// chain is recorded on the agent chosen, whichever it is: its engine caches the prompt.
    fn best_by_prefix(&mut self, step: u8, excluded: &[AgentId], chain: &[u64]) -> Option<usize> {
        let least_loaded = self.best(step, excluded, Strategy::LeastLoaded)?;
        let settings = self.prefix_settings;
        let (least, most) = self
            .agents
            .iter()
            .filter(|load| self.eligible(load, step, excluded))
            .fold((u32::MAX, 0), |(least, most), load| {
                (least.min(load.load()), most.max(load.load()))
            });
        let index = self
            .prefix
            .get_or_insert_with(|| prefix::PrefixIndex::new(settings.blocks_per_agent));
        let mut matches = std::mem::take(&mut self.matches);
        index.matches(chain, &mut matches);
        let held_by = |agent: AgentId| {
            matches
                .iter()
                .find(|(held, _)| *held == agent)
                .map_or(0, |(_, depth)| *depth)
        };
        let mut chosen = (least_loaded, held_by(self.agents[least_loaded].agent));
        if !settings.unbalanced(least, most) {
            // Longest first: the first agent with room at each depth, the least loaded of those
            // at the deepest.
            let mut deepest: Option<(usize, usize)> = None;
            for &(agent, depth) in &matches {
                if deepest.is_some_and(|(_, found)| depth < found) {
                    break;
                }
                let Some(index) = self.find(agent) else {
                    continue;
                };
                let load = &self.agents[index];
                if !load.has_room() || !self.eligible(load, step, excluded) {
                    continue;
                }
                let less_loaded = deepest.is_none_or(|(best, _)| {
                    let best = &self.agents[best];
                    u64::from(load.load()) * u64::from(best.capacity)
                        < u64::from(best.load()) * u64::from(load.capacity)
                });
                if less_loaded {
                    deepest = Some((index, depth));
                }
            }
            if let Some((index, depth)) = deepest
                && settings.follows(depth, chain.len())
            {
                chosen = (index, depth);
            }
        }
        self.matches = matches;
        let (index, matched) = chosen;
        self.prefix_stats.observe(matched, chain.len());
        if let Some(prefixes) = &mut self.prefix {
            prefixes.record(self.agents[index].agent, chain);
        }
        Some(index)
    }

    /// Grants every waiter, in order, that an agent with room may serve.
    fn drain_queue(&mut self) -> Vec<(Ticket, Grant)> {
        let mut grants = Vec::new();
        let mut index = 0;
        while index < self.queue.len() && self.agents.iter().any(AgentLoad::has_room) {
            let step = self.queue[index].step;
            // Moved out for the call (the queue and the agents are both `self`), then put back.
            let excluded = std::mem::take(&mut self.queue[index].excluded);
            let prefix = self.queue[index].prefix.take();
            match self.take_best(
                step,
                &excluded,
                prefix.as_deref().map(prefix::chain::Chain::blocks),
            ) {
                Some(grant) => {
                    let waiter = self.queue.remove(index).expect("index checked");
                    grants.push((waiter.ticket, grant));
                }
                None => {
                    self.queue[index].excluded = excluded;
                    self.queue[index].prefix = prefix;
                    index += 1;
                }
            }
        }
        grants
    }
}

#[cfg(test)]
mod tests;
