//! Who else is in the site, and what share of each limit that leaves this router (seed
//! `run-several-routers.md`, "How it works", step 4, and "When the store is unreachable").
//!
//! Pure: heartbeats and round outcomes in, [`Share`] and gauges out; time is passed in (unix
//! milliseconds, since heartbeats cross machines).
//!
//! # Rules
//! - A router that heartbeated within three of its sync intervals is live.
//! - One that stopped without leaving is silent for up to an hour: it may be cut off from the
//!   store and still spending its share, so the others keep that share free.
//! - One that left cleanly is not counted; a restart under the same router ID replaces the
//!   previous run (one record per router ID).
//! - A silent router is not counted either once it cannot be spending: a live router holds its
//!   peer ID (the same identity restarted under a new router ID), or every agent it served
//!   reports no session with it (the rule that gives its occupancy credits back, seed "A router
//!   that stops").
//!
//! # What is checked of the store
//! Anyone who can write the store can write a heartbeat, so a record is evidence, not truth
//! ([`Sightings`]):
//! - A record's age is how long this router has seen it unchanged, by its own clock: a record that
//!   is not rewritten goes silent after three intervals whatever time it claims. The time its
//!   writer put in it counts only when it is older than clocks differ by
//!   ([`CLOCKS_DIFFER_BY_AT_MOST_MS`]): a record left long ago is not live for three intervals.
//! - The interval a record claims is held to the range `--sync-interval` allows, so a record
//!   cannot stretch its own liveness.
//! - A record that does not parse, names no peer ID, or is oversized is ignored and counted
//!   (`hivenet_sync_malformed_records_total`, once per value); so are records past
//!   [`ROUTERS_MAX`].
//! - The store unreachable for three rounds in a row: this router enforces its share alone,
//!   `limit / routers` with the routers last seen, never fewer than `--sync-min-routers`; before
//!   the store first answers, `--sync-min-routers`.
//! - Ten failed rounds in a row: reconnect from the configured addresses, and again every ten.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::logic::credits::AgentSays;
use crate::logic::limits::Share;
use crate::router::config::sync::{INTERVAL_MAX, INTERVAL_MIN};

/// A router silent this long is given up: the others stop keeping its share.
pub const SILENT_FOR_AT_MOST_MS: u64 = 60 * 60 * 1000;
/// Missed heartbeats before a router counts as silent, and failed rounds before this router
/// counts the store as unreachable.
pub const MISSED_ROUNDS: u32 = 3;
/// Failed rounds in a row after which the store connection is rebuilt from the configured
/// addresses.
pub const RECONNECT_AFTER_FAILURES: u32 = 10;
/// Router records read at most per round (in router ID order); the rest are ignored and counted
/// as malformed. A site runs a handful of routers: this bounds what a flood of forged records
/// costs each round, not a real site.
pub const ROUTERS_MAX: usize = 256;
/// How far the wall clocks of a site's routers may differ. A record is as old as this router has
/// seen it unchanged; its writer's time counts only when it says the record is older than this (a
/// record left by a router gone before this one started).
pub const CLOCKS_DIFFER_BY_AT_MOST_MS: u64 = 30_000;
/// The largest heartbeat record or agent list read, in bytes (a list names the agents its router
/// serves).
pub const RECORD_BYTES_MAX: usize = 64 * 1024;
/// What a heartbeat whose agents are listed apart ([`AgentList`]) puts in its inline list, for
/// routers of the version before, which read only that: an agent no one reports, so they never
/// give this router up on its agents' word (they keep its share and credits, the safe side),
/// where an empty list would let them give it up three missed heartbeats after it went silent.
pub const AGENTS_LISTED_APART: &str = "agents-listed-apart";
/// The longest peer ID or advertised address a record may carry, in bytes.
const FIELD_BYTES_MAX: usize = 256;

