//! Phases 7 and 8: forward the request over this shard's tunnel to the agent holding the slot,
//! send the response back to the client, read exact usage on the way, and settle.
//!
//! Streams are passed through event by event, byte for byte, flushed as each tunnel data frame
//! arrives. The only change ever made to a stream: when the router itself asked the backend for
//! usage (`stream_options.include_usage`, for an OpenAI stream whose client did not ask), the
//! usage-only chunk that answer adds is removed before the client sees it.
//!
//! The slot is released when the response has ended — after the last byte of a stream, not at the
//! headers — or when the client goes away, which also resets the tunnel stream so the agent
//! cancels the backend request.

use std::rc::Rc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use futures_util::future::Either;

use crate::base::ids::Dialect;
use crate::base::latch::race;
use crate::base::spare_buffers;
use crate::logic::limits::Delivery;
use crate::logic::routing::counters::ResetReason;
use crate::logic::usage::{
    self, AnthropicStreamScan, OpenAiEvent, OpenAiStreamScan, SseSplitter, Usage,
};
use crate::router::accounting::RequestFacts;
use crate::router::accounting::tenants::{KeyLabels, Phase};
use crate::router::api::request::ClientRequest;
use crate::router::api::sink::{ClientGone, Sink};
use crate::router::error::Rejection;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::guards::{QuotaCharge, Slot};
use crate::router::shard::owner::OccupancyUpdate;
use crate::router::shard::state::Shard;
use crate::wire::http::fields::{PromptShape, RequestFields, request_with_include_usage};
use crate::wire::http::route::Route;

/// Largest non-streamed response body the router buffers; a larger one is a backend error.
const BUFFERED_BODY_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest single SSE event the usage scanner buffers; past it the stream is passed through raw.
const SSE_EVENT_BYTES_MAX: usize = 1024 * 1024;

/// One per finished inference request: what later phases (limits, estimator, audit) consume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEvent {
    pub route: Route,
    pub status: u16,
    /// Exact usage as the backend reported it; `None` when the response carried none.
    pub usage: Option<Usage>,
    /// The response ended early (client gone or upstream failed mid-stream).
    pub truncated: bool,
}

/// What settling a response needs: the one per-request context the response phases share.
struct Settling<'a> {
    shard: &'a Shard,
    facts: &'a mut RequestFacts,
    slot: &'a Slot,
    /// What the input estimate was computed from, to train the estimator with exact usage.
    prompt: PromptShape,
    quota: &'a mut QuotaCharge,
    route: Route,
    status: u16,
}

impl Settling<'_> {
    /// Phase 8, once per request: the usage event, and the key's quota charged with exact usage.
    fn settle(&mut self, usage: Option<Usage>, truncated: bool) {
        if let Some(usage) = usage {
            self.facts.input_tokens = usage.input_tokens;
            self.facts.output_tokens = usage.output_tokens;
            let shard = self.shard;
            shard.accounting.tokens(
                self.quota.key,
                self.slot.model,
                Some(self.slot.agent),
                (usage.input_tokens, usage.output_tokens),
                |key| shard.keys().get(key).map(KeyLabels::of),
            );
        }
        // The estimator learns only from usage the backend reported for a complete answer.
        if let Some(usage) = usage
            && self.status == 200
            && !truncated
            && matches!(self.route, Route::ChatCompletions | Route::Messages)
        {
            // Learned by the model's owner, with the slot's release.
            self.slot.observe(self.prompt, usage.input_tokens);
        }
        settle(
            self.shard,
            self.quota,
            UsageEvent {
                route: self.route,
                status: self.status,
                usage,
                truncated,
            },
        );
    }

    /// A non-streamed answer, before delivery: the quota owner checks its output against the
    /// key's daily budget (one round trip, only for keys with one). False: refuse it.
    async fn settle_buffered(&mut self, usage: Option<Usage>, deadline: Instant) -> bool {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(std::time::Duration::from_millis(100));
        self.quota.settle_buffered(usage, wait).await
    }

    /// The client went away mid-response: count it and settle what was used so far.
    fn client_left(&mut self, usage: Option<Usage>) -> Outcome {
        ShardMetrics::add(&self.shard.metrics.client_disconnects_total, 1);
        self.settle(usage, true);
        Outcome::Gone
    }
}

