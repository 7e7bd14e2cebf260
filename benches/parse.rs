//! Measures the per-request wire work on the router's hot path: head parsing, body field
//! extraction (small, chat-with-tools, base64-image and 100 KB bodies) and the usage scan of a
//! streamed OpenAI response.
//!
//! First run, on 2 cores shared with other builds (so noisy): parse_head 228 ns; head + 300 B
//! fields 624 ns; head + 100 KB fields 37.9 us; include_usage splice 25 ns; 21-event SSE scan
//! 4.2 us with a chunk per event, 9.5 us as one chunk (wide interval, 8.7-10.3 us).
//!
//! With the prompt shape read in the same pass (min of 3 alternating runs on a loaded box, before
//! -> after): head + 300 B fields 738 -> 791 ns; 3 KB chat with tools 1.91 -> 2.49 us; head +
//! 100 KB fields 36.0 -> 58.7 us (escape-dense text is now decoded); 48 KB base64 image
//! 7.62 -> 7.21 us.

use std::hint::black_box;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hivenet_router::logic::usage::{OpenAiEvent, OpenAiStreamScan, SseSplitter};
use hivenet_router::wire::http::fields::{extract_fields, request_with_include_usage};
use hivenet_router::wire::http::request::{HeadLimits, parse_head};

const HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\n\
    Host: router.hivenet.internal:8080\r\n\
    User-Agent: OpenAI/Python 1.54.3\r\n\
    Accept: application/json\r\n\
    Accept-Encoding: gzip, deflate\r\n\
    Authorization: Bearer sk-hn-7f3a9c2e5b1d4f8a6c0e2b4d6f8a0c2e\r\n\
    Content-Type: application/json\r\n\
    Content-Length: 297\r\n\
    X-Request-Id: 5f0c6a1e-8b2d-4c3f-9a7e-1d2b3c4d5e6f\r\n\
    \r\n";

fn small_body() -> Vec<u8> {
    br#"{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Write a haiku about routers that shard by core and never share a lock."}],"temperature":0.7,"top_p":0.95,"max_tokens":256,"stream":true,"user":"bench"}"#
        .to_vec()
}

/// A realistic agent turn: system prompt, a user question, an assistant tool call, its result and
/// a follow-up, with three function schemas in `tools` (about 3 KB).
fn chat_with_tools_body() -> Vec<u8> {
    let tool = |name: &str, description: &str| {
        format!(
            r#"{{"type":"function","function":{{"name":"{name}","description":"{description}","parameters":{{"type":"object","properties":{{"query":{{"type":"string","description":"What to look up, in plain words."}},"limit":{{"type":"integer","minimum":1,"maximum":50,"description":"Most results to return."}},"filters":{{"type":"array","items":{{"type":"string"}}}}}},"required":["query"]}}}}}}"#
        )
    };
    let tools = [
        tool(
            "search_docs",
            "Search the internal documentation and return matching passages.",
        ),
        tool(
            "get_ticket",
            "Fetch one support ticket with its history by id.",
        ),
        tool(
            "run_sql",
            "Run a read-only SQL query against the analytics replica.",
        ),
    ]
    .join(",");
    format!(
        r#"{{"model":"Qwen/Qwen3-32B","messages":[{{"role":"system","content":"You are the support assistant of Hivenet. Answer briefly, cite the documentation you used, and never invent ticket numbers. When a question needs data, call a tool first."}},{{"role":"user","content":"A customer says their requests get \"429 token_limit_exceeded\" since this morning although their dashboard shows budget left. Ticket 48213. What is going on?"}},{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_9f2c","type":"function","function":{{"name":"get_ticket","arguments":"{{\"query\":\"48213\",\"limit\":1}}"}}}}]}},{{"role":"tool","tool_call_id":"call_9f2c","content":"Ticket 48213 (open): key sk-hivenet-...abcd, tenant-a. Daily budget 2,000,000 tokens, used 1,998,311 at 09:14 UTC. Requests since then refused with 429. Customer timezone UTC+9, dashboard shows the local day."}},{{"role":"assistant","content":"The budget resets at 00:00 UTC, not at local midnight."}},{{"role":"user","content":"Can you draft a short reply to the customer explaining that, with the time their budget comes back in their timezone?"}}],"tools":[{tools}],"tool_choice":"auto","temperature":0.2,"max_completion_tokens":512,"stream":true}}"#
    )
    .into_bytes()
}

/// One user turn with a question and a 48 KB base64 PNG as an `image_url` data URL.
fn image_body() -> Vec<u8> {
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let data: String = (0..48 * 1024)
        .map(|index: usize| alphabet[(index * 7 + index / 64) % 64] as char)
        .collect();
    format!(
        r#"{{"model":"Qwen/Qwen2.5-VL-7B-Instruct","messages":[{{"role":"user","content":[{{"type":"text","text":"What is written on the whiteboard in this photo?"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{data}","detail":"auto"}}}}]}}],"max_tokens":300}}"#
    )
    .into_bytes()
}

fn large_body() -> Vec<u8> {
    let sentence = "The quick brown fox jumps over the lazy dog, \\\"quoted\\\" and\\nnewlined. ";
    let mut prompt = String::new();
    while prompt.len() < 100 * 1024 {
        prompt.push_str(sentence);
    }
    format!(
        r#"{{"model":"meta-llama/Llama-3.1-70B-Instruct","messages":[{{"role":"system","content":"Summarise."}},{{"role":"user","content":"{prompt}"}}],"max_completion_tokens":1024,"stream":false}}"#
    )
    .into_bytes()
}

