//! Liveness, records, shares and the agents' word on silent routers.

use super::*;

const SECOND: u64 = 1000;
const NOW: u64 = 1_780_000_000_000;

fn heartbeat(peer: &str, age_ms: u64) -> Heartbeat {
    Heartbeat {
        run: 1,
        at_unix_ms: NOW - age_ms,
        interval_ms: SECOND,
        peer_id: peer.into(),
        grpc_addr: Some(format!("{peer}.router-headless:50051")),
        agents: Vec::new(),
        agents_version: None,
        agents_unknown: false,
        left: false,
        whole_in: None,
    }
}

/// `id`'s record as read `age_ms` after it was written.
fn record(id: &str, heartbeat: Heartbeat) -> Record {
    Record {
        id: id.into(),
        age_ms: NOW - heartbeat.at_unix_ms,
        heartbeat,
    }
}

fn no_reports() -> HashMap<String, Box<[String]>> {
    HashMap::new()
}

#[test]
fn a_silent_router_is_given_up_only_once_every_agent_it_served_says_so() {
    let mut crashed = heartbeat("peer-b", 4 * SECOND);
    crashed.agents = vec!["agent-1".into(), "agent-2".into()];
    let records = [record("b", crashed)];
    let mut reports: HashMap<String, Box<[String]>> = HashMap::new();
    reports.insert("agent-1".into(), Box::new(["peer-a".to_string()]));
    assert!(
        given_up("a", &records, &reports).is_empty(),
        "agent-2 is not heard here"
    );
    reports.insert(
        "agent-2".into(),
        Box::new(["peer-a".to_string(), "peer-b".to_string()]),
    );
    assert!(
        given_up("a", &records, &reports).is_empty(),
        "agent-2 still has a session with b"
    );
    reports.insert("agent-2".into(), Box::new(["peer-a".to_string()]));
    assert_eq!(
        given_up("a", &records, &reports),
        vec![("b".to_string(), 1)]
    );
    // An agent b never listed, heard here, with a session to b: it may be serving b.
    reports.insert(
        "agent-3".into(),
        Box::new(["peer-a".to_string(), "peer-b".to_string()]),
    );
    assert!(given_up("a", &records, &reports).is_empty());
    reports.remove("agent-3");
    let recent = [record("b", heartbeat("peer-b", 2 * SECOND))];
    assert!(
        given_up("a", &recent, &reports).is_empty(),
        "two missed heartbeats are not enough"
    );
}

#[test]
fn live_silent_and_gone_by_age_and_leaving() {
    let beat = heartbeat("a", 0);
    assert_eq!(beat.state(3 * SECOND), PeerState::Live);
    assert_eq!(beat.state(3 * SECOND + 1), PeerState::Silent);
    assert_eq!(beat.state(SILENT_FOR_AT_MOST_MS), PeerState::Silent);
    assert_eq!(beat.state(SILENT_FOR_AT_MOST_MS + 1), PeerState::Gone);
    let left = Heartbeat { left: true, ..beat };
    assert_eq!(left.state(0), PeerState::Gone);
}

#[test]
fn a_record_cannot_stretch_its_liveness_by_the_interval_it_claims() {
    let slow = Heartbeat {
        interval_ms: u64::MAX / 4,
        ..heartbeat("a", 0)
    };
    assert_eq!(slow.interval_clamped_ms(), 10 * SECOND);
    assert_eq!(slow.state(31 * SECOND), PeerState::Silent);
    let zero = Heartbeat {
        interval_ms: 0,
        ..heartbeat("a", 0)
    };
    assert_eq!(zero.interval_clamped_ms(), 100);
    assert_eq!(zero.state(301), PeerState::Silent);
}

fn json(heartbeat: &Heartbeat) -> String {
    serde_json::to_string(heartbeat).unwrap()
}

