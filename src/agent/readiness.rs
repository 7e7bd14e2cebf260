//! Waiting for the backend before registering: health, then the served models, then (Ollama and
//! SGLang LLMs) a one-token generation per model. Each step retries with the readiness backoff
//! until it succeeds; registering earlier would send traffic to an engine still loading.

use std::time::Duration;

use tracing::{info, warn};

use super::backend::{Backend, needs_warm_up};
use super::backoff::Backoff;
use super::config::Config;

/// Returns the models to register once the backend serves them.
pub async fn wait_until_ready(config: &Config, backend: &Backend) -> Vec<String> {
    retry("backend health", || {
        backend.check_health(config.engine, &config.health_url)
    })
    .await;
    info!(backend = %config.backend_url, "backend healthy");

    let models = if config.models_override.is_empty() {
        retry("model discovery", || backend.discover_models()).await
    } else {
        config.models_override.clone()
    };
    info!(?models, "serving models");

    if needs_warm_up(config.engine, config.capability) {
        for model in &models {
            retry("warm-up generation", || {
                backend.warm_up(model, config.http_timeout)
            })
            .await;
            info!(%model, "model answered a warm-up generation");
        }
    }
    models
}

async fn retry<T, E, F, Fut>(step: &'static str, mut attempt: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Backoff::readiness();
    loop {
        match attempt().await {
            Ok(value) => return value,
            Err(error) => {
                let delay: Duration = backoff.next_delay_random();
                warn!(step, %error, ?delay, "backend not ready, retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
