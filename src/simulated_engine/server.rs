//! The HTTP/1.1 server: accept loop, routing, and one handler per endpoint.
//!
//! Key components: [`SimState`] (models, pacing, control switches; built once and leaked so every
//! connection and body borrows it for `'static` without reference counting), [`serve`] (accept
//! loop, one task per keep-alive connection), [`handle`] (routing).
//!
//! Error handling: handlers return [`SimError`]; [`handle`] is the only place it becomes a
//! response, in the envelope of the endpoint's dialect.
//!
//! Performance: no per-request allocation beyond the request body, one response buffer, the
//! response headers and, with prefix caching on, the prompt's block keys; model lookup is a scan of a handful of names; zero delays never touch the
//! timer wheel.

use std::convert::Infallible;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::simulated_engine::body::{GenerationStream, Pacing, SimBody};
use crate::simulated_engine::engine::{ModelEngine, kv_usage_fraction};
use crate::simulated_engine::error::{Dialect, SimError};
use crate::simulated_engine::prefix_cache::BlockKey;
use crate::simulated_engine::render::{self, Answer, StreamEvents};
use crate::simulated_engine::request::{
    ChatRequest, Content, EmbeddingsRequest, Message, MessagesRequest, RerankRequest, input_tokens,
    plan_output, prompt_block_keys, prompt_tokens,
};
use crate::simulated_engine::{metrics, retrieval};

/// Largest request body accepted, in bytes: far above any realistic prompt, small enough that a
/// runaway client cannot exhaust memory.
pub const REQUEST_BODY_MAX_BYTES: usize = 32 * 1024 * 1024;

/// Marks "no pinned KV usage" in [`SimState::kv_usage_pinned_bits`]; a NaN bit pattern that a
/// validated fraction in `[0, 1]` can never have.
const KV_USAGE_NOT_PINNED: u64 = u64::MAX;

/// Everything the handlers share. Built once at start-up.
#[derive(Debug)]
pub struct SimState {
    pub models: Vec<ModelEngine>,
    /// `--ttft` and `--itl`; each request adds its own prefill to the time to first token.
    pub pacing: Pacing,
    /// Prefill time per prompt token not found in the prefix cache (`--prefill-per-token`).
    pub prefill_per_token: Duration,
    /// Natural answer length in tokens (`--output-tokens`).
    pub output_tokens_natural: u64,
    /// Components per embedding vector (`--embedding-dim`).
    pub embedding_dimension: usize,
    pub started_unix_seconds: u64,
    next_response_id: AtomicU64,
    healthy: AtomicBool,
    /// `f64::to_bits` of the KV usage pinned by `/sim/control`, or [`KV_USAGE_NOT_PINNED`].
    kv_usage_pinned_bits: AtomicU64,
    /// The `traceparent` of the last request that carried one (shown by `GET /sim/control`), so
    /// tests can see what trace context reached the engine. Locked only for such requests.
    last_traceparent: std::sync::Mutex<Option<String>>,
    /// The `anthropic-beta` of the last request that carried one (shown by `GET /sim/control`),
    /// so tests can see that the router and agent forward it. Locked only for such requests.
    last_anthropic_beta: std::sync::Mutex<Option<String>>,
}

impl SimState {
    pub fn new(
        models: Vec<ModelEngine>,
        pacing: Pacing,
        prefill_per_token: Duration,
        output_tokens_natural: u64,
        embedding_dimension: usize,
    ) -> SimState {
        SimState {
            models,
            pacing,
            prefill_per_token,
            output_tokens_natural,
            embedding_dimension,
            started_unix_seconds: unix_seconds_now(),
            next_response_id: AtomicU64::new(1),
            healthy: AtomicBool::new(true),
            kv_usage_pinned_bits: AtomicU64::new(KV_USAGE_NOT_PINNED),
            last_traceparent: std::sync::Mutex::new(None),
            last_anthropic_beta: std::sync::Mutex::new(None),
        }
    }

