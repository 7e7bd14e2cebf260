//! The chunked request-body decoder (`http::chunked`) and the chunk writer (`http::response`).
//!
//! Asserts:
//! - decoding never panics and never yields or announces more body bytes than the limit;
//! - the input fed in pieces, as a connection reads it (unconsumed bytes kept and fed again),
//!   decodes to the same body, the same end and the same error as fed at once;
//! - a decoder that is not done has consumed its whole input (it keeps no bytes of its own), and
//!   one that is done consumes nothing after the last chunk;
//! - round trip: the input taken as a body, cut into chunks by `write_chunk` and ended by
//!   `write_last_chunk`, decodes to exactly that body, with a pipelined request left unconsumed;
//!   the same encoding under a limit one byte short of the body is refused as too large.
#![no_main]

use fuzz_support::Cuts;
use hivenet_router::wire::http::chunked::{BodyError, ChunkedDecoder};
use hivenet_router::wire::http::response;
use libfuzzer_sys::fuzz_target;

/// The decoder's body limit in these runs: small enough that fuzzed sizes reach it.
const BODY_BYTES_MAX: u64 = 64 * 1024;

/// Everything one decode session produced.
#[derive(Debug, PartialEq)]
struct Decoded {
    body: Vec<u8>,
    /// Input bytes consumed in total.
    consumed: usize,
    result: Result<bool, BodyError>,
}

fuzz_target!(|data: &[u8]| {
    let whole = decode_whole(data, BODY_BYTES_MAX);
    assert!(whole.body.len() as u64 <= BODY_BYTES_MAX);
    match whole.result {
        Ok(false) => assert_eq!(
            whole.consumed,
            data.len(),
            "an unfinished body keeps input back"
        ),
        Ok(true) => assert!(whole.consumed <= data.len()),
        Err(_) => {}
    }
    let pieces = decode_in_pieces(data, BODY_BYTES_MAX);
    match whole.result {
        // The bytes before an error are not promised to be the same, only the error.
        Err(error) => assert_eq!(pieces.result, Err(error)),
        Ok(_) => assert_eq!(pieces, whole),
    }
    round_trip(data);
});

fn decode_whole(input: &[u8], body_bytes_max: u64) -> Decoded {
    let mut decoder = ChunkedDecoder::new(body_bytes_max);
    let mut body = Vec::new();
    match decoder.decode(input, &mut body) {
        Ok(progress) => {
            assert_eq!(progress.done, decoder.is_done());
            // Announced bytes run ahead of decoded ones only while a chunk is arriving.
            assert!(body.len() as u64 <= decoder.body_bytes());
            assert!(decoder.body_bytes() <= body_bytes_max);
            if progress.done {
                assert_eq!(decoder.body_bytes(), body.len() as u64);
            }
            Decoded {
                body,
                consumed: progress.consumed,
                result: Ok(progress.done),
            }
        }
        Err(error) => Decoded {
            body,
            consumed: 0,
            result: Err(error),
        },
    }
}

/// As the connection reads: pieces appended to a buffer, the consumed prefix dropped.
fn decode_in_pieces(input: &[u8], body_bytes_max: u64) -> Decoded {
    let mut decoder = ChunkedDecoder::new(body_bytes_max);
    let mut body = Vec::new();
    let mut buffered = Vec::new();
    let mut consumed = 0;
    for piece in Cuts::new(input, 48).split(input) {
        buffered.extend_from_slice(piece);
        match decoder.decode(&buffered, &mut body) {
            Ok(progress) => {
                consumed += progress.consumed;
                buffered.drain(..progress.consumed);
                if progress.done {
                    return Decoded {
                        body,
                        consumed,
                        result: Ok(true),
                    };
                }
            }
            Err(error) => {
                return Decoded {
                    body,
                    consumed: 0,
                    result: Err(error),
                };
            }
        }
    }
    Decoded {
        body,
        consumed,
        result: Ok(false),
    }
}

fn round_trip(body: &[u8]) {
    let mut encoded = Vec::new();
    let mut cuts = Cuts::new(body, 300);
    for chunk in cuts.split(body) {
        response::write_chunk(&mut encoded, chunk);
    }
    response::write_last_chunk(&mut encoded);
    let encoded_len = encoded.len();
    encoded.extend_from_slice(b"GET /health HTTP/1.1\r\n\r\n");

    let limit = BODY_BYTES_MAX.max(body.len() as u64);
    let whole = decode_whole(&encoded, limit);
    assert_eq!(whole.result, Ok(true));
    assert_eq!(whole.body, body);
    assert_eq!(whole.consumed, encoded_len);
    assert_eq!(decode_in_pieces(&encoded, limit), whole);

    if !body.is_empty() {
        let short = decode_whole(&encoded, body.len() as u64 - 1);
        assert_eq!(short.result, Err(BodyError::TooLarge));
    }
}
