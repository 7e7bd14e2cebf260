//! Occupancy credits against the store: the pools' step of a round, the grant and the release
//! (the scripts of `sync::pool_store`), and the replicas' acknowledgement.

use super::*;

impl Store {
    /// The occupancy pools' step of a round, after [`Store::round`]: every pool's rewrite and a
    /// read of every holding, in one call of `pool_store::ROUND` (atomic in itself). Pools are
    /// independent of the round's transaction, so a refused script (an ACL without `EVALSHA`)
    /// leaves the reads, done on their own then, and the rest of the round, standing; it is
    /// returned in [`PoolsRead::refused`]. Any other error fails the step.
    pub async fn pools(&mut self, pools: &[PoolWrite<'_>]) -> RedisResult<PoolsRead> {
        if pools.is_empty() {
            return Ok(PoolsRead {
                pools: Vec::new(),
                refused: None,
            });
        }
        let reply = match self.pools_once(pools, false).await? {
            // The store no longer knew the script by its SHA1: it did not run. Again with its
            // text (rewrites are absolute, reads only read).
            reply if noscript(&reply) => self.pools_once(pools, true).await?,
            reply => reply,
        };
        match reply {
            Value::ServerError(error) => {
                let error = redis::RedisError::from(error);
                if !refused_permission(&error) {
                    return Err(self.failed(error));
                }
                let mut read = self.read_pools(pools).await?;
                read.refused = Some(error);
                Ok(read)
            }
            reply => {
                let replies: Vec<Value> = redis::from_redis_value(reply)?;
                if replies.len() != 2 * pools.len() {
                    return Err(short_reply());
                }
                let mut replies = replies.into_iter();
                let mut read = PoolsRead {
                    pools: Vec::with_capacity(pools.len()),
                    refused: None,
                };
                while let (Some(rewritten), Some(holdings)) = (replies.next(), replies.next()) {
                    let rewritten: i64 = redis::from_redis_value(rewritten)?;
                    read.pools.push(PoolRead {
                        rewritten: (rewritten != -3).then_some(rewritten),
                        holdings: redis::from_redis_value(holdings)?,
                    });
                }
                Ok(read)
            }
        }
    }

    /// One call of `pool_store::ROUND` for every pool: its reply, as the store gave it.
    async fn pools_once(&mut self, pools: &[PoolWrite<'_>], full: bool) -> RedisResult<Value> {
        let mut call = ROUND.call(full);
        call.arg(2 + pools.len())
            .arg(self.key("epoch"))
            .arg(self.key("pools"));
        for pool in pools {
            call.arg(self.key(&format!("pool:{}", pool.pool)));
        }
        let epoch = pools
            .iter()
            .find_map(|pool| pool.rewrite.as_ref().map(|rewrite| rewrite.epoch))
            .unwrap_or("");
        let run = pools
            .iter()
            .find_map(|pool| pool.rewrite.as_ref().map(|rewrite| rewrite.run))
            .unwrap_or(0);
        call.arg(&self.router).arg(run).arg(epoch);
        for pool in pools {
            match &pool.rewrite {
                Some(rewrite) => call
                    .arg(rewrite.holding)
                    .arg(rewrite.in_use)
                    .arg(u8::from(rewrite.short)),
                None => call.arg(-1).arg(0).arg(0),
            };
        }
        let mut pipe = pipe();
        pipe.add_command(call);
        let mut replies: Vec<Value> = self.query(&pipe).await?;
        replies.pop().ok_or_else(short_reply)
    }

    /// Every pool's holdings, read on their own (the script was refused).
    async fn read_pools(&mut self, pools: &[PoolWrite<'_>]) -> RedisResult<PoolsRead> {
        let mut pipe = pipe();
        for pool in pools {
            pipe.cmd("HGETALL")
                .arg(self.key(&format!("pool:{}", pool.pool)));
        }
        let replies: Vec<Value> = self.query(&pipe).await?;
        let mut read = PoolsRead {
            pools: Vec::with_capacity(pools.len()),
            refused: None,
        };
        for reply in replies {
            if let Value::ServerError(error) = reply {
                return Err(self.failed(redis::RedisError::from(error)));
            }
            read.pools.push(PoolRead {
                rewritten: None,
                holdings: redis::from_redis_value(reply)?,
            });
        }
        if read.pools.len() != pools.len() {
            return Err(short_reply());
        }
        Ok(read)
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
