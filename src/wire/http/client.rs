//! The client half of HTTP/1.1, for the agent's exchanges with its engine: writing a request
//! head, and reading a response head with the framing of the body after it (RFC 9112 §6.3).
//!
//! Invariants:
//! - [`parse_response_head`] reads at most [`RESPONSE_HEAD_BYTES_MAX`] bytes and
//!   [`RESPONSE_HEADERS_MAX`] fields; anything longer is [`ResponseHeadError::TooLarge`].
//! - The framing is decided as RFC 9112 §6.3 says for a response to a request that is neither
//!   `HEAD` nor `CONNECT` (the agent sends neither): no body for 1xx, 204 and 304; a final
//!   `chunked` coding is chunked; any other `transfer-encoding` is read until the connection
//!   closes; a `content-length` whose values disagree or are not digits is refused, since where
//!   the body ends would be a guess (a response-splitting vector); without either, until close.
//! - A connection may carry another exchange only when the response says it stays open
//!   ([`ResponseHead::keep_alive`]) and its body has a known end; `transfer-encoding` beside
//!   `content-length` also closes it afterwards, as §6.3 requires.
//! - Header values are copied out of the read buffer, which the caller then reuses for the body.

use std::mem::MaybeUninit;

use bytes::{BufMut, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, HeaderMap, HeaderName, HeaderValue};
use thiserror::Error;

/// Longest response head accepted, status line and fields together.
pub const RESPONSE_HEAD_BYTES_MAX: usize = 64 * 1024;
/// Most header fields accepted in one response head.
pub const RESPONSE_HEADERS_MAX: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ResponseHeadError {
    #[error(
        "response head longer than {RESPONSE_HEAD_BYTES_MAX} bytes or {RESPONSE_HEADERS_MAX} fields"
    )]
    TooLarge,
    #[error("malformed response head: {0}")]
    Malformed(&'static str),
}

/// Where a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (1xx, 204, 304, or `content-length: 0`).
    Empty,
    Length(u64),
    Chunked,
    /// The body runs until the engine closes the connection.
    UntilClose,
}

/// A parsed response head. An interim (1xx) head is returned too: the caller drops its
/// [`head_bytes`](Self::head_bytes) and reads the next head.
#[derive(Debug, PartialEq)]
pub struct ResponseHead {
    pub status: u16,
    /// Every field as sent, in order (hop-by-hop ones included: the caller decides what crosses).
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another exchange once this body is read to its end.
    pub keep_alive: bool,
    /// Bytes of the head, blank line included; the body starts after them.
    pub head_bytes: usize,
}

impl ResponseHead {
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status)
    }
}