/// Streams are charged as delivered (`Delivery::Streamed`); a non-streamed answer was settled
/// as `Delivery::Buffered` before delivery (`Settling::settle_buffered`), so this is a no-op for
/// its quota and only records usage.
fn settle(shard: &Shard, quota: &mut QuotaCharge, event: UsageEvent) {
    quota.settle_usage(event.usage, Delivery::Streamed);
    match event.usage {
        Some(usage) => {
            ShardMetrics::add(&shard.metrics.input_tokens_total, usage.input_tokens);
            ShardMetrics::add(&shard.metrics.output_tokens_total, usage.output_tokens);
        }
        None if event.status == 200 && event.route != Route::CountTokens && !event.truncated => {
            ShardMetrics::add(&shard.metrics.usage_missing_total, 1);
        }
        None => {}
    }
    tracing::debug!(?event, "request settled");
}

/// The agent's SRTT/RTTVAR learn the time from handing the request to the tunnel to its response
/// headers; `None`: it never was handed over (no sample).
fn latency_sample(shard: &Shard, slot: &Slot, handed_over: Option<Instant>) {
    let Some(handed_over) = handed_over else {
        return;
    };
    let sample_ms = handed_over.elapsed().as_secs_f64() * 1000.0;
    shard
        .accounting
        .agent_latency(slot.agent, slot.model, sample_ms);
}

const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
const ANTHROPIC_VERSION: http::HeaderName = http::HeaderName::from_static("anthropic-version");
const ANTHROPIC_BETA: http::HeaderName = http::HeaderName::from_static("anthropic-beta");

/// Whether an engine's response field reaches the client. Not the hop-by-hop ones (RFC 9110
/// §7.6.1): the agent strips them, and the router checks again because a second framing field
/// would break the client's HTTP/1.1 framing and HTTP/2 refuses them outright. Not the ones the
/// router writes itself: the body's type and framing, `x-request-id`, `traceparent`, the key's
/// `x-ratelimit-remaining-requests` and `-tokens`, and on a stream `cache-control` (always
/// `no-cache` there).
fn reaches_client(name: &http::HeaderName, streamed: bool) -> bool {
    let name = name.as_str();
    let own_or_hop = matches!(
        name,
        "content-type"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "te"
            | "trailer"
            | "upgrade"
            | "x-request-id"
            | "traceparent"
            | "x-ratelimit-remaining-requests"
            | "x-ratelimit-remaining-tokens"
    );
    !(own_or_hop || name.starts_with("proxy-") || (streamed && name == "cache-control"))
}

/// The forwarded routes' tunnel URIs, parsed once: `Uri::from_static` parses its text, about 650
/// instructions a request, where a clone of a parsed one copies a few words.
static UPSTREAM_URIS: std::sync::LazyLock<[http::Uri; 5]> = std::sync::LazyLock::new(|| {
    [
        "http://agent/v1/chat/completions",
        "http://agent/v1/messages",
        "http://agent/v1/messages/count_tokens",
        "http://agent/v1/embeddings",
        "http://agent/v1/rerank",
    ]
    .map(http::Uri::from_static)
});

fn upstream_uri(route: Route) -> http::Uri {
    let index = match route {
        Route::ChatCompletions => 0,
        Route::Messages => 1,
        Route::CountTokens => 2,
        Route::Embeddings => 3,
        Route::Rerank => 4,
        Route::Models | Route::Health | Route::Ready | Route::Admin => {
            unreachable!("{route:?} is served by the router itself, never forwarded")
        }
    };
    UPSTREAM_URIS[index].clone()
}

