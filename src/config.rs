//! Router configuration: flags and environment variables with the names, formats and defaults of
//! the configuration reference, so existing deployments start unchanged.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::duration::parse_arg as duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "hivenet-router",
    version,
    about = "OpenAI- and Anthropic-compatible LLM router"
)]
pub struct RouterArgs {
    /// Client API listen address (`:8080` binds every interface).
    #[arg(long, env = "HIVENET_ROUTER_HTTP_PORT", default_value = ":8080")]
    pub http_port: String,
    /// Agent gRPC (authentication and session) listen address.
    #[arg(long, env = "HIVENET_ROUTER_GRPC_PORT", default_value = ":50051")]
    pub grpc_port: String,
    /// Prometheus `/metrics` listen address.
    #[arg(long, env = "HIVENET_ROUTER_METRICS_PORT", default_value = ":2112")]
    pub metrics_port: String,
    /// Agent data-tunnel TCP port (no colon).
    #[arg(long, env = "HIVENET_ROUTER_P2P_PORT", default_value_t = 9000)]
    pub p2p_port: u16,
    /// Address the tunnel port binds.
    #[arg(long, default_value = "127.0.0.1")]
    pub p2p_listen_addr: IpAddr,
    /// Multiaddr agents should dial for the tunnel (e.g. `/dns4/router.example/tcp/9000`);
    /// empty: `/ip4/<p2p-listen-addr>/tcp/<p2p-port>`.
    #[arg(long, default_value = "")]
    pub p2p_announce_addr: String,
    /// Data-plane shards (one pinned core each). Default: the cores available to this process.
    #[arg(long, env = "HIVENET_ROUTER_SHARDS")]
    pub shards: Option<usize>,
    /// Maximum capacity waiters per model; 0 disables model queues.
    #[arg(long, env = "HIVENET_ROUTER_QUEUE_DEPTH", default_value_t = 30)]
    pub queue_depth: usize,
    /// Deadline for the router-side request: capacity wait plus time to the response head (and
    /// the whole body for non-streamed responses).
    #[arg(long, env = "HIVENET_ROUTER_REQUEST_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub request_timeout: Duration,
    /// Heartbeat cadence the router asks of agents.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub heartbeat_interval: Duration,
    /// Routing-signal cadence the router asks of agents.
    #[arg(long, default_value = "500ms", value_parser = duration)]
    pub routing_signal_interval: Duration,
    /// Frequency of router health-monitor passes over agents.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub health_check_interval: Duration,
    /// Time without a heartbeat before an agent leaves the routing pool.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub unhealthy_after: Duration,
    /// Time without a heartbeat before an agent's session is closed.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub remove_after: Duration,
    /// Lifetime of an agent session token; agents re-authenticate before it ends.
    #[arg(long, env = "HIVENET_ROUTER_SESSION_TTL", default_value = "1h", value_parser = duration)]
    pub session_ttl: Duration,
    /// File holding the shared agent secret (wins over `HIVENET_ROUTER_JWT_SECRET`).
    #[arg(long)]
    pub jwt_secret_file: Option<PathBuf>,
    /// `auth.yaml`: API keys, allowlists, quotas, admin section. Reloaded on SIGHUP and on change.
    /// Without it, `HIVENET_ROUTER_AUTH_MODE` decides (`none`, the default, serves without keys).
    #[arg(long, env = "HIVENET_ROUTER_AUTH_CONFIG")]
    pub auth_config_file: Option<PathBuf>,
    /// Persistent Ed25519 identity of this router (its peer ID).
    #[arg(long, default_value = "./router_identity.key")]
    pub identity_path: PathBuf,
    /// A client that takes longer than this to send a request head (or is idle this long between
    /// keep-alive requests) is disconnected.
    #[arg(long, env = "HIVENET_ROUTER_CLIENT_HEADER_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub client_header_timeout: Duration,
    /// A client whose request body stalls this long between reads gets 408 and is disconnected.
    #[arg(long, env = "HIVENET_ROUTER_CLIENT_BODY_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub client_body_timeout: Duration,
    /// Directory of the router's disk database (one redb file, `crate::disk_db`). Used with
    /// `HIVENET_ROUTER_QUOTA_BACKEND=badger`: today's daily token totals survive a restart.
    #[arg(
        long,
        env = "HIVENET_ROUTER_DISK_DB_PATH",
        default_value = "./badger_disk"
    )]
    pub disk_db_path: PathBuf,
    /// Delete the persistent database (the file in `--disk-db-path`) before start-up: today's
    /// daily totals start from zero. Not a recovery step.
    #[arg(long)]
    pub reset_disk_db: bool,
}

