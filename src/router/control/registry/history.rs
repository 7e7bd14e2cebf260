//! Per-agent lifetime history, owned by the registry: the router's counters of every (agent peer
//! ID, model) that has been in the routing pool, with the labels it last registered. Kept across
//! sessions, so an agent that registers again continues its totals (observability reference,
//! "Persistence and resets": the reference reseeds them from BadgerDB; this router keeps them in
//! memory for the life of the process). `POST /admin/metrics/reset` zeroes them and forgets the
//! agents not registered now.
//!
//! Memory: one entry per (peer ID, model) pooled since the last reset, and at most
//! [`HISTORY_ENTRIES_MAX`] once agents have left: past it, a new entry replaces the one of an
//! agent no longer in the routing pool that registered least recently, counted in
//! `hivenet_agent_history_dropped_total`. Agents that come back under new peer IDs (a fresh
//! identity at every restart) would otherwise grow it for good. Entries of pooled agents are never
//! dropped; they are bounded by the agents in the pool.

use std::collections::HashMap;
use std::sync::Arc;

use crate::base::ids::ModelId;
use crate::logic::routing::counters::{AgentCounters, AgentTotals, CountersByModel};

use super::registration::Registration;

/// The labels of one agent's series, as it last registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLabels {
    pub engine: String,
    pub region: String,
    pub organization: String,
    pub machine: String,
}

impl AgentLabels {
    pub fn of(registration: &Registration) -> AgentLabels {
        AgentLabels {
            engine: registration.engine.clone(),
            region: registration.region.clone(),
            organization: registration.organization.clone(),
            machine: registration.machine.clone(),
        }
    }
}

#[derive(Debug)]
struct Entry {
    counters: Arc<AgentCounters>,
    labels: AgentLabels,
    /// The registration that last asked for this entry, in the history's own order: the entry
    /// of a gone agent with the smallest is dropped first.
    registered: u64,
}

/// One (agent, model) of the history, for `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRow {
    pub peer_id: String,
    pub model: ModelId,
    pub labels: AgentLabels,
    pub totals: AgentTotals,
}

/// One (agent, model) of the history as the disk database keeps it: the model by name, since ids
/// are one process's own.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryRecord {
    pub peer_id: String,
    pub model: crate::logic::snapshot::ModelKey,
    pub labels: AgentLabels,
    pub totals: AgentTotals,
}

/// Entries past which a new one replaces an entry of an agent that has left (module doc).
pub const HISTORY_ENTRIES_MAX: usize = 4096;

#[derive(Debug)]
pub struct History {
    shard_count: usize,
    entries: HashMap<(String, ModelId), Entry>,
    registrations: u64,
    /// Entries dropped for room since the router started (a reset does not clear it: it counts
    /// what the history could not keep).
    dropped: u64,
}

impl History {
    pub fn new(shard_count: usize) -> History {
        History {
            shard_count,
            entries: HashMap::new(),
            registrations: 0,
            dropped: 0,
        }
    }

    /// The counters of `peer_id` for each of `models`, the ones it had before when it was pooled
    /// earlier; the labels become the ones of `registration`.
    pub fn counters_for(
        &mut self,
        peer_id: &str,
        models: &[ModelId],
        registration: &Registration,
    ) -> CountersByModel {
        let labels = AgentLabels::of(registration);
        self.registrations += 1;
        let registered = self.registrations;
        let counters = models
            .iter()
            .map(|&model| {
                let key = (peer_id.to_owned(), model);
                if !self.entries.contains_key(&key) {
                    self.make_room();
                }
                let entry = self.entries.entry(key).or_insert_with(|| Entry {
                    counters: Arc::new(AgentCounters::new(self.shard_count)),
                    labels: labels.clone(),
                    registered,
                });
                entry.labels = labels.clone();
                entry.registered = registered;
                (model, entry.counters.clone())
            })
            .collect();
        CountersByModel(counters)
    }

    /// At [`HISTORY_ENTRIES_MAX`], forgets the entry of an agent no longer pooled (its counters
    /// are held by the history alone: the routing pool holds a pooled agent's) that registered
    /// least recently. Nothing when every entry belongs to a pooled agent. A scan of the
    /// entries, made only when a new entry finds the history full.
    fn make_room(&mut self) {
        if self.entries.len() < HISTORY_ENTRIES_MAX {
            return;
        }
        let oldest_gone = self
            .entries
            .iter()
            .filter(|(_, entry)| Arc::strong_count(&entry.counters) == 1)
            .min_by_key(|(_, entry)| entry.registered)
            .map(|(key, _)| key.clone());
        if let Some(key) = oldest_gone {
            self.entries.remove(&key);
            self.dropped += 1;
        }
    }

    /// Totals an earlier run of the router kept for `peer_id` and `model` (start-up): added to
    /// the entry, made as the oldest when there is none (the entries of this run's agents are
    /// kept before it).
    pub fn restore(
        &mut self,
        peer_id: &str,
        model: ModelId,
        labels: AgentLabels,
        totals: &AgentTotals,
    ) {
        let key = (peer_id.to_owned(), model);
        if !self.entries.contains_key(&key) {
            self.make_room();
        }
        let shard_count = self.shard_count;
        let entry = self.entries.entry(key).or_insert_with(|| Entry {
            counters: Arc::new(AgentCounters::new(shard_count)),
            labels,
            registered: 0,
        });
        entry.counters.add_totals(totals);
    }

    /// Entries dropped for room since the router started.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Applies `count` to the counters of `peer_id` for each of `models` it has any for.
    pub fn each(&self, peer_id: &str, models: &[ModelId], mut count: impl FnMut(&AgentCounters)) {
        for &model in models {
            if let Some(entry) = self.entries.get(&(peer_id.to_owned(), model)) {
                count(&entry.counters);
            }
        }
    }

    /// `peer_id`'s totals over `models` (the routing table's `universal` section): counts
    /// summed; the latency of the first model that has a sample (the reference keeps one
    /// estimator per agent; this router keeps one per agent and model).
    pub fn totals(&self, peer_id: &str, models: &[ModelId]) -> AgentTotals {
        let mut sum = AgentTotals::default();
        self.each(peer_id, models, |counters| {
            let totals = counters.totals();
            sum.success += totals.success;
            sum.failed += totals.failed;
            sum.input_tokens += totals.input_tokens;
            sum.output_tokens += totals.output_tokens;
            sum.disconnections += totals.disconnections;
            sum.rejected += totals.rejected;
            for (sum, count) in sum.resets.iter_mut().zip(totals.resets) {
                *sum += count;
            }
            sum.failures += totals.failures;
            sum.latency_ms = sum.latency_ms.or(totals.latency_ms);
        });
        sum
    }

    /// `POST /admin/metrics/reset`: every entry zeroed; those `registered` says no to are
    /// forgotten (their series go).
    pub fn reset(&mut self, registered: impl Fn(&str, ModelId) -> bool) {
        self.entries
            .retain(|(peer_id, model), _| registered(peer_id, *model));
        for entry in self.entries.values() {
            entry.counters.reset();
        }
    }

    /// Every entry, sorted by peer ID then model.
    pub fn rows(&self) -> Vec<HistoryRow> {
        let mut rows: Vec<HistoryRow> = self
            .entries
            .iter()
            .map(|((peer_id, model), entry)| HistoryRow {
                peer_id: peer_id.clone(),
                model: *model,
                labels: entry.labels.clone(),
                totals: entry.counters.totals(),
            })
            .collect();
        rows.sort_by(|a, b| (&a.peer_id, a.model.0).cmp(&(&b.peer_id, b.model.0)));
        rows
    }
}
