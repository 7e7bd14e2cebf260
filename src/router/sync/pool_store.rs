//! The store side of occupancy credits (seed `run-several-routers.md`, "Occupancy credits"): one
//! budget's pool is a hash `hivenet:{site}:pool:{budget}` of router ID -> `run:held`, and a grant
//! runs [`GRANT`] atomically in the store with the rules of `credits::pool` (grants only from what
//! no router holds, a newer run replaces an older run's holding, a router that has not seen the
//! store's epoch is refused). With replicas, `WAIT` tells whether one acknowledged the grant.
//!
//! Each round rewrites what the router holds of every pool and reads them all with one [`ROUND`]
//! (after the round's transaction), and a clean shutdown removes the router's holdings
//! ([`RELEASE`]).
//!
//! Owns: the scripts' text and the records they return ([`StoredHolding`], [`Grant`]). The calls
//! that run them are `sync::store::Store`'s (`grant`, `release_holdings`, `wait_replicas`,
//! `pools`), by each script's SHA1 (`EVALSHA`, with the text again after `NOSCRIPT`:
//! `sync::store::scripts`).

/// The scripts' reader of a varint (`sync::entry::put_varint`'s format: 7-bit groups, least
/// significant first), the head of each script text that reads a packed argument.
macro_rules! lua_varint {
    () => {
        r#"
local function varint(blob, at)
  local value, scale = 0, 1
  while true do
    local byte = string.byte(blob, at)
    at = at + 1
    if byte < 128 then return value + byte * scale, at end
    value = value + (byte - 128) * scale
    scale = scale * 128
  end
end
"#
    };
}
pub(crate) use lua_varint;

/// The grant, atomically in the store. KEYS: the pool hash, the epoch key, the set of pools
/// (every pool a router may hold in, for [`RELEASE`]). ARGV: router ID, run,
/// the epoch the router knows, want, budget. Returns `{granted, held}`, or `{-1, 0}` when the
/// epoch is not the store's (it lost its data since the router read it), `{-2, 0}` when a newer
/// run of the router holds its credits.
pub const GRANT: &str = r#"
local epoch = redis.call('GET', KEYS[2])
if epoch ~= ARGV[3] then return {-1, 0} end
local fields = redis.call('HGETALL', KEYS[1])
local others, mine_run, mine_held = 0, nil, 0
for i = 1, #fields, 2 do
  local run, held = string.match(fields[i + 1], '^(%d+):(%d+)')
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
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d:%d:1', run, mine_held + granted))
redis.call('SADD', KEYS[3], KEYS[1])
return {granted, mine_held + granted}
"#;

/// The round's step of every pool this router knows, in one call, atomically: for each pool, the
/// rewrite of what the router holds (when it reports one) and a read of every holding. KEYS: the
/// epoch key, the set of pools. ARGV: router ID, run, the epoch the router knows, the pools' key
/// prefix (`hivenet:{site}:pool:`), then the pools packed in one blob (`store::credits`'s
/// `pack_pools`), each: the length of the name it shares with the one before, varint; the rest
/// of its name, varint length and bytes; hold + 1 (0: read only), varint; in use, varint; short,
/// one byte (0/1). Returns, per pool, the rewrite's answer and the pool's `HGETALL`. The answer is
/// `-3` for a pool only read, 0 for a rewrite, `-1` when the epoch is not the store's, `-2` when
/// a newer run holds the router's credits, and 1 when the router held nothing in the pool: the
/// others gave it up, so only what is in use is written (held, never credits) and the router
/// forfeits its credits. A holding of 0 is removed. Writes keys it builds from the prefix, as
/// [`RELEASE`] does: every key is under the site's hash tag, so the script stays on one node.
/// One call for every pool, where each pool was its own rewrite and read: 1,000 keys' share
/// pools took 416 KiB a round that way, 114 KiB with each pool's key and numbers as arguments of
/// one call, and about 14 bytes a pool packed
/// (`perf/notes/2026-12-05-b4-share-pools-round-bytes.md`).
pub const ROUND: &str = concat!(
    lua_varint!(),
    r#"
local epoch_ok = redis.call('GET', KEYS[1]) == ARGV[3]
local run = tonumber(ARGV[2])
local prefix, blob = ARGV[4], ARGV[5]
local out = {}
local at, name = 1, ''
while at <= #blob do
  local shared, length, hold, in_use
  shared, at = varint(blob, at)
  length, at = varint(blob, at)
  name = string.sub(name, 1, shared) .. string.sub(blob, at, at + length - 1)
  at = at + length
  hold, at = varint(blob, at)
  hold = hold - 1
  in_use, at = varint(blob, at)
  local short = string.byte(blob, at)
  at = at + 1
  local pool = prefix .. name
  local result = -3
  if hold >= 0 then
    if not epoch_ok then
      result = -1
    else
      result = 0
      local current = redis.call('HGET', pool, ARGV[1])
      local stored = nil
      if current then stored = tonumber(string.match(current, '^(%d+):')) end
      if stored ~= nil and stored > run then
        result = -2
      else
        if (not current) or (stored ~= nil and stored < run) then
          if hold > in_use then hold = in_use; result = 1 end
        end
        if hold == 0 then
          redis.call('HDEL', pool, ARGV[1])
        else
          redis.call('HSET', pool, ARGV[1], string.format('%d:%d:%d', run, hold, short))
          redis.call('SADD', KEYS[2], pool)
        end
      end
    end
  end
  out[#out + 1] = result
  out[#out + 1] = redis.call('HGETALL', pool)
end
return out
"#
);

/// Takes a router's holdings back from every pool of the site (a clean shutdown, or the others
/// giving it up), unless a newer run holds them; pools left empty leave the set, so it holds at
/// most the budgets some router holds credits in (two per model, and one per key's share). KEYS: the set
/// of pools. ARGV: router ID, run. Returns how many holdings went.
pub const RELEASE: &str = r#"
local released = 0
for _, pool in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local current = redis.call('HGET', pool, ARGV[1])
  if current then
    local stored = tonumber(string.match(current, '^(%d+):'))
    if stored == nil or stored <= tonumber(ARGV[2]) then
      released = released + redis.call('HDEL', pool, ARGV[1])
    end
  end
  if redis.call('EXISTS', pool) == 0 then redis.call('SREM', KEYS[1], pool) end
end
return released
"#;

/// One holding in a pool as the store keeps it: `run:held[:short]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredHolding {
    pub run: u64,
    pub held: u64,
    /// The router ran short of this budget since its last round.
    pub short: bool,
}

impl StoredHolding {
    pub fn parse(text: &str) -> Option<StoredHolding> {
        let mut parts = text.split(':');
        let run = parts.next()?.parse().ok()?;
        let held = parts.next()?.parse().ok()?;
        let short = parts.next() == Some("1");
        Some(StoredHolding { run, held, short })
    }
}

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
