//! The `--sync-*` flags (seed `run-several-routers.md`, "Configure the routers"), with their
//! environment variables and defaults exactly as the seed's table gives them, and their checks.

use std::path::PathBuf;
use std::time::Duration;

use crate::base::duration::parse_arg as duration;

/// `--sync-interval` bounds.
pub const INTERVAL_MIN: Duration = Duration::from_millis(100);
pub const INTERVAL_MAX: Duration = Duration::from_secs(10);
/// The longest `--sync-site`.
const SITE_MAX: usize = 64;

#[derive(Debug, Clone, clap::Args)]
pub struct SyncArgs {
    /// `none` (every router enforces every limit alone) or `valkey` (the routers of a site share
    /// limits through Valkey).
    #[arg(long, env = "HIVENET_ROUTER_SYNC_STORE", default_value = "none")]
    pub sync_store: String,
    /// Comma-separated host:port of the Sentinels, or of one Valkey without Sentinel.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_VALKEY_ADDRS", default_value = "")]
    pub sync_valkey_addrs: String,
    /// Sentinel master set name; empty connects to Valkey directly.
    #[arg(
        long,
        env = "HIVENET_ROUTER_SYNC_VALKEY_SENTINEL_MASTER",
        default_value = ""
    )]
    pub sync_valkey_sentinel_master: String,
    /// Name of the site in the store (the same on every router of the site); defaults to
    /// `--site-id`, else `default`.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_SITE")]
    pub sync_site: Option<String>,
    /// File holding the password for Valkey and Sentinel. The environment variable
    /// `HIVENET_ROUTER_SYNC_VALKEY_PASSWORD` holds the password itself.
    #[arg(long)]
    pub sync_valkey_password_file: Option<PathBuf>,
    /// The Valkey ACL user the router logs in as, with the password (empty: `default`). The
    /// Sentinels are reached with the password alone. The user needs the commands the sync
    /// runs on the keys `hivenet:{site}:*`; the router checks them at start
    /// (`docs/several-routers.md`, "Store permissions").
    #[arg(long, env = "HIVENET_ROUTER_SYNC_VALKEY_USERNAME")]
    pub sync_valkey_username: Option<String>,
    /// Connect to Valkey and the Sentinels with TLS.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_VALKEY_TLS", default_value_t = false)]
    pub sync_valkey_tls: bool,
    /// PEM CA bundle that verifies Valkey and the Sentinels; empty uses the system roots.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_VALKEY_TLS_CA_FILE")]
    pub sync_valkey_tls_ca_file: Option<PathBuf>,
    /// Between 100ms and 10s.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_INTERVAL", default_value = "1s", value_parser = duration)]
    pub sync_interval: Duration,
    /// Routers of the site assumed while the store is unreachable or before it first answers.
    /// Set it to the number of routers you run.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_MIN_ROUTERS", default_value_t = 1)]
    pub sync_min_routers: u32,
    /// Stable identity of this router; defaults to the hostname.
    #[arg(long, env = "HIVENET_ROUTER_ROUTER_ID")]
    pub router_id: Option<String>,
    /// File that keeps the usage this router holds back while the store does not answer, so
    /// that a crash or a shutdown before the store is back does not lose it: the next run under
    /// the same `--router-id` publishes it. Put it on a volume that outlives the process (in
    /// Kubernetes an `emptyDir` outlives container restarts). Unset: no journal.
    #[arg(long, env = "HIVENET_ROUTER_SYNC_JOURNAL")]
    pub sync_journal: Option<PathBuf>,
}

/// Where the store is and how to reach it.
#[derive(Clone)]
pub struct StoreSettings {
    /// host:port of the Sentinels, or of the one Valkey.
    pub addrs: Vec<(String, u16)>,
    /// `Some`: ask these Sentinels for this master set's primary.
    pub sentinel_master: Option<String>,
    /// `--sync-valkey-username`: the ACL user on Valkey (`None`: `default`).
    pub username: Option<String>,
    pub password: Option<String>,
    pub tls: bool,
    /// PEM bytes of the CA bundle (`None`: the system roots).
    pub tls_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("addrs", &self.addrs)
            .field("sentinel_master", &self.sentinel_master)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("tls_ca", &self.tls_ca.as_ref().map(Vec::len))
            .finish()
    }
}

/// The sync settings, checked.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    pub store: StoreSettings,
    pub site: String,
    pub router_id: String,
    pub interval: Duration,
    pub min_routers: u32,
    /// `--advertise-grpc-addr`, published with the heartbeat for agents' discovery.
    pub advertise_grpc_addr: Option<String>,
    /// `--request-timeout`: the longest a request a router admitted alone may still run, part of
    /// the settle window after the store lost its data ([`SyncSettings::settle_window`]).
    pub request_timeout: Duration,
    /// `--sync-journal` (`sync::journal`).
    pub journal: Option<PathBuf>,
}

