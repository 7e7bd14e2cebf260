use super::*;
use proptest::prelude::*;
use proptest::strategy::Strategy;

fn ticket(sequence: u64) -> Ticket {
    Ticket { shard: 0, sequence }
}

/// A first-step slot on `agent` in its current generation.
fn grant_on(routes: &ModelRoutes, agent: u32) -> Grant {
    Grant {
        agent: AgentId(agent),
        generation: routes.generation(AgentId(agent)).expect("agent is up"),
        step: 0,
    }
}

fn assert_granted(routes: &mut ModelRoutes, sequence: u64, agent: u32) {
    let expected = grant_on(routes, agent);
    assert_eq!(routes.acquire(ticket(sequence)), Acquire::Granted(expected));
}

fn up(routes: &mut ModelRoutes, agent: u32, capacity: u32) -> Vec<(Ticket, Grant)> {
    up_in(routes, agent, 0, capacity)
}

fn up_in(
    routes: &mut ModelRoutes,
    agent: u32,
    generation: u32,
    capacity: u32,
) -> Vec<(Ticket, Grant)> {
    routes.agent_up(
        AgentId(agent),
        Generation(generation),
        capacity,
        Arc::new(AgentProfile::default()),
    )
}

#[test]
fn no_agents_refuses() {
    let mut routes = ModelRoutes::new(4);
    assert_eq!(routes.acquire(ticket(1)), Acquire::NoAgents);
}

