//! The read-mostly routing snapshot: every served model, its owner shard, and the pre-rendered
//! `/v1/models` body. The control core builds a new one on every registry change and sends it to
//! every shard; shards swap their `Arc` and never block the writer.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

pub use crate::base::ids::{Capability, ModelId};

/// A model as operators name it: its name and the capability it is served for. Unlike a
/// [`ModelId`] (assigned per process), it means the same model after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelKey {
    pub name: Box<str>,
    pub capability: Capability,
}

#[derive(Debug, Clone)]
pub struct ModelEntry {
    pub id: ModelId,
    pub owner_shard: usize,
    /// Agents registered and routable for this model right now.
    pub healthy_agents: u32,
    /// The model's effective routing and admission policy.
    pub policy: std::sync::Arc<crate::logic::policy::ModelPolicy>,
    /// Hold at zero: `Some(budget)` when the sibling map places this model here, for this
    /// capability, with `scale_from_zero` (the placement's `hold_budget`, else
    /// `--wake-hold-budget`). Such a model resolves even with no agent, and its requests are
    /// held while it has none.
    pub hold_budget: Option<std::time::Duration>,
    /// The model's learned tokens-per-byte ratio, published by its owner shard, read by every
    /// shard for the input estimate (`admission::estimator`). The same cell in every snapshot.
    pub tokens_per_byte: Arc<crate::logic::admission::estimator::PublishedRatio>,
}

#[derive(Debug, Default)]
pub struct RoutingSnapshot {
    /// Registry version this snapshot was built from (monotonic).
    pub version: u64,
    by_name: HashMap<Box<str>, [Option<ModelEntry>; 3]>,
    /// Each model's effective policy, by id (the owner shard's view of its models).
    policies: HashMap<ModelId, std::sync::Arc<crate::logic::policy::ModelPolicy>>,
    /// Each model's published ratio, by id (where the owner publishes what it learned).
    ratios: HashMap<ModelId, Arc<crate::logic::admission::estimator::PublishedRatio>>,
    /// `GET /v1/models` response body.
    pub models_body: Bytes,
    /// Each model's entry of that body, for keys that may see only some models.
    listing: Vec<(Box<str>, Bytes)>,
    /// The pushed sibling map (cross-site redirect and hold at zero); `None` until one is pushed.
    pub siblings: Option<Arc<crate::logic::sibling::map::SiblingMap>>,
}

impl RoutingSnapshot {
    pub fn new(
        version: u64,
        entries: impl IntoIterator<Item = (Box<str>, Capability, ModelEntry)>,
        listing: Vec<(Box<str>, Bytes)>,
    ) -> RoutingSnapshot {
        let models_body = Self::render(listing.iter().map(|(_, entry)| entry));
        let mut by_name: HashMap<Box<str>, [Option<ModelEntry>; 3]> = HashMap::new();
        let mut policies = HashMap::new();
        let mut ratios = HashMap::new();
        for (name, capability, entry) in entries {
            policies.insert(entry.id, entry.policy.clone());
            ratios.insert(entry.id, entry.tokens_per_byte.clone());
            by_name.entry(name).or_default()[capability as usize] = Some(entry);
        }
        RoutingSnapshot {
            version,
            by_name,
            policies,
            ratios,
            models_body,
            listing,
            siblings: None,
        }
    }

    /// The snapshot with the sibling map it was built with.
    pub fn with_siblings(
        mut self,
        siblings: Option<Arc<crate::logic::sibling::map::SiblingMap>>,
    ) -> RoutingSnapshot {
        self.siblings = siblings;
        self
    }

    fn render<'a>(entries: impl Iterator<Item = &'a Bytes>) -> Bytes {
        let mut body = Vec::with_capacity(256);
        body.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
        for (index, entry) in entries.enumerate() {
            if index > 0 {
                body.push(b',');
            }
            body.extend_from_slice(entry);
        }
        body.extend_from_slice(b"]}");
        Bytes::from(body)
    }

    /// The `/v1/models` body listing only the models `visible` accepts.
    pub fn models_body_for(&self, visible: impl Fn(&str) -> bool) -> Bytes {
        Self::render(
            self.listing
                .iter()
                .filter(|(name, _)| visible(name))
                .map(|(_, entry)| entry),
        )
    }

    /// The model served for `capability` under `name`, if any agent serves it.
    pub fn lookup(&self, name: &str, capability: Capability) -> Option<&ModelEntry> {
        self.by_name
            .get(name)
            .and_then(|entries| entries[capability as usize].as_ref())
    }

    /// A model's name, for logs (a scan: not for the request path).
    pub fn name_of(&self, model: ModelId) -> Option<&str> {
        self.by_name.iter().find_map(|(name, entries)| {
            entries
                .iter()
                .flatten()
                .any(|entry| entry.id == model)
                .then_some(&**name)
        })
    }

    /// Where `model`'s learned ratio is published.
    pub fn ratio_of(
        &self,
        model: ModelId,
    ) -> Option<&Arc<crate::logic::admission::estimator::PublishedRatio>> {
        self.ratios.get(&model)
    }

    /// The effective policy of a served model.
    pub fn policy_of(&self, model: ModelId) -> Option<&Arc<crate::logic::policy::ModelPolicy>> {
        self.policies.get(&model)
    }

    pub fn empty() -> Arc<RoutingSnapshot> {
        Arc::new(RoutingSnapshot {
            version: 0,
            by_name: HashMap::new(),
            policies: HashMap::new(),
            ratios: HashMap::new(),
            models_body: Self::render(std::iter::empty()),
            listing: Vec::new(),
            siblings: None,
        })
    }
}
