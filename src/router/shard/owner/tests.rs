//! The owner in virtual time: parking, expiry and retry, the capacity queue, hold at zero, and
//! the races between a grant and a requester that stopped waiting. No runtime, no clock: every
//! moment is a `Frozen` clock the test sets.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::base::clock::Frozen;
use crate::logic::admission::occupancy::{Claim, Footprint};
use crate::logic::policy::{ModelPolicy, PolicyContext};
use crate::logic::routing::AgentProfile;

mod wallets;

const MODEL: ModelId = ModelId(1);
const AGENT: AgentId = AgentId(7);

fn owner() -> Owner {
    Owner::new(
        OwnerSettings {
            shard: 0,
            shards: 1,
            queue_depth: 8,
            admit_fraction: 1.0,
            hold_limits: HoldLimits {
                per_model: 2,
                per_key: 2,
            },
            rpm_burst: BurstSeconds::FULL_MINUTE,
            prefix: Default::default(),
        },
        Arc::new(KeyRegistry::open()),
    )
}

fn policy(budget_tokens: u64) -> Arc<ModelPolicy> {
    Arc::new(ModelPolicy {
        admit_budget_tokens: budget_tokens,
        ..ModelPolicy::built_in(&PolicyContext::default())
    })
}

fn profile() -> Arc<AgentProfile> {
    Arc::new(AgentProfile {
        peer_id: "peer".into(),
        engine: "vllm".into(),
        region: "eu".into(),
        tags: Box::new([]),
        deployment_id: "".into(),
        organization: "".into(),
        machine: "".into(),
        counters: Default::default(),
    })
}

fn ticket(sequence: u64) -> Ticket {
    Ticket { shard: 0, sequence }
}

fn slot() -> Option<Ask> {
    Some(Ask {
        start_step: 0,
        excluded: Box::new([]),
        beyond_depth: false,
        prefix: None,
    })
}

/// A gated acquire of `tokens` that parks until `park_until`.
fn gated(
    sequence: u64,
    tokens: u64,
    budget: u64,
    park_until: Option<Millis>,
    with_slot: bool,
) -> Visit {
    gated_with_share(sequence, tokens, budget, park_until, with_slot, 0.0)
}

/// [`gated`] for a key with a B4 occupancy `share` of the model.
fn gated_with_share(
    sequence: u64,
    tokens: u64,
    budget: u64,
    park_until: Option<Millis>,
    with_slot: bool,
    share: f64,
) -> Visit {
    Visit::Acquire {
        model: MODEL,
        pool: Some(PoolRequest {
            claim: Claim {
                ticket: ticket(sequence),
                footprint: Footprint {
                    input_tokens: tokens,
                    declared_output_tokens: 0,
                },
                key: KeyId(1),
                share,
            },
            policy: policy(budget),
            park_until,
            refuse_oversize: false,
            bounce_park: false,
        }),
        slot: if with_slot { slot() } else { None },
    }
}

fn at(ms: u64) -> Frozen {
    Frozen::at(Millis(ms))
}

fn up(owner: &mut Owner, capacity: u32, generation: u32, effects: &mut Effects) {
    let join = AgentJoin {
        agent: AGENT,
        generation: Generation(generation),
        capacity,
        profile: profile(),
    };
    owner.agent_up(Millis(0), &join, &[MODEL], effects);
}

fn decision(answer: Option<Answer>) -> Option<Decision> {
    match answer {
        Some(Answer::Decided { decision, .. }) => Some(decision),
        None => None,
        Some(other) => panic!("not a decision: {other:?}"),
    }
}

fn decided(effects: &mut Effects) -> Vec<(u64, Decision)> {
    effects
        .answers
        .drain(..)
        .map(|(ticket, answer)| match answer {
            Answer::Decided { decision, .. } => (ticket.sequence, decision),
            other => panic!("not a decision: {other:?}"),
        })
        .collect()
}

fn occupancy_tokens(owner: &Owner) -> u64 {
    owner
        .models
        .pool_reports()
        .iter()
        .map(|report| report.occupancy_tokens)
        .sum()
}

/// Ticket 1 takes 80 of a 100-token budget, and its slot.
fn first_80_of_100(owner: &mut Owner, effects: &mut Effects) -> Grant {
    match decision(owner.serve(&at(0), ticket(1), gated(1, 80, 100, None, true), effects)) {
        Some(Decision::Granted(grant)) => grant,
        other => panic!("not granted: {other:?}"),
    }
}

