//! What arrives at a shard: the control core's messages and other shards' mesh messages, each
//! applied by one dispatch function.
//!
//! Tunnel sockets and client connections are the things a shard does not handle itself: they go
//! to the tunnel starter its runtime hands [`Shard::run_control_inbox`] and to the front's
//! [`Adopt`] it hands [`Shard::run_mesh`], so the data plane does not depend on the tunnel client
//! or the HTTP front that depend on it.

use std::rc::Rc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::base::clock::SystemClock;
use crate::router::metrics::ShardMetrics;
use crate::router::shard::messages::{ControlToShard, ShardReport, ShardToShard};
use crate::router::shard::owner::AgentJoin;
use crate::router::shard::state::Shard;

/// Messages handled per mesh wake-up before the mesh task yields to the shard's other tasks.
const MESH_DRAIN_BUDGET: usize = 256;

/// Serves a client connection another shard handed this one (`shard::handoff`).
pub type Adopt = fn(Rc<Shard>, crate::router::shard::handoff::Handoff);

/// A tunnel socket the control core handed this shard.
pub enum TunnelSocket {
    /// Authenticated: the shard speaks `codec` (as the client) over it to `agent`.
    Plain {
        agent: crate::base::ids::AgentId,
        codec: crate::net::tunnel::preamble::Codec,
        socket: std::net::TcpStream,
        /// Its place under `--p2p-max-conns-per-ip`, held until the tunnel ends.
        permit: crate::router::shard::conn_limit::ConnPermit,
    },
    /// Asked for TLS: the shard terminates it and checks the preamble inside.
    Secure {
        socket: std::net::TcpStream,
        permit: crate::router::shard::conn_limit::ConnPermit,
    },
}

impl Shard {
    /// Applies control-core messages until the control core goes away; tunnel sockets go to
    /// `start_tunnel`.
    pub async fn run_control_inbox(
        self: Rc<Self>,
        mut inbox: mpsc::Receiver<ControlToShard>,
        start_tunnel: impl Fn(&Rc<Shard>, TunnelSocket),
    ) {
        while let Some(message) = inbox.recv().await {
            if let Some(socket) = self.on_control(message) {
                start_tunnel(&self, socket);
            }
        }
    }

    /// Applies one control message; a tunnel socket is handed back for the tunnel starter.
    fn on_control(self: &Rc<Self>, message: ControlToShard) -> Option<TunnelSocket> {
        match message {
            ControlToShard::Snapshot(snapshot) => self.set_snapshot(snapshot),
            ControlToShard::Keys(keys) => self.set_keys(keys),
            ControlToShard::AdminAccess(access) => self.set_admin_access(access),
            ControlToShard::AgentUp {
                agent,
                generation,
                models,
                capacity,
                profile,
            } => {
                self.accounting.agent_up(agent, profile.clone());
                let join = AgentJoin {
                    agent,
                    generation,
                    capacity,
                    profile,
                };
                let now = crate::base::clock::now();
                self.with_owner(|owner, effects| owner.agent_up(now, &join, &models, effects));
            }
            ControlToShard::AgentDown { agent, models } => {
                self.accounting.agent_down(agent);
                let now = crate::base::clock::now();
                self.with_owner(|owner, effects| owner.agent_down(now, agent, &models, effects));
            }
            ControlToShard::Signal {
                agent,
                models,
                in_flight,
                engine,
            } => self.with_owner(|owner, effects| {
                owner.signal(agent, &models, in_flight, engine, effects)
            }),
            ControlToShard::Report(reply) => {
                let (queues, pending_demand, prefix, quota_holders) = {
                    let owner = self.owner.borrow();
                    let holders = crate::router::shard::messages::QuotaHolders {
                        shard: self.id,
                        owners: owner.quotas.len(),
                        key_rates: owner.quotas.token_rate_holders(),
                        remote_only: owner.quotas.remote_only_tenants(),
                    };
                    (
                        owner.models.queues(),
                        owner.models.pending_demand(),
                        owner.models.prefix_stats(),
                        holders,
                    )
                };
                let _ = reply.send(ShardReport {
                    queues,
                    queue_waits: self.queue_waits.borrow().report(),
                    pending_demand,
                    prefix,
                    admission: self.admission_report(),
                    tenants: self.accounting.report(),
                    quota_holders,
                });
            }
            ControlToShard::ReportDaily(reply) => {
                let totals = self.owner.borrow_mut().quotas.take_changed_daily_totals();
                if let Err(totals) = reply.send(totals) {
                    // The flush gave up waiting: report these again next time.
                    self.owner.borrow_mut().quotas.requeue_daily_totals(totals);
                }
            }
            ControlToShard::TakeUsage {
                reply,
                reached,
                remember,
            } => {
                let mut report = crate::router::shard::messages::ShardUsage::default();
                self.with_owner(|owner, effects| {
                    owner.take_usage(&mut report.usage);
                    report.daily = owner.quotas.take_changed_daily_totals();
                    let now = crate::base::clock::now();
                    owner.anchor_views(now, &mut report.views);
                    if remember {
                        report.memory = owner.quotas.daily_memory();
                    }
                    let credits = &mut report.credits;
                    owner.models.credit_round(now, reached, credits, effects);
                });
                if let Err(report) = reply.send(report) {
                    // The sync core stopped waiting: the totals go out next round; the usage,
                    // already taken from the buckets, is lost to the other routers (it still
                    // counts here).
                    self.owner
                        .borrow_mut()
                        .quotas
                        .requeue_daily_totals(report.daily);
                }
            }
            ControlToShard::ApplyRemote(remote) => {
                let now = crate::base::clock::now();
                let day = crate::base::clock::utc_today();
                self.owner.borrow_mut().apply_remote(now, day, &remote);
            }
            ControlToShard::Share(share) => self.owner.borrow_mut().set_share(share),
            ControlToShard::Credits(news) => {
                let now = crate::base::clock::now();
                self.with_owner(|owner, effects| owner.models.credit_news(now, news, effects));
            }
            ControlToShard::DailyTotals(restore) => self.owner.borrow_mut().restore_daily(restore),
            ControlToShard::RewriteDaily => self.owner.borrow_mut().quotas.rewrite_daily_totals(),
            ControlToShard::Drain => {
                tracing::info!(shard = self.id, "draining: no new connections or requests");
                self.lifecycle.drain();
            }
            ControlToShard::End => {
                tracing::info!(shard = self.id, "ending the requests still in flight");
                self.lifecycle.end();
            }
            ControlToShard::CloseTunnel { agent } => self.close_tunnel(agent),
            ControlToShard::Tunnel {
                agent,
                codec,
                socket,
                permit,
            } => {
                return Some(TunnelSocket::Plain {
                    agent,
                    codec,
                    socket,
                    permit,
                });
            }
            ControlToShard::SecureTunnel { socket, permit } => {
                return Some(TunnelSocket::Secure { socket, permit });
            }
        }
        None
    }

