//! Occupancy credits against the store: the pools' step of a round, the grant and the release
//! (the scripts of `sync::pool_store`), and the replicas' acknowledgement.

use super::*;
use crate::router::sync::entry::put_varint;

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
        let epoch = pools
            .iter()
            .find_map(|pool| pool.rewrite.as_ref().map(|rewrite| rewrite.epoch))
            .unwrap_or("");
        let run = pools
            .iter()
            .find_map(|pool| pool.rewrite.as_ref().map(|rewrite| rewrite.run))
            .unwrap_or(0);
        let mut call = ROUND.call(full);
        call.arg(2)
            .arg(self.key("epoch"))
            .arg(self.key("pools"))
            .arg(&self.router)
            .arg(run)
            .arg(epoch)
            .arg(self.key("pool:"))
            .arg(pack_pools(pools));
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

/// The pools of a round as `pool_store::ROUND` reads them: each name front-coded against the one
/// before (a model's share pools differ in the key's ID only), then hold + 1 (0: read only), in
/// use and short. About 14 bytes a key's share pool, where its key name and three numbers as
/// arguments of their own took about 100.
fn pack_pools(pools: &[PoolWrite<'_>]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(16 * pools.len());
    let mut previous: &str = "";
    for pool in pools {
        let shared = previous
            .bytes()
            .zip(pool.pool.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let rest = &pool.pool.as_bytes()[shared..];
        put_varint(&mut blob, shared as u64);
        put_varint(&mut blob, rest.len() as u64);
        blob.extend_from_slice(rest);
        match &pool.rewrite {
            Some(rewrite) => {
                put_varint(&mut blob, rewrite.holding + 1);
                put_varint(&mut blob, rewrite.in_use);
                blob.push(u8::from(rewrite.short));
            }
            None => blob.extend_from_slice(&[0, 0, 0]),
        }
        previous = pool.pool;
    }
    blob
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::sync::store::PoolRewrite;

    #[test]
    fn pools_are_packed_front_coded_with_their_numbers() {
        let rewrite = |holding| PoolRewrite {
            epoch: "e",
            run: 1,
            holding,
            in_use: 2,
            short: true,
        };
        let pools = [
            PoolWrite {
                pool: "llm|m|share-0a",
                rewrite: Some(rewrite(300)),
            },
            PoolWrite {
                pool: "llm|m|share-0b",
                rewrite: None,
            },
            PoolWrite {
                pool: "llm|m|tokens",
                rewrite: Some(rewrite(0)),
            },
        ];
        let mut expected = vec![0, 14];
        expected.extend_from_slice(b"llm|m|share-0a");
        // 301 as a varint, in use 2, short.
        expected.extend_from_slice(&[0xad, 0x02, 2, 1]);
        expected.extend_from_slice(&[13, 1, b'b', 0, 0, 0]);
        expected.extend_from_slice(&[6, 6]);
        expected.extend_from_slice(b"tokens");
        expected.extend_from_slice(&[1, 2, 1]);
        assert_eq!(pack_pools(&pools), expected);
    }
}
