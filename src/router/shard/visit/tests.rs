//! The visit path driven by hand: real shards on a real mesh, not running, their owners and
//! mesh tasks called as their tasks would.

use std::future::Future;
use std::sync::Arc;
use std::task::Context;
use std::time::Duration;

use super::*;
use crate::base::ids::{AgentId, Generation};
use crate::logic::routing::AgentProfile;
use crate::router::shard::owner::AgentJoin;

const MODEL: ModelId = ModelId(1);

/// One real shard, not running (its owner is called inline, as its tasks would), with one
/// agent of `capacity` slots for `MODEL`.
fn shard_with_agent(capacity: u32) -> Rc<Shard> {
    shards_with_agent(1, capacity).pop().expect("one shard")
}

/// `count` real shards on one mesh, not running; `MODEL`'s owner has one agent of
/// `capacity` slots.
fn shards_with_agent(count: usize, capacity: u32) -> Vec<Rc<Shard>> {
    let endpoints = crate::router::shard::mesh::Mesh::build(count).expect("a mesh");
    let shards: Vec<Rc<Shard>> = endpoints
        .into_iter()
        .map(|mesh| Rc::new(new_shard(mesh, count)))
        .collect();
    let join = AgentJoin {
        agent: AgentId(7),
        generation: Generation(1),
        capacity,
        profile: Arc::new(AgentProfile::default()),
    };
    let now = crate::base::clock::now();
    shards[MODEL.owner(count)]
        .with_owner(|owner, effects| owner.agent_up(now, &join, &[MODEL], effects));
    shards
}

fn new_shard(mesh: crate::router::shard::mesh::Endpoint<ShardToShard>, count: usize) -> Shard {
    let settings = crate::router::shard::state::ShardSettings {
        queue_depth: 16,
        prefix: Default::default(),
        request_timeout: Duration::from_secs(60),
        max_request_bytes: None,
        client_header_timeout: Duration::from_secs(10),
        client_body_timeout: Duration::from_secs(10),
        rpm_burst: Default::default(),
        admit_fraction: 1.0,
        admit_park_timeout: Duration::ZERO,
        provider: None,
        hold: Default::default(),
        held_total: Arc::new(crate::logic::hold::HeldTotal::new(16)),
        site: None,
        site_tokens: None,
        readiness: Arc::new(crate::router::readiness::Readiness::new(false)),
        credit_refills: None,
        tunnel_tls: None,
        client_limits: Default::default(),
        reaper: crate::router::config::ReaperSettings {
            interval: Duration::from_secs(300),
            after_ms: 300_000,
        },
        handoff: None,
    };
    let (to_control, _) = tokio::sync::mpsc::channel(16);
    Shard::new(
        mesh,
        count,
        settings,
        Default::default(),
        Arc::new(crate::logic::auth::keys::KeyRegistry::open()),
        Arc::new(crate::logic::auth::admin::AdminAccess::Open),
        crate::router::shard::queues::ToControl::new(to_control, Default::default()),
    )
}

/// What a shard's mesh task does with the messages other shards sent it, until none is left.
fn drain_mesh(shard: &Rc<Shard>) -> usize {
    let no_connection: crate::router::shard::inbox::Adopt =
        |_, _| panic!("no connection is handed off here");
    let mut applied = 0;
    loop {
        shard.outbox.borrow_mut().flush();
        let Some((_, message)) = shard.outbox.borrow_mut().endpoint().pop() else {
            return applied;
        };
        shard.on_mesh(message, no_connection);
        applied += 1;
    }
}

fn acquire() -> Visit {
    Visit::Acquire {
        model: MODEL,
        pool: None,
        slot: Some(Ask::default()),
    }
}

fn granted(started: Started) -> Option<crate::logic::routing::Grant> {
    match started {
        Started::Answered(Answer::Decided {
            decision: Decision::Granted(grant),
            ..
        }) => Some(grant),
        _ => None,
    }
}

/// The first request takes the agent's only slot.
fn take_the_slot(shard: &Rc<Shard>) -> (Ticket, crate::logic::routing::Grant) {
    let first = shard.new_ticket();
    let grant = granted(shard.start_visit(first, acquire())).expect("the free slot");
    (first, grant)
}

fn release(shard: &Rc<Shard>, ticket: Ticket, grant: crate::logic::routing::Grant) {
    shard.notify(Notice::Release {
        model: MODEL,
        grant,
        ticket,
        observed: None,
    });
}