#[test]
fn a_time_in_the_future_is_clamped_and_an_unchanged_record_goes_silent() {
    let mut sightings = Sightings::default();
    let future = Heartbeat {
        at_unix_ms: NOW + 365 * 24 * 3600 * SECOND,
        ..heartbeat("ghost", 0)
    };
    let text = json(&future);
    let roster = sightings.read([("ghost", text.as_str())], NOW);
    assert_eq!(roster.records[0].age_ms, 0, "the future counts as now");
    assert_eq!(roster.records[0].heartbeat.state(0), PeerState::Live);
    // Not rewritten: it ages by this router's clock.
    let later = NOW + 3 * SECOND + 1;
    let roster = sightings.read([("ghost", text.as_str())], later);
    assert_eq!(roster.records[0].age_ms, 3 * SECOND + 1);
    assert_eq!(
        roster.records[0].heartbeat.state(roster.records[0].age_ms),
        PeerState::Silent
    );
    let roster = sightings.read([("ghost", text.as_str())], NOW + SILENT_FOR_AT_MOST_MS + 1);
    assert_eq!(
        roster.records[0].heartbeat.state(roster.records[0].age_ms),
        PeerState::Gone
    );
}

/// `sync::simulation` seed 1,022: router-0 could not read for 6 s; router-1 wrote its last
/// record just after router-0's last read and went silent. Back, router-0 sees the record as
/// old as its own last read, not new; a record rewritten each round is live again next round.
#[test]
fn a_record_changed_while_this_router_could_not_read_is_as_old_as_its_last_read() {
    let mut sightings = Sightings::default();
    let written = |at: u64, run: u64| {
        json(&Heartbeat {
            at_unix_ms: at,
            run,
            ..heartbeat("b", 0)
        })
    };
    let first = written(NOW, 1);
    sightings.read([("b", first.as_str())], NOW);
    let last = written(NOW + 50, 2);
    for _ in 0..6 {
        sightings.missed_round();
    }
    let back = NOW + 6 * SECOND;
    let roster = sightings.read([("b", last.as_str())], back);
    assert_eq!(roster.records[0].age_ms, 6 * SECOND);
    assert_eq!(
        roster.records[0].heartbeat.state(roster.records[0].age_ms),
        PeerState::Silent
    );
    // Rewritten by the next round, read without a missed round between: new, live.
    let next = written(back + SECOND, 3);
    let roster = sightings.read([("b", next.as_str())], back + SECOND);
    assert_eq!(roster.records[0].age_ms, 0);
    assert_eq!(roster.records[0].heartbeat.state(0), PeerState::Live);
}

/// `sync::simulation` seed 652: the store restarted empty, and the first round after it saw
/// no other router's record. The records it lost age into silence as they were, until their
/// router writes again; one that left stays gone.
#[test]
fn records_the_store_lost_age_into_silence_until_their_router_writes_again() {
    let mut sightings = Sightings::default();
    let a = json(&heartbeat("a", 0));
    let b = json(&heartbeat("b", 0));
    let gone = json(&Heartbeat {
        left: true,
        ..heartbeat("gone", 0)
    });
    let roster = sightings.read(
        [
            ("a", a.as_str()),
            ("b", b.as_str()),
            ("gone", gone.as_str()),
        ],
        NOW,
    );
    assert_eq!(roster.records.len(), 3);
    sightings.store_lost_data();
    let own = json(&heartbeat("own", 0));
    let states = |roster: &Roster| -> Vec<(String, PeerState)> {
        roster
            .records
            .iter()
            .map(|record| (record.id.clone(), record.heartbeat.state(record.age_ms)))
            .collect()
    };
    // Right after the loss: a and b as they were (live), the one that left no more.
    let roster = sightings.read([("own", own.as_str())], NOW + 500);
    assert_eq!(
        states(&roster),
        [
            ("a".to_owned(), PeerState::Live),
            ("b".to_owned(), PeerState::Live),
            ("own".to_owned(), PeerState::Live),
        ]
    );
    // b writes again; a does not, and goes silent.
    let later = NOW + 4 * SECOND;
    let rewritten = |peer| {
        json(&Heartbeat {
            at_unix_ms: later,
            ..heartbeat(peer, 0)
        })
    };
    let (b_again, own_again) = (rewritten("b"), rewritten("own"));
    let roster = sightings.read(
        [("b", b_again.as_str()), ("own", own_again.as_str())],
        later,
    );
    assert_eq!(
        states(&roster)
            .into_iter()
            .map(|(id, state)| (id, state == PeerState::Silent))
            .collect::<Vec<_>>(),
        [
            ("a".to_owned(), true),
            ("b".to_owned(), false),
            ("own".to_owned(), false),
        ]
    );
    // Gone after the hour a silent record counts.
    let roster = sightings.read([("own", own.as_str())], NOW + SILENT_FOR_AT_MOST_MS + 1);
    assert!(roster.records.iter().all(|record| record.id != "a"));
}

