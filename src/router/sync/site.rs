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
//!   ([`CLOCKS_DIFFER_BY_AT_MOST_MS`]): a record left long ago is not live for three intervals;
//!   and at the first sighting of a router this one never watched, when it is the earlier
//!   (`first_sighting_ms`): a time claimed in the past only makes the record older.
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
use crate::logic::limits::share::NOT_REACHED_YET;
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
    /// The store epoch this router's daily totals are written whole in, written in the same
    /// transaction as they are (`sync::whole`); `null` while they are not. Absent from the
    /// records of routers before it: [`WHOLE_IN_EVERY_EPOCH`].
    #[serde(default = "whole_in_every_epoch")]
    pub whole_in: Option<String>,
}

/// The claim of a router of a version before [`Heartbeat::whole_in`]: its totals count as whole
/// in every epoch, as they did then (a site upgraded router by router does not hold its daily
/// budgets meanwhile).
pub const WHOLE_IN_EVERY_EPOCH: &str = "*";

fn whole_in_every_epoch() -> Option<String> {
    Some(WHOLE_IN_EVERY_EPOCH.to_owned())
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

    /// Unchanged for one of its intervals under this router's eyes: its writer missed a
    /// heartbeat, or its round ran a little after this router's read. The second costs the
    /// daily budgets its part of what was left a round before for one round.
    fn is_late(&self) -> bool {
        self.missed() >= 1
    }
}

/// When this router first saw each record's current value: a live router rewrites its record
/// every round, so a record seen unchanged for longer than three intervals is silent, whatever
/// time its writer put in it. Bound: one entry per field of the store's hash, pruned each read.
///
/// Records the store lost with its data are kept as they were last seen
/// ([`Sightings::store_lost_data`]), until their router writes again or they are gone: they age
/// into silence like a record that stopped changing. Dropped, a router whose first round after
/// the loss saw no other record took every limit as its own while the others kept spending
/// theirs (`sync::simulation`, seed 652: 6,752 tokens of a daily budget with nothing left).
/// Bound: the records seen before the loss.
///
/// A value that changed while this router could not read (its rounds failed) may have been
/// written just after its last read, by a router silent since: it is as old as that read.
/// Taken as new, router-0 back from a 6 s outage counted router-1, cut off since, live, and
/// spent router-1's part of a daily budget besides its own (`sync::simulation`, seed 1,022:
/// 7,819 tokens where 5,411 were left). A live router rewrites its record every round: one
/// round later it is live again.
#[derive(Debug, Default)]
pub struct Sightings {
    seen: HashMap<String, Seen>,
    lost: HashMap<String, Seen>,
    /// When this router last read the records.
    last_read_ms: Option<u64>,
    /// A round failed since that read.
    missed: bool,
}

#[derive(Debug)]
struct Seen {
    value: String,
    first_seen_ms: u64,
}

/// A record's age at `now_ms`, first seen with its current value at `first_seen_ms`. Liveness
/// is this router's own reading: the time its writer's clock gives counts only past what clocks
/// of a site may differ by. Read as it was, a router whose clock ran two seconds ahead saw every
/// other router of a site with 200 ms rounds silent, for good (`sync::simulation`, seed 66).
fn record_age_ms(heartbeat: &Heartbeat, first_seen_ms: u64, now_ms: u64) -> u64 {
    let writer_age_ms = now_ms.saturating_sub(heartbeat.at_unix_ms);
    let unchanged_ms = now_ms.saturating_sub(first_seen_ms);
    if writer_age_ms > CLOCKS_DIFFER_BY_AT_MOST_MS {
        writer_age_ms.max(unchanged_ms)
    } else {
        unchanged_ms
    }
}

