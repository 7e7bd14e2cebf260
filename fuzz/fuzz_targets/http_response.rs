//! The HTTP/1.1 response head parser (`http::client`), as the agent's engine client drives it.
//!
//! Asserts:
//! - `parse_response_head` never panics; a parsed head lies inside the input and the limit;
//! - reading the same bytes in pieces, parsing the grown buffer after each read (as
//!   `agent::engine_client` does), reaches the same head or the same error as parsing them at
//!   once: every prefix shorter than a complete head asks for more;
//! - bytes after a complete head (its body) do not change it;
//! - the framing agrees with the fields: no body for 1xx, 204 and 304; a length only from a
//!   `content-length` that says it, chunked only with a `transfer-encoding`; a connection kept
//!   open only when the body has a known end.
#![no_main]

use fuzz_support::Cuts;
use hivenet_router::wire::http::client::{self, Framing, RESPONSE_HEAD_BYTES_MAX, ResponseHead};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = client::parse_response_head(data);
    if let Ok(Some(head)) = &whole {
        check_head(data, head);
        let mut longer = data.to_vec();
        longer.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(&client::parse_response_head(&longer), &whole);
    }

    let mut buf = Vec::new();
    for piece in Cuts::new(data, 64).split(data) {
        buf.extend_from_slice(piece);
        match client::parse_response_head(&buf) {
            Ok(None) => continue,
            read => {
                assert_eq!(read, whole, "read in pieces up to {} bytes", buf.len());
                return;
            }
        }
    }
    // Never complete when read in pieces: not complete at once either.
    assert!(
        matches!(whole, Ok(None)),
        "{whole:?} missed when read in pieces"
    );
});

fn check_head(data: &[u8], head: &ResponseHead) {
    assert!(head.head_bytes <= data.len() && head.head_bytes <= RESPONSE_HEAD_BYTES_MAX);
    assert!((100..1000).contains(&head.status));
    let bodiless = head.is_interim() || head.status == 204 || head.status == 304;
    if bodiless {
        assert_eq!(head.framing, Framing::Empty);
    }
    match head.framing {
        Framing::Length(length) => {
            assert!(length > 0);
            let stated = head.headers.get_all("content-length").iter().any(|value| {
                value
                    .to_str()
                    .is_ok_and(|text| text.split(',').any(|part| part.trim().parse() == Ok(length)))
            });
            assert!(stated, "a length no content-length states");
        }
        Framing::Chunked => assert!(head.headers.contains_key("transfer-encoding")),
        Framing::UntilClose => assert!(!head.keep_alive),
        Framing::Empty => {}
    }
}
