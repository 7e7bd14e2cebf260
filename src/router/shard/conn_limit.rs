//! `--p2p-max-conns-per-ip`: at most this many agents' tunnel connections from one source prefix
//! (an IPv4 `/32` or an IPv6 `/56`, as the configuration reference defines it), counting every
//! connection from accept until it closes — during its preamble, and while a shard holds it as a
//! tunnel.
//!
//! The reference counts libp2p connections, one an agent ("comfortably above the number of agents
//! sharing that address"). Here an agent keeps one tunnel connection per shard, so the limit is
//! the flag times the shard count ([`ConnLimiter::for_agents`]). Counted per connection, the
//! default 32 would have refused a single agent's 33rd tunnel on a router with more than 32
//! shards (`--shards` defaults to the cores), and the agent, missing a shard, would never join
//! the pool.
//!
//! A [`ConnPermit`] is taken at accept and travels with the socket: the handshake drops it on
//! refusal, and a shard's tunnel task drops it when the tunnel ends, so the count is exact
//! whichever thread closes the connection. The lock is held for a map update on accept and
//! close only, never on the request path.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// A source prefix: the IPv4 address, or the first 56 bits of the IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Prefix {
    V4([u8; 4]),
    V6([u8; 7]),
}

impl Prefix {
    pub fn of(ip: IpAddr) -> Prefix {
        match ip {
            IpAddr::V4(ip) => Prefix::V4(ip.octets()),
            IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
                Some(ip) => Prefix::V4(ip.octets()),
                None => {
                    let octets = ip.octets();
                    let mut prefix = [0u8; 7];
                    prefix.copy_from_slice(&octets[..7]);
                    Prefix::V6(prefix)
                }
            },
        }
    }
}

#[derive(Debug)]
struct Counts {
    max_per_prefix: u32,
    open: HashMap<Prefix, u32>,
}

/// The open-connection count per source prefix.
#[derive(Debug, Clone)]
pub struct ConnLimiter {
    counts: Arc<Mutex<Counts>>,
}

impl ConnLimiter {
    /// Room for `agents_per_prefix` agents from one prefix, each with a tunnel connection to
    /// every one of `shards` shards. 0 means no limit.
    pub fn for_agents(agents_per_prefix: u32, shards: usize) -> ConnLimiter {
        let shards = u32::try_from(shards).unwrap_or(u32::MAX);
        ConnLimiter::new(agents_per_prefix.saturating_mul(shards))
    }

    /// `max_per_prefix` connections from one prefix; 0 means no limit.
    pub fn new(max_per_prefix: u32) -> ConnLimiter {
        ConnLimiter {
            counts: Arc::new(Mutex::new(Counts {
                max_per_prefix,
                open: HashMap::new(),
            })),
        }
    }

    /// A permit for one more connection from `ip`, or `None` when its prefix is at the limit.
    pub fn admit(&self, ip: IpAddr) -> Option<ConnPermit> {
        let prefix = Prefix::of(ip);
        let mut counts = self.counts.lock().expect("connection counts poisoned");
        let limit = counts.max_per_prefix;
        let open = counts.open.entry(prefix).or_insert(0);
        if limit > 0 && *open >= limit {
            return None;
        }
        *open += 1;
        Some(ConnPermit {
            counts: self.counts.clone(),
            prefix,
        })
    }

    /// Open connections from `ip`'s prefix.
    pub fn open(&self, ip: IpAddr) -> u32 {
        let counts = self.counts.lock().expect("connection counts poisoned");
        counts.open.get(&Prefix::of(ip)).copied().unwrap_or(0)
    }
}

/// One counted connection; dropping it (wherever the connection closes) gives the place back.
#[derive(Debug)]
pub struct ConnPermit {
    counts: Arc<Mutex<Counts>>,
    prefix: Prefix,
}

impl Drop for ConnPermit {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().expect("connection counts poisoned");
        if let Some(open) = counts.open.get_mut(&self.prefix) {
            *open -= 1;
            if *open == 0 {
                counts.open.remove(&self.prefix);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn counts_per_prefix_and_frees_on_drop() {
        let limiter = ConnLimiter::new(2);
        let a = limiter.admit(ip("10.0.0.1")).unwrap();
        let b = limiter.admit(ip("10.0.0.1")).unwrap();
        assert!(limiter.admit(ip("10.0.0.1")).is_none());
        // Another /32 is independent.
        assert!(limiter.admit(ip("10.0.0.2")).is_some());
        drop(a);
        let c = limiter.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(limiter.open(ip("10.0.0.1")), 2);
        drop((b, c));
        assert_eq!(limiter.open(ip("10.0.0.1")), 0);
    }

    #[test]
    fn ipv6_shares_a_slash_56_and_mapped_ipv4_is_ipv4() {
        let limiter = ConnLimiter::new(1);
        let _held = limiter.admit(ip("2001:db8:1:2300::1")).unwrap();
        assert!(
            limiter.admit(ip("2001:db8:1:23ff::9")).is_none(),
            "same /56"
        );
        assert!(
            limiter.admit(ip("2001:db8:1:2400::1")).is_some(),
            "next /56"
        );
        let _v4 = limiter.admit(ip("192.0.2.7")).unwrap();
        assert!(limiter.admit(ip("::ffff:192.0.2.7")).is_none());
    }

    #[test]
    fn the_limit_counts_agents_each_with_a_tunnel_to_every_shard() {
        // The default 32 agents on a 64-shard router: 2,048 tunnel connections from one address.
        let limiter = ConnLimiter::for_agents(32, 64);
        let held: Vec<_> = (0..32 * 64)
            .map(|_| {
                limiter
                    .admit(ip("10.0.0.1"))
                    .expect("within 32 agents' tunnels")
            })
            .collect();
        assert!(
            limiter.admit(ip("10.0.0.1")).is_none(),
            "a 33rd agent's tunnel"
        );
        drop(held);
        let unlimited = ConnLimiter::for_agents(0, 64);
        let _held: Vec<_> = (0..10_000)
            .map(|_| unlimited.admit(ip("10.0.0.1")).unwrap())
            .collect();
    }

    #[test]
    fn zero_means_unlimited() {
        let limiter = ConnLimiter::new(0);
        let held: Vec<_> = (0..100)
            .map(|_| limiter.admit(ip("10.0.0.1")).unwrap())
            .collect();
        assert_eq!(limiter.open(ip("10.0.0.1")), 100);
        drop(held);
        assert_eq!(limiter.open(ip("10.0.0.1")), 0);
    }
}
