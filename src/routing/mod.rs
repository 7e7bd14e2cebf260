//! Per-model routing state, owned by the model's owner shard: the model's agents, this router's
//! in-flight count on each, and the model's capacity queue.
//!
//! Pure logic: no clock, no I/O, no runtime. The owner shard calls it directly for local requests
//! and on behalf of other shards' mesh messages; every decision is returned as data.
//!
//! Invariants:
//! - an agent's `own_in_flight` never exceeds its declared capacity, and equals the grants handed out
//!   for it minus the releases received;
//! - a queued ticket is either granted exactly once, cancelled, or failed (agents gone) — never two;
//! - the queue never grows beyond `queue_depth`.
//!
//! Load: the issue asks for the larger of the agent's reported in-flight count and this router's own.
//! The reported count is up to one signal interval old, so after a release here the raw report would
//! keep the slot looking busy until the next signal. We therefore refresh it with our own changes
//! since the report: `others = reported - own at report time` (other routers' share, clamped at 0) and
//! `load = max(reported_refreshed, own) = own + others`. With one router this is exactly `own`.

use std::collections::VecDeque;

/// Dense agent index assigned by the control core; stable for the life of an agent session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId(pub u32);

/// A request waiting for, or holding, a grant: the requesting shard and its per-shard sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub shard: u16,
    pub sequence: u64,
}

/// An agent's engine signals from its last routing signal; `None` where the engine reports none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineSignals {
    /// KV-cache use, 0.0 to 1.0.
    pub kv_cache_utilization: Option<f64>,
    pub running_requests: Option<f64>,
    pub waiting_requests: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// A slot on this agent is now held for the ticket; release it exactly once.
    Granted(AgentId),
    /// Every agent is full; the ticket waits in the capacity queue.
    Queued,
    /// Every agent is full and the queue is at `queue_depth` (or queueing is off).
    QueueFull,
    /// The model has no agent at all.
    NoAgents,
}

/// What a queued ticket finally gets, delivered to its shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Granted(AgentId),
    NoAgents,
}

#[derive(Debug, Clone)]
struct AgentLoad {
    agent: AgentId,
    capacity: u32,
    own_in_flight: u32,
    /// Other routers' requests on this agent: its last report minus our own count at that moment.
    others_in_flight: u32,
    engine: EngineSignals,
}

impl AgentLoad {
    fn load(&self) -> u32 {
        self.own_in_flight + self.others_in_flight
    }

    fn has_room(&self) -> bool {
        self.own_in_flight < self.capacity && self.load() < self.capacity
    }
}

#[derive(Debug)]
pub struct ModelRoutes {
    agents: Vec<AgentLoad>,
    queue: VecDeque<Ticket>,
    queue_depth: usize,
    /// Rotates the starting point among equally loaded agents so ties spread evenly.
    next_tie_break: usize,
}

impl ModelRoutes {
    pub fn new(queue_depth: usize) -> ModelRoutes {
        ModelRoutes {
            agents: Vec::new(),
            queue: VecDeque::new(),
            queue_depth,
            next_tie_break: 0,
        }
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

    /// Adds the agent, or updates its capacity when it registers again. Newly free capacity is
    /// handed to waiting tickets, returned as grants to deliver.
    pub fn agent_up(&mut self, agent: AgentId, capacity: u32) -> Vec<(Ticket, AgentId)> {
        match self.find(agent) {
            Some(index) => self.agents[index].capacity = capacity,
            None => self.agents.push(AgentLoad {
                agent,
                capacity,
                own_in_flight: 0,
                others_in_flight: 0,
                engine: EngineSignals::default(),
            }),
        }
        self.drain_queue()
    }

    /// Removes the agent. Its outstanding slots vanish with it (their releases are ignored). When
    /// no agent remains, every waiter is failed and returned.
    pub fn agent_down(&mut self, agent: AgentId) -> Vec<Ticket> {
        if let Some(index) = self.find(agent) {
            self.agents.swap_remove(index);
        }
        if self.agents.is_empty() {
            self.queue.drain(..).collect()
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
    ) -> Vec<(Ticket, AgentId)> {
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
        fn average(values: impl Iterator<Item = f64>) -> Option<f64> {
            let (sum, count) =
                values.fold((0.0, 0u32), |(sum, count), value| (sum + value, count + 1));
            (count > 0).then(|| sum / f64::from(count))
        }
        EngineSignals {
            kv_cache_utilization: average(
                self.agents
                    .iter()
                    .filter_map(|load| load.engine.kv_cache_utilization),
            ),
            running_requests: average(
                self.agents
                    .iter()
                    .filter_map(|load| load.engine.running_requests),
            ),
            waiting_requests: average(
                self.agents
                    .iter()
                    .filter_map(|load| load.engine.waiting_requests),
            ),
        }
    }

    /// Least-loaded agent with room, else the queue.
    pub fn acquire(&mut self, ticket: Ticket) -> Acquire {
        if self.agents.is_empty() {
            return Acquire::NoAgents;
        }
        // Waiters are served first: a new request never overtakes the queue.
        if self.queue.is_empty()
            && let Some(agent) = self.take_least_loaded()
        {
            return Acquire::Granted(agent);
        }
        if self.queue.len() >= self.queue_depth {
            return Acquire::QueueFull;
        }
        self.queue.push_back(ticket);
        Acquire::Queued
    }

    /// Returns a slot. The freed capacity goes to the head of the queue first.
    pub fn release(&mut self, agent: AgentId) -> Vec<(Ticket, AgentId)> {
        if let Some(index) = self.find(agent) {
            let load = &mut self.agents[index];
            assert!(
                load.own_in_flight > 0,
                "release without a grant on {agent:?}"
            );
            load.own_in_flight -= 1;
        }
        self.drain_queue()
    }

    /// Removes a waiting ticket (its request timed out or its client left). False when the ticket
    /// is no longer queued: it was granted already, and its grant must then be released.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        match self.queue.iter().position(|queued| *queued == ticket) {
            Some(index) => {
                self.queue.remove(index);
                true
            }
            None => false,
        }
    }

