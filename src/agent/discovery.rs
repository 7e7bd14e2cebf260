//! Which routers the agent keeps a control session with: the `--routers` entries, and the routers
//! the site's routers list in their authentication responses and heartbeat acks (seed,
//! run-several-routers, "Let agents find every router").
//!
//! Pure: no socket, no clock, no runtime. The driver (`agent::sessions`) feeds it what the session
//! tasks report, with the time, and carries out the [`Action`]s it returns (spawn or abort a
//! session task). The order of calls: [`Discovery::new`], then any of the `handle_*` inputs as
//! they happen, each followed by [`Discovery::poll_actions`]; [`Discovery::handle_tick`] every few
//! seconds for the two-minute expiry. Queries ([`Discovery::connected_peer_ids`]) read the state.
//!
//! Rules, from the seed:
//! - a `--routers` entry always has its session, which is never closed (it may be a DNS name that
//!   reaches another router tomorrow);
//! - a listed router gets a session as soon as the agent has none with it (by peer ID), so a new
//!   router gets the agent within one heartbeat;
//! - one router, one session: a session that authenticates with a router another session already
//!   reaches (its peer ID) goes no further ([`Admit::Duplicate`]); between a `--routers` entry and
//!   a discovered router, the `--routers` entry wins and the discovered session is closed at once;
//! - a discovered router listed under a new address is dialed there once its old session is down;
//! - a discovered router's session is closed only once the router has been missing from every
//!   list for [`FORGET_AFTER`] and its session is down. A short or empty list changes nothing;
//! - at most [`DISCOVERED_MAX`] discovered routers; lists count only from sessions that
//!   authenticated and were admitted.
//!
//! Invariants: every discovered router has exactly one session; a peer ID is reached by at most
//! one session; every session has exactly one spawned task (an `Open` not yet followed by a
//! `Close`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Discovered routers kept at once (seed: "An agent keeps at most 32 discovered routers").
pub const DISCOVERED_MAX: usize = 32;
/// A discovered router missing from every list this long, with its session down, is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(120);
/// Entries of one list looked at; a router never lists more than its live routers, so the rest
/// of a longer list is a faulty router's.
pub const LIST_ENTRIES_MAX: usize = 256;

/// One session task, for the life of the task (reconnects keep it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// One router as a list names it; `uri` is the gRPC endpoint (`http://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub peer_id: String,
    pub uri: String,
}

/// What the driver carries out, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Spawn a session task keeping a session with `uri`.
    Open { session: SessionId, uri: String },
    /// Abort the session's task (its tunnels go with it).
    Close { session: SessionId },
}

/// The answer to a session that authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Register and serve.
    Proceed,
    /// Another session already reaches this router: stop before registering, try again once
    /// that session is down.
    Duplicate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A `--routers` entry: never closed.
    Configured,
    /// Opened for a listed router.
    Discovered,
}

#[derive(Debug)]
struct Session {
    uri: String,
    origin: Origin,
    /// The router's peer ID while the session is admitted; `None` while connecting, down, or
    /// refused as a duplicate.
    reached: Option<String>,
}

#[derive(Debug)]
struct DiscoveredRouter {
    /// The address it was last listed under.
    uri: String,
    last_listed: Instant,
    session: SessionId,
}

#[derive(Debug)]
pub struct Discovery {
    sessions: BTreeMap<SessionId, Session>,
    /// Keyed by the peer ID the lists give.
    discovered: BTreeMap<String, DiscoveredRouter>,
    next_session: u64,
    actions: Vec<Action>,
    /// Listed routers not kept because [`DISCOVERED_MAX`] were already.
    ignored_over_limit: u64,
}

