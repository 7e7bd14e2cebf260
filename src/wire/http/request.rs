//! Request head parsing: bytes in, a [`RequestHead`] of byte ranges out.
//!
//! Owns the HTTP/1.x request line and header section, body framing decisions (the request
//! smuggling defence lives here), keep-alive semantics, and HTTP/2 prior-knowledge preface
//! detection. It reads a buffer; it never reads a socket and never copies header values.
//!
//! Invariants:
//! - Every [`Span`] in a [`RequestHead`] indexes the buffer given to [`parse_head`]; the caller
//!   keeps those bytes (for example as a frozen `Bytes` of the first `head_bytes` bytes) for as
//!   long as it reads header values.
//! - A head is accepted only with unambiguous body framing: never both `Content-Length` and
//!   `Transfer-Encoding`, never two different lengths, and `Transfer-Encoding` only as exactly
//!   `chunked` on HTTP/1.1. Anything else is [`HeadError::Malformed`], so the router and any
//!   downstream parser cannot disagree on where this request's body ends.
//! - A head never exceeds [`HeadLimits::head_bytes_max`] bytes or
//!   [`HeadLimits::headers_count_max`] headers ([`HeadError::TooLarge`], answered with 431).

use std::mem::MaybeUninit;

use thiserror::Error;

/// Hard ceiling on headers per request; sizes the stack array handed to `httparse`.
pub const HEADERS_COUNT_CAP: usize = 100;

/// The HTTP/2 connection preface a prior-knowledge client sends first (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Bounds on one request head. Scope: per listener, same for every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadLimits {
    /// Largest accepted head, request line through the blank line, in bytes. Default 64 KiB.
    pub head_bytes_max: usize,
    /// Most header fields accepted; values above [`HEADERS_COUNT_CAP`] act as the cap. Default 100.
    pub headers_count_max: usize,
}

