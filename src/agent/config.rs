//! The agent's command line: flags, defaults and validation, as the configuration reference's agent
//! tables name them. This module is pure: it parses and checks, it opens no file and no socket.
//!
//! Validation happens once, in [`Args::validate`], and turns the raw flags into a [`Config`] the
//! rest of the agent reads. A refused flag set is a [`ConfigError`]; `main` prints it and exits 2,
//! the code clap uses for its own usage errors.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::base::duration::parse_arg;

/// Inference-engine adapter: decides the health path, model discovery, warm-up and which
/// Prometheus metrics are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    Vllm,
    Sglang,
    Ollama,
    Llamacpp,
    Infinity,
    Custom,
}

impl Engine {
    /// The name sent in `Register.engine`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Ollama => "ollama",
            Engine::Llamacpp => "llamacpp",
            Engine::Infinity => "infinity",
            Engine::Custom => "custom",
        }
    }
}

/// What the served model does; the router matches it together with the model name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Capability {
    Llm,
    Embedding,
    Reranker,
}

impl Capability {
    /// The name sent in `Register.capability`.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Llm => "llm",
            Capability::Embedding => "embedding",
            Capability::Reranker => "reranker",
        }
    }
}

/// `--p2p-codec`: what the agent offers on its tunnels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TunnelCodec {
    /// The lean tunnel, and HTTP/2 to a router older than it.
    Lean,
    /// HTTP/2 only, as agents before the lean tunnel: a way back without a downgrade.
    Http2,
}

impl TunnelCodec {
    pub fn codec(self) -> crate::net::tunnel::preamble::Codec {
        match self {
            TunnelCodec::Lean => crate::net::tunnel::preamble::Codec::Lean,
            TunnelCodec::Http2 => crate::net::tunnel::preamble::Codec::Http2,
        }
    }
}

/// `--version` default: injected at build time through `HIVENET_AGENT_VERSION`, else `dev`.
pub const BUILD_VERSION: &str = match option_env!("HIVENET_AGENT_VERSION") {
    Some(version) => version,
    None => "dev",
};

/// Raw flags. Every duration takes Go syntax (`500ms`, `2m`, `0`).
#[derive(Debug, Clone, Parser)]
#[command(
    name = "hivenet-agent",
    about = "Connects a local inference engine to hivenet routers",
    disable_version_flag = true
)]
pub struct Args {
    /// Runtime threads serving tunnels and the backend. 1 (the default) runs everything on one
    /// thread, which measured cheapest per request: an agent's load is bounded by its engine's
    /// `--capacity`, and cross-thread hand-offs cost more than they spread.
    #[arg(long, env = "HIVENET_AGENT_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,
    /// Inference-engine adapter.
    #[arg(long, value_enum, default_value = "vllm")]
    pub engine: Engine,
    /// Base URL of the local inference server (http only).
    #[arg(long, default_value = "http://localhost:8888")]
    pub backend_url: String,
    /// Public model ID override; comma-separated for several. Empty: discover from /v1/models.
    #[arg(long, default_value = "")]
    pub model: String,
    /// Absolute health URL; required for the custom engine.
    #[arg(long, default_value = "")]
    pub health_url: String,
    /// llm, embedding or reranker.
    #[arg(long, value_enum, default_value = "llm")]
    pub capability: Capability,
    /// Maximum concurrent requests the routers may assign to this agent; must be > 0.
    #[arg(long, default_value_t = 10)]
    pub capacity: u32,
    /// Backend timeout: for the response head, then for each body chunk (idle).
    #[arg(long, default_value = "120s", value_parser = parse_arg)]
    pub http_timeout: Duration,
    /// Rolling per-chunk deadline for writing a response chunk to the router; 0 disables.
    #[arg(long, default_value = "60s", value_parser = parse_arg)]
    pub stream_write_timeout: Duration,
    /// On SIGTERM: how long the requests in flight may run on after the agent has told its
    /// routers to send nothing new; what is left then is cut (the router ends those streams with
    /// an error). A second signal exits at once.
    #[arg(long, default_value = "30s", value_parser = parse_arg)]
    pub drain_timeout: Duration,
    /// The gRPC addresses (`host:port` or URL) of the site's routers, comma-separated or
    /// repeated: the agent keeps one session with each, and with every router they list
    /// (discovery). Entries may be DNS names; none is ever closed. Empty: `--router-grpc`.
    #[arg(long, env = "HIVENET_AGENT_ROUTERS", action = clap::ArgAction::Append)]
    pub routers: Vec<String>,
    /// Router gRPC address(es) (host:port or URL), the single-router form; used only when
    /// `--routers` is empty. Repeat or comma-separate to join several routers.
    #[arg(long, default_value = "localhost:50051", action = clap::ArgAction::Append)]
    pub router_grpc: Vec<String>,
    /// Deprecated no-op: tunnel addresses come from the authentication response.
    #[arg(long, default_value = "/ip4/127.0.0.1/tcp/9000")]
    pub router_p2p: String,
    /// Persistent Ed25519 key file (created when missing).
    #[arg(long, default_value = "./agent_identity.key")]
    pub identity_path: PathBuf,
    /// File holding the shared agent secret; else HIVENET_ROUTER_JWT_SECRET.
    #[arg(long)]
    pub jwt_secret_file: Option<PathBuf>,
    /// Overrides the heartbeat interval the router sends at authentication. Also how often the
    /// backend's health check runs after registration (5s when not given); a failing backend
    /// takes the agent out of the routing pool until it passes again.
    #[arg(long, value_parser = parse_arg)]
    pub heartbeat_interval: Option<Duration>,
    /// Routing-signal cadence. When not given: the router's value, else 500ms.
    #[arg(long, value_parser = parse_arg)]
    pub routing_signal_interval: Option<Duration>,
    /// Engine /metrics scrape interval.
    #[arg(long, default_value = "500ms", value_parser = parse_arg)]
    pub engine_sample_interval: Duration,
    /// Comma-separated routing tags.
    #[arg(long, default_value = "production")]
    pub tags: String,
    /// Operator-defined location label.
    #[arg(long, default_value = "UE-France")]
    pub region: String,
    /// Operator or provider label.
    #[arg(long, default_value = "Unknown")]
    pub organization: String,
    /// Machine label.
    #[arg(long, default_value = "Unknown")]
    pub machine: String,
    /// Version recorded in registration metadata.
    #[arg(long, default_value = BUILD_VERSION)]
    pub version: String,
    /// Deployment identifier: the router's tenant metrics carry it as `deployment_id` for the
    /// requests this agent serves.
    #[arg(long, env = "HIVENET_ROUTER_DEPLOYMENT_ID", default_value = "")]
    pub deployment_id: String,
    /// Stable replica identifier.
    #[arg(long, env = "HIVENET_ROUTER_REPLICA_ID", default_value = "")]
    pub replica_id: String,