impl Discovery {
    /// Starts with one session per `--routers` entry (URIs, duplicates already removed).
    pub fn new(configured: &[String]) -> Discovery {
        let mut discovery = Discovery {
            sessions: BTreeMap::new(),
            discovered: BTreeMap::new(),
            next_session: 0,
            actions: Vec::new(),
            ignored_over_limit: 0,
        };
        for uri in configured {
            discovery.open(uri.clone(), Origin::Configured);
        }
        discovery
    }

    // ----- queries -----

    /// Peer IDs of the routers with an admitted session now, sorted: what heartbeats report.
    pub fn connected_peer_ids(&self) -> Vec<String> {
        let mut peers: Vec<String> = self
            .sessions
            .values()
            .filter_map(|session| session.reached.clone())
            .collect();
        peers.sort();
        peers
    }

    pub fn discovered_count(&self) -> usize {
        self.discovered.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Listed routers left out because [`DISCOVERED_MAX`] were kept already.
    pub fn ignored_over_limit(&self) -> u64 {
        self.ignored_over_limit
    }

    // ----- inputs -----

    /// `session` authenticated with the router `peer_id`.
    pub fn handle_authenticated(&mut self, session: SessionId, peer_id: &str) -> Admit {
        let Some(origin) = self.sessions.get(&session).map(|session| session.origin) else {
            // Closed meanwhile; its task is being aborted.
            return Admit::Duplicate;
        };
        let holder = self.sessions.iter().find_map(|(id, other)| {
            (*id != session && other.reached.as_deref() == Some(peer_id))
                .then_some((*id, other.origin))
        });
        match (origin, holder) {
            (_, None) => {}
            // A `--routers` entry reaches a router a discovered session holds: the entry wins.
            (Origin::Configured, Some((holder, Origin::Discovered))) => {
                self.forget_discovered_session(holder);
            }
            // A discovered router that a `--routers` entry already reaches: closed at once.
            (Origin::Discovered, Some((_, Origin::Configured))) => {
                self.forget_discovered_session(session);
                return Admit::Duplicate;
            }
            (_, Some(_)) => return Admit::Duplicate,
        }
        if origin == Origin::Configured {
            // A discovered router under this peer ID is reached by the entry now.
            if let Some(router) = self.discovered.get(peer_id)
                && router.session != session
            {
                let discovered_session = router.session;
                self.forget_discovered_session(discovered_session);
            }
        }
        if let Some(entry) = self.sessions.get_mut(&session) {
            entry.reached = Some(peer_id.to_owned());
        }
        Admit::Proceed
    }

    /// `session` ended (it reconnects on its own unless closed).
    pub fn handle_down(&mut self, session: SessionId, now: Instant) {
        let Some(entry) = self.sessions.get_mut(&session) else {
            return;
        };
        entry.reached = None;
        if entry.origin == Origin::Configured {
            return;
        }
        let session_uri = entry.uri.clone();
        let Some((peer_id, router)) = self
            .discovered
            .iter()
            .find(|(_, router)| router.session == session)
        else {
            return;
        };
        let peer_id = peer_id.clone();
        if now.saturating_duration_since(router.last_listed) >= FORGET_AFTER {
            self.forget_discovered_session(session);
        } else if router.uri != session_uri {
            self.redial(&peer_id);
        }
    }

    /// A list from `from`: `None` (the router sent no list) changes nothing, and so does a list
    /// from a session that is not admitted.
    pub fn handle_list(&mut self, from: SessionId, list: Option<&[Listed]>, now: Instant) {
        let Some(list) = list else { return };
        if self
            .sessions
            .get(&from)
            .is_none_or(|session| session.reached.is_none())
        {
            return;
        }
        for listed in list.iter().take(LIST_ENTRIES_MAX) {
            if listed.peer_id.is_empty() || listed.uri.is_empty() {
                continue;
            }
            if let Some(router) = self.discovered.get_mut(&listed.peer_id) {
                router.last_listed = now;
                if router.uri != listed.uri {
                    router.uri = listed.uri.clone();
                    let session_up = self
                        .sessions
                        .get(&router.session)
                        .is_some_and(|session| session.reached.is_some());
                    if !session_up {
                        let peer_id = listed.peer_id.clone();
                        self.redial(&peer_id);
                    }
                }
                continue;
            }
            let reached = self
                .sessions
                .values()
                .any(|session| session.reached.as_deref() == Some(listed.peer_id.as_str()));
            if reached {
                continue;
            }
            if self.discovered.len() >= DISCOVERED_MAX {
                self.ignored_over_limit += 1;
                continue;
            }
            let session = self.open(listed.uri.clone(), Origin::Discovered);
            self.discovered.insert(
                listed.peer_id.clone(),
                DiscoveredRouter {
                    uri: listed.uri.clone(),
                    last_listed: now,
                    session,
                },
            );
        }
    }

    /// The expiry pass: forgets discovered routers missing from every list for [`FORGET_AFTER`]
    /// whose session is down.
    pub fn handle_tick(&mut self, now: Instant) {
        let expired: Vec<SessionId> = self
            .discovered
            .values()
            .filter(|router| now.saturating_duration_since(router.last_listed) >= FORGET_AFTER)
            .map(|router| router.session)
            .filter(|session| {
                self.sessions
                    .get(session)
                    .is_none_or(|session| session.reached.is_none())
            })
            .collect();
        for session in expired {
            self.forget_discovered_session(session);
        }
    }

    // ----- outputs -----

    /// The actions to carry out, in order, since the last call.
    pub fn poll_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    // ----- internals -----

    fn open(&mut self, uri: String, origin: Origin) -> SessionId {
        let session = SessionId(self.next_session);
        self.next_session += 1;
        self.actions.push(Action::Open {
            session,
            uri: uri.clone(),
        });
        self.sessions.insert(
            session,
            Session {
                uri,
                origin,
                reached: None,
            },
        );
        session
    }

    /// Closes a discovered router's session and forgets the router.
    fn forget_discovered_session(&mut self, session: SessionId) {
        debug_assert!(
            self.sessions
                .get(&session)
                .is_none_or(|entry| entry.origin == Origin::Discovered),
            "a --routers session is never closed"
        );
        if self.sessions.remove(&session).is_some() {
            self.actions.push(Action::Close { session });
        }
        self.discovered
            .retain(|_, router| router.session != session);
    }

    /// Replaces a discovered router's session with one to the address it was last listed under.
    fn redial(&mut self, peer_id: &str) {
        let Some(router) = self.discovered.get(peer_id) else {
            return;
        };
        let (old, uri) = (router.session, router.uri.clone());
        if self.sessions.remove(&old).is_some() {
            self.actions.push(Action::Close { session: old });
        }
        let session = self.open(uri, Origin::Discovered);
        if let Some(router) = self.discovered.get_mut(peer_id) {
            router.session = session;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(peer_id: &str, uri: &str) -> Listed {
        Listed {
            peer_id: peer_id.to_owned(),
            uri: uri.to_owned(),
        }
    }

    fn opened(actions: &[Action]) -> Vec<(SessionId, String)> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Open { session, uri } => Some((*session, uri.clone())),
                Action::Close { .. } => None,
            })
            .collect()
    }