/// What a router records about itself each round (one field per router ID in the store).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The router's start time (unix ms): a restart under the same ID is a new run.
    pub run: u64,
    pub at_unix_ms: u64,
    pub interval_ms: u64,
    /// The router's peer ID (agents report routers by it).
    pub peer_id: String,
    /// `--advertise-grpc-addr`, for agents' discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_addr: Option<String>,
    /// Peer IDs of the agents with a session to this router: inline in the heartbeats of routers
    /// before issue 33's change; otherwise filled in by the reader from the [`AgentList`] that
    /// `agents_version` names (stored as [`AGENTS_LISTED_APART`]).
    #[serde(default)]
    pub agents: Vec<String>,
    /// The version of this router's [`AgentList`], written apart and only when it changes, so a
    /// heartbeat does not grow with the agents every round and every router reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents_version: Option<u64>,
    /// Not stored: the list `agents_version` names could not be read (lost with the store's
    /// data, or not written yet), so who this router served is unknown: it is never given up on
    /// its agents' word until the list is read.
    #[serde(skip)]
    pub agents_unknown: bool,
    /// Shut down cleanly: no longer counted.
    #[serde(default)]
    pub left: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    Live,
    Silent,
    /// Left cleanly, or silent for over an hour: not counted, and its record may be removed.
    Gone,
}

impl Heartbeat {
    /// The record's state when it is `age_ms` old (see [`Record::age_ms`]).
    pub fn state(&self, age_ms: u64) -> PeerState {
        if self.left {
            return PeerState::Gone;
        }
        let age = age_ms;
        if age <= self.interval_clamped_ms() * u64::from(MISSED_ROUNDS) {
            PeerState::Live
        } else if age <= SILENT_FOR_AT_MOST_MS {
            PeerState::Silent
        } else {
            PeerState::Gone
        }
    }

    /// The interval the record claims, held to what `--sync-interval` allows: a record cannot
    /// stay live longer by claiming a longer one.
    pub fn interval_clamped_ms(&self) -> u64 {
        self.interval_ms.clamp(
            INTERVAL_MIN.as_millis() as u64,
            INTERVAL_MAX.as_millis() as u64,
        )
    }

    /// Parses a stored record; `None` when it is not one this router can trust the shape of.
    fn parse(text: &str) -> Option<Heartbeat> {
        if text.len() > RECORD_BYTES_MAX {
            return None;
        }
        let heartbeat: Heartbeat = serde_json::from_str(text).ok()?;
        let field_ok = |field: &str| !field.is_empty() && field.len() <= FIELD_BYTES_MAX;
        let ok = field_ok(&heartbeat.peer_id)
            && heartbeat.grpc_addr.as_deref().is_none_or(field_ok)
            && heartbeat.agents.iter().all(|agent| field_ok(agent));
        ok.then_some(heartbeat)
    }

    /// Takes the agents from `list` when it is the version this heartbeat names; otherwise (no
    /// list, another version, unreadable) they are unknown. A heartbeat naming no version keeps
    /// its inline list.
    pub fn resolve_agents(&mut self, list: Option<&AgentList>) {
        let Some(version) = self.agents_version else {
            return;
        };
        match list {
            Some(list) if list.version == version => {
                self.agents = list.agents.clone();
                self.agents_unknown = false;
            }
            _ => {
                self.agents.clear();
                self.agents_unknown = true;
            }
        }
    }
}

/// The agents one router serves, written to `hivenet:{site}:agents` under its router ID when they
/// change (seed "A router that stops": each router publishes, with its heartbeat, the agents it
/// serves); its heartbeat names the version each round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentList {
    pub version: u64,
    pub agents: Vec<String>,
}

impl AgentList {
    /// The list of `agents` (sorted and deduplicated here), versioned by its content: the same
    /// agents give the same version, in any run and on any router.
    pub fn new(mut agents: Vec<String>) -> AgentList {
        use sha2::Digest;
        agents.sort_unstable();
        agents.dedup();
        let mut digest = sha2::Sha256::new();
        for agent in &agents {
            digest.update(agent.as_bytes());
            digest.update([0]);
        }
        let digest = digest.finalize();
        let version = u64::from_le_bytes(digest[..8].try_into().expect("eight bytes"));
        AgentList { version, agents }
    }

