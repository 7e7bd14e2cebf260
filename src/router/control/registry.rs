//! The agent registry, owned by the control core: sessions, registrations, tunnel readiness,
//! heartbeats, and the model table. Pure state: every method takes `now` and returns the
//! [`Event`]s the control core must broadcast to shards.
//!
//! An agent is *routable* (in the pool) only when it has registered, every shard's tunnel to it is
//! up, and its last heartbeat is younger than `unhealthy_after`. Any of those lost takes it out at
//! once (`AgentDown`); all regained puts it back (`AgentUp`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::base::ids::{AgentId, Capability, Generation, ModelId, ModelNameId};
use crate::logic::admission::estimator::PublishedRatio;
use crate::logic::routing::{AgentProfile, EngineSignals};
use crate::logic::sibling::map::SiblingMap;
use crate::logic::snapshot::{ModelEntry, ModelKey, RoutingSnapshot};
use crate::router::shard::registration_feed::Membership;

mod history;
mod registration;
mod reports;
pub use history::{AgentLabels, HistoryRecord, HistoryRow};
pub use registration::Registration;
pub use reports::LiveAgent;

/// Effects for the control core to carry out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    AgentUp {
        agent: AgentId,
        /// This stay's number, new at every join (see [`Generation`]).
        generation: Generation,
        models: Arc<[ModelId]>,
        capacity: u32,
        profile: Arc<AgentProfile>,
    },
    AgentDown {
        agent: AgentId,
        models: Arc<[ModelId]>,
    },
    Signal {
        agent: AgentId,
        models: Arc<[ModelId]>,
        in_flight: u32,
        engine: EngineSignals,
    },
    /// The routable set changed: publish a new snapshot.
    SnapshotChanged,
    /// The session is over (heartbeats lost past `remove_after`, or its token expired unrefreshed).
    CloseSession { agent: AgentId },
    /// An agent joined or left the routing pool: one entry of `/admin/registration-stream`.
    Membership(Membership),
}

/// One registered agent as the admin API shows it ([`Registry::agent_views`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentView {
    pub peer_id: String,
    pub registration: Registration,
    /// In the routing pool now.
    pub routable: bool,
    /// Its last heartbeat is younger than `unhealthy_after` (the backend side of health: an
    /// agent can be heartbeating yet out of the pool, e.g. while a tunnel is down or leaving).
    pub heartbeat_fresh: bool,
    /// Requests the agent reported serving, from every router.
    pub in_flight: u32,
    pub engine: EngineSignals,
    /// Unix milliseconds of the last heartbeat.
    pub last_seen_unix_ms: i64,
    /// Heartbeats that reported the backend newly unhealthy.
    pub backend_failures: u64,
    /// The router's lifetime counters of the agent, over the models it serves now.
    pub totals: crate::logic::routing::counters::AgentTotals,
    /// The host's hardware as the last heartbeat reported it (`None` before one did).
    pub host: Option<crate::wire::proto::HostStats>,
}

#[derive(Debug)]
struct AgentRecord {
    peer_id: String,
    registration: Option<Registration>,
    models: Arc<[ModelId]>,
    tunnels_up: Vec<bool>,
    last_heartbeat: Instant,
    session_expires: Instant,
    in_flight: u32,
    engine: EngineSignals,
    /// The rest of the agent's last engine scrape, as its last routing signal carried it.
    engine_report: Option<crate::wire::proto::EngineReport>,
    /// Finished requests by reason, counted from the engine reports of this session.
    finished: crate::router::control::agent_reports::FinishTally,
    /// The agent host's hardware at its last heartbeat (bounded by `control::service`).
    host: Option<crate::wire::proto::HostStats>,
    /// The last heartbeat's `unproven_routers`.
    unproven_routers: u64,
    routable: bool,
    /// The last heartbeat said the agent's backend failed its health check: out of the pool
    /// until a heartbeat says it is healthy again.
    backend_unhealthy: bool,
    /// Heartbeats that reported the backend unhealthy after a healthy one (or the first),
    /// for `hivenet_model_backend_failure_total`.
    backend_failures: u64,
    /// The agent said it is shutting down: it stays out of the pool for the rest of its session.
    leaving: bool,
    /// Peer IDs of the routers the agent last reported a session with (its heartbeats), at most
    /// [`REPORTED_ROUTERS_MAX`].
    reported_routers: Box<[String]>,
    /// A sync round has published this session in the router's heartbeat (see
    /// [`Registry::hold_unpublished`]).
    published: bool,
}