    fn closed(actions: &[Action]) -> Vec<SessionId> {
        actions
            .iter()
            .filter_map(|action| match action {
                Action::Close { session } => Some(*session),
                Action::Open { .. } => None,
            })
            .collect()
    }

    /// One `--routers` entry, up as router `a`.
    fn started(now: Instant) -> (Discovery, SessionId) {
        let mut discovery = Discovery::new(&["http://a:1".to_owned()]);
        let first = opened(&discovery.poll_actions());
        assert_eq!(first.len(), 1);
        let session = first[0].0;
        assert_eq!(discovery.handle_authenticated(session, "a"), Admit::Proceed);
        discovery.handle_list(session, Some(&[listed("a", "http://a:1")]), now);
        assert!(discovery.poll_actions().is_empty(), "a router lists itself");
        (discovery, session)
    }

    #[test]
    fn configured_routers_each_get_a_session() {
        let mut discovery = Discovery::new(&[
            "http://router-0:50051".to_owned(),
            "http://router-1:50051".to_owned(),
        ]);
        let actions = discovery.poll_actions();
        assert_eq!(
            opened(&actions)
                .into_iter()
                .map(|(_, uri)| uri)
                .collect::<Vec<_>>(),
            vec!["http://router-0:50051", "http://router-1:50051"]
        );
        assert!(discovery.connected_peer_ids().is_empty());
    }

