//! Proves that the provider fallback client, called through `ProviderPool` from a monoio or tokio
//! runtime, talks to a real `hivenet-sim` standing in for OpenAI and Anthropic: it returns a
//! translated answer with the provider's usage and `processed_by`, sends each provider's auth
//! headers, refuses a provider without a key, and fails fast and typed when the provider is
//! unreachable, refuses, or is slower than the request deadline.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hivenet_router::base::ids::Dialect;
use hivenet_router::router::provider::settings::{
    ANTHROPIC_API_KEY_VARIABLE, ANTHROPIC_BASE_URL_VARIABLE, OPENAI_API_KEY_VARIABLE,
    OPENAI_BASE_URL_VARIABLE,
};
use hivenet_router::router::provider::{
    ConfigError, PoolSettings, ProviderAnswer, ProviderConfig, ProviderEngine, ProviderError,
    ProviderPool, ProviderRequest, ProviderSettings,
};
use serde_json::{Value, json};

/// A running `hivenet-sim`, killed on drop.
struct Sim {
    child: Child,
    address: SocketAddr,
}

impl Sim {
    fn start(extra_args: &[&str]) -> Sim {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let directory = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "provider-client-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        let ready_file = directory.join("address");
        let mut child = Command::new(env!("CARGO_BIN_EXE_hivenet-sim"))
            .args(["--listen", "127.0.0.1:0", "--ready-file"])
            .arg(&ready_file)
            .args(extra_args)
            .stdout(Stdio::null())
            .spawn()
            .expect("hivenet-sim starts");
        let address = common::poll(common::WAIT, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("hivenet-sim exited early: {status}");
            }
            std::fs::read_to_string(&ready_file)
                .ok()?
                .trim()
                .parse()
                .ok()
        });
        match address {
            Some(address) => Sim { child, address },
            None => {
                let _ = child.kill();
                panic!("hivenet-sim never became ready");
            }
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn settings(pairs: &[(&str, String)]) -> ProviderSettings {
    ProviderSettings::from_lookup(|name| {
        pairs
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.clone())
    })
    .expect("valid provider settings")
}

/// Settings with both keys, both providers at `url`.
fn both_at(url: &str) -> ProviderSettings {
    settings(&[
        (OPENAI_API_KEY_VARIABLE, "sk-test-openai".into()),
        (ANTHROPIC_API_KEY_VARIABLE, "sk-test-anthropic".into()),
        (OPENAI_BASE_URL_VARIABLE, url.into()),
        (ANTHROPIC_BASE_URL_VARIABLE, url.into()),
    ])
}

fn start_pool(settings: ProviderSettings) -> ProviderPool {
    ProviderPool::start(settings, PoolSettings::default()).expect("provider pool starts")
}

fn chat_body() -> Bytes {
    Bytes::from(
        serde_json::to_vec(&json!({
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "stream": false,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Reply with the word fallback."},
            ],
            "max_tokens": 5,
        }))
        .unwrap(),
    )
}

fn request(engine: ProviderEngine, model: &str, timeout: Duration) -> ProviderRequest {
    ProviderRequest::new(
        &ProviderConfig {
            engine,
            model: model.into(),
        },
        Dialect::OpenAi,
        chat_body(),
        Instant::now() + timeout,
    )
}

/// Awaits the call on a monoio runtime, the shards' executor.
fn call_on_monoio(
    pool: &ProviderPool,
    request: ProviderRequest,
) -> Result<ProviderAnswer, ProviderError> {
    let mut runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()
        .expect("monoio runtime");
    runtime.block_on(pool.call(request))
}

/// Awaits the call on a tokio current-thread runtime.
fn call_on_tokio(
    pool: &ProviderPool,
    request: ProviderRequest,
) -> Result<ProviderAnswer, ProviderError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(pool.call(request))
}

fn json_of(answer: &ProviderAnswer) -> Value {
    serde_json::from_slice(&answer.body).expect("the answer is JSON")
}

#[test]
fn openai_path_returns_a_chat_completion_with_usage_and_processed_by() {
    let sim = Sim::start(&[]);
    let pool = start_pool(both_at(&sim.url()));
    let answer = call_on_monoio(
        &pool,
        request(ProviderEngine::OpenAi, "sim-model", Duration::from_secs(20)),
    )
    .expect("the openai call succeeds");
    let body = json_of(&answer);
    assert_eq!(body["processed_by"], "provider:openai");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(
        body["model"], "sim-model",
        "the provider model replaced the client's"
    );
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "tok tok tok tok tok "
    );
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let usage = answer.usage.expect("usage reported");
    assert_eq!(usage.output_tokens, 5);
    assert!(usage.input_tokens > 0);
    assert_eq!(body["usage"]["prompt_tokens"], usage.input_tokens);

    assert_rendered(
        &pool,
        "http_client_request_duration_seconds_count{provider=\"openai\",status_code=\"200\"} 1",
    );
}

