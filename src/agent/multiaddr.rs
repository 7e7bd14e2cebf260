//! Tunnel addresses from the authentication response: the multiaddr subset routers announce
//! (`/ip4/…/tcp/…`, `/ip6/…/tcp/…`, `/dns/…`, `/dns4/…`, `/dns6/…`, optionally followed by
//! `/tls` — the tunnel speaks TLS, `crate::net::tunnel::tls` — and `/p2p/<peer id>`), turned into a
//! host and port to dial. Pure.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelAddr {
    pub host: String,
    pub port: u16,
    /// The router's tunnel port speaks TLS; `host` is the name its certificate must carry.
    pub tls: bool,
}

impl TunnelAddr {
    /// `host:port`, with brackets around IPv6 literals, as `TcpStream::connect` takes it.
    pub fn dial_target(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for TunnelAddr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.dial_target())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MultiaddrError {
    #[error("multiaddr {0:?} does not start with /ip4, /ip6, /dns, /dns4 or /dns6")]
    UnsupportedHost(String),
    #[error("multiaddr {0:?} has no /tcp/<port>")]
    NoTcpPort(String),
    #[error("multiaddr {0:?} has an invalid host or port")]
    Invalid(String),
}

pub fn parse(text: &str) -> Result<TunnelAddr, MultiaddrError> {
    let mut parts = text.trim().split('/');
    if parts.next() != Some("") {
        return Err(MultiaddrError::UnsupportedHost(text.to_owned()));
    }
    let protocol = parts.next().unwrap_or_default();
    let host = parts.next().unwrap_or_default();
    if host.is_empty() {
        return Err(MultiaddrError::Invalid(text.to_owned()));
    }
    match protocol {
        "ip4" => {
            host.parse::<std::net::Ipv4Addr>()
                .map_err(|_| MultiaddrError::Invalid(text.to_owned()))?;
        }
        "ip6" => {
            host.parse::<std::net::Ipv6Addr>()
                .map_err(|_| MultiaddrError::Invalid(text.to_owned()))?;
        }
        "dns" | "dns4" | "dns6" => {}
        _ => return Err(MultiaddrError::UnsupportedHost(text.to_owned())),
    }
    if parts.next() != Some("tcp") {
        return Err(MultiaddrError::NoTcpPort(text.to_owned()));
    }
    let port: u16 = parts
        .next()
        .and_then(|port| port.parse().ok())
        .filter(|port| *port != 0)
        .ok_or_else(|| MultiaddrError::Invalid(text.to_owned()))?;
    // After the port: `/tls`, and `/p2p/<peer id>` (which identifies the router, not where to
    // dial); anything else is ignored.
    let mut tls = false;
    while let Some(component) = parts.next() {
        match component {
            "tls" => tls = true,
            "p2p" => {
                parts.next();
            }
            _ => {}
        }
    }
    Ok(TunnelAddr {
        host: host.to_owned(),
        port,
        tls,
    })
}

/// The first address of the list that parses; the others are reported by the caller.
pub fn first_dialable(addrs: &[String]) -> Option<TunnelAddr> {
    addrs.iter().find_map(|addr| parse(addr).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_announced_forms() {
        assert_eq!(
            parse("/ip4/127.0.0.1/tcp/9000").unwrap().dial_target(),
            "127.0.0.1:9000"
        );
        assert_eq!(
            parse("/dns4/router.internal/tcp/9001").unwrap(),
            TunnelAddr {
                host: "router.internal".into(),
                port: 9001,
                tls: false,
            }
        );
        let secure = parse("/dns4/router.example/tcp/9000/tls/p2p/12D3KooWabc").unwrap();
        assert!(secure.tls);
        assert_eq!(secure.host, "router.example");
        assert!(parse("/ip4/10.0.0.1/tcp/9000/tls").unwrap().tls);
        assert!(!parse("/ip4/10.0.0.1/tcp/9000/p2p/tls").unwrap().tls);
        assert_eq!(
            parse("/ip6/::1/tcp/9000").unwrap().dial_target(),
            "[::1]:9000"
        );
        assert_eq!(
            parse("/ip4/10.0.0.1/tcp/9000/p2p/12D3KooWabc")
                .unwrap()
                .port,
            9000
        );
    }

    #[test]
    fn refuses_what_cannot_be_dialed() {
        assert!(matches!(
            parse("/ip4/1.2.3.4/udp/9000/quic"),
            Err(MultiaddrError::NoTcpPort(_))
        ));
        assert!(matches!(
            parse("127.0.0.1:9000"),
            Err(MultiaddrError::UnsupportedHost(_))
        ));
        assert!(matches!(
            parse("/ip4/300.1.1.1/tcp/9000"),
            Err(MultiaddrError::Invalid(_))
        ));
        assert!(matches!(
            parse("/ip4/1.1.1.1/tcp/0"),
            Err(MultiaddrError::Invalid(_))
        ));
        assert!(matches!(
            parse("/ip4/1.1.1.1/tcp/70000"),
            Err(MultiaddrError::Invalid(_))
        ));
        assert!(matches!(
            parse("/unix/x"),
            Err(MultiaddrError::UnsupportedHost(_))
        ));
    }

    #[test]
    fn first_dialable_skips_unusable_entries() {
        let addrs = vec![
            "/ip4/1.2.3.4/udp/1/quic".to_owned(),
            "/dns/r/tcp/9000".to_owned(),
        ];
        assert_eq!(first_dialable(&addrs).unwrap().host, "r");
        assert_eq!(first_dialable(&[]), None);
    }
}
