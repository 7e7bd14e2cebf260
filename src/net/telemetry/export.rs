//! The exporter: a task on a `tokio` runtime off the request path (the router's control core,
//! the agent's runtime) that drains finished spans every export interval and sends them to the
//! OTLP gRPC endpoint through `opentelemetry-otlp`'s `SpanExporter`, [`BATCH_SPANS_MAX`] at a
//! time.
//!
//! Error handling: a failed export (collector down, timeout) loses that batch and is logged
//! once per failure streak; spans keep being drained so nothing grows. Records the producers
//! dropped (full ring or queue) are logged when their count grows.
//!
//! Performance: the SDK's `SpanData` (attributes as owned strings) is built here, off the
//! shards; the producers only copied a fixed-shape [`SpanRecord`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};

use super::TracingSettings;
use super::span::{Kind, SpanRecord};

/// Spans sent in one export request (the SDK batch processor's default,
/// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
pub const BATCH_SPANS_MAX: usize = 512;

/// Where the exporter drains finished spans from.
pub enum SpanSource {
    /// The router: one ring per shard.
    Rings(Vec<rtrb::Consumer<SpanRecord>>),
    /// The agent: one queue every task pushes to.
    Queue(tokio::sync::mpsc::Receiver<SpanRecord>),
}

impl SpanSource {
    /// Moves waiting records into `batch` until it holds `max`.
    fn drain_into(&mut self, batch: &mut Vec<SpanRecord>, max: usize) {
        match self {
            SpanSource::Rings(rings) => {
                for ring in rings {
                    while batch.len() < max {
                        match ring.pop() {
                            Ok(record) => batch.push(record),
                            Err(_) => break,
                        }
                    }
                }
            }
            SpanSource::Queue(queue) => {
                while batch.len() < max {
                    match queue.try_recv() {
                        Ok(record) => batch.push(record),
                        Err(_) => break,
                    }
                }
            }
        }
    }
}

/// The running export task; [`SpanExport::finish`] exports what is still waiting and stops it.
pub struct SpanExport {
    stop: tokio::sync::oneshot::Sender<tokio::sync::oneshot::Sender<()>>,
}

impl SpanExport {
    /// Exports every span still waiting (at SIGTERM, once the requests have drained) and stops
    /// the task. False when that did not finish within `timeout` (a collector that does not
    /// answer: the export's own timeout is longer) or the task is gone.
    pub async fn finish(self, timeout: Duration) -> bool {
        let (done, finished) = tokio::sync::oneshot::channel();
        if self.stop.send(done).is_err() {
            return false;
        }
        matches!(tokio::time::timeout(timeout, finished).await, Ok(Ok(())))
    }
}

/// Builds the OTLP exporter and starts the export task on the current `tokio` runtime (the
/// gRPC channel connects lazily, on the first export). The spans' resource names the service,
/// its version and this process (`instance_id`: its peer ID). Errors only on an endpoint that
/// is not a URI.
pub fn spawn(
    settings: &TracingSettings,
    service_name: &'static str,
    instance_id: &str,
    source: SpanSource,
    dropped: Arc<AtomicU64>,
) -> Result<SpanExport, opentelemetry_otlp::ExporterBuildError> {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(settings.endpoint.clone());
    if settings.endpoint.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_webpki_roots();
        if let Some(pem) = &settings.certificate {
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        builder = builder.with_tls_config(tls);
    }
    let mut exporter = builder.build()?;
    exporter.set_resource(&resource(service_name, instance_id));
    let scope = InstrumentationScope::builder(service_name)
        .with_version(env!("CARGO_PKG_VERSION"))
        .build();
    let interval = settings.export_interval;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(export_loop(
        Exporting {
            exporter,
            source,
            scope,
            dropped,
            failing: false,
            dropped_reported: 0,
        },
        interval,
        stopped,
    ));
    Ok(SpanExport { stop })
}

/// The attributes a collector groups spans by: `service.name`, `service.version`,
/// `service.instance.id`.
pub fn resource(service_name: &'static str, instance_id: &str) -> Resource {
    Resource::builder_empty()
        .with_service_name(service_name)
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", instance_id.to_owned()),
        ])
        .build()
}