/// `visit`, asking to be told where B2 would park it (a request whose tokens were charged ahead).
fn bounced(mut visit: Visit) -> Visit {
    if let Visit::Acquire {
        pool: Some(pool), ..
    } = &mut visit
    {
        pool.bounce_park = true;
    }
    visit
}

#[test]
fn a_release_grants_the_queued_ticket() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 1, 1, &mut effects);
    let first = Visit::Acquire {
        model: MODEL,
        pool: None,
        slot: slot(),
    };
    let Some(Decision::Granted(grant)) =
        decision(owner.serve(&at(0), ticket(1), first, &mut effects))
    else {
        panic!("the free agent was not granted");
    };
    let second = Visit::Acquire {
        model: MODEL,
        pool: None,
        slot: slot(),
    };
    assert_eq!(
        decision(owner.serve(&at(0), ticket(2), second, &mut effects)),
        None
    );
    assert_eq!(
        effects.queue,
        [QueueMove::Entered(MODEL, ticket(2))],
        "the queued ticket is timed from here"
    );
    owner.notice(
        &at(5),
        Notice::Release {
            model: MODEL,
            grant,
            ticket: ticket(1),
            observed: None,
        },
        &mut effects,
    );
    assert!(matches!(
        decided(&mut effects).as_slice(),
        [(2, Decision::Granted(_))]
    ));
    assert_eq!(
        effects.queue,
        [
            QueueMove::Entered(MODEL, ticket(2)),
            QueueMove::Left(MODEL, ticket(2))
        ],
        "granted from the queue: its wait ends"
    );
}

#[test]
fn a_parked_ticket_expires_at_its_deadline_and_not_before() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let first = gated(1, 80, 100, None, true);
    assert!(matches!(
        decision(owner.serve(&at(0), ticket(1), first, &mut effects)),
        Some(Decision::Granted(_))
    ));
    let parked = gated(2, 50, 100, Some(Millis(1_000)), true);
    assert_eq!(
        decision(owner.serve(&at(0), ticket(2), parked, &mut effects)),
        None
    );
    assert_eq!(effects.parked, 1);

    let next = owner.models.expire_parked(Millis(999), &mut effects);
    assert_eq!(next, Some(Millis(1_000)));
    assert!(effects.answers.is_empty());

    let next = owner.models.expire_parked(Millis(1_000), &mut effects);
    assert_eq!(next, None);
    assert_eq!(decided(&mut effects), vec![(2, Decision::PoolFull)]);
    assert!(
        owner
            .rejections()
            .any(|(model, reason, count)| model == MODEL && reason == Reason::B2 && count == 1)
    );
    assert_eq!(occupancy_tokens(&owner), 80);
}

/// A request that charged its tokens ahead of the gates asks to be told, not parked: it holds
/// nothing and counts no refusal; without a park timeout it is refused as any other, and once
/// there is room it is granted as any other.
#[test]
fn a_bounced_ticket_is_told_it_would_park_and_holds_nothing() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let grant = first_80_of_100(&mut owner, &mut effects);
    let bounced = |sequence, park_until| bounced(gated(sequence, 50, 100, park_until, true));
    assert_eq!(
        decision(owner.serve(
            &at(0),
            ticket(2),
            bounced(2, Some(Millis(1_000))),
            &mut effects
        )),
        Some(Decision::WouldPark)
    );
    assert_eq!(effects.parked, 0);
    assert_eq!(occupancy_tokens(&owner), 80);
    assert_eq!(owner.rejections().count(), 0, "no refusal counted");
    // With no park timeout, the same request is refused as it would be without the bounce.
    assert_eq!(
        decision(owner.serve(&at(0), ticket(3), bounced(3, None), &mut effects)),
        Some(Decision::PoolFull)
    );
    // A bounced request that fits is granted like any other.
    owner.notice(
        &at(10),
        Notice::Release {
            model: MODEL,
            grant,
            ticket: ticket(1),
            observed: None,
        },
        &mut effects,
    );
    assert!(matches!(
        decision(owner.serve(
            &at(10),
            ticket(4),
            bounced(4, Some(Millis(1_000))),
            &mut effects
        )),
        Some(Decision::Granted(_))
    ));
    assert_eq!(occupancy_tokens(&owner), 50);
    assert!(effects.answers.is_empty());
}