#[test]
fn a_grant_that_comes_in_the_turn_its_client_leaves_is_released() {
    let shard = shard_with_agent(1);
    let (first, grant) = take_the_slot(&shard);

    // The second request queues for the one slot and waits.
    let second = shard.new_ticket();
    let started = shard.start_visit(second, acquire());
    assert!(matches!(started, Started::Waiting(_)));
    let mut wait = Box::pin(shard.finish_visit(started, Instant::now() + Duration::from_secs(60)));
    let waker = futures_util::task::noop_waker();
    assert!(
        wait.as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending()
    );

    // The first request ends: the owner grants the slot to the second, whose task is woken
    // but, before it runs again, its client leaves and its future is dropped.
    release(&shard, first, grant);
    drop(wait);

    // The slot the second request never took is free again.
    let third = shard.new_ticket();
    assert!(
        granted(shard.start_visit(third, acquire())).is_some(),
        "the grant of a request that left in the turn it came leaked the agent's only slot"
    );
}

#[test]
fn a_wait_past_its_deadline_ends_and_withdraws_its_ticket() {
    let shard = shard_with_agent(1);
    let (first, grant) = take_the_slot(&shard);
    let second = shard.new_ticket();
    let started = shard.start_visit(second, acquire());
    let mut wait = Box::pin(shard.finish_visit(started, Instant::now()));
    let waker = futures_util::task::noop_waker();
    let mut context = Context::from_waker(&waker);
    assert!(wait.as_mut().poll(&mut context).is_pending());
    // What the deadline task does when the deadline passes.
    let mut due = Vec::new();
    shard.waiters.borrow_mut().expire(Instant::now(), &mut due);
    assert_eq!(due.len(), 1);
    assert!(matches!(
        wait.as_mut().poll(&mut context),
        std::task::Poll::Ready(Err(Unanswered::Timeout))
    ));
    drop(wait);
    // The ticket left the queue: the slot, once released, goes to nobody and stays free.
    release(&shard, first, grant);
    let third = shard.new_ticket();
    assert!(granted(shard.start_visit(third, acquire())).is_some());
}

#[test]
fn a_visit_that_finds_its_ring_full_waits_for_room_and_is_answered() {
    let shards = shards_with_agent(2, 1);
    let (requester, owner) = (&shards[1 - MODEL.owner(2)], &shards[MODEL.owner(2)]);
    // The ring to the owner is full of notices it has not read yet.
    let capacity = crate::router::shard::mesh::ring_capacity(2) as u64;
    for sequence in 0..capacity {
        requester.notify(Notice::Cancel {
            ticket: Ticket {
                shard: requester.id as u16,
                sequence: u64::MAX - sequence,
            },
            model: MODEL,
        });
    }
    assert_eq!(requester.outbox.borrow().deferred_len(), 0);

    // The visit waits behind them instead of being refused (503 `queue_full` before).
    let ticket = requester.new_ticket();
    let started = requester.start_visit(ticket, acquire());
    assert!(
        matches!(started, Started::Waiting(_)),
        "refused on a full ring"
    );
    assert_eq!(requester.outbox.borrow().deferred_len(), 1);
    let mut wait =
        Box::pin(requester.finish_visit(started, Instant::now() + Duration::from_secs(60)));
    let waker = futures_util::task::noop_waker();
    let mut context = Context::from_waker(&waker);
    assert!(wait.as_mut().poll(&mut context).is_pending());

    // The owner drains (the requester's outbox sends the visit once there is room), serves
    // the visit; the requester hears the answer: the agent's slot.
    for round in 0.. {
        assert!(round < 10, "the deferred visit never went");
        let applied = drain_mesh(owner);
        requester.outbox.borrow_mut().flush();
        if applied == 0 && !requester.outbox.borrow().has_deferred() {
            break;
        }
    }
    assert_eq!(drain_mesh(requester), 1, "one answer");
    let std::task::Poll::Ready(answered) = wait.as_mut().poll(&mut context) else {
        panic!("answered but still waiting")
    };
    let Ok(Answer::Decided {
        decision: Decision::Granted(grant),
        ..
    }) = answered
    else {
        panic!("not granted: {answered:?}")
    };
    assert_eq!(grant.agent, AgentId(7));
}