/// The export task's state.
struct Exporting {
    exporter: opentelemetry_otlp::SpanExporter,
    source: SpanSource,
    scope: InstrumentationScope,
    dropped: Arc<AtomicU64>,
    /// The last export failed (logged once per failure streak).
    failing: bool,
    dropped_reported: u64,
}

async fn export_loop(
    mut exporting: Exporting,
    interval: Duration,
    mut stopped: tokio::sync::oneshot::Receiver<tokio::sync::oneshot::Sender<()>>,
) {
    let mut batch = Vec::with_capacity(BATCH_SPANS_MAX);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => exporting.export_waiting(&mut batch).await,
            stop = &mut stopped => {
                exporting.export_waiting(&mut batch).await;
                if let Ok(done) = stop {
                    let _ = done.send(());
                }
                return;
            }
        }
    }
}

impl Exporting {
    /// Drains and exports every span waiting now, a batch at a time.
    async fn export_waiting(&mut self, batch: &mut Vec<SpanRecord>) {
        loop {
            self.source.drain_into(batch, BATCH_SPANS_MAX);
            if batch.is_empty() {
                break;
            }
            let full = batch.len() == BATCH_SPANS_MAX;
            let spans = batch
                .drain(..)
                .map(|record| span_data(record, &self.scope))
                .collect();
            match self.exporter.export(spans).await {
                Ok(()) if self.failing => {
                    tracing::info!("span export works again");
                    self.failing = false;
                }
                Ok(()) => {}
                Err(error) if !self.failing => {
                    tracing::warn!(%error, "span export failed; spans are dropped until it works");
                    self.failing = true;
                }
                Err(_) => {}
            }
            if !full {
                break;
            }
        }
        let dropped_now = self.dropped.load(Ordering::Relaxed);
        if dropped_now > self.dropped_reported {
            tracing::warn!(
                dropped = dropped_now,
                "spans dropped: the exporter cannot keep up"
            );
            self.dropped_reported = dropped_now;
        }
    }
}

