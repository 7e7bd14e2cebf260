//! Incremental decoding of `Transfer-Encoding: chunked` request bodies (RFC 9112 §7.1).
//!
//! Owns the chunk framing state between reads: a [`ChunkedDecoder`] is fed whatever bytes the
//! socket produced, appends decoded body bytes to the caller's buffer and reports how much input
//! it consumed. It keeps no input bytes of its own, so a read may end at any byte.
//!
//! Invariants:
//! - Decoded body bytes never exceed `body_bytes_max`; an over-long chunk is refused when its size
//!   line is read, before its data arrives.
//! - Every line ends in CRLF; a bare LF, a non-hex size, a size over 64 bits or a missing CRLF
//!   after chunk data is [`BodyError::Malformed`] (a lenient chunk parser is a smuggling vector).
//! - Chunk extensions and trailer fields are skipped, each bounded by [`LINE_BYTES_MAX`] and
//!   [`TRAILER_BYTES_MAX`] so a client cannot make the decoder spin on framing.
//! - Once complete, the decoder consumes nothing more: bytes after the last CRLF belong to the
//!   next request on the connection.

use bytes::BufMut;
use thiserror::Error;

/// Longest chunk size line (size plus extensions), in bytes.
pub const LINE_BYTES_MAX: usize = 4096;
/// Most trailer section bytes accepted after the last chunk.
pub const TRAILER_BYTES_MAX: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BodyError {
    /// The decoded body would exceed the configured limit: answer 413.
    #[error("request body too large")]
    TooLarge,
    #[error("malformed chunked body: {0}")]
    Malformed(&'static str),
}

/// Outcome of one [`ChunkedDecoder::decode`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Input bytes used; the caller drops these and keeps the rest for the next call.
    pub consumed: usize,
    /// The last chunk and trailer section have been read.
    pub done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits; `digits` counts them so an empty size is caught.
    Size {
        size: u64,
        digits: u8,
    },
    /// After the size: optional whitespace and `;ext` up to CR.
    Extension {
        size: u64,
    },
    SizeLf {
        size: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line, or of the final empty line.
    TrailerStart,
    TrailerLine,
    TrailerLf,
    FinalLf,
    Done,
}

/// A resumable chunked-body decoder. One per request body; see the module docs.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    body_bytes: u64,
    body_bytes_max: u64,
    /// Bytes of the current size line or trailer section, for the framing bounds.
    framing_bytes: usize,
}

impl ChunkedDecoder {
    pub fn new(body_bytes_max: u64) -> Self {
        ChunkedDecoder {
            state: State::Size { size: 0, digits: 0 },
            body_bytes: 0,
            body_bytes_max,
            framing_bytes: 0,
        }
    }

