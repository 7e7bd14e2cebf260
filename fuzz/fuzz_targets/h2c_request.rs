//! h2c request mapping (`front::h2c`): client bytes after the HTTP/2 preface go through the
//! router's own HTTP/2 server settings (`server_builder`), and every request the server accepts
//! is routed (`route_of`) and mapped (`client_request`) as the stream task does.
//!
//! Asserts:
//! - nothing panics, in h2's frame and HPACK decoding under the router's settings or in the
//!   mapping;
//! - the mapped request carries the method, the target and the credentials exactly as sent, a
//!   body no larger than the router's limit, and a well-formed 36-byte request ID.
#![no_main]

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use fuzz_support::Wire;
use hivenet_router::wire::http::request::H2_PREFACE;
use hivenet_router::router::front::h2c;
use libfuzzer_sys::fuzz_target;

/// Most requests mapped per input: h2 accepts up to the router's 256 concurrent streams.
const REQUESTS_MAX: usize = 32;
/// The body limit of these runs (the router's is `--max-request-bytes`).
const BODY_BYTES_MAX: usize = 256 * 1024;

fuzz_target!(|data: &[u8]| {
    // The router sniffs the preface before it hands the socket to h2; start every input with it
    // so the fuzzer spends its time on frames.
    let mut input = Vec::with_capacity(H2_PREFACE.len() + data.len());
    if !data.starts_with(H2_PREFACE) {
        input.extend_from_slice(H2_PREFACE);
    }
    input.extend_from_slice(data);
    serve(Wire::idle_at_end(input));
});

/// Polls without waiting: the client is idle once its bytes are read, so whatever is pending then
/// waits for bytes that never come.
fn serve(wire: Wire) {
    let handshake = h2c::server_builder().handshake::<_, Bytes>(wire);
    let Some(Ok(mut connection)) = handshake.now_or_never() else {
        return;
    };
    let mut requests = Vec::new();
    while let Some(Some(Ok((request, respond)))) = connection.accept().now_or_never() {
        if requests.len() < REQUESTS_MAX {
            requests.push((request, respond));
        }
    }
    for (request, _respond) in requests {
        let (parts, mut body_stream) = request.into_parts();
        let Ok((route, method)) = h2c::route_of(&parts) else {
            continue;
        };
        assert_eq!(method, h2c::method_of(&parts.method));
        // The client is idle: what a stream holds is buffered already, never awaited.
        let mut body = BytesMut::new();
        while let Some(Some(Ok(chunk))) = body_stream.data().now_or_never() {
            if body.len() + chunk.len() > BODY_BYTES_MAX {
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let body = body.freeze();
        let mapped = h2c::client_request(&parts, route, method, body.clone(), Instant::now(), None);
        assert_eq!(mapped.route, route);
        assert_eq!(mapped.method, method);
        assert_eq!(mapped.body, body);
        let target = parts
            .uri
            .path_and_query()
            .map_or("/", |target| target.as_str());
        assert_eq!(&mapped.target[..], target.as_bytes());
        let header = |name: &str| parts.headers.get(name).map(|value| value.as_bytes());
        assert_eq!(mapped.authorization.as_deref(), header("authorization"));
        assert_eq!(mapped.x_api_key.as_deref(), header("x-api-key"));
        assert_eq!(
            mapped.anthropic_version.as_deref(),
            header("anthropic-version")
        );
        assert_eq!(mapped.anthropic_beta.as_deref(), header("anthropic-beta"));
        let id = mapped.request_id_str();
        assert_eq!(id.len(), 36, "request id {id:?}");
        for (index, byte) in id.bytes().enumerate() {
            if matches!(index, 8 | 13 | 18 | 23) {
                assert_eq!(byte, b'-', "request id {id:?}");
            } else {
                assert!(byte.is_ascii_hexdigit(), "request id {id:?}");
            }
        }
    }
}
