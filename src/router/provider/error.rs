//! Every way a provider fallback call ends without an answer. `crate::router::api::refusal::provider`
//! is the one place these become client responses (reference, "Failure behavior": one outbound
//! call, no retry, HTTP 502 `backend_error` when it fails).

use thiserror::Error;

/// A failed provider fallback. Every message is static: nothing the client or the provider sent
/// is echoed back, and the API key never is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ProviderError {
    /// The client's request cannot be expressed to the provider (`stream: true`, no message
    /// with text, a body that is not a chat request). No provider call was made.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The provider's API key was not loaded at start-up. Policies naming it are refused by
    /// [`ProviderConfig::validate`](super::ProviderConfig::validate), so this means a caller
    /// skipped validation.
    #[error("provider fallback has no API key for this provider")]
    NotConfigured,
    /// The request deadline had already passed when the call was asked for: nothing was sent.
    #[error("the request deadline expired before the provider call")]
    Expired,
    /// Every call slot and queue place is taken; refused at once, nothing was sent.
    #[error("the provider call queue is full")]
    QueueFull,
    /// The provider thread has stopped (the router is shutting down).
    #[error("the provider client is not running")]
    Stopped,
    /// Connecting, TLS, or reading the answer failed.
    #[error("the provider could not be reached")]
    Network,
    /// No complete answer before min(120 s, the request's remaining deadline).
    #[error("the provider did not answer before the request deadline")]
    Timeout,
    /// The provider answered with a status other than 200.
    #[error("the provider answered with HTTP status {0}")]
    Status(u16),
    /// A 200 answer that is not a usable completion (not JSON, no choice, no text block, too
    /// large).
    #[error("{0}")]
    BadResponse(&'static str),
}

impl ProviderError {
    /// The client-facing message: static, naming the cause without provider details.
    pub fn message(&self) -> &'static str {
        match self {
            ProviderError::Unsupported(message) | ProviderError::BadResponse(message) => message,
            ProviderError::NotConfigured => "provider fallback has no API key for this provider",
            ProviderError::Expired => "the request deadline expired before the provider call",
            ProviderError::QueueFull => "the provider call queue is full",
            ProviderError::Stopped => "the provider client is not running",
            ProviderError::Network => "the provider could not be reached",
            ProviderError::Timeout => "the provider did not answer before the request deadline",
            ProviderError::Status(status) => status_message(*status),
        }
    }
}

/// What a provider status means, in the reference's list of failure causes.
fn status_message(status: u16) -> &'static str {
    match status {
        400 | 413 | 422 => "the provider refused the request as incompatible",
        401 | 403 => "the provider refused the credentials",
        404 => "the provider does not offer the configured model",
        429 => "the provider rate limit or quota was reached",
        500..=599 => "the provider failed with a server error",
        _ => "the provider answered with an unexpected status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_messages_name_the_cause() {
        assert_eq!(
            ProviderError::Status(401).message(),
            "the provider refused the credentials"
        );
        assert_eq!(
            ProviderError::Status(529).message(),
            "the provider failed with a server error"
        );
        assert_eq!(
            ProviderError::Status(429).to_string(),
            "the provider answered with HTTP status 429"
        );
        assert_eq!(
            ProviderError::Unsupported("x").message(),
            ProviderError::Unsupported("x").to_string()
        );
    }
}
