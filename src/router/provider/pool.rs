//! The provider transport: one dedicated thread running a tokio current-thread runtime with a
//! hyper client, which makes every provider HTTP call of the process.
//!
//! # Key components
//! - [`ProviderPool`]: the handle shards and tests hold (cheap to clone). [`ProviderPool::call`]
//!   never blocks: it checks the deadline, takes a place, and sends the request to the provider
//!   thread with a non-blocking `try_send`.
//! - [`ProviderCall`]: the future of one call's answer, a `tokio::sync::oneshot` receiver, so
//!   it can be awaited from a monoio shard, a tokio runtime or any other executor. Dropping it
//!   cancels the call (the provider thread stops waiting for the provider).
//! - [`PoolSettings`]: the bounds.
//! - [`ProviderMetrics`]: `http_client_request_duration_seconds{provider, status_code}`.
//!
//! # Architecture
//! `call` → bounded queue → dispatcher task on the provider thread → one task per call: wait
//! for a turn (at most `concurrency_max` calls talk to providers at once), translate the client
//! body, POST it, read the answer (at most `response_bytes_max` bytes), translate it back, reply.
//!
//! # Error handling
//! Refusals that need no provider thread (deadline passed, queue full, thread gone) are returned
//! by `call` itself, so they cost the caller nothing. Everything else comes back through the
//! oneshot as a [`ProviderError`]. One call makes exactly one HTTP request; nothing retries.
//!
//! # Invariants
//! - Places: `concurrency_max + queue_max`, taken in `call`, given back when the call's task
//!   ends (success, failure, timeout, or the caller dropping its [`ProviderCall`]).
//! - Time: a call waits for a turn at most until the request deadline, and its HTTP exchange
//!   ends by min(deadline, exchange start + `timeout_max`); the provider thread answers
//!   [`ProviderError::Timeout`] then, so a caller never waits past its deadline by more than
//!   scheduling delay.
//! - The API key is sent only in its auth header, marked sensitive, and never logged.
//!
//! # Performance
//! One thread is plenty: calls spend their time waiting on the provider, and translation is
//! a JSON parse and re-encode. Connections are pooled per provider host and kept alive.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::logic::policy::ProviderEngine;

use super::anthropic::API_VERSION;
use super::settings::{ApiKey, ProviderSettings};
use super::{ProviderAnswer, ProviderError, ProviderRequest, decode_response, encode_request};

/// Bounds of the provider thread. Scope: the whole process.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// Provider calls talking to a provider at once, both providers together. Default 64.
    pub concurrency_max: usize,
    /// Calls admitted beyond `concurrency_max`, waiting for a turn. Default 256. A call past
    /// both bounds fails at once with [`ProviderError::QueueFull`].
    pub queue_max: usize,
    /// The provider client timeout of one HTTP exchange, further bounded by the request
    /// deadline. Default 120 s (reference, "Timeout behavior").
    pub timeout_max: Duration,
    /// Longest provider answer read, in bytes; a longer one is a provider failure. Default
    /// 64 MiB, the cap on buffered agent answers.
    pub response_bytes_max: usize,
    /// Time to establish a TCP connection to a provider, within the deadline. Default 10 s.
    pub connect_timeout: Duration,
    /// Idle keep-alive connections kept per provider host. Default 16.
    pub idle_connections_per_host_max: usize,
}

impl Default for PoolSettings {
    fn default() -> PoolSettings {
        PoolSettings {
            concurrency_max: 64,
            queue_max: 256,
            timeout_max: Duration::from_secs(120),
            response_bytes_max: 64 * 1024 * 1024,
            connect_timeout: Duration::from_secs(10),
            idle_connections_per_host_max: 16,
        }
    }
}

type Answer = Result<ProviderAnswer, ProviderError>;

/// One call on its way to the provider thread.
struct Job {
    request: ProviderRequest,
    reply: oneshot::Sender<Answer>,
    /// Held until the call's task ends; its release admits the next call.
    _place: OwnedSemaphorePermit,
}

/// The handle to the provider thread. Clone one per shard. The thread stops when the last
/// clone is dropped; calls still running then answer [`ProviderError::Stopped`].
#[derive(Clone)]
pub struct ProviderPool {
    to_pool: mpsc::Sender<Job>,
    places: Arc<Semaphore>,
    metrics: Arc<ProviderMetrics>,
}

