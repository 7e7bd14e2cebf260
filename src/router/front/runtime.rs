//! Starting the shards: one thread per shard, pinned to a core, each with its own `monoio` runtime
//! and its own SO_REUSEPORT listener on the HTTP port.
//!
//! Driver: io_uring when the kernel allows it (set up with cooperative task running, which measured
//! cheapest per request here), else epoll; `HIVENET_ROUTER_IO_DRIVER=epoll|io_uring` forces one.
//! The choice is logged.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_util::future::Either;
use monoio::net::{ListenerOpts, TcpListener};
use tokio::sync::mpsc;

use crate::base::latch::race;
use crate::router::front::connection;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::mesh::Endpoint;
use crate::router::shard::messages::{ControlToShard, ShardToShard};
use crate::router::shard::state::{Shard, ShardSettings};

/// Everything one shard thread needs.
pub struct ShardSetup {
    pub mesh: Endpoint<ShardToShard>,
    pub count: usize,
    pub http_address: SocketAddr,
    pub settings: ShardSettings,
    pub metrics: Arc<ShardMetrics>,
    /// The client-key registry at start-up; later ones arrive through the inbox.
    pub keys: Arc<crate::logic::auth::keys::KeyRegistry>,
    /// Who may call `/admin/*` at start-up.
    pub admin_access: Arc<crate::logic::auth::admin::AdminAccess>,
    /// `HIVENET_ROUTER_QUOTA_BACKEND=badger`: today's persisted totals of the tenants this shard
    /// owns (`tenant % count`); `None` with the `memory` backend.
    pub daily_restore: Option<crate::router::shard::owner::quotas::DailyRestore>,
    /// `--sync-store valkey`: limits are shared with the routers of the site from the start
    /// (today's UTC day and the share before the store first answers).
    pub shared_limits: Option<(crate::logic::limits::Day, crate::logic::limits::Share)>,
    /// This shard's end of the audit log.
    pub audit: Option<crate::router::audit::AuditSender>,
    /// This shard's end of the span export; `None` when tracing is off.
    pub spans: Option<crate::net::telemetry::SpanRing>,
    pub inbox: mpsc::Receiver<ControlToShard>,
    pub to_control: crate::router::shard::queues::ToControl,
    pub core: Option<core_affinity::CoreId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    IoUring,
    Epoll,
}

impl Driver {
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::IoUring => "io_uring",
            Driver::Epoll => "epoll",
        }
    }
}

type Runtime = monoio::FusionRuntime<
    monoio::time::TimeDriver<monoio::IoUringDriver>,
    monoio::time::TimeDriver<monoio::LegacyDriver>,
>;

const RING_ENTRIES: u32 = 4096;
/// Seed, "Idle-state cleanup": idle quota state goes every five minutes.
const QUOTA_CLEANUP_INTERVAL: Duration = Duration::from_secs(300);

fn build_runtime() -> std::io::Result<(Runtime, Driver)> {
    let forced = std::env::var("HIVENET_ROUTER_IO_DRIVER").unwrap_or_default();
    if forced != "epoll" {
        let mut uring = io_uring::IoUring::builder();
        uring.setup_coop_taskrun().setup_taskrun_flag();
        let built = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .with_entries(RING_ENTRIES)
            .uring_builder(uring)
            .enable_timer()
            .build();
        match built {
            Ok(runtime) => return Ok((runtime.into(), Driver::IoUring)),
            Err(error) if forced == "io_uring" => return Err(error),
            Err(error) => tracing::debug!(%error, "io_uring unavailable, using epoll"),
        }
    }
    let runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new()
        .enable_timer()
        .build()?;
    Ok((runtime.into(), Driver::Epoll))
}

/// Connections the kernel queues for a shard before it accepts them.
const LISTEN_BACKLOG: usize = 4096;

/// Draining: how long the accept loop waits for one more connection from the backlog before it
/// closes the listener.
const BACKLOG_DRAIN_WAIT: Duration = Duration::from_millis(10);

