//! Router configuration: flags and environment variables with the names, formats and defaults of
//! the configuration reference, so existing deployments start unchanged.

pub mod sync;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::base::duration::parse_arg as duration;

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
    /// gRPC address (`host:port`) agents reach this router at, handed to them so an agent given
    /// one router finds the others (with a sync store, shared through it). The host must be one
    /// agents can dial and the port numeric: a listen address (`:50051`, `0.0.0.0:50051`) is
    /// refused. Empty (default): not advertised. Scope: this router.
    #[arg(long, env = "HIVENET_ROUTER_ADVERTISE_GRPC_ADDR", default_value = "")]
    pub advertise_grpc_addr: String,
    /// Prometheus `/metrics` listen address.
    #[arg(long, env = "HIVENET_ROUTER_METRICS_PORT", default_value = ":2112")]
    pub metrics_port: String,
    /// Agent data-tunnel TCP port (no colon).
    #[arg(long, env = "HIVENET_ROUTER_P2P_PORT", default_value_t = 9000)]
    pub p2p_port: u16,
    /// Address the tunnel port binds.
    #[arg(long, default_value = "127.0.0.1")]
    pub p2p_listen_addr: IpAddr,
    /// Agents allowed to connect from one source prefix (IPv4 /32, IPv6 /56); set it comfortably
    /// above the agents behind one NAT. Each agent keeps a tunnel connection to every shard, so
    /// the router counts up to this many times `--shards` open tunnel connections from the
    /// prefix. 0: no limit.
    #[arg(
        long,
        env = "HIVENET_ROUTER_P2P_MAX_CONNS_PER_IP",
        default_value_t = 32
    )]
    pub p2p_max_conns_per_ip: u32,
    /// Tenants named in the `hivenet_tenant_*` and per-tenant routing series of `/metrics`: the
    /// most active ones on this router; the others are summed under `tenant_id="_other"`.
    /// 0: every tenant (the default). For sites with tens of thousands of keys.
    #[arg(
        long,
        env = "HIVENET_ROUTER_TENANT_METRICS_MAX_TENANTS",
        default_value_t = 0
    )]
    pub tenant_metrics_max_tenants: usize,
    /// Multiaddr agents should dial for the tunnel (e.g. `/dns4/router.example/tcp/9000`);
    /// empty: `/ip4/<p2p-listen-addr>/tcp/<p2p-port>`.
    #[arg(long, default_value = "")]
    pub p2p_announce_addr: String,
    /// Tunnel TLS: the router's certificate chain (PEM, leaf first). With `--p2p-tls-key`, the
    /// tunnel port speaks TLS only and the announced address ends in `/tls`.
    #[arg(long, env = "HIVENET_ROUTER_P2P_TLS_CERT")]
    pub p2p_tls_cert: Option<PathBuf>,
    /// Tunnel TLS: the certificate's private key (PEM).
    #[arg(long, env = "HIVENET_ROUTER_P2P_TLS_KEY")]
    pub p2p_tls_key: Option<PathBuf>,
    /// Data-plane shards (one pinned core each). Default: the cores available to this process.
    #[arg(long, env = "HIVENET_ROUTER_SHARDS")]
    pub shards: Option<usize>,
    /// Pin each shard's thread to its own core (and the sync core to the next one). Right for a
    /// router with its cores to itself; `false` on a host whose cores the router shares with busy
    /// processes, where the kernel may leave a pinned shard's core idle while the others queue
    /// on the rest (`perf/notes/2026-12-02-where-the-remaining-time-goes.md`).
    #[arg(long, env = "HIVENET_ROUTER_PIN_SHARDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub pin_shards: bool,
    /// With several shards, a client connection whose first request's key has limits moves to
    /// the shard that owns that key, while that shard is not much busier (`shard::handoff`);
    /// `off` keeps every connection on the shard that accepted it. `on`/`off` (or true/false).
    #[arg(long, env = "HIVENET_ROUTER_CONNECTION_HANDOFF", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub connection_handoff: bool,
    /// Maximum capacity waiters per model; 0 disables model queues.
    #[arg(long, env = "HIVENET_ROUTER_QUEUE_DEPTH", default_value_t = 30)]
    pub queue_depth: usize,
    /// `prefix-aware` steps: the least fraction of a prompt's blocks an agent must hold for the
    /// prompt to go there (below it, least-loaded). SGLang's model gateway's `--cache-threshold`.
    #[arg(long, env = "HIVENET_ROUTER_PREFIX_CACHE_THRESHOLD", default_value_t = 0.3, value_parser = parse_cache_threshold)]
    pub prefix_cache_threshold: f64,
    /// `prefix-aware` steps: load is unbalanced, and a prompt goes least-loaded whatever it
    /// matches, when the most loaded eligible agent carries more than this many requests over
    /// the least loaded (`--balance-abs-threshold`)...
    #[arg(
        long,
        env = "HIVENET_ROUTER_PREFIX_BALANCE_ABS_THRESHOLD",
        default_value_t = 64
    )]
    pub prefix_balance_abs_threshold: u32,
    /// ...and more than this many times its load (`--balance-rel-threshold`; at least 1).
    #[arg(long, env = "HIVENET_ROUTER_PREFIX_BALANCE_REL_THRESHOLD", default_value_t = 1.5, value_parser = parse_balance_rel_threshold)]
    pub prefix_balance_rel_threshold: f64,
    /// `prefix-aware` steps: prompt blocks (256 bytes each) indexed per agent and model, the
    /// least recently routed evicted first; about 80 bytes of memory each.
    #[arg(long, env = "HIVENET_ROUTER_PREFIX_INDEX_BLOCKS", default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefix_index_blocks: u32,
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
    /// Longest an agent's authentication JWT may be valid for (`exp - iat`, or `exp - now` without
    /// `iat`); a longer-lived token is refused, so a captured one cannot be replayed for long.
    /// At least 5m (`hivenet-agent` signs five-minute tokens). Scope: agent gRPC `Authenticate`.
    #[arg(long, env = "HIVENET_ROUTER_AGENT_TOKEN_MAX_LIFETIME", default_value = "1h", value_parser = duration)]
    pub agent_token_max_lifetime: Duration,
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
    /// Client connections each shard keeps open at once; one more is answered `503` and closed.
    #[arg(
        long,
        env = "HIVENET_ROUTER_MAX_CLIENT_CONNECTIONS",
        default_value_t = 10_000
    )]
    pub max_client_connections: usize,
    /// Request-body bytes each shard holds while bodies arrive; a body that would pass it is
    /// answered `503 queue_full` and its connection closed (bodies are also refused before they
    /// are read when the request's credentials are refused).
    #[arg(long, env = "HIVENET_ROUTER_MAX_BUFFERED_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_buffered_body_bytes: usize,
    /// On SIGTERM: how long requests in flight may run on before the router ends them with an
    /// error and exits. The router stops accepting and fails `/health` at once.
    #[arg(long, env = "HIVENET_ROUTER_DRAIN_TIMEOUT", default_value = "30s", value_parser = duration)]
    pub drain_timeout: Duration,
    #[command(flatten)]
    pub tracing: crate::net::telemetry::TracingArgs,
    /// Directory of the router's disk database (one redb file, `crate::router::control::disk_db`). Used with
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
    /// Global routing-policy YAML. Invalid: start-up fails. Reloaded on SIGHUP and on change
    /// unless `--policy-model-dir` is set (then the directory is reloaded instead). Without
    /// either, the built-in `least-loaded` policy applies.
    #[arg(long, env = "HIVENET_ROUTER_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,
    /// Directory of per-model policies (`*.yaml`, `*.yml`); its `_default.yaml` is the global
    /// policy and wins over `--policy-file`. Reloaded on SIGHUP and on change.
    #[arg(long, env = "HIVENET_ROUTER_POLICY_MODEL_DIR")]
    pub policy_model_dir: Option<PathBuf>,
    /// Failed forwards allowed per policy step whose `max_tries` is 0, negative or omitted. At
    /// least 1.
    #[arg(long, env = "HIVENET_ROUTER_MAX_TRIES_PER_STEP", default_value_t = 3)]
    pub max_tries_per_step: i64,
    /// Hold at zero: how long a request for a model asleep here is held when its sibling-map
    /// placement sets no `hold_budget`. Greater than 0.
    #[arg(long, default_value = "5m", value_parser = duration, allow_hyphen_values = true)]
    pub wake_hold_budget: Duration,
    /// Hold at zero: requests held per model. At least 1.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    pub wake_hold_max: i64,
    /// Hold at zero: requests held per API key and model (requests without a key have only the
    /// other limits). At least 1.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true)]
    pub wake_hold_max_per_key: i64,
    /// Hold at zero: requests held in total, across all models (each keeps its body in memory).
    /// At least 1.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    pub wake_hold_max_total: i64,
    /// Hold at zero: the interval of keepalive bytes to a held client; the first one commits
    /// `200`. `0`: no keepalives (plain status codes).
    #[arg(long, default_value = "15s", value_parser = duration, allow_hyphen_values = true)]
    pub wake_keepalive: Duration,
    /// Admission: how often each shard's reaper looks for occupancy reservations whose release
    /// was lost (and drops occupancy state idle for 15 minutes). Greater than 0. Scope: every
    /// model's pool on every shard.
    #[arg(long, env = "HIVENET_ROUTER_ADMISSION_REAP_INTERVAL", default_value = "5m", value_parser = duration)]
    pub admission_reap_interval: Duration,
    /// Admission: a reservation untouched this long (not grown by its stream, whose reservation
    /// is refreshed every 16 output events, nor trued up) lost its release, and the reaper gives
    /// its tokens back (`hivenet_admission_reaped_total`). Greater than 0. A value below
    /// `--request-timeout` can reap a live non-streamed request, which nothing refreshes (a
    /// warning says so at start-up). Scope: every model's pool on every shard.
    #[arg(long, env = "HIVENET_ROUTER_ADMISSION_REAP_AFTER", default_value = "30m", value_parser = duration)]
    pub admission_reap_after: Duration,
    /// This site's ID in the sibling map. Turns cross-site redirect (and hold at zero) on; needs
    /// `--redirect-secret-file`, `--redirect-allowed-domains`, and dynamic API keys or auth mode
    /// `none`.
    #[arg(long)]
    pub site_id: Option<String>,
    /// Secrets that sign and verify redirect tokens, one per line: the first signs, all verify
    /// (add the new secret first, remove the old one later).
    #[arg(long)]
    pub redirect_secret_file: Option<PathBuf>,
    /// Domains sibling sites may be under (comma-separated): a pushed map whose site URL is
    /// elsewhere is refused.
    #[arg(long, value_delimiter = ',')]
    pub redirect_allowed_domains: Vec<String>,
    /// Several routers of one site sharing limits (`--sync-*`, `--router-id`).
    #[command(flatten)]
    pub sync: crate::router::config::sync::SyncArgs,
}