impl std::fmt::Debug for ProviderPool {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ProviderPool")
            .field("places_free", &self.places.available_permits())
            .finish()
    }
}

impl ProviderPool {
    /// Starts the provider thread. Fails when the runtime, the TLS configuration or the thread
    /// cannot be created, or an API key cannot be sent in an HTTP header.
    pub fn start(settings: ProviderSettings, pool: PoolSettings) -> std::io::Result<ProviderPool> {
        let concurrency_max = pool.concurrency_max.max(1);
        let places = concurrency_max.saturating_add(pool.queue_max);
        // Every queued job holds a place, so the channel never holds more than `places` jobs.
        let (to_pool, from_shards) = mpsc::channel(places);
        let metrics = Arc::new(ProviderMetrics::default());
        let exchange = Arc::new(Exchange::new(
            &settings,
            &pool,
            concurrency_max,
            metrics.clone(),
        )?);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("hivenet-provider".to_owned())
            .spawn(move || runtime.block_on(dispatch(from_shards, exchange)))?;
        Ok(ProviderPool {
            to_pool,
            places: Arc::new(Semaphore::new(places)),
            metrics,
        })
    }

    /// Asks for one provider call. Never blocks and never awaits: the refusals that need no
    /// provider thread are decided here and come back from the first poll.
    pub fn call(&self, request: ProviderRequest) -> ProviderCall {
        if request.deadline <= Instant::now() {
            return ProviderCall::refused(ProviderError::Expired);
        }
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            return ProviderCall::refused(ProviderError::QueueFull);
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            request,
            reply,
            _place: place,
        };
        match self.to_pool.try_send(job) {
            Ok(()) => ProviderCall {
                state: CallState::Waiting(answer),
            },
            Err(TrySendError::Full(_)) => ProviderCall::refused(ProviderError::QueueFull),
            Err(TrySendError::Closed(_)) => ProviderCall::refused(ProviderError::Stopped),
        }
    }

    /// The outbound request histogram, for `/metrics`.
    pub fn metrics(&self) -> &Arc<ProviderMetrics> {
        &self.metrics
    }
}

/// The answer to one [`ProviderPool::call`]. Dropping it cancels the call.
#[must_use = "a provider call does nothing useful unless its answer is awaited"]
pub struct ProviderCall {
    state: CallState,
}

enum CallState {
    Refused(Option<ProviderError>),
    Waiting(oneshot::Receiver<Answer>),
}

impl ProviderCall {
    fn refused(error: ProviderError) -> ProviderCall {
        ProviderCall {
            state: CallState::Refused(Some(error)),
        }
    }
}

impl Future for ProviderCall {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Answer> {
        match &mut self.state {
            CallState::Refused(error) => {
                Poll::Ready(Err(error.take().unwrap_or(ProviderError::Stopped)))
            }
            CallState::Waiting(answer) => Pin::new(answer)
                .poll(context)
                .map(|answer| answer.unwrap_or(Err(ProviderError::Stopped))),
        }
    }
}

/// Receives calls until every [`ProviderPool`] is dropped; one task per call.
async fn dispatch(mut from_shards: mpsc::Receiver<Job>, exchange: Arc<Exchange>) {
    while let Some(job) = from_shards.recv().await {
        tokio::spawn(run_job(exchange.clone(), job));
    }
}

async fn run_job(exchange: Arc<Exchange>, job: Job) {
    let Job {
        request,
        mut reply,
        _place,
    } = job;
    let answer = tokio::select! {
        answer = exchange.call(&request) => answer,
        () = reply.closed() => {
            tracing::debug!(
                provider = request.engine.as_str(),
                model = %request.model,
                request_id = %request_id(&request),
                "provider call cancelled: the client left"
            );
            return;
        }
    };
    match &answer {
        Ok(answer) => tracing::info!(
            provider = request.engine.as_str(),
            model = %request.model,
            request_id = %request_id(&request),
            outcome = "ok",
            elapsed_ms = answer.elapsed.as_millis() as u64,
            "provider fallback call"
        ),
        Err(error) => tracing::warn!(
            provider = request.engine.as_str(),
            model = %request.model,
            request_id = %request_id(&request),
            outcome = %error,
            "provider fallback call failed"
        ),
    }
    let _ = reply.send(answer);
}

