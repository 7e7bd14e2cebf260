use super::*;

#[test]
fn the_engines_own_fields_reach_the_client_and_framing_or_router_fields_do_not() {
    let passes = |name: &str, streamed: bool| {
        reaches_client(
            &http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            streamed,
        )
    };
    for name in [
        "x-engine-trace",
        "server",
        "date",
        "set-cookie",
        "content-encoding",
    ] {
        assert!(passes(name, false) && passes(name, true), "{name}");
    }
    // A buffered answer carries the engine's caching rule; a stream has the router's.
    assert!(passes("cache-control", false));
    assert!(!passes("cache-control", true));
    for name in [
        "content-type",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-authenticate",
        "x-request-id",
        "traceparent",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
    ] {
        assert!(!passes(name, false) && !passes(name, true), "{name}");
    }
}

/// A sink that keeps what a head was written with, as a connection's buffer would: copied.
#[derive(Default)]
struct HeadRecorder {
    status: u16,
    content_type: String,
    fields: Vec<(String, Vec<u8>)>,
}

impl Sink for HeadRecorder {
    async fn respond(
        &mut self,
        _: u16,
        _: &str,
        _: &[(&str, &[u8])],
        _: &[u8],
    ) -> Result<(), ClientGone> {
        unreachable!("a streamed answer's head only")
    }

    async fn start_stream(
        &mut self,
        status: u16,
        content_type: &str,
        extra_headers: &[(&str, &[u8])],
    ) -> Result<(), ClientGone> {
        self.status = status;
        self.content_type = content_type.to_owned();
        self.fields = extra_headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_vec()))
            .collect();
        Ok(())
    }

    async fn start_keepalive(&mut self, _: &str) -> Result<(), ClientGone> {
        unreachable!("a streamed answer's head only")
    }

    async fn stream_data(&mut self, _: &[u8]) -> Result<(), ClientGone> {
        unreachable!("a streamed answer's head only")
    }

    async fn end_stream(&mut self) -> Result<(), ClientGone> {
        unreachable!("a streamed answer's head only")
    }

    async fn until_client_gone<F: std::future::Future>(&mut self, future: F) -> Option<F::Output> {
        Some(future.await)
    }

    fn close_after(&mut self) {}

    fn status(&self) -> u16 {
        self.status
    }

    fn set_request_id(&mut self, _: [u8; 36]) {}

    fn set_traceparent(
        &mut self,
        _: Option<[u8; crate::net::telemetry::context::TRACEPARENT_LEN]>,
    ) {
    }
}

#[test]
fn a_streamed_answers_head_is_let_go_once_the_clients_head_is_written() {
    // The engine's head as the lean tunnel decodes it: field values are slices of the read
    // that brought the frame (`tunnel::wire::Head::fields`).
    let read = Bytes::from(
        b"text/event-stream; charset=utf-8engine-7, and the rest of a 16 KiB read".to_vec(),
    );
    let mut engine = http::Response::new(());
    *engine.status_mut() = http::StatusCode::OK;
    let headers = engine.headers_mut();
    let shared = |range: std::ops::Range<usize>| {
        http::HeaderValue::from_maybe_shared(read.slice(range)).unwrap()
    };
    headers.insert(http::header::CONTENT_TYPE, shared(0..32));
    headers.insert("x-engine-trace", shared(32..40));
    headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from_static("9"),
    );
    let (head, ()) = engine.into_parts();
    assert!(!read.is_unique(), "the head shares the read");

    let mut sink = HeadRecorder::default();
    let remaining = Remaining {
        requests: Some(41),
        tokens: None,
    };
    let started = start_streamed(&mut sink, head, remaining).now_or_never();
    assert_eq!(started, Some(Ok(())));
    assert!(
        read.is_unique(),
        "the engine's head still pins the tunnel read once the client's head is written"
    );
    assert_eq!(sink.status, 200);
    assert_eq!(sink.content_type, "text/event-stream; charset=utf-8");
    let expected = [
        ("x-ratelimit-remaining-requests".to_owned(), b"41".to_vec()),
        ("x-engine-trace".to_owned(), b"engine-7".to_vec()),
    ];
    assert_eq!(sink.fields, expected);
}

fn client_request(route: Route, anthropic_version: Option<&'static str>) -> ClientRequest {
    ClientRequest {
        route,
        method: crate::wire::http::request::Method::Post,
        target: Bytes::from_static(b"/v1/x"),
        body: Bytes::new(),
        request_id: *b"5f0c6a1e-8b2d-4c3f-9a7e-1d2b3c4d5e6f",
        client_id: None,
        anthropic_version: anthropic_version.map(|value| Bytes::from_static(value.as_bytes())),
        anthropic_beta: None,
        authorization: None,
        x_api_key: None,
        received_at: Instant::now(),
        peer: None,
        span: None,
    }
}

#[test]
fn the_agent_gets_the_route_path_json_and_a_never_indexed_request_id() {
    let paths = [
        (Route::ChatCompletions, "/v1/chat/completions"),
        (Route::Messages, "/v1/messages"),
        (Route::CountTokens, "/v1/messages/count_tokens"),
        (Route::Embeddings, "/v1/embeddings"),
        (Route::Rerank, "/v1/rerank"),
    ];
    for (route, path) in paths {
        let upstream = upstream_request(&client_request(route, None));
        assert_eq!(upstream.method(), http::Method::POST);
        assert_eq!(upstream.uri().scheme_str(), Some("http"));
        assert_eq!(upstream.uri().authority().unwrap(), "agent");
        assert_eq!(upstream.uri().path(), path);
        let headers = upstream.headers();
        assert_eq!(headers.len(), 2, "{headers:?}");
        assert_eq!(headers[http::header::CONTENT_TYPE], "application/json");
        assert_eq!(
            headers[&X_REQUEST_ID],
            "5f0c6a1e-8b2d-4c3f-9a7e-1d2b3c4d5e6f"
        );
        assert!(headers[&X_REQUEST_ID].is_sensitive());
    }
    let messages = upstream_request(&client_request(Route::Messages, Some("2023-06-01")));
    assert_eq!(messages.headers()[&ANTHROPIC_VERSION], "2023-06-01");
    assert!(!messages.headers().contains_key(&ANTHROPIC_BETA));
}

/// The JSON of an event's `data:` line.
fn data(event: &[u8]) -> serde_json::Value {
    let text = std::str::from_utf8(event).unwrap();
    assert!(text.ends_with("\n\n"), "{text:?}");
    let line = text.lines().find_map(|line| line.strip_prefix("data: "));
    serde_json::from_str(line.expect("a data line")).unwrap()
}

#[test]
fn mid_stream_errors_say_whether_the_backend_or_the_agent_failed() {
    let backend = data(stream_error_event(Dialect::OpenAi, true));
    assert_eq!(backend["error"]["code"], "backend_error");
    assert_eq!(backend["error"]["source"], "backend");
    let lost = data(stream_error_event(Dialect::OpenAi, false));
    assert_eq!(lost["error"]["code"], "agent_disconnected");
    assert_eq!(lost["error"]["source"], "router");
    let backend = data(stream_error_event(Dialect::Anthropic, true));
    assert_eq!(backend["type"], "error");
    assert!(
        backend["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("backend_error")
    );
    let lost = data(stream_error_event(Dialect::Anthropic, false));
    assert_eq!(lost["error"]["type"], "api_error");
    // The seed: an Anthropic `error` event's message starts with the error code.
    assert!(
        lost["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("agent_disconnected: ")
    );
}