/// The request the agent gets: built in place rather than through `http::request::Builder`,
/// which moves the whole request through a `Result` at every call (about 600 instructions a
/// header).
fn upstream_request(request: &ClientRequest) -> http::Request<()> {
    // Unique per request: marked sensitive, HPACK sends it as a never-indexed literal instead of
    // inserting it into the tunnel's dynamic table (where it would only evict useful entries,
    // and cost a table insertion per request: measured +5 % router instructions,
    // `perf/notes/2026-12-02-streamed-events-and-the-agents-request-task.md`).
    let mut request_id = http::HeaderValue::from_bytes(&request.request_id)
        .expect("request IDs are ASCII hex digits and dashes");
    request_id.set_sensitive(true);
    let mut headers = http::HeaderMap::with_capacity(4);
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    headers.insert(X_REQUEST_ID, request_id);
    if let Some(span) = &request.span {
        // The agent's span is a child of the router's: unique per request, so never indexed.
        let mut traceparent = http::HeaderValue::from_bytes(&span.context.traceparent())
            .expect("a traceparent is ASCII hex digits and dashes");
        traceparent.set_sensitive(true);
        headers.insert(TRACEPARENT, traceparent);
    }
    let forwarded = [
        (ANTHROPIC_VERSION, &request.anthropic_version),
        (ANTHROPIC_BETA, &request.anthropic_beta),
    ];
    for (name, value) in forwarded {
        if let Some(value) = value
            && let Ok(value) = http::HeaderValue::from_maybe_shared(value.clone())
        {
            headers.insert(name, value);
        }
    }
    let mut upstream = http::Request::new(());
    *upstream.method_mut() = http::Method::POST;
    *upstream.uri_mut() = upstream_uri(request.route);
    *upstream.headers_mut() = headers;
    upstream
}

#[allow(clippy::too_many_arguments)]
pub async fn forward<S: Sink>(
    shard: &Rc<Shard>,
    request: &ClientRequest,
    fields: &RequestFields<'_>,
    slot: Slot,
    quota: &mut QuotaCharge,
    deadline: Instant,
    may_retry: bool,
    facts: &mut RequestFacts,
    sink: &mut S,
) -> Result<u16, Outcome> {
    // A failure before anything reached the client may be retried on another agent (policy
    // reference, "What consumes a try") when the request has tries left.
    let failed = |rejection: Rejection| -> Outcome {
        if may_retry {
            Outcome::Retry(Failure {
                agent: slot.agent,
                step: slot.step,
                rejection,
            })
        } else {
            Outcome::Rejected(rejection)
        }
    };
    let Some(tunnel) = shard.tunnel(slot.agent) else {
        return Err(failed(if shard.lifecycle.is_ending() {
            Rejection::shutting_down()
        } else {
            Rejection::agent_disconnected()
        }));
    };
    let injected = match request.route {
        Route::ChatCompletions => request_with_include_usage(&request.body, fields),
        _ => None,
    };
    let suppress_usage_chunk = injected.is_some();
    let body = injected.map_or_else(|| request.body.clone(), Bytes::from);

    let remaining = deadline.saturating_duration_since(Instant::now());
    // When the request was handed to the tunnel: the start of its latency sample.
    let handed_over: std::cell::Cell<Option<Instant>> = std::cell::Cell::new(None);
    let sent = sink
        .until_client_gone(crate::router::shard::timer::timeout(
            remaining,
            tunnel.send.exchange(upstream_request(request), body, || {
                handed_over.set(Some(Instant::now()))
            }),
        ))
        .await;
    let response = match sent {
        None => {
            ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
            return Err(Outcome::Gone);
        }
        Some(Err(_elapsed)) => return Err(Rejection::request_timeout().into()),
        Some(Ok(Err(error))) if error.is_refused() => {
            // The agent's end of the tunnel holds as many streams as it takes: a slot the router
            // believed free that the agent refused (`no_capacity`; another agent may serve).
            ShardMetrics::add(&shard.metrics.upstream_errors_total, 1);
            shard.accounting.agent_rejected(slot.agent, slot.model);
            return Err(failed(Rejection::no_capacity()));
        }
        Some(Ok(Err(error))) => {
            // A transport failure after the request was sent is still a latency sample
            // (latency-tracking reference, "Successful and failed requests"); one before is not.
            latency_sample(shard, &slot, handed_over.get());
            if handed_over.get().is_some() {
                count_reset(shard, &slot, &error);
            }
            ShardMetrics::add(&shard.metrics.upstream_errors_total, 1);
            tracing::debug!(shard = shard.id, session = slot.agent.0, %error, "forward failed");
            return Err(failed(upstream_failure(shard, &error)));
        }
        Some(Ok(Ok(response))) => {
            latency_sample(shard, &slot, handed_over.get());
            if is_refusal_status(response.status().as_u16()) {
                shard.accounting.agent_rejected(slot.agent, slot.model);
            }
            response
        }
    };
    if may_retry && is_retryable_status(response.status().as_u16()) {
        // Dropping the response resets the stream: the agent stops the backend request.
        ShardMetrics::add(&shard.metrics.upstream_errors_total, 1);
        return Err(failed(Rejection::backend_status(
            response.status().as_u16(),
        )));
    }
    let (head, upstream_body) = response.into_parts();
    let status = head.status.as_u16();
    let content_type = content_type_of(&head.headers);
    let streamed = content_type.starts_with("text/event-stream");
    ShardMetrics::gauge(&shard.metrics.in_flight, 1);
    let remaining = Remaining {
        requests: quota.remaining_requests,
        tokens: quota.remaining_tokens,
    };
    let settling = Settling {
        shard,
        facts,
        slot: &slot,
        prompt: fields.prompt,
        quota,
        route: request.route,
        status,
    };
    let result = if streamed {
        match start_streamed(sink, head, remaining).await {
            Ok(()) => stream_back(settling, upstream_body, suppress_usage_chunk, sink).await,
            Err(ClientGone) => Err(Outcome::Gone),
        }
    } else {
        let mut texts = [itoa::Buffer::new(), itoa::Buffer::new()];
        let headers = client_fields(&head.headers, remaining, &mut texts, false);
        buffer_back(
            settling,
            content_type,
            &headers,
            upstream_body,
            deadline,
            sink,
        )
        .await
    };
    ShardMetrics::gauge(&shard.metrics.in_flight, -1);
    // Settle: the response is over, the slot goes back now.
    drop(slot);
    result.map(|()| status)
}