fn request_id(request: &ProviderRequest) -> std::borrow::Cow<'_, str> {
    match &request.request_id {
        Some(id) => String::from_utf8_lossy(id),
        None => "-".into(),
    }
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Per provider: where to post and how to authenticate.
struct Endpoint {
    uri: http::Uri,
    /// `None` when the provider's key is not configured.
    headers: Option<Vec<(HeaderName, HeaderValue)>>,
}

/// What the provider thread's tasks share.
struct Exchange {
    client: HttpsClient,
    openai: Endpoint,
    anthropic: Endpoint,
    turns: Semaphore,
    timeout_max: Duration,
    response_bytes_max: usize,
    metrics: Arc<ProviderMetrics>,
}

/// Bytes of a provider error body kept for the debug log.
const ERROR_BODY_LOGGED_BYTES_MAX: usize = 512;

impl Exchange {
    fn new(
        settings: &ProviderSettings,
        pool: &PoolSettings,
        concurrency_max: usize,
        metrics: Arc<ProviderMetrics>,
    ) -> std::io::Result<Exchange> {
        let mut http = HttpConnector::new();
        // The https connector wraps this one and needs it to accept https URIs.
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(pool.connect_timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .map_err(std::io::Error::other)?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(pool.idle_connections_per_host_max)
            .build(https);
        let endpoint = |engine: ProviderEngine| -> std::io::Result<Endpoint> {
            let headers = match settings.api_key(engine) {
                None => None,
                Some(key) => Some(auth_headers(engine, key).ok_or_else(|| {
                    std::io::Error::other(format!(
                        "{} holds characters that cannot be sent in an HTTP header",
                        engine.key_variable()
                    ))
                })?),
            };
            Ok(Endpoint {
                uri: settings.base_url(engine).join(engine.endpoint_path()),
                headers,
            })
        };
        Ok(Exchange {
            client,
            openai: endpoint(ProviderEngine::OpenAi)?,
            anthropic: endpoint(ProviderEngine::Anthropic)?,
            turns: Semaphore::new(concurrency_max),
            timeout_max: pool.timeout_max,
            response_bytes_max: pool.response_bytes_max,
            metrics,
        })
    }

    fn endpoint(&self, engine: ProviderEngine) -> &Endpoint {
        match engine {
            ProviderEngine::OpenAi => &self.openai,
            ProviderEngine::Anthropic => &self.anthropic,
        }
    }

    /// One provider call, start to finish.
    async fn call(&self, request: &ProviderRequest) -> Answer {
        let endpoint = self.endpoint(request.engine);
        let headers = endpoint
            .headers
            .as_ref()
            .ok_or(ProviderError::NotConfigured)?;
        let body = encode_request(
            request.engine,
            &request.model,
            request.dialect,
            &request.body,
        )?;
        let mut builder = http::Request::post(endpoint.uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(
                USER_AGENT,
                concat!("hivenet-router/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in headers {
            builder = builder.header(name, value);
        }
        let http_request = builder
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| ProviderError::Unsupported("the provider request could not be built"))?;

        let deadline = tokio::time::Instant::from_std(request.deadline);
        let _turn = tokio::time::timeout_at(deadline, self.turns.acquire())
            .await
            .map_err(|_| ProviderError::Timeout)?
            .map_err(|_| ProviderError::Stopped)?;
        let started = Instant::now();
        let limit = tokio::time::Instant::from_std(started)
            .checked_add(self.timeout_max)
            .map_or(deadline, |cap| deadline.min(cap));
        // The status label: 0 until a response head arrives (a network failure or a timeout).
        let mut status = 0u16;
        let exchanged = tokio::time::timeout_at(limit, async {
            let response = self.client.request(http_request).await.map_err(|error| {
                tracing::debug!(provider = request.engine.as_str(), %error, "provider request failed");
                ProviderError::Network
            })?;
            status = response.status().as_u16();
            let collected = Limited::new(response.into_body(), self.response_bytes_max)
                .collect()
                .await
                .map_err(|error| {
                    if error.is::<LengthLimitError>() {
                        ProviderError::BadResponse("the provider's answer is too large")
                    } else {
                        ProviderError::Network
                    }
                })?;
            Ok::<Bytes, ProviderError>(collected.to_bytes())
        })
        .await
        .unwrap_or(Err(ProviderError::Timeout));
        let elapsed = started.elapsed();
        self.metrics.record(request.engine, status, elapsed);
        let body = exchanged?;
        if status != 200 {
            tracing::debug!(
                provider = request.engine.as_str(),
                status,
                body = %String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_LOGGED_BYTES_MAX)]),
                "provider refused the call"
            );
            return Err(ProviderError::Status(status));
        }
        let created_unix_seconds = crate::base::credentials::unix_seconds(SystemTime::now());
        let (out, usage) =
            decode_response(request.engine, request.dialect, &body, created_unix_seconds)?;
        Ok(ProviderAnswer {
            engine: request.engine,
            body: Bytes::from(out),
            usage,
            elapsed,
        })
    }
}