#[test]
fn a_release_admits_the_parked_ticket_and_grants_it() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let grant = first_80_of_100(&mut owner, &mut effects);
    let parked = gated(2, 50, 100, Some(Millis(1_000)), true);
    assert_eq!(
        decision(owner.serve(&at(0), ticket(2), parked, &mut effects)),
        None
    );
    owner.notice(
        &at(400),
        Notice::Release {
            model: MODEL,
            grant,
            ticket: ticket(1),
            observed: None,
        },
        &mut effects,
    );
    assert!(matches!(
        decided(&mut effects).as_slice(),
        [(2, Decision::Granted(_))]
    ));
    assert_eq!(occupancy_tokens(&owner), 50);
    assert_eq!(
        owner.models.expire_parked(Millis(2_000), &mut effects),
        None
    );
    assert!(effects.answers.is_empty());
}

#[test]
fn a_cancelled_parked_ticket_is_never_decided() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 4, 1, &mut effects);
    let grant = first_80_of_100(&mut owner, &mut effects);
    let parked = gated(2, 50, 100, Some(Millis(1_000)), true);
    assert_eq!(
        decision(owner.serve(&at(0), ticket(2), parked, &mut effects)),
        None
    );
    owner.notice(
        &at(10),
        Notice::Cancel {
            ticket: ticket(2),
            model: MODEL,
        },
        &mut effects,
    );
    owner.notice(
        &at(20),
        Notice::Release {
            model: MODEL,
            grant,
            ticket: ticket(1),
            observed: None,
        },
        &mut effects,
    );
    assert_eq!(
        owner.models.expire_parked(Millis(5_000), &mut effects),
        None
    );
    assert!(effects.answers.is_empty());
    assert_eq!(occupancy_tokens(&owner), 0);
}

/// The requester timed out while its grant was on the way: its cancel reaches the owner first,
/// then the grant finds no waiter and comes back as a release. Both the slot and the
/// reservation are given back once.
#[test]
fn a_grant_cancelled_in_flight_is_released_exactly_once() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 1, 1, &mut effects);
    let answer = owner.serve(
        &at(0),
        ticket(1),
        gated(1, 60, 100, None, true),
        &mut effects,
    );
    let answer = answer.expect("granted at once");
    owner.notice(
        &at(1),
        Notice::Cancel {
            ticket: ticket(1),
            model: MODEL,
        },
        &mut effects,
    );
    let unwanted = answer.unwanted(ticket(1)).expect("a grant gives back");
    owner.notice(&at(2), unwanted, &mut effects);
    // Twice more, as a duplicated message would: nothing more is given back.
    owner.notice(
        &at(3),
        Notice::ReleaseReservation {
            model: MODEL,
            ticket: ticket(1),
        },
        &mut effects,
    );
    assert_eq!(occupancy_tokens(&owner), 0);
    let again = owner.serve(
        &at(4),
        ticket(2),
        gated(2, 100, 100, None, true),
        &mut effects,
    );
    assert!(matches!(decision(again), Some(Decision::Granted(_))));
}

#[test]
fn a_held_request_wakes_when_an_agent_registers() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    let hold = |sequence| Visit::Hold {
        model: MODEL,
        key: Some(KeyId(sequence as u32)),
        client: None,
    };
    assert!(
        owner
            .serve(&at(0), ticket(1), hold(1), &mut effects)
            .is_none()
    );
    assert!(
        owner
            .serve(&at(0), ticket(2), hold(2), &mut effects)
            .is_none()
    );
    // `per_model: 2`: the third is refused at once.
    assert!(matches!(
        owner.serve(&at(0), ticket(3), hold(3), &mut effects),
        Some(Answer::Held(HoldAnswer::Full))
    ));
    assert_eq!(owner.models.pending_demand(), vec![(MODEL, 2)]);

    up(&mut owner, 1, 1, &mut effects);
    let woken: Vec<_> = effects
        .answers
        .drain(..)
        .map(|(ticket, answer)| (ticket.sequence, format!("{answer:?}")))
        .collect();
    assert_eq!(woken.len(), 2);
    assert!(woken.iter().all(|(_, answer)| answer == "Held(Awake)"));
    assert_eq!(effects.woke, vec![(MODEL, 2)]);
    // Released requests stay in the pending demand until they leave the book.
    assert_eq!(owner.models.pending_demand(), vec![(MODEL, 2)]);
    owner.notice(
        &at(1),
        Notice::HoldLeave {
            ticket: ticket(1),
            model: MODEL,
        },
        &mut effects,
    );
    assert_eq!(owner.models.pending_demand(), vec![(MODEL, 1)]);
    // An agent already there: a new hold goes on at once.
    assert!(matches!(
        owner.serve(&at(2), ticket(4), hold(4), &mut effects),
        Some(Answer::Held(HoldAnswer::Awake))
    ));
}

