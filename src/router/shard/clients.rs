//! What one client may cost a shard: open connections, request-body bytes held while they
//! arrive, and stream resets (HTTP/2 rapid reset), counted per source address.
//!
//! Every bound here protects the clients that behave: a shard refuses a connection over
//! `--max-client-connections` with `503` at once instead of running out of descriptors; it refuses
//! a body that would take its buffered bytes over `--max-buffered-body-bytes` with `503` instead of
//! growing without limit (unbounded, 100 connections × 5 MiB of unauthenticated bodies take a
//! router from 37 MB to 656 MB); and it stops a source whose clients reset streams faster than
//! [`ResetLimits`] allows, because each reset of a forwarded request is passed on to an agent's
//! tunnel, which every client of that agent shares.
//!
//! Single-threaded (one per shard, `Cell`s only), no I/O, no clock: callers pass `now`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Bounds on what the clients of one shard may hold. Scope: per shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Client connections open at once (`--max-client-connections`, per shard).
    pub connections_max: usize,
    /// Request-body bytes being received at once (`--max-buffered-body-bytes`, per shard).
    pub body_bytes_max: usize,
    pub resets: ResetLimits,
}

impl Default for ClientLimits {
    fn default() -> ClientLimits {
        ClientLimits {
            connections_max: 10_000,
            body_bytes_max: 64 * 1024 * 1024,
            resets: ResetLimits::default(),
        }
    }
}

/// A token bucket of stream resets per source address and shard: `burst` at once, refilled at
/// `per_second`. A source over it is refused for `penalty`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetLimits {
    pub burst: u32,
    pub per_second: u32,
    pub penalty: Duration,
}

impl Default for ResetLimits {
    fn default() -> ResetLimits {
        // Generous for a NAT full of people pressing "stop", far below what tears a tunnel down.
        ResetLimits {
            burst: 200,
            per_second: 20,
            penalty: Duration::from_secs(10),
        }
    }
}

/// Sources tracked at once; beyond it the quietest entries are forgotten (bounded memory).
const SOURCES_MAX: usize = 4096;

/// The shard's client bounds and their live counts.
pub struct ClientGuard {
    limits: ClientLimits,
    connections: Cell<usize>,
    body_bytes: Rc<Cell<usize>>,
    resets: RefCell<ResetLedger>,
}

impl ClientGuard {
    pub fn new(limits: ClientLimits) -> ClientGuard {
        ClientGuard {
            limits,
            connections: Cell::new(0),
            body_bytes: Rc::new(Cell::new(0)),
            resets: RefCell::new(ResetLedger::new(limits.resets)),
        }
    }

    /// Counts a new connection from `source`; `None` when the shard is full or the source is
    /// refused for its resets (answer and close it).
    pub fn open_connection(
        self: &Rc<Self>,
        source: Option<IpAddr>,
        now: Instant,
    ) -> Result<ConnectionPermit, Refusal> {
        if self.connections.get() >= self.limits.connections_max {
            return Err(Refusal::Connections);
        }
        if let Some(source) = source
            && self.resets.borrow_mut().is_refused(source, now)
        {
            return Err(Refusal::Resets);
        }
        self.connections.set(self.connections.get() + 1);
        Ok(ConnectionPermit {
            guard: self.clone(),
        })
    }

    pub fn connections(&self) -> usize {
        self.connections.get()
    }

    /// Reserves `bytes` of body buffer; `None` when that would go over the shard's bound.
    pub fn lease_body(&self, bytes: usize) -> Option<BodyLease> {
        let mut lease = BodyLease {
            held: 0,
            max: self.limits.body_bytes_max,
            used: self.body_bytes.clone(),
        };
        lease.grow_to(bytes).then_some(lease)
    }

    pub fn body_bytes(&self) -> usize {
        self.body_bytes.get()
    }

    /// A client reset one of its streams. True when `source` is now refused: its connections
    /// should be closed.
    pub fn stream_reset(&self, source: Option<IpAddr>, now: Instant) -> bool {
        match source {
            Some(source) => self.resets.borrow_mut().record(source, now),
            None => false,
        }
    }

    /// Whether `source` is refused for its resets.
    pub fn is_refused(&self, source: Option<IpAddr>, now: Instant) -> bool {
        source.is_some_and(|source| self.resets.borrow_mut().is_refused(source, now))
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `--max-client-connections` are open on this shard.
    Connections,
    /// The source reset too many streams recently.
    Resets,
}

/// One open connection; dropping it frees its place.
pub struct ConnectionPermit {
    guard: Rc<ClientGuard>,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let open = &self.guard.connections;
        open.set(open.get() - 1);
    }
}

/// Body bytes reserved while a body arrives; dropping it gives them back.
pub struct BodyLease {
    held: usize,
    max: usize,
    used: Rc<Cell<usize>>,
}

impl BodyLease {
    /// Grows the reservation to `bytes` in all; false (nothing changed) when the shard's bound
    /// would be passed.
    pub fn grow_to(&mut self, bytes: usize) -> bool {
        if bytes <= self.held {
            return true;
        }
        let more = bytes - self.held;
        let used = self.used.get();
        if used.saturating_add(more) > self.max {
            return false;
        }
        self.used.set(used + more);
        self.held = bytes;
        true
    }
}

impl Drop for BodyLease {
    fn drop(&mut self) {
        self.used.set(self.used.get() - self.held);
    }
}

/// Reset buckets per source address.
struct ResetLedger {
    limits: ResetLimits,
    sources: HashMap<IpAddr, Bucket, foldhash::fast::RandomState>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Resets still allowed, in thousandths (integer refill without drift).
    milli_tokens: u64,
    refilled_at: Instant,
    refused_until: Option<Instant>,
}