#[test]
fn a_record_rewritten_every_round_stays_live_whatever_its_clock_says() {
    let mut sightings = Sightings::default();
    // Its writer's clock runs an hour ahead of this router's: still live while it writes.
    for round in 0..10 {
        let now = NOW + round * SECOND;
        let beat = Heartbeat {
            at_unix_ms: now + 3600 * SECOND,
            ..heartbeat("skewed", 0)
        };
        let text = json(&beat);
        let roster = sightings.read([("skewed", text.as_str())], now);
        assert_eq!(roster.records[0].age_ms, 0);
    }
    // A record first seen older than clocks differ by is as old as its writer says.
    let old = json(&heartbeat("old", 120 * SECOND));
    let roster = sightings.read([("old", old.as_str())], NOW);
    assert_eq!(roster.records[0].age_ms, 120 * SECOND);
}

/// `peer`'s heartbeat written at `at_unix_ms` by a router with 200 ms rounds.
fn fast_beat(peer: &str, at_unix_ms: u64) -> Heartbeat {
    Heartbeat {
        at_unix_ms,
        interval_ms: 200,
        ..heartbeat(peer, 0)
    }
}

/// Long-mode seed 17,908: router-0's new run reached the store for one round and read
/// router-1's record, written 3.7 s before by a router cut off since (200 ms rounds). Taken
/// as new, router-1 counted live. At a first sighting the writer's time counts when it is the
/// older; from the next read on, this router's own reading does.
#[test]
fn a_router_never_watched_is_as_old_as_its_writer_says() {
    let mut sightings = Sightings::default();
    let text = json(&fast_beat("cut-off", NOW - 3_700));
    let roster = sightings.read([("cut-off", text.as_str())], NOW);
    let record = &roster.records[0];
    assert_eq!(record.age_ms, 3_700);
    assert_eq!(record.heartbeat.state(record.age_ms), PeerState::Silent);
    // Watched unchanged since: older still.
    let roster = sightings.read([("cut-off", text.as_str())], NOW + 200);
    assert_eq!(roster.records[0].age_ms, 3_900);
    // A record of a router this one has watched before is aged by this router alone: written
    // again (its writer's clock behind), it is new.
    let again = json(&fast_beat("cut-off", NOW - 3_000));
    let roster = sightings.read([("cut-off", again.as_str())], NOW + 400);
    assert_eq!(roster.records[0].age_ms, 0);
}

/// `sync::simulation` seed 66: this router's clock two seconds ahead of the others', with
/// 200 ms rounds. The others' records, rewritten every round, are live from the second read
/// (the first sighting takes its writer's time, which this clock makes older).
#[test]
fn a_reader_whose_clock_runs_ahead_sees_routers_that_write_live() {
    let mut sightings = Sightings::default();
    let text = json(&fast_beat("behind", NOW - 200));
    let roster = sightings.read([("behind", text.as_str())], NOW - 200 + 2 * SECOND);
    let record = &roster.records[0];
    assert_eq!(record.heartbeat.state(record.age_ms), PeerState::Silent);
    for round in 0..20 {
        let writer_now = NOW + round * 200;
        let text = json(&fast_beat("behind", writer_now));
        let roster = sightings.read([("behind", text.as_str())], writer_now + 2 * SECOND);
        let record = &roster.records[0];
        assert_eq!(record.heartbeat.state(record.age_ms), PeerState::Live);
    }
}

