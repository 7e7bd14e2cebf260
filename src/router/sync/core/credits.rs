//! The round's occupancy credits between rounds: a wallet's refill asked of its pool, a gone
//! router's credits taken back, and this router's given back when it stops.

use super::*;

impl Round {
    /// A wallet ran short: ask its pool for more, held to this router's ceiling, and hand the
    /// answer to the model's owner shard (0 while the store is unreachable or refuses).
    pub(super) async fn refill(&mut self, refill: Refill) {
        let started = Instant::now();
        let now_ms = now_unix_ms().max(0) as u64;
        let mut granted = 0;
        let mut acknowledged = true;
        let ceiling = if self.health.is_up() && self.stepped_down.is_none() {
            let registry = self.shared.registry();
            self.credits.ceiling(
                now_ms,
                refill.model,
                refill.kind,
                refill.budget,
                self.unknown_routers,
                |model| registry.model_key(model),
            )
        } else {
            None
        };
        let ceiling = match self.store.ensure_connected().await {
            Ok(()) => {
                self.notice_failover(now_ms);
                ceiling.filter(|_| !self.credits.awaiting_rewrite())
            }
            Err(_) => None,
        };
        if let (Some((pool, ceiling)), Some(epoch)) = (ceiling, self.epoch.clone()) {
            let answer = self
                .store
                .grant(
                    &pool,
                    &self.settings.router_id,
                    self.run,
                    &epoch,
                    refill.want,
                    ceiling,
                )
                .await;
            match answer {
                Ok(Grant::Granted { granted: more, .. }) => {
                    granted = more;
                    if more > 0 && self.settings.store.sentinel_master.is_some() {
                        // A failover must not hand the same capacity out twice: until a replica
                        // has the grant, the router keeps to its share.
                        let replicas = self.store.wait_replicas(pools::ACKNOWLEDGE_WAIT_MS).await;
                        if let Err(error) = &replicas
                            && refused_permission(error)
                        {
                            self.refused(Refused::Acknowledge, error);
                        }
                        acknowledged = matches!(replicas, Ok(replicas) if replicas > 0);
                    }
                }
                // The store lost its data: the next round notices the epoch.
                Ok(Grant::StaleEpoch) => {}
                Ok(Grant::Replaced) => {
                    tracing::error!(router_id = %self.settings.router_id, "another process runs under this --router-id: one router ID runs one process at a time");
                }
                Err(error) => {
                    self.metrics
                        .credit_errors_total
                        .fetch_add(1, Ordering::Relaxed);
                    if refused_permission(&error) {
                        self.refused(Refused::Grant, &error);
                    } else {
                        tracing::debug!(%error, "credit refill failed");
                    }
                }
            }
            self.metrics
                .credit_refill_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        let owner = refill.model.owner(self.shared.shard_count());
        self.shared
            .send_to_shard(
                owner,
                ControlToShard::Credits(CreditNews::Granted {
                    model: refill.model,
                    kind: refill.kind,
                    granted,
                    acknowledged,
                }),
            )
            .await;
    }

    /// Gives `router`'s `run` up: its holdings in every pool this router knows go back (counted
    /// once, when some went). A failure is retried next round.
    pub(super) async fn reclaim(&mut self, router: &str, run: u64) {
        match self.store.release_holdings(router, run).await {
            Ok(0) => {}
            Ok(released) => {
                self.metrics
                    .credit_reclaims_total
                    .fetch_add(1, Ordering::Relaxed);
                self.credits.forget(router);
                tracing::warn!(
                    router,
                    released,
                    "a router missed its heartbeats and every agent it served reports no connection to it: its occupancy credits are taken back"
                );
            }
            Err(error) => {
                self.metrics
                    .credit_errors_total
                    .fetch_add(1, Ordering::Relaxed);
                if refused_permission(&error) {
                    self.refused(Refused::Release, &error);
                } else {
                    tracing::debug!(%error, router, "taking a router's credits back failed");
                }
            }
        }
    }

    /// A clean shutdown: every credit back at once (the shards admit nothing any more). A
    /// process that stepped down holds none (the router ID's holdings are the other's).
    pub(super) async fn release_credits(&mut self) {
        if self.stepped_down.is_some() {
            return;
        }
        if let Err(error) = self
            .store
            .release_holdings(&self.settings.router_id, self.run)
            .await
        {
            self.metrics
                .credit_errors_total
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, "could not give the occupancy credits back: the others take them back once this router misses its heartbeats");
        }
    }