    /// Body bytes announced by the size lines read so far. They are counted, and held to the
    /// limit, when a size line ends, so while a chunk's data is still arriving this runs ahead of
    /// the bytes decoded; once the body is done the two are equal.
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decode as much of `input` as possible, appending body bytes to `out`.
    ///
    /// After an error the decoder is unusable: the connection must be closed, because where this
    /// body ends is unknown.
    pub fn decode<B: BufMut>(&mut self, input: &[u8], out: &mut B) -> Result<Progress, BodyError> {
        let mut position = 0;
        while position < input.len() {
            let byte = input[position];
            match self.state {
                State::Done => break,
                State::Data { remaining } => {
                    let available = (input.len() - position) as u64;
                    let take = remaining.min(available) as usize;
                    out.put_slice(&input[position..position + take]);
                    position += take;
                    let remaining = remaining - take as u64;
                    self.state = if remaining == 0 {
                        State::DataCr
                    } else {
                        State::Data { remaining }
                    };
                    continue;
                }
                State::Size { size, digits } => {
                    self.count_line_byte()?;
                    if let Some(value) = hex_value(byte) {
                        // 16 hex digits fill a u64; a 17th significant one would overflow. Leading
                        // zeros are allowed, hence the check on the value, not the digit count.
                        if size > u64::MAX >> 4 {
                            return Err(BodyError::Malformed("chunk size overflows"));
                        }
                        self.state = State::Size {
                            size: (size << 4) | u64::from(value),
                            digits: digits.saturating_add(1),
                        };
                    } else if digits == 0 {
                        return Err(BodyError::Malformed("chunk size is not hex"));
                    } else {
                        match byte {
                            b'\r' => self.state = State::SizeLf { size },
                            b';' | b' ' | b'\t' => self.state = State::Extension { size },
                            _ => return Err(BodyError::Malformed("chunk size is not hex")),
                        }
                    }
                }
                State::Extension { size } => {
                    self.count_line_byte()?;
                    match byte {
                        b'\r' => self.state = State::SizeLf { size },
                        b'\n' => return Err(BodyError::Malformed("bare lf in chunk size line")),
                        _ => {}
                    }
                }
                State::SizeLf { size } => {
                    if byte != b'\n' {
                        return Err(BodyError::Malformed("chunk size line without crlf"));
                    }
                    self.framing_bytes = 0;
                    if size == 0 {
                        self.state = State::TrailerStart;
                    } else {
                        let body_bytes = self
                            .body_bytes
                            .checked_add(size)
                            .filter(|&total| total <= self.body_bytes_max)
                            .ok_or(BodyError::TooLarge)?;
                        self.body_bytes = body_bytes;
                        self.state = State::Data { remaining: size };
                    }
                }
                State::DataCr => {
                    if byte != b'\r' {
                        return Err(BodyError::Malformed("chunk data without crlf"));
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if byte != b'\n' {
                        return Err(BodyError::Malformed("chunk data without crlf"));
                    }
                    self.state = State::Size { size: 0, digits: 0 };
                }
                State::TrailerStart => {
                    self.count_trailer_byte()?;
                    self.state = match byte {
                        b'\r' => State::FinalLf,
                        b'\n' => return Err(BodyError::Malformed("bare lf in trailer")),
                        _ => State::TrailerLine,
                    };
                }
                State::TrailerLine => {
                    self.count_trailer_byte()?;
                    match byte {
                        b'\r' => self.state = State::TrailerLf,
                        b'\n' => return Err(BodyError::Malformed("bare lf in trailer")),
                        _ => {}
                    }
                }
                State::TrailerLf => {
                    self.count_trailer_byte()?;
                    if byte != b'\n' {
                        return Err(BodyError::Malformed("trailer line without crlf"));
                    }
                    self.state = State::TrailerStart;
                }
                State::FinalLf => {
                    if byte != b'\n' {
                        return Err(BodyError::Malformed("last chunk without final crlf"));
                    }
                    self.state = State::Done;
                    position += 1;
                    break;
                }
            }
            position += 1;
        }
        Ok(Progress {
            consumed: position,
            done: self.state == State::Done,
        })
    }

    fn count_line_byte(&mut self) -> Result<(), BodyError> {
        self.framing_bytes += 1;
        if self.framing_bytes > LINE_BYTES_MAX {
            return Err(BodyError::Malformed("chunk size line too long"));
        }
        Ok(())
    }

    fn count_trailer_byte(&mut self) -> Result<(), BodyError> {
        self.framing_bytes += 1;
        if self.framing_bytes > TRAILER_BYTES_MAX {
            return Err(BodyError::Malformed("trailer section too long"));
        }
        Ok(())
    }
}

#[inline]
fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    //! Proves decoding is exact at any split of a valid encoding and refuses bad framing and
    //! oversized bodies.
    use super::*;
    use proptest::prelude::*;

    const BODY_BYTES_MAX: u64 = 1 << 20;

    /// Decode `input` in one call; returns (body, consumed, done).
    fn decode_all(input: &[u8]) -> Result<(Vec<u8>, usize, bool), BodyError> {
        let mut decoder = ChunkedDecoder::new(BODY_BYTES_MAX);
        let mut out = Vec::new();
        let progress = decoder.decode(input, &mut out)?;
        Ok((out, progress.consumed, progress.done))
    }

    /// Decode `input` fed in pieces cut at `cuts`, carrying unconsumed bytes over like a reader.
    fn decode_split(input: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, usize, bool), BodyError> {
        let mut decoder = ChunkedDecoder::new(BODY_BYTES_MAX);
        let mut out = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        let mut consumed_total = 0;
        let mut previous = 0;
        let mut boundaries: Vec<usize> =
            cuts.iter().copied().filter(|&c| c <= input.len()).collect();
        boundaries.sort_unstable();
        boundaries.push(input.len());
        for cut in boundaries {
            pending.extend_from_slice(&input[previous..cut]);
            previous = cut;
            let progress = decoder.decode(&pending, &mut out)?;
            consumed_total += progress.consumed;
            pending.drain(..progress.consumed);
            if progress.done {
                return Ok((out, consumed_total, true));
            }
        }
        Ok((out, consumed_total, false))
    }

    fn encode(body: &[u8], chunk_sizes: &[usize], extension: bool, trailer: bool) -> Vec<u8> {
        let mut encoded = Vec::new();
        let mut rest = body;
        let mut sizes = chunk_sizes.iter().cycle();
        while !rest.is_empty() {
            let size = (*sizes.next().unwrap()).clamp(1, rest.len());
            if extension {
                encoded.extend_from_slice(format!("{size:X};name=\"v;x\"\r\n").as_bytes());
            } else {
                encoded.extend_from_slice(format!("{size:x}\r\n").as_bytes());
            }
            encoded.extend_from_slice(&rest[..size]);
            encoded.extend_from_slice(b"\r\n");
            rest = &rest[size..];
        }
        encoded.extend_from_slice(b"0\r\n");
        if trailer {
            encoded.extend_from_slice(b"X-Checksum: abc\r\nX-Other: 1\r\n");
        }
        encoded.extend_from_slice(b"\r\n");
        encoded
    }

