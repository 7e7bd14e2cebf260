//! The parts of a sibling map: its sites, its placements, and the endpoint kind a placement
//! covers.
//!
//! Owns: the [`Kind`] names of the map's JSON and the kind each agent capability serves.
//!
//! Must not: validate. A [`Site`] or [`Placement`] is plain data; the document checks the values
//! before it builds one.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::ids::Capability;

/// Placement kind: which endpoints a placement covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `POST /v1/chat/completions` and `POST /v1/messages`.
    Chat = 0,
    /// `POST /v1/embeddings`.
    Embedding = 1,
    /// `POST /v1/rerank`.
    Rerank = 2,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Chat, Kind::Embedding, Kind::Rerank];

    /// The kind of the endpoints that serve a capability: chat for `Llm`, embedding for
    /// `Embedding`, rerank for `Reranker`.
    pub fn of_capability(capability: Capability) -> Kind {
        match capability {
            Capability::Llm => Kind::Chat,
            Capability::Embedding => Kind::Embedding,
            Capability::Reranker => Kind::Rerank,
        }
    }

    /// The capability an agent registers for this kind (the inverse of [`Kind::of_capability`]).
    pub fn capability(self) -> Capability {
        match self {
            Kind::Chat => Capability::Llm,
            Kind::Embedding => Capability::Embedding,
            Kind::Rerank => Capability::Reranker,
        }
    }

    /// The name in the map's JSON (`chat`, `embedding`, `rerank`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Chat => "chat",
            Kind::Embedding => "embedding",
            Kind::Rerank => "rerank",
        }
    }

    /// Parses the name in the map's JSON.
    pub fn parse(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == text)
    }
}

/// A site of the deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// Unique id, `[A-Za-z0-9._-]{1,128}`; the routers' `--site-id`.
    pub id: String,
    /// Base URL without a trailing slash, e.g. `https://fr1.example.com`; redirects go to
    /// `{url}{path}`.
    pub url: String,
}

/// Where a model is served: one (model, kind, site).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub model: String,
    pub kind: Kind,
    /// A listed site id, or the local site's id.
    pub site: String,
    /// The site may hold requests for the model while it is scaled to zero.
    pub scale_from_zero: bool,
    /// Hold budget for this placement, in `(0, 1h]`; `None` uses `--wake-hold-budget`. Only used
    /// with `scale_from_zero`.
    pub hold_budget: Option<Duration>,
    /// The map writer's hint: running (`true`), asleep (`false`) or unknown (`None`). Trusted
    /// only while the hints are fresh ([`super::SiblingMap::hints_fresh`]).
    pub warm: Option<bool>,
}