    #[test]
    fn a_listed_router_gets_a_session_once() {
        let now = Instant::now();
        let (mut discovery, a) = started(now);
        discovery.handle_list(
            a,
            Some(&[listed("a", "http://a:1"), listed("b", "http://b:1")]),
            now,
        );
        let actions = discovery.poll_actions();
        assert_eq!(opened(&actions).len(), 1);
        let b = opened(&actions)[0].0;
        assert_eq!(opened(&actions)[0].1, "http://b:1");
        // Listed again, before and after its session is up: no second session.
        discovery.handle_list(a, Some(&[listed("b", "http://b:1")]), now);
        assert_eq!(discovery.handle_authenticated(b, "b"), Admit::Proceed);
        discovery.handle_list(
            b,
            Some(&[listed("a", "http://a:1"), listed("b", "http://b:1")]),
            now,
        );
        assert!(discovery.poll_actions().is_empty());
        assert_eq!(discovery.connected_peer_ids(), vec!["a", "b"]);
        assert_eq!(discovery.discovered_count(), 1);
    }

    #[test]
    fn no_list_or_a_list_from_a_session_not_admitted_changes_nothing() {
        let now = Instant::now();
        let mut discovery =
            Discovery::new(&["http://a:1".to_owned(), "http://a-again:1".to_owned()]);
        let sessions = opened(&discovery.poll_actions());
        let (a, duplicate) = (sessions[0].0, sessions[1].0);
        // Not authenticated yet.
        discovery.handle_list(a, Some(&[listed("b", "http://b:1")]), now);
        assert!(discovery.poll_actions().is_empty());
        assert_eq!(discovery.handle_authenticated(a, "a"), Admit::Proceed);
        assert_eq!(
            discovery.handle_authenticated(duplicate, "a"),
            Admit::Duplicate
        );
        discovery.handle_list(duplicate, Some(&[listed("b", "http://b:1")]), now);
        discovery.handle_list(a, None, now);
        discovery.handle_list(a, Some(&[]), now);
        discovery.handle_list(SessionId(99), Some(&[listed("b", "http://b:1")]), now);
        assert!(discovery.poll_actions().is_empty());
    }

    #[test]
    fn the_same_router_under_two_configured_addresses_gets_one_session() {
        let mut discovery = Discovery::new(&[
            "http://127.0.0.1:7".to_owned(),
            "http://localhost:7".to_owned(),
        ]);
        let sessions = opened(&discovery.poll_actions());
        let (first, second) = (sessions[0].0, sessions[1].0);
        assert_eq!(discovery.handle_authenticated(second, "r"), Admit::Proceed);
        assert_eq!(discovery.handle_authenticated(first, "r"), Admit::Duplicate);
        assert_eq!(discovery.connected_peer_ids(), vec!["r"]);
        // Neither is closed: both are --routers entries. Once the holder is down the other may
        // take over.
        assert!(discovery.poll_actions().is_empty());
        discovery.handle_down(second, Instant::now());
        assert!(discovery.poll_actions().is_empty());
        assert_eq!(discovery.handle_authenticated(first, "r"), Admit::Proceed);
    }