    // ----- internals -----

    fn find(&self, agent: AgentId) -> Option<usize> {
        self.agents.iter().position(|load| load.agent == agent)
    }

    fn take_least_loaded(&mut self) -> Option<AgentId> {
        let count = self.agents.len();
        let start = self.next_tie_break % count.max(1);
        let mut best: Option<(usize, u32)> = None;
        for offset in 0..count {
            let index = (start + offset) % count;
            let candidate = &self.agents[index];
            if !candidate.has_room() {
                continue;
            }
            let load = candidate.load();
            if best.is_none_or(|(_, best_load)| load < best_load) {
                best = Some((index, load));
            }
        }
        let (index, _) = best?;
        self.next_tie_break = index + 1;
        let chosen = &mut self.agents[index];
        chosen.own_in_flight += 1;
        Some(chosen.agent)
    }

    fn drain_queue(&mut self) -> Vec<(Ticket, AgentId)> {
        let mut grants = Vec::new();
        while !self.queue.is_empty() {
            let Some(agent) = self.take_least_loaded() else {
                break;
            };
            let ticket = self.queue.pop_front().expect("queue checked non-empty");
            grants.push((ticket, agent));
        }
        grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ticket(sequence: u64) -> Ticket {
        Ticket { shard: 0, sequence }
    }

    #[test]
    fn no_agents_refuses() {
        let mut routes = ModelRoutes::new(4);
        assert_eq!(routes.acquire(ticket(1)), Acquire::NoAgents);
    }

    #[test]
    fn spreads_ties_and_respects_capacity() {
        let mut routes = ModelRoutes::new(1);
        routes.agent_up(AgentId(1), 2);
        routes.agent_up(AgentId(2), 2);
        let mut granted = Vec::new();
        for sequence in 0..4 {
            match routes.acquire(ticket(sequence)) {
                Acquire::Granted(agent) => granted.push(agent),
                other => panic!("unexpected {other:?}"),
            }
        }
        granted.sort();
        assert_eq!(
            granted,
            vec![AgentId(1), AgentId(1), AgentId(2), AgentId(2)]
        );
        assert_eq!(routes.acquire(ticket(5)), Acquire::Queued);
        assert_eq!(routes.acquire(ticket(6)), Acquire::QueueFull);
        assert_eq!(routes.release(AgentId(2)), vec![(ticket(5), AgentId(2))]);
    }

    #[test]
    fn zero_queue_depth_never_queues() {
        let mut routes = ModelRoutes::new(0);
        routes.agent_up(AgentId(1), 1);
        assert_eq!(routes.acquire(ticket(1)), Acquire::Granted(AgentId(1)));
        assert_eq!(routes.acquire(ticket(2)), Acquire::QueueFull);
    }

    #[test]
    fn reported_load_from_other_routers_counts() {
        let mut routes = ModelRoutes::new(0);
        routes.agent_up(AgentId(1), 4);
        routes.agent_up(AgentId(2), 4);
        // Agent 1 reports 3 requests from other routers; we hold none there.
        routes.signal(AgentId(1), 3, EngineSignals::default());
        assert_eq!(routes.acquire(ticket(1)), Acquire::Granted(AgentId(2)));
        assert_eq!(routes.acquire(ticket(2)), Acquire::Granted(AgentId(2)));
        assert_eq!(routes.acquire(ticket(3)), Acquire::Granted(AgentId(2)));
        assert_eq!(routes.acquire(ticket(4)), Acquire::Granted(AgentId(1)));
        // Agent 1 is now at 3 others + 1 own = capacity.
        assert_eq!(routes.acquire(ticket(5)), Acquire::Granted(AgentId(2)));
        assert_eq!(routes.acquire(ticket(6)), Acquire::QueueFull);
    }

    #[test]
    fn own_release_frees_a_slot_before_the_next_report() {
        let mut routes = ModelRoutes::new(1);
        routes.agent_up(AgentId(1), 1);
        assert_eq!(routes.acquire(ticket(1)), Acquire::Granted(AgentId(1)));
        routes.signal(AgentId(1), 1, EngineSignals::default()); // the report includes our own request
        assert_eq!(routes.acquire(ticket(2)), Acquire::Queued);
        assert_eq!(routes.release(AgentId(1)), vec![(ticket(2), AgentId(1))]);
    }

    #[test]
    fn cancel_and_agent_loss() {
        let mut routes = ModelRoutes::new(2);
        routes.agent_up(AgentId(1), 1);
        assert_eq!(routes.acquire(ticket(1)), Acquire::Granted(AgentId(1)));
        assert_eq!(routes.acquire(ticket(2)), Acquire::Queued);
        assert_eq!(routes.acquire(ticket(3)), Acquire::Queued);
        assert!(routes.cancel(ticket(2)));
        assert!(!routes.cancel(ticket(2)));
        assert_eq!(routes.agent_down(AgentId(1)), vec![ticket(3)]);
        // A release for the vanished agent is ignored.
        assert!(routes.release(AgentId(1)).is_empty());
        assert!(routes.is_idle());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Acquire,
        Release(usize),
        Cancel(usize),
        Signal(u8, u32),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Acquire),
            (0usize..64).prop_map(Step::Release),
            (0usize..64).prop_map(Step::Cancel),
            (0u8..3, 0u32..6).prop_map(|(agent, count)| Step::Signal(agent, count)),
        ]
    }

    proptest! {
        /// Any interleaving of acquire, release, cancel and signals hands out each ticket at most
        /// once, never exceeds capacity, and returns to idle once everything held is released.
        #[test]
        fn accounting_returns_to_zero(steps in proptest::collection::vec(step(), 1..200)) {
            let mut routes = ModelRoutes::new(3);
            for agent in 0..3 {
                routes.agent_up(AgentId(agent), 2);
            }
            let mut held: Vec<AgentId> = Vec::new();
            let mut queued: Vec<Ticket> = Vec::new();
            let mut sequence = 0;
            let take = |grants: Vec<(Ticket, AgentId)>, held: &mut Vec<AgentId>, queued: &mut Vec<Ticket>| {
                for (ticket, agent) in grants {
                    let index = queued.iter().position(|queued| *queued == ticket).expect("granted ticket was queued");
                    queued.remove(index);
                    held.push(agent);
                }
            };
            for step in steps {
                match step {
                    Step::Acquire => {
                        sequence += 1;
                        match routes.acquire(ticket(sequence)) {
                            Acquire::Granted(agent) => held.push(agent),
                            Acquire::Queued => queued.push(ticket(sequence)),
                            Acquire::QueueFull | Acquire::NoAgents => {}
                        }
                    }
                    Step::Release(index) if !held.is_empty() => {
                        let agent = held.swap_remove(index % held.len());
                        let grants = routes.release(agent);
                        take(grants, &mut held, &mut queued);
                    }
                    Step::Cancel(index) if !queued.is_empty() => {
                        let ticket = queued.remove(index % queued.len());
                        prop_assert!(routes.cancel(ticket));
                    }
                    Step::Signal(agent, count) => {
                        let grants = routes.signal(AgentId(agent as u32), count, EngineSignals::default());
                        take(grants, &mut held, &mut queued);
                    }
                    _ => {}
                }
                for agent in 0..3 {
                    prop_assert!(routes.own_in_flight(AgentId(agent)).unwrap() <= 2);
                }
                prop_assert_eq!(routes.total_own_in_flight() as usize, held.len());
                prop_assert_eq!(routes.queue_len(), queued.len());
            }
            for ticket in queued.drain(..) {
                prop_assert!(routes.cancel(ticket));
            }
            while let Some(agent) = held.pop() {
                prop_assert!(routes.release(agent).is_empty());
            }
            prop_assert!(routes.is_idle());
        }
    }
}