#[test]
fn anthropic_path_returns_a_translated_chat_completion() {
    let sim = Sim::start(&[]);
    let pool = start_pool(both_at(&sim.url()));
    let answer = call_on_monoio(
        &pool,
        request(
            ProviderEngine::Anthropic,
            "sim-model",
            Duration::from_secs(20),
        ),
    )
    .expect("the anthropic call succeeds");
    let body = json_of(&answer);
    assert_eq!(body["processed_by"], "provider:anthropic");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "sim-model");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "tok tok tok tok tok "
    );
    // The sim stops at max_tokens: Anthropic's `max_tokens` maps to `length`.
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let usage = answer.usage.expect("usage reported");
    assert_eq!(usage.output_tokens, 5);
    assert!(usage.input_tokens > 0);
    assert_eq!(
        body["usage"]["total_tokens"],
        usage.input_tokens + usage.output_tokens
    );
}

#[test]
fn messages_clients_get_an_anthropic_message_back() {
    let sim = Sim::start(&[]);
    let pool = start_pool(both_at(&sim.url()));
    for engine in [ProviderEngine::OpenAi, ProviderEngine::Anthropic] {
        let body = json!({
            "model": "claude-local", "max_tokens": 3, "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        });
        let request = ProviderRequest::new(
            &ProviderConfig {
                engine,
                model: "sim-model".into(),
            },
            Dialect::Anthropic,
            Bytes::from(serde_json::to_vec(&body).unwrap()),
            Instant::now() + Duration::from_secs(20),
        );
        let answer = call_on_tokio(&pool, request).expect("the call succeeds");
        let body = json_of(&answer);
        assert_eq!(body["type"], "message", "{engine}");
        assert_eq!(body["content"][0]["text"], "tok tok tok ", "{engine}");
        assert_eq!(body["stop_reason"], "max_tokens", "{engine}");
        assert_eq!(body["usage"]["output_tokens"], 3, "{engine}");
        assert_eq!(body["processed_by"], engine.processed_by());
    }
}

#[test]
fn a_provider_without_a_key_is_refused_at_validation_and_by_the_pool() {
    let settings = settings(&[(OPENAI_API_KEY_VARIABLE, "sk-test-openai".into())]);
    let anthropic = ProviderConfig {
        engine: ProviderEngine::Anthropic,
        model: "claude-x".into(),
    };
    assert_eq!(
        anthropic.validate(&settings),
        Err(ConfigError::KeyMissing {
            engine: ProviderEngine::Anthropic,
            variable: ANTHROPIC_API_KEY_VARIABLE,
        })
    );
    // A caller that skipped validation still gets a typed refusal and nothing is sent.
    let pool = start_pool(settings);
    let refused = call_on_tokio(
        &pool,
        request(
            ProviderEngine::Anthropic,
            "claude-x",
            Duration::from_secs(5),
        ),
    );
    assert_eq!(refused.unwrap_err(), ProviderError::NotConfigured);
}

#[test]
fn an_unreachable_provider_fails_fast_as_a_network_error() {
    // A port nothing listens on: the connection is refused at once.
    let url = format!("http://127.0.0.1:{}", common::free_port());
    let pool = start_pool(both_at(&url));
    let started = Instant::now();
    let failed = call_on_monoio(
        &pool,
        request(ProviderEngine::OpenAi, "sim-model", Duration::from_secs(30)),
    );
    assert_eq!(failed.unwrap_err(), ProviderError::Network);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_rendered(
        &pool,
        "http_client_request_duration_seconds_count{provider=\"openai\",status_code=\"0\"} 1",
    );
}

#[test]
fn https_to_a_plain_http_server_fails_as_a_network_error() {
    // The TLS path (rustls, ring, webpki roots) runs and fails the handshake; it must not hang
    // until the deadline or be mistaken for an answer.
    let sim = Sim::start(&[]);
    let pool = start_pool(both_at(&format!("https://{}", sim.address)));
    let started = Instant::now();
    let failed = call_on_monoio(
        &pool,
        request(
            ProviderEngine::Anthropic,
            "sim-model",
            Duration::from_secs(20),
        ),
    );
    assert_eq!(failed.unwrap_err(), ProviderError::Network);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_deadline_shorter_than_the_provider_latency_times_out_at_the_deadline() {
    let sim = Sim::start(&["--ttft", "2s"]);
    let pool = start_pool(both_at(&sim.url()));
    for engine in [ProviderEngine::OpenAi, ProviderEngine::Anthropic] {
        let started = Instant::now();
        let failed = call_on_monoio(
            &pool,
            request(engine, "sim-model", Duration::from_millis(300)),
        );
        let elapsed = started.elapsed();
        assert_eq!(failed.unwrap_err(), ProviderError::Timeout, "{engine}");
        assert!(
            elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1500),
            "{engine}: answered after {elapsed:?}"
        );
    }
    // A deadline already passed is refused without any call.
    let expired = call_on_tokio(
        &pool,
        request(ProviderEngine::OpenAi, "sim-model", Duration::ZERO),
    );
    assert_eq!(expired.unwrap_err(), ProviderError::Expired);
}

#[test]
fn a_provider_refusal_is_a_typed_status_error() {
    let sim = Sim::start(&[]);
    let pool = start_pool(both_at(&sim.url()));
    // The sim answers 404 for a model it does not serve, as a provider does.
    let refused = call_on_tokio(
        &pool,
        request(
            ProviderEngine::Anthropic,
            "no-such-model",
            Duration::from_secs(20),
        ),
    );
    let error = refused.unwrap_err();
    assert_eq!(error, ProviderError::Status(404));
    assert_eq!(
        error.message(),
        "the provider does not offer the configured model"
    );
    // A streaming request never reaches the provider.
    let streaming = ProviderRequest::new(
        &ProviderConfig {
            engine: ProviderEngine::OpenAi,
            model: "sim-model".into(),
        },
        Dialect::OpenAi,
        Bytes::from_static(
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}"#,
        ),
        Instant::now() + Duration::from_secs(20),
    );
    assert!(matches!(
        call_on_tokio(&pool, streaming),
        Err(ProviderError::Unsupported(_))
    ));
}

/// Serves one HTTP/1.1 request on `listener` with `answer`, returning the request head and body.
fn serve_once(listener: TcpListener, answer: Value) -> std::thread::JoinHandle<(String, Value)> {
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        stream.set_read_timeout(Some(common::READ_TIMEOUT)).unwrap();
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let length: usize = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .expect("content-length");
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let answer = answer.to_string();
        let mut stream = reader.into_inner();
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        )
        .unwrap();
        (head, serde_json::from_slice(&body).unwrap())
    })
}