#[test]
fn the_last_agent_leaving_fails_its_queue() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 1, 1, &mut effects);
    let acquire = || Visit::Acquire {
        model: MODEL,
        pool: None,
        slot: slot(),
    };
    assert!(
        owner
            .serve(&at(0), ticket(1), acquire(), &mut effects)
            .is_some()
    );
    assert!(
        owner
            .serve(&at(0), ticket(2), acquire(), &mut effects)
            .is_none()
    );
    owner.agent_down(Millis(1), AGENT, &[MODEL], &mut effects);
    assert_eq!(decided(&mut effects), vec![(2, Decision::NoAgents)]);
}

/// Found by the interleaving proptest below: a gated ticket queued for capacity kept its
/// occupancy reservation when the last agent left and it was answered `NoAgents` (nothing on the
/// requester gives back a reservation it never saw), until the reaper's pass 30 minutes later.
#[test]
fn the_last_agent_leaving_gives_back_the_reservations_of_its_queue() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    up(&mut owner, 1, 1, &mut effects);
    let first = gated(1, 40, 100, None, true);
    assert!(
        owner
            .serve(&at(0), ticket(1), first, &mut effects)
            .is_some()
    );
    let queued = gated(2, 30, 100, None, true);
    assert!(
        owner
            .serve(&at(0), ticket(2), queued, &mut effects)
            .is_none()
    );
    assert_eq!(occupancy_tokens(&owner), 70);
    owner.agent_down(Millis(1), AGENT, &[MODEL], &mut effects);
    assert_eq!(decided(&mut effects), vec![(2, Decision::NoAgents)]);
    assert_eq!(occupancy_tokens(&owner), 40);
}

#[test]
fn a_redirect_token_is_spent_once() {
    let (mut owner, mut effects) = (owner(), Effects::default());
    let clock = Frozen {
        unix_ms: 1_000,
        ..Frozen::default()
    };
    let spend = || Visit::SpendToken {
        nonce: [3; 16],
        expires_unix_ms: 60_000,
    };
    assert!(matches!(
        owner.serve(&clock, ticket(1), spend(), &mut effects),
        Some(Answer::TokenSpent(true))
    ));
    assert!(matches!(
        owner.serve(&clock, ticket(2), spend(), &mut effects),
        Some(Answer::TokenSpent(false))
    ));
}

// ----- any interleaving -----

/// What the requester side knows of one ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    Waiting,
    Granted(Grant),
    Reserved,
    Done,
}

#[derive(Debug, Clone)]
enum Op {
    /// A gated (or direct) acquire of `tokens`, asking for a slot or only a reservation,
    /// parking up to `park_ms`, or told it would park (`bounce`, a request whose tokens were
    /// charged ahead: it then holds nothing and is never answered again).
    Acquire {
        gated: bool,
        tokens: u64,
        with_slot: bool,
        park_ms: u64,
        bounce: bool,
    },
    /// The request at this index (modulo) ends: releases what it holds, or stops waiting.
    End(usize),
    /// The request at this index stops waiting, racing its own grant (cancel, then the grant
    /// comes back as unwanted).
    CancelRacingGrant(usize),
    /// Streamed output grows a reservation.
    Grow(usize, u64),
    /// Time passes; the park timer runs.
    Advance(u64),
    /// The agent leaves and comes back (a new stay).
    Rejoin,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<bool>(), 0u64..120, any::<bool>(), 0u64..2_000, any::<bool>()).prop_map(
            |(gated, tokens, with_slot, park_ms, bounce)| Op::Acquire {
                gated,
                tokens,
                with_slot: with_slot || !gated,
                park_ms,
                bounce: bounce && gated,
            }
        ),
        3 => (0usize..64).prop_map(Op::End),
        1 => (0usize..64).prop_map(Op::CancelRacingGrant),
        1 => (0usize..64, 0u64..50).prop_map(|(index, tokens)| Op::Grow(index, tokens)),
        2 => (1u64..1_500).prop_map(Op::Advance),
        1 => Just(Op::Rejoin),
    ]
}

const CAPACITY: u32 = 3;
const BUDGET: u64 = 150;