impl SyncSettings {
    /// The settle window after the store lost its data (and for a site's first deployment):
    /// the request timeout plus ten sync intervals plus 5 s (seed, "When the store is
    /// unreachable").
    pub fn settle_window(&self) -> Duration {
        self.request_timeout + self.interval * 10 + Duration::from_secs(5)
    }

    /// `None` with `--sync-store none`. `site_id`: `--site-id`; `quota_backend_badger`: the
    /// disk database is on (refused together with a shared store, which keeps today's totals);
    /// `password_env`: `HIVENET_ROUTER_SYNC_VALKEY_PASSWORD`.
    pub fn from_args(
        args: &SyncArgs,
        site_id: Option<&str>,
        quota_backend_badger: bool,
        password_env: Option<String>,
        advertise_grpc_addr: Option<String>,
    ) -> anyhow::Result<Option<SyncSettings>> {
        match args.sync_store.trim() {
            "" | "none" => return Ok(None),
            "valkey" => {}
            other => anyhow::bail!("--sync-store must be none or valkey, got {other:?}"),
        }
        anyhow::ensure!(
            !quota_backend_badger,
            "--sync-store valkey replaces HIVENET_ROUTER_QUOTA_BACKEND=badger (the store keeps today's totals): set one of them"
        );
        anyhow::ensure!(
            (INTERVAL_MIN..=INTERVAL_MAX).contains(&args.sync_interval),
            "--sync-interval must be between 100ms and 10s, got {:?}",
            args.sync_interval
        );
        anyhow::ensure!(
            args.sync_min_routers >= 1,
            "--sync-min-routers must be at least 1"
        );
        let addrs = parse_addrs(&args.sync_valkey_addrs)?;
        let site = match args.sync_site.as_deref().map(str::trim) {
            Some(site) if !site.is_empty() => site.to_owned(),
            _ => site_id
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .unwrap_or("default")
                .to_owned(),
        };
        check_site(&site)?;
        let router_id = match args.router_id.as_deref().map(str::trim) {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => hostname()?,
        };
        check_router_id(&router_id)?;
        let password = match &args.sync_valkey_password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|error| {
                    anyhow::anyhow!("--sync-valkey-password-file {}: {error}", path.display())
                })?;
                Some(text.trim_end_matches(['\r', '\n']).to_owned())
            }
            None => password_env.filter(|password| !password.is_empty()),
        };
        let tls_ca = match &args.sync_valkey_tls_ca_file {
            Some(path) if !path.as_os_str().is_empty() => {
                anyhow::ensure!(
                    args.sync_valkey_tls,
                    "--sync-valkey-tls-ca-file needs --sync-valkey-tls"
                );
                Some(std::fs::read(path).map_err(|error| {
                    anyhow::anyhow!("--sync-valkey-tls-ca-file {}: {error}", path.display())
                })?)
            }
            _ => None,
        };
        let sentinel_master = Some(args.sync_valkey_sentinel_master.trim())
            .filter(|name| !name.is_empty())
            .map(str::to_owned);
        if sentinel_master.is_none() {
            anyhow::ensure!(
                addrs.len() == 1,
                "--sync-valkey-addrs lists {} addresses but --sync-valkey-sentinel-master is empty: give one Valkey address, or the Sentinels and the master set name",
                addrs.len()
            );
        }
        if args.sync_min_routers == 1 {
            tracing::warn!(
                "--sync-min-routers is 1: routers that start while the store is unreachable each enforce the whole of every limit; set it to the number of routers of the site"
            );
        }
        Ok(Some(SyncSettings {
            store: StoreSettings {
                addrs,
                sentinel_master,
                username: args
                    .sync_valkey_username
                    .as_deref()
                    .map(str::trim)
                    .filter(|user| !user.is_empty())
                    .map(str::to_owned),
                password,
                tls: args.sync_valkey_tls,
                tls_ca,
            },
            site,
            router_id,
            interval: args.sync_interval,
            min_routers: args.sync_min_routers,
            advertise_grpc_addr,
            // The flag's default; the router sets its own (`--request-timeout` is not a sync flag).
            request_timeout: Duration::from_secs(60),
            journal: args
                .sync_journal
                .clone()
                .filter(|path| !path.as_os_str().is_empty()),
        }))
    }
}

