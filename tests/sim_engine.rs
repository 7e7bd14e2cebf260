//! Proves that the real `hivenet-sim` binary speaks the OpenAI and Anthropic wire formats byte for
//! byte over loopback HTTP/1.1, queues requests FIFO behind its concurrency limit, reports vLLM-style
//! metrics that follow control overrides, frees capacity when a client disconnects, and counts
//! prefix-cache queries and hits in tokens as vLLM does.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Upper bound on any wait in these tests; generous for a loaded 2-core machine.
const WAIT_MAX: Duration = Duration::from_secs(10);

/// A running `hivenet-sim`, killed (and its temp dir removed) on drop.
struct Sim {
    child: Child,
    address: SocketAddr,
    directory: PathBuf,
}

impl Sim {
    fn start(extra_args: &[&str]) -> Sim {
        static NEXT_DIRECTORY: AtomicU64 = AtomicU64::new(0);
        let directory = std::env::temp_dir().join(format!(
            "hivenet-sim-test-{}-{}",
            std::process::id(),
            NEXT_DIRECTORY.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&directory).unwrap();
        let ready_file = directory.join("address");
        let child = Command::new(env!("CARGO_BIN_EXE_hivenet-sim"))
            .args(["--listen", "127.0.0.1:0", "--ready-file"])
            .arg(&ready_file)
            .args(extra_args)
            .stdout(Stdio::null())
            .spawn()
            .expect("hivenet-sim starts");
        let mut sim = Sim {
            child,
            address: "127.0.0.1:1".parse().unwrap(),
            directory,
        };
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            if let Ok(text) = std::fs::read_to_string(&ready_file) {
                sim.address = text.trim().parse().expect("ready file holds an address");
                return sim;
            }
            if let Some(status) = sim.child.try_wait().unwrap() {
                panic!("hivenet-sim exited early: {status}");
            }
            assert!(Instant::now() < deadline, "hivenet-sim never became ready");
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn connect(&self) -> Connection {
        let stream = TcpStream::connect(self.address).unwrap();
        stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
        Connection {
            reader: BufReader::new(stream),
        }
    }

    fn get(&self, path: &str) -> HttpResponse {
        self.connect().request("GET", path, None)
    }

    fn post(&self, path: &str, body: &Value) -> HttpResponse {
        self.connect()
            .request("POST", path, Some(&body.to_string()))
    }

    fn metrics(&self) -> String {
        let response = self.get("/metrics");
        assert_eq!(response.status, 200);
        response.text()
    }

    /// Polls `/metrics` until `condition` holds, failing after [`WAIT_MAX`].
    fn wait_for_metrics(&self, what: &str, condition: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let text = self.metrics();
            if condition(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}:\n{text}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

/// One keep-alive HTTP/1.1 client connection.
struct Connection {
    reader: BufReader<TcpStream>,
}

struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("utf-8 body")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!("body is not json ({error}): {}", self.text());
        })
    }
}

impl Connection {
    fn send(&mut self, method: &str, path: &str, body: Option<&str>) {
        let body = body.unwrap_or("");
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        self.reader.get_mut().write_all(request.as_bytes()).unwrap();
    }

    fn request(&mut self, method: &str, path: &str, body: Option<&str>) -> HttpResponse {
        self.send(method, path, body);
        self.read_response()
    }

