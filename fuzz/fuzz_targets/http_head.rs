//! The HTTP/1.1 request head parser (`http::request`), as a connection drives it.
//!
//! Asserts, for the default limits and for small ones:
//! - `parse_head` never panics; a parsed head lies inside the limit and every span inside the head;
//! - reading the same bytes in pieces (`HeadWait` deciding when to parse, as the connection does)
//!   reaches the same head or the same error as parsing them at once, and never misses a head
//!   that is complete;
//! - bytes after a complete head (the body, a pipelined request) do not change it;
//! - `is_h2_preface` answers a prefix consistently with the whole.
#![no_main]

use fuzz_support::Cuts;
use hivenet_router::wire::http::request::{self, HeadLimits, HeadWait, RequestHead};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let small = HeadLimits {
        head_bytes_max: 256,
        headers_count_max: 8,
    };
    for limits in [HeadLimits::default(), small] {
        check(data, &limits);
    }
    check_preface(data);
});

fn check(data: &[u8], limits: &HeadLimits) {
    let whole = request::parse_head(data, limits);
    if let Ok(Some(head)) = &whole {
        check_head(data, head, limits);
        // What follows a complete head belongs to the body or the next request.
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"POST / HTTP/1.1\r\n\r\n");
        assert_eq!(request::parse_head(&longer, limits), whole);
    }

    // The connection: read a piece, ask HeadWait, parse the whole buffer when it says so.
    let mut wait = HeadWait::default();
    let mut buf = Vec::new();
    let mut outcome = None;
    for piece in Cuts::new(data, 64).split(data) {
        buf.extend_from_slice(piece);
        if !wait.ready(&buf, limits) {
            continue;
        }
        match request::parse_head(&buf, limits) {
            Ok(None) => {}
            decided => {
                outcome = Some(decided);
                break;
            }
        }
    }
    match outcome {
        Some(Ok(Some(head))) => {
            assert_eq!(whole, Ok(Some(head)), "a head read in pieces differs");
        }
        Some(Err(error)) => assert_eq!(whole, Err(error), "an error read in pieces differs"),
        Some(Ok(None)) => unreachable!("Ok(None) is not an outcome"),
        None => assert!(
            !matches!(whole, Ok(Some(_))),
            "a complete head was never parsed: HeadWait missed its blank line"
        ),
    }
}

fn check_head(data: &[u8], head: &RequestHead, limits: &HeadLimits) {
    assert!(head.head_bytes <= data.len());
    assert!(head.head_bytes <= limits.head_bytes_max);
    assert!(head.headers_count <= limits.headers_count_max);
    let spans = [Some(head.method_span), Some(head.path), head.query]
        .into_iter()
        .chain([
            head.host,
            head.authorization,
            head.x_api_key,
            head.content_type,
            head.x_request_id,
            head.x_client_request_id,
            head.anthropic_version,
            head.upgrade,
        ])
        .flatten();
    for span in spans {
        assert!(span.start <= span.end && span.end as usize <= head.head_bytes);
        let _ = span.get(data);
    }
    let mut headers = 0;
    for (name, value) in head.headers(data) {
        headers += 1;
        let _ = (name, value);
    }
    assert_eq!(headers, head.headers_count);
    let _ = head.header(data, "content-type");
    let _ = hivenet_router::router::api::request::route(head.method, head.path(data));
}

fn check_preface(data: &[u8]) {
    let whole = request::is_h2_preface(data);
    for end in 0..data.len().min(request::H2_PREFACE.len() + 1) {
        match request::is_h2_preface(&data[..end]) {
            // Undecided on a prefix: the whole may go either way.
            None => {}
            decided => assert_eq!(decided, whole),
        }
    }
}
