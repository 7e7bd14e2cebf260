//! The agent registry: joining, leaving, health, signals and what agents report.

use super::*;

fn registration(models: &[&str]) -> Registration {
    Registration {
        models: models.iter().map(|m| m.to_string()).collect(),
        capability: Capability::Llm,
        capacity: 4,
        engine: "vllm".into(),
        region: "eu".into(),
        tags: vec![],
        version: "dev".into(),
        deployment_id: String::new(),
        replica_id: String::new(),
        organization: "Unknown".into(),
        machine: "Unknown".into(),
    }
}

fn health() -> HealthTimes {
    HealthTimes {
        unhealthy_after: Duration::from_secs(15),
        remove_after: Duration::from_secs(30),
    }
}

#[test]
fn routable_only_with_registration_and_every_tunnel() {
    let now = Instant::now();
    let mut registry = Registry::new(2, health());
    let agent = AgentId(1);
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    assert!(
        registry
            .register(agent, registration(&["m"]), now)
            .is_empty()
    );
    assert!(registry.tunnel_up(agent, 0, now).is_empty());
    let events = registry.tunnel_up(agent, 1, now);
    assert!(matches!(events[0], Event::AgentUp { capacity: 4, .. }));
    let snapshot = registry.snapshot(&crate::logic::policy::PolicySet::built_in(
        &Default::default(),
    ));
    let entry = snapshot.lookup("m", Capability::Llm).expect("listed");
    assert_eq!(entry.healthy_agents, 1);
    assert!(snapshot.lookup("m", Capability::Embedding).is_none());
    let events = registry.tunnel_down(agent, 1, now);
    assert!(matches!(events[0], Event::AgentDown { .. }));
    assert!(
        registry
            .snapshot(&crate::logic::policy::PolicySet::built_in(
                &Default::default()
            ))
            .lookup("m", Capability::Llm)
            .is_none()
    );
}

#[test]
fn reported_routers_are_a_union_over_live_agents_and_served_agents_are_registered_ones() {
    let now = Instant::now();
    let expires = now + Duration::from_secs(3600);
    let mut registry = Registry::new(1, health());
    registry.session_opened(AgentId(1), "agent-1".into(), expires, now);
    registry.session_opened(AgentId(2), "agent-2".into(), expires, now);
    // Authenticated only: a duplicate session the agent never registered.
    registry.session_opened(AgentId(3), "agent-1".into(), expires, now);
    registry.register(AgentId(1), registration(&["m"]), now);
    registry.register(AgentId(2), registration(&["m"]), now);
    assert!(registry.reported_routers().is_empty());
    registry.routers_reported(AgentId(1), vec!["router-a".into(), "router-b".into()]);
    registry.routers_reported(
        AgentId(2),
        vec!["router-a".into(), "router-c".into(), " ".into()],
    );
    registry.routers_reported(AgentId(9), vec!["unknown-session".into()]);
    let expected: HashSet<String> = ["router-a", "router-b", "router-c"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(registry.reported_routers(), expected);
    assert_eq!(registry.served_agents(), vec!["agent-1", "agent-2"]);
    // A later heartbeat replaces the agent's report; a closed session takes its report away.
    registry.routers_reported(AgentId(1), vec!["router-a".into()]);
    registry.session_closed(AgentId(2));
    let expected: HashSet<String> = ["router-a".to_owned()].into_iter().collect();
    assert_eq!(registry.reported_routers(), expected);
    assert_eq!(registry.served_agents(), vec!["agent-1"]);
    // A report is bounded.
    let many = (0..100).map(|index| format!("router-{index}")).collect();
    registry.routers_reported(AgentId(1), many);
    assert_eq!(registry.reported_routers().len(), REPORTED_ROUTERS_MAX);
    registry.routers_reported(AgentId(1), vec!["x".repeat(200)]);
    assert!(registry.reported_routers().is_empty());
}

#[test]
fn joining_and_leaving_the_pool_are_membership_events() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    let agent = AgentId(3);
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    let mut declared = registration(&["m"]);
    declared.deployment_id = "deploy-42".into();
    declared.replica_id = "replica-3".into();
    assert!(registry.register(agent, declared, now).is_empty());
    let membership = |joined| {
        Event::Membership(Membership {
            joined,
            peer_id: "peer".into(),
            deployment_id: "deploy-42".into(),
            replica_id: "replica-3".into(),
        })
    };
    let events = registry.tunnel_up(agent, 0, now);
    assert!(events.contains(&membership(true)), "{events:?}");
    // Heartbeat loss takes it out of the pool: an `unregistered` entry.
    let events = registry.check_health(now + Duration::from_secs(16));
    assert!(events.contains(&membership(false)), "{events:?}");
    let events = registry.heartbeat(agent, 0, true, now + Duration::from_secs(17));
    assert!(events.contains(&membership(true)), "{events:?}");
    let events = registry.session_closed(agent);
    assert!(events.contains(&membership(false)), "{events:?}");
    assert!(registry.session_closed(agent).is_empty());
}

