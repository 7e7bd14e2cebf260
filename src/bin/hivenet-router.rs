//! `hivenet-router`: starts the control core, then one shard per core, and runs until SIGTERM or
//! SIGINT.
//!
//! With `HIVENET_ROUTER_QUOTA_BACKEND=badger`, start-up opens the disk database (refusing to start
//! when it cannot be written), hands each shard today's totals of the tenants it owns before the
//! shard accepts, and the control core flushes changed totals every second and once more at
//! SIGTERM/SIGINT before the process exits.

/// mimalloc: the request path allocates small, short-lived buffers on every core; glibc malloc
/// measured several percent of CPU per request under load. The `system-allocator` feature keeps
/// the system's instead, for heap profilers that cannot see mimalloc (`perf/heap-profile.sh`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

use hivenet_router::base::clock::utc_today;
use hivenet_router::base::credentials::{self, Secret};
use hivenet_router::base::identity::Identity;
use hivenet_router::logic::auth::config::ApiMode;
use hivenet_router::logic::auth::dynamic::DynamicRegistry;
use hivenet_router::logic::hold::HeldTotal;
use hivenet_router::logic::limits::Day;
use hivenet_router::logic::policy::PolicyContext;
use hivenet_router::net::telemetry::{self, SpanRing};
use hivenet_router::net::tunnel::tls::{self, TunnelSecurity};
use hivenet_router::router::audit::AuditLog;
use hivenet_router::router::config::sync::SyncSettings;
use hivenet_router::router::config::{EnvSettings, QuotaBackend, RouterArgs, listen_address};
use hivenet_router::router::control::daily_flush::DailyFlush;
use hivenet_router::router::control::disk_db::{self, DiskDb};
use hivenet_router::router::control::policies::{self, PolicyControl};
use hivenet_router::router::control::policy_reload;
use hivenet_router::router::control::registry::{HealthTimes, HistoryRecord};
use hivenet_router::router::control::{self, ControlSettings, ControlShared, auth_reload};
use hivenet_router::router::front::runtime::{self, ShardSetup};
use hivenet_router::router::metrics::ShardMetrics;
use hivenet_router::router::provider::{
    PoolSettings, ProviderEngine, ProviderPool, ProviderSettings,
};
use hivenet_router::router::shard::mesh::Mesh;
use hivenet_router::router::shard::owner::quotas::DailyRestore;
use hivenet_router::router::shard::queues::{QueueFullCounts, Queues};
use hivenet_router::router::shard::redirect_claims::SiteTokens;
use hivenet_router::router::shard::state::ShardSettings;
use hivenet_router::router::sync::SyncMetrics;
use hivenet_router::router::sync::core::SyncCore;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    hivenet_router::base::fatal::abort_on_panic("hivenet-router");
    hivenet_router::base::huge_pages::keep_off_at_start();
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == "derive-key-defaults")
    {
        let args = hivenet_router::logic::admission::derive::DeriveArgs::parse_from(
            std::env::args_os().skip(1),
        );
        match hivenet_router::logic::admission::derive::run(&args) {
            Ok(fragment) => print!("{fragment}"),
            Err(error) => {
                eprintln!("hivenet-router derive-key-defaults: {error:#}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Err(error) = run(RouterArgs::parse()) {
        eprintln!("hivenet-router: {error:#}");
        std::process::exit(1);
    }
}

/// SO_REUSEPORT would let us bind a port another process already serves and silently take half of
/// its connections; refuse instead.
fn refuse_if_served(address: SocketAddr) -> anyhow::Result<()> {
    std::net::TcpListener::bind(address)
        .map(drop)
        .with_context(|| format!("--http-port {address} is already in use"))
}

/// The open disk database and what start-up read from it (`HIVENET_ROUTER_QUOTA_BACKEND=badger`).
struct QuotaStore {
    disk_db: Arc<DiskDb>,
    /// The UTC day the totals were read for (and the database pruned for).
    today: Day,
    /// Shard `i`'s share of today's totals: the tenants it owns.
    restores: Vec<DailyRestore>,
    /// The per-agent history an earlier run kept.
    history: Vec<HistoryRecord>,
}

/// Opens the disk database and reads today's totals (`badger`); `None` with `memory` (after
/// honouring `--reset-disk-db`, which deletes the database whatever the backend).
fn open_quota_store(
    args: &RouterArgs,
    backend: QuotaBackend,
    shard_count: usize,
) -> anyhow::Result<Option<QuotaStore>> {
    if backend == QuotaBackend::Memory {
        if args.reset_disk_db {
            disk_db::reset(&args.disk_db_path)?;
            tracing::info!(path = %args.disk_db_path.display(), "disk database deleted (--reset-disk-db)");
        }
        return Ok(None);
    }
    let today = utc_today();
    let disk_db = DiskDb::open(&args.disk_db_path, args.reset_disk_db, today).with_context(|| {
        format!(
            "HIVENET_ROUTER_QUOTA_BACKEND=badger needs a writable disk database (--disk-db-path {})",
            args.disk_db_path.display()
        )
    })?;
    let records = disk_db.load_daily(today)?;
    let tenants: std::collections::HashSet<_> =
        records.iter().map(|record| record.tenant).collect();
    tracing::info!(
        path = %disk_db.path().display(),
        totals = records.len(),
        tenants = tenants.len(),
        reset = args.reset_disk_db,
        "daily token totals restored from the disk database"
    );
    let history = disk_db.load_history()?;
    tracing::info!(
        records = history.len(),
        "per-agent history restored from the disk database"
    );
    let mut restores: Vec<DailyRestore> = (0..shard_count)
        .map(|_| DailyRestore {
            day: today,
            records: Vec::new(),
        })
        .collect();
    for record in records {
        restores[record.tenant.owner(shard_count)]
            .records
            .push(record);
    }
    Ok(Some(QuotaStore {
        disk_db: Arc::new(disk_db),
        today,
        restores,
        history,
    }))
}

fn run(args: RouterArgs) -> anyhow::Result<()> {
    let env = EnvSettings::from_env()?;
    let hold = args.hold_settings()?;
    let reaper = args.admission_reaper()?;
    let secret = Secret::from_file_or_env(args.jwt_secret_file.as_deref())?;
    let identity = Identity::load_or_create(&args.identity_path)?;
    let session_issuer = credentials::session_issuer(&identity.peer_id.to_string());
    // Policies before keys: static keys are checked against the serverless policies.
    let policy_context = PolicyContext {
        max_tries_per_step: args.max_tries_per_step()?,
        provider_keys: env.provider_keys,
    };
    let policy_sources = policies::Sources {
        file: args.policy_file().map(Into::into),
        dir: args.policy_model_dir().map(Into::into),
    };
    let policies = policy_reload::load_initial(&policy_sources, &policy_context)?;
    let mode_env = std::env::var("HIVENET_ROUTER_AUTH_MODE").ok();
    let loaded = auth_reload::load(
        args.auth_config_file.as_deref(),
        mode_env.as_deref(),
        &policies.set.serverless_limits(),
    )?;
    let dynamic_keys = (loaded.api_mode == ApiMode::Dynamic).then(DynamicRegistry::new);
    let site = args.redirect_site(loaded.api_mode)?.map(Arc::new);
    if let Some(site) = &site {
        tracing::info!(site = %site.id, domains = ?site.allowed_domains, "cross-site redirect on; hold at zero follows the pushed sibling map");
    }
    let keys = Arc::new(loaded.registry);
    let admin_access = Arc::new(loaded.admin);
    tracing::info!(keys = keys.len(), mode = ?loaded.api_mode, admin = ?admin_access, "client API keys loaded");
    let policies = PolicyControl::new(
        policies,
        policy_context,
        policy_sources,
        loaded.config,
        keys.clone(),
    );
    let http_address = listen_address(&args.http_port)?;
    let grpc_address = listen_address(&args.grpc_port)?;
    let advertise_grpc_addr = args.advertise_grpc_addr()?;
    let metrics_address = listen_address(&args.metrics_port)?;
    let tunnel_address = SocketAddr::new(args.p2p_listen_addr, args.p2p_port);
    let shard_count = args
        .shards
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    anyhow::ensure!(
        (1..=256).contains(&shard_count),
        "--shards must be between 1 and 256, got {shard_count}"
    );
    anyhow::ensure!(
        !args.request_timeout.is_zero(),
        "--request-timeout must be positive"
    );
    anyhow::ensure!(
        args.agent_token_max_lifetime >= hivenet_router::base::credentials::AUTH_TOKEN_TTL,
        "--agent-token-max-lifetime must be at least 30s (hivenet-agent signs 30-second tokens), got {:?}",
        args.agent_token_max_lifetime
    );
    refuse_if_served(http_address)?;
    let sync_settings = SyncSettings::from_args(
        &args.sync,
        args.site_id.as_deref(),
        env.quota_backend == QuotaBackend::Badger,
        std::env::var("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD").ok(),
        advertise_grpc_addr.clone(),
    )?
    .map(|mut sync| {
        sync.request_timeout = args.request_timeout;
        sync
    });
    let quota_store = open_quota_store(&args, env.quota_backend, shard_count)?;
    let (flush_to, mut daily_restores) = match quota_store {
        Some(store) => (
            Some((store.disk_db, store.today, store.history)),
            Some(store.restores),
        ),
        None => (None, None),
    };
    let tunnel_tls = match (&args.p2p_tls_cert, &args.p2p_tls_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(Arc::new(TunnelSecurity {
            config: tls::server_config(cert, key).context("--p2p-tls-cert/--p2p-tls-key")?,
            secret: secret.clone(),
            session_issuer: session_issuer.clone(),
        })),
        (Some(_), None) => anyhow::bail!("--p2p-tls-cert needs --p2p-tls-key"),
        (None, Some(_)) => anyhow::bail!("--p2p-tls-key needs --p2p-tls-cert"),
    };
    let mut tunnel_announce = if args.p2p_announce_addr.is_empty() {
        match args.p2p_listen_addr {
            std::net::IpAddr::V4(ip) => format!("/ip4/{ip}/tcp/{}", args.p2p_port),
            std::net::IpAddr::V6(ip) => format!("/ip6/{ip}/tcp/{}", args.p2p_port),
        }
    } else {
        args.p2p_announce_addr.clone()
    };
    // Agents dial TLS exactly when the address they are given says so.
    if tunnel_tls.is_some() && !tunnel_announce.split('/').any(|part| part == "tls") {
        tunnel_announce.push_str("/tls");
    }

    let metrics: Vec<Arc<ShardMetrics>> = (0..shard_count)
        .map(|_| Arc::new(ShardMetrics::default()))
        .collect();
    let Queues {
        to_shards,
        from_shards,
        inboxes,
        to_control,
    } = Queues::new(shard_count, &Arc::new(QueueFullCounts::default()));

    // Provider fallback: one client thread, started only when a provider key is configured
    // (credentials are read once, at start-up).
    let provider_settings = ProviderSettings::from_env()?;
    let provider = if [ProviderEngine::OpenAi, ProviderEngine::Anthropic]
        .into_iter()
        .any(|engine| provider_settings.api_key(engine).is_some())
    {
        Some(
            ProviderPool::start(provider_settings, PoolSettings::default())
                .context("cannot start the provider-fallback client")?,
        )
    } else {
        None
    };
    let shared = Arc::new(ControlShared::new(
        ControlSettings {
            shard_count,
            history_on_disk: flush_to.is_some(),
            session_ttl: args.session_ttl,
            agent_token_max_lifetime: args.agent_token_max_lifetime,
            heartbeat_interval: args.heartbeat_interval,
            routing_signal_interval: args.routing_signal_interval,
            health_check_interval: args.health_check_interval,
            health: HealthTimes {
                unhealthy_after: args.unhealthy_after,
                remove_after: args.remove_after,
            },
            tunnel_announce: tunnel_announce.clone(),
            router_peer_id: identity.peer_id.to_string(),
            session_issuer,
            grpc_address,
            auth_config_file: args.auth_config_file.clone(),
            tunnel_address,
            p2p_max_conns_per_ip: args.p2p_max_conns_per_ip,
            tenant_metrics_max_tenants: args.tenant_metrics_max_tenants,
            metrics_address,
            site: site.as_ref().map(|site| control::SiteControl {
                id: site.id.clone(),
                allowed_domains: site.allowed_domains.clone(),
                default_hold_budget: hold.budget,
            }),
            tunnel_tls: tunnel_tls.is_some(),
            advertise_grpc_addr,
            sync_store: sync_settings.is_some(),
        },
        secret,
        dynamic_keys,
        to_shards,
        metrics.clone(),
        policies,
        provider.as_ref().map(|pool| pool.metrics().clone()),
    ));
    // `GET /ready` on the shards: the same readiness the control and sync cores set.
    let readiness = shared.readiness.clone();

    // The audit log: one writer thread, one ring per shard.
    let audit_path = hivenet_router::router::audit::path_from_env();
    let (mut audit_log, audit_senders) =
        AuditLog::start(&audit_path, shard_count).context("cannot start the audit log writer")?;
    tracing::info!(destination = %audit_log.destination, "audit log");
    let mut audit_senders = audit_senders.into_iter().map(Some).collect::<Vec<_>>();

    // Tracing: one span ring per shard, drained by the exporter on the control core.
    let tracing_settings = args.tracing.settings().map_err(anyhow::Error::msg)?;
    let (mut span_rings, span_export) = match &tracing_settings {
        Some(settings) => {
            tracing::info!(endpoint = %settings.endpoint, interval = ?settings.export_interval, "spans exported over OTLP gRPC as hivenet-router");
            let (rings, consumers, dropped) = SpanRing::build(shard_count, settings.sampler);
            (
                rings.into_iter().map(Some).collect(),
                Some((settings.clone(), consumers, dropped)),
            )
        }
        None => (Vec::new(), None),
    };

    // The sync core: its own thread, its own runtime. Its first round waits for the shards.
    let shared_limits = sync_settings.as_ref().map(|sync| {
        (
            hivenet_router::base::clock::utc_today(),
            hivenet_router::logic::limits::Share::Alone {
                since: 0,
                routers: sync.min_routers,
                late: 0,
                unread: 0,
            },
        )
    });
    let (site_tokens, token_claims) = match &sync_settings {
        Some(_) => {
            let (tokens, claims, up) = SiteTokens::new();
            (Some(tokens), Some((claims, up)))
        }
        None => (None, None),
    };
    // Wallets that run short ask the sync core for refills (bounded: a full queue drops the ask
    // and the wallet asks again after the next round).
    let (credit_refills, refill_asks) = match &sync_settings {
        Some(_) => {
            let (asks, asked) =
                tokio::sync::mpsc::channel(hivenet_router::router::sync::pools::REFILL_QUEUE);
            (Some(asks), Some(asked))
        }
        None => (None, None),
    };
    let sync_core = match sync_settings.zip(token_claims) {
        Some((sync, token_claims)) => {
            let sync_metrics = Arc::new(SyncMetrics::default());
            let _ = shared.sync_metrics.set(sync_metrics.clone() as Arc<_>);
            tracing::info!(site = %sync.site, router_id = %sync.router_id, store = ?sync.store, interval = ?sync.interval, "limits shared with the routers of the site");
            Some(SyncCore::start(
                sync,
                shared.clone(),
                identity.peer_id.to_string(),
                sync_metrics,
                token_claims,
                refill_asks.expect("a refill queue with every sync core"),
                // Shards take cores 0..shards; a core beyond them is the sync core's alone.
                core_affinity::get_core_ids()
                    .unwrap_or_default()
                    .get(shard_count)
                    .copied()
                    .filter(|_| args.pin_shards),
            )?)
        }
        None => None,
    };

    // The control core: its own thread, its own tokio runtime.
    let drain_timeout = args.drain_timeout;
    let router_peer_id = identity.peer_id.to_string();
    let (control_started, control_ready) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = control_started.send(Err(anyhow::anyhow!(error)));
                    return;
                }
            };
            let flush_shared = shared.clone();
            let drain_shared = shared.clone();
            let mut span_exporter = None;
            let started = control::core::start(&runtime, shared, from_shards).and_then(|started| {
                if let Some((settings, consumers, dropped)) = span_export {
                    let _guard = runtime.enter();
                    span_exporter = Some(
                        telemetry::export::spawn(
                            &settings,
                            telemetry::ROUTER_SERVICE,
                            &router_peer_id,
                            telemetry::export::SpanSource::Rings(consumers),
                            dropped,
                        )
                        .context("OTEL_EXPORTER_OTLP_ENDPOINT")?,
                    );
                }
                Ok(started)
            });
            let failed = started.is_err();
            let _ = control_started.send(started);
            if failed {
                return;
            }
            let daily_flush = flush_to.map(|(disk_db, today, history)| {
                DailyFlush::spawn(&runtime, flush_shared, disk_db, today, history)
            });
            runtime.block_on(async {
                let mut terminate =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .expect("installing the SIGTERM handler");
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                drain(&drain_shared, drain_timeout).await;
                if let Some(sync_core) = sync_core {
                    if sync_core.finish().await {
                        tracing::info!("usage published and this router left the site");
                    } else {
                        tracing::warn!("the last sync round did not finish; the other routers count this router as silent");
                    }
                }
                if let Some(daily_flush) = daily_flush {
                    if daily_flush.finish().await {
                        tracing::info!("daily token totals written to the disk database");
                    } else {
                        tracing::warn!("the final flush of daily token totals did not finish; the last second of changes may be lost");
                    }
                }
                // The spans of the drained requests reach the collector before the process ends.
                if let Some(exporter) = span_exporter
                    && !exporter.finish(SPAN_EXPORT_FINISH).await
                {
                    tracing::warn!("the last spans were not exported before the router stopped");
                }
                // Every record the shards have written reaches the log before the process ends.
                audit_log.shutdown();
                std::process::exit(0);
            });
        })?;
    control_ready
        .recv()
        .context("control core did not start")??;

    let cores = match args.pin_shards {
        true => core_affinity::get_core_ids().unwrap_or_default(),
        false => Vec::new(),
    };
    let settings = ShardSettings {
        queue_depth: args.queue_depth,
        prefix: hivenet_router::logic::routing::prefix::PrefixSettings {
            cache_threshold: args.prefix_cache_threshold,
            balance_abs_threshold: args.prefix_balance_abs_threshold,
            balance_rel_threshold: args.prefix_balance_rel_threshold,
            blocks_per_agent: args.prefix_index_blocks as usize,
        },
        request_timeout: args.request_timeout,
        max_request_bytes: env.max_request_bytes,
        client_header_timeout: args.client_header_timeout,
        client_body_timeout: args.client_body_timeout,
        client_limits: hivenet_router::router::shard::clients::ClientLimits {
            connections_max: args.max_client_connections,
            body_bytes_max: args.max_buffered_body_bytes,
            ..Default::default()
        },
        rpm_burst: env.rpm_burst,
        admit_fraction: env.admit_fraction,
        handoff: args
            .connection_handoff
            .then(|| hivenet_router::router::shard::handoff::Loads::new(shard_count))
            .flatten(),
        admit_park_timeout: env.admit_park_timeout,
        provider,
        hold,
        held_total: Arc::new(HeldTotal::new(hold.max_total)),
        site,
        site_tokens,
        readiness,
        credit_refills,
        tunnel_tls,
        reaper,
    };
    let (shard_started, shards_ready) = std::sync::mpsc::channel();
    let (thread_ended, threads_ended) = std::sync::mpsc::channel();
    let mut threads = Vec::with_capacity(shard_count);
    let meshes = Mesh::build(shard_count).context("cannot create the shard mesh")?;
    for (index, (mesh, inbox)) in meshes.into_iter().zip(inboxes).enumerate() {
        let setup = ShardSetup {
            mesh,
            count: shard_count,
            http_address,
            settings: settings.clone(),
            metrics: metrics[index].clone(),
            keys: keys.clone(),
            admin_access: admin_access.clone(),
            audit: audit_senders[index].take(),
            spans: span_rings.get_mut(index).and_then(Option::take),
            daily_restore: daily_restores
                .as_mut()
                .map(|restores| std::mem::take(&mut restores[index])),
            shared_limits,
            inbox,
            to_control: to_control.clone(),
            core: (!cores.is_empty()).then(|| cores[index % cores.len()]),
        };
        threads.push(runtime::spawn(
            setup,
            shard_started.clone(),
            thread_ended.clone(),
        ));
    }
    let mut driver = None;
    for _ in 0..shard_count {
        let started = shards_ready
            .recv()
            .context("a shard stopped during start-up")?;
        driver = Some(started.map_err(|error| anyhow::anyhow!(error))?);
    }
    tracing::info!(
        http = %http_address,
        grpc = %grpc_address,
        tunnel = %tunnel_address,
        announce = %tunnel_announce,
        metrics = %metrics_address,
        shards = shard_count,
        driver = driver.map_or("none", |driver| driver.as_str()),
        peer_id = %identity.peer_id,
        "hivenet-router listening"
    );
    drop(thread_ended);
    // A shard runs for the life of the process; one that ends leaves its keys and models
    // unserved, so the process ends with it (a panic already aborted it, see `fatal`).
    let ended = threads_ended
        .recv()
        .unwrap_or_else(|_| "every shard".to_owned());
    tracing::error!(thread = %ended, "a shard thread ended; stopping the router");
    drop(threads);
    std::process::exit(70);
}