impl ResetLedger {
    fn new(limits: ResetLimits) -> ResetLedger {
        ResetLedger {
            limits,
            sources: HashMap::default(),
        }
    }

    fn full(&self) -> u64 {
        u64::from(self.limits.burst) * 1000
    }

    /// Counts one reset; true when the source is (now) refused.
    fn record(&mut self, source: IpAddr, now: Instant) -> bool {
        if !self.sources.contains_key(&source) && self.sources.len() >= SOURCES_MAX {
            self.forget_quietest(now);
        }
        let full = self.full();
        let limits = self.limits;
        let bucket = self.sources.entry(source).or_insert(Bucket {
            milli_tokens: full,
            refilled_at: now,
            refused_until: None,
        });
        refill(bucket, limits, full, now);
        if bucket.refused_until.is_some_and(|until| now < until) {
            return true;
        }
        match bucket.milli_tokens.checked_sub(1000) {
            Some(left) => {
                bucket.milli_tokens = left;
                false
            }
            None => {
                bucket.refused_until = Some(now + limits.penalty);
                true
            }
        }
    }

    fn is_refused(&mut self, source: IpAddr, now: Instant) -> bool {
        let Some(bucket) = self.sources.get_mut(&source) else {
            return false;
        };
        match bucket.refused_until {
            Some(until) if now < until => true,
            Some(_) => {
                bucket.refused_until = None;
                false
            }
            None => false,
        }
    }

    /// Drops the entries with the most tokens left (the sources that reset least lately), half
    /// of the table at a time so the cost is amortised.
    fn forget_quietest(&mut self, now: Instant) {
        let (full, limits) = (self.full(), self.limits);
        let mut levels: Vec<u64> = self
            .sources
            .values_mut()
            .map(|bucket| {
                refill(bucket, limits, full, now);
                bucket.milli_tokens
            })
            .collect();
        let middle = levels.len() / 2;
        let (_, threshold, _) = levels.select_nth_unstable(middle);
        let threshold = *threshold;
        self.sources.retain(|_, bucket| {
            bucket.milli_tokens < threshold || bucket.refused_until.is_some_and(|until| now < until)
        });
    }
}

fn refill(bucket: &mut Bucket, limits: ResetLimits, full: u64, now: Instant) {
    let elapsed = now.saturating_duration_since(bucket.refilled_at);
    let earned = elapsed.as_millis() as u64 * u64::from(limits.per_second);
    bucket.milli_tokens = bucket.milli_tokens.saturating_add(earned).min(full);
    bucket.refilled_at = now;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(burst: u32, per_second: u32) -> ClientLimits {
        ClientLimits {
            connections_max: 2,
            body_bytes_max: 100,
            resets: ResetLimits {
                burst,
                per_second,
                penalty: Duration::from_secs(10),
            },
        }
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn connections_are_counted_until_their_permit_drops() {
        let guard = Rc::new(ClientGuard::new(limits(1, 1)));
        let now = Instant::now();
        let first = guard.open_connection(ip(1), now).unwrap();
        let _second = guard.open_connection(ip(2), now).unwrap();
        assert_eq!(
            guard.open_connection(ip(3), now).err(),
            Some(Refusal::Connections)
        );
        drop(first);
        let _third = guard.open_connection(ip(3), now).unwrap();
        assert_eq!(guard.connections(), 2);
    }

    #[test]
    fn body_leases_never_pass_the_bound_and_give_back_on_drop() {
        let guard = ClientGuard::new(limits(1, 1));
        let mut first = guard.lease_body(60).unwrap();
        assert!(guard.lease_body(41).is_none());
        let second = guard.lease_body(40).unwrap();
        assert!(!first.grow_to(61), "over the bound");
        assert_eq!(guard.body_bytes(), 100);
        drop(second);
        assert!(first.grow_to(100));
        assert!(first.grow_to(50), "shrinking asks for nothing");
        drop(first);
        assert_eq!(guard.body_bytes(), 0);
    }

    #[test]
    fn a_source_over_its_resets_is_refused_for_the_penalty_then_forgiven() {
        let guard = Rc::new(ClientGuard::new(limits(3, 1)));
        let now = Instant::now();
        for _ in 0..3 {
            assert!(!guard.stream_reset(ip(1), now));
        }
        assert!(guard.stream_reset(ip(1), now), "the fourth reset at once");
        assert!(
            !guard.stream_reset(ip(2), now),
            "another source is unaffected"
        );
        assert_eq!(
            guard.open_connection(ip(1), now).err(),
            Some(Refusal::Resets)
        );
        let later = now + Duration::from_secs(10);
        assert!(!guard.is_refused(ip(1), later));
        assert!(guard.open_connection(ip(1), later).is_ok());
        // Refilled at one per second over the ten seconds: the burst is back.
        for _ in 0..3 {
            assert!(!guard.stream_reset(ip(1), later));
        }
    }

    #[test]
    fn the_ledger_stays_bounded_and_keeps_refused_sources() {
        let mut ledger = ResetLedger::new(limits(1, 0).resets);
        let now = Instant::now();
        let refused = IpAddr::from([192, 168, 0, 1]);
        ledger.record(refused, now);
        assert!(ledger.record(refused, now));
        for index in 0..(SOURCES_MAX as u32 * 3) {
            ledger.record(IpAddr::from(index.to_be_bytes()), now);
            assert!(ledger.sources.len() <= SOURCES_MAX);
        }
        assert!(ledger.is_refused(refused, now));
    }
}
