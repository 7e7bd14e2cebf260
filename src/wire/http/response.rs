//! Response writing: status line and headers, chunk frames, and the router's JSON error body.
//!
//! Owns the exact bytes the router puts on the wire for responses it frames itself. Writers
//! append to any [`BufMut`] (`Vec<u8>` or `BytesMut`) so the shard can reuse one buffer per
//! connection; nothing here allocates except [`error_body`], which returns a fresh body.
//!
//! Invariants:
//! - A head carries exactly one framing: `content-length`, `transfer-encoding: chunked`, or
//!   neither for bodiless responses ([`ResponseFraming::NoBody`]).
//! - Header names and values written here must not contain CR or LF (checked in debug builds):
//!   values echoed from a request, such as `x-request-id`, were already refused by the request
//!   parser if they did.
//! - [`write_chunk`] never writes an empty chunk, which would end the body early.

use bytes::BufMut;

/// The last chunk and an empty trailer section: ends a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
/// The interim response sent when a request carried `Expect: 100-continue`.
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// How the response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    ContentLength(u64),
    Chunked,
    /// For 1xx, 204 and 304, and answers to HEAD: no framing header at all.
    NoBody,
}

/// Everything needed to write one response head.
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    pub status: u16,
    pub content_type: Option<&'a str>,
    pub framing: ResponseFraming,
    /// Write `connection: close`; the shard closes after the body.
    pub close: bool,
    /// Further headers, written in order after the standard ones: the connection's own
    /// (`x-request-id`, `traceparent`, `cache-control` on a stream).
    pub extra_headers: &'a [(&'a str, &'a [u8])],
    /// The caller's headers, written in order after `extra_headers`: a refusal's
    /// `retry-after`, the key's rate headers, the engine's fields.
    pub passed_headers: &'a [(&'a str, &'a [u8])],
}

impl ResponseHead<'_> {
    /// Append the status line, headers and the blank line to `out`.
    pub fn write<B: BufMut>(&self, out: &mut B) {
        out.put_slice(b"HTTP/1.1 ");
        put_decimal(out, u64::from(self.status));
        out.put_u8(b' ');
        out.put_slice(reason_phrase(self.status).as_bytes());
        out.put_slice(b"\r\n");
        if let Some(content_type) = self.content_type {
            put_header(out, "content-type", content_type.as_bytes());
        }
        match self.framing {
            ResponseFraming::ContentLength(length) => {
                out.put_slice(b"content-length: ");
                put_decimal(out, length);
                out.put_slice(b"\r\n");
            }
            ResponseFraming::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
            ResponseFraming::NoBody => {}
        }
        if self.close {
            out.put_slice(b"connection: close\r\n");
        }
        for (name, value) in self.extra_headers.iter().chain(self.passed_headers) {
            put_header(out, name, value);
        }
        out.put_slice(b"\r\n");
    }
}