/// How often the drain looks at the requests still open.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The longest a stopping router waits for its last spans to be exported.
const SPAN_EXPORT_FINISH: std::time::Duration = std::time::Duration::from_secs(5);
/// After the drain deadline: how long the requests ended by it get to write their error.
const END_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// SIGTERM: the shards stop accepting and fail `/health`; requests already in flight run on for
/// up to `timeout`; those still open then end with an error (see `shard::lifecycle`).
async fn drain(shared: &ControlShared, timeout: std::time::Duration) {
    let open = || -> i64 {
        shared
            .shard_metrics
            .iter()
            .map(|metrics| {
                metrics
                    .requests_open
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    };
    tracing::info!(
        requests_open = open(),
        drain_timeout = ?timeout,
        "hivenet-router draining: no new connections, /health and /ready fail, requests in flight run on"
    );
    shared.readiness.draining();
    shared
        .broadcast(|| hivenet_router::router::shard::messages::ControlToShard::Drain)
        .await;
    let deadline = tokio::time::Instant::now() + timeout;
    while open() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(DRAIN_POLL).await;
    }
    let left = open();
    if left > 0 {
        tracing::warn!(
            requests_open = left,
            "drain deadline passed: ending the requests still in flight with an error"
        );
        shared
            .broadcast(|| hivenet_router::router::shard::messages::ControlToShard::End)
            .await;
        let grace = tokio::time::Instant::now() + END_GRACE;
        while open() > 0 && tokio::time::Instant::now() < grace {
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }
    tracing::info!(requests_open = open(), "hivenet-router stopping");
}