impl RouterArgs {
    /// `--policy-file`, treating an empty value (an empty environment variable) as unset.
    pub fn policy_file(&self) -> Option<&std::path::Path> {
        self.policy_file
            .as_deref()
            .filter(|path| !path.as_os_str().is_empty())
    }

    /// `--policy-model-dir`, treating an empty value as unset.
    pub fn policy_model_dir(&self) -> Option<&std::path::Path> {
        self.policy_model_dir
            .as_deref()
            .filter(|path| !path.as_os_str().is_empty())
    }

    /// `--advertise-grpc-addr` as agents dial it; `None` when empty (not advertised).
    pub fn advertise_grpc_addr(&self) -> anyhow::Result<Option<String>> {
        advertise_grpc_addr(&self.advertise_grpc_addr)
    }

    /// The hold-at-zero flags, refused when a budget or limit is not greater than 0.
    pub fn hold_settings(&self) -> anyhow::Result<crate::logic::hold::HoldSettings> {
        crate::logic::hold::HoldSettings::new(
            self.wake_hold_budget,
            self.wake_hold_max,
            self.wake_hold_max_per_key,
            self.wake_hold_max_total,
            self.wake_keepalive,
        )
        .map_err(|error| anyhow::anyhow!(error))
    }

    /// `--admission-reap-interval` and `--admission-reap-after`, refused when zero (a zero
    /// interval would spin the reaper; a zero age would reap every reservation at once) or when
    /// the age does not fit the pool's millisecond clock.
    pub fn admission_reaper(&self) -> anyhow::Result<ReaperSettings> {
        anyhow::ensure!(
            !self.admission_reap_interval.is_zero(),
            "--admission-reap-interval must be greater than 0"
        );
        anyhow::ensure!(
            !self.admission_reap_after.is_zero(),
            "--admission-reap-after must be greater than 0"
        );
        let after_ms = u64::try_from(self.admission_reap_after.as_millis()).map_err(|_| {
            anyhow::anyhow!(
                "--admission-reap-after is too large, got {:?}",
                self.admission_reap_after
            )
        })?;
        if self.admission_reap_after < self.request_timeout {
            tracing::warn!(
                reap_after = ?self.admission_reap_after,
                request_timeout = ?self.request_timeout,
                "--admission-reap-after is below --request-timeout: a non-streamed request that runs longer than it can lose its reservation to the reaper"
            );
        }
        Ok(ReaperSettings {
            interval: self.admission_reap_interval,
            after_ms,
        })
    }