    fn read_line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        assert!(line.ends_with("\r\n"), "truncated line {line:?}");
        line.truncate(line.len() - 2);
        line
    }

    fn read_head(&mut self) -> (u16, Vec<(String, String)>) {
        let status_line = self.read_line();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let line = self.read_line();
            if line.is_empty() {
                return (status, headers);
            }
            let (name, value) = line.split_once(':').expect("header line");
            headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
        }
    }

    /// Reads one chunk of a chunked body; `None` at the terminating zero-size chunk.
    fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let size_line = self.read_line();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap(), 16).unwrap();
        let mut chunk = vec![0; size];
        self.reader.read_exact(&mut chunk).unwrap();
        assert_eq!(self.read_line(), "", "chunk not followed by CRLF");
        (size > 0).then_some(chunk)
    }

    fn read_response(&mut self) -> HttpResponse {
        let (status, headers) = self.read_head();
        let mut response = HttpResponse {
            status,
            headers,
            body: Vec::new(),
        };
        if let Some(length) = response.header("content-length") {
            response.body = vec![0; length.parse().unwrap()];
            self.reader.read_exact(&mut response.body).unwrap();
        } else {
            assert_eq!(response.header("transfer-encoding"), Some("chunked"));
            while let Some(chunk) = self.read_chunk() {
                response.body.extend_from_slice(&chunk);
            }
        }
        response
    }
}

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "sim-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello there"}]}
        ]
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// Prompt tokens of [`chat`]: ceil((8 + 11) / 4) + 4 per message.
const CHAT_PROMPT_TOKENS: u64 = 5 + 8;

/// The value of `name{model_name="model"}` in Prometheus text.
fn metric(text: &str, name: &str, model: &str) -> f64 {
    let prefix = format!("{name}{{model_name=\"{model}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        .parse()
        .unwrap()
}

/// Splits an OpenAI event stream into its `data:` payloads, checking the framing of each event.
fn openai_events(body: &str) -> Vec<&str> {
    assert!(body.ends_with("\n\n"), "stream must end with a blank line");
    body.split_terminator("\n\n")
        .map(|event| {
            assert!(!event.contains('\n'), "one line per event: {event:?}");
            event.strip_prefix("data: ").expect("data: prefix")
        })
        .collect()
}

#[test]
fn non_stream_chat_has_openai_shape_and_usage() {
    let sim = Sim::start(&["--output-tokens", "4"]);
    let response = sim.post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let value = response.json();
    assert!(value["id"].as_str().unwrap().starts_with("chatcmpl-sim-"));
    assert_eq!(value["object"], "chat.completion");
    assert!(value["created"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(value["model"], "sim-model");
    assert_eq!(value["choices"][0]["index"], 0);
    assert_eq!(value["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        value["choices"][0]["message"]["content"],
        "tok tok tok tok "
    );
    assert_eq!(value["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        value["usage"],
        json!({"prompt_tokens": CHAT_PROMPT_TOKENS, "completion_tokens": 4, "total_tokens": CHAT_PROMPT_TOKENS + 4})
    );
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let sim = Sim::start(&["--threads", "2"]);
    let mut connection = sim.connect();
    for _ in 0..3 {
        let body = chat(json!({"stream": true})).to_string();
        let response = connection.request("POST", "/v1/chat/completions", Some(&body));
        assert_eq!(response.status, 200);
        assert!(response.text().ends_with("data: [DONE]\n\n"));
        let response = connection.request("GET", "/health", None);
        assert_eq!(response.json(), json!({"status": "ok"}));
    }
}

#[test]
fn max_tokens_cut_the_answer_and_max_completion_tokens_wins() {
    let sim = Sim::start(&[]);
    let value = sim
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 3})))
        .json();
    assert_eq!(value["usage"]["completion_tokens"], 3);
    assert_eq!(value["choices"][0]["message"]["content"], "tok tok tok ");
    assert_eq!(value["choices"][0]["finish_reason"], "length");

    let value = sim
        .post(
            "/v1/chat/completions",
            &chat(json!({"max_tokens": 3, "max_completion_tokens": 2})),
        )
        .json();
    assert_eq!(value["usage"]["completion_tokens"], 2);

    // A limit above the natural length (16) changes nothing.
    let value = sim
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 100})))
        .json();
    assert_eq!(value["usage"]["completion_tokens"], 16);
    assert_eq!(value["choices"][0]["finish_reason"], "stop");
}