    // Accepted for command-line compatibility; not used by this agent.
    /// Accepted, unused: GPU label.
    #[arg(long, env = "HIVENET_ROUTER_GPU_MODEL", default_value = "")]
    pub gpu_model: String,
    /// Accepted, unused: file of assigned GPU UUIDs.
    #[arg(long)]
    pub gpu_devices_file: Option<PathBuf>,
    /// Accepted, unused: hide_llm metadata flag.
    #[arg(long)]
    pub hide_llm: bool,
    /// Accepted, unused: human-readable model name.
    #[arg(long, default_value = "")]
    pub llm_pretty_name: String,
    /// Accepted, unused: short model description.
    #[arg(long, default_value = "")]
    pub llm_info: String,
    /// Accepted, unused: the agent only dials out.
    #[arg(long, default_value_t = 0)]
    pub p2p_listen_port: u16,
    /// CA certificates (PEM) that sign routers' tunnel certificates, for routers whose tunnel
    /// address ends in `/tls`. Default: the public web roots.
    #[arg(long, env = "HIVENET_AGENT_P2P_TLS_CA")]
    pub p2p_tls_ca: Option<PathBuf>,
    /// What the tunnels to the routers carry: `lean` (the default; HTTP/2 to a router that
    /// predates it) or `http2` (HTTP/2 only).
    #[arg(long, env = "HIVENET_AGENT_P2P_CODEC", value_enum, default_value_t = TunnelCodec::Lean)]
    pub p2p_codec: TunnelCodec,
    /// Accepted, unused: no hardware sampling in this agent.
    #[arg(long, default_value = "2s", value_parser = parse_arg)]
    pub hardware_sample_interval: Duration,
    #[command(flatten)]
    pub tracing: crate::net::telemetry::TracingArgs,
}

/// A refused flag combination. Messages name the flag involved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("--capacity must be greater than 0")]
    ZeroCapacity,
    #[error("--engine custom requires --model")]
    CustomNeedsModel,
    #[error("--engine custom requires --health-url")]
    CustomNeedsHealthUrl,
    #[error("--engine ollama cannot serve --capability reranker")]
    OllamaReranker,
    #[error("--backend-url {0:?} must be an http:// URL with a host")]
    BadBackendUrl(String),
    #[error("--health-url {0:?} must be an http:// URL with a host")]
    BadHealthUrl(String),
    #[error("--routers and --router-grpc are empty")]
    NoRouter,
    #[error("--engine-sample-interval must be greater than 0")]
    ZeroSampleInterval,
    #[error("{0}")]
    Tracing(String),
}

