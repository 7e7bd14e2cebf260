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
//! - The store unreachable for three rounds in a row: this router enforces its share alone,
//!   `limit / routers` with the routers last seen, never fewer than `--sync-min-routers`; before
//!   the store first answers, `--sync-min-routers`.
//! - Ten failed rounds in a row: reconnect from the configured addresses, and again every ten.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::logic::credits::AgentSays;
use crate::logic::limits::Share;

/// A router silent this long is given up: the others stop keeping its share.
pub const SILENT_FOR_AT_MOST_MS: u64 = 60 * 60 * 1000;
/// Missed heartbeats before a router counts as silent, and failed rounds before this router
/// counts the store as unreachable.
pub const MISSED_ROUNDS: u32 = 3;
/// Failed rounds in a row after which the store connection is rebuilt from the configured
/// addresses.
pub const RECONNECT_AFTER_FAILURES: u32 = 10;

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
    /// Peer IDs of the agents with a session to this router.
    #[serde(default)]
    pub agents: Vec<String>,
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
    pub fn state(&self, now_unix_ms: u64) -> PeerState {
        if self.left {
            return PeerState::Gone;
        }
        let age = now_unix_ms.saturating_sub(self.at_unix_ms);
        if age <= self.interval_ms.max(1) * u64::from(MISSED_ROUNDS) {
            PeerState::Live
        } else if age <= SILENT_FOR_AT_MOST_MS {
            PeerState::Silent
        } else {
            PeerState::Gone
        }
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

/// Reads the heartbeats of one round. `own_id`'s record is this router's: it counts as live
/// whatever the record says.
pub fn peers<'a>(
    own_id: &str,
    own: &Heartbeat,
    records: impl IntoIterator<Item = (&'a str, &'a Heartbeat)>,
    now_unix_ms: u64,
) -> Peers {
    let mut peers = Peers::default();
    if let Some(addr) = &own.grpc_addr {
        peers.advertised.push((own.peer_id.clone(), addr.clone()));
    }
    peers.listed.push(own.peer_id.clone());
    for (id, heartbeat) in records {
        if id == own_id {
            continue;
        }
        match heartbeat.state(now_unix_ms) {
            PeerState::Live => {
                peers.live += 1;
                if let Some(addr) = &heartbeat.grpc_addr {
                    peers
                        .advertised
                        .push((heartbeat.peer_id.clone(), addr.clone()));
                }
                peers.listed.push(heartbeat.peer_id.clone());
            }
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
pub fn given_up<'a>(
    me: &str,
    records: impl IntoIterator<Item = (&'a str, &'a Heartbeat)>,
    reports: &HashMap<String, Box<[String]>>,
    now_ms: u64,
) -> Vec<(String, u64)> {
    records
        .into_iter()
        .filter(|(id, record)| *id != me && !record.left)
        .filter(|(_, record)| {
            !reports
                .values()
                .any(|routers| routers.contains(&record.peer_id))
        })
        .filter(|(_, record)| {
            let missed = now_ms.saturating_sub(record.at_unix_ms) / record.interval_ms.max(1);
            crate::logic::credits::may_reclaim(
                u32::try_from(missed).unwrap_or(u32::MAX),
                &record.agents,
                |agent| match reports.get(agent) {
                    None => AgentSays::Unheard,
                    Some(routers) if routers.contains(&record.peer_id) => AgentSays::Connected,
                    Some(_) => AgentSays::NotConnected,
                },
            )
        })
        .map(|(id, record)| (id.to_owned(), record.run))
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
            left: false,
        }
    }

    #[test]
    fn a_silent_router_is_given_up_only_once_every_agent_it_served_says_so() {
        let mut crashed = heartbeat("peer-b", 4 * SECOND);
        crashed.agents = vec!["agent-1".into(), "agent-2".into()];
        let records = [("b", &crashed)];
        let mut reports: HashMap<String, Box<[String]>> = HashMap::new();
        reports.insert("agent-1".into(), Box::new(["peer-a".to_string()]));
        assert!(
            given_up("a", records, &reports, NOW).is_empty(),
            "agent-2 is not heard here"
        );
        reports.insert(
            "agent-2".into(),
            Box::new(["peer-a".to_string(), "peer-b".to_string()]),
        );
        assert!(
            given_up("a", records, &reports, NOW).is_empty(),
            "agent-2 still has a session with b"
        );
        reports.insert("agent-2".into(), Box::new(["peer-a".to_string()]));
        assert_eq!(
            given_up("a", records, &reports, NOW),
            vec![("b".to_string(), 1)]
        );
        // An agent b never listed, heard here, with a session to b: it may be serving b.
        reports.insert(
            "agent-3".into(),
            Box::new(["peer-a".to_string(), "peer-b".to_string()]),
        );
        assert!(given_up("a", records, &reports, NOW).is_empty());
        reports.remove("agent-3");
        let recent = heartbeat("peer-b", 2 * SECOND);
        assert!(
            given_up("a", [("b", &recent)], &reports, NOW).is_empty(),
            "two missed heartbeats are not enough"
        );
    }

    #[test]
    fn live_silent_and_gone_by_age_and_leaving() {
        assert_eq!(heartbeat("a", 3 * SECOND).state(NOW), PeerState::Live);
        assert_eq!(heartbeat("a", 3 * SECOND + 1).state(NOW), PeerState::Silent);
        assert_eq!(
            heartbeat("a", SILENT_FOR_AT_MOST_MS).state(NOW),
            PeerState::Silent
        );
        assert_eq!(
            heartbeat("a", SILENT_FOR_AT_MOST_MS + 1).state(NOW),
            PeerState::Gone
        );
        let left = Heartbeat {
            left: true,
            ..heartbeat("a", 0)
        };
        assert_eq!(left.state(NOW), PeerState::Gone);
    }

    #[test]
    fn peers_count_others_and_list_advertised_live_routers() {
        let own = heartbeat("self", 0);
        let records = [
            ("r-self", heartbeat("self-old-run", 0)),
            ("r-live", heartbeat("live", SECOND)),
            ("r-silent", heartbeat("silent", 10 * SECOND)),
            ("r-gone", heartbeat("gone", 2 * SILENT_FOR_AT_MOST_MS)),
        ];
        let peers = peers(
            "r-self",
            &own,
            records.iter().map(|(id, record)| (*id, record)),
            NOW,
        );
        assert_eq!((peers.live, peers.silent), (1, 1));
        let advertised: Vec<&str> = peers.advertised.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(advertised, ["live", "self"]);
        assert_eq!(peers.listed, ["live", "self", "silent"]);
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