/// What the key had left at admission, for the answer's head (API-key reference).
#[derive(Debug, Clone, Copy)]
struct Remaining {
    requests: Option<u64>,
    tokens: Option<u64>,
}

/// The engine's `content-type`; `application/json` when it sent none, or one that is not
/// visible ASCII.
fn content_type_of(engine: &http::HeaderMap) -> &str {
    engine
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("application/json")
}

/// The fields of the client's head besides the type and framing: what the key had left at
/// admission, as the API-key reference documents on responses, then the engine's own fields
/// (custom-engine reference: "backend response headers [...] are returned through the agent and
/// router to the client"). Bound: the two rate fields and the engine head's fields (the lean
/// tunnel's `wire::FIELDS_MAX`; on an HTTP/2 tunnel, `h2`'s default header list limit of 16 MiB).
fn client_fields<'h>(
    engine: &'h http::HeaderMap,
    remaining: Remaining,
    texts: &'h mut [itoa::Buffer; 2],
    streamed: bool,
) -> Vec<(&'h str, &'h [u8])> {
    let mut fields: Vec<(&str, &[u8])> = Vec::with_capacity(2 + engine.len());
    let [requests_text, tokens_text] = texts;
    if let Some(requests) = remaining.requests {
        fields.push((
            "x-ratelimit-remaining-requests",
            requests_text.format(requests).as_bytes(),
        ));
    }
    if let Some(tokens) = remaining.tokens {
        fields.push((
            "x-ratelimit-remaining-tokens",
            tokens_text.format(tokens).as_bytes(),
        ));
    }
    fields.extend(
        engine
            .iter()
            .filter(|(name, _)| reaches_client(name, streamed))
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
    );
    fields
}

/// Starts the client's streamed answer from the engine's head (corked: the head, the events and
/// the end leave together when they came together), and lets that head go. Its field values
/// are slices of the tunnel read that brought them (`tunnel::wire`): a head kept for the
/// stream's life pins that read, 16 KiB or more, for every open stream
/// (`perf/notes/2026-12-07-memory-under-churn.md`).
async fn start_streamed<S: Sink>(
    sink: &mut S,
    engine: http::response::Parts,
    remaining: Remaining,
) -> Result<(), ClientGone> {
    let mut texts = [itoa::Buffer::new(), itoa::Buffer::new()];
    let fields = client_fields(&engine.headers, remaining, &mut texts, true);
    let content_type = content_type_of(&engine.headers);
    sink.start_stream(engine.status.as_u16(), content_type, &fields)
        .await
}