struct Run {
    owner: Owner,
    effects: Effects,
    now: u64,
    generation: u32,
    next: u64,
    tickets: BTreeMap<u64, Held>,
}

impl Run {
    fn clock(&self) -> Frozen {
        at(self.now)
    }

    /// Applies the answers the owner left for others: each goes to a waiting ticket, once.
    fn settle_effects(&mut self) {
        for (ticket, answer) in std::mem::take(&mut self.effects.answers) {
            let state = self
                .tickets
                .get_mut(&ticket.sequence)
                .expect("known ticket");
            assert_eq!(
                *state,
                Held::Waiting,
                "ticket {} answered again: {answer:?}",
                ticket.sequence
            );
            *state = held_of(answer);
        }
    }

    fn notice(&mut self, notice: Notice) {
        let clock = self.clock();
        self.owner.notice(&clock, notice, &mut self.effects);
        self.settle_effects();
    }

    /// Gives back what the ticket holds.
    fn end(&mut self, sequence: u64) {
        let ticket = ticket(sequence);
        match self.tickets[&sequence] {
            Held::Waiting => self.notice(Notice::Cancel {
                ticket,
                model: MODEL,
            }),
            Held::Granted(grant) => self.notice(Notice::Release {
                model: MODEL,
                grant,
                ticket,
                observed: None,
            }),
            Held::Reserved => self.notice(Notice::ReleaseReservation {
                model: MODEL,
                ticket,
            }),
            Held::Done => {}
        }
        self.tickets.insert(sequence, Held::Done);
    }

    fn pick(&self, index: usize) -> Option<u64> {
        let live: Vec<u64> = self
            .tickets
            .iter()
            .filter(|(_, held)| **held != Held::Done)
            .map(|(sequence, _)| *sequence)
            .collect();
        (!live.is_empty()).then(|| live[index % live.len()])
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Acquire {
                gated: is_gated,
                tokens,
                with_slot,
                park_ms,
                bounce,
            } => {
                self.next += 1;
                let sequence = self.next;
                let park_until = (park_ms > 0).then(|| Millis(self.now + park_ms));
                let visit = match (is_gated, bounce) {
                    (true, false) => gated(sequence, tokens, BUDGET, park_until, with_slot),
                    (true, true) => bounced(gated(sequence, tokens, BUDGET, park_until, with_slot)),
                    (false, _) => Visit::Acquire {
                        model: MODEL,
                        pool: None,
                        slot: slot(),
                    },
                };
                let clock = self.clock();
                let parked = self.effects.parked;
                let answer = self
                    .owner
                    .serve(&clock, ticket(sequence), visit, &mut self.effects);
                assert!(
                    !bounce || self.effects.parked == parked,
                    "a request that asked to be told was parked"
                );
                self.tickets
                    .insert(sequence, answer.map_or(Held::Waiting, held_of));
                self.settle_effects();
            }
            Op::End(index) => {
                if let Some(sequence) = self.pick(index) {
                    self.end(sequence);
                }
            }
            Op::CancelRacingGrant(index) => {
                let Some(sequence) = self.pick(index) else {
                    return;
                };
                if let Held::Granted(grant) = self.tickets[&sequence] {
                    let ticket = ticket(sequence);
                    self.notice(Notice::Cancel {
                        ticket,
                        model: MODEL,
                    });
                    let unwanted = Answer::decided(MODEL, Decision::Granted(grant))
                        .unwanted(ticket)
                        .expect("a grant gives back");
                    self.notice(unwanted);
                    self.tickets.insert(sequence, Held::Done);
                }
            }
            Op::Grow(index, tokens) => {
                if let Some(sequence) = self.pick(index)
                    && matches!(self.tickets[&sequence], Held::Granted(_) | Held::Reserved)
                {
                    self.notice(Notice::Occupancy {
                        model: MODEL,
                        ticket: ticket(sequence),
                        update: OccupancyUpdate::Output(tokens),
                    });
                }
            }
            Op::Advance(ms) => {
                self.now += ms;
                let now = Millis(self.now);
                self.owner.models.expire_parked(now, &mut self.effects);
                self.settle_effects();
            }
            Op::Rejoin => {
                let now = Millis(self.now);
                self.owner
                    .agent_down(now, AGENT, &[MODEL], &mut self.effects);
                self.settle_effects();
                self.generation += 1;
                let generation = self.generation;
                up(&mut self.owner, CAPACITY, generation, &mut self.effects);
                self.settle_effects();
            }
        }
    }
}