/// Validated settings the rest of the agent reads.
#[derive(Debug, Clone)]
pub struct Config {
    pub engine: Engine,
    /// Backend base URL without a trailing slash.
    pub backend_url: String,
    /// Explicit models from `--model`; empty means discover.
    pub models_override: Vec<String>,
    /// Absolute health URL (custom engine), empty otherwise.
    pub health_url: String,
    pub capability: Capability,
    pub capacity: u32,
    pub http_timeout: Duration,
    /// `None` when `--stream-write-timeout 0`.
    pub stream_write_timeout: Option<Duration>,
    pub drain_timeout: Duration,
    /// The starting list: one gRPC endpoint URI (`http://host:port`) per `--routers` entry (else
    /// per `--router-grpc` entry), duplicates removed. Discovery adds to it, never removes.
    pub routers: Vec<String>,
    pub identity_path: PathBuf,
    pub jwt_secret_file: Option<PathBuf>,
    pub heartbeat_interval: Option<Duration>,
    pub routing_signal_interval: Option<Duration>,
    pub engine_sample_interval: Duration,
    pub tags: Vec<String>,
    pub region: String,
    pub version: String,
    pub deployment_id: String,
    pub replica_id: String,
    /// `--organization` and `--machine`: registered, the labels of the router's per-agent
    /// metrics.
    pub organization: String,
    pub machine: String,
    /// `--p2p-tls-ca`.
    pub p2p_tls_ca: Option<PathBuf>,
    /// `--p2p-codec`: what a tunnel connection offers first.
    pub p2p_codec: crate::net::tunnel::preamble::Codec,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: `None` when tracing is off.
    pub tracing: Option<crate::net::telemetry::TracingSettings>,
}

impl Args {
    pub fn validate(self) -> Result<Config, ConfigError> {
        if self.capacity == 0 {
            return Err(ConfigError::ZeroCapacity);
        }
        let models_override = split_list(&self.model);
        if self.engine == Engine::Custom {
            if models_override.is_empty() {
                return Err(ConfigError::CustomNeedsModel);
            }
            if self.health_url.trim().is_empty() {
                return Err(ConfigError::CustomNeedsHealthUrl);
            }
        }
        if self.engine == Engine::Ollama && self.capability == Capability::Reranker {
            return Err(ConfigError::OllamaReranker);
        }
        let backend_url = self.backend_url.trim().trim_end_matches('/').to_owned();
        if !is_http_url(&backend_url) {
            return Err(ConfigError::BadBackendUrl(self.backend_url));
        }
        let health_url = self.health_url.trim().to_owned();
        if !health_url.is_empty() && !is_http_url(&health_url) {
            return Err(ConfigError::BadHealthUrl(self.health_url));
        }
        let given = if self
            .routers
            .iter()
            .any(|value| !split_list(value).is_empty())
        {
            &self.routers
        } else {
            &self.router_grpc
        };
        let mut routers: Vec<String> = Vec::new();
        for address in given.iter().flat_map(|value| split_list(value)) {
            let uri = grpc_uri(&address);
            if !routers.contains(&uri) {
                routers.push(uri);
            }
        }
        if routers.is_empty() {
            return Err(ConfigError::NoRouter);
        }
        if self.engine_sample_interval.is_zero() {
            return Err(ConfigError::ZeroSampleInterval);
        }
        Ok(Config {
            engine: self.engine,
            backend_url,
            models_override,
            health_url,
            capability: self.capability,
            capacity: self.capacity,
            http_timeout: self.http_timeout,
            stream_write_timeout: Some(self.stream_write_timeout).filter(|value| !value.is_zero()),
            drain_timeout: self.drain_timeout,
            routers,
            identity_path: self.identity_path,
            jwt_secret_file: self.jwt_secret_file,
            heartbeat_interval: self.heartbeat_interval.filter(|value| !value.is_zero()),
            routing_signal_interval: self
                .routing_signal_interval
                .filter(|value| !value.is_zero()),
            engine_sample_interval: self.engine_sample_interval,
            tags: split_list(&self.tags),
            region: self.region,
            version: self.version,
            deployment_id: self.deployment_id,
            replica_id: self.replica_id,
            organization: self.organization,
            machine: self.machine,
            p2p_tls_ca: self.p2p_tls_ca,
            p2p_codec: self.p2p_codec.codec(),
            tracing: self.tracing.settings().map_err(ConfigError::Tracing)?,
        })
    }
}