async fn buffer_back<S: Sink>(
    mut settling: Settling<'_>,
    content_type: &str,
    headers: &[(&str, &[u8])],
    mut upstream: crate::net::tunnel::upstream::Body,
    deadline: Instant,
    sink: &mut S,
) -> Result<(), Outcome> {
    let (shard, route, status) = (settling.shard, settling.route, settling.status);
    // Most bodies arrive in one frame: keep it as is; join frames only when there are several.
    let mut single: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    // One timer for the whole body, not one per chunk.
    let mut expired = crate::router::shard::timer::sleep_until(deadline);
    loop {
        let next = sink
            .until_client_gone(race(upstream.data(), expired.as_mut()))
            .await;
        match next {
            None => {
                ShardMetrics::add(&shard.metrics.client_disconnects_total, 1);
                return Err(Outcome::Gone);
            }
            Some(Either::Right(())) => return Err(Rejection::request_timeout().into()),
            Some(Either::Left(None)) => break,
            Some(Either::Left(Some(Err(error)))) => {
                ShardMetrics::add(&shard.metrics.upstream_errors_total, 1);
                count_reset(shard, settling.slot, &error);
                return Err(upstream_failure(shard, &error).into());
            }
            Some(Either::Left(Some(Ok(chunk)))) => {
                let held = single.as_ref().map_or(0, Bytes::len) + joined.len();
                if held + chunk.len() > BUFFERED_BODY_BYTES_MAX {
                    return Err(Rejection::backend_error("backend response is too large").into());
                }
                match single.take() {
                    None if joined.is_empty() => single = Some(chunk),
                    None => joined.extend_from_slice(&chunk),
                    Some(first) => {
                        joined.extend_from_slice(&first);
                        joined.extend_from_slice(&chunk);
                    }
                }
            }
        }
    }
    let body = single.unwrap_or_else(|| joined.freeze());
    let usage = if status == 200 {
        match route {
            Route::ChatCompletions => usage::from_openai_chat(&body),
            Route::Messages => usage::from_anthropic_message(&body),
            Route::Embeddings | Route::Rerank => usage::from_openai_embeddings(&body),
            _ => None,
        }
    } else {
        None
    };
    if status == 200 && !settling.settle_buffered(usage, deadline).await {
        // The answer's output no longer fits the key's daily budget: refused, not delivered
        // (its usage is still recorded; the quota was settled without the output).
        settling.settle(usage, false);
        let key = settling.quota.key;
        shard.accounting.tenants.borrow_mut().token_limited(
            key,
            Phase::Output,
            shard.accounting.deployment_of(Some(settling.slot.agent)),
            || shard.keys().get(key).map(KeyLabels::of),
        );
        return Err(super::refusal::daily_output(settling.slot.model).into());
    }
    let written = sink.respond(status, content_type, headers, &body).await;
    settling.settle(usage, written.is_err());
    written.map_err(|_| Outcome::Gone)
}

enum Scanner {
    OpenAi(OpenAiStreamScan),
    Anthropic(AnthropicStreamScan),
}

impl Scanner {
    fn usage(&self) -> Option<Usage> {
        match self {
            Scanner::OpenAi(scan) => scan.usage(),
            Scanner::Anthropic(scan) => scan.usage(),
        }
    }
}

