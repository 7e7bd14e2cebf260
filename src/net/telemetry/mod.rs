//! Distributed tracing over OTLP (configuration reference, "Distributed tracing"; audit
//! reference, "Trace IDs").
//!
//! What it owns: `OTEL_EXPORTER_OTLP_ENDPOINT` on the router and the agent turns tracing on
//! (empty or absent: off), and each process then exports one server span per request over OTLP
//! gRPC as service `hivenet-router` or `hivenet-agent`. A request's W3C `traceparent` is
//! continued (an invalid one starts a new trace, never fails the request), the router sends its
//! span's context to the agent on the tunnel request, the agent sends its own to the engine.
//!
//! Key components:
//! - `context`: `traceparent` parsing and formatting, pure;
//! - `span`: a span in progress, its finished record, and the bounded lock-free hand-over to the
//!   exporter (per-shard rings on the router, one queue on the agent);
//! - `export`: the task that drains them and calls `opentelemetry-otlp`'s exporter.
//!
//! Architecture: the router's shards never call into an SDK span processor (they take locks and
//! do I/O); a shard copies a fixed-shape record into its own ring and the exporter, on the
//! control core, builds the SDK's `SpanData` and sends batches every `OTEL_BSP_SCHEDULE_DELAY`.
//!
//! Sampling: `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` as the SDK reads them
//! (`sampler`), by default parent-based and always on at the root. A request whose span is not
//! sampled is continued (its trace id is still returned and audited) but its spans are not
//! exported.
//!
//! Resource: `service.name`, `service.version` (the crate's) and `service.instance.id` (the
//! process's peer ID), the attributes a collector groups spans by. At SIGTERM, spans still
//! waiting are exported before the process exits (`export::SpanExport::finish`).
//!
//! Performance: with tracing off the request path pays one branch on an `Option` per request:
//! no clock read, no header lookup, no allocation.

pub mod context;
pub mod export;
pub mod sampler;
pub mod span;

use std::time::Duration;

pub use context::TraceContext;
pub use sampler::Sampler;
pub use span::{SpanOutcome, SpanQueue, SpanRecord, SpanRing, StartedSpan};

/// The standard variable naming the OTLP gRPC collector (`tempo:4317`, `http://otel:4317`).
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The standard sampler variables (`sampler`).
pub const SAMPLER_ENV: &str = "OTEL_TRACES_SAMPLER";
pub const SAMPLER_ARG_ENV: &str = "OTEL_TRACES_SAMPLER_ARG";
/// The standard variable naming the PEM file of the CA that signed the collector's certificate.
pub const CERTIFICATE_ENV: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
/// The standard batch span processor's export interval, in milliseconds.
pub const SCHEDULE_DELAY_ENV: &str = "OTEL_BSP_SCHEDULE_DELAY";
/// `OTEL_BSP_SCHEDULE_DELAY`'s default (the OpenTelemetry specification's), in milliseconds.
pub const SCHEDULE_DELAY_MS_DEFAULT: u64 = 5000;

/// The router's service name in its spans.
pub const ROUTER_SERVICE: &str = "hivenet-router";
/// The agent's service name in its spans.
pub const AGENT_SERVICE: &str = "hivenet-agent";

/// Where and how often spans are exported; a process has tracing on exactly when it has these.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    /// The collector's gRPC URI; `http://` is assumed when the variable gives no scheme (the
    /// reference's own example is `tempo:4317`), `https://` when a CA certificate is given. An
    /// `https://` endpoint is reached over TLS, verified against the public web roots and the
    /// given CA.
    pub endpoint: String,
    /// PEM of the CA that signed the collector's certificate (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
    pub certificate: Option<Vec<u8>>,
    /// How often finished spans are drained and sent. At least 1 ms.
    pub export_interval: Duration,
    /// Which traces are recorded.
    pub sampler: Sampler,
}

impl TracingSettings {
    /// Tracing settings from the endpoint variable (`None` or empty: tracing off) and the export
    /// interval in milliseconds.
    pub fn from_endpoint(endpoint: Option<&str>, schedule_delay_ms: u64) -> Option<Self> {
        let endpoint = endpoint.map(str::trim).filter(|value| !value.is_empty())?;
        let endpoint = if endpoint.contains("://") {
            endpoint.to_owned()
        } else {
            format!("http://{endpoint}")
        };
        Some(TracingSettings {
            endpoint,
            certificate: None,
            export_interval: Duration::from_millis(schedule_delay_ms.max(1)),
            sampler: Sampler::default(),
        })
    }
}

/// The tracing flags of both binaries (flattened into their arguments), each also read from
/// its standard OpenTelemetry variable.
#[derive(Debug, Clone, clap::Args)]
pub struct TracingArgs {
    /// OTLP gRPC collector to export spans to (`tempo:4317`; `http://` is assumed without a
    /// scheme, the connection is insecure). Empty: tracing off. Read at start; a change needs a
    /// restart.
    #[arg(long = "otel-exporter-otlp-endpoint", env = ENDPOINT_ENV, default_value = "")]
    pub endpoint: String,
    /// Milliseconds between span exports (with tracing on).
    #[arg(
        long = "otel-bsp-schedule-delay",
        env = SCHEDULE_DELAY_ENV,
        default_value_t = SCHEDULE_DELAY_MS_DEFAULT
    )]
    pub schedule_delay_ms: u64,
    /// Which traces are recorded: `parentbased_always_on` (default), `parentbased_always_off`,
    /// `parentbased_traceidratio`, `always_on`, `always_off`, `traceidratio`.
    #[arg(long = "otel-traces-sampler", env = SAMPLER_ENV, default_value = "parentbased_always_on")]
    pub sampler: String,
    /// The probability of the two `traceidratio` samplers, 0 to 1 (default 1).
    #[arg(long = "otel-traces-sampler-arg", env = SAMPLER_ARG_ENV)]
    pub sampler_arg: Option<String>,
    /// PEM file of the CA that signed the collector's certificate: the export goes over TLS
    /// (an endpoint without a scheme is `https://`).
    #[arg(long = "otel-exporter-otlp-certificate", env = CERTIFICATE_ENV)]
    pub certificate: Option<std::path::PathBuf>,
}

