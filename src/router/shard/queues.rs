//! The bounded queues between the control core and the shards (tokio `mpsc`, which works across
//! the control core's tokio runtime and the shards' monoio runtimes), what a full queue means for
//! each message, and `hivenet_control_queue_full_total`.
//!
//! Owns: the capacities, the typed [`QueueError`], the shard's sending end [`ToControl`] and the
//! full-queue counts. It must not decide what a message does; only whether it waits, is refused
//! or is dropped when its queue is full:
//!
//! - Waits for room (never dropped): everything that changes what a shard routes or holds —
//!   `Snapshot`, `Keys`, `AdminAccess`, `AgentUp`, `AgentDown`, `Tunnel`, `SecureTunnel`,
//!   `CloseTunnel`, `Drain`, `End`, `ReportDaily` (a daily total handed out is no longer the
//!   shard's to report), the sync core's `TakeUsage`, `ApplyRemote`, `Share`, `DailyTotals` and
//!   `RewriteDaily` — and a shard's `TunnelUp` / `TunnelDown`. Every sender of these can
//!   await (the control core's tasks, its blocking threads with `blocking_send`, a shard's tunnel
//!   task), so a full queue slows the sender instead of growing.
//! - Dropped: `Signal`, an agent's routing signal, superseded by the next one within
//!   `--routing-signal-interval`.
//! - Skipped: a scrape's `Report`: the scrape answers without that shard's per-model series.
//! - Refused: an `/admin/*` call that finds the shard-to-control queue or the admin queue full is
//!   answered `503` with the admin envelope (`{"error": "..."}`), at once.
//!
//! Every one of these is counted in `hivenet_control_queue_full_total{route,message}`, waiting
//! ones included, so a queue that runs full shows even when nothing was lost.
//!
//! Invariant: a queue never grows past its capacity; nothing here allocates per message.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use crate::router::shard::messages::{ControlToShard, ShardToControl};

/// Messages queued to one shard. The shard applies each within microseconds (its inbox task does
/// no I/O), so the queue fills only when the shard's thread stalls; what comes in bursts is a
/// round of routing signals (one per agent every `--routing-signal-interval`) and, at start-up or
/// after a reload, an `AgentUp` per agent and a snapshot per change. 1024 holds a signal round of
/// a thousand agents; full, it is 72 KiB per shard (72-byte messages; tokio allocates the slots
/// in blocks of 32 as they fill, so an idle queue costs little).
pub const CONTROL_TO_SHARD_CAPACITY: usize = 1024;

/// Messages from every shard to the control core (one queue, shared). Bursts: a `TunnelUp` per
/// agent and shard when agents (re)connect, a `TunnelDown` per agent and shard when they leave.
/// 1024 is a hundred agents reconnecting to a ten-shard router at once (80 KiB when full);
/// beyond it the tunnel tasks wait their turn, which only delays those agents' joining.
pub const SHARD_TO_CONTROL_CAPACITY: usize = 1024;

/// Admin calls waiting for the control core, which serves them one at a time. A caller waits at
/// most 10 s for its answer (`api::admin`), and each call may carry a 16 MiB body: more than a
/// handful queued would be answered after their callers gave up, and 16 bounds the bodies held.
pub const ADMIN_QUEUE_CAPACITY: usize = 16;

/// Which queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The control core's queue to one shard (`ControlToShard`).
    ToShard,
    /// The shards' queue to the control core (`ShardToControl`).
    ToControl,
    /// The control core's queue of admin calls waiting for the blocking thread that serves them.
    ToAdmin,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::ToShard => "to_shard",
            Route::ToControl => "to_control",
            Route::ToAdmin => "to_admin",
        }
    }
}

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The queue is at capacity (only for messages that are refused or dropped when full).
    #[error("the {} queue is full", .0.as_str())]
    Full(Route),
    /// The receiving end is gone (the process is stopping).
    #[error("the {} queue is closed", .0.as_str())]
    Closed(Route),
}