/// Found by the gRPC fuzz target's registration-stream check: a pooled agent registering
/// again with other models left the pool without an `unregistered` entry, so the stream
/// showed it joining twice.
#[test]
fn a_re_registration_leaves_then_joins_on_the_registration_stream() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    let agent = AgentId(4);
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    registry.register(agent, registration(&["m"]), now);
    registry.tunnel_up(agent, 0, now);
    let events = registry.register(agent, registration(&["m", "n"]), now);
    let joins: Vec<bool> = events
        .iter()
        .filter_map(|event| match event {
            Event::Membership(membership) => Some(membership.joined),
            _ => None,
        })
        .collect();
    assert_eq!(joins, [false, true], "{events:?}");
}

#[test]
fn agent_views_list_registered_agents_with_wall_clock_last_seen() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    registry.session_opened(AgentId(1), "b".into(), now + Duration::from_secs(60), now);
    registry.session_opened(AgentId(2), "a".into(), now + Duration::from_secs(60), now);
    registry.session_opened(
        AgentId(3),
        "unregistered".into(),
        now + Duration::from_secs(60),
        now,
    );
    registry.register(AgentId(1), registration(&["m"]), now);
    registry.register(AgentId(2), registration(&["m"]), now);
    registry.tunnel_up(AgentId(2), 0, now);
    registry.heartbeat(AgentId(2), 3, true, now + Duration::from_millis(500));
    let later = now + Duration::from_millis(15_200);
    let views = registry.agent_views(later, 1_000_000);
    let peers: Vec<&str> = views.iter().map(|view| view.peer_id.as_str()).collect();
    assert_eq!(peers, ["a", "b"], "sorted, registered only");
    assert!(views[0].routable);
    assert!(views[0].heartbeat_fresh, "silent 14.7 s, under 15 s");
    assert_eq!(views[0].in_flight, 3);
    assert_eq!(views[0].last_seen_unix_ms, 1_000_000 - 14_700);
    assert!(!views[1].routable, "a tunnel never came up");
    assert!(!views[1].heartbeat_fresh, "silent 15.2 s");
    assert_eq!(views[1].last_seen_unix_ms, 1_000_000 - 15_200);
}

#[test]
fn heartbeat_loss_then_removal() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    let agent = AgentId(7);
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    registry.register(agent, registration(&["m"]), now);
    registry.tunnel_up(agent, 0, now);
    assert_eq!(registry.routable_count(), 1);
    let events = registry.check_health(now + Duration::from_secs(16));
    assert!(matches!(events[0], Event::AgentDown { .. }));
    let events = registry.check_health(now + Duration::from_secs(31));
    assert_eq!(events, vec![Event::CloseSession { agent }]);
    let events = registry.session_closed(agent);
    assert!(events.is_empty(), "already out of the pool");
}