    #[test]
    fn decodes_a_simple_body_and_stops_at_its_end() {
        let input = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        let (body, consumed, done) = decode_all(input).unwrap();
        assert_eq!(body, b"hello world");
        assert!(done);
        assert_eq!(&input[consumed..], b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn empty_body_and_trailers() {
        assert_eq!(decode_all(b"0\r\n\r\n").unwrap(), (vec![], 5, true));
        let input = b"000\r\nTrailer: x\r\n\r\n";
        assert_eq!(decode_all(input).unwrap(), (vec![], input.len(), true));
        let input = b"1 ; a=b\r\nZ\r\n0\r\n\r\n";
        assert_eq!(decode_all(input).unwrap().0, b"Z");
    }

    #[test]
    fn large_sizes_with_leading_zeros_are_fine_but_overflow_is_not() {
        let mut decoder = ChunkedDecoder::new(u64::MAX);
        let progress = decoder
            .decode(b"0000000000000000000fffffffffffffff\r\n", &mut Vec::new())
            .unwrap();
        assert!(!progress.done);
        assert_eq!(
            ChunkedDecoder::new(u64::MAX).decode(b"10000000000000000\r\n", &mut Vec::new()),
            Err(BodyError::Malformed("chunk size overflows"))
        );
    }

    #[test]
    fn malformed_framing_is_refused() {
        let cases: &[&[u8]] = &[
            b"\r\n",
            b"g\r\n",
            b"-1\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5;ext\nhello",
            b"0\r\n\n",
            b"0\r\nTrailer: x\n\r\n",
            b"0\r\n\r\r",
            b"0x5\r\nhello\r\n",
        ];
        for input in cases {
            assert!(
                matches!(decode_all(input), Err(BodyError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn body_limit_is_exact_and_checked_before_data() {
        let mut decoder = ChunkedDecoder::new(10);
        let mut out = Vec::new();
        assert!(
            decoder
                .decode(b"a\r\n0123456789\r\n0\r\n\r\n", &mut out)
                .unwrap()
                .done
        );
        let mut decoder = ChunkedDecoder::new(10);
        assert_eq!(
            decoder.decode(b"6\r\n012345\r\n5\r\n", &mut Vec::new()),
            Err(BodyError::TooLarge)
        );
        assert_eq!(
            ChunkedDecoder::new(10).decode(b"ffffffffffffffff\r\n", &mut Vec::new()),
            Err(BodyError::TooLarge)
        );
    }

    #[test]
    fn framing_lines_are_bounded() {
        let mut long_extension = b"1;".to_vec();
        long_extension.resize(LINE_BYTES_MAX + 10, b'x');
        assert!(matches!(
            decode_all(&long_extension),
            Err(BodyError::Malformed(_))
        ));
        let mut long_trailer = b"0\r\nX: ".to_vec();
        long_trailer.resize(TRAILER_BYTES_MAX + 10, b'x');
        assert!(matches!(
            decode_all(&long_trailer),
            Err(BodyError::Malformed(_))
        ));
    }

    #[test]
    fn done_decoder_consumes_nothing() {
        let mut decoder = ChunkedDecoder::new(BODY_BYTES_MAX);
        let mut out = Vec::new();
        assert!(decoder.decode(b"0\r\n\r\n", &mut out).unwrap().done);
        let progress = decoder.decode(b"more", &mut out).unwrap();
        assert_eq!(
            progress,
            Progress {
                consumed: 0,
                done: true
            }
        );
    }

    #[test]
    fn decodes_into_bytes_mut() {
        let mut out = bytes::BytesMut::new();
        let progress = ChunkedDecoder::new(BODY_BYTES_MAX)
            .decode(b"3\r\nabc\r\n0\r\n\r\n", &mut out)
            .unwrap();
        assert!(progress.done);
        assert_eq!(&out[..], b"abc");
    }

    proptest! {
        #[test]
        fn any_split_decodes_the_same(
            body in proptest::collection::vec(any::<u8>(), 0..600),
            chunk_sizes in proptest::collection::vec(1usize..200, 1..6),
            extension in any::<bool>(),
            trailer in any::<bool>(),
            cuts in proptest::collection::vec(0usize..1400, 0..12),
        ) {
            let mut encoded = encode(&body, &chunk_sizes, extension, trailer);
            let encoded_len = encoded.len();
            encoded.extend_from_slice(b"NEXT");
            let (decoded, consumed, done) = decode_split(&encoded, &cuts).unwrap();
            prop_assert!(done);
            prop_assert_eq!(consumed, encoded_len);
            prop_assert_eq!(decoded, body);
        }

        #[test]
        fn byte_at_a_time_decodes_the_same(
            body in proptest::collection::vec(any::<u8>(), 0..100),
            chunk_sizes in proptest::collection::vec(1usize..40, 1..4),
        ) {
            let encoded = encode(&body, &chunk_sizes, true, true);
            let cuts: Vec<usize> = (0..encoded.len()).collect();
            let (decoded, consumed, done) = decode_split(&encoded, &cuts).unwrap();
            prop_assert!(done);
            prop_assert_eq!(consumed, encoded.len());
            prop_assert_eq!(decoded, body);
        }

        #[test]
        fn arbitrary_input_never_panics(input in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_all(&input);
        }
    }
}