/// Router peer IDs kept from one heartbeat: an agent keeps at most 32 discovered routers plus its
/// `--routers` entries; the rest of a longer report is a faulty agent's.
pub const REPORTED_ROUTERS_MAX: usize = 64;
/// Longest router peer ID kept (an Ed25519 peer ID is 52 characters).
const REPORTED_ROUTER_ID_BYTES_MAX: usize = 128;

#[derive(Debug, Clone, Copy)]
pub struct HealthTimes {
    pub unhealthy_after: Duration,
    pub remove_after: Duration,
}

/// The sibling map as the registry uses it: which models are held here, for the snapshot.
#[derive(Debug, Clone)]
pub struct Siblings {
    pub map: Arc<SiblingMap>,
    /// `--site-id`.
    pub local_site: String,
    /// `--wake-hold-budget`: the budget of a placement that sets none.
    pub default_budget: Duration,
}

pub struct Registry {
    shard_count: usize,
    health: HealthTimes,
    agents: HashMap<AgentId, AgentRecord>,
    model_ids: HashMap<(String, Capability), ModelId>,
    /// Every name seen, by its [`ModelNameId`].
    model_names: Vec<String>,
    name_ids: HashMap<String, ModelNameId>,
    /// Each model's learned input ratio, the same cell in every snapshot: its owner shard
    /// publishes, every shard reads (`admission::estimator::PublishedRatio`).
    ratios: HashMap<ModelId, Arc<PublishedRatio>>,
    version: u64,
    /// The pushed sibling map (`PUT /admin/sibling-map`); `None` until one is pushed.
    siblings: Option<Siblings>,
    /// The stay number the next agent to join the routing pool gets.
    next_generation: u32,
    /// Routers share occupancy budgets and the store answers: a new session joins the routing
    /// pool only once a sync round has published it in this router's heartbeat, so the other
    /// routers ask that agent before they give this router up (`credits::simulation`, seed 1724).
    hold_unpublished: bool,
    /// Per-agent lifetime counters, kept across sessions (`history`).
    history: history::History,
}

impl Registry {
    pub fn new(shard_count: usize, health: HealthTimes) -> Registry {
        Registry {
            shard_count,
            health,
            agents: HashMap::new(),
            model_ids: HashMap::new(),
            model_names: Vec::new(),
            name_ids: HashMap::new(),
            ratios: HashMap::new(),
            version: 0,
            siblings: None,
            next_generation: 0,
            hold_unpublished: false,
            history: history::History::new(shard_count),
        }
    }

    /// Installs a pushed sibling map; the caller publishes the snapshot that follows from it.
    pub fn set_siblings(&mut self, siblings: Siblings) {
        self.siblings = Some(siblings);
    }

    pub fn siblings(&self) -> Option<&Siblings> {
        self.siblings.as_ref()
    }

    /// The models the map places here with `scale_from_zero` (every capability), by name: each
    /// has a `hivenet_pending_demand` series, 0 when nothing waits.
    pub fn held_here(&self) -> Vec<(ModelId, &str)> {
        let Some(siblings) = &self.siblings else {
            return Vec::new();
        };
        siblings
            .map
            .held_here(&siblings.local_site)
            .into_iter()
            .filter_map(|(model, kind)| {
                let id = self.model_ids.get(&(model.to_owned(), kind.capability()))?;
                Some((*id, model))
            })
            .collect()
    }