    /// `--max-tries-per-step`, refused below 1 (configuration reference, "Router validation").
    pub fn max_tries_per_step(&self) -> anyhow::Result<u32> {
        match u32::try_from(self.max_tries_per_step) {
            Ok(tries) if tries >= 1 => Ok(tries),
            _ => anyhow::bail!(
                "--max-tries-per-step must be between 1 and {}, got {}",
                u32::MAX,
                self.max_tries_per_step
            ),
        }
    }
}

/// The occupancy reaper, as start-up validated it (`--admission-reap-interval`,
/// `--admission-reap-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaperSettings {
    /// How often each shard runs the reaper.
    pub interval: Duration,
    /// A reservation untouched this many milliseconds is reaped.
    pub after_ms: u64,
}

/// Cross-site redirect, as start-up validated it (`--site-id` and its companions).
#[derive(Debug)]
pub struct RedirectSite {
    /// `--site-id`: this site in the sibling map.
    pub id: String,
    /// `--redirect-secret-file`: the first signs redirect tokens, all verify.
    pub secrets: crate::logic::sibling::token::RedirectSecrets,
    /// `--redirect-allowed-domains`.
    pub allowed_domains: Vec<String>,
}

impl RouterArgs {
    /// `--site-id` and what it needs; `None` when cross-site redirect is off. Refuses to start,
    /// naming what is missing: the secret file, the allowed domains, or a key mode whose keys
    /// every site knows (dynamic keys, pushed to every site, or `none`).
    pub fn redirect_site(
        &self,
        api_mode: crate::logic::auth::config::ApiMode,
    ) -> anyhow::Result<Option<RedirectSite>> {
        use crate::logic::auth::config::ApiMode;
        let Some(id) = self.site_id.as_deref().map(str::trim) else {
            if self.redirect_secret_file.is_some() || !self.redirect_allowed_domains.is_empty() {
                tracing::warn!(
                    "--redirect-secret-file and --redirect-allowed-domains have no effect without --site-id"
                );
            }
            return Ok(None);
        };
        anyhow::ensure!(
            !id.is_empty()
                && id.len() <= 128
                && id
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || b"._-".contains(&byte)),
            "--site-id must be 1 to 128 characters of letters, digits, '.', '_' and '-', got {id:?}"
        );
        let Some(path) = &self.redirect_secret_file else {
            anyhow::bail!(
                "--site-id needs --redirect-secret-file (the secrets that sign redirect tokens)"
            );
        };
        let text = std::fs::read_to_string(path).map_err(|error| {
            anyhow::anyhow!("--redirect-secret-file {}: {error}", path.display())
        })?;
        let secrets =
            crate::logic::sibling::token::RedirectSecrets::parse(&text).map_err(|error| {
                anyhow::anyhow!("--redirect-secret-file {}: {error}", path.display())
            })?;
        let allowed_domains: Vec<String> = self
            .redirect_allowed_domains
            .iter()
            .map(|domain| domain.trim().trim_start_matches('.').to_ascii_lowercase())
            .filter(|domain| !domain.is_empty())
            .collect();
        anyhow::ensure!(
            !allowed_domains.is_empty(),
            "--site-id needs --redirect-allowed-domains (the domains sibling sites may be under)"
        );
        anyhow::ensure!(
            matches!(api_mode, ApiMode::Dynamic | ApiMode::None),
            "--site-id needs dynamic API keys (api.mode: dynamic) or auth mode none: a redirected request is authenticated by its key's registry id, which only dynamic keys share across sites"
        );
        Ok(Some(RedirectSite {
            id: id.to_owned(),
            secrets,
            allowed_domains,
        }))
    }
}