fn held_of(answer: Answer) -> Held {
    match answer {
        Answer::Decided {
            decision: Decision::Granted(grant),
            ..
        } => Held::Granted(grant),
        Answer::Decided {
            decision: Decision::Reserved,
            ..
        } => Held::Reserved,
        Answer::Decided { .. } => Held::Done,
        other => panic!("not an acquire's answer: {other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the interleaving of acquires, releases, cancels racing grants, streamed growth,
    /// expiries and agent rejoins: every ticket is answered at most once, and once every request
    /// has ended the model holds no occupancy, no queue and its whole capacity is free again.
    #[test]
    fn every_interleaving_gives_everything_back(ops in proptest::collection::vec(op(), 1..80)) {
        let mut run = Run {
            owner: owner(),
            effects: Effects::default(),
            now: 0,
            generation: 1,
            next: 0,
            tickets: BTreeMap::new(),
        };
        up(&mut run.owner, CAPACITY, 1, &mut run.effects);
        for op in ops {
            run.apply(op);
        }
        let live: Vec<u64> = run.tickets.keys().copied().collect();
        for sequence in live {
            run.end(sequence);
        }
        run.now += 10_000;
        let now = Millis(run.now);
        prop_assert_eq!(run.owner.models.expire_parked(now, &mut run.effects), None);
        run.settle_effects();
        prop_assert_eq!(occupancy_tokens(&run.owner), 0);
        prop_assert!(run.owner.models.pool_reports().iter().all(|report| report.inflight == 0));
        prop_assert!(run.owner.models.queues().iter().all(|(_, queued)| *queued == 0));
        for extra in 0..u64::from(CAPACITY) {
            let sequence = 10_000 + extra;
            let visit = Visit::Acquire { model: MODEL, pool: None, slot: slot() };
            let clock = run.clock();
            let answer = run.owner.serve(&clock, ticket(sequence), visit, &mut run.effects);
            prop_assert!(matches!(decision(answer), Some(Decision::Granted(_))));
        }
    }
}

/// The model's owner trains its one ratio from the exact usage a release brings, and publishes
/// it where every shard's snapshot entry reads it.
#[test]
fn exact_usage_with_a_release_trains_the_models_one_published_ratio() {
    use crate::logic::admission::estimator::{PublishedRatio, TOKENS_PER_BYTE_START};
    use crate::logic::snapshot::{Capability, ModelEntry};
    use crate::wire::http::prompt::PromptShape;

    let mut owner = owner();
    let ratio = Arc::new(PublishedRatio::default());
    let entry = ModelEntry {
        id: MODEL,
        owner_shard: 0,
        healthy_agents: 1,
        policy: policy(0),
        hold_budget: None,
        tokens_per_byte: ratio.clone(),
    };
    let mut effects = Effects::default();
    owner.set_snapshot(
        Arc::new(RoutingSnapshot::new(
            1,
            [(Box::<str>::from("m"), Capability::Llm, entry)],
            Vec::new(),
        )),
        &mut effects,
    );
    assert_eq!(ratio.tokens_per_byte(), TOKENS_PER_BYTE_START);
    let shape = PromptShape {
        text_bytes: 1000,
        tools_bytes: 0,
        messages: 1,
        images: 0,
    };
    let release = |sequence, observed| Notice::Release {
        model: MODEL,
        grant: Grant {
            agent: AGENT,
            generation: Generation(0),
            step: 0,
        },
        ticket: ticket(sequence),
        observed,
    };
    // 254 exact tokens: 4 for the message, 250 over 1000 bytes.
    let observed = Observed {
        shape,
        exact_input_tokens: 254,
    };
    owner.notice(&at(0), release(1, Some(observed)), &mut effects);
    let expected = 0.8 * TOKENS_PER_BYTE_START + 0.2 * 0.25;
    assert!((ratio.tokens_per_byte() - expected).abs() < 1e-12);
    assert_eq!(
        ratio.estimate(&shape),
        (1000.0 * expected).ceil() as u64 + 4
    );
    assert_eq!(owner.models.estimator.observations(MODEL), 1);
    // A release without exact usage (none reported, a broken answer) teaches nothing.
    owner.notice(&at(0), release(2, None), &mut effects);
    assert_eq!(owner.models.estimator.observations(MODEL), 1);
    assert!((ratio.tokens_per_byte() - expected).abs() < 1e-12);
}