    /// Parses a stored list; `None` when it is not one this router can trust the shape of.
    pub fn parse(text: &str) -> Option<AgentList> {
        if text.len() > RECORD_BYTES_MAX {
            return None;
        }
        let list: AgentList = serde_json::from_str(text).ok()?;
        list.agents
            .iter()
            .all(|agent| !agent.is_empty() && agent.len() <= FIELD_BYTES_MAX)
            .then_some(list)
    }
}

/// One router's record as this router reads it: the heartbeat and its age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The router ID (the field in the store).
    pub id: String,
    pub heartbeat: Heartbeat,
    /// The larger of its writer's age (`now - at_unix_ms`, 0 for a time in the future) and how
    /// long this router has seen the record unchanged.
    pub age_ms: u64,
}

impl Record {
    /// Heartbeats missed, by this router's count.
    fn missed(&self) -> u32 {
        u32::try_from(self.age_ms / self.heartbeat.interval_clamped_ms()).unwrap_or(u32::MAX)
    }
}

/// When this router first saw each record's current value: a live router rewrites its record
/// every round, so a record seen unchanged for longer than three intervals is silent, whatever
/// time its writer put in it. Bound: one entry per field of the store's hash, pruned each read.
#[derive(Debug, Default)]
pub struct Sightings {
    seen: HashMap<String, Seen>,
}

#[derive(Debug)]
struct Seen {
    value: String,
    first_seen_ms: u64,
}

/// What one read of the store's router records gave.
#[derive(Debug, Default)]
pub struct Roster {
    /// The well-formed records, in router ID order.
    pub records: Vec<Record>,
    /// Records ignored this read (unreadable, or past [`ROUTERS_MAX`]).
    pub malformed: u32,
    /// The router IDs whose malformed value this read is the first to see (for the counter and
    /// the log: each bad value is reported once).
    pub newly_malformed: Vec<String>,
}

impl Sightings {
    /// Reads the store's router records (router ID, stored text) at `now_ms`.
    pub fn read<'a>(
        &mut self,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
        now_ms: u64,
    ) -> Roster {
        let mut fields: Vec<(&str, &str)> = fields.into_iter().collect();
        fields.sort_unstable_by_key(|(id, _)| *id);
        let mut roster = Roster::default();
        let mut seen = HashMap::with_capacity(fields.len());
        for (index, (id, text)) in fields.into_iter().enumerate() {
            let kept = self.seen.remove(id).filter(|before| before.value == text);
            let newly_seen = kept.is_none();
            let sighting = kept.unwrap_or_else(|| Seen {
                value: text.to_owned(),
                first_seen_ms: now_ms,
            });
            let first_seen_ms = sighting.first_seen_ms;
            seen.insert(id.to_owned(), sighting);
            let heartbeat = (index < ROUTERS_MAX)
                .then(|| Heartbeat::parse(text))
                .flatten();
            let Some(heartbeat) = heartbeat else {
                roster.malformed += 1;
                if newly_seen {
                    roster.newly_malformed.push(id.to_owned());
                }
                continue;
            };
            // Liveness is this router's own reading: the time its writer's clock gives counts
            // only past what clocks of a site may differ by. Read as it was, a router whose
            // clock ran two seconds ahead saw every other router of a site with 200 ms rounds
            // silent, for good (`sync::simulation`, seed 66).
            let writer_age_ms = now_ms.saturating_sub(heartbeat.at_unix_ms);
            let unchanged_ms = now_ms.saturating_sub(first_seen_ms);
            let age_ms = if writer_age_ms > CLOCKS_DIFFER_BY_AT_MOST_MS {
                writer_age_ms.max(unchanged_ms)
            } else {
                unchanged_ms
            };
            roster.records.push(Record {
                id: id.to_owned(),
                heartbeat,
                age_ms,
            });
        }
        self.seen = seen;
        roster
    }
}