    #[test]
    fn a_configured_entry_wins_over_a_discovered_session_to_the_same_router() {
        let now = Instant::now();
        let mut discovery = Discovery::new(&["http://a:1".to_owned(), "http://b-dns:1".to_owned()]);
        let sessions = opened(&discovery.poll_actions());
        let (a, b_dns) = (sessions[0].0, sessions[1].0);
        assert_eq!(discovery.handle_authenticated(a, "a"), Admit::Proceed);
        // b-dns is still connecting when a lists b under its pod IP.
        discovery.handle_list(a, Some(&[listed("b", "http://10.0.0.2:1")]), now);
        let b_ip = opened(&discovery.poll_actions())[0].0;
        assert_eq!(discovery.handle_authenticated(b_ip, "b"), Admit::Proceed);
        // The --routers entry reaches b too: the discovered session is closed at once.
        assert_eq!(discovery.handle_authenticated(b_dns, "b"), Admit::Proceed);
        assert_eq!(closed(&discovery.poll_actions()), vec![b_ip]);
        assert_eq!(discovery.discovered_count(), 0);
        assert_eq!(discovery.connected_peer_ids(), vec!["a", "b"]);
        // And in the other order: the discovered session authenticates after the entry.
        let mut discovery = Discovery::new(&["http://a:1".to_owned(), "http://b-dns:1".to_owned()]);
        let sessions = opened(&discovery.poll_actions());
        let (a, b_dns) = (sessions[0].0, sessions[1].0);
        assert_eq!(discovery.handle_authenticated(a, "a"), Admit::Proceed);
        discovery.handle_list(a, Some(&[listed("b", "http://10.0.0.2:1")]), now);
        let b_ip = opened(&discovery.poll_actions())[0].0;
        assert_eq!(discovery.handle_authenticated(b_dns, "b"), Admit::Proceed);
        assert_eq!(closed(&discovery.poll_actions()), vec![b_ip]);
        assert_eq!(discovery.handle_authenticated(b_ip, "b"), Admit::Duplicate);
        assert_eq!(discovery.discovered_count(), 0);
    }

    #[test]
    fn a_router_listed_under_a_new_address_is_dialed_there_once_its_session_is_down() {
        let now = Instant::now();
        let (mut discovery, a) = started(now);
        discovery.handle_list(a, Some(&[listed("b", "http://10.0.0.2:1")]), now);
        let old = opened(&discovery.poll_actions())[0].0;
        assert_eq!(discovery.handle_authenticated(old, "b"), Admit::Proceed);
        // Moved while its session is up: nothing yet.
        discovery.handle_list(a, Some(&[listed("b", "http://10.0.0.9:1")]), now);
        assert!(discovery.poll_actions().is_empty());
        discovery.handle_down(old, now + Duration::from_secs(1));
        let actions = discovery.poll_actions();
        assert_eq!(closed(&actions), vec![old]);
        assert_eq!(opened(&actions)[0].1, "http://10.0.0.9:1");
        // Moved again while its new session is still connecting: redialled at once.
        let connecting = opened(&actions)[0].0;
        discovery.handle_list(a, Some(&[listed("b", "http://10.0.0.10:1")]), now);
        let actions = discovery.poll_actions();
        assert_eq!(closed(&actions), vec![connecting]);
        assert_eq!(opened(&actions)[0].1, "http://10.0.0.10:1");
        assert_eq!(discovery.discovered_count(), 1);
    }