/// Every (route, message) pair `hivenet_control_queue_full_total` has a series for; the index
/// of a pair is its counter.
const SERIES: [(Route, &str); 23] = [
    (Route::ToShard, "snapshot"),
    (Route::ToShard, "keys"),
    (Route::ToShard, "admin_access"),
    (Route::ToShard, "agent_up"),
    (Route::ToShard, "agent_down"),
    (Route::ToShard, "signal"),
    (Route::ToShard, "tunnel"),
    (Route::ToShard, "secure_tunnel"),
    (Route::ToShard, "close_tunnel"),
    (Route::ToShard, "drain"),
    (Route::ToShard, "end"),
    (Route::ToShard, "report"),
    (Route::ToShard, "report_daily"),
    (Route::ToShard, "take_usage"),
    (Route::ToShard, "apply_remote"),
    (Route::ToShard, "share"),
    (Route::ToShard, "daily_totals"),
    (Route::ToShard, "rewrite_daily"),
    (Route::ToShard, "credits"),
    (Route::ToControl, "tunnel_up"),
    (Route::ToControl, "tunnel_down"),
    (Route::ToControl, "admin"),
    (Route::ToAdmin, "admin"),
];

fn to_shard_series(message: &ControlToShard) -> usize {
    match message {
        ControlToShard::Snapshot(_) => 0,
        ControlToShard::Keys(_) => 1,
        ControlToShard::AdminAccess(_) => 2,
        ControlToShard::AgentUp { .. } => 3,
        ControlToShard::AgentDown { .. } => 4,
        ControlToShard::Signal { .. } => 5,
        ControlToShard::Tunnel { .. } => 6,
        ControlToShard::SecureTunnel { .. } => 7,
        ControlToShard::CloseTunnel { .. } => 8,
        ControlToShard::Drain => 9,
        ControlToShard::End => 10,
        ControlToShard::Report(_) => 11,
        ControlToShard::ReportDaily(_) => 12,
        ControlToShard::TakeUsage { .. } => 13,
        ControlToShard::ApplyRemote(_) => 14,
        ControlToShard::Share(_) => 15,
        ControlToShard::DailyTotals(_) => 16,
        ControlToShard::RewriteDaily => 17,
        ControlToShard::Credits(_) => 18,
    }
}

fn to_control_series(message: &ShardToControl) -> usize {
    match message {
        ShardToControl::TunnelUp { .. } => 19,
        ShardToControl::TunnelDown { .. } => 20,
        ShardToControl::Admin(_) => 21,
    }
}

const ADMIN_SERIES: usize = 22;

/// What a full `ControlToShard` queue means for `message`: wait for room, or drop it (a routing
/// signal, superseded by the next) and count it.
pub fn waits_when_full(message: &ControlToShard) -> bool {
    !matches!(
        message,
        ControlToShard::Signal { .. } | ControlToShard::Report(_)
    )
}

/// `hivenet_control_queue_full_total`: sends that found their queue full. Shared by the control
/// core and every shard; written only when a queue is full, so the shared cache line costs the
/// request path nothing.
#[derive(Debug, Default)]
pub struct QueueFullCounts {
    counts: [AtomicU64; SERIES.len()],
}

impl QueueFullCounts {
    fn count(&self, series: usize) {
        self.counts[series].fetch_add(1, Ordering::Relaxed);
    }

    /// A `ControlToShard` message found its shard's queue full.
    pub fn to_shard(&self, message: &ControlToShard) {
        self.count(to_shard_series(message));
    }

    /// An admin call found the admin queue full.
    pub fn to_admin(&self) {
        self.count(ADMIN_SERIES);
    }

    /// Every series, for the exposition: (route, message, count).
    pub fn series(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
        SERIES
            .iter()
            .zip(&self.counts)
            .map(|((route, message), count)| {
                (route.as_str(), *message, count.load(Ordering::Relaxed))
            })
    }
}

/// `hivenet_control_queue_full_total{route,message}`, every series from start.
impl crate::router::metrics::Collect for QueueFullCounts {
    fn collect(&self, out: &mut Vec<crate::router::metrics::Family>) {
        let mut family = crate::router::metrics::Family::counter(
            "hivenet_control_queue_full_total",
            "Messages between the control core and the shards that found their bounded queue full (signals dropped, scrape reports skipped, admin calls refused with 503, everything else waited).",
        );
        for (route, message, count) in self.series() {
            family.sample(&[("route", route), ("message", message)], count as f64);
        }
        out.push(family);
    }
}