/// Splits a comma-separated flag value, trimming items and dropping empty ones.
pub fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `localhost:50051` becomes `http://localhost:50051`; an explicit scheme is kept.
pub fn grpc_uri(address: &str) -> String {
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

fn is_http_url(url: &str) -> bool {
    match url.parse::<http::Uri>() {
        Ok(uri) => uri.scheme_str() == Some("http") && uri.host().is_some(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["hivenet-agent"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).expect("clap accepts").validate()
    }

    #[test]
    fn defaults_match_the_reference() {
        let config = parse(&[]).unwrap();
        assert_eq!(config.engine, Engine::Vllm);
        assert_eq!(config.backend_url, "http://localhost:8888");
        assert!(config.models_override.is_empty());
        assert_eq!(config.capability, Capability::Llm);
        assert_eq!(config.capacity, 10);
        assert_eq!(config.http_timeout, Duration::from_secs(120));
        assert_eq!(config.stream_write_timeout, Some(Duration::from_secs(60)));
        assert_eq!(config.routers, vec!["http://localhost:50051"]);
        assert_eq!(config.identity_path, PathBuf::from("./agent_identity.key"));
        assert_eq!(config.engine_sample_interval, Duration::from_millis(500));
        assert_eq!(config.routing_signal_interval, None);
        assert_eq!(config.tags, vec!["production"]);
        assert_eq!(config.region, "UE-France");
        assert_eq!(config.version, BUILD_VERSION);
    }

    #[test]
    fn lists_are_split_and_trimmed() {
        let config = parse(&[
            "--tags",
            " a, b ,,c",
            "--router-grpc",
            "r1:1, r2:2",
            "--router-grpc",
            "https://r3:3",
            "--model",
            "m1,m2",
        ])
        .unwrap();
        assert_eq!(config.tags, vec!["a", "b", "c"]);
        assert_eq!(
            config.routers,
            vec!["http://r1:1", "http://r2:2", "https://r3:3"]
        );
        assert_eq!(config.models_override, vec!["m1", "m2"]);
    }

    #[test]
    fn routers_win_over_router_grpc_and_are_deduplicated() {
        let config = parse(&[
            "--routers",
            "router-0:50051, router-1:50051",
            "--routers",
            "router-0:50051,https://router-2:443",
            "--router-grpc",
            "ignored:1",
        ])
        .unwrap();
        assert_eq!(
            config.routers,
            vec![
                "http://router-0:50051",
                "http://router-1:50051",
                "https://router-2:443"
            ]
        );
        // An empty --routers falls back to --router-grpc (and its default).
        let config = parse(&["--routers", " , ", "--router-grpc", "r1:1"]).unwrap();
        assert_eq!(config.routers, vec!["http://r1:1"]);
        let config = parse(&["--routers", ""]).unwrap();
        assert_eq!(config.routers, vec!["http://localhost:50051"]);
    }

    #[test]
    fn refuses_invalid_combinations() {
        assert_eq!(
            parse(&["--capacity", "0"]).unwrap_err(),
            ConfigError::ZeroCapacity
        );
        assert_eq!(
            parse(&["--engine", "custom", "--health-url", "http://h/health"]).unwrap_err(),
            ConfigError::CustomNeedsModel
        );
        assert_eq!(
            parse(&["--engine", "custom", "--model", "m"]).unwrap_err(),
            ConfigError::CustomNeedsHealthUrl
        );
        assert_eq!(
            parse(&["--engine", "ollama", "--capability", "reranker"]).unwrap_err(),
            ConfigError::OllamaReranker
        );
        assert!(matches!(
            parse(&["--backend-url", "ftp://x"]).unwrap_err(),
            ConfigError::BadBackendUrl(_)
        ));
        assert!(parse(&["--router-grpc", " , "]).is_err());
    }

    #[test]
    fn accepts_boundaries_and_compat_flags() {
        let config = parse(&[
            "--engine",
            "custom",
            "--model",
            "m",
            "--health-url",
            "http://127.0.0.1:1/ok",
            "--capacity",
            "1",
            "--stream-write-timeout",
            "0",
            "--router-p2p",
            "/ip4/1.2.3.4/tcp/9000",
            "--hide-llm",
            "--gpu-model",
            "H100",
            "--p2p-listen-port",
            "4001",
            "--hardware-sample-interval",
            "5s",
            "--version",
            "1.2.3",
            "--backend-url",
            "http://127.0.0.1:9/",
        ])
        .unwrap();
        assert_eq!(config.capacity, 1);
        assert_eq!(config.stream_write_timeout, None);
        assert_eq!(config.version, "1.2.3");
        assert_eq!(config.backend_url, "http://127.0.0.1:9");
        assert!(parse(&["--engine", "ollama", "--capability", "embedding"]).is_ok());
    }

    #[test]
    fn clap_refuses_unknown_values() {
        assert!(Args::try_parse_from(["hivenet-agent", "--engine", "tgi"]).is_err());
        assert!(Args::try_parse_from(["hivenet-agent", "--http-timeout", "5"]).is_err());
    }
}