/// When a record seen at `seen_ms` was first seen, for a router this one never watched: its
/// writer's time when that is the earlier. A router watched before is aged by this router's
/// reading alone ([`record_age_ms`]), but of one never watched this router has no reading: taken
/// as new, a new run that reached the store for one round took routers cut off for 3.7 s for
/// live, and alone a round later split what it believed was left, their unseen usage included
/// (`sync::simulation`, long-mode seed 17,908: 1,512 tokens where 1,442 at most were its part).
/// A writer whose clock is behind this router's shows late or silent for one round at most: a
/// live router's next record is seen change.
fn first_sighting_ms(heartbeat: &Heartbeat, seen_ms: u64) -> u64 {
    heartbeat.at_unix_ms.min(seen_ms)
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
    /// The store lost its data (a new epoch): the records seen so far are kept as they were.
    pub fn store_lost_data(&mut self) {
        self.lost.extend(self.seen.drain());
    }

    /// A round failed: the records read next may have changed at any time since the last read.
    pub fn missed_round(&mut self) {
        self.missed = true;
    }

    /// Reads the store's router records (router ID, stored text) at `now_ms`.
    pub fn read<'a>(
        &mut self,
        fields: impl IntoIterator<Item = (&'a str, &'a str)>,
        now_ms: u64,
    ) -> Roster {
        // When a value not seen before was written, at the earliest.
        let changed_ms = match self.last_read_ms {
            Some(last_read_ms) if self.missed => last_read_ms.min(now_ms),
            _ => now_ms,
        };
        self.last_read_ms = Some(now_ms);
        self.missed = false;
        let mut fields: Vec<(&str, &str)> = fields.into_iter().collect();
        fields.sort_unstable_by_key(|(id, _)| *id);
        let mut roster = Roster::default();
        let mut seen = HashMap::with_capacity(fields.len());
        for (index, (id, text)) in fields.into_iter().enumerate() {
            let watched = self.seen.contains_key(id) || self.lost.contains_key(id);
            let kept = self.seen.remove(id).filter(|before| before.value == text);
            let newly_seen = kept.is_none();
            let heartbeat = (index < ROUTERS_MAX)
                .then(|| Heartbeat::parse(text))
                .flatten();
            let sighting = kept.unwrap_or_else(|| Seen {
                value: text.to_owned(),
                first_seen_ms: match &heartbeat {
                    Some(heartbeat) if !watched => first_sighting_ms(heartbeat, changed_ms),
                    _ => changed_ms,
                },
            });
            let first_seen_ms = sighting.first_seen_ms;
            seen.insert(id.to_owned(), sighting);
            let Some(heartbeat) = heartbeat else {
                roster.malformed += 1;
                if newly_seen {
                    roster.newly_malformed.push(id.to_owned());
                }
                continue;
            };
            let age_ms = record_age_ms(&heartbeat, first_seen_ms, now_ms);
            roster.records.push(Record {
                id: id.to_owned(),
                heartbeat,
                age_ms,
            });
        }
        // What the store lost: kept until the router writes again, or its record is gone.
        self.lost.retain(|id, lost| {
            if seen.contains_key(id) {
                return false;
            }
            let Some(heartbeat) = Heartbeat::parse(&lost.value) else {
                return false;
            };
            let age_ms = record_age_ms(&heartbeat, lost.first_seen_ms, now_ms);
            if heartbeat.state(age_ms) == PeerState::Gone {
                return false;
            }
            roster.records.push(Record {
                id: id.clone(),
                heartbeat,
                age_ms,
            });
            true
        });
        roster.records.sort_unstable_by(|a, b| a.id.cmp(&b.id));
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
    /// Of the live routers, those that missed a heartbeat: their record did not change for one
    /// of their intervals under this router's eyes (`Share::Shared`'s `late`).
    pub late: u32,
    /// Other routers the store lists that count neither live nor silent: left, given up, or
    /// gone. With this router and the live and silent ones, every router the site knows of;
    /// `--sync-min-routers` past that are unlisted (`Share::Shared`'s `unlisted`).
    pub gone: u32,
    /// Of the live routers, those whose daily totals this router has not read whole since the
    /// store lost its data (`sync::whole`, `Share::Shared`'s `unread`): set by the caller.
    pub unread: u32,
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
                if record.is_late() {
                    peers.late += 1;
                }
                if let Some(addr) = &heartbeat.grpc_addr {
                    peers
                        .advertised
                        .push((heartbeat.peer_id.clone(), addr.clone()));
                }
                peers.listed.push(heartbeat.peer_id.clone());
            }
            // The same identity runs live under another router ID (restarted under a new one):
            // this record's process is gone.
            PeerState::Silent if live_peer_ids.contains(&heartbeat.peer_id.as_str()) => {
                peers.gone += 1;
            }
            // Every agent it served reports no session with it: it cannot be spending its share.
            // A router that listed no agent is kept: it may still serve through provider
            // fallback, which no agent can report on.
            PeerState::Silent if !heartbeat.agents.is_empty() && abandoned(record, reports) => {
                peers.gone += 1;
            }
            PeerState::Silent => {
                peers.silent += 1;
                peers.listed.push(heartbeat.peer_id.clone());
            }
            PeerState::Gone => peers.gone += 1,
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
    /// `Share::Shared`'s `away_since` of the last successful round.
    away_since: Option<u32>,
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
            away_since: None,
            last: None,
        }
    }

    /// A round reached the store and saw `peers`. Returns whether a router joined the site: this
    /// one (its first round that reached the store), or more routers are live than at the last
    /// successful round (one started, or came back after it could not reach the store). The
    /// caller reads today's totals again for a few rounds (`round::RESYNC_ROUNDS_AFTER_LOSS`):
    /// a router that joins writes its totals whole if the store lost them while it was away,
    /// and a router that just started cannot know the store failed over before it connected,
    /// while the others still write theirs whole (`sync::simulation`, seed 1,641: a run that
    /// read the totals once, just after a failover lost 2,432 tokens of router-2's, counted
    /// them nowhere for the rest of the day).
    pub fn succeeded(&mut self, peers: Peers) -> bool {
        let joined = self.last.as_ref().is_none_or(|last| peers.live > last.live);
        self.away_since = self.away_since(self.round.wrapping_add(1), &peers);
        self.round = self.round.wrapping_add(1);
        self.failures = 0;
        self.last_seen = 1 + peers.live + peers.silent;
        self.last = Some(peers);
        joined
    }

    /// The share [`Health::succeeded`] with `peers` leaves: the round's entries and anchors are
    /// applied under it, not under the last round's. A router back from silence publishes what
    /// it held back in the round that shows it live; applied while it still counted silent, its
    /// usage came off the live routers' part and its own part, held back, was given back whole
    /// once it showed live (`sync::simulation`, seed 400).
    pub fn share_after(&self, peers: &Peers) -> Share {
        self.shared(self.round.wrapping_add(1), peers)
    }

    /// The share of round `round` with `peers` seen.
    fn shared(&self, round: u32, peers: &Peers) -> Share {
        Share::Shared {
            round,
            live: 1 + peers.live,
            silent: peers.silent,
            late: peers.late,
            at_least: self.min_routers,
            unlisted: self.unlisted(peers),
            unread: peers.unread,
            away_since: self.away_since(round, peers),
        }
    }

    fn unlisted(&self, peers: &Peers) -> u32 {
        self.min_routers
            .saturating_sub(1 + peers.live + peers.silent + peers.gone)
    }

    /// `Share::Shared`'s `away_since` for round `round` with `peers` seen: the round routers
    /// went away, kept while any stays away. A router that comes back from its own outage to
    /// find routers away goes on with the outage's split: its view counts none of what they
    /// spent meanwhile, and its part of the outage is what it may still spend. A run that
    /// never reached the store before starts from the round.
    fn away_since(&self, round: u32, peers: &Peers) -> Option<u32> {
        if peers.late + peers.silent + self.unlisted(peers) == 0 {
            return None;
        }
        if round == self.round {
            // The last successful round's own share (between rounds, or a failed one).
            return self.away_since;
        }
        // The split in use until now goes on: the outage's, or the failed rounds' (the last
        // successful round's), or the one routers went away at.
        let going_on = if self.failures >= MISSED_ROUNDS {
            Some(self.outage_since)
        } else if self.failures > 0 {
            Some(self.away_since.unwrap_or(self.outage_since))
        } else {
            self.away_since
        };
        Some(
            going_on
                .filter(|since| *since != NOT_REACHED_YET)
                .unwrap_or(round),
        )
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
            // A failed round keeps the last round's number: no new allowance without news.
            Some(peers) if self.failures < MISSED_ROUNDS => self.shared(self.round, peers),
            last => Share::Alone {
                since: self.outage_since,
                routers: self.last_seen.max(self.min_routers),
                late: last.as_ref().map_or(0, |peers| peers.late),
                unread: last.as_ref().map_or(0, |peers| peers.unread),
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
mod tests;