    // ----- queries -----

    pub fn is_session_live(&self, agent: AgentId) -> bool {
        self.agents.contains_key(&agent)
    }

    pub fn routable_count(&self) -> usize {
        self.agents
            .values()
            .filter(|record| record.routable)
            .count()
    }

    /// The model name behind an id (every id was assigned here).
    pub fn model_name(&self, model: ModelId) -> Option<&str> {
        let name = self.model_names.get(model.name().0 as usize)?;
        let assigned = self.model_ids.get(&(name.clone(), model.capability()));
        (assigned == Some(&model)).then_some(name.as_str())
    }

    /// The name and capability behind an id: how the disk database names a model (ids are
    /// this process's own).
    pub fn model_key(&self, model: ModelId) -> Option<ModelKey> {
        self.model_name(model).map(|name| ModelKey {
            name: name.into(),
            capability: model.capability(),
        })
    }

    /// The id of a model this router has seen under this name and capability, without assigning
    /// one (usage other routers publish for a model never served here limits nothing here).
    pub fn find_model(&self, name: &str, capability: Capability) -> Option<ModelId> {
        self.model_ids.get(&(name.to_owned(), capability)).copied()
    }

    pub fn peer_id(&self, agent: AgentId) -> Option<&str> {
        self.agents
            .get(&agent)
            .map(|record| record.peer_id.as_str())
    }

    /// The union of the routers every live agent last reported a session with (see
    /// [`Registry::routers_reported`]).
    pub fn reported_routers(&self) -> HashSet<String> {
        self.agents
            .values()
            .flat_map(|record| record.reported_routers.iter().cloned())
            .collect()
    }

    /// For each agent with a live, registered session: the routers it last reported a session
    /// with (by peer ID). What the sync core asks before giving a silent router up.
    pub fn agent_reports(&self) -> HashMap<String, Box<[String]>> {
        self.agents
            .values()
            .filter(|record| record.registration.is_some())
            .map(|record| (record.peer_id.clone(), record.reported_routers.clone()))
            .collect()
    }

    /// The registered sessions, and their peer IDs sorted without duplicates: what a heartbeat
    /// publishes ([`Registry::published`] once it is in the store).
    pub fn served_sessions(&self) -> (Vec<AgentId>, Vec<String>) {
        let sessions = self
            .agents
            .iter()
            .filter(|(_, record)| record.registration.is_some())
            .map(|(agent, _)| *agent)
            .collect();
        (sessions, self.served_agents())
    }

    /// A sync round put `sessions` in this router's heartbeat: they may join the routing pool.
    pub fn published(&mut self, sessions: &[AgentId], now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        for agent in sessions {
            if let Some(record) = self.agents.get_mut(agent) {
                record.published = true;
            }
            self.update_routable(*agent, now, &mut events);
        }
        events
    }

    /// Whether new sessions wait for a heartbeat to publish them before they route (while the
    /// store answers). Turned off (the store is unreachable), every session may route: a router
    /// cut off from the store admits nothing on budgeted models once an agent connects anyway.
    pub fn hold_unpublished(&mut self, hold: bool, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        if hold == self.hold_unpublished {
            return events;
        }
        self.hold_unpublished = hold;
        let agents: Vec<AgentId> = self.agents.keys().copied().collect();
        for agent in agents {
            if hold && let Some(record) = self.agents.get_mut(&agent) {
                // Already routing (joined while the store was unreachable): its session goes into
                // the next heartbeat; it stays.
                record.published |= record.routable;
            }
            self.update_routable(agent, now, &mut events);
        }
        events
    }

    /// Peer IDs of the agents with a live session that has registered, sorted, without
    /// duplicates. A session that authenticated and never registered (an agent that found the
    /// router already reached under another address) is not served here.
    pub fn served_agents(&self) -> Vec<String> {
        let peers: BTreeSet<&str> = self
            .agents
            .values()
            .filter(|record| record.registration.is_some())
            .map(|record| record.peer_id.as_str())
            .collect();
        peers.into_iter().map(str::to_owned).collect()
    }