/// Settings read only from the environment, as the reference documents them.
#[derive(Debug, Clone)]
pub struct EnvSettings {
    /// Largest `/v1/*` request body in bytes; `None` when `HIVENET_ROUTER_MAX_REQUEST_BYTES=0`.
    pub max_request_bytes: Option<usize>,
    /// `HIVENET_ROUTER_RPM_BURST_SECONDS` (`0`: a full minute of burst; `1`-`59`: that many
    /// seconds of the rate).
    pub rpm_burst: crate::logic::limits::BurstSeconds,
    /// `HIVENET_ROUTER_ADMIT_FRACTION`: share of a policy's `admit_budget_tokens` available to
    /// B2 occupancy admission, in (0, 1]; default [`DEFAULT_ADMIT_FRACTION`]. Scope: every model.
    pub admit_fraction: f64,
    /// `HIVENET_ROUTER_ADMIT_PARK_TIMEOUT`: longest an over-budget request waits for occupancy
    /// to free before `429 concurrency_limit_exceeded`; zero rejects at once; default
    /// [`DEFAULT_ADMIT_PARK_TIMEOUT`].
    pub admit_park_timeout: Duration,
    /// Which provider-fallback credentials are set (`HIVENET_ROUTER_OPENAI_API_KEY`,
    /// `HIVENET_ROUTER_ANTHROPIC_API_KEY`); a policy naming a provider without its key is refused.
    pub provider_keys: crate::logic::policy::ProviderKeys,
    /// `HIVENET_ROUTER_QUOTA_BACKEND`.
    pub quota_backend: QuotaBackend,
}