    #[test]
    fn a_discovered_router_is_closed_only_after_two_minutes_missing_and_down() {
        let start = Instant::now();
        let (mut discovery, a) = started(start);
        discovery.handle_list(
            a,
            Some(&[listed("a", "http://a:1"), listed("b", "http://b:1")]),
            start,
        );
        let b = opened(&discovery.poll_actions())[0].0;
        assert_eq!(discovery.handle_authenticated(b, "b"), Admit::Proceed);
        // Short and empty lists (a router restarting) change nothing.
        let later = start + Duration::from_secs(60);
        discovery.handle_list(a, Some(&[listed("a", "http://a:1")]), later);
        discovery.handle_list(a, Some(&[]), later);
        discovery.handle_tick(later);
        assert!(discovery.poll_actions().is_empty());
        // Missing for two minutes but its session is up: kept.
        let expired = start + FORGET_AFTER;
        discovery.handle_tick(expired);
        assert!(discovery.poll_actions().is_empty());
        // Down, and missing for two minutes: closed.
        discovery.handle_down(b, expired + Duration::from_secs(1));
        assert_eq!(closed(&discovery.poll_actions()), vec![b]);
        assert_eq!(discovery.discovered_count(), 0);
        assert_eq!(discovery.connected_peer_ids(), vec!["a"]);
    }

    #[test]
    fn a_down_discovered_router_listed_again_within_two_minutes_is_kept() {
        let start = Instant::now();
        let (mut discovery, a) = started(start);
        discovery.handle_list(a, Some(&[listed("b", "http://b:1")]), start);
        let b = opened(&discovery.poll_actions())[0].0;
        discovery.handle_down(b, start + Duration::from_secs(10));
        let just_before = start + FORGET_AFTER - Duration::from_millis(1);
        discovery.handle_tick(just_before);
        assert!(discovery.poll_actions().is_empty());
        discovery.handle_list(a, Some(&[listed("b", "http://b:1")]), just_before);
        discovery.handle_tick(start + FORGET_AFTER + Duration::from_secs(60));
        assert!(
            discovery.poll_actions().is_empty(),
            "listed again: the clock restarts"
        );
        discovery.handle_tick(just_before + FORGET_AFTER);
        assert_eq!(closed(&discovery.poll_actions()), vec![b]);
    }

    #[test]
    fn configured_sessions_are_never_closed() {
        let start = Instant::now();
        let (mut discovery, a) = started(start);
        discovery.handle_down(a, start + Duration::from_secs(600));
        discovery.handle_tick(start + Duration::from_secs(6000));
        assert!(discovery.poll_actions().is_empty());
        assert_eq!(discovery.session_count(), 1);
    }

    #[test]
    fn at_most_thirty_two_discovered_routers() {
        let now = Instant::now();
        let (mut discovery, a) = started(now);
        let list: Vec<Listed> = (0..40)
            .map(|index| listed(&format!("peer-{index}"), &format!("http://r{index}:1")))
            .collect();
        discovery.handle_list(a, Some(&list), now);
        assert_eq!(opened(&discovery.poll_actions()).len(), DISCOVERED_MAX);
        assert_eq!(discovery.discovered_count(), DISCOVERED_MAX);
        assert_eq!(discovery.ignored_over_limit(), 8);
        // Entries without a peer ID or an address are skipped.
        let (mut discovery, a) = started(now);
        discovery.handle_list(a, Some(&[listed("", "http://x:1"), listed("x", "")]), now);
        assert!(discovery.poll_actions().is_empty());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;
        use std::collections::BTreeSet;

        #[derive(Debug, Clone)]
        enum Step {
            /// The `n`-th live session authenticates with router `peer`.
            Authenticated {
                session: usize,
                peer: u8,
            },
            Down {
                session: usize,
            },
            /// The `n`-th live session hands a list of `(peer, address)`.
            List {
                session: usize,
                routers: Vec<(u8, u8)>,
            },
            /// Time passes, then the expiry pass.
            Tick {
                seconds: u16,
            },
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                (0..8usize, 0..6u8)
                    .prop_map(|(session, peer)| Step::Authenticated { session, peer }),
                (0..8usize).prop_map(|session| Step::Down { session }),
                (
                    0..8usize,
                    proptest::collection::vec((0..40u8, 0..3u8), 0..40)
                )
                    .prop_map(|(session, routers)| Step::List { session, routers }),
                (0..200u16).prop_map(|seconds| Step::Tick { seconds }),
            ]
        }

