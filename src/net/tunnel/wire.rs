//! The frames of the lean tunnel codec: what replaces HTTP/2 between a router shard and an agent
//! when both ends speak it (`preamble::Codec`). Pure: bytes in, frames out, and back; the
//! streams, their flow control and the connection's I/O are the multiplexer's, not this module's.
//!
//! Why: under callgrind, `h2` is about 35 % of the router's instructions per request and about
//! 54 % of the agent's
//! (`perf/notes/2026-12-02-engine-client-without-hyper-and-a-smaller-request-future.md`). The
//! tunnel needs little of HTTP/2: one peer on a trusted, authenticated connection; heads of a few
//! fields; no priorities, no server push, no header compression state to keep in step (its
//! fields are short, and the loopback or LAN carries the bytes for less than HPACK's Huffman
//! coding costs to make them).
//!
//! ```text
//! frame    = length: u32 BE (payload bytes) | kind: u8 | flags: u8 | stream: u32 BE | payload
//! REQUEST  kind 1, router -> agent: method_len: u8 | method | target_len: u16 | target | fields
//! RESPONSE kind 2, agent -> router: status: u16 | fields
//!          flag END on either head: no body follows
//! DATA     kind 3: body bytes; flag END: the body's last
//! RESET    kind 4: reason: u32 (HTTP/2's codes: CANCEL, and INTERNAL_ERROR for a backend
//!          that failed after its head, as `crate::net::tunnel` says)
//! CREDIT   kind 5: bytes: u32, the receiver's window grows by that (stream 0: the connection's)
//! PING     kind 6, stream 0: opaque: u64; flag ACK: the answer
//! GOAWAY   kind 7, stream 0: last_stream: u32 | reason: u32
//! fields   = (name_len: u8 | name | value_len: u16 | value)*, names lowercase
//! ```
//!
//! Invariants:
//! - [`decode`] takes a frame off the front of the buffer only when the whole frame is there; a
//!   buffer read in any pieces decodes to the same frames as read at once.
//! - A payload longer than [`PAYLOAD_BYTES_MAX`] is refused from its header, before it is
//!   buffered; a head's fields are held to [`FIELDS_MAX`].
//! - Frames of unknown kinds are skipped whole, so a later version may add kinds a peer ignores;
//!   any other malformation ([`WireError`]) ends the connection, since the stream it belongs to
//!   can no longer be trusted to line up.
//! - Whatever [`encode`] writes, [`decode`] reads back as the same frame.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, StatusCode};
use thiserror::Error;

/// Bytes of a frame's header.
pub const HEADER_BYTES: usize = 10;
/// Longest payload accepted; a sender cuts longer bodies into DATA frames of at most this.
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;
/// Most fields in one head.
pub const FIELDS_MAX: usize = 128;
/// A RESPONSE head's bytes before its fields: the status.
pub const STATUS_BYTES: usize = 2;

/// The stream a frame belongs to: odd numbers, opened by the router; 0 is the connection.
pub type StreamId = u32;

const REQUEST: u8 = 1;
const RESPONSE: u8 = 2;
const DATA: u8 = 3;
const RESET: u8 = 4;
const CREDIT: u8 = 5;
const PING: u8 = 6;
const GOAWAY: u8 = 7;

const FLAG_END: u8 = 0x1;
const FLAG_ACK: u8 = 0x1;