#[test]
fn spreads_ties_and_respects_capacity() {
    let mut routes = ModelRoutes::new(1);
    up(&mut routes, 1, 2);
    up(&mut routes, 2, 2);
    let mut granted = Vec::new();
    for sequence in 0..4 {
        match routes.acquire(ticket(sequence)) {
            Acquire::Granted(grant) => granted.push(grant.agent),
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
    let two = grant_on(&routes, 2);
    assert_eq!(routes.release(two), vec![(ticket(5), two)]);
}

#[test]
fn least_loaded_ranks_by_load_over_capacity() {
    let mut routes = ModelRoutes::new(0);
    up(&mut routes, 1, 8);
    up(&mut routes, 2, 2);
    // Both idle: agent 1 (first in rotation). Then agent 2 (0/2 < 1/8), then agent 1 while
    // its ratio stays under agent 2's 1/2: 1/8, 2/8, 3/8.
    assert_granted(&mut routes, 1, 1);
    assert_granted(&mut routes, 2, 2);
    assert_granted(&mut routes, 3, 1);
    assert_granted(&mut routes, 4, 1);
    assert_granted(&mut routes, 5, 1);
    // 4/8 against 1/2: a tie, rotation picks agent 2.
    assert_granted(&mut routes, 6, 2);
}

/// One step that allows every agent and ranks them by `0`.
struct Ranked(super::Strategy);

impl StepFilter for Ranked {
    fn step_count(&self) -> usize {
        1
    }

    fn allows(&self, _step: usize, _candidate: &Candidate<'_>) -> bool {
        true
    }

    fn strategy(&self, _step: usize) -> super::Strategy {
        self.0
    }
}

/// Three agents of capacity 4 ranked by `strategy`, agent 1 reporting `first`, agent 2
/// `second` and agent 3 nothing, through `signals` (a value in the engine's signals).
fn ranked(
    strategy: super::Strategy,
    signals: impl Fn(Option<f64>) -> EngineSignals,
    first: f64,
    second: f64,
) -> ModelRoutes {
    let mut routes = ModelRoutes::new(0);
    let _ = routes.set_steps(Arc::new(Ranked(strategy)));
    for agent in 1..=3 {
        up(&mut routes, agent, 4);
    }
    routes.signal(AgentId(1), 0, signals(Some(first)));
    routes.signal(AgentId(2), 0, signals(Some(second)));
    routes.signal(AgentId(3), 0, signals(None));
    routes
}

/// Each engine-signal strategy: the lowest signal first while it has room, then the next,
/// and an agent that reports none last, least-loaded among those that lack it.
#[test]
fn engine_signal_strategies_rank_the_lowest_first_and_the_agents_without_it_last() {
    type Signal = fn(Option<f64>) -> EngineSignals;
    let cases: [(super::Strategy, Signal); 4] = [
        (super::Strategy::LowestKvCache, |value| EngineSignals {
            kv_cache_utilization: value,
            ..EngineSignals::default()
        }),
        (super::Strategy::LowestQueue, |value| EngineSignals {
            waiting_requests: value,
            ..EngineSignals::default()
        }),
        (super::Strategy::BestTtft, |value| EngineSignals {
            avg_ttft_seconds: value,
            ..EngineSignals::default()
        }),
        (super::Strategy::BestItl, |value| EngineSignals {
            avg_itl_seconds: value,
            ..EngineSignals::default()
        }),
    ];
    for (strategy, signals) in cases {
        // Agent 2 reports less than agent 1: its four slots first, whatever its load.
        let mut routes = ranked(strategy, signals, 0.5, 0.25);
        for sequence in 0..4 {
            assert_granted(&mut routes, sequence, 2);
        }
        for sequence in 4..8 {
            assert_granted(&mut routes, sequence, 1);
        }
        for sequence in 8..12 {
            assert_granted(&mut routes, sequence, 3);
        }
        assert_eq!(
            routes.acquire(ticket(12)),
            Acquire::QueueFull,
            "{strategy:?}"
        );
    }
}

/// Equal signals rank least-loaded; a signal that is not a number is taken as lacking.
#[test]
fn equal_signals_rank_least_loaded_and_a_value_not_finite_is_lacking() {
    let kv = |value| EngineSignals {
        kv_cache_utilization: value,
        ..EngineSignals::default()
    };
    let mut routes = ranked(super::Strategy::LowestKvCache, kv, 0.5, 0.5);
    assert_granted(&mut routes, 0, 1);
    assert_granted(&mut routes, 1, 2);
    assert_granted(&mut routes, 2, 1);
    let mut routes = ranked(super::Strategy::LowestKvCache, kv, f64::NAN, 0.9);
    assert_granted(&mut routes, 0, 2);
    // Agents 1 and 3 both lack it: least-loaded between them, in rotation.
    assert_granted(&mut routes, 1, 2);
    assert_granted(&mut routes, 2, 2);
    assert_granted(&mut routes, 3, 2);
    assert_granted(&mut routes, 4, 3);
    assert_granted(&mut routes, 5, 1);
}

/// `round-robin`: each agent with room in turn, whatever the load reports say.
#[test]
fn round_robin_takes_each_agent_in_turn() {
    let mut routes = ModelRoutes::new(0);
    let _ = routes.set_steps(Arc::new(Ranked(super::Strategy::RoundRobin)));
    up(&mut routes, 1, 8);
    up(&mut routes, 2, 8);
    up(&mut routes, 3, 2);
    routes.signal(AgentId(2), 6, EngineSignals::default());
    let order: Vec<u32> = (0..9)
        .map(|sequence| match routes.acquire(ticket(sequence)) {
            Acquire::Granted(grant) => grant.agent.0,
            other => panic!("{other:?}"),
        })
        .collect();
    // Agent 2 holds 6 of other routers': room for 2 of ours; agent 3 for 2.
    assert_eq!(order, [1, 2, 3, 1, 2, 3, 1, 1, 1]);
}

/// A `prefix-aware` ask for the prompt whose blocks are `blocks` (each a small number standing
/// for a block's bytes).
fn prompt(blocks: &[u8]) -> Ask {
    let mut chain = prefix::chain::Chain::new();
    let bytes: Vec<Vec<u8>> = blocks
        .iter()
        .map(|&block| vec![block; prefix::chain::BLOCK_BYTES])
        .collect();
    let parts: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    prefix::chain::chain_of(&parts, &mut chain);
    Ask {
        prefix: Some(Arc::new(chain)),
        ..Ask::default()
    }
}

fn prefix_routes(settings: prefix::PrefixSettings, agents: u32, capacity: u32) -> ModelRoutes {
    let mut routes = ModelRoutes::new(4).with_prefix_settings(settings);
    let _ = routes.set_steps(Arc::new(Ranked(super::Strategy::PrefixAware)));
    for agent in 1..=agents {
        up(&mut routes, agent, capacity);
    }
    routes
}

fn granted_agent(routes: &mut ModelRoutes, sequence: u64, ask: &Ask) -> u32 {
    match routes.acquire_from(ticket(sequence), ask) {
        Acquire::Granted(grant) => grant.agent.0,
        other => panic!("{other:?}"),
    }
}

/// `prefix-aware`: a prompt goes where its leading blocks went before, whatever the load while
/// it is balanced; a prompt sharing too little of a known one, or none, goes least-loaded.
#[test]
fn prefix_aware_sends_a_prompt_where_its_prefix_went() {
    let mut routes = prefix_routes(prefix::PrefixSettings::default(), 3, 16);
    // Three conversations, least-loaded: one on each agent.
    let first: Vec<u32> = (0..3u8)
        .map(|chat| granted_agent(&mut routes, u64::from(chat), &prompt(&[chat, 1, 2])))
        .collect();
    let mut agents = first.clone();
    agents.sort();
    assert_eq!(agents, [1, 2, 3]);
    // Each conversation's next turns follow it.
    for turn in 1..4u64 {
        for chat in 0..3u8 {
            let next = prompt(&[chat, 1, 2, 3, 4]);
            let sequence = 10 * turn + u64::from(chat);
            assert_eq!(
                granted_agent(&mut routes, sequence, &next),
                first[usize::from(chat)]
            );
        }
    }
    let stats = routes.prefix_stats();
    assert_eq!((stats.hits, stats.misses), (9, 3));
    assert_eq!(stats.ratio_counts[0], 3, "the first turns matched nothing");
    assert_eq!(stats.blocks, 15, "5 blocks on each agent");
    // Every agent carries 4; one less on another agent than chat 0's.
    let lighter = first[1];
    assert!(routes.release(grant_on(&routes, lighter)).is_empty());
    // 1 block of 5 shared with chat 0 (below the 0.3 threshold): least-loaded.
    assert_eq!(
        granted_agent(&mut routes, 100, &prompt(&[0, 9, 9, 9, 9])),
        lighter
    );
    assert!(routes.release(grant_on(&routes, lighter)).is_empty());
    // 2 of 5 (0.4): chat 0's agent, though busier.
    assert_eq!(
        granted_agent(&mut routes, 101, &prompt(&[0, 1, 8, 8, 8])),
        first[0]
    );
    // No chain (a prompt shorter than a block): least-loaded.
    assert_eq!(granted_agent(&mut routes, 102, &Ask::default()), lighter);
}

/// Load unbalanced past both thresholds sends a prompt least-loaded whatever it matches, and
/// both agents then hold it; an agent that leaves takes its blocks with it.
#[test]
fn prefix_aware_yields_to_unbalanced_load() {
    let settings = prefix::PrefixSettings {
        balance_abs_threshold: 2,
        balance_rel_threshold: 1.5,
        ..prefix::PrefixSettings::default()
    };
    let mut routes = prefix_routes(settings, 2, 8);
    let chat = prompt(&[7, 7, 7, 7]);
    let home = granted_agent(&mut routes, 0, &chat);
    let other = 3 - home;
    // Loads 1-0, then 2-0: within 2 of each other, the chat stays home.
    assert_eq!(granted_agent(&mut routes, 1, &chat), home);
    assert_eq!(granted_agent(&mut routes, 2, &chat), home);
    // 3-0: more than 2 apart and more than 1.5 times: least-loaded.
    assert_eq!(granted_agent(&mut routes, 3, &chat), other);
    // 3-1: balanced again; both hold the whole chat now, the less loaded wins.
    assert_eq!(granted_agent(&mut routes, 4, &chat), other);
    assert!(routes.agent_down(AgentId(other)).is_empty());
    up(&mut routes, other, 8);
    let mut matches = Vec::new();
    let index = routes.prefix.as_ref().expect("built");
    index.matches(chat.prefix.as_deref().unwrap().blocks(), &mut matches);
    assert_eq!(matches, [(AgentId(home), 4)]);
    assert_eq!(routes.prefix_stats().blocks, 4);
}

/// An agent with no room is never chosen for its match: the prompt goes to one with room.
#[test]
fn prefix_aware_never_passes_capacity() {
    let mut routes = prefix_routes(prefix::PrefixSettings::default(), 2, 2);
    let chat = prompt(&[4, 4, 4]);
    let home = granted_agent(&mut routes, 0, &chat);
    assert_eq!(granted_agent(&mut routes, 1, &chat), home);
    assert_eq!(granted_agent(&mut routes, 2, &chat), 3 - home);
}

/// A waiter keeps its prompt: granted from the queue, it is ranked by its prefix (counted a
/// hit), not least-loaded.
#[test]
fn a_queued_prompt_keeps_its_prefix() {
    let mut routes = prefix_routes(prefix::PrefixSettings::default(), 2, 1);
    let chat = prompt(&[3, 3, 3]);
    let home = granted_agent(&mut routes, 0, &chat);
    assert!(routes.release(grant_on(&routes, home)).is_empty());
    // Both agents full of other routers' requests: the chat waits.
    routes.signal(AgentId(1), 1, EngineSignals::default());
    routes.signal(AgentId(2), 1, EngineSignals::default());
    assert_eq!(routes.acquire_from(ticket(1), &chat), Acquire::Queued);
    let granted = routes.signal(AgentId(home), 0, EngineSignals::default());
    assert_eq!(granted, vec![(ticket(1), grant_on(&routes, home))]);
    let stats = routes.prefix_stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    assert_eq!(
        stats.ratio_counts[prefix::MATCHED_RATIO_BUCKETS.len() - 1],
        1,
        "a whole match"
    );
}

/// `lowest-srtt`: the agent this router measured fastest for the model first; an agent not
/// measured yet after every measured one.
#[test]
fn lowest_srtt_ranks_the_agent_measured_fastest_for_the_model_first() {
    use crate::logic::routing::counters::{AgentCounters, CountersByModel};
    let model = ModelId(7);
    let mut routes = ModelRoutes::for_model(model, 0);
    let _ = routes.set_steps(Arc::new(Ranked(super::Strategy::LowestSrtt)));
    for (agent, latency_ms) in [(1, Some(300.0)), (2, Some(120.0)), (3, None)] {
        let counters = Arc::new(AgentCounters::new(1));
        if let Some(latency_ms) = latency_ms {
            counters.latency_sample(latency_ms);
        }
        let profile = AgentProfile {
            counters: CountersByModel(Box::new([(model, counters)])),
            ..AgentProfile::default()
        };
        routes.agent_up(AgentId(agent), Generation(0), 2, Arc::new(profile));
    }
    let order: Vec<u32> = (0..6)
        .map(|sequence| match routes.acquire(ticket(sequence)) {
            Acquire::Granted(grant) => grant.agent.0,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(order, [2, 2, 1, 1, 3, 3]);
}

#[test]
fn zero_queue_depth_never_queues() {
    let mut routes = ModelRoutes::new(0);
    up(&mut routes, 1, 1);
    assert_granted(&mut routes, 1, 1);
    assert_eq!(routes.acquire(ticket(2)), Acquire::QueueFull);
}

#[test]
fn reported_load_from_other_routers_counts() {
    let mut routes = ModelRoutes::new(0);
    up(&mut routes, 1, 4);
    up(&mut routes, 2, 4);
    // Agent 1 reports 3 requests from other routers; we hold none there.
    routes.signal(AgentId(1), 3, EngineSignals::default());
    assert_granted(&mut routes, 1, 2);
    assert_granted(&mut routes, 2, 2);
    assert_granted(&mut routes, 3, 2);
    assert_granted(&mut routes, 4, 1);
    // Agent 1 is now at 3 others + 1 own = capacity.
    assert_granted(&mut routes, 5, 2);
    assert_eq!(routes.acquire(ticket(6)), Acquire::QueueFull);
}

/// Seed, run-several-routers: "Every router ranks agents by the larger of that report and
/// its own in-flight requests".
#[test]
fn ranks_by_the_larger_of_reported_and_own_in_flight() {
    let mut routes = ModelRoutes::new(0);
    up(&mut routes, 1, 8);
    up(&mut routes, 2, 8);
    let load = |routes: &ModelRoutes, agent: u32| {
        routes.agents[routes.find(AgentId(agent)).unwrap()].load()
    };
    // Two of ours on agent 1; its report (from every router) says 5: load 5.
    assert_granted(&mut routes, 1, 1);
    assert_granted(&mut routes, 2, 2);
    assert_granted(&mut routes, 3, 1);
    routes.signal(AgentId(1), 5, EngineSignals::default());
    assert_eq!(load(&routes, 1), 5);
    // A report below our own count (stale, or sent before our requests arrived): our own
    // count wins.
    routes.signal(AgentId(2), 0, EngineSignals::default());
    assert_eq!(load(&routes, 2), 1);
    // Agent 2 (1 of 8) ranks before agent 1 (5 of 8, of which only 2 are ours): the report
    // decides.
    assert_granted(&mut routes, 4, 2);
    assert_granted(&mut routes, 5, 2);
    assert_granted(&mut routes, 6, 2);
    assert_eq!(load(&routes, 2), 4);
    // Our own requests since the report keep counting on top of the others' share.
    assert_granted(&mut routes, 7, 2);
    assert_eq!(load(&routes, 2), 5);
    assert_granted(&mut routes, 8, 1);
    assert_eq!(load(&routes, 1), 6, "max(5 reported + 1 since, 3 own)");
}

#[test]
fn own_release_frees_a_slot_before_the_next_report() {
    let mut routes = ModelRoutes::new(1);
    up(&mut routes, 1, 1);
    assert_granted(&mut routes, 1, 1);
    routes.signal(AgentId(1), 1, EngineSignals::default()); // the report includes our own request
    assert_eq!(routes.acquire(ticket(2)), Acquire::Queued);
    let one = grant_on(&routes, 1);
    assert_eq!(routes.release(one), vec![(ticket(2), one)]);
}

#[test]
fn cancel_and_agent_loss() {
    let mut routes = ModelRoutes::new(2);
    up(&mut routes, 1, 1);
    let held = grant_on(&routes, 1);
    assert_granted(&mut routes, 1, 1);
    assert_eq!(routes.acquire(ticket(2)), Acquire::Queued);
    assert_eq!(routes.acquire(ticket(3)), Acquire::Queued);
    assert!(routes.cancel(ticket(2)));
    assert!(!routes.cancel(ticket(2)));
    assert_eq!(routes.agent_down(AgentId(1)), vec![ticket(3)]);
    // A release for the vanished agent is ignored.
    assert!(routes.release(held).is_empty());
    assert!(routes.is_idle());
}

/// A tunnel lost and redialled a second later makes the agent leave and join again under the
/// same id; the slots granted before are released afterwards. They must not be charged to the
/// new stay (a release the stay has no grant for panics the shard: "release without a grant").
#[test]
fn releases_from_before_a_rejoin_are_not_charged_to_the_new_stay() {
    let mut routes = ModelRoutes::new(1);
    up(&mut routes, 1, 2);
    let before = grant_on(&routes, 1);
    assert_granted(&mut routes, 1, 1);
    assert_granted(&mut routes, 2, 1);
    assert!(routes.agent_down(AgentId(1)).is_empty());
    up_in(&mut routes, 1, 1, 2);
    let after = grant_on(&routes, 1);
    assert_ne!(before.generation, after.generation);
    assert_granted(&mut routes, 3, 1);
    assert!(routes.release(before).is_empty());
    assert!(routes.release(before).is_empty());
    assert_eq!(routes.own_in_flight(AgentId(1)), Some(1));
    assert!(routes.release(after).is_empty());
    assert!(routes.is_idle());
}

/// The model's state may be dropped while the agent is away and built anew when it returns:
/// the stay number comes from the control core, so an old slot still cannot match.
#[test]
fn a_new_stay_replaces_one_whose_leaving_was_not_seen() {
    let mut routes = ModelRoutes::new(0);
    up_in(&mut routes, 1, 3, 1);
    let before = grant_on(&routes, 1);
    assert_granted(&mut routes, 1, 1);
    up_in(&mut routes, 1, 4, 1);
    assert_eq!(routes.own_in_flight(AgentId(1)), Some(0));
    assert_granted(&mut routes, 2, 1);
    assert!(routes.release(before).is_empty());
    assert_eq!(routes.own_in_flight(AgentId(1)), Some(1));
}

#[derive(Debug, Clone)]
enum Step {
    Acquire,
    Release(usize),
    Cancel(usize),
    Signal(u8, u32),
    Rejoin(u8),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Acquire),
        (0usize..64).prop_map(Step::Release),
        (0usize..64).prop_map(Step::Cancel),
        (0u8..3, 0u32..6).prop_map(|(agent, count)| Step::Signal(agent, count)),
        (0u8..3).prop_map(Step::Rejoin),
    ]
}

proptest! {
    /// Any interleaving of acquire, release, cancel, signals and agents leaving and joining
    /// again hands out each ticket at most once, never exceeds capacity, and returns to idle
    /// once everything held is released (releases of slots from before a rejoin included).
    #[test]
    fn accounting_returns_to_zero(steps in proptest::collection::vec(step(), 1..200)) {
        let mut routes = ModelRoutes::new(3);
        for agent in 0..3 {
            up(&mut routes, agent, 2);
        }
        // Slots of the agents' current stays, and slots whose agent left since.
        let mut held: Vec<Grant> = Vec::new();
        let mut stale: Vec<Grant> = Vec::new();
        let mut generation = 0;
        let mut queued: Vec<Ticket> = Vec::new();
        let mut sequence = 0;
        let take = |grants: Vec<(Ticket, Grant)>, held: &mut Vec<Grant>, queued: &mut Vec<Ticket>| {
            for (ticket, grant) in grants {
                let index = queued.iter().position(|queued| *queued == ticket).expect("granted ticket was queued");
                queued.remove(index);
                held.push(grant);
            }
        };
        for step in steps {
            match step {
                Step::Acquire => {
                    sequence += 1;
                    match routes.acquire(ticket(sequence)) {
                        Acquire::Granted(grant) => held.push(grant),
                        Acquire::Queued => queued.push(ticket(sequence)),
                        Acquire::QueueFull | Acquire::NoAgents => {}
                    }
                }
                Step::Release(index) if !held.is_empty() => {
                    let grant = held.swap_remove(index % held.len());
                    let grants = routes.release(grant);
                    take(grants, &mut held, &mut queued);
                }
                Step::Release(index) if !stale.is_empty() => {
                    let grant = stale.swap_remove(index % stale.len());
                    let grants = routes.release(grant);
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
                Step::Rejoin(agent) => {
                    let agent = AgentId(u32::from(agent));
                    // Three agents, so the queue is never failed by agent_down here.
                    prop_assert!(routes.agent_down(agent).is_empty());
                    let (gone, kept): (Vec<Grant>, Vec<Grant>) =
                        held.drain(..).partition(|grant| grant.agent == agent);
                    held = kept;
                    stale.extend(gone);
                    generation += 1;
                    let grants = routes.agent_up(agent, Generation(generation), 2, Arc::new(AgentProfile::default()));
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
        while let Some(grant) = held.pop().or_else(|| stale.pop()) {
            prop_assert!(routes.release(grant).is_empty());
        }
        prop_assert!(routes.is_idle());
    }
}