#[test]
fn each_provider_gets_its_own_auth_headers_path_and_model() {
    let openai_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let anthropic_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let settings = settings(&[
        (OPENAI_API_KEY_VARIABLE, "sk-openai-1".into()),
        (ANTHROPIC_API_KEY_VARIABLE, "sk-anthropic-1".into()),
        (
            OPENAI_BASE_URL_VARIABLE,
            format!("http://{}/gateway", openai_listener.local_addr().unwrap()),
        ),
        (
            ANTHROPIC_BASE_URL_VARIABLE,
            format!("http://{}", anthropic_listener.local_addr().unwrap()),
        ),
    ]);
    let pool = start_pool(settings);

    let openai = serve_once(
        openai_listener,
        json!({"id": "c", "model": "gpt-x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
    );
    call_on_tokio(
        &pool,
        request(ProviderEngine::OpenAi, "gpt-x", Duration::from_secs(20)),
    )
    .expect("openai answer");
    let (head, sent) = openai.join().unwrap();
    let head = head.to_ascii_lowercase();
    assert!(
        head.starts_with("post /gateway/v1/chat/completions http/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("authorization: bearer sk-openai-1\r\n"),
        "{head}"
    );
    assert!(
        head.contains("content-type: application/json\r\n"),
        "{head}"
    );
    assert_eq!(sent["model"], "gpt-x");
    assert!(sent.get("stream").is_none());

    let anthropic = serve_once(
        anthropic_listener,
        json!({"id": "m", "type": "message", "model": "claude-x", "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}),
    );
    call_on_tokio(
        &pool,
        request(
            ProviderEngine::Anthropic,
            "claude-x",
            Duration::from_secs(20),
        ),
    )
    .expect("anthropic answer");
    let (head, sent) = anthropic.join().unwrap();
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("post /v1/messages http/1.1\r\n"), "{head}");
    assert!(head.contains("x-api-key: sk-anthropic-1\r\n"), "{head}");
    assert!(head.contains("anthropic-version: 2023-06-01\r\n"), "{head}");
    assert!(!head.contains("authorization"), "{head}");
    assert_eq!(sent["model"], "claude-x");
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["max_tokens"], 5);
}

/// The pool's metrics text contains `line`.
fn assert_rendered(pool: &ProviderPool, line: &str) {
    let mut families = Vec::new();
    hivenet_router::router::metrics::Collect::collect(pool.metrics().as_ref(), &mut families);
    let metrics = hivenet_router::router::metrics::encode(families);
    assert!(metrics.contains(line), "{metrics}");
}