    fn model(&self, name: &str) -> Result<&ModelEngine, SimError> {
        self.models
            .iter()
            .find(|model| model.name == name)
            .ok_or_else(|| SimError::UnknownModel(name.to_owned()))
    }

    fn next_response_id(&self) -> u64 {
        self.next_response_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn kv_usage_pinned(&self) -> Option<f64> {
        let bits = self.kv_usage_pinned_bits.load(Ordering::Relaxed);
        (bits != KV_USAGE_NOT_PINNED).then(|| f64::from_bits(bits))
    }
}

fn unix_seconds_now() -> u64 {
    crate::base::credentials::unix_seconds(SystemTime::now())
}

/// Accepts connections forever, serving each on its own task with HTTP/1.1 keep-alive.
pub async fn serve(listener: TcpListener, state: &'static SimState) -> io::Result<()> {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Usually descriptor exhaustion under a benchmark; back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Streams write small frames; Nagle would hold them back.
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(state, request));
            if let Err(error) = http1::Builder::new()
                .keep_alive(true)
                // Benchmarks may pipeline; answer a batch of requests with one write.
                .pipeline_flush(true)
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
}

/// Routes one request and turns any refusal into an error response.
pub async fn handle(
    state: &'static SimState,
    request: Request<Incoming>,
) -> Result<Response<SimBody>, Infallible> {
    let dialect = if request.uri().path().starts_with("/v1/messages") {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    };
    for (name, last) in [
        ("traceparent", &state.last_traceparent),
        ("anthropic-beta", &state.last_anthropic_beta),
    ] {
        if let Some(value) = request.headers().get(name) {
            let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
            if let Ok(mut last) = last.lock() {
                *last = Some(text);
            }
        }
    }
    let result = route(state, request).await;
    Ok(result.unwrap_or_else(|error| {
        json_response(error.status(), SimBody::complete(error.body(dialect)))
    }))
}

async fn route(
    state: &'static SimState,
    request: Request<Incoming>,
) -> Result<Response<SimBody>, SimError> {
    let method = request.method().clone();
    let expect = |allowed: &Method| {
        if method == allowed {
            Ok(())
        } else {
            Err(SimError::MethodNotAllowed)
        }
    };
    match request.uri().path() {
        "/v1/chat/completions" => {
            expect(&Method::POST)?;
            chat_completions(state, read_body(request).await?).await
        }
        "/v1/messages" => {
            expect(&Method::POST)?;
            messages(state, read_body(request).await?).await
        }
        "/v1/messages/count_tokens" => {
            expect(&Method::POST)?;
            count_tokens(state, read_body(request).await?)
        }
        "/v1/embeddings" => {
            expect(&Method::POST)?;
            embeddings(state, read_body(request).await?)
        }
        "/v1/rerank" | "/rerank" | "/v2/rerank" => {
            expect(&Method::POST)?;
            rerank(state, read_body(request).await?)
        }
        "/v1/models" => {
            expect(&Method::GET)?;
            Ok(models(state))
        }
        "/health" => {
            expect(&Method::GET)?;
            Ok(health(state))
        }
        "/metrics" => {
            expect(&Method::GET)?;
            let text = metrics::render(&state.models, state.kv_usage_pinned());
            let mut response = Response::new(SimBody::complete(text));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(response)
        }
        "/sim/control" => match method {
            Method::GET => Ok(control_state(state)),
            Method::POST => control(state, read_body(request).await?),
            _ => Err(SimError::MethodNotAllowed),
        },
        _ => Err(SimError::UnknownPath),
    }
}