        proptest! {
            /// Whatever the sessions report: `--routers` sessions are never closed, a router is
            /// reached by one session at most, at most 32 routers are discovered, each has one
            /// live session, and the tasks the actions leave running are exactly the sessions.
            #[test]
            fn one_session_per_router_and_configured_ones_stay(
                steps in proptest::collection::vec(step(), 1..120)
            ) {
                let configured = vec!["http://a:1".to_owned(), "http://a-alias:1".to_owned()];
                let mut discovery = Discovery::new(&configured);
                let mut running: BTreeSet<SessionId> = BTreeSet::new();
                let mut configured_ids: BTreeSet<SessionId> = BTreeSet::new();
                let apply = |discovery: &mut Discovery, running: &mut BTreeSet<SessionId>| {
                    for action in discovery.poll_actions() {
                        match action {
                            Action::Open { session, .. } => prop_assert!(running.insert(session)),
                            Action::Close { session } => prop_assert!(running.remove(&session)),
                        }
                    }
                    Ok(())
                };
                apply(&mut discovery, &mut running)?;
                configured_ids.extend(running.iter().copied());
                let mut now = Instant::now();
                for step in steps {
                    let live: Vec<SessionId> = running.iter().copied().collect();
                    match step {
                        Step::Authenticated { session, peer } => {
                            let session = live[session % live.len()];
                            discovery.handle_authenticated(session, &format!("peer-{peer}"));
                        }
                        Step::Down { session } => {
                            discovery.handle_down(live[session % live.len()], now);
                        }
                        Step::List { session, routers } => {
                            let list: Vec<Listed> = routers
                                .iter()
                                .map(|(peer, address)| {
                                    listed(&format!("peer-{peer}"), &format!("http://r{peer}-{address}:1"))
                                })
                                .collect();
                            discovery.handle_list(live[session % live.len()], Some(&list), now);
                        }
                        Step::Tick { seconds } => {
                            now += Duration::from_secs(u64::from(seconds));
                            discovery.handle_tick(now);
                        }
                    }
                    apply(&mut discovery, &mut running)?;
                    prop_assert!(configured_ids.is_subset(&running), "a --routers session was closed");
                    let running_now: BTreeSet<SessionId> =
                        discovery.sessions.keys().copied().collect();
                    prop_assert_eq!(&running_now, &running);
                    let peers = discovery.connected_peer_ids();
                    let unique: BTreeSet<&String> = peers.iter().collect();
                    prop_assert_eq!(unique.len(), peers.len(), "a router reached twice");
                    prop_assert!(discovery.discovered_count() <= DISCOVERED_MAX);
                    let discovered_sessions: BTreeSet<SessionId> =
                        discovery.discovered.values().map(|router| router.session).collect();
                    prop_assert_eq!(discovered_sessions.len(), discovery.discovered_count());
                    prop_assert!(discovered_sessions.is_subset(&running));
                    prop_assert_eq!(
                        running.len(),
                        configured_ids.len() + discovery.discovered_count(),
                        "every session is a --routers entry's or one discovered router's"
                    );
                }
            }
        }
    }

    #[test]
    fn two_discovered_sessions_reaching_one_router_keep_one() {
        let now = Instant::now();
        let (mut discovery, a) = started(now);
        // Two peer IDs whose addresses reach the same router (a stale list).
        discovery.handle_list(
            a,
            Some(&[listed("b", "http://b:1"), listed("c", "http://c:1")]),
            now,
        );
        let sessions = opened(&discovery.poll_actions());
        assert_eq!(
            discovery.handle_authenticated(sessions[0].0, "b"),
            Admit::Proceed
        );
        assert_eq!(
            discovery.handle_authenticated(sessions[1].0, "b"),
            Admit::Duplicate
        );
        assert_eq!(discovery.connected_peer_ids(), vec!["a", "b"]);
    }
}