/// The auth headers of `engine`, or `None` when the key has bytes a header cannot carry.
fn auth_headers(engine: ProviderEngine, key: &ApiKey) -> Option<Vec<(HeaderName, HeaderValue)>> {
    let sensitive = |text: &str| {
        let mut value = HeaderValue::from_str(text).ok()?;
        value.set_sensitive(true);
        Some(value)
    };
    Some(match engine {
        ProviderEngine::OpenAi => vec![(
            AUTHORIZATION,
            sensitive(&format!("Bearer {}", key.expose()))?,
        )],
        ProviderEngine::Anthropic => vec![
            (
                HeaderName::from_static("x-api-key"),
                sensitive(key.expose())?,
            ),
            (
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static(API_VERSION),
            ),
        ],
    })
}

/// Upper bounds of the latency histogram, in seconds: from a fast cached answer to the 120 s
/// client timeout.
const LATENCY_BUCKETS_SECONDS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
];

/// `http_client_request_duration_seconds{provider, status_code}`: one observation per provider
/// HTTP exchange, `status_code="0"` for a network failure or timeout before a response head
/// (reference, "Monitor provider fallback"). Written by the provider thread, read by the
/// `/metrics` scrape; neither is a shard, so a mutex is fine. Series are bounded by the
/// statuses hyper accepts (100..=999) times two providers; in practice a handful.
#[derive(Debug, Default)]
pub struct ProviderMetrics {
    series: Mutex<Vec<LatencySeries>>,
}

#[derive(Debug, Clone)]
struct LatencySeries {
    engine: ProviderEngine,
    status: u16,
    /// Observations per bucket (not cumulative); the last slot is `+Inf`.
    buckets: [u64; LATENCY_BUCKETS_SECONDS.len() + 1],
    count: u64,
    sum_seconds: f64,
}

impl ProviderMetrics {
    pub fn record(&self, engine: ProviderEngine, status: u16, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS_SECONDS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS_SECONDS.len());
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        let index = match series
            .iter()
            .position(|s| s.engine == engine && s.status == status)
        {
            Some(index) => index,
            None => {
                series.push(LatencySeries {
                    engine,
                    status,
                    buckets: [0; LATENCY_BUCKETS_SECONDS.len() + 1],
                    count: 0,
                    sum_seconds: 0.0,
                });
                series.len() - 1
            }
        };
        let entry = &mut series[index];
        entry.buckets[bucket] += 1;
        entry.count += 1;
        entry.sum_seconds += seconds;
    }
}