#[test]
fn malformed_records_are_ignored_and_each_bad_value_reported_once() {
    let mut sightings = Sightings::default();
    let good = json(&heartbeat("good", 0));
    let no_peer = json(&heartbeat("", 0));
    let huge_addr = json(&Heartbeat {
        grpc_addr: Some("x".repeat(FIELD_BYTES_MAX + 1)),
        ..heartbeat("big", 0)
    });
    let fields = [
        ("a-good", good.as_str()),
        ("b-garbage", "{not json"),
        ("c-no-peer", no_peer.as_str()),
        ("d-huge", huge_addr.as_str()),
    ];
    let roster = sightings.read(fields, NOW);
    assert_eq!(roster.records.len(), 1);
    assert_eq!(roster.records[0].id, "a-good");
    assert_eq!(roster.malformed, 3);
    assert_eq!(roster.newly_malformed, ["b-garbage", "c-no-peer", "d-huge"]);
    let roster = sightings.read(fields, NOW + SECOND);
    assert_eq!(roster.malformed, 3);
    assert!(roster.newly_malformed.is_empty(), "reported once per value");
    let roster = sightings.read([("b-garbage", "{still not json")], NOW + 2 * SECOND);
    assert_eq!(roster.newly_malformed, ["b-garbage"]);
}

#[test]
fn records_past_the_most_a_site_holds_are_ignored() {
    let mut sightings = Sightings::default();
    let texts: Vec<(String, String)> = (0..ROUTERS_MAX + 3)
        .map(|index| {
            let id = format!("r{index:04}");
            let text = json(&heartbeat(&id, 0));
            (id, text)
        })
        .collect();
    let roster = sightings.read(
        texts.iter().map(|(id, text)| (id.as_str(), text.as_str())),
        NOW,
    );
    assert_eq!(roster.records.len(), ROUTERS_MAX);
    assert_eq!(roster.malformed, 3);
}

#[test]
fn peers_count_others_and_list_advertised_live_routers() {
    let own = heartbeat("self", 0);
    let records = [
        record("r-self", heartbeat("self-old-run", 0)),
        record("r-live", heartbeat("live", SECOND)),
        record("r-silent", heartbeat("silent", 10 * SECOND)),
        record("r-gone", heartbeat("gone", 2 * SILENT_FOR_AT_MOST_MS)),
    ];
    let peers = peers("r-self", &own, &records, &no_reports());
    assert_eq!((peers.live, peers.silent, peers.gone), (1, 1, 1));
    let advertised: Vec<&str> = peers.advertised.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(advertised, ["live", "self"]);
    assert_eq!(peers.listed, ["live", "self", "silent"]);
}

#[test]
fn a_router_restarted_under_a_new_id_does_not_keep_its_old_share() {
    let own = heartbeat("peer-a", 0);
    // The same identity, live under a new router ID: the old record's process is gone.
    let records = [
        record("r-b-old", heartbeat("peer-b", 30 * SECOND)),
        record("r-b-new", heartbeat("peer-b", 0)),
    ];
    let peers = peers("r-a", &own, &records, &no_reports());
    assert_eq!((peers.live, peers.silent, peers.gone), (1, 0, 1));
    // This router's own identity under an older router ID.
    let records = [record("r-a-old", heartbeat("peer-a", 30 * SECOND))];
    let peers = super::peers("r-a", &own, &records, &no_reports());
    assert_eq!((peers.live, peers.silent, peers.gone), (0, 0, 1));
}