    /// Every registered agent (sessions that have not registered yet are left out), sorted by
    /// peer ID, with its last heartbeat turned into wall-clock time: `now` and `now_unix_ms` are
    /// the same moment on the two clocks.
    pub fn agent_views(&self, now: Instant, now_unix_ms: i64) -> Vec<AgentView> {
        let mut views: Vec<AgentView> = self
            .agents
            .values()
            .filter_map(|record| {
                let registration = record.registration.clone()?;
                let silent = now.saturating_duration_since(record.last_heartbeat);
                let silent_ms = i64::try_from(silent.as_millis()).unwrap_or(i64::MAX);
                Some(AgentView {
                    peer_id: record.peer_id.clone(),
                    registration,
                    routable: record.routable,
                    heartbeat_fresh: silent < self.health.unhealthy_after,
                    in_flight: record.in_flight,
                    engine: record.engine,
                    last_seen_unix_ms: now_unix_ms.saturating_sub(silent_ms),
                    backend_failures: record.backend_failures,
                    totals: self.history.totals(&record.peer_id, &record.models),
                    host: record.host.clone(),
                })
            })
            .collect();
        views.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
        views
    }

    // ----- inputs -----

    /// A session was issued by `Authenticate`.
    pub fn session_opened(
        &mut self,
        agent: AgentId,
        peer_id: String,
        expires: Instant,
        now: Instant,
    ) {
        self.agents.insert(
            agent,
            AgentRecord {
                peer_id,
                registration: None,
                models: Arc::from(Vec::new()),
                tunnels_up: vec![false; self.shard_count],
                last_heartbeat: now,
                session_expires: expires,
                in_flight: 0,
                engine: EngineSignals::default(),
                engine_report: None,
                finished: Default::default(),
                host: None,
                unproven_routers: 0,
                routable: false,
                backend_unhealthy: false,
                backend_failures: 0,
                leaving: false,
                reported_routers: Box::default(),
                published: false,
            },
        );
    }

    pub fn session_refreshed(&mut self, agent: AgentId, expires: Instant) {
        if let Some(record) = self.agents.get_mut(&agent) {
            record.session_expires = expires;
        }
    }

    pub fn register(
        &mut self,
        agent: AgentId,
        registration: Registration,
        now: Instant,
    ) -> Vec<Event> {
        let mut models = Vec::with_capacity(registration.models.len());
        for name in &registration.models {
            models.push(self.model_id(name, registration.capability));
        }
        let Some(record) = self.agents.get_mut(&agent) else {
            return Vec::new();
        };
        let mut events = Vec::new();
        if record.routable {
            // A re-registration with different models: leave with the old set first (and say so
            // on the registration stream, which then sees the join that follows).
            record.routable = false;
            events.push(Event::Membership(membership(record, false)));
            events.push(Event::AgentDown {
                agent,
                models: record.models.clone(),
            });
        }
        record.models = Arc::from(models);
        record.registration = Some(registration);
        record.last_heartbeat = now;
        self.update_routable(agent, now, &mut events);
        events
    }

    pub fn tunnel_up(&mut self, agent: AgentId, shard: usize, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(record) = self.agents.get_mut(&agent)
            && let Some(flag) = record.tunnels_up.get_mut(shard)
        {
            *flag = true;
            self.update_routable(agent, now, &mut events);
        }
        events
    }

    pub fn tunnel_down(&mut self, agent: AgentId, shard: usize, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(record) = self.agents.get_mut(&agent)
            && let Some(flag) = record.tunnels_up.get_mut(shard)
        {
            *flag = false;
            self.update_routable(agent, now, &mut events);
        }
        events
    }

