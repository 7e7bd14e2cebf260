//! The routes of the router's HTTP API: what each serves, in which dialect, and the path an agent
//! or provider is called with. Which route a request takes is `router::api::request::route`'s
//! decision; this is the vocabulary it decides in.

use crate::base::ids::{Capability, Dialect};

/// The routes the router serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    ChatCompletions,
    Messages,
    CountTokens,
    Embeddings,
    Rerank,
    Models,
    /// `/health`: liveness (200 while the process runs, 503 while it drains).
    Health,
    /// `/ready`: readiness (503 while the router cannot serve what it would otherwise serve).
    Ready,
    /// `/admin/*`: served by the control core, behind admin authentication.
    Admin,
}

impl Route {
    pub fn capability(self) -> Capability {
        match self {
            Route::Embeddings => Capability::Embedding,
            Route::Rerank => Capability::Reranker,
            _ => Capability::Llm,
        }
    }

    pub fn dialect(self) -> Dialect {
        match self {
            Route::Messages | Route::CountTokens => Dialect::Anthropic,
            _ => Dialect::OpenAi,
        }
    }

    pub fn upstream_path(self) -> &'static str {
        match self {
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Messages => "/v1/messages",
            Route::CountTokens => "/v1/messages/count_tokens",
            Route::Embeddings => "/v1/embeddings",
            Route::Rerank => "/v1/rerank",
            Route::Models => "/v1/models",
            Route::Health => "/health",
            Route::Ready => "/ready",
            Route::Admin => "/admin",
        }
    }
}