pub const DEFAULT_MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024;
/// Seed "B2: pool occupancy".
pub const DEFAULT_ADMIT_FRACTION: f64 = 0.90;
/// Seed "B2: pool occupancy".
pub const DEFAULT_ADMIT_PARK_TIMEOUT: Duration = Duration::from_millis(250);

/// `HIVENET_ROUTER_ADMIT_FRACTION`: a number greater than 0 and at most 1.
pub fn parse_admit_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        // Written so that NaN fails too.
        Ok(fraction) if fraction > 0.0 && fraction <= 1.0 => Ok(fraction),
        Ok(fraction) => Err(format!(
            "HIVENET_ROUTER_ADMIT_FRACTION must be greater than 0 and at most 1, got {fraction}"
        )),
        Err(_) => Err(format!(
            "HIVENET_ROUTER_ADMIT_FRACTION must be a number in (0, 1], got {text:?}"
        )),
    }
}

/// `--prefix-cache-threshold`: a fraction, 0 to 1.
fn parse_cache_threshold(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(fraction) if (0.0..=1.0).contains(&fraction) => Ok(fraction),
        _ => Err(format!("a fraction from 0 to 1, got {text:?}")),
    }
}

/// `--prefix-balance-rel-threshold`: a ratio of loads, at least 1.
fn parse_balance_rel_threshold(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(ratio) if ratio.is_finite() && ratio >= 1.0 => Ok(ratio),
        _ => Err(format!("a ratio of at least 1, got {text:?}")),
    }
}