    /// A heartbeat: the health keepalive, with whether the agent's backend passes its health
    /// check.
    pub fn heartbeat(
        &mut self,
        agent: AgentId,
        in_flight: u32,
        backend_healthy: bool,
        now: Instant,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(record) = self.agents.get_mut(&agent) {
            record.last_heartbeat = now;
            record.in_flight = in_flight;
            if !backend_healthy && !record.backend_unhealthy {
                record.backend_failures += 1;
            }
            record.backend_unhealthy = !backend_healthy;
            self.update_routable(agent, now, &mut events);
        }
        events
    }

    /// A heartbeat's `connected_router_peer_ids`: the routers the agent has a session with now.
    /// Kept up to [`REPORTED_ROUTERS_MAX`] entries; blank or over-long IDs are dropped.
    pub fn routers_reported(&mut self, agent: AgentId, peer_ids: Vec<String>) {
        if let Some(record) = self.agents.get_mut(&agent) {
            record.reported_routers = peer_ids
                .into_iter()
                .filter(|peer_id| {
                    !peer_id.trim().is_empty() && peer_id.len() <= REPORTED_ROUTER_ID_BYTES_MAX
                })
                .take(REPORTED_ROUTERS_MAX)
                .collect();
        }
    }

    pub fn signal(&mut self, agent: AgentId, in_flight: u32, engine: EngineSignals) -> Vec<Event> {
        // Routing signals carry engine data "without updating the agent's heartbeat timestamp"
        // (reference, architecture overview): only heartbeats keep an agent in the pool, so an
        // agent whose heartbeats stop leaves it after `unhealthy_after` even while signals flow.
        let mut events = Vec::new();
        if let Some(record) = self.agents.get_mut(&agent) {
            record.in_flight = in_flight;
            record.engine = engine;
            if record.routable {
                events.push(Event::Signal {
                    agent,
                    models: record.models.clone(),
                    in_flight,
                    engine,
                });
            }
        }
        events
    }

    /// The agent is shutting down: it leaves the pool at once, and its session stays open while
    /// the requests it serves finish.
    pub fn leaving(&mut self, agent: AgentId, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        if let Some(record) = self.agents.get_mut(&agent) {
            record.leaving = true;
            self.update_routable(agent, now, &mut events);
        }
        events
    }

    /// The session stream ended: the agent leaves the pool at once.
    pub fn session_closed(&mut self, agent: AgentId) -> Vec<Event> {
        let mut events = Vec::new();
        let Some(record) = self.agents.remove(&agent) else {
            return events;
        };
        if record.registration.is_some() {
            self.history
                .each(&record.peer_id, &record.models, |counters| {
                    counters.disconnected()
                });
        }
        if record.routable {
            events.push(Event::Membership(membership(&record, false)));
            events.push(Event::AgentDown {
                agent,
                models: record.models,
            });
            events.push(Event::SnapshotChanged);
        }
        events
    }

    /// Periodic health pass: heartbeat loss and session expiry.
    pub fn check_health(&mut self, now: Instant) -> Vec<Event> {
        let mut events = Vec::new();
        let agents: Vec<AgentId> = self.agents.keys().copied().collect();
        for agent in agents {
            let record = &self.agents[&agent];
            let silent = now.saturating_duration_since(record.last_heartbeat);
            if silent >= self.health.remove_after || now >= record.session_expires {
                events.push(Event::CloseSession { agent });
                continue;
            }
            self.update_routable(agent, now, &mut events);
        }
        events
    }

