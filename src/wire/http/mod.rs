//! The HTTP/1.1 wire codec and the inference-body fields the router reads.
//!
//! Owns the pure, I/O-free half of the front end: parsing request heads out of a byte buffer,
//! decoding chunked request bodies incrementally, writing response heads and chunk frames, the
//! router's JSON error envelope, and extracting `model`/`stream`/token limits from request bodies.
//! It must not import a runtime, a socket or a clock: the shard loop feeds it bytes and acts on the
//! results, and tests and fuzz targets drive exactly the same code.
//!
//! # Key components
//! - [`request`]: [`request::parse_head`] turns buffered bytes into a [`request::RequestHead`] whose
//!   header values are [`request::Span`]s into that buffer (no copies), plus HTTP/2 preface
//!   detection.
//! - [`chunked`]: [`chunked::ChunkedDecoder`], a resumable decoder fed at any byte boundary.
//! - [`response`]: writers for response heads, chunk frames and [`response::error_body`].
//! - [`fields`]: [`fields::extract_fields`] validates the JSON body and borrows its fields in one
//!   pass; [`fields::request_with_include_usage`] asks the backend for streamed usage.
//! - [`prompt`]: [`prompt::PromptShape`], the prompt's text bytes, tool-schema bytes, message and
//!   image counts, read by the same pass for the input estimate.
//!
//! # Error handling
//! Each boundary has a small error enum ([`request::HeadError`], [`chunked::BodyError`],
//! [`fields::FieldsError`]). They carry static context; turning them into status codes and
//! envelopes is the `error` module's job, not this one's.
//!
//! # Performance
//! `parse_head` allocates nothing: header storage is a stack array and results are byte ranges.
//! The chunked decoder copies each data byte once, into the caller's output buffer.

pub mod chunked;
pub mod client;
pub mod fields;
pub mod prompt;
pub mod prompt_parts;
pub mod request;
pub mod response;
pub mod route;

/// Index just past the first blank line in `buf`: a `\n` followed by `\n` or `\r\n`, which covers
/// `\r\n\r\n`, `\n\n` and their mixtures. Ends both HTTP heads and server-sent events.
pub fn blank_line_end(buf: &[u8]) -> Option<usize> {
    blank_line_end_and_lines(buf).map(|(end, _)| end)
}

/// [`blank_line_end`], and whether the text before the blank line is one line (the scan met no
/// other line end): what an SSE event's reader needs to skip a second scan of the event.
pub fn blank_line_end_and_lines(buf: &[u8]) -> Option<(usize, bool)> {
    for (line, newline) in memchr::memchr_iter(b'\n', buf).enumerate() {
        match buf.get(newline + 1..) {
            Some([b'\n', ..]) => return Some((newline + 2, line == 0)),
            Some([b'\r', b'\n', ..]) => return Some((newline + 3, line == 0)),
            _ => {}
        }
    }
    None
}

/// `Content-Length = 1*DIGIT` (RFC 9110 §8.6), optional whitespace around it; signs, spaces
/// inside, lists and overflow are refused, with the reason. Requests (`request::parse_head`) and
/// engine responses (`client::parse_response_head`, per list element) read it alike.
pub fn content_length(value: &[u8]) -> Result<u64, &'static str> {
    let value = trim_ows(value);
    if value.is_empty() {
        return Err("empty content-length");
    }
    let mut length: u64 = 0;
    for &byte in value {
        if !byte.is_ascii_digit() {
            return Err("content-length is not a number");
        }
        length = length
            .checked_mul(10)
            .and_then(|length| length.checked_add(u64::from(byte - b'0')))
            .ok_or("content-length overflows")?;
    }
    Ok(length)
}

/// What a `Connection` field's tokens say about the connection, over all its fields (RFC 9112
/// §9.3): `close` wins over `keep-alive`, whatever their order.
#[derive(Debug, Default, Clone, Copy)]
pub struct ConnectionTokens {
    pub close: bool,
    pub keep_alive: bool,
}

impl ConnectionTokens {
    /// Takes in one `Connection` field's value.
    pub fn read(&mut self, value: &[u8]) {
        for token in value.split(|&byte| byte == b',') {
            let token = trim_ows(token);
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                self.keep_alive = true;
            }
        }
    }

    /// Whether the connection stays open after this message, for an HTTP/1.1 message or an
    /// HTTP/1.0 one.
    pub fn keep_alive(self, http11: bool) -> bool {
        !self.close && (http11 || self.keep_alive)
    }
}

/// A field value without the optional whitespace (spaces and tabs) around it.
fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}