/// 21 events as vLLM sends them with `include_usage`: role, 17 content deltas, finish, the
/// usage-only chunk, `[DONE]`; one event per network chunk.
fn openai_stream_chunks() -> Vec<Bytes> {
    openai_stream_events()
        .into_iter()
        .map(|event| Bytes::from(format!("{event}\n\n")))
        .collect()
}

/// The same events as OpenAI (and the simulator) send them with `include_usage`: every chunk
/// before the usage-only one carries `"usage":null`.
fn openai_stream_chunks_with_null_usage() -> Vec<Bytes> {
    openai_stream_events()
        .into_iter()
        .map(|event| match event.strip_suffix("]}") {
            Some(open) if !event.contains("\"usage\"") => format!("{open}],\"usage\":null}}\n\n"),
            _ => format!("{event}\n\n"),
        })
        .map(Bytes::from)
        .collect()
}

fn openai_stream_events() -> Vec<String> {
    let mut events = vec![
        r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732890000,"model":"llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#.to_owned(),
    ];
    for index in 0..17 {
        events.push(format!(
            r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732890000,"model":"llama","choices":[{{"index":0,"delta":{{"content":" token{index}"}},"logprobs":null,"finish_reason":null}}]}}"#
        ));
    }
    events.push(r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732890000,"model":"llama","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}"#.to_owned());
    events.push(r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1732890000,"model":"llama","choices":[],"usage":{"prompt_tokens":42,"total_tokens":60,"completion_tokens":18}}"#.to_owned());
    events.push("data: [DONE]".to_owned());
    assert_eq!(events.len(), 21);
    events
}

fn scan_stream(chunks: &[Bytes]) -> u64 {
    let mut splitter = SseSplitter::new(1 << 20);
    let mut scan = OpenAiStreamScan::new();
    let mut forwarded = 0u64;
    for chunk in chunks {
        splitter.push(chunk.clone());
        while let Some(event) = splitter.next_event().expect("bounded events") {
            if !matches!(scan.scan_event(&event), OpenAiEvent::UsageOnly(_)) {
                forwarded += event.len() as u64;
            }
        }
    }
    forwarded + scan.usage().map_or(0, |usage| usage.output_tokens)
}

fn bench(criterion: &mut Criterion) {
    let limits = HeadLimits::default();
    let small = small_body();
    let large = large_body();

    let mut group = criterion.benchmark_group("request");
    group.throughput(Throughput::Bytes(HEAD.len() as u64));
    group.bench_function("parse_head", |bencher| {
        bencher.iter(|| parse_head(black_box(HEAD), &limits).unwrap().unwrap())
    });
    group.throughput(Throughput::Bytes((HEAD.len() + small.len()) as u64));
    group.bench_function("head_and_fields_small_body", |bencher| {
        bencher.iter(|| {
            let head = parse_head(black_box(HEAD), &limits).unwrap().unwrap();
            let fields = extract_fields(black_box(&small)).unwrap();
            (head.head_bytes, fields.model.len(), fields.stream)
        })
    });
    group.throughput(Throughput::Bytes((HEAD.len() + large.len()) as u64));
    group.bench_function("head_and_fields_100k_body", |bencher| {
        bencher.iter(|| {
            let head = parse_head(black_box(HEAD), &limits).unwrap().unwrap();
            let fields = extract_fields(black_box(&large)).unwrap();
            (
                head.head_bytes,
                fields.model.len(),
                fields.max_completion_tokens,
            )
        })
    });
    let tools_body = chat_with_tools_body();
    group.throughput(Throughput::Bytes(tools_body.len() as u64));
    group.bench_function("fields_chat_with_tools_body", |bencher| {
        bencher.iter(|| {
            let fields = extract_fields(black_box(&tools_body)).unwrap();
            (fields.model.len(), fields.stream)
        })
    });
    let image = image_body();
    group.throughput(Throughput::Bytes(image.len() as u64));
    group.bench_function("fields_base64_image_body", |bencher| {
        bencher.iter(|| {
            let fields = extract_fields(black_box(&image)).unwrap();
            (fields.model.len(), fields.max_tokens)
        })
    });
    group.throughput(Throughput::Bytes(small.len() as u64));
    group.bench_function("include_usage_splice_small_body", |bencher| {
        let fields = extract_fields(&small).unwrap();
        bencher.iter(|| request_with_include_usage(black_box(&small), &fields).unwrap())
    });
    group.finish();

    let chunks = openai_stream_chunks();
    let stream_bytes: usize = chunks.iter().map(Bytes::len).sum();
    let whole = vec![Bytes::from(chunks.concat())];
    let mut group = criterion.benchmark_group("sse");
    group.throughput(Throughput::Bytes(stream_bytes as u64));
    group.bench_function("openai_21_events_chunk_per_event", |bencher| {
        bencher.iter(|| scan_stream(black_box(&chunks)))
    });
    group.bench_function("openai_21_events_one_chunk", |bencher| {
        bencher.iter(|| scan_stream(black_box(&whole)))
    });
    let with_null_usage = vec![Bytes::from(openai_stream_chunks_with_null_usage().concat())];
    assert_eq!(
        with_null_usage[0]
            .windows(13)
            .filter(|w| w == b"\"usage\":null}")
            .count(),
        19
    );
    group.bench_function("openai_21_events_null_usage_one_chunk", |bencher| {
        bencher.iter(|| scan_stream(black_box(&with_null_usage)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