    /// Builds the snapshot for shards from the current routable set, each model with its
    /// effective policy from `policies`.
    pub fn snapshot(&mut self, policies: &crate::logic::policy::PolicySet) -> Arc<RoutingSnapshot> {
        self.version += 1;
        struct Summary {
            healthy: u32,
            capacity: u64,
            engines: BTreeSet<String>,
            regions: BTreeSet<String>,
        }
        let mut summaries: HashMap<ModelId, Summary> = HashMap::new();
        for record in self.agents.values().filter(|record| record.routable) {
            let registration = record
                .registration
                .as_ref()
                .expect("routable implies registered");
            for model in record.models.iter() {
                let summary = summaries.entry(*model).or_insert_with(|| Summary {
                    healthy: 0,
                    capacity: 0,
                    engines: BTreeSet::new(),
                    regions: BTreeSet::new(),
                });
                summary.healthy += 1;
                summary.capacity += u64::from(registration.capacity);
                summary.engines.insert(registration.engine.clone());
                summary.regions.insert(registration.region.clone());
            }
        }
        // Hold at zero: the models placed here with `scale_from_zero` resolve even with no
        // agent, with their hold budget.
        let placed: Vec<(String, Capability, Duration)> = match &self.siblings {
            None => Vec::new(),
            Some(siblings) => siblings
                .map
                .held_here(&siblings.local_site)
                .into_iter()
                .map(|(model, kind)| {
                    let budget = siblings
                        .map
                        .hold_here(&siblings.local_site, model, kind)
                        .flatten()
                        .unwrap_or(siblings.default_budget);
                    (model.to_owned(), kind.capability(), budget)
                })
                .collect(),
        };
        let mut holds: HashMap<ModelId, Duration> = HashMap::new();
        for (name, capability, budget) in placed {
            holds.insert(self.model_id(&name, capability), budget);
        }
        let mut ids: Vec<&ModelId> = summaries.keys().collect();
        ids.sort();
        let mut listing = Vec::with_capacity(ids.len());
        let mut entries = Vec::with_capacity(ids.len());
        for id in ids {
            let (name, capability) = (&self.model_names[id.name().0 as usize], &id.capability());
            let summary = &summaries[id];
            let entry = serde_json::json!({
                "id": name,
                "object": "model",
                "owned_by": "hivenet-router",
                "capability": capability.as_str(),
                "agents": {
                    "total": summary.healthy,
                    "healthy": summary.healthy,
                    "total_capacity": summary.capacity,
                    "engines": summary.engines,
                    "regions": summary.regions,
                },
            });
            listing.push((
                name.clone().into_boxed_str(),
                Bytes::from(
                    serde_json::to_vec(&entry).expect("serializing a json value cannot fail"),
                ),
            ));
            entries.push((
                name.clone().into_boxed_str(),
                *capability,
                ModelEntry {
                    id: *id,
                    owner_shard: id.owner(self.shard_count),
                    healthy_agents: summary.healthy,
                    policy: policies.effective(name),
                    hold_budget: holds.get(id).copied(),
                    // Every id was assigned by `model_id`, with its cell.
                    tokens_per_byte: self.ratios.get(id).cloned().unwrap_or_default(),
                },
            ));
        }
        // A model with no routable agent whose policy names a provider fallback stays resolvable
        // (with no agent and no `/v1/models` entry), so its requests reach the provider instead
        // of a 404: the models named policies claim, and every model agents have served.
        let mut provider_only: BTreeSet<ModelId> = BTreeSet::new();
        let claimed: Vec<String> = policies
            .named()
            .values()
            .filter(|entry| entry.policy.fallback_provider.is_some())
            .flat_map(|entry| entry.models().iter().cloned())
            .collect();
        for name in claimed {
            provider_only.insert(self.model_id(&name, Capability::Llm));
        }
        for ((name, capability), id) in &self.model_ids {
            if *capability == Capability::Llm
                && policies.effective_ref(name).fallback_provider.is_some()
            {
                provider_only.insert(*id);
            }
        }
        let mut asleep: BTreeSet<ModelId> = holds.keys().copied().collect();
        asleep.extend(provider_only);
        for id in asleep {
            if summaries.contains_key(&id) {
                continue;
            }
            let (name, capability) = (&self.model_names[id.name().0 as usize], &id.capability());
            entries.push((
                name.clone().into_boxed_str(),
                *capability,
                ModelEntry {
                    id,
                    owner_shard: id.owner(self.shard_count),
                    healthy_agents: 0,
                    policy: policies.effective(name),
                    hold_budget: holds.get(&id).copied(),
                    tokens_per_byte: self.ratios.get(&id).cloned().unwrap_or_default(),
                },
            ));
        }
        let siblings = self.siblings.as_ref().map(|siblings| siblings.map.clone());
        Arc::new(RoutingSnapshot::new(self.version, entries, listing).with_siblings(siblings))
    }