/// Reads the whole request body. A body that arrives as one frame (the common case for small
/// JSON requests) is returned as is, without copying.
async fn read_body(request: Request<Incoming>) -> Result<Bytes, SimError> {
    let too_large = SimError::BodyTooLarge {
        limit_bytes: REQUEST_BODY_MAX_BYTES,
    };
    let declared_bytes = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared_bytes.is_some_and(|bytes| bytes > REQUEST_BODY_MAX_BYTES) {
        return Err(too_large);
    }
    let mut body = request.into_body();
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|_| SimError::BodyUnreadable)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry nothing the simulator reads
        };
        match (&mut first, &mut joined) {
            (None, None) => first = Some(data),
            (Some(_), None) => {
                let first = first.take().expect("checked above");
                let mut buffer =
                    BytesMut::with_capacity(declared_bytes.unwrap_or(first.len() + data.len()));
                buffer.extend_from_slice(&first);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
            (_, Some(buffer)) => buffer.extend_from_slice(&data),
        }
        let received_bytes =
            first.as_ref().map_or(0, Bytes::len) + joined.as_ref().map_or(0, BytesMut::len);
        if received_bytes > REQUEST_BODY_MAX_BYTES {
            return Err(too_large);
        }
    }
    Ok(match (first, joined) {
        (_, Some(buffer)) => buffer.freeze(),
        (Some(first), None) => first,
        (None, None) => Bytes::new(),
    })
}

fn json_response(status: StatusCode, body: SimBody) -> Response<SimBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn event_stream_response(body: SimBody) -> Response<SimBody> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// What a generation endpoint asked for, dialect aside.
struct GenerationAsk {
    model: &'static ModelEngine,
    prompt_tokens: u64,
    /// The prompt's full prefix-cache blocks; empty when the model caches no prefixes.
    prompt_blocks: Vec<BlockKey>,
    declared_max_tokens: Option<u64>,
    stream: bool,
}