/// Relays a streamed answer whose head [`forward`] has started (corked) on `sink`.
async fn stream_back<S: Sink>(
    mut settling: Settling<'_>,
    mut upstream: crate::net::tunnel::upstream::Body,
    suppress_usage_chunk: bool,
    sink: &mut S,
) -> Result<(), Outcome> {
    let shard = settling.shard;
    let dialect = settling.route.dialect();
    let mut splitter = SseSplitter::new(SSE_EVENT_BYTES_MAX);
    let mut scanner = match dialect {
        Dialect::OpenAi => Scanner::OpenAi(OpenAiStreamScan::new()),
        Dialect::Anthropic => Scanner::Anthropic(AnthropicStreamScan::new()),
    };
    // Past an oversized event the scanner stops and bytes pass through untouched.
    let mut passthrough = false;
    // What one upstream chunk comes to, lent from the shard's spare buffers while a chunk is
    // relayed and given back before the next wait: a stream between two tokens holds none
    // (`perf/notes/2026-12-06-memory-per-open-stream.md`).
    let mut out = Vec::new();
    let mut truncated = false;
    let mut occupancy = OccupancyTracker::new(settling.slot);
    loop {
        let next = match upstream.data().now_or_never() {
            Some(ready) => Some(ready),
            None => {
                spare_buffers::give_back(std::mem::take(&mut out));
                if sink.flush().await.is_err() {
                    return Err(settling.client_left(scanner.usage()));
                }
                sink.waiting();
                sink.until_client_gone(upstream.data()).await
            }
        };
        let chunk = match next {
            None => return Err(settling.client_left(scanner.usage())),
            Some(None) => break,
            Some(Some(Err(error))) => {
                ShardMetrics::add(&shard.metrics.upstream_errors_total, 1);
                count_reset(shard, settling.slot, &error);
                truncated = true;
                out.clear();
                out.extend_from_slice(&splitter.take_tail());
                if shard.lifecycle.is_ending() {
                    out.extend_from_slice(&Rejection::shutting_down().stream_event(dialect));
                } else {
                    out.extend_from_slice(stream_error_event(dialect, error.is_backend_failure()));
                }
                if sink.stream_data(&out).await.is_err() {
                    return Err(settling.client_left(scanner.usage()));
                }
                break;
            }
            Some(Some(Ok(chunk))) => chunk,
        };
        if out.capacity() == 0 {
            out = spare_buffers::take();
        }
        out.clear();
        if passthrough {
            out.extend_from_slice(&chunk);
        } else {
            splitter.push(chunk);
            loop {
                match splitter.next_event() {
                    Ok(Some(event)) => {
                        let keep = match &mut scanner {
                            Scanner::OpenAi(scan) => !matches!(
                                scan.scan_event(&event),
                                OpenAiEvent::UsageOnly(_) if suppress_usage_chunk
                            ),
                            Scanner::Anthropic(scan) => {
                                scan.scan_event(&event);
                                true
                            }
                        };
                        if keep {
                            out.extend_from_slice(&event);
                        }
                        occupancy.event(&scanner);
                    }
                    Ok(None) => break,
                    Err(_) => {
                        passthrough = true;
                        out.extend_from_slice(&splitter.take_tail());
                        break;
                    }
                }
            }
        }
        if !out.is_empty() && sink.stream_data_corked(&out).await.is_err() {
            return Err(settling.client_left(scanner.usage()));
        }
    }
    spare_buffers::give_back(out);
    if !truncated {
        let tail = splitter.take_tail();
        if !tail.is_empty() && sink.stream_data_corked(&tail).await.is_err() {
            return Err(settling.client_left(scanner.usage()));
        }
    }
    let ended = sink.end_stream().await;
    settling.settle(scanner.usage(), truncated || ended.is_err());
    ended.map_err(|_| Outcome::Gone)
}

/// Backend statuses that say "try elsewhere": unavailable, overloaded, rate-limited, failing.
fn is_retryable_status(status: u16) -> bool {
    matches!(status, 429 | 500 | 502 | 503 | 504)
}

/// Statuses that say the agent or its engine refused the request for capacity or readiness
/// (`hivenet_agent_rejected_requests_total`): rate-limited or overloaded, unavailable.
fn is_refusal_status(status: u16) -> bool {
    matches!(status, 429 | 503)
}

/// A request the agent had was cut: counted on the agent by what broke
/// (`hivenet_agent_connection_resets_total`), unless the router's own shutdown closed the tunnel.
fn count_reset(shard: &Shard, slot: &Slot, error: &crate::net::tunnel::upstream::UpstreamError) {
    if shard.lifecycle.is_ending() {
        return;
    }
    let reason = if error.is_backend_failure() {
        ResetReason::Engine
    } else {
        ResetReason::Tunnel
    };
    shard.accounting.agent_reset(slot.agent, slot.model, reason);
}