/// `http_client_request_duration_seconds{provider,status_code}` (no series before the first call).
impl crate::router::metrics::Collect for ProviderMetrics {
    fn collect(&self, out: &mut Vec<crate::router::metrics::Family>) {
        let mut series = self
            .series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        series.sort_by_key(|s| (s.engine.as_str(), s.status));
        let mut family = crate::router::metrics::Family::histogram(
            "http_client_request_duration_seconds",
            "Outbound provider fallback requests by provider and status code (0: network failure or timeout).",
        );
        for s in &series {
            let (buckets, _) =
                crate::router::metrics::histogram::cumulative(&LATENCY_BUCKETS_SECONDS, &s.buckets);
            let status = s.status.to_string();
            family.histogram_sample(
                &[("provider", s.engine.as_str()), ("status_code", &status)],
                &buckets,
                s.sum_seconds,
                s.count,
            );
        }
        out.push(family);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_per_provider_and_status() {
        let metrics = ProviderMetrics::default();
        metrics.record(ProviderEngine::OpenAi, 200, Duration::from_millis(30));
        metrics.record(ProviderEngine::OpenAi, 200, Duration::from_secs(3));
        metrics.record(ProviderEngine::Anthropic, 0, Duration::from_secs(500));
        let mut families = Vec::new();
        crate::router::metrics::Collect::collect(&metrics, &mut families);
        let out = crate::router::metrics::encode(families);
        let line = |needle: &str| {
            out.lines()
                .find(|line| line.starts_with(needle))
                .unwrap_or_else(|| panic!("{needle} missing from\n{out}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_owned()
        };
        let openai = "provider=\"openai\",status_code=\"200\"";
        assert_eq!(
            line(&format!(
                "http_client_request_duration_seconds_bucket{{{openai},le=\"0.05\"}}"
            )),
            "1"
        );
        assert_eq!(
            line(&format!(
                "http_client_request_duration_seconds_bucket{{{openai},le=\"2.5\"}}"
            )),
            "1"
        );
        assert_eq!(
            line(&format!(
                "http_client_request_duration_seconds_bucket{{{openai},le=\"5\"}}"
            )),
            "2"
        );
        assert_eq!(
            line(&format!(
                "http_client_request_duration_seconds_count{{{openai}}}"
            )),
            "2"
        );
        let failed = "provider=\"anthropic\",status_code=\"0\"";
        assert_eq!(
            line(&format!(
                "http_client_request_duration_seconds_bucket{{{failed},le=\"120\"}}"
            )),
            "0"
        );
        assert_eq!(
            line(&format!(
                "http_client_request_duration_seconds_bucket{{{failed},le=\"+Inf\"}}"
            )),
            "1"
        );
    }

    #[test]
    fn auth_headers_follow_each_provider_and_are_sensitive() {
        let key = ApiKey::new("sk-1").unwrap();
        let openai = auth_headers(ProviderEngine::OpenAi, &key).unwrap();
        assert_eq!(openai[0].0, AUTHORIZATION);
        assert_eq!(openai[0].1, "Bearer sk-1");
        assert!(openai[0].1.is_sensitive());
        let anthropic = auth_headers(ProviderEngine::Anthropic, &key).unwrap();
        assert_eq!(anthropic[0].0, "x-api-key");
        assert_eq!(anthropic[0].1, "sk-1");
        assert_eq!(anthropic[1].1, "2023-06-01");
        let bad = ApiKey::new("sk\u{1}x").unwrap();
        assert!(auth_headers(ProviderEngine::OpenAi, &bad).is_none());
    }

    /// Refusals decided in `call` need no provider: an expired deadline, then a full pool.
    #[test]
    fn call_refuses_expired_deadlines_and_full_queues_at_once() {
        // A listener that never accepts: the handshake completes in the backlog and the call
        // then waits for an answer that never comes, so it keeps its place.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base_url = format!("http://{}", silent.local_addr().unwrap());
        let settings = ProviderSettings::from_lookup(|name| match name {
            super::super::settings::OPENAI_BASE_URL_VARIABLE => Some(base_url.clone()),
            super::super::settings::OPENAI_API_KEY_VARIABLE => Some("k".to_owned()),
            _ => None,
        })
        .unwrap();
        let pool = ProviderPool::start(
            settings,
            PoolSettings {
                concurrency_max: 1,
                queue_max: 0,
                ..PoolSettings::default()
            },
        )
        .unwrap();
        let request = |deadline| ProviderRequest {
            engine: ProviderEngine::OpenAi,
            model: "m".into(),
            dialect: crate::base::ids::Dialect::OpenAi,
            body: Bytes::from_static(br#"{"messages":[{"role":"user","content":"x"}]}"#),
            deadline,
            request_id: None,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let expired = pool.call(request(Instant::now())).await;
            assert_eq!(expired.unwrap_err(), ProviderError::Expired);
            // Hold the only place with a call whose answer is not awaited yet.
            let held = pool.call(request(Instant::now() + Duration::from_secs(30)));
            let refused = pool
                .call(request(Instant::now() + Duration::from_secs(30)))
                .await;
            assert_eq!(refused.unwrap_err(), ProviderError::QueueFull);
            drop(held);
        });
    }
}