impl Default for HeadLimits {
    fn default() -> Self {
        HeadLimits {
            head_bytes_max: 64 * 1024,
            headers_count_max: HEADERS_COUNT_CAP,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum HeadError {
    /// The head is over `head_bytes_max` or has too many headers: answer 431.
    #[error("request head too large: over the byte or header count limit")]
    TooLarge,
    /// Not a well-formed or not an unambiguous HTTP/1.x request head: answer 400 and close.
    #[error("malformed request head: {0}")]
    Malformed(&'static str),
}

/// A byte range `start..end` into the buffer the head was parsed from.
///
/// `u32` offsets keep [`RequestHead`] small; heads are bounded far below 4 GiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    /// The bytes this span covers. Panics if `buf` is not (a prefix-preserving copy of) the
    /// buffer the span came from and is too short.
    #[inline]
    pub fn get<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        &buf[self.start as usize..self.end as usize]
    }

    #[inline]
    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The span of `part`, which must be a subslice of `buf`. An empty `part` whose pointer is
    /// outside `buf` (possible for empty slices) maps to an empty span at 0.
    #[inline]
    fn of(buf: &[u8], part: &[u8]) -> Span {
        let start = (part.as_ptr() as usize).wrapping_sub(buf.as_ptr() as usize);
        if start > buf.len() || buf.len() - start < part.len() {
            debug_assert!(part.is_empty(), "span of a slice outside the buffer");
            return Span { start: 0, end: 0 };
        }
        Span {
            start: start as u32,
            end: (start + part.len()) as u32,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    Post,
    Put,
    Delete,
    Options,
    Patch,
    /// Any other token; read it through [`RequestHead::method_span`].
    Other,
}

impl Method {
    fn from_bytes(token: &[u8]) -> Method {
        match token {
            b"GET" => Method::Get,
            b"HEAD" => Method::Head,
            b"POST" => Method::Post,
            b"PUT" => Method::Put,
            b"DELETE" => Method::Delete,
            b"OPTIONS" => Method::Options,
            b"PATCH" => Method::Patch,
            _ => Method::Other,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http10,
    Http11,
}

/// How the request body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No `Content-Length` and no `Transfer-Encoding`: a request without a body.
    None,
    ContentLength(u64),
    Chunked,
}

/// A parsed request head. Header values are [`Span`]s into the parsed buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: Method,
    pub method_span: Span,
    /// The request target up to (not including) `?`.
    pub path: Span,
    /// What follows `?` in the request target, without the `?`; `None` when there is no `?`.
    pub query: Option<Span>,
    pub version: Version,
    /// Bytes from the start of the buffer through the blank line; the body starts here.
    pub head_bytes: usize,
    pub framing: BodyFraming,
    /// Whether the connection stays open after this exchange: HTTP/1.1 unless `Connection:
    /// close`, HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent: answer `100 Continue` before reading the body. Other
    /// expectations are ignored.
    pub expect_continue: bool,
    pub host: Option<Span>,
    pub authorization: Option<Span>,
    pub x_api_key: Option<Span>,
    pub content_type: Option<Span>,
    pub x_request_id: Option<Span>,
    /// `X-Client-Request-ID`: the client's own ID for a request and its retries (hold at zero
    /// counts a retried request once).
    pub x_client_request_id: Option<Span>,
    pub anthropic_version: Option<Span>,
    /// The first `anthropic-beta` header (forwarded to the agent as it came).
    pub anthropic_beta: Option<Span>,
    /// `Upgrade` value (for example `h2c` or `websocket`), which the router does not honour.
    pub upgrade: Option<Span>,
    pub http2_settings: bool,
    pub headers_count: usize,
}

impl RequestHead {
    /// Value of the first header named `name` (ASCII case-insensitive), as bytes of `buf`.
    ///
    /// Re-scans the head rather than storing every header, so that parsing stays allocation-free;
    /// use the named fields for the headers on the hot path.
    pub fn header<'b>(&self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        self.headers(buf)
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every header as `(name, value)`, in order, values trimmed of surrounding whitespace.
    pub fn headers<'b>(&self, buf: &'b [u8]) -> HeaderIter<'b> {
        let head = &buf[..self.head_bytes];
        // Start after the request line, which ends after the target (httparse may have skipped
        // empty lines before it); parse_head has validated the whole head already.
        let target_end = self.query.map_or(self.path.end, |query| query.end) as usize;
        let rest = match memchr::memchr(b'\n', &head[target_end..]) {
            Some(newline) => &head[target_end + newline + 1..],
            None => &[],
        };
        HeaderIter { rest }
    }

    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        self.path.get(buf)
    }
}

/// Iterator over the header lines of an already-validated head.
pub struct HeaderIter<'b> {
    rest: &'b [u8],
}

impl<'b> Iterator for HeaderIter<'b> {
    type Item = (&'b [u8], &'b [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let newline = memchr::memchr(b'\n', self.rest)?;
        let line = &self.rest[..newline];
        self.rest = &self.rest[newline + 1..];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.rest = &[];
            return None;
        }
        let colon = memchr::memchr(b':', line)?;
        Some((&line[..colon], super::trim_ows(&line[colon + 1..])))
    }
}

/// Tells, in time linear in the bytes received, when [`parse_head`] is worth calling: once a blank
/// line has arrived or the buffer has reached the head limit. Calling `parse_head` after every read
/// instead would let a client that sends one byte per packet cost quadratic work.
///
/// One per connection, reset (`HeadWait::default()`) after each request head is parsed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadWait {
    scanned_bytes: usize,
}

impl HeadWait {
    /// Whether `buf` (the same buffer as on earlier calls, grown) may now hold a complete head or
    /// an over-limit one.
    pub fn ready(&mut self, buf: &[u8], limits: &HeadLimits) -> bool {
        if buf.len() >= limits.head_bytes_max {
            return true;
        }
        // A blank line is at most 3 bytes, so one straddling the previous end began in its last 2.
        let from = self.scanned_bytes.saturating_sub(2).min(buf.len());
        self.scanned_bytes = buf.len();
        super::blank_line_end(&buf[from..]).is_some()
    }
}