/// `HIVENET_ROUTER_ADMIT_PARK_TIMEOUT`: a Go duration (`250ms`, `1s`), `0` for none.
pub fn parse_admit_park_timeout(text: &str) -> Result<Duration, String> {
    crate::base::duration::parse(text)
        .map_err(|error| format!("HIVENET_ROUTER_ADMIT_PARK_TIMEOUT: {error}"))
}

/// The configuration reference: "invalid values ... leave the default unchanged". The router
/// still says so in its log, since a silently ignored setting is hard to diagnose.
fn or_default_with_warning<T: std::fmt::Debug>(
    name: &str,
    parsed: Option<Result<T, String>>,
    default: T,
) -> T {
    match parsed {
        None => default,
        Some(Ok(value)) => value,
        Some(Err(error)) => {
            tracing::warn!(%error, default = ?default, "{name} ignored; using the default");
            default
        }
    }
}

fn env_is_set(name: &str) -> bool {
    std::env::var(name).is_ok_and(|value| !value.trim().is_empty())
}

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
            Err(_) => crate::logic::limits::BurstSeconds::default(),
            Ok(text) => crate::logic::limits::BurstSeconds::parse(&text)
                .map_err(|error| anyhow::anyhow!("{error}"))?,
        };
        let admit_fraction = or_default_with_warning(
            "HIVENET_ROUTER_ADMIT_FRACTION",
            std::env::var("HIVENET_ROUTER_ADMIT_FRACTION")
                .ok()
                .map(|text| parse_admit_fraction(&text)),
            DEFAULT_ADMIT_FRACTION,
        );
        let admit_park_timeout = or_default_with_warning(
            "HIVENET_ROUTER_ADMIT_PARK_TIMEOUT",
            std::env::var("HIVENET_ROUTER_ADMIT_PARK_TIMEOUT")
                .ok()
                .map(|text| parse_admit_park_timeout(&text)),
            DEFAULT_ADMIT_PARK_TIMEOUT,
        );
        let provider_keys = crate::logic::policy::ProviderKeys {
            openai: env_is_set("HIVENET_ROUTER_OPENAI_API_KEY"),
            anthropic: env_is_set("HIVENET_ROUTER_ANTHROPIC_API_KEY"),
        };
        Ok(EnvSettings {
            max_request_bytes,
            rpm_burst,
            admit_fraction,
            admit_park_timeout,
            provider_keys,
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

/// Checks an `--advertise-grpc-addr`: `host:port` (`[v6]:port` for an IPv6 address) with a host
/// agents can dial — a DNS name or a specified IP, never `0.0.0.0`, `::` or none (a listen
/// address) — and a numeric port from 1 to 65535. Empty: `None`.
pub fn advertise_grpc_addr(text: &str) -> anyhow::Result<Option<String>> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let refuse = |reason: &str| {
        anyhow::anyhow!(
            "--advertise-grpc-addr {text:?} must be host:port with a host agents can dial and a numeric port: {reason}"
        )
    };
    if text.contains('/') {
        return Err(refuse("give host:port, without a scheme or path"));
    }
    let port = if let Some(rest) = text.strip_prefix('[') {
        let (host, port) = rest
            .split_once("]:")
            .ok_or_else(|| refuse("an IPv6 address is written [address]:port"))?;
        let ip: std::net::Ipv6Addr = host
            .parse()
            .map_err(|_| refuse("the bracketed host is not an IPv6 address"))?;
        if ip.is_unspecified() {
            return Err(refuse("[::] is a listen address, not one agents can dial"));
        }
        port
    } else {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| refuse("the port is missing"))?;
        if host.is_empty() {
            return Err(refuse("the host is missing (:PORT is a listen address)"));
        }
        if host.contains(':') {
            return Err(refuse("an IPv6 address is written [address]:port"));
        }
        match host.parse::<IpAddr>() {
            Ok(ip) if ip.is_unspecified() => {
                return Err(refuse(
                    "0.0.0.0 is a listen address, not one agents can dial",
                ));
            }
            Ok(_) => {}
            Err(_) => {
                let name_ok = host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
                if !name_ok || host.starts_with(['-', '.']) || host.ends_with('-') {
                    return Err(refuse("the host is not a DNS name or an IP address"));
                }
            }
        }
        port
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse("the port is not a number"));
    }
    match port.parse::<u16>() {
        Ok(port) if port > 0 => Ok(Some(text.to_owned())),
        _ => Err(refuse("the port is not between 1 and 65535")),
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
    fn prefix_thresholds_take_a_fraction_and_a_ratio_of_at_least_one() {
        assert_eq!(parse_cache_threshold("0.3"), Ok(0.3));
        assert_eq!(parse_cache_threshold("0"), Ok(0.0));
        assert_eq!(parse_cache_threshold("1"), Ok(1.0));
        for bad in ["1.5", "-0.1", "NaN", "x"] {
            assert!(parse_cache_threshold(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_balance_rel_threshold("1.5"), Ok(1.5));
        for bad in ["0.9", "inf", "NaN", ""] {
            assert!(parse_balance_rel_threshold(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn advertise_grpc_addr_takes_a_dialable_host_and_a_numeric_port() {
        for good in [
            "router-0.router-headless:50051",
            "10.0.0.7:50051",
            "127.0.0.1:1",
            "[fd00::7]:50051",
            "localhost:65535",
        ] {
            assert_eq!(advertise_grpc_addr(good).unwrap().as_deref(), Some(good));
        }
        assert_eq!(advertise_grpc_addr("").unwrap(), None);
        assert_eq!(advertise_grpc_addr("  ").unwrap(), None);
        for (bad, reason) in [
            (":50051", "listen address"),
            ("0.0.0.0:50051", "listen address"),
            ("[::]:50051", "listen address"),
            ("router-0", "port is missing"),
            ("router-0:grpc", "not a number"),
            ("router-0:0", "between 1 and 65535"),
            ("router-0:70000", "between 1 and 65535"),
            ("router-0:", "not a number"),
            ("http://router-0:50051", "without a scheme"),
            ("fd00::7:50051", "[address]:port"),
            ("bad host:50051", "not a DNS name"),
        ] {
            let error = advertise_grpc_addr(bad).unwrap_err().to_string();
            assert!(error.contains("--advertise-grpc-addr"), "{error}");
            assert!(error.contains(reason), "{bad}: {error}");
        }
    }

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
    fn admit_fraction_is_in_zero_to_one() {
        assert_eq!(parse_admit_fraction("0.5"), Ok(0.5));
        assert_eq!(parse_admit_fraction(" 1 "), Ok(1.0));
        for bad in ["0", "-0.1", "1.01", "NaN", "inf", "ninety", ""] {
            assert!(parse_admit_fraction(bad).is_err(), "{bad:?}");
        }
        // Invalid values leave the default.
        assert_eq!(
            or_default_with_warning(
                "HIVENET_ROUTER_ADMIT_FRACTION",
                Some(parse_admit_fraction("2")),
                DEFAULT_ADMIT_FRACTION
            ),
            0.90
        );
        assert_eq!(
            or_default_with_warning("X", None, DEFAULT_ADMIT_FRACTION),
            0.90
        );
    }

    #[test]
    fn admit_park_timeout_is_a_go_duration() {
        assert_eq!(
            parse_admit_park_timeout("250ms"),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(parse_admit_park_timeout("0"), Ok(Duration::ZERO));
        assert_eq!(
            parse_admit_park_timeout("1.5s"),
            Ok(Duration::from_millis(1500))
        );
        for bad in ["-1s", "250", "soon"] {
            assert!(parse_admit_park_timeout(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            or_default_with_warning(
                "HIVENET_ROUTER_ADMIT_PARK_TIMEOUT",
                Some(parse_admit_park_timeout("-1s")),
                DEFAULT_ADMIT_PARK_TIMEOUT
            ),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn max_tries_per_step_is_at_least_one() {
        let args = |tries: &str| {
            RouterArgs::try_parse_from(["hivenet-router", &format!("--max-tries-per-step={tries}")])
                .unwrap()
        };
        assert_eq!(args("3").max_tries_per_step().unwrap(), 3);
        assert!(args("0").max_tries_per_step().is_err());
        assert!(args("-1").max_tries_per_step().is_err());
        let defaults = RouterArgs::try_parse_from(["hivenet-router"]).unwrap();
        assert_eq!(defaults.max_tries_per_step().unwrap(), 3);
        assert_eq!(defaults.policy_file(), None);
    }

    #[test]
    fn hold_flags_have_the_seed_defaults_and_refuse_bad_values() {
        let defaults = RouterArgs::try_parse_from(["hivenet-router"]).unwrap();
        let hold = defaults.hold_settings().unwrap();
        assert_eq!(hold, crate::logic::hold::HoldSettings::default());
        let parse = |flag: &str, value: &str| {
            RouterArgs::try_parse_from(["hivenet-router", flag, value])
                .map_err(|error| error.to_string())
                .and_then(|args| args.hold_settings().map_err(|error| error.to_string()))
        };
        assert_eq!(
            parse("--wake-keepalive", "0").unwrap().keepalive,
            Duration::ZERO
        );
        assert!(
            parse("--wake-keepalive", "-1s")
                .unwrap_err()
                .contains("negative")
        );
        assert!(parse("--wake-hold-budget", "0").is_err());
        assert!(
            parse("--wake-hold-max", "-3")
                .unwrap_err()
                .contains("--wake-hold-max must be")
        );
        assert!(parse("--wake-hold-max-per-key", "0").is_err());
        assert!(parse("--wake-hold-max-total", "0").is_err());
    }

    #[test]
    fn reaper_flags_default_to_the_seed_and_refuse_zero() {
        let defaults = RouterArgs::try_parse_from(["hivenet-router"]).unwrap();
        let reaper = defaults.admission_reaper().unwrap();
        assert_eq!(reaper.interval, Duration::from_secs(300));
        assert_eq!(
            reaper.after_ms,
            crate::router::shard::state::RESERVATION_REAP_MS
        );
        assert_eq!(reaper.after_ms, 30 * 60 * 1000);
        let parse = |args: &[&str]| {
            let mut all = vec!["hivenet-router"];
            all.extend_from_slice(args);
            RouterArgs::try_parse_from(all)
                .map_err(|error| error.to_string())
                .and_then(|args| args.admission_reaper().map_err(|error| error.to_string()))
        };
        assert_eq!(
            parse(&[
                "--admission-reap-interval",
                "1s",
                "--admission-reap-after",
                "2.5s"
            ]),
            Ok(ReaperSettings {
                interval: Duration::from_secs(1),
                after_ms: 2500
            })
        );
        assert!(
            parse(&["--admission-reap-interval", "0"])
                .unwrap_err()
                .contains("--admission-reap-interval must be greater than 0")
        );
        assert!(
            parse(&["--admission-reap-after", "0"])
                .unwrap_err()
                .contains("--admission-reap-after must be greater than 0")
        );
        assert!(parse(&["--admission-reap-after", "-1s"]).is_err());
        assert!(parse(&["--admission-reap-interval", "soon"]).is_err());
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
