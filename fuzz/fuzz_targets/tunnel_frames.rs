//! The lean tunnel's frames (`tunnel::wire`) and multiplexer (`tunnel::mux`), as a connection
//! drives them with whatever its peer sends.
//!
//! Asserts:
//! - decoding never panics; bytes read in pieces give the same frames, and the same error, as
//!   read at once;
//! - every decoded frame encodes and decodes back to itself;
//! - the same bytes fed to a router's mux and to an agent's never panic, and an agent's mux
//!   never holds more than `STREAMS_MAX` streams.
#![no_main]

use bytes::BytesMut;
use fuzz_support::Cuts;
use hivenet_router::net::tunnel::mux::{Mux, Role, STREAMS_MAX};
use hivenet_router::net::tunnel::wire::{self, Frame, WireError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = decode_all(&mut BytesMut::from(data));
    let mut pieces = Vec::new();
    let mut buf = BytesMut::new();
    let mut failed = None;
    for piece in Cuts::new(data, 64).split(data) {
        buf.extend_from_slice(piece);
        match decode_all(&mut buf) {
            (frames, None) => pieces.extend(frames),
            (frames, Some(error)) => {
                pieces.extend(frames);
                failed = Some(error);
                break;
            }
        }
    }
    assert_eq!(failed, whole.1, "the same error read in pieces");
    if failed.is_none() {
        assert_eq!(pieces, whole.0, "the same frames read in pieces");
    }
    for frame in &whole.0 {
        let mut encoded = BytesMut::new();
        wire::encode(frame, &mut encoded);
        assert_eq!(wire::decode(&mut encoded), Ok(Some(frame.clone())));
        assert!(encoded.is_empty());
    }
    for role in [Role::Client, Role::Server] {
        let mut mux = Mux::new(role);
        let mut buf = BytesMut::from(data);
        let _ = mux.receive(&mut buf);
        while mux.poll_event().is_some() {}
        assert!(mux.open_streams() <= STREAMS_MAX);
        let _ = mux.take_output();
    }
});

/// Every whole frame at the front of `buf`, and the error that stopped the reading, if any.
fn decode_all(buf: &mut BytesMut) -> (Vec<Frame>, Option<WireError>) {
    let mut frames = Vec::new();
    loop {
        match wire::decode(buf) {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => return (frames, None),
            Err(error) => return (frames, Some(error)),
        }
    }
}