/// Parse a request head from the start of `buf`.
///
/// Returns `Ok(None)` when the head is incomplete and may still fit the limits: read more and
/// call again with the grown buffer (parsing restarts from the beginning, which is cheap next to
/// a read for heads of a few hundred bytes).
pub fn parse_head(buf: &[u8], limits: &HeadLimits) -> Result<Option<RequestHead>, HeadError> {
    let head_bytes_max = limits.head_bytes_max.min(u32::MAX as usize);
    // Parse at most head_bytes_max bytes, so a slow-loris head costs bounded work per call.
    let window = &buf[..buf.len().min(head_bytes_max)];
    // Uninitialised storage: httparse writes only the headers it finds, so a short head does not
    // pay for clearing 100 slots (3.2 KB) per call.
    let mut header_storage =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; HEADERS_COUNT_CAP];
    let headers_count_max = limits.headers_count_max.min(HEADERS_COUNT_CAP);
    let mut request = httparse::Request::new(&mut []);
    let parsed =
        request.parse_with_uninit_headers(window, &mut header_storage[..headers_count_max]);
    let head_bytes = match parsed {
        Ok(httparse::Status::Complete(head_bytes)) => head_bytes,
        Ok(httparse::Status::Partial) => {
            // The head needs at least one byte more than we have; if that cannot fit, stop now.
            return if buf.len() >= head_bytes_max {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            };
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(httparse::Error::Token) => return Err(HeadError::Malformed(token_reason(window))),
        Err(error) => return Err(HeadError::Malformed(httparse_reason(error))),
    };

    // httparse guarantees these are present on Complete.
    let method_bytes = request.method.unwrap_or_default().as_bytes();
    let target = request.path.unwrap_or_default().as_bytes();
    let version = match request.version {
        Some(0) => Version::Http10,
        Some(1) => Version::Http11,
        _ => return Err(HeadError::Malformed("unsupported http version")),
    };
    let (path, query) = match memchr::memchr(b'?', target) {
        Some(question) => (
            Span::of(buf, &target[..question]),
            Some(Span::of(buf, &target[question + 1..])),
        ),
        None => (Span::of(buf, target), None),
    };

    let mut head = RequestHead {
        method: Method::from_bytes(method_bytes),
        method_span: Span::of(buf, method_bytes),
        path,
        query,
        version,
        head_bytes,
        framing: BodyFraming::None,
        keep_alive: version == Version::Http11,
        expect_continue: false,
        host: None,
        authorization: None,
        x_api_key: None,
        content_type: None,
        x_request_id: None,
        x_client_request_id: None,
        anthropic_version: None,
        anthropic_beta: None,
        upgrade: None,
        http2_settings: false,
        headers_count: request.headers.len(),
    };

    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding_seen = false;
    let mut connection = super::ConnectionTokens::default();

    for header in request.headers.iter() {
        let name = header.name.as_bytes();
        let value = header.value;
        // Dispatch on length first: most names are rejected by one integer compare.
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"host") => {
                // RFC 9112 §3.2: more than one Host is a 400, as is none on HTTP/1.1 (below).
                if head.host.is_some() {
                    return Err(HeadError::Malformed("more than one host header"));
                }
                head.host = Some(Span::of(buf, value));
            }
            6 if name.eq_ignore_ascii_case(b"expect") => {
                head.expect_continue |=
                    super::trim_ows(value).eq_ignore_ascii_case(b"100-continue");
            }
            7 if name.eq_ignore_ascii_case(b"upgrade") => {
                head.upgrade = Some(Span::of(buf, value));
            }
            9 if name.eq_ignore_ascii_case(b"x-api-key") => {
                // Two credentials are ambiguous: which one would be charged? Refuse, never pick.
                if head.x_api_key.is_some() {
                    return Err(HeadError::Malformed("more than one x-api-key header"));
                }
                head.x_api_key = Some(Span::of(buf, value));
            }
            10 if name.eq_ignore_ascii_case(b"connection") => connection.read(value),
            12 if name.eq_ignore_ascii_case(b"content-type") => {
                head.content_type = Some(Span::of(buf, value));
            }
            12 if name.eq_ignore_ascii_case(b"x-request-id") => {
                head.x_request_id = Some(Span::of(buf, value));
            }
            19 if name.eq_ignore_ascii_case(b"x-client-request-id") => {
                head.x_client_request_id = Some(Span::of(buf, value));
            }
            13 if name.eq_ignore_ascii_case(b"authorization") => {
                if head.authorization.is_some() {
                    return Err(HeadError::Malformed("more than one authorization header"));
                }
                head.authorization = Some(Span::of(buf, value));
            }
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                let length = super::content_length(value).map_err(HeadError::Malformed)?;
                // Identical repeats are harmless (RFC 9112 §6.3 item 5); different ones are the
                // classic smuggling vector.
                if content_length.is_some_and(|previous| previous != length) {
                    return Err(HeadError::Malformed("conflicting content-length headers"));
                }
                content_length = Some(length);
            }
            14 if name.eq_ignore_ascii_case(b"http2-settings") => {
                head.http2_settings = true;
            }
            14 if name.eq_ignore_ascii_case(b"anthropic-beta") => {
                head.anthropic_beta.get_or_insert(Span::of(buf, value));
            }
            17 if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                for coding in value.split(|&byte| byte == b',') {
                    let coding = super::trim_ows(coding);
                    if coding.is_empty() {
                        continue;
                    }
                    // Only a single `chunked` is supported: a coding after chunked, or chunked
                    // twice, leaves the length unknowable (RFC 9112 §6.3 item 4).
                    if !coding.eq_ignore_ascii_case(b"chunked") || chunked {
                        return Err(HeadError::Malformed("unsupported transfer-encoding"));
                    }
                    chunked = true;
                }
                transfer_encoding_seen = true;
            }
            17 if name.eq_ignore_ascii_case(b"anthropic-version") => {
                head.anthropic_version = Some(Span::of(buf, value));
            }
            _ => {}
        }
    }

    if transfer_encoding_seen {
        if !chunked {
            return Err(HeadError::Malformed("unsupported transfer-encoding"));
        }
        if content_length.is_some() {
            return Err(HeadError::Malformed(
                "both content-length and transfer-encoding",
            ));
        }
        // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing.
        if version == Version::Http10 {
            return Err(HeadError::Malformed("transfer-encoding on http/1.0"));
        }
        head.framing = BodyFraming::Chunked;
    } else if let Some(length) = content_length {
        head.framing = BodyFraming::ContentLength(length);
    }

    if version == Version::Http11 && head.host.is_none() {
        return Err(HeadError::Malformed("missing host header"));
    }

    head.keep_alive = connection.keep_alive(version == Version::Http11);
    Ok(Some(head))
}