    // ----- internals -----

    fn model_id(&mut self, name: &str, capability: Capability) -> ModelId {
        let key = (name.to_owned(), capability);
        if let Some(id) = self.model_ids.get(&key) {
            return *id;
        }
        let name = match self.name_ids.get(name) {
            Some(name) => *name,
            None => {
                let id = ModelNameId(self.model_names.len() as u32);
                self.model_names.push(name.to_owned());
                self.name_ids.insert(name.to_owned(), id);
                id
            }
        };
        let id = ModelId::new(name, capability);
        self.model_ids.insert(key, id);
        self.ratios.insert(id, Arc::default());
        id
    }

    fn update_routable(&mut self, agent: AgentId, now: Instant, events: &mut Vec<Event>) {
        let Some(record) = self.agents.get_mut(&agent) else {
            return;
        };
        let healthy =
            now.saturating_duration_since(record.last_heartbeat) < self.health.unhealthy_after;
        let should_route = healthy
            && !record.backend_unhealthy
            && !record.leaving
            && record.registration.is_some()
            && record.tunnels_up.iter().all(|up| *up)
            && (record.published || !self.hold_unpublished);
        if should_route == record.routable {
            return;
        }
        record.routable = should_route;
        if should_route {
            let registration = record.registration.as_ref();
            let capacity = registration.map_or(0, |r| r.capacity);
            let counters = match registration {
                Some(registration) => {
                    self.history
                        .counters_for(&record.peer_id, &record.models, registration)
                }
                None => Default::default(),
            };
            let profile = Arc::new(AgentProfile {
                peer_id: record.peer_id.as_str().into(),
                engine: registration.map_or("", |r| r.engine.as_str()).into(),
                region: registration.map_or("", |r| r.region.as_str()).into(),
                tags: registration
                    .map_or_else(Vec::new, |r| r.tags.clone())
                    .into_boxed_slice(),
                deployment_id: registration.map_or("", |r| r.deployment_id.as_str()).into(),
                organization: registration.map_or("", |r| r.organization.as_str()).into(),
                machine: registration.map_or("", |r| r.machine.as_str()).into(),
                counters,
            });
            let generation = Generation(self.next_generation);
            self.next_generation = self.next_generation.wrapping_add(1);
            events.push(Event::AgentUp {
                agent,
                generation,
                models: record.models.clone(),
                capacity,
                profile,
            });
            if record.in_flight > 0 || record.engine != EngineSignals::default() {
                events.push(Event::Signal {
                    agent,
                    models: record.models.clone(),
                    in_flight: record.in_flight,
                    engine: record.engine,
                });
            }
        } else {
            if !healthy {
                // Out of the pool because its heartbeats stopped: `hivenet_agent_failure_total`.
                self.history
                    .each(&record.peer_id, &record.models, |counters| {
                        counters.heartbeat_failed()
                    });
            }
            events.push(Event::AgentDown {
                agent,
                models: record.models.clone(),
            });
        }
        events.push(Event::Membership(membership(record, should_route)));
        events.push(Event::SnapshotChanged);
    }
}

fn membership(record: &AgentRecord, joined: bool) -> Membership {
    let registration = record.registration.as_ref();
    Membership {
        joined,
        peer_id: record.peer_id.clone(),
        deployment_id: registration.map_or_else(String::new, |r| r.deployment_id.clone()),
        replica_id: registration.map_or_else(String::new, |r| r.replica_id.clone()),
    }
}

pub mod metrics;

#[cfg(test)]
mod tests;
