//! Spans as this process records them: started on a request's arrival ([`StartedSpan`]),
//! finished into a fixed-shape [`SpanRecord`] and handed, without a lock, to the exporter.
//!
//! Two ways to hand records over, one per process shape:
//! - the router's shards each own a [`SpanRing`], a bounded single-producer ring (`rtrb`) that
//!   the exporter on the control core drains, the audit log's pattern: no lock, no system call,
//!   no wait on the request path;
//! - the agent's tasks share a [`SpanQueue`] (a bounded `tokio` channel), since any of its
//!   runtime's threads may finish a request.
//!
//! Both are bounded ([`RING_SPANS`]): a full one drops the record and counts it in `dropped`,
//! which the exporter reports; the request never waits for tracing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;

use super::context::TraceContext;
use super::sampler::Sampler;

/// Finished spans one shard (or the agent) may have waiting for the exporter. At the default
/// export interval (5 s) this is ~1,600 requests per second per shard before any is dropped;
/// `OTEL_BSP_SCHEDULE_DELAY` shortens the interval for more.
pub const RING_SPANS: usize = 8192;

/// What a span stands for (OpenTelemetry's span kinds this process records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request this process served.
    Server,
    /// A call this process made for one: the agent's to its engine.
    Client,
}

/// A span of this process in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartedSpan {
    /// This span's place in its trace: its own span id, the trace it belongs to.
    pub context: TraceContext,
    /// The span it continues: the caller's (`traceparent`) for a server span, when there was a
    /// valid one; this process's server span for a client span.
    pub parent: Option<[u8; 8]>,
    pub started: SystemTime,
    pub kind: Kind,
}

impl StartedSpan {
    /// Continues the trace of `incoming` (a `traceparent` value) as a child of its span, or
    /// starts a new trace when there is none or it is invalid; `sampler` decides whether the
    /// span is recorded (its context's `sampled` flag).
    pub fn start(incoming: Option<&[u8]>, sampler: Sampler) -> StartedSpan {
        let started = SystemTime::now();
        let (mut context, parent) = match incoming.and_then(TraceContext::parse) {
            Some(parent) => (parent.child(), Some(parent)),
            None => (TraceContext::new_root(), None),
        };
        let sampled = sampler.samples(parent.map(|parent| parent.is_sampled()), &context.trace_id);
        context.set_sampled(sampled);
        StartedSpan {
            context,
            parent: parent.map(|parent| parent.span_id),
            started,
            kind: Kind::Server,
        }
    }

    /// A client span under this one, starting now: the call this process makes for the request
    /// (same trace and `sampled` flag, its own span id).
    pub fn client(&self) -> StartedSpan {
        StartedSpan {
            context: self.context.child(),
            parent: Some(self.context.span_id),
            started: SystemTime::now(),
            kind: Kind::Client,
        }
    }

    /// The span ends now with what the request came to.
    pub fn finish(&self, name: &'static str, outcome: SpanOutcome) -> SpanRecord {
        SpanRecord {
            context: self.context,
            parent: self.parent,
            kind: self.kind,
            name,
            start: self.started,
            end: SystemTime::now(),
            outcome,
        }
    }
}

/// What a request span reports besides its timing (OpenTelemetry HTTP semantic conventions
/// where they have a name for it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpanOutcome {
    /// `http.response.status_code`; 0 when no response was written.
    pub status: u16,
    /// `hivenet.request_id`: the request's `X-Request-ID`.
    pub request_id: Option<[u8; 36]>,
    /// `gen_ai.request.model`: the model the client asked for.
    pub model: Option<Bytes>,
    /// `error.type`: the router's or agent's error code.
    pub error_code: Option<&'static str>,
}

/// One finished server span, as it waits for the exporter. Fixed shape: a record costs one
/// copy into a ring slot, and only the exporter builds the SDK's `SpanData` from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanRecord {
    pub context: TraceContext,
    pub parent: Option<[u8; 8]>,
    pub kind: Kind,
    /// `{method} {route}`, e.g. `POST /v1/chat/completions` (`telemetry::span_name`).
    pub name: &'static str,
    pub start: SystemTime,
    pub end: SystemTime,
    pub outcome: SpanOutcome,
}

/// A shard's end of the span export: single producer, never blocks.
pub struct SpanRing {
    ring: rtrb::Producer<SpanRecord>,
    dropped: Arc<AtomicU64>,
    sampler: Sampler,
}