fn parse_addrs(text: &str) -> anyhow::Result<Vec<(String, u16)>> {
    let addrs: Vec<(String, u16)> = text
        .split(',')
        .map(str::trim)
        .filter(|addr| !addr.is_empty())
        .map(|addr| {
            let (host, port) = addr
                .rsplit_once(':')
                .ok_or_else(|| anyhow::anyhow!("--sync-valkey-addrs: {addr:?} is not host:port"))?;
            let port: u16 = port.parse().map_err(|_| {
                anyhow::anyhow!("--sync-valkey-addrs: {addr:?} has no numeric port")
            })?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            anyhow::ensure!(
                !host.is_empty(),
                "--sync-valkey-addrs: {addr:?} has no host"
            );
            Ok((host.to_owned(), port))
        })
        .collect::<anyhow::Result<_>>()?;
    anyhow::ensure!(
        !addrs.is_empty(),
        "--sync-store valkey needs --sync-valkey-addrs"
    );
    Ok(addrs)
}

/// Up to 64 letters, digits, `.`, `_` or `-` (it is part of every key, as a hash tag).
fn check_site(site: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !site.is_empty()
            && site.len() <= SITE_MAX
            && site
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')),
        "--sync-site must be 1 to 64 letters, digits, '.', '_' or '-', got {site:?}"
    );
    Ok(())
}

/// A router ID names a field of the store's keys: printable, no separator (`|`), bounded.
fn check_router_id(id: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        id.len() <= 253
            && id
                .bytes()
                .all(|byte| byte.is_ascii_graphic() && byte != b'|'),
        "--router-id must be up to 253 printable characters without '|' or spaces, got {id:?}"
    );
    Ok(())
}

fn hostname() -> anyhow::Result<String> {
    if let Ok(name) = std::env::var("HOSTNAME")
        && !name.trim().is_empty()
    {
        return Ok(name.trim().to_owned());
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map_err(|error| {
            anyhow::anyhow!("--router-id is not set and the hostname cannot be read: {error}")
        })?;
    Ok(name.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sync: SyncArgs,
    }

    fn settings(args: &[&str]) -> anyhow::Result<Option<SyncSettings>> {
        let cli = Cli::try_parse_from(std::iter::once("router").chain(args.iter().copied()))?;
        SyncSettings::from_args(&cli.sync, None, false, None, None)
    }

    #[test]
    fn none_is_the_default() {
        assert!(settings(&[]).unwrap().is_none());
    }

    #[test]
    fn one_valkey_without_sentinel() {
        let sync = settings(&[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            "127.0.0.1:6379",
            "--router-id",
            "router-0",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(sync.store.addrs, [("127.0.0.1".to_owned(), 6379)]);
        assert_eq!(sync.site, "default");
        assert_eq!(sync.router_id, "router-0");
        assert_eq!(sync.interval, Duration::from_secs(1));
        assert_eq!(sync.min_routers, 1);
    }

    #[test]
    fn refused_settings_say_why() {
        let base = ["--sync-store", "valkey", "--router-id", "r"];
        let refused = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            settings(&args).unwrap_err().to_string()
        };
        assert!(refused(&[]).contains("--sync-valkey-addrs"));
        assert!(refused(&["--sync-valkey-addrs", "a:1,b:2"]).contains("sentinel-master"));
        assert!(refused(&["--sync-valkey-addrs", "a"]).contains("host:port"));
        assert!(
            refused(&["--sync-valkey-addrs", "a:1", "--sync-interval", "50ms"])
                .contains("--sync-interval")
        );
        assert!(
            refused(&["--sync-valkey-addrs", "a:1", "--sync-interval", "11s"])
                .contains("--sync-interval")
        );
        assert!(
            refused(&["--sync-valkey-addrs", "a:1", "--sync-site", "bad site"])
                .contains("--sync-site")
        );
        assert!(
            refused(&["--sync-valkey-addrs", "a:1", "--sync-min-routers", "0"])
                .contains("--sync-min-routers")
        );
        let cli = Cli::try_parse_from([
            "router",
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            "a:1",
        ])
        .unwrap();
        let error = SyncSettings::from_args(&cli.sync, None, true, None, None).unwrap_err();
        assert!(error.to_string().contains("badger"), "{error}");
    }

    #[test]
    fn the_site_defaults_to_the_site_id_and_the_password_to_the_environment() {
        let cli = Cli::try_parse_from([
            "router",
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            "s0:26379,s1:26379,s2:26379",
            "--sync-valkey-sentinel-master",
            "hivenet",
            "--router-id",
            "router-1",
        ])
        .unwrap();
        let sync = SyncSettings::from_args(
            &cli.sync,
            Some("site-a"),
            false,
            Some("secret".into()),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(sync.site, "site-a");
        assert_eq!(sync.store.sentinel_master.as_deref(), Some("hivenet"));
        assert_eq!(sync.store.addrs.len(), 3);
        assert_eq!(sync.store.password.as_deref(), Some("secret"));
        assert!(!format!("{:?}", sync.store).contains("secret"));
    }
}