/// A forward that failed before anything reached the client, on this agent in this step.
pub struct Failure {
    pub agent: crate::logic::routing::AgentId,
    pub step: u8,
    /// What the client gets if no other attempt is made.
    pub rejection: Rejection,
}

/// Output events between two occupancy updates to the model's owner.
const OCCUPANCY_UPDATE_EVERY: u64 = 16;

/// Keeps a reserved stream's occupancy current (seed, B2): the reservation grows as output
/// streams (one token per SSE event, the engines' usual chunking, until exact usage arrives at
/// the end), and the estimated input is replaced as soon as the backend reports the exact count
/// (Anthropic's `message_start`). Updates go out every [`OCCUPANCY_UPDATE_EVERY`] events, so a
/// stream costs the owner one message per sixteen tokens.
struct OccupancyTracker<'a> {
    slot: &'a Slot,
    events: u64,
    input_known: bool,
}

impl<'a> OccupancyTracker<'a> {
    fn new(slot: &'a Slot) -> Self {
        OccupancyTracker {
            slot,
            events: 0,
            input_known: !slot.is_reserved(),
        }
    }

    fn event(&mut self, scanner: &Scanner) {
        if !self.slot.is_reserved() {
            return;
        }
        self.events += 1;
        if self.events.is_multiple_of(OCCUPANCY_UPDATE_EVERY) {
            self.slot
                .update_occupancy(OccupancyUpdate::Output(self.events));
        }
        if !self.input_known
            && let Scanner::Anthropic(scan) = scanner
            && let Some(usage) = scan.usage()
            && usage.input_tokens > 0
        {
            self.input_known = true;
            self.slot
                .update_occupancy(OccupancyUpdate::ExactInput(usage.input_tokens));
        }
    }
}

/// What a tunnelled stream's error tells the client: the router's own shutdown closed the
/// tunnel, the agent's backend failed (`tunnel::BACKEND_FAILED`), or the tunnel or the agent was
/// lost.
fn upstream_failure(
    shard: &Shard,
    error: &crate::net::tunnel::upstream::UpstreamError,
) -> Rejection {
    if shard.lifecycle.is_ending() {
        Rejection::shutting_down()
    } else if error.is_backend_failure() {
        Rejection::backend_failed()
    } else {
        Rejection::agent_disconnected()
    }
}

/// The event that tells a streaming client its stream failed upstream, in its own dialect:
/// `backend_error` when the agent said its backend failed, else `agent_disconnected`.
fn stream_error_event(dialect: Dialect, backend_failed: bool) -> &'static [u8] {
    match (dialect, backend_failed) {
        (Dialect::OpenAi, false) => {
            b"data: {\"error\":{\"code\":\"agent_disconnected\",\"message\":\"the agent connection was lost mid-stream\",\"source\":\"router\"}}\n\n"
        }
        (Dialect::OpenAi, true) => {
            b"data: {\"error\":{\"code\":\"backend_error\",\"message\":\"the backend failed mid-stream\",\"source\":\"backend\"}}\n\n"
        }
        (Dialect::Anthropic, false) => {
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"agent_disconnected: the agent connection was lost mid-stream\"}}\n\n"
        }
        (Dialect::Anthropic, true) => {
            b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"backend_error: the backend failed mid-stream\"}}\n\n"
        }
    }
}

/// How an inference request ended when it did not end well.
pub enum Outcome {
    /// Nothing has been sent to the client yet: answer with this.
    Rejected(Rejection),
    /// A forward failed before anything was sent to the client, and another attempt may serve
    /// it (the caller decides; without one, the failure's rejection is the answer).
    Retry(Failure),
    /// The client is gone (or its connection broke mid-response).
    Gone,
}

impl From<Rejection> for Outcome {
    fn from(rejection: Rejection) -> Outcome {
        Outcome::Rejected(rejection)
    }
}

#[cfg(test)]
mod tests;