#[test]
fn routing_signals_do_not_keep_a_silent_agent_in_the_pool() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    let agent = AgentId(7);
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    registry.register(agent, registration(&["m"]), now);
    registry.tunnel_up(agent, 0, now);
    for second in 1..=20 {
        let at = now + Duration::from_secs(second);
        let _ = registry.signal(agent, 0, EngineSignals::default());
        let _ = registry.check_health(at);
    }
    assert_eq!(registry.routable_count(), 0, "no heartbeat for 20 s");
    let snapshot = registry.snapshot(&crate::logic::policy::PolicySet::built_in(
        &Default::default(),
    ));
    assert!(snapshot.lookup("m", Capability::Llm).is_none());
    assert_eq!(&snapshot.models_body[..], br#"{"object":"list","data":[]}"#);
    let events = registry.heartbeat(agent, 0, true, now + Duration::from_secs(21));
    assert!(matches!(events[0], Event::AgentUp { .. }));
}

#[test]
fn a_backend_failing_its_health_check_leaves_the_pool_until_it_passes() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    let agent = AgentId(7);
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    registry.register(agent, registration(&["m"]), now);
    registry.tunnel_up(agent, 0, now);
    assert_eq!(registry.routable_count(), 1);
    let events = registry.heartbeat(agent, 0, false, now);
    assert!(matches!(events[0], Event::AgentDown { .. }));
    assert_eq!(events.last(), Some(&Event::SnapshotChanged));
    let snapshot = registry.snapshot(&crate::logic::policy::PolicySet::built_in(
        &Default::default(),
    ));
    assert!(snapshot.lookup("m", Capability::Llm).is_none());
    assert!(
        registry
            .check_health(now + Duration::from_secs(1))
            .is_empty()
    );
    let events = registry.heartbeat(agent, 0, true, now + Duration::from_secs(2));
    assert!(matches!(events[0], Event::AgentUp { .. }));
    assert_eq!(registry.routable_count(), 1);
}

#[test]
fn while_the_store_answers_a_session_routes_once_a_heartbeat_published_it() {
    let now = Instant::now();
    let expires = now + Duration::from_secs(3600);
    let mut registry = Registry::new(1, health());
    assert!(registry.hold_unpublished(true, now).is_empty());
    registry.session_opened(AgentId(1), "agent-1".into(), expires, now);
    assert!(
        registry
            .register(AgentId(1), registration(&["m"]), now)
            .is_empty()
    );
    assert!(
        registry.tunnel_up(AgentId(1), 0, now).is_empty(),
        "not in a heartbeat yet"
    );
    let (sessions, peers) = registry.served_sessions();
    assert_eq!(
        (sessions.clone(), peers),
        (vec![AgentId(1)], vec!["agent-1".to_string()])
    );
    let events = registry.published(&sessions, now);
    assert!(matches!(events[0], Event::AgentUp { .. }));
    // The store is unreachable: a new session routes at once; when it answers again, what
    // routes stays.
    assert!(registry.hold_unpublished(false, now).is_empty());
    registry.session_opened(AgentId(2), "agent-2".into(), expires, now);
    registry.register(AgentId(2), registration(&["m"]), now);
    let events = registry.tunnel_up(AgentId(2), 0, now);
    assert!(matches!(events[0], Event::AgentUp { .. }));
    assert!(registry.hold_unpublished(true, now).is_empty());
}

/// The counters an `AgentUp` among `events` hands the shards.
fn pooled_counters(events: &[Event]) -> crate::logic::routing::counters::CountersByModel {
    events
        .iter()
        .find_map(|event| match event {
            Event::AgentUp { profile, .. } => Some(profile.counters.clone()),
            _ => None,
        })
        .expect("the agent joined the pool")
}

fn join(registry: &mut Registry, agent: AgentId, now: Instant) -> Vec<Event> {
    registry.session_opened(agent, "peer".into(), now + Duration::from_secs(3600), now);
    registry.register(agent, registration(&["m"]), now);
    registry.tunnel_up(agent, 0, now)
}

