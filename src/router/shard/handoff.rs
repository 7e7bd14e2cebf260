//! Handing a client connection to the shard that owns its key.
//!
//! A request whose key has limits visits the key's owner twice or three times (`Visit::Quota` at
//! admission, `Visit::Settle` before a buffered answer, or the release notice of a stream): with
//! the owner on another shard, each is a message, an answer and usually a wake-up
//! (`perf/notes/2026-12-06-shard-scaling.md`: a remote key costs a JSON request 1.22x the
//! instructions of a local one). An SDK client sends every request of a keep-alive connection
//! with the same key, so the shard that accepts a connection reads its first request's head and,
//! when the key is limited and owned elsewhere, gives the connection itself to the owner: the
//! socket and the bytes read so far, over the mesh, before anything of the request has run. The
//! owner serves it from the first request on, and every request with that key is local to it.
//!
//! Only the first request decides: a connection whose later requests use other keys stays where
//! it went (each of those visits its owner as before). A connection moves at most once.
//!
//! Load: keys do not spread evenly when one tenant is most of the traffic. A shard gives a
//! connection away only while the owner holds no more than [`SLACK`] connections (or a sixteenth)
//! more than the giver would keep ([`worth_moving`]), counting on each shard its open
//! connections, those on their way to it and those waiting in its listener's accept queue
//! ([`Loads`]); past that it serves the connection itself, with the visits. So a hot key costs at
//! most that imbalance, never one core doing every request.
//!
//! On by default with several shards; `--connection-handoff off`
//! (`HIVENET_ROUTER_CONNECTION_HANDOFF=off`) turns it off. Measured with it off and on: a key per
//! connection 1.10x-1.16x the requests/s; one key on every connection level within noise
//! (`perf/notes/2026-12-07-connection-handoff.md`, "The default").

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicI64, Ordering};

use bytes::BytesMut;

/// A client connection on its way to another shard: the socket, out of the giver's runtime, and
/// what was read of it (the first request's head at least). Boxed in the message: the mesh's
/// messages stay the size of a visit.
#[derive(Debug)]
pub struct Handoff {
    pub socket: std::net::TcpStream,
    pub read: BytesMut,
    pub peer: Option<std::net::IpAddr>,
}

/// How many connections an owner may hold beyond what the giver keeps before the giver stops
/// handing it more (the larger of this and a sixteenth of the giver's).
pub const SLACK: i64 = 2;

/// How many client connections each shard serves or is about to: its open ones, and those
/// another shard gave it that it has not taken yet. Read to keep a hot key from piling every
/// connection onto its owner. Its own counters, not `hivenet_shard_connections_open`: a burst of
/// connections (a client opening 64 at once) is given away before the owner takes any, and
/// counts that left out the ones in transit let one shard give it nearly all of them (measured:
/// 56 of 64 connections on one shard, its throughput 0.84x). Present when connections may move.
#[derive(Debug, Clone)]
pub struct Loads {
    shards: Arc<[Load]>,
    /// Each shard's listening socket, -1 when it has none (not bound yet, or draining): the
    /// connections the kernel queued for a shard that has not accepted them yet count on it too
    /// ([`queued`]). Without them a burst of connections was given to an owner whose own share
    /// of the burst still sat in its accept queue (measured: 13 of 64 moved where about 2 would
    /// keep the slack, and 0.93x the throughput).
    listeners: Arc<[AtomicI32]>,
}

/// One shard's count, on a cache line of its own: its shard writes it for every connection it
/// opens or closes, the others only when they give it one.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Load(AtomicI64);

impl Loads {
    /// `None` with fewer than two shards: there is nowhere to move to.
    pub fn new(shards: usize) -> Option<Loads> {
        (shards > 1).then(|| Loads {
            shards: (0..shards).map(|_| Load::default()).collect(),
            listeners: (0..shards).map(|_| AtomicI32::new(-1)).collect(),
        })
    }

    /// `shard` listens on `fd` from now on; `None` before it closes its listener.
    pub fn listening(&self, shard: usize, fd: Option<std::os::fd::RawFd>) {
        if let Some(listener) = self.listeners.get(shard) {
            listener.store(fd.unwrap_or(-1), Ordering::Relaxed);
        }
    }

    /// How many connections `shard` serves, counting those on their way to it and those queued
    /// on its listener.
    fn load(&self, shard: usize) -> i64 {
        let fd = self
            .listeners
            .get(shard)
            .map_or(-1, |listener| listener.load(Ordering::Relaxed));
        self.of(shard).saturating_add(queued(fd))
    }

    /// A connection opened on `shard`, or closed there (`-1`).
    pub fn add(&self, shard: usize, connections: i64) {
        if let Some(load) = self.shards.get(shard) {
            load.0.fetch_add(connections, Ordering::Relaxed);
        }
    }

    fn of(&self, shard: usize) -> i64 {
        self.shards
            .get(shard)
            .map_or(i64::MAX, |load| load.0.load(Ordering::Relaxed))
    }