/// Parses a response head from the start of `buf`. `Ok(None)`: incomplete, read more and call
/// again with the grown buffer (parsing restarts at the beginning: cheap next to a read).
pub fn parse_response_head(buf: &[u8]) -> Result<Option<ResponseHead>, ResponseHeadError> {
    let window = &buf[..buf.len().min(RESPONSE_HEAD_BYTES_MAX)];
    let mut storage =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; RESPONSE_HEADERS_MAX];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        window,
        &mut storage,
    );
    let head_bytes = match parsed {
        Ok(httparse::Status::Complete(head_bytes)) => head_bytes,
        Ok(httparse::Status::Partial) if buf.len() >= RESPONSE_HEAD_BYTES_MAX => {
            return Err(ResponseHeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(ResponseHeadError::TooLarge),
        Err(httparse::Error::Status) => return Err(ResponseHeadError::Malformed("bad status")),
        Err(httparse::Error::Version) => return Err(ResponseHeadError::Malformed("bad version")),
        Err(_) => return Err(ResponseHeadError::Malformed("bad status line or field")),
    };
    let status = response.code.unwrap_or_default();
    if !(100..1000).contains(&status) {
        return Err(ResponseHeadError::Malformed("bad status"));
    }
    let http11 = response.version == Some(1);
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut connection = super::ConnectionTokens::default();
    let mut transfer_encoding: Option<bool> = None; // Some(whether the final coding is chunked)
    let mut content_length: Option<u64> = None;
    for field in response.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes())
            .map_err(|_| ResponseHeadError::Malformed("bad field name"))?;
        let value = HeaderValue::from_bytes(field.value)
            .map_err(|_| ResponseHeadError::Malformed("bad field value"))?;
        if name == CONNECTION {
            connection.read(field.value);
        } else if name == http::header::TRANSFER_ENCODING {
            // Codings accumulate across fields; only the last one decides.
            if let Some(last) = field.value.rsplit(|&byte| byte == b',').next() {
                let last = last.trim_ascii();
                if !last.is_empty() {
                    transfer_encoding = Some(last.eq_ignore_ascii_case(b"chunked"));
                }
            }
        } else if name == CONTENT_LENGTH {
            for part in field.value.split(|&byte| byte == b',') {
                let length = super::content_length(part).map_err(ResponseHeadError::Malformed)?;
                if content_length.is_some_and(|seen| seen != length) {
                    return Err(ResponseHeadError::Malformed("conflicting content-length"));
                }
                content_length = Some(length);
            }
        }
        headers.append(name, value);
    }
    let mut keep_alive = connection.keep_alive(http11);
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Empty
    } else if let Some(chunked) = transfer_encoding {
        if content_length.is_some() {
            // §6.3: `transfer-encoding` overrides, and the connection must close afterwards.
            keep_alive = false;
        }
        if chunked {
            Framing::Chunked
        } else {
            Framing::UntilClose
        }
    } else {
        match content_length {
            Some(0) => Framing::Empty,
            Some(length) => Framing::Length(length),
            None => Framing::UntilClose,
        }
    };
    if framing == Framing::UntilClose {
        keep_alive = false;
    }
    Ok(Some(ResponseHead {
        status,
        headers,
        framing,
        keep_alive,
        head_bytes,
    }))
}

/// How the request body travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody {
    /// No body and no framing field (a `GET` without one).
    None,
    Length(u64),
    Chunked,
}