#[test]
fn stream_chat_is_framed_like_openai() {
    let sim = Sim::start(&["--output-tokens", "3", "--itl", "1ms"]);
    let response = sim.post("/v1/chat/completions", &chat(json!({"stream": true})));
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let body = response.text();
    let events = openai_events(&body);
    assert_eq!(events.len(), 1 + 3 + 1 + 1, "{body}");
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|event| serde_json::from_str(event).unwrap())
        .collect();
    let id = chunks[0]["id"].clone();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["model"], "sim-model");
        assert!(chunk.get("usage").is_none(), "usage only when asked for");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    for chunk in &chunks[1..4] {
        assert_eq!(chunk["choices"][0]["delta"], json!({"content": "tok "}));
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
    }
    assert_eq!(chunks[4]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
}

#[test]
fn stream_chat_with_include_usage_ends_with_a_usage_chunk() {
    let sim = Sim::start(&[]);
    let response = sim.post(
        "/v1/chat/completions",
        &chat(json!({"stream": true, "max_tokens": 2, "stream_options": {"include_usage": true}})),
    );
    let body = response.text();
    let events = openai_events(&body);
    assert_eq!(events.len(), 1 + 2 + 1 + 1 + 1, "{body}");
    assert_eq!(events[5], "[DONE]");
    let finish: Value = serde_json::from_str(events[3]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["usage"], Value::Null);
    let usage: Value = serde_json::from_str(events[4]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": CHAT_PROMPT_TOKENS, "completion_tokens": 2, "total_tokens": CHAT_PROMPT_TOKENS + 2})
    );
}