    /// May `giver` hand one of its connections to `owner`? (One relaxed load each: two shards
    /// deciding at once may each move one more than the rule allows, never lose one.)
    pub fn may_move(&self, giver: usize, owner: usize) -> bool {
        worth_moving(self.load(giver), self.load(owner))
    }
}

/// The connections the kernel has queued on the listening socket `fd` and nobody accepted yet
/// (`tcpi_unacked` of a listening socket is its accept queue's length); 0 without one. One
/// system call, once a connection. The number is read without owning the socket: a listener
/// closed meanwhile (a draining shard) and its number reused gives another socket's count or an
/// error, which moves one connection more or less, nothing else.
fn queued(fd: std::os::fd::RawFd) -> i64 {
    /// `TCP_LISTEN` of the kernel's socket states (`include/net/tcp_states.h`).
    const TCP_LISTEN: u8 = 10;
    if fd < 0 {
        return 0;
    }
    // SAFETY: `tcp_info` is plain data (integers), so all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut length = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `length` are valid for writes of `length` bytes for the duration of
    // the call; a bad or reused descriptor only makes the call fail or read another socket.
    let read = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut length,
        )
    };
    if read == 0 && info.tcpi_state == TCP_LISTEN {
        i64::from(info.tcpi_unacked)
    } else {
        0
    }
}

/// Whether a connection counted in `giver_open` should move to a shard holding `owner_open`:
/// after the move the owner may hold at most [`SLACK`] (or a sixteenth of the giver's) more than
/// the giver.
pub fn worth_moving(giver_open: i64, owner_open: i64) -> bool {
    let giver_after = giver_open.saturating_sub(1);
    let owner_after = owner_open.saturating_add(1);
    owner_after <= giver_after.saturating_add(SLACK.max(giver_after / 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_owner_takes_the_connection() {
        assert!(worth_moving(1, 0));
        assert!(worth_moving(40, 10));
        assert!(worth_moving(40, 38));
    }

    #[test]
    fn a_busy_owner_is_left_alone_past_the_slack() {
        // After the move: giver 0, owner 2 (the slack) ... 3.
        assert!(worth_moving(1, 1));
        assert!(!worth_moving(1, 2));
        // After the move: giver 799, a sixteenth of it 49; owner 848 ... 849.
        assert!(worth_moving(800, 847));
        assert!(!worth_moving(800, 848));
    }

    #[test]
    fn one_hot_key_keeps_the_shards_within_the_slack() {
        // 2 shards, the kernel's accepts alternate, every connection's key owned by shard 0:
        // shard 1 gives what it accepts away until the owner holds the slack more.
        let mut open = [0i64, 0];
        for accepted in 0..1_000 {
            let front = accepted % 2;
            open[front] += 1;
            if front == 1 && worth_moving(open[1], open[0]) {
                open[1] -= 1;
                open[0] += 1;
            }
        }
        assert_eq!(open[0] + open[1], 1_000);
        let gap = open[0] - open[1];
        assert!((0..=SLACK.max(open[1] / 16) + 1).contains(&gap), "{open:?}");
        assert!(open[1] > 400, "{open:?}");
    }

    #[test]
    fn a_shard_that_is_not_there_takes_nothing() {
        let loads = Loads::new(2).unwrap();
        loads.add(0, 1);
        assert!(loads.may_move(0, 1));
        assert!(!loads.may_move(0, 7));
        assert!(Loads::new(1).is_none());
    }

    #[test]
    fn connections_waiting_in_a_listeners_queue_count_on_its_shard() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let loads = Loads::new(2).unwrap();
        loads.listening(1, Some(listener.as_raw_fd()));
        assert_eq!(loads.load(1), 0);
        // Connected by the kernel, not accepted by anyone yet.
        let _waiting: Vec<_> = (0..3)
            .map(|_| std::net::TcpStream::connect(address).unwrap())
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while loads.load(1) < 3 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(loads.load(1), 3);
        assert_eq!(loads.load(0), 0);
        // A closed listener counts nothing.
        loads.listening(1, None);
        assert_eq!(loads.load(1), 0);
        assert_eq!(queued(-1), 0);
    }

    #[test]
    fn a_burst_given_away_before_the_owner_takes_any_stops_at_the_slack() {
        // 32 connections open on shard 0 at once, every key owned by shard 1, which has taken
        // none of them yet: the ones in transit count on it.
        let loads = Loads::new(2).unwrap();
        loads.add(0, 32);
        let mut given = 0;
        for _ in 0..32 {
            if loads.may_move(0, 1) {
                loads.add(1, 1);
                loads.add(0, -1);
                given += 1;
            }
        }
        assert_eq!((loads.of(0), loads.of(1)), (32 - given, given));
        assert!(loads.of(1) - loads.of(0) <= SLACK, "{given}");
        assert!(given >= 16, "{given}");
    }
}
