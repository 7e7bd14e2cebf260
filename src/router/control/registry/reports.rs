//! The registry's per-agent metric inputs and views: the host and engine reports agents send
//! (kept as the latest only), what `/metrics` reads of them ([`LiveAgent`]) and of the lifetime
//! history (`history`), and the history's reset.
//!
//! Must not: change routing. Nothing here moves an agent in or out of the pool.

use std::collections::HashSet;

use crate::base::ids::{AgentId, ModelId};
use crate::logic::routing::EngineSignals;

use super::Registry;
use super::history::{AgentLabels, HistoryRow};

/// What `/metrics` shows of one registered agent now (`Registry::live_agents`).
#[derive(Debug, Clone, PartialEq)]
pub struct LiveAgent {
    pub peer_id: String,
    pub models: Vec<String>,
    pub labels: AgentLabels,
    /// Requests the agent reported serving over its declared capacity.
    pub capacity_utilization: f64,
    pub engine: EngineSignals,
    pub engine_report: Option<crate::wire::proto::EngineReport>,
    pub finished: crate::router::control::agent_reports::FinishTally,
    pub host: Option<crate::wire::proto::HostStats>,
    /// Routers the agent dialled that failed the challenge since it started (its heartbeat).
    pub unproven_routers: u64,
}

/// The registry's per-agent metrics: its lifetime history and what agents report now.
impl Registry {
    /// Every (agent, model) pooled since the last reset, with its lifetime totals and the
    /// model's name (rows of models without a name are left out).
    pub fn agent_history(&self) -> Vec<(HistoryRow, &str)> {
        self.history
            .rows()
            .into_iter()
            .filter_map(|row| {
                let name = self.model_name(row.model)?;
                Some((row, name))
            })
            .collect()
    }

    /// Every (agent, model) of the history with its model's name and capability, for the disk
    /// database.
    pub fn history_records(&self) -> Vec<super::history::HistoryRecord> {
        self.history
            .rows()
            .into_iter()
            .filter_map(|row| {
                Some(super::history::HistoryRecord {
                    model: self.model_key(row.model)?,
                    peer_id: row.peer_id,
                    labels: row.labels,
                    totals: row.totals,
                })
            })
            .collect()
    }

    /// Totals an earlier run of the router kept in the disk database (start-up), each added to
    /// its agent's history.
    pub fn restore_history(&mut self, records: Vec<super::history::HistoryRecord>) {
        for record in records {
            let model = self.model_id(&record.model.name, record.model.capability);
            self.history
                .restore(&record.peer_id, model, record.labels, &record.totals);
        }
    }

    /// History entries dropped to keep the history bounded.
    pub fn history_dropped(&self) -> u64 {
        self.history.dropped()
    }

    /// Every registered agent's current state for `/metrics`, sorted by peer ID.
    pub fn live_agents(&self) -> Vec<LiveAgent> {
        let mut agents: Vec<LiveAgent> = self
            .agents
            .values()
            .filter_map(|record| {
                let registration = record.registration.as_ref()?;
                Some(LiveAgent {
                    peer_id: record.peer_id.clone(),
                    models: registration.models.clone(),
                    labels: AgentLabels::of(registration),
                    capacity_utilization: f64::from(record.in_flight)
                        / f64::from(registration.capacity.max(1)),
                    engine: record.engine,
                    engine_report: record.engine_report.clone(),
                    unproven_routers: record.unproven_routers,
                    finished: record.finished.clone(),
                    host: record.host.clone(),
                })
            })
            .collect();
        agents.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
        agents
    }

    /// `POST /admin/metrics/reset`: the per-agent lifetime counters back to zero; agents not
    /// registered now are forgotten.
    pub fn reset_agent_history(&mut self) {
        let registered: HashSet<(String, ModelId)> = self
            .agents
            .values()
            .filter(|record| record.registration.is_some())
            .flat_map(|record| {
                record
                    .models
                    .iter()
                    .map(|model| (record.peer_id.clone(), *model))
            })
            .collect();
        self.history
            .reset(|peer_id, model| registered.contains(&(peer_id.to_owned(), model)));
    }

    /// The hardware a heartbeat reported (already bounded by the caller).
    pub fn host_reported(&mut self, agent: AgentId, host: Option<crate::wire::proto::HostStats>) {
        if let Some(record) = self.agents.get_mut(&agent) {
            record.host = host;
        }
    }

    /// A heartbeat's count of routers the agent found unable to prove they belong to the site.
    pub fn unproven_routers_reported(&mut self, agent: AgentId, count: u64) {
        if let Some(record) = self.agents.get_mut(&agent) {
            record.unproven_routers = count;
        }
    }

    /// The engine report a routing signal carried (already bounded by the caller).
    pub fn engine_reported(
        &mut self,
        agent: AgentId,
        report: Option<crate::wire::proto::EngineReport>,
    ) {
        if let Some(record) = self.agents.get_mut(&agent) {
            if let Some(report) = &report {
                record.finished.observe(&report.finished);
            }
            record.engine_report = report;
        }
    }
}