/// The block keys of a chat prompt for `model`'s prefix cache, or none (no allocation) when the
/// model does not cache prefixes.
fn prompt_blocks_for(
    model: &ModelEngine,
    messages: &[Message<'_>],
    system: Option<&Content<'_>>,
) -> Vec<BlockKey> {
    model
        .prefix_cache_block_tokens()
        .map_or_else(Vec::new, |block_tokens| {
            prompt_block_keys(messages, system, block_tokens)
        })
}

/// Shared by both chat dialects: queue for admission, then stream or generate the whole answer.
async fn generate(
    state: &'static SimState,
    ask: GenerationAsk,
    render_complete: fn(&mut BytesMut, &Answer<'_>),
    stream_events: impl FnOnce(&Answer<'static>) -> StreamEvents,
) -> Result<Response<SimBody>, SimError> {
    let mut generation = ask.model.admit(ask.prompt_tokens).await?;
    // The cache is consulted at admission, as vLLM's scheduler does when it schedules a request:
    // a request still queued neither finds nor leaves blocks.
    let cached_tokens = ask
        .model
        .look_up_prefix(&ask.prompt_blocks, ask.prompt_tokens);
    drop(ask.prompt_blocks);
    let pacing = state
        .pacing
        .with_prefill(state.prefill_per_token, ask.prompt_tokens - cached_tokens);
    let answer = Answer {
        response_id: state.next_response_id(),
        created_unix_seconds: unix_seconds_now(),
        model_json: &ask.model.name_json,
        prompt_tokens: ask.prompt_tokens,
        plan: plan_output(ask.declared_max_tokens, state.output_tokens_natural),
    };
    if ask.stream {
        let events = stream_events(&answer);
        let stream = GenerationStream::new(generation, answer, events, pacing);
        return Ok(event_stream_response(SimBody::Stream(Box::new(stream))));
    }
    let output_tokens = answer.plan.output_tokens;
    if output_tokens > 0 {
        if !pacing.time_to_first_token.is_zero() {
            tokio::time::sleep(pacing.time_to_first_token).await;
        }
        if pacing.inter_token_latency.is_zero() {
            generation.advance(output_tokens);
        } else {
            generation.advance(1);
            for _ in 1..output_tokens {
                tokio::time::sleep(pacing.inter_token_latency).await;
                generation.advance(1);
            }
        }
    }
    generation.finish();
    // Prefix, text and usage fit comfortably in this; one allocation per answer.
    let mut out =
        BytesMut::with_capacity(320 + answer.model_json.len() + 4 * output_tokens as usize);
    render_complete(&mut out, &answer);
    Ok(json_response(
        StatusCode::OK,
        SimBody::complete(out.freeze()),
    ))
}

async fn chat_completions(
    state: &'static SimState,
    body: Bytes,
) -> Result<Response<SimBody>, SimError> {
    let request: ChatRequest = serde_json::from_slice(&body)?;
    let model = state.model(&request.model)?;
    let include_usage = request.include_usage();
    let ask = GenerationAsk {
        model,
        prompt_tokens: prompt_tokens(&request.messages, None),
        prompt_blocks: prompt_blocks_for(model, &request.messages, None),
        declared_max_tokens: request.declared_max_tokens(),
        stream: request.is_stream(),
    };
    // Nothing borrowed from the body is needed past this point; free it before queueing.
    drop(request);
    drop(body);
    generate(state, ask, render::openai_completion, |answer| {
        StreamEvents::openai(answer, include_usage)
    })
    .await
}

async fn messages(state: &'static SimState, body: Bytes) -> Result<Response<SimBody>, SimError> {
    let request: MessagesRequest = serde_json::from_slice(&body)?;
    let model = state.model(&request.model)?;
    let declared_max_tokens = match request.max_tokens {
        None => return Err(SimError::MissingMaxTokens),
        // Anthropic refuses a zero limit too; an empty answer is never what a client meant.
        Some(0) => return Err(SimError::InvalidField("max_tokens: must be at least 1")),
        Some(limit) => limit,
    };
    let ask = GenerationAsk {
        model,
        prompt_tokens: prompt_tokens(&request.messages, request.system.as_ref()),
        prompt_blocks: prompt_blocks_for(model, &request.messages, request.system.as_ref()),
        declared_max_tokens: Some(declared_max_tokens),
        stream: request.stream.unwrap_or(false),
    };
    // Nothing borrowed from the body is needed past this point; free it before queueing.
    drop(request);
    drop(body);
    generate(state, ask, render::anthropic_message, |_| {
        StreamEvents::Anthropic
    })
    .await
}

fn count_tokens(state: &'static SimState, body: Bytes) -> Result<Response<SimBody>, SimError> {
    let request: MessagesRequest = serde_json::from_slice(&body)?;
    let model = state.model(&request.model)?;
    model.count_request();
    let tokens = prompt_tokens(&request.messages, request.system.as_ref());
    Ok(json_response(
        StatusCode::OK,
        SimBody::complete(format!(r#"{{"input_tokens":{tokens}}}"#)),
    ))
}

fn embeddings(state: &'static SimState, body: Bytes) -> Result<Response<SimBody>, SimError> {
    let request: EmbeddingsRequest = serde_json::from_slice(&body)?;
    let model = state.model(&request.model)?;
    let texts = request.input.texts();
    if texts.is_empty() {
        return Err(SimError::InvalidField("input must not be empty"));
    }
    model.count_request();
    let tokens = input_tokens(texts.iter().copied());
    let data: Vec<serde_json::Value> = texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            serde_json::json!({
                "object": "embedding",
                "index": index,
                "embedding": retrieval::embedding(text, state.embedding_dimension),
            })
        })
        .collect();
    let value = serde_json::json!({
        "object": "list",
        "data": data,
        "model": model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    Ok(json_response(
        StatusCode::OK,
        SimBody::complete(value.to_string()),
    ))
}

fn rerank(state: &'static SimState, body: Bytes) -> Result<Response<SimBody>, SimError> {
    let request: RerankRequest = serde_json::from_slice(&body)?;
    let model = state.model(&request.model)?;
    model.count_request();
    let documents: Vec<&str> = request
        .documents
        .iter()
        .map(|document| document.text())
        .collect();
    let tokens =
        input_tokens(std::iter::once(request.query.as_ref()).chain(documents.iter().copied()));
    let results: Vec<serde_json::Value> =
        retrieval::rerank(&request.query, &documents, request.top_n)
            .into_iter()
            .map(|(index, score)| serde_json::json!({"index": index, "relevance_score": score}))
            .collect();
    let value = serde_json::json!({
        "id": format!("rerank-sim-{}", state.next_response_id()),
        "model": model.name,
        "results": results,
        "usage": {"total_tokens": tokens},
    });
    Ok(json_response(
        StatusCode::OK,
        SimBody::complete(value.to_string()),
    ))
}

fn models(state: &'static SimState) -> Response<SimBody> {
    let data: Vec<serde_json::Value> = state
        .models
        .iter()
        .map(|model| {
            serde_json::json!({
                "id": model.name,
                "object": "model",
                "created": state.started_unix_seconds,
                "owned_by": "hivenet-sim",
            })
        })
        .collect();
    let value = serde_json::json!({"object": "list", "data": data});
    json_response(StatusCode::OK, SimBody::complete(value.to_string()))
}

fn health(state: &'static SimState) -> Response<SimBody> {
    if state.healthy.load(Ordering::Relaxed) {
        json_response(
            StatusCode::OK,
            SimBody::complete(&br#"{"status":"ok"}"#[..]),
        )
    } else {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            SimBody::complete(&br#"{"status":"unhealthy"}"#[..]),
        )
    }
}

fn control_state(state: &'static SimState) -> Response<SimBody> {
    let models: serde_json::Map<String, serde_json::Value> = state
        .models
        .iter()
        .map(|model| {
            let snapshot = model.snapshot();
            let usage = kv_usage_fraction(
                snapshot.kv_tokens,
                model.kv_capacity_tokens,
                state.kv_usage_pinned(),
            );
            (
                model.name.clone(),
                serde_json::json!({
                    "running": snapshot.running,
                    "waiting": snapshot.waiting,
                    "kv_cache_usage": usage,
                }),
            )
        })
        .collect();
    let value = serde_json::json!({
        "kv_cache_usage": state.kv_usage_pinned(),
        "healthy": state.healthy.load(Ordering::Relaxed),
        "models": models,
        "last_traceparent": state
            .last_traceparent
            .lock()
            .ok()
            .and_then(|last| last.clone()),
        "last_anthropic_beta": state
            .last_anthropic_beta
            .lock()
            .ok()
            .and_then(|last| last.clone()),
    });
    json_response(StatusCode::OK, SimBody::complete(value.to_string()))
}

/// `POST /sim/control`: `kv_cache_usage` pins the reported KV usage of every model (a number in
/// `[0, 1]`) or clears the pin (`null`); `healthy` flips `/health`. Absent fields are unchanged.
fn control(state: &'static SimState, body: Bytes) -> Result<Response<SimBody>, SimError> {
    let fields: serde_json::Map<String, serde_json::Value> =
        if body.iter().all(u8::is_ascii_whitespace) {
            serde_json::Map::new()
        } else {
            serde_json::from_slice(&body)?
        };
    // Validate everything before changing anything, so a bad request changes nothing.
    let kv_usage_update = match fields.get("kv_cache_usage") {
        None => None,
        Some(serde_json::Value::Null) => Some(KV_USAGE_NOT_PINNED),
        Some(value) => match value.as_f64() {
            Some(fraction) if (0.0..=1.0).contains(&fraction) => Some(fraction.to_bits()),
            _ => {
                return Err(SimError::InvalidField(
                    "kv_cache_usage must be null or a number in [0, 1]",
                ));
            }
        },
    };
    let healthy_update = match fields.get("healthy") {
        None => None,
        Some(serde_json::Value::Bool(healthy)) => Some(*healthy),
        Some(_) => return Err(SimError::InvalidField("healthy must be a boolean")),
    };
    if let Some(bits) = kv_usage_update {
        state.kv_usage_pinned_bits.store(bits, Ordering::Relaxed);
    }
    if let Some(healthy) = healthy_update {
        state.healthy.store(healthy, Ordering::Relaxed);
    }
    Ok(control_state(state))
}