/// httparse reports a bad byte in the method and in the request target alike; say which.
fn token_reason(window: &[u8]) -> &'static str {
    let line = window
        .split(|&byte| byte == b'\n')
        .next()
        .unwrap_or_default();
    match line.iter().position(|&byte| byte == b' ') {
        Some(end) if end > 0 && line[..end].iter().all(|&byte| is_tchar(byte)) => {
            "invalid byte in the request target"
        }
        _ => "invalid method token",
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

fn httparse_reason(error: httparse::Error) -> &'static str {
    match error {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid line ending",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid method token",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "invalid http version",
    }
}

/// Whether `buf` starts with the HTTP/2 prior-knowledge preface; `None` while `buf` is a proper
/// prefix of it and more bytes are needed to tell.
pub fn is_h2_preface(buf: &[u8]) -> Option<bool> {
    if buf.len() >= H2_PREFACE.len() {
        Some(&buf[..H2_PREFACE.len()] == H2_PREFACE)
    } else if H2_PREFACE.starts_with(buf) {
        None
    } else {
        Some(false)
    }
}

#[cfg(test)]
mod tests {
    //! Proves heads parse into the right spans and framing, and that every ambiguity or excess is
    //! refused with the right error.
    use super::*;

    fn parse(raw: &[u8]) -> Result<Option<RequestHead>, HeadError> {
        parse_head(raw, &HeadLimits::default())
    }

