//! The store side of occupancy credits (issue 13, seed `run-several-routers.md`, "Occupancy
//! credits"): one budget's pool is a hash `hivenet:{site}:pool:{budget}` of router ID ->
//! `run:held`, and a grant runs [`GRANT`] atomically in the store with the rules of
//! `credits::pool` (grants only from what no router holds, a newer run replaces an older run's
//! holding, a router that has not seen the store's epoch is refused). With replicas, `WAIT`
//! tells whether one acknowledged the grant.
//!
//! Not wired into the sync core yet: the occupancy budgets are still per router.

use redis::RedisResult;

use super::store::Store;

/// The grant, atomically in the store. KEYS: the pool hash, the epoch key. ARGV: router ID, run,
/// the epoch the router knows, want, budget. Returns `{granted, held}`, or `{-1, 0}` when the
/// epoch is not the store's (it lost its data since the router read it), `{-2, 0}` when a newer
/// run of the router holds its credits.
pub const GRANT: &str = r#"
local epoch = redis.call('GET', KEYS[2])
if epoch ~= ARGV[3] then return {-1, 0} end
local fields = redis.call('HGETALL', KEYS[1])
local others, mine_run, mine_held = 0, nil, 0
for i = 1, #fields, 2 do
  local run, held = string.match(fields[i + 1], '^(%d+):(%d+)$')
  if fields[i] == ARGV[1] then
    mine_run, mine_held = tonumber(run), tonumber(held)
  else
    others = others + tonumber(held)
  end
end
local run = tonumber(ARGV[2])
if mine_run ~= nil and run < mine_run then return {-2, 0} end
if mine_run ~= nil and run > mine_run then mine_held = 0 end
local free = tonumber(ARGV[5]) - others - mine_held
if free < 0 then free = 0 end
local granted = math.min(tonumber(ARGV[4]), free)
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d:%d', run, mine_held + granted))
return {granted, mine_held + granted}
"#;

/// What a grant came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// `granted` more; the router now holds `held`.
    Granted { granted: u64, held: u64 },
    /// The store's epoch is not the one the router knows: it lost its data.
    StaleEpoch,
    /// A newer run of this router ID holds its credits.
    Replaced,
}

impl Store {
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
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(GRANT)
            .arg(2)
            .arg(self.key(&format!("pool:{budget_name}")))
            .arg(self.key("epoch"))
            .arg(router)
            .arg(run)
            .arg(epoch)
            .arg(want)
            .arg(budget);
        let ((granted, held),): ((i64, i64),) = self.query(&pipe).await?;
        Ok(match granted {
            -1 => Grant::StaleEpoch,
            -2 => Grant::Replaced,
            granted => Grant::Granted {
                granted: granted.max(0) as u64,
                held: held.max(0) as u64,
            },
        })
    }

    /// How many replicas acknowledged every write before this call within `timeout_ms` (`WAIT`):
    /// with Sentinel, a grant counts only once one has.
    pub async fn wait_replicas(&mut self, timeout_ms: u64) -> RedisResult<u64> {
        let mut pipe = redis::pipe();
        pipe.cmd("WAIT").arg(1).arg(timeout_ms);
        let (acknowledged,): (u64,) = self.query(&pipe).await?;
        Ok(acknowledged)
    }
}
