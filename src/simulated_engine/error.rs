//! Every way the simulator refuses a request, and the one place a refusal becomes an HTTP response
//! in the dialect of the endpoint that was called (OpenAI or Anthropic error envelope).

use bytes::Bytes;
use hyper::StatusCode;

/// A refused request. Messages are lowercase and name the value involved.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("no such endpoint")]
    UnknownPath,
    #[error("method not allowed on this endpoint")]
    MethodNotAllowed,
    #[error("request body is not valid for this endpoint: {0}")]
    MalformedBody(#[from] serde_json::Error),
    #[error("request body exceeds {limit_bytes} bytes")]
    BodyTooLarge { limit_bytes: usize },
    #[error("request body could not be read")]
    BodyUnreadable,
    #[error("model {0} not found")]
    UnknownModel(String),
    #[error("max_tokens: field required")]
    MissingMaxTokens,
    #[error("{0}")]
    InvalidField(&'static str),
    #[error("request queue is full ({waiting_max} requests waiting)")]
    QueueFull { waiting_max: u64 },
}

/// Which API's error envelope to answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `{"error":{"message":..,"type":..}}`
    OpenAi,
    /// `{"type":"error","error":{"type":..,"message":..}}`
    Anthropic,
}

impl SimError {
    pub fn status(&self) -> StatusCode {
        match self {
            SimError::UnknownPath | SimError::UnknownModel(_) => StatusCode::NOT_FOUND,
            SimError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            SimError::MalformedBody(_)
            | SimError::BodyUnreadable
            | SimError::MissingMaxTokens
            | SimError::InvalidField(_) => StatusCode::BAD_REQUEST,
            SimError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            SimError::QueueFull { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_type(&self, dialect: Dialect) -> &'static str {
        match (self, dialect) {
            (SimError::QueueFull { .. }, Dialect::OpenAi) => "server_error",
            (SimError::QueueFull { .. }, Dialect::Anthropic) => "overloaded_error",
            (SimError::UnknownPath | SimError::UnknownModel(_), Dialect::Anthropic) => {
                "not_found_error"
            }
            (SimError::BodyTooLarge { .. }, Dialect::Anthropic) => "request_too_large",
            _ => "invalid_request_error",
        }
    }

    /// The JSON error body for this refusal.
    pub fn body(&self, dialect: Dialect) -> Bytes {
        let message = self.to_string();
        let value = match dialect {
            Dialect::OpenAi => serde_json::json!({
                "error": {"message": message, "type": self.error_type(dialect)}
            }),
            Dialect::Anthropic => serde_json::json!({
                "type": "error",
                "error": {"type": self.error_type(dialect), "message": message}
            }),
        };
        Bytes::from(serde_json::to_vec(&value).expect("json values always serialize"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_matches_openai_shape() {
        let error = SimError::UnknownModel("x".into());
        assert_eq!(error.status(), StatusCode::NOT_FOUND);
        let value: serde_json::Value =
            serde_json::from_slice(&error.body(Dialect::OpenAi)).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"error":{"message":"model x not found","type":"invalid_request_error"}})
        );
    }

    #[test]
    fn anthropic_envelope_names_the_error_type() {
        let value: serde_json::Value =
            serde_json::from_slice(&SimError::MissingMaxTokens.body(Dialect::Anthropic)).unwrap();
        assert_eq!(value["type"], "error");
        assert_eq!(value["error"]["type"], "invalid_request_error");
        assert_eq!(value["error"]["message"], "max_tokens: field required");
    }
}