/// Settings read only from the environment, as the reference documents them.
#[derive(Debug, Clone)]
pub struct EnvSettings {
    /// Largest `/v1/*` request body in bytes; `None` when `HIVENET_ROUTER_MAX_REQUEST_BYTES=0`.
    pub max_request_bytes: Option<usize>,
    /// `HIVENET_ROUTER_RPM_BURST_SECONDS` (`0`: a full minute of burst; `1`-`59`: that many
    /// seconds of the rate).
    pub rpm_burst: crate::limits::BurstSeconds,
    /// `HIVENET_ROUTER_QUOTA_BACKEND`.
    pub quota_backend: QuotaBackend,
}

pub const DEFAULT_MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024;

impl EnvSettings {
    pub fn from_env() -> anyhow::Result<EnvSettings> {
        let max_request_bytes = match std::env::var("HIVENET_ROUTER_MAX_REQUEST_BYTES") {
            Err(_) => Some(DEFAULT_MAX_REQUEST_BYTES),
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(0) => None,
                Ok(bytes) => Some(usize::try_from(bytes).unwrap_or(usize::MAX)),
                Err(_) => anyhow::bail!(
                    "HIVENET_ROUTER_MAX_REQUEST_BYTES must be a non-negative integer, got {text:?}"
                ),
            },
        };
        let quota_backend = quota_backend(
            std::env::var("HIVENET_ROUTER_QUOTA_BACKEND")
                .ok()
                .as_deref(),
        )?;
        let rpm_burst = match std::env::var("HIVENET_ROUTER_RPM_BURST_SECONDS") {
            Err(_) => crate::limits::BurstSeconds::default(),
            Ok(text) => crate::limits::BurstSeconds::parse(&text)
                .map_err(|error| anyhow::anyhow!("{error}"))?,
        };
        Ok(EnvSettings {
            max_request_bytes,
            rpm_burst,
            quota_backend,
        })
    }
}

/// Where daily token totals live (`HIVENET_ROUTER_QUOTA_BACKEND`, default `memory`). Request
/// rates are always in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuotaBackend {
    /// Lost when the router restarts.
    #[default]
    Memory,
    /// `badger`: also written to the disk database (`--disk-db-path`) every second and at
    /// shutdown, and restored at start-up. The name is the reference's; the store is redb.
    Badger,
}

/// Parses `HIVENET_ROUTER_QUOTA_BACKEND`; unset or empty is `memory`.
pub fn quota_backend(value: Option<&str>) -> anyhow::Result<QuotaBackend> {
    match value.map(str::trim) {
        None | Some("") | Some("memory") => Ok(QuotaBackend::Memory),
        Some("badger") => Ok(QuotaBackend::Badger),
        Some(other) => {
            anyhow::bail!("HIVENET_ROUTER_QUOTA_BACKEND must be memory or badger, got {other:?}")
        }
    }
}

/// Parses `:8080`, `0.0.0.0:8080` or `[::1]:8080`.
pub fn listen_address(text: &str) -> anyhow::Result<SocketAddr> {
    let full = if let Some(port) = text.strip_prefix(':') {
        format!("0.0.0.0:{port}")
    } else {
        text.to_owned()
    };
    full.parse().map_err(|_| {
        anyhow::anyhow!("invalid listen address {text:?} (expected :PORT or HOST:PORT)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_backends() {
        assert_eq!(quota_backend(None).unwrap(), QuotaBackend::Memory);
        assert_eq!(quota_backend(Some("")).unwrap(), QuotaBackend::Memory);
        assert_eq!(quota_backend(Some("memory")).unwrap(), QuotaBackend::Memory);
        assert_eq!(
            quota_backend(Some(" badger ")).unwrap(),
            QuotaBackend::Badger
        );
        assert_eq!(
            quota_backend(Some("redis")).unwrap_err().to_string(),
            "HIVENET_ROUTER_QUOTA_BACKEND must be memory or badger, got \"redis\""
        );
    }

    #[test]
    fn disk_db_flags() {
        let args = RouterArgs::try_parse_from(["hivenet-router"]).unwrap();
        assert_eq!(args.disk_db_path, PathBuf::from("./badger_disk"));
        assert!(!args.reset_disk_db);
        let args = RouterArgs::try_parse_from([
            "hivenet-router",
            "--disk-db-path",
            "/var/lib/router",
            "--reset-disk-db",
        ])
        .unwrap();
        assert_eq!(args.disk_db_path, PathBuf::from("/var/lib/router"));
        assert!(args.reset_disk_db);
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(listen_address(":8080").unwrap().port(), 8080);
        assert_eq!(
            listen_address("127.0.0.1:9").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert!(listen_address("8080").is_err());
    }
}
