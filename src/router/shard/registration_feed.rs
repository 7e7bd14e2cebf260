//! The change feed behind `GET /admin/registration-stream`: every agent joining or leaving the
//! routing pool, rendered once as an SSE `data:` frame and offered to every subscriber.
//!
//! Owns the subscriber count and the frame format; it does not hold connections (the shard that
//! serves the request writes the frames and the keepalive comments) and never blocks a publisher:
//! each subscriber reads through a bounded buffer ([`BUFFER_EVENTS`], a `tokio::sync::broadcast`
//! ring), and one that falls behind misses the oldest events instead of slowing registration.
//!
//! Invariants: at most [`SUBSCRIBERS_MAX`] subscriptions are open (a further one is refused, the
//! caller answers `503`); a [`Subscription`] gives its place back when dropped, however the
//! stream ends.
//!
//! Better than the reference, which drops a slow subscriber's events silently: a subscriber that
//! missed events is told how many in an SSE comment (`: missed N events, resync from
//! /admin/routing-table`), so a scheduler knows when to re-read the routing table.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use serde::Serialize;
use tokio::sync::broadcast;

/// An agent joining (`registered`) or leaving (`unregistered`) the routing pool, as the
/// registration stream publishes it (the caller stamps the wall-clock time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub joined: bool,
    pub peer_id: String,
    pub deployment_id: String,
    pub replica_id: String,
}

/// Events buffered for each subscriber before the oldest are dropped for it.
pub const BUFFER_EVENTS: usize = 256;

/// Open registration streams at most, over the whole router.
pub const SUBSCRIBERS_MAX: usize = 64;

/// Who publishes registration changes and who listens.
pub struct RegistrationFeed {
    sender: broadcast::Sender<Bytes>,
    subscribers: Arc<AtomicUsize>,
}

/// The feed is full: [`SUBSCRIBERS_MAX`] streams are open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManySubscribers;

/// One subscriber's end of the feed; dropping it gives its place back.
#[derive(Debug)]
pub struct Subscription {
    pub frames: broadcast::Receiver<Bytes>,
    subscribers: Arc<AtomicUsize>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Default for RegistrationFeed {
    fn default() -> RegistrationFeed {
        RegistrationFeed {
            sender: broadcast::channel(BUFFER_EVENTS).0,
            subscribers: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl RegistrationFeed {
    /// A new subscription, seeing the events published after it was made.
    pub fn subscribe(&self) -> Result<Subscription, TooManySubscribers> {
        let taken = self
            .subscribers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < SUBSCRIBERS_MAX).then_some(open + 1)
            });
        match taken {
            Ok(_) => Ok(Subscription {
                frames: self.sender.subscribe(),
                subscribers: self.subscribers.clone(),
            }),
            Err(_) => Err(TooManySubscribers),
        }
    }

    /// Offers `change`, which happened at `timestamp` (RFC 3339), to every subscriber; with none,
    /// it is dropped.
    pub fn publish(&self, change: &Membership, timestamp: &str) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let _ = self.sender.send(frame(change, timestamp));
    }
}

#[derive(Serialize)]
struct Entry<'a> {
    event_type: &'static str,
    deployment_id: &'a str,
    replica_id: &'a str,
    agent_id: &'a str,
    timestamp: &'a str,
}

/// One SSE frame: `data: {json}` and the blank line that ends the event. The JSON is one line
/// (serde_json escapes newlines inside strings), so one `data:` field carries it.
pub fn frame(change: &Membership, timestamp: &str) -> Bytes {
    let entry = Entry {
        event_type: if change.joined {
            "registered"
        } else {
            "unregistered"
        },
        deployment_id: &change.deployment_id,
        replica_id: &change.replica_id,
        agent_id: &change.peer_id,
        timestamp,
    };
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, &entry).expect("a registration entry serializes");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(joined: bool) -> Membership {
        Membership {
            joined,
            peer_id: "12D3Koo".into(),
            deployment_id: "deploy-42".into(),
            replica_id: "replica\n3".into(),
        }
    }

    #[test]
    fn a_frame_is_one_data_line_with_the_documented_fields() {
        let frame = frame(&change(true), "2026-08-11T09:30:00Z");
        let text = std::str::from_utf8(&frame).unwrap();
        assert!(text.ends_with("\n\n"), "{text:?}");
        let line = text.strip_prefix("data: ").unwrap().trim_end();
        assert!(!line.contains('\n'), "one line: {line:?}");
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "event_type": "registered",
                "deployment_id": "deploy-42",
                "replica_id": "replica\n3",
                "agent_id": "12D3Koo",
                "timestamp": "2026-08-11T09:30:00Z",
            })
        );
        let left = super::frame(&change(false), "t");
        assert!(
            std::str::from_utf8(&left)
                .unwrap()
                .contains("\"unregistered\"")
        );
    }

    #[test]
    fn subscribers_are_bounded_and_give_their_place_back() {
        let feed = RegistrationFeed::default();
        let open: Vec<_> = (0..SUBSCRIBERS_MAX)
            .map(|_| feed.subscribe().expect("room"))
            .collect();
        assert_eq!(feed.subscribe().unwrap_err(), TooManySubscribers);
        drop(open);
        assert!(feed.subscribe().is_ok());
    }

    #[test]
    fn a_slow_subscriber_misses_the_oldest_events_and_the_publisher_never_waits() {
        let feed = RegistrationFeed::default();
        let mut subscription = feed.subscribe().unwrap();
        for _ in 0..BUFFER_EVENTS + 3 {
            feed.publish(&change(true), "t");
        }
        assert_eq!(
            subscription.frames.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(3))
        );
        assert!(subscription.frames.try_recv().is_ok());
    }
}
