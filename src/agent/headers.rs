//! Header rules at the tunnel boundary, in both directions. Pure.
//!
//! Hop-by-hop headers describe one connection (RFC 9110 §7.6.1) and must not cross to the next:
//! the router -> agent leg is HTTP/2 and the agent -> backend leg HTTP/1.1, and HTTP/2 refuses
//! connection-specific headers outright (RFC 9113 §8.2.2), so a backend's `transfer-encoding:
//! chunked` or `connection: keep-alive` would otherwise break the response.

use http::HeaderMap;
use http::header::{CONNECTION, HOST, HeaderName, HeaderValue};

/// Headers that never cross a hop, whatever the `Connection` header says.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "trailer",
];

fn is_hop_by_hop(name: &HeaderName) -> bool {
    let name = name.as_str();
    HOP_BY_HOP.contains(&name) || name.starts_with("proxy-")
}

/// Removes hop-by-hop headers, including every header the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Nearly every request and response has none (`Connection` is one itself): one pass over
    // the names, nothing collected.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    let hop: Vec<HeaderName> = headers
        .keys()
        .filter(|name| is_hop_by_hop(name))
        .cloned()
        .collect();
    for name in hop {
        headers.remove(name);
    }
}

/// Prepares a tunnelled request's headers for the backend: hop-by-hop removed, `host` set to the
/// backend authority (engines behind a virtual host route on it).
pub fn to_backend(headers: &mut HeaderMap, backend_authority: &HeaderValue) {
    strip_hop_by_hop(headers);
    headers.insert(HOST, backend_authority.clone());
}

/// Prepares a backend response's headers for the tunnel.
pub fn to_router(headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        headers
    }

    #[test]
    fn request_loses_hop_by_hop_and_gets_backend_host() {
        let mut headers = map(&[
            ("host", "router.example"),
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-connection", "keep-alive"),
            ("content-type", "application/json"),
            ("content-length", "12"),
            ("authorization", "Bearer sk"),
        ]);
        to_backend(&mut headers, &HeaderValue::from_static("127.0.0.1:8000"));
        let mut names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            ["authorization", "content-length", "content-type", "host"]
        );
        assert_eq!(headers[HOST], "127.0.0.1:8000");
    }

    #[test]
    fn response_loses_chunked_encoding() {
        let mut headers = map(&[
            ("transfer-encoding", "chunked"),
            ("connection", "close"),
            ("content-type", "text/event-stream"),
            ("x-request-id", "abc"),
        ]);
        to_router(&mut headers);
        assert_eq!(headers.len(), 2);
        assert!(headers.contains_key("content-type"));
        assert!(headers.contains_key("x-request-id"));
    }

    #[test]
    fn headers_without_hop_by_hop_ones_pass_unchanged() {
        let pairs = [
            ("content-type", "application/json"),
            ("x-request-id", "abc"),
            ("proxy", "not a proxy- header"),
            ("keep-alive-ish", "1"),
            ("date", "Wed, 02 Dec 2026 04:15:37 GMT"),
        ];
        let mut headers = map(&pairs);
        to_router(&mut headers);
        assert_eq!(headers, map(&pairs));
        let mut with_one = map(&pairs);
        with_one.append("te", HeaderValue::from_static("trailers"));
        to_router(&mut with_one);
        assert_eq!(with_one, map(&pairs));
    }

    #[test]
    fn empty_and_odd_connection_values_are_harmless() {
        let mut headers = map(&[("connection", " , ,"), ("accept", "*/*")]);
        to_router(&mut headers);
        assert_eq!(headers.len(), 1);
    }
}