fn anthropic(extra: Value) -> Value {
    let mut body = json!({
        "model": "sim-model",
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

#[test]
fn anthropic_message_has_anthropic_shape() {
    let sim = Sim::start(&["--output-tokens", "4"]);
    let value = sim
        .post("/v1/messages", &anthropic(json!({"max_tokens": 2})))
        .json();
    assert!(value["id"].as_str().unwrap().starts_with("msg_sim_"));
    assert_eq!(value["type"], "message");
    assert_eq!(value["role"], "assistant");
    assert_eq!(value["model"], "sim-model");
    assert_eq!(
        value["content"],
        json!([{"type": "text", "text": "tok tok "}])
    );
    assert_eq!(value["stop_reason"], "max_tokens");
    assert_eq!(value["stop_sequence"], Value::Null);
    // The system prompt counts like an OpenAI system message.
    assert_eq!(
        value["usage"],
        json!({"input_tokens": CHAT_PROMPT_TOKENS, "output_tokens": 2})
    );

    let value = sim
        .post("/v1/messages", &anthropic(json!({"max_tokens": 1000})))
        .json();
    assert_eq!(value["stop_reason"], "end_turn");
    assert_eq!(value["usage"]["output_tokens"], 4);
}

#[test]
fn anthropic_requires_max_tokens() {
    let sim = Sim::start(&[]);
    for body in [anthropic(json!({})), anthropic(json!({"max_tokens": 0}))] {
        let response = sim.post("/v1/messages", &body);
        assert_eq!(response.status, 400);
        let value = response.json();
        assert_eq!(value["type"], "error");
        assert_eq!(value["error"]["type"], "invalid_request_error");
    }
}

#[test]
fn anthropic_stream_events_come_in_order_with_usage() {
    let sim = Sim::start(&["--output-tokens", "3", "--ttft", "5ms", "--itl", "1ms"]);
    let response = sim.post(
        "/v1/messages",
        &anthropic(json!({"stream": true, "max_tokens": 100})),
    );
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    let body = response.text();
    assert!(body.ends_with("\n\n"));
    let mut names = Vec::new();
    let mut data = Vec::new();
    for event in body.split_terminator("\n\n") {
        let (name_line, data_line) = event.split_once('\n').expect("event and data lines");
        let name = name_line.strip_prefix("event: ").unwrap();
        let value: Value = serde_json::from_str(data_line.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(value["type"], name, "data type matches the event name");
        names.push(name.to_owned());
        data.push(value);
    }
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        data[0]["message"]["usage"],
        json!({"input_tokens": CHAT_PROMPT_TOKENS, "output_tokens": 1})
    );
    assert_eq!(data[0]["message"]["content"], json!([]));
    assert_eq!(
        data[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        data[3]["delta"],
        json!({"type": "text_delta", "text": "tok "})
    );
    assert_eq!(data[7]["delta"]["stop_reason"], "end_turn");
    assert_eq!(data[7]["usage"], json!({"output_tokens": 3}));
}

#[test]
fn token_counting_embeddings_rerank_and_models() {
    let sim = Sim::start(&["--models", "alpha,beta", "--embedding-dim", "4"]);
    let value = sim
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": "beta", "system": "be brief", "messages": [{"role": "user", "content": "hello there"}]}),
        )
        .json();
    assert_eq!(value, json!({"input_tokens": CHAT_PROMPT_TOKENS}));

    let value = sim
        .post(
            "/v1/embeddings",
            &json!({"model": "alpha", "input": ["abcd", "efghi"]}),
        )
        .json();
    assert_eq!(value["object"], "list");
    assert_eq!(value["model"], "alpha");
    assert_eq!(value["data"].as_array().unwrap().len(), 2);
    assert_eq!(value["data"][1]["index"], 1);
    assert_eq!(value["data"][1]["object"], "embedding");
    assert_eq!(value["data"][0]["embedding"].as_array().unwrap().len(), 4);
    assert_eq!(
        value["usage"],
        json!({"prompt_tokens": 3, "total_tokens": 3})
    );
    let single = sim
        .post(
            "/v1/embeddings",
            &json!({"model": "alpha", "input": "abcd"}),
        )
        .json();
    assert_eq!(
        single["data"][0]["embedding"],
        value["data"][0]["embedding"]
    );

    let value = sim
        .post(
            "/v1/rerank",
            &json!({"model": "alpha", "query": "red fox", "documents": ["blue sky", "a red fox", "red"], "top_n": 2}),
        )
        .json();
    assert_eq!(value["model"], "alpha");
    assert_eq!(
        value["results"],
        json!([{"index": 1, "relevance_score": 1.0}, {"index": 2, "relevance_score": 0.5}])
    );
    assert!(value["usage"]["total_tokens"].as_u64().unwrap() > 0);

    let value = sim.get("/v1/models").json();
    assert_eq!(value["object"], "list");
    let ids: Vec<&str> = value["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| {
            assert_eq!(model["object"], "model");
            assert_eq!(model["owned_by"], "hivenet-sim");
            model["id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(ids, ["alpha", "beta"]);
}

#[test]
fn refusals_have_the_documented_status_and_envelope() {
    let sim = Sim::start(&[]);
    let response = sim.post(
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": []}),
    );
    assert_eq!(response.status, 404);
    assert_eq!(
        response.json(),
        json!({"error": {"message": "model nope not found", "type": "invalid_request_error"}})
    );

    let response = sim
        .connect()
        .request("POST", "/v1/chat/completions", Some("{not json"));
    assert_eq!(response.status, 400);
    assert_eq!(response.json()["error"]["type"], "invalid_request_error");

    let response = sim.post(
        "/v1/messages",
        &json!({"model": "nope", "max_tokens": 1, "messages": []}),
    );
    assert_eq!(response.status, 404);
    assert_eq!(response.json()["type"], "error");

    assert_eq!(sim.get("/v2/nothing").status, 404);
    assert_eq!(sim.get("/v1/chat/completions").status, 405);
    assert_eq!(sim.post("/metrics", &json!({})).status, 405);
}

#[test]
fn metrics_use_vllm_names_per_model() {
    let sim = Sim::start(&["--models", "alpha,beta"]);
    sim.post("/v1/chat/completions", &chat(json!({"model": "beta"})));
    let text = sim.metrics();
    for family in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "sim_requests_total",
        "sim_cancelled_total",
        "sim_in_flight",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} typed"
        );
        for model in ["alpha", "beta"] {
            let value = metric(&text, family, model);
            assert!(value.is_finite() && value >= 0.0);
        }
    }
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("series and value");
        assert!(series.ends_with("\"}"), "labelled series: {line}");
        value.parse::<f64>().expect("numeric value");
    }
    assert_eq!(metric(&text, "sim_requests_total", "beta"), 1.0);
    assert_eq!(metric(&text, "sim_requests_total", "alpha"), 0.0);
    assert_eq!(metric(&text, "vllm:kv_cache_usage_perc", "beta"), 0.0);
    // Prefix caching is off by default: nothing is looked up, the counters stay at 0.
    assert_eq!(
        metric(&text, "vllm:prefix_cache_queries_total", "beta"),
        0.0
    );
    assert_eq!(metric(&text, "vllm:prefix_cache_hits_total", "beta"), 0.0);
}

/// Prefix caching on, with 16-token blocks; every prompt token not found in the cache adds 1 ms to
/// the time to first token.
const PREFIX_CACHE_ARGS: [&str; 8] = [
    "--prefix-cache-blocks",
    "64",
    "--block-tokens",
    "16",
    "--prefill-per-token",
    "1ms",
    "--ttft",
    "0ms",
];

/// Tokens per cache block in [`PREFIX_CACHE_ARGS`].
const BLOCK_TOKENS: u64 = 16;

/// The cumulative count of the `vllm:time_to_first_token_seconds` bucket `le` of `model`.
fn ttft_bucket(text: &str, le: &str, model: &str) -> u64 {
    let prefix =
        format!("vllm:time_to_first_token_seconds_bucket{{le=\"{le}\",model_name=\"{model}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn prefix_cache_counts_queried_and_cached_tokens() {
    // One message: a 16-byte marker for the template's 4 tokens, then 330 bytes of text. At 4
    // bytes a token, that is 4 + ceil(330 / 4) = 87 prompt tokens, and 346 bytes make 5 whole
    // blocks of 64 bytes (16 tokens) plus a tail that is never cached.
    const PROMPT_TOKENS: u64 = 87;
    let long = "a".repeat(330);
    let sim = Sim::start(&PREFIX_CACHE_ARGS);
    let prompt = |text: &str| chat(json!({"messages": [{"role": "user", "content": text}]}));
    let send = |text: &str| {
        let response = sim.post("/v1/chat/completions", &prompt(text));
        assert_eq!(response.status, 200);
        assert_eq!(response.json()["usage"]["prompt_tokens"], PROMPT_TOKENS);
    };
    // Tokens looked up and tokens found, as the engine counts them.
    let counts = |text: &str| {
        (
            metric(text, "vllm:prefix_cache_queries_total", "sim-model") as u64,
            metric(text, "vllm:prefix_cache_hits_total", "sim-model") as u64,
        )
    };

    send(&long);
    let text = sim.metrics();
    assert_eq!(counts(&text), (PROMPT_TOKENS, 0));
    // Nothing was cached, so the first token waited at least 87 × 1 ms, above the 80 ms bucket.
    // Only this lower bound is checked: a sleep never ends early, so it cannot flake.
    assert_eq!(ttft_bucket(&text, "0.08", "sim-model"), 0);
    assert_eq!(ttft_bucket(&text, "+Inf", "sim-model"), 1);

    // The same prompt again finds its 5 whole blocks.
    send(&long);
    let text = sim.metrics();
    assert_eq!(counts(&text), (2 * PROMPT_TOKENS, 5 * BLOCK_TOKENS));

    // A prompt sharing only its first 165 bytes of text: 16 + 165 = 181 stream bytes in common,
    // which cover 2 whole blocks; the third block holds the first different byte.
    let half = format!("{}{}", "a".repeat(165), "b".repeat(165));
    send(&half);
    let text = sim.metrics();
    assert_eq!(counts(&text), (3 * PROMPT_TOKENS, (5 + 2) * BLOCK_TOKENS));
}

#[test]
fn anthropic_messages_reuse_the_blocks_of_the_same_openai_prompt() {
    // Two messages: 16 + 100 + 16 + 200 = 332 stream bytes, 5 whole blocks; 8 + 25 + 50 = 83
    // prompt tokens.
    const PROMPT_TOKENS: u64 = 83;
    let sim = Sim::start(&PREFIX_CACHE_ARGS);
    let system = "s".repeat(100);
    let user = "u".repeat(200);
    let openai = chat(json!({"messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user}
    ]}));
    let response = sim.post("/v1/chat/completions", &openai);
    assert_eq!(response.json()["usage"]["prompt_tokens"], PROMPT_TOKENS);
    let anthropic = anthropic(json!({
        "system": system,
        "messages": [{"role": "user", "content": [{"type": "text", "text": user}]}],
        "max_tokens": 4,
        "stream": true
    }));
    let response = sim.post("/v1/messages", &anthropic);
    assert_eq!(response.status, 200);
    let text = sim.metrics();
    assert_eq!(
        metric(&text, "vllm:prefix_cache_queries_total", "sim-model"),
        (2 * PROMPT_TOKENS) as f64
    );
    assert_eq!(
        metric(&text, "vllm:prefix_cache_hits_total", "sim-model"),
        (5 * BLOCK_TOKENS) as f64
    );

    // Embeddings are no generation: they neither query nor fill the cache.
    let response = sim.post(
        "/v1/embeddings",
        &json!({"model": "sim-model", "input": user}),
    );
    assert_eq!(response.status, 200);
    let after = sim.metrics();
    assert_eq!(
        metric(&after, "vllm:prefix_cache_queries_total", "sim-model"),
        (2 * PROMPT_TOKENS) as f64
    );
}

#[test]
fn control_pins_kv_usage_and_health() {
    let sim = Sim::start(&[]);
    let state = sim
        .post(
            "/sim/control",
            &json!({"kv_cache_usage": 0.95, "healthy": false}),
        )
        .json();
    assert_eq!(state["kv_cache_usage"], 0.95);
    assert_eq!(state["healthy"], false);
    assert_eq!(
        metric(&sim.metrics(), "vllm:kv_cache_usage_perc", "sim-model"),
        0.95
    );
    let response = sim.get("/health");
    assert_eq!(response.status, 503);

    // Absent fields are unchanged; null clears the pin.
    let state = sim
        .post("/sim/control", &json!({"kv_cache_usage": null}))
        .json();
    assert_eq!(state["kv_cache_usage"], Value::Null);
    assert_eq!(state["healthy"], false);
    assert_eq!(
        metric(&sim.metrics(), "vllm:kv_cache_usage_perc", "sim-model"),
        0.0
    );
    sim.post("/sim/control", &json!({"healthy": true}));
    assert_eq!(sim.get("/health").status, 200);

    let response = sim.post("/sim/control", &json!({"kv_cache_usage": 2}));
    assert_eq!(response.status, 400);
}

#[test]
fn concurrency_limit_queues_fifo_and_bounds_the_queue() {
    let sim = Sim::start(&[
        "--max-concurrency",
        "1",
        "--max-waiting",
        "1",
        "--ttft",
        "200ms",
    ]);
    let address = sim.address;
    let send = move || {
        let stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
        let mut connection = Connection {
            reader: BufReader::new(stream),
        };
        let body = chat(json!({})).to_string();
        connection
            .request("POST", "/v1/chat/completions", Some(&body))
            .json()
    };
    let first = thread::spawn(send);
    sim.wait_for_metrics("the first request to run", |text| {
        metric(text, "vllm:num_requests_running", "sim-model") == 1.0
    });
    let second = thread::spawn(send);
    let text = sim.wait_for_metrics("the second request to queue", |text| {
        metric(text, "vllm:num_requests_waiting", "sim-model") == 1.0
    });
    assert_eq!(metric(&text, "sim_in_flight", "sim-model"), 2.0);

    // The queue holds one request: a third is refused at once.
    let response = sim.post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(response.status, 503);
    assert!(response.json()["error"]["message"].is_string());

    let first = first.join().unwrap();
    let second = second.join().unwrap();
    // Ids are assigned at admission, so their order is the admission order.
    let serial = |value: &Value| -> u64 {
        value["id"]
            .as_str()
            .unwrap()
            .trim_start_matches("chatcmpl-sim-")
            .parse()
            .unwrap()
    };
    assert!(serial(&first) < serial(&second), "FIFO admission");
    let text = sim.metrics();
    assert_eq!(metric(&text, "vllm:num_requests_running", "sim-model"), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_waiting", "sim-model"), 0.0);
    assert_eq!(metric(&text, "sim_requests_total", "sim-model"), 2.0);
    assert_eq!(metric(&text, "sim_cancelled_total", "sim-model"), 0.0);
}

#[test]
fn client_disconnect_mid_stream_frees_capacity_and_counts_cancelled() {
    let sim = Sim::start(&[
        "--itl",
        "100ms",
        "--output-tokens",
        "100",
        "--kv-capacity-tokens",
        "1000",
    ]);
    let mut connection = sim.connect();
    let body = chat(json!({"stream": true})).to_string();
    connection.send("POST", "/v1/chat/completions", Some(&body));
    let (status, _headers) = connection.read_head();
    assert_eq!(status, 200);
    let first = connection.read_chunk().expect("a first event");
    assert!(first.starts_with(b"data: "));
    let text = sim.metrics();
    assert_eq!(metric(&text, "sim_in_flight", "sim-model"), 1.0);
    // Prompt plus at least the first token is held in the KV cache.
    assert!(
        metric(&text, "vllm:kv_cache_usage_perc", "sim-model")
            >= (CHAT_PROMPT_TOKENS + 1) as f64 / 1000.0
    );

    drop(connection);
    let text = sim.wait_for_metrics("the stream to be cancelled", |text| {
        metric(text, "sim_in_flight", "sim-model") == 0.0
            && metric(text, "sim_cancelled_total", "sim-model") == 1.0
    });
    assert_eq!(metric(&text, "vllm:kv_cache_usage_perc", "sim-model"), 0.0);
    assert_eq!(metric(&text, "vllm:num_requests_running", "sim-model"), 0.0);
}

#[test]
fn client_disconnect_while_queued_leaves_the_queue() {
    let sim = Sim::start(&["--max-concurrency", "1", "--ttft", "30s"]);
    let mut running = sim.connect();
    let body = chat(json!({})).to_string();
    running.send("POST", "/v1/chat/completions", Some(&body));
    sim.wait_for_metrics("the first request to run", |text| {
        metric(text, "vllm:num_requests_running", "sim-model") == 1.0
    });
    let mut queued = sim.connect();
    queued.send("POST", "/v1/chat/completions", Some(&body));
    sim.wait_for_metrics("the second request to queue", |text| {
        metric(text, "vllm:num_requests_waiting", "sim-model") == 1.0
    });

    drop(queued);
    sim.wait_for_metrics("the queued request to leave", |text| {
        metric(text, "vllm:num_requests_waiting", "sim-model") == 0.0
            && metric(text, "sim_cancelled_total", "sim-model") == 1.0
    });

    // A non-stream request abandoned while generating is cancelled too.
    drop(running);
    sim.wait_for_metrics("the running request to be cancelled", |text| {
        metric(text, "sim_in_flight", "sim-model") == 0.0
            && metric(text, "sim_cancelled_total", "sim-model") == 2.0
    });
}

#[test]
fn chunked_request_bodies_are_reassembled() {
    let sim = Sim::start(&["--output-tokens", "2"]);
    let body = chat(json!({})).to_string();
    let (head, tail) = body.split_at(body.len() / 2);
    let mut connection = sim.connect();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{head}\r\n{:x}\r\n{tail}\r\n0\r\n\r\n",
        head.len(),
        tail.len()
    );
    connection
        .reader
        .get_mut()
        .write_all(request.as_bytes())
        .unwrap();
    let response = connection.read_response();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(
        response.json()["usage"]["prompt_tokens"],
        CHAT_PROMPT_TOKENS
    );
}