#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Request {
        stream: StreamId,
        method: Method,
        target: PathAndQuery,
        fields: HeaderMap,
        end: bool,
    },
    Response {
        stream: StreamId,
        status: StatusCode,
        fields: HeaderMap,
        end: bool,
    },
    Data {
        stream: StreamId,
        data: Bytes,
        end: bool,
    },
    Reset {
        stream: StreamId,
        reason: u32,
    },
    Credit {
        stream: StreamId,
        bytes: u32,
    },
    Ping {
        opaque: u64,
        ack: bool,
    },
    GoAway {
        last_stream: StreamId,
        reason: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("a tunnel frame of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("malformed tunnel frame: {0}")]
    Malformed(&'static str),
}

/// Appends `frame`. Panics if a field, the method or the target is longer than its length
/// prefix can say, or a payload longer than [`PAYLOAD_BYTES_MAX`]: the sender builds frames from
/// what it parsed and cut itself, so that is a bug, not input.
pub fn encode(frame: &Frame, out: &mut BytesMut) {
    // One reservation for the whole frame, not one per field.
    let frame_bytes = HEADER_BYTES + payload_len(frame);
    out.reserve(frame_bytes);
    let start = out.len();
    match frame {
        Frame::Request {
            stream,
            method,
            target,
            fields,
            end,
        } => {
            let at = header(out, REQUEST, flag(*end, FLAG_END), *stream);
            let method = method.as_str().as_bytes();
            out.put_u8(u8::try_from(method.len()).expect("a method of at most 255 bytes"));
            out.put_slice(method);
            let target = target.as_str().as_bytes();
            out.put_u16(u16::try_from(target.len()).expect("a target of at most 65535 bytes"));
            out.put_slice(target);
            put_fields(fields, out);
            finish(out, at);
        }
        Frame::Response {
            stream,
            status,
            fields,
            end,
        } => {
            let at = header(out, RESPONSE, flag(*end, FLAG_END), *stream);
            out.put_u16(status.as_u16());
            put_fields(fields, out);
            finish(out, at);
        }
        Frame::Data { stream, data, end } => {
            let at = header(out, DATA, flag(*end, FLAG_END), *stream);
            out.put_slice(data);
            finish(out, at);
        }
        Frame::Reset { stream, reason } => {
            let at = header(out, RESET, 0, *stream);
            out.put_u32(*reason);
            finish(out, at);
        }
        Frame::Credit { stream, bytes } => {
            let at = header(out, CREDIT, 0, *stream);
            out.put_u32(*bytes);
            finish(out, at);
        }
        Frame::Ping { opaque, ack } => {
            let at = header(out, PING, flag(*ack, FLAG_ACK), 0);
            out.put_u64(*opaque);
            finish(out, at);
        }
        Frame::GoAway {
            last_stream,
            reason,
        } => {
            let at = header(out, GOAWAY, 0, 0);
            out.put_u32(*last_stream);
            out.put_u32(*reason);
            finish(out, at);
        }
    }
    debug_assert_eq!(
        out.len() - start,
        frame_bytes,
        "payload_len disagrees with encode"
    );
}

/// The payload bytes [`encode`] writes for `frame`.
fn payload_len(frame: &Frame) -> usize {
    match frame {
        Frame::Request {
            method,
            target,
            fields,
            ..
        } => 1 + method.as_str().len() + 2 + target.as_str().len() + fields_bytes(fields),
        Frame::Response { fields, .. } => STATUS_BYTES + fields_bytes(fields),
        Frame::Data { data, .. } => data.len(),
        Frame::Reset { .. } | Frame::Credit { .. } => 4,
        Frame::Ping { .. } | Frame::GoAway { .. } => 8,
    }
}

fn flag(set: bool, bit: u8) -> u8 {
    if set { bit } else { 0 }
}

/// Writes a header with a length to fill in; returns where the frame starts.
fn header(out: &mut BytesMut, kind: u8, flags: u8, stream: StreamId) -> usize {
    let at = out.len();
    out.put_u32(0);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
    at
}

fn finish(out: &mut BytesMut, at: usize) {
    let length = out.len() - at - HEADER_BYTES;
    assert!(
        length <= PAYLOAD_BYTES_MAX,
        "a frame over the payload limit"
    );
    out[at..at + 4].copy_from_slice(&(length as u32).to_be_bytes());
}

/// Whether one field can travel in a head: a name of at most 255 bytes, a value of at most
/// 65,535 (their length prefixes).
fn field_fits(name: &HeaderName, value: &HeaderValue) -> bool {
    name.as_str().len() <= usize::from(u8::MAX) && value.len() <= usize::from(u16::MAX)
}

/// Drops the fields a head cannot carry: one whose name or value is longer than its length
/// prefix can say, and any past [`FIELDS_MAX`] or past [`PAYLOAD_BYTES_MAX`] with the head's
/// `other_bytes` (status, or method and target). Returns how many were dropped. For heads built
/// from what a peer sent (an engine's response): [`encode`] panics on them instead.
pub fn drop_unfit_fields(fields: &mut HeaderMap, other_bytes: usize) -> usize {
    // One pass in the common case, where everything fits.
    let mut bytes = other_bytes;
    let fits_whole = fields.len() <= FIELDS_MAX
        && fields.iter().all(|(name, value)| {
            bytes += field_bytes(name, value);
            field_fits(name, value)
        })
        && bytes <= PAYLOAD_BYTES_MAX;
    if fits_whole {
        return 0;
    }
    let mut kept = HeaderMap::with_capacity(fields.len().min(FIELDS_MAX));
    let mut bytes = other_bytes;
    let mut dropped = 0;
    for (name, value) in fields.iter() {
        let size = field_bytes(name, value);
        if kept.len() < FIELDS_MAX && field_fits(name, value) && bytes + size <= PAYLOAD_BYTES_MAX {
            kept.append(name.clone(), value.clone());
            bytes += size;
        } else {
            dropped += 1;
        }
    }
    *fields = kept;
    dropped
}

fn fields_bytes(fields: &HeaderMap) -> usize {
    fields
        .iter()
        .map(|(name, value)| field_bytes(name, value))
        .sum()
}

/// One field's bytes in a head: its name and value, each after its length prefix.
fn field_bytes(name: &HeaderName, value: &HeaderValue) -> usize {
    1 + name.as_str().len() + 2 + value.len()
}

fn put_fields(fields: &HeaderMap, out: &mut BytesMut) {
    assert!(fields.len() <= FIELDS_MAX, "a head over the field limit");
    for (name, value) in fields {
        let name = name.as_str().as_bytes();
        out.put_u8(u8::try_from(name.len()).expect("a field name of at most 255 bytes"));
        out.put_slice(name);
        let value = value.as_bytes();
        out.put_u16(u16::try_from(value.len()).expect("a field value of at most 65535 bytes"));
        out.put_slice(value);
    }
}

/// Takes the first whole frame off `buf`. `Ok(None)`: not all of it is there yet (read more; the
/// header says how much, see [`frame_bytes`]). Frames of unknown kinds are dropped on the way.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
    loop {
        let Some(total) = frame_bytes(buf)? else {
            return Ok(None);
        };
        if buf.len() < total {
            return Ok(None);
        }
        let mut frame = buf.split_to(total).freeze();
        frame.advance(4);
        let kind = frame.get_u8();
        let flags = frame.get_u8();
        let stream = frame.get_u32();
        let end = flags & FLAG_END != 0;
        let payload = frame;
        return Ok(Some(match kind {
            REQUEST => request(stream, end, payload)?,
            RESPONSE => response(stream, end, payload)?,
            DATA => Frame::Data {
                stream,
                data: payload,
                end,
            },
            RESET => Frame::Reset {
                stream,
                reason: word(payload)?,
            },
            CREDIT => Frame::Credit {
                stream,
                bytes: word(payload)?,
            },
            PING => {
                let mut payload = fixed::<8>(payload)?;
                Frame::Ping {
                    opaque: payload.get_u64(),
                    ack: flags & FLAG_ACK != 0,
                }
            }
            GOAWAY => {
                let mut payload = fixed::<8>(payload)?;
                Frame::GoAway {
                    last_stream: payload.get_u32(),
                    reason: payload.get_u32(),
                }
            }
            _ => continue,
        }));
    }
}

/// The whole size of the frame at the front of `buf`, once its header is there; refused when
/// its payload is over the limit.
pub fn frame_bytes(buf: &[u8]) -> Result<Option<usize>, WireError> {
    let Some(length) = buf.get(..4) else {
        return Ok(None);
    };
    let length = u32::from_be_bytes(length.try_into().expect("four bytes")) as usize;
    if length > PAYLOAD_BYTES_MAX {
        return Err(WireError::TooLarge(length));
    }
    if buf.len() < HEADER_BYTES {
        return Ok(None);
    }
    Ok(Some(HEADER_BYTES + length))
}

fn fixed<const N: usize>(payload: Bytes) -> Result<Bytes, WireError> {
    if payload.len() == N {
        Ok(payload)
    } else {
        Err(WireError::Malformed("a control frame of the wrong length"))
    }
}

fn word(payload: Bytes) -> Result<u32, WireError> {
    Ok(fixed::<4>(payload)?.get_u32())
}

fn request(stream: StreamId, end: bool, payload: Bytes) -> Result<Frame, WireError> {
    let mut head = Head::new(payload);
    let length = usize::from(head.u8()?);
    let method =
        Method::from_bytes(head.bytes(length)?).map_err(|_| WireError::Malformed("bad method"))?;
    let length = usize::from(head.u16()?);
    let target = PathAndQuery::from_maybe_shared(head.shared(length)?)
        .map_err(|_| WireError::Malformed("bad target"))?;
    if !target.as_str().starts_with('/') {
        return Err(WireError::Malformed("a target not in origin form"));
    }
    Ok(Frame::Request {
        stream,
        method,
        target,
        fields: head.fields()?,
        end,
    })
}

fn response(stream: StreamId, end: bool, payload: Bytes) -> Result<Frame, WireError> {
    let mut head = Head::new(payload);
    let status =
        StatusCode::from_u16(head.u16()?).map_err(|_| WireError::Malformed("bad status"))?;
    Ok(Frame::Response {
        stream,
        status,
        fields: head.fields()?,
        end,
    })
}

/// A REQUEST or RESPONSE payload read front to back. Only what a frame keeps (a target, field
/// values) shares the payload's buffer; lengths and names are read in place, so a head of n
/// fields costs n reference counts, not 4n (each shared piece is an atomic increment and
/// decrement).
struct Head {
    payload: Bytes,
    at: usize,
}

impl Head {
    fn new(payload: Bytes) -> Head {
        Head { payload, at: 0 }
    }

    fn fields(&mut self) -> Result<HeaderMap, WireError> {
        let mut fields = HeaderMap::new();
        while self.at < self.payload.len() {
            if fields.len() == FIELDS_MAX {
                return Err(WireError::Malformed("too many fields"));
            }
            let length = usize::from(self.u8()?);
            let raw = self.bytes(length)?;
            let name = HeaderName::from_bytes(raw).map_err(|_| WireError::Malformed("bad name"))?;
            if name.as_str().as_bytes() != raw {
                // `from_bytes` lowercases; the wire carries names lowercase already.
                return Err(WireError::Malformed("bad name"));
            }
            let length = usize::from(self.u16()?);
            let value = HeaderValue::from_maybe_shared(self.shared(length)?)
                .map_err(|_| WireError::Malformed("bad value"))?;
            fields.append(name, value);
        }
        Ok(fields)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.bytes(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        let bytes = self.bytes(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    /// The next `length` bytes, in place.
    fn bytes(&mut self, length: usize) -> Result<&[u8], WireError> {
        let range = self.range(length)?;
        Ok(&self.payload[range])
    }

    /// The next `length` bytes, sharing the payload's buffer.
    fn shared(&mut self, length: usize) -> Result<Bytes, WireError> {
        let range = self.range(length)?;
        Ok(self.payload.slice(range))
    }

    fn range(&mut self, length: usize) -> Result<std::ops::Range<usize>, WireError> {
        let start = self.at;
        let end = start
            .checked_add(length)
            .filter(|&end| end <= self.payload.len())
            .ok_or(WireError::Malformed("a field runs past its frame"))?;
        self.at = end;
        Ok(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fields(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut fields = HeaderMap::new();
        for (name, value) in pairs {
            fields.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        fields
    }

    fn examples() -> Vec<Frame> {
        vec![
            Frame::Request {
                stream: 1,
                method: Method::POST,
                target: PathAndQuery::from_static("/v1/chat/completions"),
                fields: fields(&[
                    ("content-type", "application/json"),
                    ("x-request-id", "0b5f8c1e-4a7d-4c1b-9e2f-3a6d7c8b9e0f"),
                ]),
                end: false,
            },
            Frame::Data {
                stream: 1,
                data: Bytes::from_static(b"{\"model\":\"m\"}"),
                end: true,
            },
            Frame::Response {
                stream: 1,
                status: StatusCode::OK,
                fields: fields(&[
                    ("content-type", "text/event-stream"),
                    ("x-a", "1"),
                    ("x-a", "2"),
                ]),
                end: false,
            },
            Frame::Response {
                stream: 3,
                status: StatusCode::NO_CONTENT,
                fields: HeaderMap::new(),
                end: true,
            },
            Frame::Data {
                stream: 1,
                data: Bytes::new(),
                end: true,
            },
            Frame::Reset {
                stream: 5,
                reason: u32::from(h2::Reason::CANCEL),
            },
            Frame::Credit {
                stream: 0,
                bytes: 1 << 20,
            },
            Frame::Ping {
                opaque: 0x0102_0304_0506_0708,
                ack: true,
            },
            Frame::GoAway {
                last_stream: 7,
                reason: 0,
            },
        ]
    }

    fn encoded(frames: &[Frame]) -> BytesMut {
        let mut out = BytesMut::new();
        for frame in frames {
            encode(frame, &mut out);
        }
        out
    }

    fn decode_all(buf: &mut BytesMut) -> Result<Vec<Frame>, WireError> {
        let mut frames = Vec::new();
        while let Some(frame) = decode(buf)? {
            frames.push(frame);
        }
        Ok(frames)
    }

    #[test]
    fn every_kind_reads_back_as_written() {
        let frames = examples();
        let mut buf = encoded(&frames);
        assert_eq!(decode_all(&mut buf).unwrap(), frames);
        assert!(buf.is_empty());
    }

    #[test]
    fn frames_read_in_any_pieces_come_out_the_same() {
        let frames = examples();
        let bytes = encoded(&frames);
        for piece in [1, 2, 3, 7, 10, 11, 64] {
            let mut buf = BytesMut::new();
            let mut read = Vec::new();
            for chunk in bytes.chunks(piece) {
                buf.extend_from_slice(chunk);
                read.extend(decode_all(&mut buf).unwrap());
            }
            assert_eq!(read, frames, "pieces of {piece} bytes");
        }
    }

    #[test]
    fn an_unknown_kind_is_skipped_whole() {
        let mut buf = BytesMut::new();
        buf.put_u32(3);
        buf.put_u8(200);
        buf.put_u8(0xff);
        buf.put_u32(9);
        buf.put_slice(b"new");
        encode(&examples()[1], &mut buf);
        assert_eq!(decode_all(&mut buf).unwrap(), vec![examples()[1].clone()]);
    }

    #[test]
    fn an_oversized_frame_is_refused_from_its_header() {
        let mut buf = BytesMut::new();
        buf.put_u32(PAYLOAD_BYTES_MAX as u32 + 1);
        assert_eq!(
            decode(&mut buf),
            Err(WireError::TooLarge(PAYLOAD_BYTES_MAX + 1))
        );
    }

    /// A frame of `kind` around `payload`.
    fn raw(kind: u8, payload: &[u8]) -> BytesMut {
        let mut buf = BytesMut::new();
        buf.put_u32(payload.len() as u32);
        buf.put_u8(kind);
        buf.put_u8(0);
        buf.put_u32(1);
        buf.put_slice(payload);
        buf
    }

    #[test]
    fn fields_a_head_cannot_carry_are_dropped_before_encoding() {
        let long_name = HeaderName::from_bytes(&[b'x'; 300]).unwrap();
        let mut head = fields(&[("content-type", "application/json")]);
        head.append(long_name, HeaderValue::from_static("1"));
        head.append("date", HeaderValue::from_static("today"));
        assert_eq!(drop_unfit_fields(&mut head, 2), 1);
        assert_eq!(
            head,
            fields(&[("content-type", "application/json"), ("date", "today")])
        );
        // What fits is left alone, and encodes.
        assert_eq!(drop_unfit_fields(&mut head, 2), 0);
        let mut many = HeaderMap::new();
        for index in 0..FIELDS_MAX + 5 {
            many.append(
                HeaderName::from_bytes(format!("x-{index}").as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        assert_eq!(drop_unfit_fields(&mut many, 2), 5);
        assert_eq!(many.len(), FIELDS_MAX);
        let mut out = BytesMut::new();
        encode(
            &Frame::Response {
                stream: 1,
                status: StatusCode::OK,
                fields: many,
                end: true,
            },
            &mut out,
        );
        assert!(matches!(decode(&mut out), Ok(Some(Frame::Response { .. }))));
    }

    #[test]
    fn malformed_frames_are_errors_not_guesses() {
        let cases: &[(u8, &[u8], &str)] = &[
            (RESET, b"\0\0\0", "a control frame of the wrong length"),
            (PING, b"\0\0\0\0", "a control frame of the wrong length"),
            (RESPONSE, b"\x00", "a field runs past its frame"),
            (RESPONSE, b"\x00\x01", "bad status"),
            (RESPONSE, b"\x00\xc8\x04name", "a field runs past its frame"),
            (RESPONSE, b"\x00\xc8\x04Name\x00\x00", "bad name"),
            (RESPONSE, b"\x00\xc8\x01a\x00\x01\n", "bad value"),
            (REQUEST, b"\x04POST\x00\x01x", "bad target"),
            (REQUEST, b"\x04POST\x00\x01*", "a target not in origin form"),
            (REQUEST, b"\x00\x00\x01/", "bad method"),
            (REQUEST, b"\x04POST\x00\x05/", "a field runs past its frame"),
        ];
        for (kind, payload, reason) in cases {
            assert_eq!(
                decode(&mut raw(*kind, payload)),
                Err(WireError::Malformed(reason)),
                "{payload:?}"
            );
        }
    }

    fn token() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,20}"
    }

    fn pairs() -> impl Strategy<Value = Vec<(String, String)>> {
        prop::collection::vec((token(), "[ -~]{0,40}"), 0..6)
    }

    fn any_frame() -> impl Strategy<Value = Frame> {
        let stream = any::<u32>();
        prop_oneof![
            (
                stream,
                "(GET|POST|DELETE)",
                "/[a-z0-9/?=&]{0,40}",
                pairs(),
                any::<bool>()
            )
                .prop_map(|(stream, method, target, pairs, end)| Frame::Request {
                    stream,
                    method: method.parse().unwrap(),
                    target: target.parse().unwrap(),
                    fields: to_fields(&pairs),
                    end,
                }),
            (stream, 100u16..1000, pairs(), any::<bool>()).prop_map(
                |(stream, status, pairs, end)| {
                    Frame::Response {
                        stream,
                        status: StatusCode::from_u16(status).unwrap(),
                        fields: to_fields(&pairs),
                        end,
                    }
                }
            ),
            (
                stream,
                prop::collection::vec(any::<u8>(), 0..300),
                any::<bool>()
            )
                .prop_map(|(stream, data, end)| Frame::Data {
                    stream,
                    data: data.into(),
                    end,
                }),
            (stream, any::<u32>()).prop_map(|(stream, reason)| Frame::Reset { stream, reason }),
            (stream, any::<u32>()).prop_map(|(stream, bytes)| Frame::Credit { stream, bytes }),
            (any::<u64>(), any::<bool>()).prop_map(|(opaque, ack)| Frame::Ping { opaque, ack }),
            (stream, any::<u32>()).prop_map(|(last_stream, reason)| Frame::GoAway {
                last_stream,
                reason
            }),
        ]
    }

    fn to_fields(pairs: &[(String, String)]) -> HeaderMap {
        let pairs: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        fields(&pairs)
    }

    proptest! {
        #[test]
        fn any_frames_read_back_as_written_whatever_the_pieces(
            frames in prop::collection::vec(any_frame(), 1..8),
            cuts in prop::collection::vec(1usize..64, 1..16),
        ) {
            let bytes = encoded(&frames);
            let mut buf = BytesMut::new();
            let mut read = Vec::new();
            let mut rest = &bytes[..];
            let mut cuts = cuts.iter().cycle();
            while !rest.is_empty() {
                let piece = (*cuts.next().unwrap()).min(rest.len());
                buf.extend_from_slice(&rest[..piece]);
                rest = &rest[piece..];
                read.extend(decode_all(&mut buf).unwrap());
            }
            prop_assert_eq!(read, frames);
            prop_assert!(buf.is_empty());
        }
    }
}