#[test]
fn an_agent_list_is_versioned_by_its_agents_alone() {
    let list = AgentList::new(vec!["b".into(), "a".into(), "a".into()]);
    assert_eq!(list.agents, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(list, AgentList::new(vec!["a".into(), "b".into()]));
    assert_ne!(list.version, AgentList::new(vec!["a".into()]).version);
    // "ab" is not "a" then "b".
    assert_ne!(
        AgentList::new(vec!["ab".into()]).version,
        AgentList::new(vec!["a".into(), "b".into()]).version
    );
    let text = serde_json::to_string(&list).unwrap();
    assert_eq!(AgentList::parse(&text), Some(list));
    assert_eq!(AgentList::parse(r#"{"version":1,"agents":[""]}"#), None);
}

#[test]
fn a_router_whose_agent_list_is_unknown_is_never_given_up_on_its_agents_word() {
    let own = heartbeat("peer-a", 0);
    let list = AgentList::new(vec!["agent-1".into()]);
    let mut crashed = heartbeat("peer-b", 10 * SECOND);
    crashed.agents = vec![AGENTS_LISTED_APART.into()];
    crashed.agents_version = Some(list.version);
    let mut reports: HashMap<String, Box<[String]>> = HashMap::new();
    reports.insert("agent-1".into(), Box::new(["peer-a".to_string()]));
    // A router of the version before reads only the inline list: an agent no one reports.
    let as_read_before = {
        let mut heartbeat = crashed.clone();
        heartbeat.agents_version = None;
        [record("r-b", heartbeat)]
    };
    assert!(given_up("r-a", &as_read_before, &reports).is_empty());
    assert_eq!(peers("r-a", &own, &as_read_before, &reports).silent, 1);
    // The list lost, or of another version: unknown.
    for list_read in [None, Some(&AgentList::new(vec!["agent-2".into()]))] {
        let mut unknown = crashed.clone();
        unknown.resolve_agents(list_read);
        assert!(unknown.agents_unknown && unknown.agents.is_empty());
        let records = [record("r-b", unknown)];
        assert!(given_up("r-a", &records, &reports).is_empty());
        assert_eq!(peers("r-a", &own, &records, &reports).silent, 1);
    }
    // Read: its one agent reports no session with it.
    crashed.resolve_agents(Some(&list));
    assert_eq!(crashed.agents, vec!["agent-1".to_string()]);
    let records = [record("r-b", crashed)];
    assert_eq!(given_up("r-a", &records, &reports), vec![("r-b".into(), 1)]);
    assert_eq!(peers("r-a", &own, &records, &reports).silent, 0);
}

#[test]
fn a_silent_router_its_agents_left_is_not_counted_one_that_served_none_is() {
    let own = heartbeat("peer-a", 0);
    let mut crashed = heartbeat("peer-b", 10 * SECOND);
    crashed.agents = vec!["agent-1".into()];
    let records = [record("r-b", crashed)];
    let mut reports: HashMap<String, Box<[String]>> = HashMap::new();
    reports.insert(
        "agent-1".into(),
        Box::new(["peer-a".to_string(), "peer-b".to_string()]),
    );
    assert_eq!(
        peers("r-a", &own, &records, &reports).silent,
        1,
        "its agent still reports a session with it: it may be spending"
    );
    reports.insert("agent-1".into(), Box::new(["peer-a".to_string()]));
    assert_eq!(peers("r-a", &own, &records, &reports).silent, 0);
    // One that listed no agent may still serve through provider fallback.
    let lonely = [record("r-c", heartbeat("peer-c", 10 * SECOND))];
    assert_eq!(peers("r-a", &own, &lonely, &reports).silent, 1);
}

#[test]
fn before_the_store_answers_each_router_takes_its_share_of_min_routers() {
    let health = Health::new(3);
    assert!(!health.is_up());
    assert_eq!(
        health.share(),
        Share::Alone {
            since: 0,
            routers: 3,
            late: 0,
            unread: 0,
        }
    );
}

#[test]
fn three_failed_rounds_fall_back_to_the_routers_last_seen() {
    let mut health = Health::new(1);
    health.succeeded(Peers {
        live: 2,
        silent: 1,
        ..Peers::default()
    });
    assert_eq!(
        health.share(),
        Share::Shared {
            round: 1,
            live: 3,
            silent: 1,
            late: 0,
            at_least: 1,
            unlisted: 0,
            unread: 0,
            away_since: Some(1),
        }
    );
    assert_eq!(health.failed(), AfterFailure::Retry);
    assert_eq!(health.failed(), AfterFailure::Retry);
    assert!(health.is_up(), "two missed rounds keep the shared limits");
    assert_eq!(
        health.share(),
        Share::Shared {
            round: 1,
            live: 3,
            silent: 1,
            late: 0,
            at_least: 1,
            unlisted: 0,
            unread: 0,
            away_since: Some(1),
        },
        "no new round without news"
    );
    health.failed();
    assert!(!health.is_up());
    assert_eq!(
        health.share(),
        Share::Alone {
            since: 1,
            routers: 4,
            late: 0,
            unread: 0,
        }
    );
}

#[test]
fn min_routers_floors_the_routers_last_seen() {
    let mut health = Health::new(5);
    health.succeeded(Peers::default());
    for _ in 0..3 {
        health.failed();
    }
    assert_eq!(
        health.share(),
        Share::Alone {
            since: 1,
            routers: 5,
            late: 0,
            unread: 0,
        }
    );
}

#[test]
fn every_tenth_failure_reconnects() {
    let mut health = Health::new(1);
    let reconnects: Vec<u32> = (1..=25)
        .filter(|_| health.failed() == AfterFailure::Reconnect)
        .collect();
    assert_eq!(reconnects, [10, 20]);
}

#[test]
fn the_store_back_returns_to_shared_limits_in_a_new_round() {
    let mut health = Health::new(2);
    health.succeeded(Peers::default());
    for _ in 0..4 {
        health.failed();
    }
    health.succeeded(Peers {
        live: 1,
        ..Peers::default()
    });
    assert!(health.is_up());
    assert_eq!(
        health.share(),
        Share::Shared {
            round: 2,
            live: 2,
            silent: 0,
            late: 0,
            at_least: 2,
            unlisted: 0,
            unread: 0,
            away_since: None,
        }
    );
}

/// The daily budgets' reserve for silent routers (`limits::daily`) trusts a view of the site
/// only from the round a silent router can show in: a new run sees a record silent since just
/// before its start (its writer's time within what clocks may differ by) as fresh at its first
/// round, and live at exactly three intervals, so silent first at its fifth round. Trusted from
/// the fourth, router-1's new run took router-2, alone for 9 s, for live and spent its part of
/// what it believed was left, router-2's unseen usage included (`sync::simulation`, seed 916).
#[test]
fn a_silent_router_shows_from_the_round_the_budgets_trust() {
    let first_silent = |written_at: u64| {
        let mut sightings = Sightings::default();
        let text = json(&Heartbeat {
            at_unix_ms: written_at,
            ..heartbeat("router-2", 0)
        });
        (1..=10u32)
            .find(|round| {
                let now = NOW + u64::from(round - 1) * SECOND;
                let roster = sightings.read([("router-2", text.as_str())], now);
                let record = &roster.records[0];
                record.heartbeat.state(record.age_ms) == PeerState::Silent
            })
            .expect("silent within ten rounds")
    };
    // At the latest: its writer's clock ahead of this router's by as much as it is old.
    assert_eq!(
        first_silent(NOW),
        crate::logic::limits::share::SILENCE_SHOWS_FROM_ROUND
    );
    // Sooner when its writer's time says it is old.
    assert_eq!(first_silent(NOW - 9 * SECOND), 1);
}

/// A live router whose record did not change for one of its intervals is late: the daily
/// budgets leave it its part from then, not three intervals later (`Share::for_daily`;
/// `sync::simulation`, seed 1,629). Rewritten, it is on time again.
#[test]
fn a_record_unchanged_for_an_interval_is_late_and_on_time_once_rewritten() {
    let own = heartbeat("self", 0);
    let mut sightings = Sightings::default();
    let mut read = |beat: &Heartbeat, now: u64| {
        let text = json(beat);
        let roster = sightings.read([("r-peer", text.as_str())], now);
        let found = peers("r-self", &own, &roster.records, &no_reports());
        (found.live, found.silent, found.late)
    };
    let first = heartbeat("peer", 0);
    assert_eq!(read(&first, NOW), (1, 0, 0));
    assert_eq!(
        read(&first, NOW + SECOND / 2),
        (1, 0, 0),
        "half an interval unchanged"
    );
    assert_eq!(read(&first, NOW + SECOND), (1, 0, 1), "a heartbeat missed");
    assert_eq!(
        read(&first, NOW + 3 * SECOND),
        (1, 0, 1),
        "live up to three"
    );
    assert_eq!(read(&first, NOW + 3 * SECOND + 1), (0, 1, 0), "then silent");
    let rewritten = Heartbeat {
        at_unix_ms: NOW + 4 * SECOND,
        ..heartbeat("peer", 0)
    };
    assert_eq!(read(&rewritten, NOW + 4 * SECOND), (1, 0, 0));
}

/// The share a round's entries and anchors apply under is the one its records leave, whatever
/// came before (an outage, silent routers): what [`Health::succeeded`] then records.
#[test]
fn a_rounds_share_is_known_before_it_is_recorded() {
    let back = Peers {
        live: 2,
        late: 1,
        ..Peers::default()
    };
    let mut health = Health::new(3);
    health.succeeded(Peers {
        silent: 2,
        ..Peers::default()
    });
    for _ in 0..4 {
        health.failed();
    }
    assert!(matches!(health.share(), Share::Alone { .. }));
    let before = health.share_after(&back);
    health.succeeded(back.clone());
    assert_eq!(before, health.share());
    assert_eq!(
        before,
        Share::Shared {
            round: 2,
            live: 3,
            silent: 0,
            late: 1,
            at_least: 3,
            unlisted: 0,
            unread: 0,
            away_since: Some(1),
        }
    );
}

/// `--sync-min-routers` past the routers the store lists in any state are unlisted: a router
/// that left (or went silent for over an hour) is listed, known not to spend.
#[test]
fn routers_the_site_counts_that_the_store_does_not_list_are_unlisted() {
    let unlisted = |peers: Peers| {
        let mut health = Health::new(3);
        health.succeeded(peers);
        match health.share() {
            Share::Shared { unlisted, .. } => unlisted,
            share => panic!("{share:?}"),
        }
    };
    assert_eq!(unlisted(Peers::default()), 2);
    let one_live = Peers {
        live: 1,
        ..Peers::default()
    };
    assert_eq!(unlisted(one_live.clone()), 1);
    assert_eq!(
        unlisted(Peers {
            gone: 1,
            ..one_live.clone()
        }),
        0
    );
    assert_eq!(
        unlisted(Peers {
            silent: 1,
            ..one_live
        }),
        0
    );
}

/// The round routers went away is kept while any is away (late, silent or unlisted), and is
/// forgotten once none is; a router back from its own outage goes on with the outage's round,
/// and a run's first round that reaches the store starts from itself (`Share::rate_split`).
#[test]
fn routers_away_are_counted_from_the_round_they_went_away() {
    let away_since = |health: &Health| match health.share() {
        Share::Shared { away_since, .. } => away_since,
        share => panic!("{share:?}"),
    };
    let live = |live, late, silent| Peers {
        live,
        late,
        silent,
        ..Peers::default()
    };
    let mut health = Health::new(3);
    health.succeeded(live(2, 0, 0));
    health.succeeded(live(2, 0, 0));
    assert_eq!(away_since(&health), None);
    health.succeeded(live(2, 1, 0));
    assert_eq!(away_since(&health), Some(3), "late from round 3");
    health.succeeded(live(1, 0, 1));
    assert_eq!(
        away_since(&health),
        Some(3),
        "then silent: still away since round 3"
    );
    health.succeeded(live(2, 0, 0));
    assert_eq!(away_since(&health), None, "back");

    for _ in 0..4 {
        health.failed();
    }
    assert!(matches!(health.share(), Share::Alone { since: 5, .. }));
    health.succeeded(live(0, 0, 2));
    assert_eq!(
        away_since(&health),
        Some(5),
        "back from its outage with the others away: the outage's part goes on"
    );

    let mut new_run = Health::new(3);
    for _ in 0..4 {
        new_run.failed();
    }
    new_run.succeeded(Peers::default());
    assert_eq!(
        away_since(&new_run),
        Some(1),
        "two routers unlisted at a run's first round: from that round, not from nothing"
    );
}