/// The other routers as one round saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peers {
    /// Other live routers (this one excluded): `hivenet_sync_peers`.
    pub live: u32,
    pub silent: u32,
    /// Live routers that advertise a gRPC address, this one included when it does:
    /// (peer ID, address), for agents' discovery.
    pub advertised: Vec<(String, String)>,
    /// Peer IDs of every live or silent router, this one included: the routers the store lists
    /// (agents reporting another are reporting an unknown router).
    pub listed: Vec<String>,
}

/// Reads the records of one round. `own_id`'s record is this router's: it counts as live
/// whatever the record says. `reports`: per agent served here, the routers it reports a session
/// with (see [`given_up`]).
pub fn peers(
    own_id: &str,
    own: &Heartbeat,
    records: &[Record],
    reports: &HashMap<String, Box<[String]>>,
) -> Peers {
    let mut peers = Peers::default();
    if let Some(addr) = &own.grpc_addr {
        peers.advertised.push((own.peer_id.clone(), addr.clone()));
    }
    peers.listed.push(own.peer_id.clone());
    let others = || records.iter().filter(|record| record.id != own_id);
    let live_peer_ids: Vec<&str> = others()
        .filter(|record| record.heartbeat.state(record.age_ms) == PeerState::Live)
        .map(|record| record.heartbeat.peer_id.as_str())
        .chain([own.peer_id.as_str()])
        .collect();
    for record in others() {
        let heartbeat = &record.heartbeat;
        match heartbeat.state(record.age_ms) {
            PeerState::Live => {
                peers.live += 1;
                if let Some(addr) = &heartbeat.grpc_addr {
                    peers
                        .advertised
                        .push((heartbeat.peer_id.clone(), addr.clone()));
                }
                peers.listed.push(heartbeat.peer_id.clone());
            }
            // The same identity runs live under another router ID (restarted under a new one):
            // this record's process is gone.
            PeerState::Silent if live_peer_ids.contains(&heartbeat.peer_id.as_str()) => {}
            // Every agent it served reports no session with it: it cannot be spending its share.
            // A router that listed no agent is kept: it may still serve through provider
            // fallback, which no agent can report on.
            PeerState::Silent if !heartbeat.agents.is_empty() && abandoned(record, reports) => {}
            PeerState::Silent => {
                peers.silent += 1;
                peers.listed.push(heartbeat.peer_id.clone());
            }
            PeerState::Gone => {}
        }
    }
    peers.advertised.sort();
    peers.listed.sort();
    peers
}

/// Whether every agent `record`'s router served reports no session with it, and no agent heard
/// here reports one (see [`given_up`]); its missed heartbeats are the caller's to check.
fn abandoned(record: &Record, reports: &HashMap<String, Box<[String]>>) -> bool {
    let peer_id = &record.heartbeat.peer_id;
    !record.heartbeat.agents_unknown
        && !reports.values().any(|routers| routers.contains(peer_id))
        && crate::logic::credits::may_reclaim(record.missed(), &record.heartbeat.agents, |agent| {
            match reports.get(agent) {
                None => AgentSays::Unheard,
                Some(routers) if routers.contains(peer_id) => AgentSays::Connected,
                Some(_) => AgentSays::NotConnected,
            }
        })
}

/// The store's health as rounds see it, and the share it leaves this router.
#[derive(Debug, Clone)]
pub struct Health {
    min_routers: u32,
    /// Successful rounds so far: the round number of [`Share::Shared`].
    round: u32,
    failures: u32,
    /// Routers (this one included) live or silent at the last successful round; 0 before one.
    last_seen: u32,
    /// The round the current outage began at (for [`Share::Alone`]).
    outage_since: u32,
    last: Option<Peers>,
}

/// What a failed round asks of the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    Retry,
    /// Rebuild the connection from the configured addresses (Valkey or the Sentinels may have
    /// moved).
    Reconnect,
}

impl Health {
    pub fn new(min_routers: u32) -> Health {
        Health {
            min_routers: min_routers.max(1),
            round: 0,
            failures: 0,
            last_seen: 0,
            outage_since: 0,
            last: None,
        }
    }