impl TracingArgs {
    /// `Ok(None)`: tracing off. An unknown sampler or a ratio that is not a probability is an
    /// error, with tracing on or off (a typo must not go unnoticed until tracing is turned on).
    pub fn settings(&self) -> Result<Option<TracingSettings>, String> {
        let sampler = Sampler::parse(&self.sampler, self.sampler_arg.as_deref())?;
        let Some(settings) =
            TracingSettings::from_endpoint(Some(&self.endpoint), self.schedule_delay_ms)
        else {
            return Ok(None);
        };
        let Some(path) = &self.certificate else {
            return Ok(Some(TracingSettings {
                sampler,
                ..settings
            }));
        };
        let certificate = std::fs::read(path)
            .map_err(|error| format!("{CERTIFICATE_ENV} {}: {error}", path.display()))?;
        let endpoint = match settings.endpoint.strip_prefix("http://") {
            // A scheme the operator did not write: the certificate says TLS.
            Some(rest) if !self.endpoint.contains("://") => format!("https://{rest}"),
            Some(_) => {
                return Err(format!(
                    "{CERTIFICATE_ENV} is set but {ENDPOINT_ENV} {} is plain http://",
                    self.endpoint
                ));
            }
            None => settings.endpoint,
        };
        Ok(Some(TracingSettings {
            endpoint,
            certificate: Some(certificate),
            sampler,
            ..settings
        }))
    }
}

/// A request span's name, `{method} {route}` as the HTTP semantic conventions ask, for the
/// routes the router forwards; anything else (`/admin/*`) is `HTTP`, the conventions' name when
/// neither route nor method is worth naming, which keeps span names low-cardinality.
pub fn span_name(path: &str) -> &'static str {
    match path {
        "/v1/chat/completions" => "POST /v1/chat/completions",
        "/v1/messages" => "POST /v1/messages",
        "/v1/messages/count_tokens" => "POST /v1/messages/count_tokens",
        "/v1/embeddings" => "POST /v1/embeddings",
        "/v1/rerank" => "POST /v1/rerank",
        "/v1/models" => "GET /v1/models",
        _ => "HTTP",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_absent_endpoint_turns_tracing_off() {
        assert_eq!(TracingSettings::from_endpoint(None, 5000), None);
        assert_eq!(TracingSettings::from_endpoint(Some(""), 5000), None);
        assert_eq!(TracingSettings::from_endpoint(Some("  "), 5000), None);
    }

    fn args(endpoint: &str, certificate: Option<&str>) -> TracingArgs {
        TracingArgs {
            endpoint: endpoint.into(),
            schedule_delay_ms: 5000,
            sampler: "parentbased_always_on".into(),
            sampler_arg: None,
            certificate: certificate.map(Into::into),
        }
    }

    /// A CA certificate means TLS: an endpoint without a scheme becomes `https://`, an explicit
    /// `http://` one is refused, and a file that cannot be read is refused naming it.
    #[test]
    fn a_certificate_turns_the_export_to_tls() {
        let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tls/ca.pem");
        let settings = args("otel:4317", Some(ca)).settings().unwrap().unwrap();
        assert_eq!(settings.endpoint, "https://otel:4317");
        assert!(settings.certificate.unwrap().starts_with(b"-----BEGIN"));
        let settings = args("https://otel:4317", Some(ca))
            .settings()
            .unwrap()
            .unwrap();
        assert_eq!(settings.endpoint, "https://otel:4317");
        assert!(args("http://otel:4317", Some(ca)).settings().is_err());
        let missing = args("otel:4317", Some("/nonexistent/ca.pem"))
            .settings()
            .unwrap_err();
        assert!(
            missing.starts_with("OTEL_EXPORTER_OTLP_CERTIFICATE /nonexistent/ca.pem"),
            "{missing}"
        );
        assert_eq!(args("", Some("/nonexistent/ca.pem")).settings(), Ok(None));
        let plain = args("otel:4317", None).settings().unwrap().unwrap();
        assert_eq!(
            (plain.endpoint.as_str(), plain.certificate),
            ("http://otel:4317", None)
        );
    }

    #[test]
    fn an_endpoint_without_a_scheme_is_plain_http() {
        let settings = TracingSettings::from_endpoint(Some("tempo:4317"), 0).unwrap();
        assert_eq!(settings.endpoint, "http://tempo:4317");
        assert_eq!(settings.export_interval, Duration::from_millis(1));
        let settings = TracingSettings::from_endpoint(Some("https://otel:4317"), 200).unwrap();
        assert_eq!(settings.endpoint, "https://otel:4317");
        assert_eq!(settings.export_interval, Duration::from_millis(200));
    }
}