#[test]
fn lifetime_counters_survive_a_new_session_and_a_reset_clears_them() {
    let now = Instant::now();
    let mut registry = Registry::new(1, health());
    let counters = pooled_counters(&join(&mut registry, AgentId(1), now));
    let model = counters.0[0].0;
    counters.of(model).expect("counted").finished(0, 200);
    // Heartbeats stop: out of the pool (one failure), then the session closes (one disconnection).
    let later = now + Duration::from_secs(20);
    registry.check_health(later);
    registry.session_closed(AgentId(1));
    let again = pooled_counters(&join(&mut registry, AgentId(2), later));
    again.of(model).expect("counted").finished(0, 502);
    let history = registry.agent_history();
    assert_eq!(history.len(), 1);
    let (row, name) = &history[0];
    assert_eq!((row.peer_id.as_str(), *name), ("peer", "m"));
    assert_eq!((row.totals.success, row.totals.failed), (1, 1));
    assert_eq!((row.totals.failures, row.totals.disconnections), (1, 1));
    registry.reset_agent_history();
    let history = registry.agent_history();
    assert_eq!(
        history.len(),
        1,
        "a registered agent keeps its (zeroed) series"
    );
    assert_eq!(history[0].0.totals, Default::default());
    registry.session_closed(AgentId(2));
    registry.reset_agent_history();
    assert!(
        registry.agent_history().is_empty(),
        "an absent agent's series go"
    );
}

#[test]
fn the_history_of_agents_gone_is_bounded_and_pooled_agents_keep_theirs() {
    use super::history::{HISTORY_ENTRIES_MAX, History};
    let mut history = History::new(1);
    let registration = registration(&["m"]);
    let model = [ModelId(0)];
    // One pooled agent: the routing pool holds its counters.
    let pooled = history.counters_for("pooled", &model, &registration);
    // Agents that came and went under fresh peer IDs, far past the bound.
    for index in 0..HISTORY_ENTRIES_MAX + 100 {
        drop(history.counters_for(&format!("gone-{index}"), &model, &registration));
    }
    let rows = history.rows();
    assert_eq!(rows.len(), HISTORY_ENTRIES_MAX);
    assert!(rows.iter().any(|row| row.peer_id == "pooled"));
    // The oldest gone went first, each counted: the first 101 gone agents are forgotten.
    assert_eq!(history.dropped(), 101);
    let kept = |peer: &str| rows.iter().any(|row| row.peer_id == peer);
    assert!(!kept("gone-0") && !kept("gone-100"));
    assert!(kept("gone-101") && kept(&format!("gone-{}", HISTORY_ENTRIES_MAX + 99)));
    // An agent gone that registers again is the newest: the next to go is gone-101.
    drop(history.counters_for("gone-101", &model, &registration));
    drop(history.counters_for("new", &model, &registration));
    let rows = history.rows();
    assert!(rows.iter().any(|row| row.peer_id == "gone-101"));
    assert!(!rows.iter().any(|row| row.peer_id == "gone-102"));
    assert_eq!(history.dropped(), 102);
    drop(pooled);
}

/// Totals kept on disk by an earlier run continue when the agent registers again, and add to
/// what an agent that registered first already counted.
#[test]
fn restored_history_continues_and_adds_to_what_was_counted() {
    use super::history::History;
    use crate::logic::routing::counters::AgentTotals;
    let mut history = History::new(2);
    let registration = registration(&["m"]);
    let kept = AgentTotals {
        success: 7,
        failed: 1,
        ..AgentTotals::default()
    };
    history.restore("back", ModelId(0), AgentLabels::of(&registration), &kept);
    let counters = history.counters_for("back", &[ModelId(0)], &registration);
    counters.of(ModelId(0)).unwrap().finished(1, 200);
    assert_eq!(history.totals("back", &[ModelId(0)]).success, 8);
    let early = history.counters_for("early", &[ModelId(0)], &registration);
    early.of(ModelId(0)).unwrap().finished(0, 200);
    history.restore("early", ModelId(0), AgentLabels::of(&registration), &kept);
    let totals = history.totals("early", &[ModelId(0)]);
    assert_eq!((totals.success, totals.failed), (8, 1));
}