fn put_header<B: BufMut>(out: &mut B, name: &str, value: &[u8]) {
    debug_assert!(
        !name
            .bytes()
            .any(|byte| byte == b'\r' || byte == b'\n' || byte == b':')
    );
    debug_assert!(!value.iter().any(|&byte| byte == b'\r' || byte == b'\n'));
    out.put_slice(name.as_bytes());
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// Append `{len:x}\r\n{data}\r\n`; nothing for empty `data`.
pub fn write_chunk<B: BufMut>(out: &mut B, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    write_chunk_header(out, data.len());
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// Append only `{len:x}\r\n`, for callers that write the data themselves (vectored writes) and
/// follow it with `\r\n`. `len` must not be zero.
pub fn write_chunk_header<B: BufMut>(out: &mut B, len: usize) {
    debug_assert!(len > 0, "an empty chunk is the last chunk");
    let mut digits = [0u8; 16];
    let mut position = digits.len();
    let mut rest = len as u64;
    loop {
        position -= 1;
        digits[position] = b"0123456789abcdef"[(rest & 0xf) as usize];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    out.put_slice(&digits[position..]);
    out.put_slice(b"\r\n");
}

/// Append the last chunk and an empty trailer section.
pub fn write_last_chunk<B: BufMut>(out: &mut B) {
    out.put_slice(LAST_CHUNK);
}

fn put_decimal<B: BufMut>(out: &mut B, value: u64) {
    let mut digits = [0u8; 20];
    let mut position = digits.len();
    let mut rest = value;
    loop {
        position -= 1;
        digits[position] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.put_slice(&digits[position..]);
}

/// The standard reason phrase (RFC 9110 §15), or `"Unknown"`; clients ignore it anyway.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        499 => "Client Closed Request",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        529 => "Site Overloaded",
        _ => "Unknown",
    }
}

/// `{"error":{"code":"<code>","message":"<message>","source":"<source>"}}`, strings
/// JSON-escaped.
pub fn error_body(code: &str, message: &str, source: &str) -> Vec<u8> {
    let mut body = Vec::with_capacity(48 + code.len() + message.len() + source.len());
    body.extend_from_slice(b"{\"error\":{\"code\":");
    put_json_string(&mut body, code);
    body.extend_from_slice(b",\"message\":");
    put_json_string(&mut body, message);
    body.extend_from_slice(b",\"source\":");
    put_json_string(&mut body, source);
    body.extend_from_slice(b"}}");
    body
}

/// Append `text` as a JSON string literal (RFC 8259 §7): quote, backslash and control characters
/// escaped, everything else (valid UTF-8) verbatim.
pub fn put_json_string<B: BufMut>(out: &mut B, text: &str) {
    out.put_u8(b'"');
    let bytes = text.as_bytes();
    let mut clean_from = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.put_slice(&bytes[clean_from..index]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.put_slice(b"\\u00");
            out.put_u8(HEX[usize::from(byte >> 4)]);
            out.put_u8(HEX[usize::from(byte & 0xf)]);
        } else {
            out.put_slice(escape);
        }
        clean_from = index + 1;
    }
    out.put_slice(&bytes[clean_from..]);
    out.put_u8(b'"');
}

#[cfg(test)]
mod tests {
    //! Proves the exact bytes of heads, chunk frames and the error envelope.
    use super::*;

    #[test]
    fn writes_a_content_length_head() {
        let mut out = Vec::new();
        ResponseHead {
            status: 429,
            content_type: Some("application/json"),
            framing: ResponseFraming::ContentLength(1234),
            close: false,
            extra_headers: &[("x-request-id", b"abc")],
            passed_headers: &[("retry-after", b"2"), ("server", b"engine")],
        }
        .write(&mut out);
        assert_eq!(
            out,
            b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
              content-length: 1234\r\nx-request-id: abc\r\nretry-after: 2\r\nserver: engine\r\n\r\n"
        );
    }

    #[test]
    fn writes_a_chunked_closing_head_into_bytes_mut() {
        let mut out = bytes::BytesMut::new();
        ResponseHead {
            status: 200,
            content_type: Some("text/event-stream"),
            framing: ResponseFraming::Chunked,
            close: true,
            extra_headers: &[],
            passed_headers: &[],
        }
        .write(&mut out);
        assert_eq!(
            &out[..],
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
              transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
    }

    #[test]
    fn bodiless_head_and_zero_length() {
        let mut out = Vec::new();
        ResponseHead {
            status: 204,
            content_type: None,
            framing: ResponseFraming::NoBody,
            close: false,
            extra_headers: &[],
            passed_headers: &[],
        }
        .write(&mut out);
        assert_eq!(out, b"HTTP/1.1 204 No Content\r\n\r\n");
        out.clear();
        ResponseHead {
            status: 799,
            content_type: None,
            framing: ResponseFraming::ContentLength(0),
            close: false,
            extra_headers: &[],
            passed_headers: &[],
        }
        .write(&mut out);
        assert_eq!(out, b"HTTP/1.1 799 Unknown\r\ncontent-length: 0\r\n\r\n");
    }

    #[test]
    fn chunk_frames() {
        let mut out = Vec::new();
        write_chunk(&mut out, b"hello");
        write_chunk(&mut out, b"");
        write_chunk(&mut out, &[b'x'; 26]);
        write_last_chunk(&mut out);
        let mut expected = b"5\r\nhello\r\n1a\r\n".to_vec();
        expected.extend_from_slice(&[b'x'; 26]);
        expected.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(out, expected);

        out.clear();
        write_chunk_header(&mut out, 0x10_0000);
        assert_eq!(out, b"100000\r\n");
    }

    #[test]
    fn error_body_is_exact() {
        assert_eq!(
            error_body("rate_limited", "too many requests for key k1", "router"),
            br#"{"error":{"code":"rate_limited","message":"too many requests for key k1","source":"router"}}"#
        );
    }

    #[test]
    fn error_body_escapes_like_serde_json() {
        let nasty = "quote \" backslash \\ newline \n tab \t nul \u{0} bell \u{7} del \u{7f} é 🚀 </script>";
        let body = error_body("bad\"code", nasty, "router");
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(parsed["error"]["code"], "bad\"code");
        assert_eq!(parsed["error"]["message"], nasty);
        assert_eq!(parsed["error"]["source"], "router");
        // Same bytes as serde_json's own string encoding.
        let mut ours = Vec::new();
        put_json_string(&mut ours, nasty);
        assert_eq!(ours, serde_json::to_vec(nasty).unwrap());
    }
}
