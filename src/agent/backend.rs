//! The agent's own calls to the local engine: health, model discovery, warm-up and the metrics
//! scrape. Forwarded client traffic does not come through here (see `agent::forward`).
//!
//! Every call has a deadline; none retries. The retry policy belongs to the caller
//! (`agent::readiness`, `agent::poller`).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::config::{Capability, Engine};

/// Deadline of a health check, discovery call or metrics scrape (the reference gives scrapes a
/// five-second timeout).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response body the agent reads from its own probes; `/metrics` of a busy vLLM is a few
/// hundred KB.
const PROBE_BODY_BYTES_MAX: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("backend url {0:?} is invalid")]
    BadUrl(String),
    #[error("backend request to {url} failed: {source}")]
    Request {
        url: String,
        source: hyper_util::client::legacy::Error,
    },
    #[error("backend request to {url} timed out after {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("backend answered {status} to {url}")]
    Status { url: String, status: StatusCode },
    #[error("backend body from {url} could not be read: {reason}")]
    Body { url: String, reason: String },
    #[error("backend model list from {url} is not an OpenAI list: {reason}")]
    ModelList { url: String, reason: String },
    #[error("backend at {0} serves no model")]
    NoModels(String),
}

#[derive(Clone)]
pub struct Backend {
    client: Client<HttpConnector, Full<Bytes>>,
    /// Base URL without a trailing slash.
    base: String,
}

impl Backend {
    pub fn new(base: &str) -> Backend {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(PROBE_TIMEOUT));
        Backend {
            client: Client::builder(TokioExecutor::new()).build(connector),
            base: base.to_owned(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends one request and reads the whole body; a non-2xx status is an error.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Bytes, BackendError> {
        let mut builder = Request::builder().method(method).uri(url);
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|_| BackendError::BadUrl(url.to_owned()))?;
        let exchange = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|source| BackendError::Request {
                        url: url.to_owned(),
                        source,
                    })?;
            let status = response.status();
            let limited = http_body_util::Limited::new(response.into_body(), PROBE_BODY_BYTES_MAX);
            let bytes = limited
                .collect()
                .await
                .map_err(|error| BackendError::Body {
                    url: url.to_owned(),
                    reason: error.to_string(),
                })?
                .to_bytes();
            if !status.is_success() {
                return Err(BackendError::Status {
                    url: url.to_owned(),
                    status,
                });
            }
            Ok(bytes)
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| BackendError::Timeout {
                url: url.to_owned(),
                timeout,
            })?
    }

    /// One health probe as the engine adapter defines it.
    pub async fn check_health(&self, engine: Engine, health_url: &str) -> Result<(), BackendError> {
        match engine {
            Engine::Custom => self
                .call(Method::GET, health_url, None, PROBE_TIMEOUT)
                .await
                .map(drop),
            // Ollama has no /health; /api/tags answers once the server is up, `/` on old builds.
            Engine::Ollama => match self
                .call(Method::GET, &self.url("/api/tags"), None, PROBE_TIMEOUT)
                .await
            {
                Ok(_) => Ok(()),
                Err(_) => self
                    .call(Method::GET, &self.url("/"), None, PROBE_TIMEOUT)
                    .await
                    .map(drop),
            },
            Engine::Vllm | Engine::Sglang | Engine::Llamacpp | Engine::Infinity => self
                .call(Method::GET, &self.url("/health"), None, PROBE_TIMEOUT)
                .await
                .map(drop),
        }
    }

    /// Model IDs from `GET /v1/models`.
    pub async fn discover_models(&self) -> Result<Vec<String>, BackendError> {
        let url = self.url("/v1/models");
        let body = self.call(Method::GET, &url, None, PROBE_TIMEOUT).await?;
        let models = parse_model_list(&body).map_err(|reason| BackendError::ModelList {
            url: url.clone(),
            reason,
        })?;
        if models.is_empty() {
            return Err(BackendError::NoModels(self.base.clone()));
        }
        Ok(models)
    }

    /// A one-token chat completion: Ollama and SGLang answer health before the model is loaded,
    /// and only a real generation proves the model serves.
    pub async fn warm_up(&self, model: &str, timeout: Duration) -> Result<(), BackendError> {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1,
            "stream": false,
        });
        self.call(
            Method::POST,
            &self.url("/v1/chat/completions"),
            Some(body.to_string().into_bytes()),
            timeout,
        )
        .await
        .map(drop)
    }

    /// The raw Prometheus text of `GET /metrics`.
    pub async fn scrape_metrics(&self) -> Result<String, BackendError> {
        let url = self.url("/metrics");
        let body = self.call(Method::GET, &url, None, PROBE_TIMEOUT).await?;
        String::from_utf8(body.to_vec()).map_err(|_| BackendError::Body {
            url,
            reason: "not UTF-8".to_owned(),
        })
    }
}

/// Whether this engine and capability need a warm-up generation before registering.
pub fn needs_warm_up(engine: Engine, capability: Capability) -> bool {
    matches!(engine, Engine::Ollama | Engine::Sglang) && capability == Capability::Llm
}

/// The `data[].id` of an OpenAI model list, in order, without duplicates.
pub fn parse_model_list(body: &[u8]) -> Result<Vec<String>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| format!("invalid JSON: {error}"))?;
    let data = value
        .get("data")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| "no \"data\" array".to_owned())?;
    let mut models: Vec<String> = Vec::with_capacity(data.len());
    for entry in data {
        let id = entry
            .get("id")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| "an entry has no string \"id\"".to_owned())?;
        if !id.is_empty() && !models.iter().any(|known| known == id) {
            models.push(id.to_owned());
        }
    }
    Ok(models)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_list_is_read_from_data_ids() {
        let body = br#"{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","owned_by":"vllm","max_model_len":8192},{"id":"lora-a","object":"model"},{"id":"lora-a"}]}"#;
        assert_eq!(
            parse_model_list(body).unwrap(),
            vec!["meta-llama/Llama-3.1-8B-Instruct", "lora-a"]
        );
        assert_eq!(
            parse_model_list(br#"{"data":[]}"#).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn malformed_model_lists_are_refused() {
        assert!(parse_model_list(b"not json").is_err());
        assert!(parse_model_list(br#"{"models":[]}"#).is_err());
        assert!(parse_model_list(br#"{"data":[{"name":"x"}]}"#).is_err());
    }

    #[test]
    fn warm_up_only_for_ollama_and_sglang_llms() {
        assert!(needs_warm_up(Engine::Ollama, Capability::Llm));
        assert!(needs_warm_up(Engine::Sglang, Capability::Llm));
        assert!(!needs_warm_up(Engine::Sglang, Capability::Embedding));
        assert!(!needs_warm_up(Engine::Vllm, Capability::Llm));
    }
}