/// The control core's queue to one shard: sends that wait, drop or skip per
/// [`waits_when_full`], counted in [`QueueFullCounts`].
#[derive(Debug, Clone)]
pub struct ToShard {
    sender: mpsc::Sender<ControlToShard>,
    full: Arc<QueueFullCounts>,
}

impl ToShard {
    pub fn new(sender: mpsc::Sender<ControlToShard>, full: Arc<QueueFullCounts>) -> ToShard {
        ToShard { sender, full }
    }

    /// Queues `message` without waiting; a full queue gives it back with the count taken.
    fn try_send(&self, message: ControlToShard) -> Result<(), (QueueError, ControlToShard)> {
        match self.sender.try_send(message) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(message)) => {
                self.full.to_shard(&message);
                Err((QueueError::Full(Route::ToShard), message))
            }
            Err(TrySendError::Closed(message)) => {
                Err((QueueError::Closed(Route::ToShard), message))
            }
        }
    }

    /// Queues `message`, waiting for room when it must not be lost; a signal or a report that
    /// finds the queue full is given up (`Full`).
    pub async fn send(&self, message: ControlToShard) -> Result<(), QueueError> {
        match self.try_send(message) {
            Ok(()) => Ok(()),
            Err((QueueError::Full(route), message)) => {
                if !waits_when_full(&message) {
                    return Err(QueueError::Full(route));
                }
                self.sender
                    .send(message)
                    .await
                    .map_err(|_| QueueError::Closed(Route::ToShard))
            }
            Err((error, _)) => Err(error),
        }
    }

    /// [`ToShard::send`] for the control core's blocking threads (admin calls, `auth.yaml`
    /// reloads). Must not be called from an async task.
    pub fn send_blocking(&self, message: ControlToShard) -> Result<(), QueueError> {
        match self.try_send(message) {
            Ok(()) => Ok(()),
            Err((QueueError::Full(route), message)) => {
                if !waits_when_full(&message) {
                    return Err(QueueError::Full(route));
                }
                self.sender
                    .blocking_send(message)
                    .map_err(|_| QueueError::Closed(Route::ToShard))
            }
            Err((error, _)) => Err(error),
        }
    }

    /// Queues a scrape's report request without waiting: a full queue skips this shard.
    pub fn try_report(&self, message: ControlToShard) -> Result<(), QueueError> {
        self.try_send(message).map_err(|(error, _)| error)
    }
}

/// A shard's end of the shard-to-control queue.
#[derive(Debug, Clone)]
pub struct ToControl {
    sender: mpsc::Sender<ShardToControl>,
    full: Arc<QueueFullCounts>,
}

impl ToControl {
    pub fn new(sender: mpsc::Sender<ShardToControl>, full: Arc<QueueFullCounts>) -> ToControl {
        ToControl { sender, full }
    }

    /// Queues a message that must not be lost (`TunnelUp`, `TunnelDown`), waiting for room.
    pub async fn send(&self, message: ShardToControl) -> Result<(), QueueError> {
        match self.sender.try_send(message) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(message)) => {
                self.full.count(to_control_series(&message));
                self.sender
                    .send(message)
                    .await
                    .map_err(|_| QueueError::Closed(Route::ToControl))
            }
            Err(TrySendError::Closed(_)) => Err(QueueError::Closed(Route::ToControl)),
        }
    }

    /// Queues an admin call, refused at once (`Full`) when the queue is full: its client gets
    /// `503` rather than waiting behind a stalled control core.
    pub fn try_send(&self, message: ShardToControl) -> Result<(), QueueError> {
        match self.sender.try_send(message) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(message)) => {
                self.full.count(to_control_series(&message));
                Err(QueueError::Full(Route::ToControl))
            }
            Err(TrySendError::Closed(_)) => Err(QueueError::Closed(Route::ToControl)),
        }
    }
}

/// The control core's ends of the queues to the shards (index: shard), and the counts they and
/// the shards keep.
pub struct ToShards {
    pub shards: Vec<ToShard>,
    pub full: Arc<QueueFullCounts>,
}