/// Appends `{method} {target} HTTP/1.1`, the fields, the body's framing field and the blank
/// line; a chunked body follows in `super::response::write_chunk`'s frames. The fields must
/// already be the ones the engine should get: no hop-by-hop fields (`transfer-encoding` among
/// them); a `content-length` of their own is left out for the one this writes.
pub fn write_request_head(
    out: &mut BytesMut,
    method: &http::Method,
    target: &str,
    headers: &HeaderMap,
    body: RequestBody,
) {
    out.put_slice(method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == CONTENT_LENGTH {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    match body {
        RequestBody::None => {}
        RequestBody::Length(length) => {
            out.put_slice(b"content-length: ");
            out.put_slice(itoa::Buffer::new().format(length).as_bytes());
            out.put_slice(b"\r\n");
        }
        RequestBody::Chunked => out.put_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> ResponseHead {
        parse_response_head(text.as_bytes()).unwrap().unwrap()
    }

    fn refused(text: &str) -> ResponseHeadError {
        parse_response_head(text.as_bytes()).unwrap_err()
    }

    #[test]
    fn a_head_with_a_length_keeps_the_connection_and_its_fields() {
        let text = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 27\r\nx-a: 1\r\nx-a: 2\r\n\r\n{";
        let head = parsed(text);
        assert_eq!(head.status, 200);
        assert_eq!(head.framing, Framing::Length(27));
        assert!(head.keep_alive);
        assert_eq!(head.head_bytes, text.len() - 1);
        assert_eq!(head.headers["content-type"], "application/json");
        let repeated: Vec<_> = head.headers.get_all("x-a").iter().collect();
        assert_eq!(repeated, ["1", "2"]);
    }

    #[test]
    fn an_incomplete_head_asks_for_more_and_an_endless_one_is_refused() {
        assert!(
            parse_response_head(b"HTTP/1.1 200 OK\r\ncontent-len")
                .unwrap()
                .is_none()
        );
        let mut endless = b"HTTP/1.1 200 OK\r\nx-long: ".to_vec();
        endless.resize(RESPONSE_HEAD_BYTES_MAX, b'a');
        assert_eq!(
            parse_response_head(&endless).unwrap_err(),
            ResponseHeadError::TooLarge
        );
        let mut many = String::from("HTTP/1.1 200 OK\r\n");
        for field in 0..=RESPONSE_HEADERS_MAX {
            many.push_str(&format!("x-{field}: 1\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(refused(&many), ResponseHeadError::TooLarge);
    }

    #[test]
    fn the_body_framing_follows_rfc_9112() {
        let framing = |text: &str| parsed(text).framing;
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n"
            ),
            Framing::UntilClose
        );
        assert_eq!(framing("HTTP/1.1 200 OK\r\n\r\n"), Framing::UntilClose);
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(framing("HTTP/1.1 304 Not Modified\r\n\r\n"), Framing::Empty);
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 7, 7\r\n\r\n"),
            Framing::Length(7)
        );
        let interim = parsed("HTTP/1.1 100 Continue\r\n\r\n");
        assert!(interim.is_interim());
        assert_eq!(interim.framing, Framing::Empty);
    }

    #[test]
    fn keep_alive_follows_the_version_and_the_connection_field() {
        let keep = |text: &str| parsed(text).keep_alive;
        assert!(!keep(
            "HTTP/1.1 200 OK\r\nconnection: Close\r\ncontent-length: 1\r\n\r\n"
        ));
        assert!(!keep("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n"));
        assert!(keep(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n"
        ));
        // `close` wins whatever the order of the tokens, as for requests.
        for tokens in ["close, keep-alive", "keep-alive, close"] {
            assert!(!keep(&format!(
                "HTTP/1.0 200 OK\r\nconnection: {tokens}\r\ncontent-length: 1\r\n\r\n"
            )));
        }
        // A body that ends at the close cannot be followed by another exchange.
        assert!(!keep("HTTP/1.1 200 OK\r\n\r\n"));
        // Both framing fields: transfer-encoding wins, and the connection closes afterwards.
        let both =
            parsed("HTTP/1.1 200 OK\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n");
        assert_eq!(both.framing, Framing::Chunked);
        assert!(!both.keep_alive);
    }

    #[test]
    fn a_length_that_cannot_be_trusted_is_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 7\r\ncontent-length: 8\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 7, 8\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +7\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x7\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
        ] {
            assert!(
                matches!(refused(text), ResponseHeadError::Malformed(_)),
                "{text:?}"
            );
        }
        assert!(matches!(
            refused("HTTP/1.1 abc OK\r\n\r\n"),
            ResponseHeadError::Malformed(_)
        ));
        assert!(matches!(
            refused("HTTP/2.0 200 OK\r\n\r\n"),
            ResponseHeadError::Malformed(_)
        ));
    }

    #[test]
    fn a_request_head_carries_its_fields_and_its_body_framing() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("engine:8000"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        // A framing field of its own is replaced by the one written for the body.
        headers.insert("content-length", HeaderValue::from_static("999"));
        let mut out = BytesMut::new();
        write_request_head(
            &mut out,
            &http::Method::POST,
            "/v1/chat/completions",
            &headers,
            RequestBody::Length(12),
        );
        assert_eq!(
            &out[..],
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine:8000\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n"
        );
        out.clear();
        write_request_head(
            &mut out,
            &http::Method::GET,
            "/v1/models",
            &HeaderMap::new(),
            RequestBody::None,
        );
        assert_eq!(&out[..], b"GET /v1/models HTTP/1.1\r\n\r\n");
        out.clear();
        write_request_head(
            &mut out,
            &http::Method::POST,
            "/v1/messages",
            &HeaderMap::new(),
            RequestBody::Chunked,
        );
        assert_eq!(
            &out[..],
            b"POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"
        );
    }
}