impl SpanRing {
    /// `shards` rings of [`RING_SPANS`] each: the producers for the shards, the consumers for
    /// the exporter, and the count of records dropped because a ring was full.
    pub fn build(
        shards: usize,
        sampler: Sampler,
    ) -> (
        Vec<SpanRing>,
        Vec<rtrb::Consumer<SpanRecord>>,
        Arc<AtomicU64>,
    ) {
        let dropped = Arc::new(AtomicU64::new(0));
        let (rings, consumers) = (0..shards)
            .map(|_| {
                let (producer, consumer) = rtrb::RingBuffer::new(RING_SPANS);
                let ring = SpanRing {
                    ring: producer,
                    dropped: dropped.clone(),
                    sampler,
                };
                (ring, consumer)
            })
            .unzip();
        (rings, consumers, dropped)
    }

    /// The sampler the shard starts its spans with.
    pub fn sampler(&self) -> Sampler {
        self.sampler
    }

    /// Hands `record` to the exporter when its trace is sampled; drops and counts it when the
    /// ring is full.
    pub fn push(&mut self, record: SpanRecord) {
        if !record.context.is_sampled() {
            return;
        }
        if self.ring.push(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The agent's end of the span export: any task may push, never blocks.
#[derive(Clone)]
pub struct SpanQueue {
    queue: tokio::sync::mpsc::Sender<SpanRecord>,
    dropped: Arc<AtomicU64>,
    sampler: Sampler,
}

impl SpanQueue {
    /// A queue of [`RING_SPANS`]: the sender for the tasks, the receiver for the exporter.
    pub fn build(
        sampler: Sampler,
    ) -> (
        SpanQueue,
        tokio::sync::mpsc::Receiver<SpanRecord>,
        Arc<AtomicU64>,
    ) {
        let (queue, receiver) = tokio::sync::mpsc::channel(RING_SPANS);
        let dropped = Arc::new(AtomicU64::new(0));
        let sender = SpanQueue {
            queue,
            dropped: dropped.clone(),
            sampler,
        };
        (sender, receiver, dropped)
    }

    /// The sampler the agent starts its spans with.
    pub fn sampler(&self) -> Sampler {
        self.sampler
    }

    /// As [`SpanRing::push`].
    pub fn push(&self, record: SpanRecord) {
        if !record.context.is_sampled() {
            return;
        }
        if self.queue.try_send(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_parent_is_continued_and_an_invalid_one_starts_a_new_trace() {
        let continued = StartedSpan::start(Some(PARENT), Sampler::default());
        assert_eq!(
            &continued.context.trace_id_hex()[..],
            b"4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(continued.parent, Some(0x00f067aa0ba902b7u64.to_be_bytes()));
        assert_ne!(continued.context.span_id, continued.parent.unwrap());

        let fresh = StartedSpan::start(Some(b"00-bad"), Sampler::default());
        assert_eq!(fresh.parent, None);
        assert!(fresh.context.is_sampled());
        assert_ne!(fresh.context.trace_id, continued.context.trace_id);
        assert_eq!(StartedSpan::start(None, Sampler::default()).parent, None);
    }

    #[test]
    fn a_full_ring_drops_and_counts_and_unsampled_spans_are_not_kept() {
        let (mut rings, mut consumers, dropped) = SpanRing::build(1, Sampler::default());
        let span = StartedSpan::start(None, Sampler::default());
        for _ in 0..RING_SPANS + 3 {
            rings[0].push(span.finish("POST /v1/chat/completions", SpanOutcome::default()));
        }
        assert_eq!(consumers[0].slots(), RING_SPANS);
        assert_eq!(dropped.load(Ordering::Relaxed), 3);

        let unsampled = StartedSpan::start(
            Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
            Sampler::default(),
        );
        while consumers[0].pop().is_ok() {}
        rings[0].push(unsampled.finish("POST /v1/chat/completions", SpanOutcome::default()));
        assert_eq!(consumers[0].slots(), 0);
    }

    /// The sampler decides the span's flag, and so what goes on in `traceparent`: a ratio of 0
    /// at the root records nothing and tells the agent so; parent-based follows the caller.
    #[test]
    fn the_sampler_sets_the_flag_that_goes_on() {
        let never = Sampler::parse("parentbased_traceidratio", Some("0")).unwrap();
        let root = StartedSpan::start(None, never);
        assert!(!root.context.is_sampled());
        assert!(root.context.traceparent().ends_with(b"-00"));
        let continued = StartedSpan::start(Some(PARENT), never);
        assert!(continued.context.is_sampled());
        let always = Sampler::parse("always_on", None).unwrap();
        let unsampled_parent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(
            StartedSpan::start(Some(unsampled_parent), always)
                .context
                .is_sampled()
        );
    }
}