    pub(super) fn on_mesh(self: &Rc<Self>, message: ShardToShard, adopt: Adopt) {
        match message {
            ShardToShard::Connection(handoff) => adopt(self.clone(), *handoff),
            ShardToShard::Visit { ticket, visit } => self.serve_remote(ticket, visit),
            ShardToShard::Answer { ticket, answer } => self.resolve(ticket, answer),
            ShardToShard::Notice(notice) => {
                self.with_owner(|owner, effects| owner.notice(&SystemClock, notice, effects))
            }
        }
    }

    /// Applies other shards' mesh messages, forever; a client connection handed to this shard
    /// goes to `adopt` (the front's, which serves it).
    pub async fn run_mesh(self: Rc<Self>, adopt: Adopt) {
        use monoio::io::AsyncReadRent;
        let (socket, sleeper) = self.outbox.borrow_mut().endpoint().waiter().into_parts();
        let mut bell = match monoio::net::UnixStream::from_std(socket) {
            Ok(bell) => bell,
            Err(error) => {
                tracing::error!(shard = self.id, %error, "mesh doorbell unusable; this shard cannot hear other shards");
                return;
            }
        };
        let mut rung = vec![0u8; 64];
        loop {
            self.outbox.borrow_mut().flush();
            let mut handled = 0;
            while handled < MESH_DRAIN_BUDGET {
                let Some((_, message)) = self.outbox.borrow_mut().endpoint().pop() else {
                    break;
                };
                self.on_mesh(message, adopt);
                handled += 1;
            }
            let deferred = self.outbox.borrow().deferred_len();
            ShardMetrics::set(&self.metrics.mesh_deferred, deferred as i64);
            if handled == MESH_DRAIN_BUDGET || self.outbox.borrow().has_deferred() {
                // More may be queued (or a ring was full): let other tasks run, then continue.
                monoio::time::sleep(Duration::from_micros(50)).await;
                continue;
            }
            // Raise the flag, then look once more: a message pushed before the flag was visible
            // rang no bell and must not wait for the next one.
            sleeper.sleep();
            if self.outbox.borrow().has_inbound() {
                sleeper.wake();
                continue;
            }
            let (read, buffer) = bell.read(rung).await;
            rung = buffer;
            sleeper.wake();
            if matches!(read, Ok(0) | Err(_)) {
                tracing::error!(
                    shard = self.id,
                    "mesh doorbell closed; this shard stops hearing other shards"
                );
                return;
            }
        }
    }
}