    pub fn succeeded(&mut self, peers: Peers) {
        self.round = self.round.wrapping_add(1);
        self.failures = 0;
        self.last_seen = 1 + peers.live + peers.silent;
        self.last = Some(peers);
    }

    pub fn failed(&mut self) -> AfterFailure {
        if self.failures == 0 {
            self.outage_since = self.round;
        }
        self.failures = self.failures.saturating_add(1);
        if self.failures.is_multiple_of(RECONNECT_AFTER_FAILURES) {
            AfterFailure::Reconnect
        } else {
            AfterFailure::Retry
        }
    }

    /// `hivenet_sync_up`: the store answered within the last three rounds.
    pub fn is_up(&self) -> bool {
        self.last.is_some() && self.failures < MISSED_ROUNDS
    }

    /// The last round's view of the other routers, while the store answers.
    pub fn peers(&self) -> Option<&Peers> {
        self.last.as_ref().filter(|_| self.is_up())
    }

    pub fn share(&self) -> Share {
        match &self.last {
            Some(peers) if self.failures < MISSED_ROUNDS => Share::Shared {
                // A failed round keeps the last round's number: no new allowance without news.
                round: self.round,
                live: 1 + peers.live,
                silent: peers.silent,
            },
            _ => Share::Alone {
                since: self.outage_since,
                routers: self.last_seen.max(self.min_routers),
            },
        }
    }
}

/// The other routers this one may give up now, with the run it gives up (seed "A router that
/// stops", `credits::may_reclaim`): each missed three heartbeats without leaving, and every
/// agent it served reports no connection to it. An agent this router does not serve is one it
/// cannot hear: that keeps the credits where they are. An agent heard here that reports a
/// session with it keeps them too, whether its heartbeat listed that agent or not (it may have
/// connected since, `credits::simulation` seed 2866). `reports`: per agent served here, the routers it
/// reports a session with.
pub fn given_up(
    me: &str,
    records: &[Record],
    reports: &HashMap<String, Box<[String]>>,
) -> Vec<(String, u64)> {
    records
        .iter()
        .filter(|record| record.id != me && !record.heartbeat.left)
        .filter(|record| abandoned(record, reports))
        .map(|record| (record.id.clone(), record.heartbeat.run))
        .collect()
}

#[cfg(test)]
mod tests {
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
        // A record first seen older than clocks differ by is as old as its writer says; one
        // younger ages from when this router first saw it.
        let old = json(&heartbeat("old", 120 * SECOND));
        let roster = sightings.read([("old", old.as_str())], NOW);
        assert_eq!(roster.records[0].age_ms, 120 * SECOND);
        let recent = json(&heartbeat("recent", 10 * SECOND));
        let roster = sightings.read([("recent", recent.as_str())], NOW);
        assert_eq!(roster.records[0].age_ms, 0);
    }

    /// `sync::simulation` seed 66: this router's clock two seconds ahead of the others', with
    /// 200 ms rounds. The others' records, rewritten every round, stay live.
    #[test]
    fn a_reader_whose_clock_runs_ahead_sees_routers_that_write_live() {
        let mut sightings = Sightings::default();
        for round in 0..20 {
            let writer_now = NOW + round * 200;
            let beat = Heartbeat {
                at_unix_ms: writer_now,
                interval_ms: 200,
                ..heartbeat("behind", 0)
            };
            let text = json(&beat);
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
        assert_eq!((peers.live, peers.silent), (1, 1));
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
        assert_eq!((peers.live, peers.silent), (1, 0));
        // This router's own identity under an older router ID.
        let records = [record("r-a-old", heartbeat("peer-a", 30 * SECOND))];
        let peers = super::peers("r-a", &own, &records, &no_reports());
        assert_eq!((peers.live, peers.silent), (0, 0));
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
                routers: 3
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
                silent: 1
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
                silent: 1
            },
            "no new round without news"
        );
        health.failed();
        assert!(!health.is_up());
        assert_eq!(
            health.share(),
            Share::Alone {
                since: 1,
                routers: 4
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
                routers: 5
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
                silent: 0
            }
        );
    }
}