/// The queues of a router with `shard_count` shards: the control core's ends (one [`ToShard`]
/// per shard, the receiver of the shards' messages) and each shard's (its inbox, a
/// [`ToControl`]), all counting into `full`.
pub struct Queues {
    pub to_shards: ToShards,
    pub from_shards: mpsc::Receiver<ShardToControl>,
    pub inboxes: Vec<mpsc::Receiver<ControlToShard>>,
    pub to_control: ToControl,
}

impl Queues {
    pub fn new(shard_count: usize, full: &Arc<QueueFullCounts>) -> Queues {
        Queues::with_capacities(
            shard_count,
            full,
            CONTROL_TO_SHARD_CAPACITY,
            SHARD_TO_CONTROL_CAPACITY,
        )
    }

    /// [`Queues::new`] with other capacities (tests fill small ones).
    pub fn with_capacities(
        shard_count: usize,
        full: &Arc<QueueFullCounts>,
        to_shard_capacity: usize,
        to_control_capacity: usize,
    ) -> Queues {
        let (sender, from_shards) = mpsc::channel(to_control_capacity);
        let mut to_shards = Vec::with_capacity(shard_count);
        let mut inboxes = Vec::with_capacity(shard_count);
        for _ in 0..shard_count {
            let (sender, receiver) = mpsc::channel(to_shard_capacity);
            to_shards.push(ToShard::new(sender, full.clone()));
            inboxes.push(receiver);
        }
        Queues {
            to_shards: ToShards {
                shards: to_shards,
                full: full.clone(),
            },
            from_shards,
            inboxes,
            to_control: ToControl::new(sender, full.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::routing::AgentId;
    use std::time::Duration;

    fn count(full: &QueueFullCounts, route: &str, message: &str) -> u64 {
        full.series()
            .find(|(r, m, _)| *r == route && *m == message)
            .map(|(_, _, count)| count)
            .unwrap_or_else(|| panic!("no series {route}/{message}"))
    }

    fn snapshot() -> ControlToShard {
        ControlToShard::Snapshot(crate::logic::snapshot::RoutingSnapshot::empty())
    }

    fn signal() -> ControlToShard {
        ControlToShard::Signal {
            agent: AgentId(1),
            models: Arc::from([]),
            in_flight: 0,
            engine: Default::default(),
        }
    }

    fn kind(message: &ControlToShard) -> usize {
        to_shard_series(message)
    }

    /// Lets the spawned tasks of a current-thread runtime run until they block.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_full_shard_queue_waits_for_what_must_arrive_and_drops_or_skips_the_rest() {
        let full = Arc::new(QueueFullCounts::default());
        let Queues {
            to_shards,
            mut inboxes,
            ..
        } = Queues::with_capacities(1, &full, 2, 2);
        let to_shard = to_shards.shards[0].clone();
        to_shard.send(snapshot()).await.unwrap();
        to_shard.send(snapshot()).await.unwrap();
        // A routing signal is dropped, a scrape's report skipped: both counted, neither waits.
        assert_eq!(
            to_shard.send(signal()).await,
            Err(QueueError::Full(Route::ToShard))
        );
        let (reply, _answer) = tokio::sync::oneshot::channel();
        assert_eq!(
            to_shard.try_report(ControlToShard::Report(reply)),
            Err(QueueError::Full(Route::ToShard))
        );
        assert_eq!(count(&full, "to_shard", "signal"), 1);
        assert_eq!(count(&full, "to_shard", "report"), 1);
        // An agent leaving waits for room, counted once, and arrives after what was queued.
        let waiting = tokio::spawn({
            let to_shard = to_shard.clone();
            async move {
                let down = ControlToShard::AgentDown {
                    agent: AgentId(7),
                    models: Arc::from([]),
                };
                to_shard.send(down).await
            }
        });
        settle().await;
        assert!(
            !waiting.is_finished(),
            "a full queue must make AgentDown wait"
        );
        assert_eq!(count(&full, "to_shard", "agent_down"), 1);
        let inbox = &mut inboxes[0];
        assert_eq!(kind(&inbox.recv().await.unwrap()), 0);
        assert_eq!(waiting.await.unwrap(), Ok(()));
        assert_eq!(kind(&inbox.recv().await.unwrap()), 0);
        assert!(matches!(
            inbox.recv().await.unwrap(),
            ControlToShard::AgentDown {
                agent: AgentId(7),
                ..
            }
        ));
        assert!(
            inbox.try_recv().is_err(),
            "the queue never held more than 2"
        );
        // The shard is gone: closed, not full, and not counted.
        drop(inboxes);
        assert_eq!(
            to_shard.send(snapshot()).await,
            Err(QueueError::Closed(Route::ToShard))
        );
        assert_eq!(count(&full, "to_shard", "snapshot"), 0);
    }

    #[test]
    fn a_blocking_thread_waits_for_room_in_a_full_shard_queue() {
        let full = Arc::new(QueueFullCounts::default());
        let Queues {
            to_shards,
            mut inboxes,
            ..
        } = Queues::with_capacities(1, &full, 1, 1);
        let to_shard = to_shards.shards[0].clone();
        to_shard.send_blocking(snapshot()).unwrap();
        let (sent_tx, sent) = std::sync::mpsc::channel();
        let sender = std::thread::spawn(move || {
            let keys =
                ControlToShard::Keys(Arc::new(crate::logic::auth::keys::KeyRegistry::open()));
            let result = to_shard.send_blocking(keys);
            sent_tx.send(()).unwrap();
            result
        });
        assert!(
            sent.recv_timeout(Duration::from_millis(200)).is_err(),
            "Keys must wait while the queue is full"
        );
        assert_eq!(count(&full, "to_shard", "keys"), 1);
        assert_eq!(kind(&inboxes[0].blocking_recv().unwrap()), 0);
        assert_eq!(sender.join().unwrap(), Ok(()));
        assert_eq!(kind(&inboxes[0].blocking_recv().unwrap()), 1);
    }

    #[tokio::test]
    async fn a_full_control_queue_refuses_admin_calls_and_makes_tunnel_news_wait() {
        let full = Arc::new(QueueFullCounts::default());
        let Queues {
            mut from_shards,
            to_control,
            ..
        } = Queues::with_capacities(1, &full, 1, 1);
        let up = |agent| ShardToControl::TunnelUp {
            agent: AgentId(agent),
            shard: 0,
        };
        to_control.send(up(1)).await.unwrap();
        let (reply, _answer) = tokio::sync::oneshot::channel();
        let call = ShardToControl::Admin(crate::router::shard::messages::AdminCall {
            method: crate::wire::http::request::Method::Get,
            target: bytes::Bytes::from_static(b"/admin/api-keys"),
            body: bytes::Bytes::new(),
            reply,
        });
        assert_eq!(
            to_control.try_send(call),
            Err(QueueError::Full(Route::ToControl))
        );
        assert_eq!(count(&full, "to_control", "admin"), 1);
        let waiting = tokio::spawn({
            let to_control = to_control.clone();
            async move {
                to_control
                    .send(ShardToControl::TunnelDown {
                        agent: AgentId(1),
                        shard: 0,
                    })
                    .await
            }
        });
        settle().await;
        assert!(
            !waiting.is_finished(),
            "TunnelDown must wait, not be dropped"
        );
        assert_eq!(count(&full, "to_control", "tunnel_down"), 1);
        assert!(matches!(
            from_shards.recv().await.unwrap(),
            ShardToControl::TunnelUp { .. }
        ));
        assert_eq!(waiting.await.unwrap(), Ok(()));
        assert!(matches!(
            from_shards.recv().await.unwrap(),
            ShardToControl::TunnelDown { .. }
        ));
    }

    #[test]
    fn every_series_is_exposed_from_start() {
        let full = QueueFullCounts::default();
        full.to_admin();
        let mut families = Vec::new();
        crate::router::metrics::Collect::collect(&full, &mut families);
        let out = crate::router::metrics::encode(families);
        let samples: Vec<&str> = out.lines().filter(|line| !line.starts_with('#')).collect();
        assert_eq!(samples.len(), SERIES.len());
        assert!(samples.contains(
            &"hivenet_control_queue_full_total{route=\"to_shard\",message=\"signal\"} 0"
        ));
        assert!(
            samples.contains(
                &"hivenet_control_queue_full_total{route=\"to_admin\",message=\"admin\"} 1"
            )
        );
    }
}