/// Starts one shard thread; `started` receives the driver or the start-up error, `ended` the
/// thread's name should it ever end (it must not: the process stops then).
pub fn spawn(
    setup: ShardSetup,
    started: std::sync::mpsc::Sender<Result<Driver, String>>,
    ended: std::sync::mpsc::Sender<String>,
) -> JoinHandle<()> {
    let shard_id = setup.mesh.shard();
    let name = format!("shard-{shard_id}");
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let _running = crate::base::fatal::ThreadGuard::new(name, ended);
            if let Some(core) = setup.core {
                core_affinity::set_for_current(core);
            }
            let (mut runtime, driver) = match build_runtime() {
                Ok(built) => built,
                Err(error) => {
                    let _ = started.send(Err(format!(
                        "shard {shard_id}: cannot start runtime: {error}"
                    )));
                    return;
                }
            };
            runtime.block_on(run(setup, driver, started));
        })
        .expect("spawning a shard thread")
}

async fn run(
    setup: ShardSetup,
    driver: Driver,
    started: std::sync::mpsc::Sender<Result<Driver, String>>,
) {
    let options = ListenerOpts::new()
        .reuse_port(true)
        .backlog(LISTEN_BACKLOG as i32);
    let listener = match TcpListener::bind_with_config(setup.http_address, &options) {
        Ok(listener) => listener,
        Err(error) => {
            let _ = started.send(Err(format!(
                "shard {}: cannot bind --http-port {}: {error}",
                setup.mesh.shard(),
                setup.http_address
            )));
            return;
        }
    };
    let shard = Rc::new(Shard::new(
        setup.mesh,
        setup.count,
        setup.settings,
        setup.metrics,
        setup.keys,
        setup.admin_access,
        setup.to_control,
    ));
    if let Some(audit) = setup.audit {
        shard.accounting.set_audit(audit);
    }
    if let Some(spans) = setup.spans {
        shard.accounting.set_spans(spans);
    }
    if let Some(restore) = setup.daily_restore {
        shard.restore_daily(restore);
    }
    if let Some((day, share)) = setup.shared_limits {
        shard.share_limits(day, share);
    }
    monoio::spawn(
        shard
            .clone()
            .run_control_inbox(setup.inbox, crate::router::shard::tunnels::start),
    );
    monoio::spawn(shard.clone().run_mesh(connection::adopt));
    monoio::spawn(shard.clone().run_visit_deadlines());
    let cleaner = shard.clone();
    monoio::spawn(async move {
        // Seed, "Idle-state cleanup": idle quota state goes every five minutes.
        loop {
            monoio::time::sleep(QUOTA_CLEANUP_INTERVAL).await;
            cleaner.cleanup_quotas();
        }
    });
    let reaper = shard.clone();
    monoio::spawn(async move {
        // The reaper gives back reservations whose release was lost, and idle occupancy state
        // goes (seed, "Idle-state cleanup": every five minutes by default). Its own period, so
        // tests can run it within their lifetime; the pass is logged at debug level, which is
        // how they see that it ran.
        let interval = reaper.settings.reaper.interval;
        loop {
            monoio::time::sleep(interval).await;
            reaper.cleanup_pools();
            tracing::debug!(shard = reaper.id, "admission reaper pass");
        }
    });
    let _ = started.send(Ok(driver));
    let loads = shard.settings.handoff.clone();
    if let Some(loads) = &loads {
        use std::os::fd::AsRawFd;
        loads.listening(shard.id, Some(listener.as_raw_fd()));
    }
    loop {
        let accepted = match race(listener.accept(), shard.lifecycle.stopped_accepting()).await {
            Either::Left(accepted) => accepted,
            // Draining: the listener closes; connections already open are served on until
            // the process exits.
            Either::Right(()) => {
                // Connections already in the backlog were accepted by the kernel: serve them
                // rather than reset them when the listener closes. At most a backlog's worth, so
                // clients that keep connecting cannot hold the listener open.
                for _ in 0..LISTEN_BACKLOG {
                    match monoio::time::timeout(BACKLOG_DRAIN_WAIT, listener.accept()).await {
                        Ok(Ok((stream, _))) => {
                            monoio::spawn(connection::serve(shard.clone(), stream));
                        }
                        _ => break,
                    }
                }
                if let Some(loads) = &loads {
                    loads.listening(shard.id, None);
                }
                drop(listener);
                return std::future::pending().await;
            }
        };
        match accepted {
            Ok((stream, _)) => {
                monoio::spawn(connection::serve(shard.clone(), stream));
            }
            Err(error) => {
                // Out of descriptors or the like: back off a little instead of spinning.
                tracing::warn!(shard = shard.id, %error, "accept failed");
                monoio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