/// The SDK's form of a finished server span.
pub fn span_data(record: SpanRecord, scope: &InstrumentationScope) -> SpanData {
    let context = record.context;
    let outcome = record.outcome;
    let mut attributes = Vec::with_capacity(4);
    attributes.push(KeyValue::new(
        "http.response.status_code",
        i64::from(outcome.status),
    ));
    if let Some(id) = outcome.request_id {
        attributes.push(KeyValue::new(
            "hivenet.request_id",
            String::from_utf8_lossy(&id).into_owned(),
        ));
    }
    if let Some(model) = outcome.model {
        attributes.push(KeyValue::new(
            "gen_ai.request.model",
            String::from_utf8_lossy(&model).into_owned(),
        ));
    }
    if let Some(code) = outcome.error_code {
        attributes.push(KeyValue::new("error.type", code));
    }
    // A server span is an error for a 5xx answer (HTTP semantic conventions); a 4xx is the
    // client's. A client span is an error for any 4xx or 5xx, or no answer at all.
    let failed = match record.kind {
        Kind::Server => outcome.status >= 500,
        Kind::Client => outcome.status >= 400 || outcome.status == 0,
    };
    let status = if failed {
        Status::error(outcome.error_code.unwrap_or("server error"))
    } else {
        Status::Unset
    };
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(context.trace_id),
            SpanId::from_bytes(context.span_id),
            TraceFlags::new(context.flags & 1),
            false,
            TraceState::default(),
        ),
        parent_span_id: record.parent.map_or(SpanId::INVALID, SpanId::from_bytes),
        // A server span's parent is the caller's; a client span's is this process's own.
        parent_span_is_remote: record.parent.is_some() && record.kind == Kind::Server,
        span_kind: match record.kind {
            Kind::Server => SpanKind::Server,
            Kind::Client => SpanKind::Client,
        },
        name: record.name.into(),
        start_time: record.start,
        end_time: record.end,
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: scope.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::telemetry::Sampler;
    use crate::net::telemetry::span::{SpanOutcome, SpanRing, StartedSpan};

    fn attribute<'d>(data: &'d SpanData, key: &str) -> Option<&'d opentelemetry::Value> {
        data.attributes
            .iter()
            .find(|attribute| attribute.key.as_str() == key)
            .map(|attribute| &attribute.value)
    }

    #[test]
    fn a_record_becomes_a_server_span_under_its_remote_parent() {
        let span = StartedSpan::start(
            Some(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Sampler::default(),
        );
        let record = span.finish(
            "POST /v1/chat/completions",
            SpanOutcome {
                status: 502,
                request_id: Some(*b"8b9e4a6d-dfb4-4b95-bada-319e7e5b878a"),
                model: Some(bytes::Bytes::from_static(b"sim-model")),
                error_code: Some("backend_error"),
            },
        );
        let data = span_data(record, &InstrumentationScope::builder("test").build());
        assert_eq!(
            data.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(data.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(data.parent_span_is_remote);
        assert_eq!(data.span_kind, SpanKind::Server);
        assert_eq!(data.status, Status::error("backend_error"));
        assert_eq!(
            attribute(&data, "http.response.status_code"),
            Some(&opentelemetry::Value::I64(502))
        );
        assert_eq!(
            attribute(&data, "gen_ai.request.model").map(|value| value.to_string()),
            Some("sim-model".to_owned())
        );
        assert!(attribute(&data, "hivenet.request_id").is_some());
    }

    #[test]
    fn a_root_span_has_no_parent_and_a_4xx_is_not_an_error() {
        let record = StartedSpan::start(None, Sampler::default()).finish(
            "POST /v1/messages",
            SpanOutcome {
                status: 429,
                ..SpanOutcome::default()
            },
        );
        let data = span_data(record, &InstrumentationScope::builder("test").build());
        assert_eq!(data.parent_span_id, SpanId::INVALID);
        assert!(!data.parent_span_is_remote);
        assert_eq!(data.status, Status::Unset);
    }

    /// A client span is a local child of its server span, and an error for a 4xx or no answer.
    #[test]
    fn a_client_span_is_a_local_child_and_fails_on_any_error_answer() {
        let server = StartedSpan::start(None, Sampler::default());
        let call = server.client();
        assert_eq!(call.context.trace_id, server.context.trace_id);
        let scope = InstrumentationScope::builder("test").build();
        let refused = span_data(
            call.finish(
                "POST /v1/chat/completions",
                SpanOutcome {
                    status: 429,
                    ..SpanOutcome::default()
                },
            ),
            &scope,
        );
        assert_eq!(refused.span_kind, SpanKind::Client);
        assert_eq!(
            refused.parent_span_id,
            SpanId::from_bytes(server.context.span_id)
        );
        assert!(!refused.parent_span_is_remote);
        assert!(matches!(refused.status, Status::Error { .. }));
        let unreachable = span_data(
            call.finish(
                "POST /v1/chat/completions",
                SpanOutcome {
                    error_code: Some("backend_unavailable"),
                    ..SpanOutcome::default()
                },
            ),
            &scope,
        );
        assert_eq!(unreachable.status, Status::error("backend_unavailable"));
        let served = span_data(
            call.finish(
                "POST",
                SpanOutcome {
                    status: 200,
                    ..SpanOutcome::default()
                },
            ),
            &scope,
        );
        assert_eq!(served.status, Status::Unset);
    }

    #[test]
    fn draining_stops_at_the_batch_bound_and_takes_every_ring() {
        let (mut rings, consumers, _) = SpanRing::build(2, Sampler::default());
        let span = StartedSpan::start(None, Sampler::default());
        for index in 0..6 {
            rings[index % 2].push(span.finish("POST", SpanOutcome::default()));
        }
        let mut source = SpanSource::Rings(consumers);
        let mut batch = Vec::new();
        source.drain_into(&mut batch, 4);
        assert_eq!(batch.len(), 4);
        batch.clear();
        source.drain_into(&mut batch, 4);
        assert_eq!(batch.len(), 2);
    }
}