    fn complete(raw: &[u8]) -> RequestHead {
        parse(raw).expect("parses").expect("complete")
    }

    const CHAT: &[u8] = b"POST /v1/chat/completions?beta=true HTTP/1.1\r\n\
        Host: router.local\r\n\
        Authorization: Bearer sk-test\r\n\
        Content-Type: application/json\r\n\
        Content-Length: 42\r\n\
        X-Request-Id: abc-123\r\n\
        anthropic-version: 2023-06-01\r\n\
        Anthropic-Beta: tools-2024\r\n\
        X-Custom:   spaced value  \r\n\
        anthropic-beta: second\r\n\
        \r\nBODY";

    #[test]
    fn parses_a_typical_chat_request() {
        let head = complete(CHAT);
        assert_eq!(head.method, Method::Post);
        assert_eq!(head.path(CHAT), b"/v1/chat/completions");
        assert_eq!(head.query.unwrap().get(CHAT), b"beta=true");
        assert_eq!(head.version, Version::Http11);
        assert_eq!(&CHAT[head.head_bytes..], b"BODY");
        assert_eq!(head.framing, BodyFraming::ContentLength(42));
        assert!(head.keep_alive);
        assert!(!head.expect_continue);
        assert_eq!(head.authorization.unwrap().get(CHAT), b"Bearer sk-test");
        assert_eq!(head.content_type.unwrap().get(CHAT), b"application/json");
        assert_eq!(head.x_request_id.unwrap().get(CHAT), b"abc-123");
        assert_eq!(head.anthropic_version.unwrap().get(CHAT), b"2023-06-01");
        // The first one, as the header lookup it replaces found it.
        assert_eq!(head.anthropic_beta.unwrap().get(CHAT), b"tools-2024");
        assert_eq!(
            head.header(CHAT, "anthropic-beta"),
            Some(&b"tools-2024"[..])
        );
        assert_eq!(head.host.unwrap().get(CHAT), b"router.local");
        assert_eq!(head.x_api_key, None);
        assert_eq!(head.upgrade, None);
        assert!(!head.http2_settings);
        assert_eq!(head.headers_count, 9);
        assert_eq!(head.header(CHAT, "x-custom"), Some(&b"spaced value"[..]));
        assert_eq!(head.header(CHAT, "CONTENT-length"), Some(&b"42"[..]));
        assert_eq!(head.header(CHAT, "missing"), None);
        assert_eq!(head.headers(CHAT).count(), 9);
    }