    /// What the round read of the pools: a new epoch or a router given up makes every shard
    /// forfeit its credits; every shard learns which budgets others ran short of.
    pub(super) async fn after_pools(&mut self, now_ms: u64, epoch: &str, pool_reads: &[PoolRead]) {
        let epoch_changed = self.epoch.as_ref().is_some_and(|known| known != epoch);
        let after =
            self.credits
                .after_round(now_ms, epoch_changed, pools::epoch_since(epoch), pool_reads);
        if after.given_up {
            tracing::warn!(
                "the other routers gave this router up: its occupancy credits are asked for again"
            );
        }
        self.settle_news(now_ms);
        if after.forfeit {
            self.shared
                .broadcast(|| ControlToShard::Credits(CreditNews::Forfeit))
                .await;
        }
        let short = after.others_short;
        self.shared
            .broadcast(|| ControlToShard::Credits(CreditNews::OthersShort(short.clone())))
            .await;
    }

    /// The settle window, made visible: `hivenet_sync_settle_seconds_remaining`,
    /// `GET /ready/budgets`, and a log line when a window starts and each time it holds back
    /// more budgets, naming them and when they open.
    fn settle_news(&mut self, now_ms: u64) {
        let settling = self.credits.settling(now_ms);
        let settles_at = settling.as_ref().map_or(0, |(at, _)| *at);
        self.metrics.settle_remaining_ms.store(
            settles_at.saturating_sub(now_ms).min(i64::MAX as u64) as i64,
            Ordering::Relaxed,
        );
        self.shared.readiness.budgets_settle_until(settles_at);
        let Some((settles_at, pools)) = settling else {
            return;
        };
        if self.settle_announced == (settles_at, pools.len()) {
            return;
        }
        self.settle_announced = (settles_at, pools.len());
        let seconds = settles_at.saturating_sub(now_ms).div_ceil(1000);
        let opens_at = crate::router::audit::Timestamp(
            std::time::UNIX_EPOCH + std::time::Duration::from_millis(settles_at),
        );
        // A pool is `{capability}|{model}|{kind}`: shown as `model (kind)`.
        let held_back = if pools.is_empty() {
            "every budget asked for before it ends".to_owned()
        } else {
            let named = pools.iter().map(|pool| {
                let mut parts = pool.splitn(3, '|').skip(1);
                match (parts.next(), parts.next()) {
                    (Some(model), Some(kind)) => format!("{model} ({kind})"),
                    _ => (*pool).to_owned(),
                }
            });
            named.collect::<Vec<_>>().join(", ")
        };
        tracing::info!(
            seconds,
            opens_at = %opens_at,
            held_back = %held_back,
            "the sync store is younger than the settle window (a first deployment, or it lost its data): models with an occupancy budget admit nothing until it ends; GET /ready/budgets on the metrics port answers 200 then"
        );
    }

    /// The occupancy pools' step, after the round's transaction and on its own: a refused
    /// script costs credits, not the round. `epoch` is the store's, as the round read it.
    pub(super) async fn pools_step(&mut self, now_ms: u64, leaving: bool, epoch: &str) {
        let pools = self.credits.pool_writes(self.epoch.as_deref(), leaving);
        let pools_read = self.store.pools(&pools).await;
        drop(pools);
        let pool_reads = match pools_read {
            Ok(read) => {
                match &read.refused {
                    Some(error) => self.refused(Refused::Pools, error),
                    None => self.pools_written = true,
                }
                read.pools
            }
            Err(error) => {
                if refused_permission(&error) {
                    self.refused(Refused::Pools, &error);
                } else {
                    self.metrics
                        .credit_errors_total
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%error, "the occupancy pools' step of the round failed");
                }
                Vec::new()
            }
        };
        self.after_pools(now_ms, epoch, &pool_reads).await;
    }
}
