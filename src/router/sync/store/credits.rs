//! Occupancy credits against the store: the pools' step of a round, the grant and the release
//! (the scripts of `sync::pool_store`), and the replicas' acknowledgement.

use super::*;

impl Store {
    /// The occupancy pools' step of a round, after [`Store::round`]: each pool's rewrite
    /// (`pool_store::REWRITE`, atomic in itself) then a read of every holding. Pools are
    /// independent of each other and of the round's transaction, so a refused script (an ACL
    /// without `EVALSHA`) leaves the reads, and the rest of the round, standing; it is returned in
    /// [`PoolsRead::refused`]. Any other error fails the step.
    pub async fn pools(&mut self, pools: &[PoolWrite<'_>]) -> RedisResult<PoolsRead> {
        if pools.is_empty() {
            return Ok(PoolsRead {
                pools: Vec::new(),
                refused: None,
            });
        }
        match self.pools_once(pools, false).await? {
            // A rewrite the store no longer knew by its SHA1 did not run: the step again, every
            // rewrite with the script's text (rewrites are absolute, reads only read).
            None => Ok(self.pools_once(pools, true).await?.ok_or_else(|| {
                redis::RedisError::from(std::io::Error::other(
                    "the store answered NOSCRIPT to EVAL",
                ))
            })?),
            Some(read) => Ok(read),
        }
    }

    /// One try of [`Store::pools`]; `None` when a rewrite was answered `NOSCRIPT`.
    async fn pools_once(
        &mut self,
        pools: &[PoolWrite<'_>],
        full: bool,
    ) -> RedisResult<Option<PoolsRead>> {
        let mut read = PoolsRead {
            pools: Vec::with_capacity(pools.len()),
            refused: None,
        };
        let mut pipe = pipe();
        for pool in pools {
            let key = self.key(&format!("pool:{}", pool.pool));
            if let Some(rewrite) = &pool.rewrite {
                let mut call = REWRITE.call(full);
                call.arg(3)
                    .arg(&key)
                    .arg(self.key("epoch"))
                    .arg(self.key("pools"))
                    .arg(&self.router)
                    .arg(rewrite.run)
                    .arg(rewrite.epoch)
                    .arg(rewrite.holding)
                    .arg(rewrite.in_use)
                    .arg(u8::from(rewrite.short));
                pipe.add_command(call);
            }
            pipe.cmd("HGETALL").arg(&key);
        }
        let replies: Vec<Value> = self.query(&pipe).await?;
        if !full && replies.iter().any(noscript) {
            return Ok(None);
        }
        let mut replies = replies.into_iter();
        for pool in pools {
            let rewritten = match pool.rewrite {
                Some(_) => match replies.next() {
                    Some(Value::ServerError(error)) => {
                        let error = redis::RedisError::from(error);
                        if !refused_permission(&error) {
                            return Err(self.failed(error));
                        }
                        read.refused.get_or_insert(error);
                        None
                    }
                    Some(reply) => Some(redis::from_redis_value_ref::<i64>(&reply)?),
                    None => return Err(short_reply()),
                },
                None => None,
            };
            let holdings = match replies.next() {
                Some(Value::ServerError(error)) => {
                    return Err(self.failed(redis::RedisError::from(error)));
                }
                Some(reply) => redis::from_redis_value_ref(&reply)?,
                None => return Err(short_reply()),
            };
            read.pools.push(PoolRead {
                rewritten,
                holdings,
            });
        }
        Ok(Some(read))
    }

    /// Asks the pool of `budget_name` for `want` of `budget` for this router's `run`.
    pub async fn grant(
        &mut self,
        budget_name: &str,
        router: &str,
        run: u64,
        epoch: &str,
        want: u64,
        budget: u64,
    ) -> RedisResult<Grant> {
        let key = self.key(&format!("pool:{budget_name}"));
        let epoch_key = self.key("epoch");
        let pools_key = self.key("pools");
        let reply = self
            .script(&GRANT, |call| {
                call.arg(3)
                    .arg(&key)
                    .arg(&epoch_key)
                    .arg(&pools_key)
                    .arg(router)
                    .arg(run)
                    .arg(epoch)
                    .arg(want)
                    .arg(budget);
            })
            .await?;
        let (granted, held): (i64, i64) = redis::from_redis_value(reply)?;
        Ok(match granted {
            -1 => Grant::StaleEpoch,
            -2 => Grant::Replaced,
            granted => Grant::Granted {
                granted: granted.max(0) as u64,
                held: held.max(0) as u64,
            },
        })
    }

    /// Takes `router`'s holdings of `run` (or an older run) back from every pool of the site:
    /// this router's own at a clean shutdown, or another's the others gave up. Returns how many
    /// holdings went.
    pub async fn release_holdings(&mut self, router: &str, run: u64) -> RedisResult<u64> {
        let pools_key = self.key("pools");
        let reply = self
            .script(&RELEASE, |call| {
                call.arg(1).arg(&pools_key).arg(router).arg(run);
            })
            .await?;
        let released: u64 = redis::from_redis_value(reply)?;
        Ok(released)
    }

    /// How many replicas acknowledged every write before this call within `timeout_ms` (`WAIT`):
    /// with Sentinel, a grant counts only once one has.
    pub async fn wait_replicas(&mut self, timeout_ms: u64) -> RedisResult<u64> {
        let mut pipe = pipe();
        pipe.cmd("WAIT").arg(1).arg(timeout_ms);
        let replies = self.query_ok(&pipe).await?;
        Ok(redis::from_redis_value_ref(last(&replies)?)?)
    }
}