    #[test]
    fn incomplete_heads_ask_for_more_at_every_prefix() {
        let head_bytes = complete(CHAT).head_bytes;
        for cut in 0..head_bytes {
            assert_eq!(parse(&CHAT[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn keep_alive_defaults_follow_the_version() {
        assert!(!complete(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(complete(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
        assert!(complete(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").keep_alive);
        assert!(
            !complete(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, close\r\n\r\n")
                .keep_alive
        );
        assert!(!complete(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Close\r\n\r\n").keep_alive);
    }

    #[test]
    fn framing_is_none_chunked_or_length() {
        assert_eq!(
            complete(b"GET /v1/models HTTP/1.1\r\nHost: h\r\n\r\n").framing,
            BodyFraming::None
        );
        assert_eq!(
            complete(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n").framing,
            BodyFraming::Chunked
        );
        assert_eq!(
            complete(
                b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n"
            )
            .framing,
            BodyFraming::ContentLength(5)
        );
        assert_eq!(
            complete(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n").framing,
            BodyFraming::ContentLength(0)
        );
        assert_eq!(
            complete(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551615\r\n\r\n")
                .framing,
            BodyFraming::ContentLength(u64::MAX)
        );
    }

    #[test]
    fn ambiguous_framing_is_malformed() {
        let cases: &[&[u8]] = &[
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5, 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: \r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 18446744073709551616\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: \r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        ];
        for raw in cases {
            assert!(
                matches!(parse(raw), Err(HeadError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn garbage_is_malformed() {
        let cases: &[&[u8]] = &[
            b"POST / HTTP/2.0\r\n\r\n",
            b"P@ST / HTTP/1.1\r\nHost: h\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nBad Header: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        ];
        for raw in cases {
            assert!(
                matches!(parse(raw), Err(HeadError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn expect_upgrade_and_api_key_are_seen() {
        let raw = b"POST /v1/messages HTTP/1.1\r\nHost: h\r\nExpect: 100-Continue\r\nx-api-key: k\r\n\
            Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n";
        let head = complete(raw);
        assert!(head.expect_continue);
        assert_eq!(head.x_api_key.unwrap().get(raw), b"k");
        assert_eq!(head.upgrade.unwrap().get(raw), b"h2c");
        assert!(head.http2_settings);
        assert!(head.keep_alive);
        assert!(
            !complete(b"POST / HTTP/1.1\r\nHost: h\r\nExpect: nothing\r\n\r\n").expect_continue
        );
    }

    #[test]
    fn head_size_limit_is_exact() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX: y\r\n\r\n";
        let exact = HeadLimits {
            head_bytes_max: raw.len(),
            ..HeadLimits::default()
        };
        assert!(parse_head(raw, &exact).unwrap().is_some());
        let short = HeadLimits {
            head_bytes_max: raw.len() - 1,
            ..HeadLimits::default()
        };
        assert_eq!(parse_head(raw, &short), Err(HeadError::TooLarge));
        // Partial and already at the limit: can never complete.
        assert_eq!(
            parse_head(&raw[..raw.len() - 1], &short),
            Err(HeadError::TooLarge)
        );
        assert_eq!(parse_head(&raw[..raw.len() - 2], &short), Ok(None));

        let mut huge = b"GET / HTTP/1.1\r\nX: ".to_vec();
        huge.resize(70 * 1024, b'a');
        assert_eq!(parse(&huge), Err(HeadError::TooLarge));
    }

    #[test]
    fn header_count_limit() {
        let mut raw = b"GET / HTTP/1.1\r\nHost: h\r\n".to_vec();
        for index in 1..HEADERS_COUNT_CAP {
            raw.extend_from_slice(format!("x-h{index}: v\r\n").as_bytes());
        }
        let mut over = raw.clone();
        raw.extend_from_slice(b"\r\n");
        assert_eq!(complete(&raw).headers_count, HEADERS_COUNT_CAP);
        over.extend_from_slice(b"x-last: v\r\n\r\n");
        assert_eq!(parse(&over), Err(HeadError::TooLarge));
        let few = HeadLimits {
            headers_count_max: 2,
            ..HeadLimits::default()
        };
        assert_eq!(
            parse_head(
                b"GET / HTTP/1.1\r\nHost: h\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n",
                &few
            ),
            Err(HeadError::TooLarge)
        );
    }

    /// RFC 9112 §3.2 asks for exactly one Host on HTTP/1.1; two credentials are ambiguous; a bad
    /// byte in the target is named as such.
    #[test]
    fn host_and_credentials_must_be_unambiguous() {
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nA: b\r\n\r\n"),
            Err(HeadError::Malformed("missing host header"))
        );
        assert!(complete(b"GET / HTTP/1.0\r\n\r\n").host.is_none());
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"),
            Err(HeadError::Malformed("more than one host header"))
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer x\r\nauthorization: Bearer y\r\n\r\n"),
            Err(HeadError::Malformed("more than one authorization header"))
        );
        assert_eq!(
            parse(b"GET / HTTP/1.1\r\nHost: a\r\nx-api-key: x\r\nX-Api-Key: x\r\n\r\n"),
            Err(HeadError::Malformed("more than one x-api-key header"))
        );
        assert_eq!(
            parse(b"GET /a\0b HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(HeadError::Malformed("invalid byte in the request target"))
        );
        assert_eq!(
            parse(b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(HeadError::Malformed("invalid method token"))
        );
    }

    #[test]
    fn leading_empty_lines_and_empty_values() {
        let raw = b"\r\nGET /x?y HTTP/1.1\r\nHost: h\r\nX-Request-Id:\r\nA: b\r\n\r\n";
        let head = complete(raw);
        assert_eq!(head.path(raw), b"/x");
        assert_eq!(head.x_request_id.unwrap().get(raw), b"");
        assert_eq!(head.header(raw, "a"), Some(&b"b"[..]));
        assert_eq!(head.headers(raw).count(), 3);
        let bare_lf = b"GET / HTTP/1.1\nHost: h\nA: b\n\n";
        assert_eq!(complete(bare_lf).header(bare_lf, "A"), Some(&b"b"[..]));
    }

    #[test]
    fn head_wait_fires_on_the_blank_line_at_any_split() {
        let limits = HeadLimits::default();
        let head_bytes = complete(CHAT).head_bytes;
        for first in 1..=CHAT.len() {
            for second in first..=CHAT.len() {
                let mut wait = HeadWait::default();
                let fired =
                    wait.ready(&CHAT[..first], &limits) || wait.ready(&CHAT[..second], &limits);
                assert_eq!(
                    fired,
                    second >= head_bytes,
                    "reads end at {first} and {second}"
                );
            }
        }
        let mut byte_at_a_time = HeadWait::default();
        let fired = (1..=CHAT.len()).find(|&end| byte_at_a_time.ready(&CHAT[..end], &limits));
        assert_eq!(fired, Some(head_bytes));
        let tiny = HeadLimits {
            head_bytes_max: 8,
            ..HeadLimits::default()
        };
        assert!(HeadWait::default().ready(b"GET / HT", &tiny));
    }

    #[test]
    fn h2_preface_detection() {
        assert_eq!(is_h2_preface(b""), None);
        assert_eq!(is_h2_preface(b"PRI * HTTP/2"), None);
        assert_eq!(is_h2_preface(b"POST /"), Some(false));
        assert_eq!(
            is_h2_preface(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n\r\n\r\n\r\n"),
            Some(false)
        );
        assert_eq!(is_h2_preface(H2_PREFACE), Some(true));
        let mut with_frames = H2_PREFACE.to_vec();
        with_frames.extend_from_slice(&[0, 0, 0, 4, 0]);
        assert_eq!(is_h2_preface(&with_frames), Some(true));
        // The preface is not a valid HTTP/1.1 request either.
        assert!(parse(H2_PREFACE).is_err());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_spans_stay_inside(
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        ) {
            if let Ok(Some(head)) = parse(&raw) {
                proptest::prop_assert!(head.head_bytes <= raw.len());
                for span in [Some(head.path), head.query, head.authorization, head.content_type] {
                    proptest::prop_assert!(span.is_none_or(|span| span.end as usize <= head.head_bytes));
                }
                let _ = head.headers(&raw).count();
            }
        }

        #[test]
        fn mutated_heads_never_panic(index in 0usize..200, byte in proptest::prelude::any::<u8>()) {
            let mut raw = CHAT.to_vec();
            let index = index % raw.len();
            raw[index] = byte;
            if let Ok(Some(head)) = parse(&raw) {
                let _ = head.header(&raw, "content-length");
            }
        }
    }
}
