//! The store's scripts as the round sends them (issue 33, "The round's cost on the wire"): each
//! runs by its SHA1 (`EVALSHA`, 40 bytes) instead of its text (about 1 KB each time), and the
//! round's usage writes (stream entries and daily totals) go as one script call whose daily
//! totals are packed in a few bytes each instead of one `HINCRBY` of about 80 bytes per total.
//!
//! # Why `EVALSHA` and not Valkey functions
//! A function library has one name per server: during a rolling upgrade two router versions
//! would replace each other's library (`FUNCTION LOAD REPLACE`) under the same name, or need a
//! name per version and someone to delete the old ones; `FUNCTION LOAD` also needs a permission
//! (`@admin`-adjacent in many ACLs) routers have not needed. A script's SHA1 names its exact
//! text, so versions side by side each run their own, and nothing is left behind. Both are
//! forgotten by a store restarted empty (functions persist with the data, but a replica
//! promoted after the primary lost them has none), so either needs the fallback below.
//!
//! # Fallback
//! The script cache is per server, not replicated, and emptied by a restart or `SCRIPT FLUSH`:
//! a `NOSCRIPT` reply means the script did not run, and the same call is sent again as `EVAL`
//! with the full text, which also caches it for the next rounds. `EVAL` rather than
//! `SCRIPT LOAD`: a store's ACL then needs only the two scripting commands it already grants
//! routers (`EVAL`, `EVALSHA`), not the `SCRIPT` container command.
//!
//! # The daily totals' packing
//! Per day, one blob of items, each `u32 le tenant, varint tag, varint amount`, where the tag is
//! `model index << 1 | whole` (model index 0: the tenant's flat budget; `i`: the `i`-th model of
//! the call's model list, `capability|name`), `whole` a total written whole after the store lost
//! its data (`HSET`) and otherwise an increment. The script writes the same fields a `HINCRBY`
//! per total writes (`sync::daily_fields::daily_field`), so the store's layout, the start-up read and
//! routers of the version before read them unchanged. Increments stay increments (two writers
//! of one field lose nothing, `sync::round::DailyLedger`): the script reads every field it adds
//! to (`HMGET`) and writes them back (`HSET`) atomically, two calls instead of one per total
//! (one `redis.call` per total made an earlier try cost the store more than the `HINCRBY`s,
//! `perf/notes/2026-12-04-a-bad-day-at-the-store.md`).

use std::sync::LazyLock;

use crate::base::ids::TenantId;
use crate::logic::snapshot::ModelKey;
use crate::router::sync::entry::put_varint;
use crate::router::sync::pool_store::{self, lua_varint};
use crate::router::sync::round::DailyWrite;

/// A script and the SHA1 the store knows it by.
pub struct Script {
    pub code: &'static str,
    /// Lowercase hex, as `EVALSHA` takes it.
    pub sha1: String,
}

impl Script {
    pub(super) fn new(code: &'static str) -> Script {
        let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, code.as_bytes());
        Script {
            code,
            sha1: hex::encode(digest.as_ref()),
        }
    }

    /// The call: `EVALSHA sha1` by default, `EVAL code` after the store answered `NOSCRIPT`.
    pub fn call(&self, full: bool) -> redis::Cmd {
        if full {
            let mut command = redis::cmd("EVAL");
            command.arg(self.code);
            command
        } else {
            let mut command = redis::cmd("EVALSHA");
            command.arg(&self.sha1);
            command
        }
    }
}

pub static GRANT: LazyLock<Script> = LazyLock::new(|| Script::new(pool_store::GRANT));
pub static ROUND: LazyLock<Script> = LazyLock::new(|| Script::new(pool_store::ROUND));
pub static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(pool_store::RELEASE));
pub static USAGE: LazyLock<Script> = LazyLock::new(|| Script::new(USAGE_CODE));

/// Whether a reply is the store's "no script by that SHA1" (`NOSCRIPT`): the script did not run.
pub fn noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(error) if error.code() == "NOSCRIPT")
}

/// The same for an error already taken out of its reply.
pub fn noscript_error(error: &redis::RedisError) -> bool {
    error.code() == Some("NOSCRIPT")
}

/// The round's usage writes, atomically: the stream entries, then per day the packed daily
/// totals (see the module doc) and the day's expiry, and the site's levels of contended rate
/// buckets (`sync::levels`: every tracked bucket the entries used is lowered, and each bucket
/// asked for is answered with its level). Every read comes before the first write, so a command
/// the ACL refuses inside the script (`HMGET`, `TIME`, `HRANDFIELD`) fails it before it wrote
/// anything.
///
/// KEYS: the usage stream, the levels hash, the hash of what of each router's usage the levels
/// count (its run and newest batch applied), one daily hash per day, then the router records'
/// hash. ARGV: the stream's
/// `MINID`, the entry count `n`, the `n` entries, the router ID, the daily hashes' expiry
/// (seconds), the model count `m`, the `m` models (`capability|name`), one blob per daily hash,
/// then the levels hash's expiry (seconds), the sweep's field count, the round's interval (ms),
/// the asks' model count `a`,
/// the `a` models (`capability code|name`), the asks' blob (`sync::levels::pack`), the exclusive
/// start of the entries the asks' views did not count (`(ID`, empty for none), this router's
/// run, the most entries the round reads and its heartbeat, written last: a round whose usage
/// the store refused does not show the router live beside it (`sync::simulation`, seed
/// 3,043); then the marks beside the totals (`sync::counted`), `d run at` triples with `d` the
/// index of the daily hash in KEYS, each written as the field `|router|run`; last, how many of
/// the entries, first among them, are copies of usage published before (`sync::republish`).
/// Returns the ID of the last entry added (false when none was), the asked levels in units, in
/// order, and the levels of the tracked buckets the entries used without asking, as field,
/// level pairs. Each entry is added with a field `l` beside its usage `u`: its rate usage is in
/// the levels; a copy's usage is under `c` instead, and lowers no level (nor does a copy read
/// after a view's cursor lower the level started from the view).
const USAGE_CODE: &str = concat!(
    lua_varint!(),
    r#"
-- Two hex digits per byte, looked up: a string.format per total cost the store an eighth more.
local hex = {}
for i = 0, 255 do hex[i] = string.format('%02x', i) end
local n = tonumber(ARGV[2])
local router = ARGV[3 + n]
local ttl = ARGV[4 + n]
local m = tonumber(ARGV[5 + n])
local suffixes = {'|'}
for i = 1, m do suffixes[i + 1] = ARGV[5 + n + i] end
local days = {}
-- The daily hashes, between the levels' keys and the router records' hash (the last key).
local days_end = #KEYS - 1
for d = 4, days_end do
  local blob = ARGV[5 + n + m + d - 3]
  local adds, add_fields, sets = {}, {}, {}
  local at = 1
  while at <= #blob do
    local b1, b2, b3, b4 = string.byte(blob, at, at + 3)
    local tag, amount
    tag, at = varint(blob, at + 4)
    amount, at = varint(blob, at)
    local field = router .. '|' .. hex[b4] .. hex[b3] .. hex[b2] .. hex[b1] .. '|' .. suffixes[math.floor(tag / 2) + 1]
    if tag % 2 == 1 then
      sets[field] = amount
    else
      if adds[field] == nil then add_fields[#add_fields + 1] = field; adds[field] = 0 end
      adds[field] = adds[field] + amount
    end
  end
  local current = {}
  for first = 1, #add_fields, 1000 do
    local last = math.min(first + 999, #add_fields)
    local values = redis.call('HMGET', KEYS[d], unpack(add_fields, first, last))
    for i = first, last do current[add_fields[i]] = tonumber(values[i - first + 1]) or 0 end
  end
  days[d] = {adds = adds, add_fields = add_fields, sets = sets, current = current}
end
-- The levels: the rate usage of every entry (version 1, `sync::entry`), by field.
local base = 5 + n + m + days_end - 2
local levels_ttl = ARGV[base]
local sweep = tonumber(ARGV[base + 1])
local interval = tonumber(ARGV[base + 2])
local a = tonumber(ARGV[base + 3])
local ask_models = {}
for i = 1, a do ask_models[i] = ARGV[base + 3 + i] end
local asks_blob = ARGV[base + 4 + a]
local views_after = ARGV[base + 5 + a]
local run = tonumber(ARGV[base + 6 + a])
local read_max = ARGV[base + 7 + a]
local heartbeat = ARGV[base + 8 + a]
-- The first `copies` entries publish again usage published before (`sync::republish`).
local copies = tonumber(ARGV[base + 10 + a]) or 0
local used, fields, known = {}, {}, {}
local function touch(field)
  if not known[field] then known[field] = true; fields[#fields + 1] = field end
end
-- One entry's run, admission time and (with `bodies`) rate usage; nil for an entry of another
-- version.
local function entry_usage(blob, bodies)
  local found = {}
  if string.byte(blob, 1) ~= 1 then return nil end
  local length, at = varint(blob, 2)
  found.router = string.sub(blob, at, at + length - 1)
  at = at + length
  local admitted
  found.run, at = varint(blob, at)
  admitted, at = varint(blob, at)
  found.admitted = admitted
  if not bodies then return found end
  local _
  _, at = varint(blob, at)
  local count
  count, at = varint(blob, at)
  local models = {}
  for j = 1, count do
    local capability = string.byte(blob, at)
    length, at = varint(blob, at + 1)
    models[j] = capability .. '|' .. string.sub(blob, at, at + length - 1)
    at = at + length
  end
  count, at = varint(blob, at)
  for _ = 1, count do
    local b1, b2, b3, b4 = string.byte(blob, at, at + 3)
    local key = hex[b4] .. hex[b3] .. hex[b2] .. hex[b1]
    local buckets
    buckets, at = varint(blob, at + 4)
    for _ = 1, buckets do
      local tag = string.byte(blob, at)
      at = at + 1
      local kind = tag % 4
      local model = ''
      if math.floor(tag / 4) % 2 == 1 then
        local index = math.floor(tag / 16)
        if index == 15 then index, at = varint(blob, at) end
        model = models[index + 1]
      end
      if math.floor(tag / 8) % 2 == 1 then _, at = varint(blob, at) end
      local amount
      amount, at = varint(blob, at)
      if kind ~= 3 then found[#found + 1] = {key .. '|' .. kind .. '|' .. model, amount} end
    end
  end
  return found
end
local batches = {}
-- What of this router's usage the levels count: its run and the newest batch applied. A batch
-- published again (its round's reply was lost) is not applied twice.
-- Without a tracked bucket and without an ask, no usage lowers any level: the entries' bodies
-- are not read (most rounds of a site whose limits have room).
local contended = #asks_blob > 0 or redis.call('EXISTS', KEYS[2]) == 1
-- Of its latest run and of the run before: a run publishes its predecessor's journal first.
local marks = {-1, -1, -1, -1}
local applied = redis.call('HGET', KEYS[3], router)
if applied then
  local i = 0
  for value in string.gmatch(applied, '[^,]+') do
    i = i + 1
    marks[i] = tonumber(value)
  end
end
local applied_run, applied_at, previous_run, previous_at = marks[1], marks[2], marks[3], marks[4]
for i = copies + 1, n do
  local parsed, found = pcall(entry_usage, ARGV[2 + i], contended)
  if parsed and found then
    batches[#batches + 1] = found
    for _, usage in ipairs(found) do
      touch(usage[1])
      used[usage[1]] = true
    end
  end
end
local asks = {}
local at = 1
while at <= #asks_blob do
  local b1, b2, b3, b4 = string.byte(asks_blob, at, at + 3)
  local tag = string.byte(asks_blob, at + 4)
  at = at + 5
  local model = ''
  if math.floor(tag / 4) % 2 == 1 then
    local index
    index, at = varint(asks_blob, at)
    model = ask_models[index + 1]
  end
  local ask = {field = hex[b4] .. hex[b3] .. hex[b2] .. hex[b1] .. '|' .. (tag % 4) .. '|' .. model,
    settled = math.floor(tag / 8) % 2 == 1}
  ask.rate, at = varint(asks_blob, at)
  local capacity
  capacity, at = varint(asks_blob, at)
  ask.capacity = capacity * 60000
  local zigzag
  zigzag, at = varint(asks_blob, at)
  if zigzag % 2 == 0 then ask.view = zigzag / 2 else ask.view = -(zigzag + 1) / 2 end
  touch(ask.field)
  asks[#asks + 1] = ask
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- A level brought up to `time` (never back).
local function refill(level, time)
  if time > level.since then
    if level.units < level.capacity then
      level.units = math.min(level.capacity, level.units + (time - level.since) * level.rate)
    end
    level.since = time
  end
end
local function level_at(value)
  local comma1 = string.find(value, ',', 1, true)
  local comma2 = string.find(value, ',', comma1 + 1, true)
  local comma3 = string.find(value, ',', comma2 + 1, true)
  return {
    units = tonumber(string.sub(value, 1, comma1 - 1)),
    since = tonumber(string.sub(value, comma1 + 1, comma2 - 1)),
    rate = tonumber(string.sub(value, comma2 + 1, comma3 - 1)),
    capacity = tonumber(string.sub(value, comma3 + 1)),
  }
end
local levels = {}
for first = 1, #fields, 1000 do
  local last = math.min(first + 999, #fields)
  local values = redis.call('HMGET', KEYS[2], unpack(fields, first, last))
  for i = first, last do
    local value = values[i - first + 1]
    if value then levels[fields[i]] = level_at(value) end
  end
end
local swept = {}
if #fields > 0 and sweep > 0 then
  local random = redis.call('HRANDFIELD', KEYS[2], sweep, 'WITHVALUES')
  for i = 1, #random, 2 do
    if not known[random[i]] then
      local level = level_at(random[i + 1])
      refill(level, now)
      if level.units >= level.capacity then swept[#swept + 1] = random[i] end
    end
  end
end
-- Each batch's usage at the time it was admitted (a batch held back in an outage is not
-- charged the refill its bucket had meanwhile), then every level brought up to now.
local newest_applied = false
for _, batch in ipairs(batches) do
  local time = math.min(batch.admitted, now)
  local again = (batch.run == applied_run and batch.admitted <= applied_at)
    or (batch.run == previous_run and batch.admitted <= previous_at)
  if not again then
    if batch.run ~= applied_run then previous_run, previous_at = applied_run, applied_at end
    applied_run, applied_at = batch.run, batch.admitted
    newest_applied = true
  end
  for _, usage in ipairs(again and {} or batch) do
    local level = levels[usage[1]]
    if level then
      refill(level, time)
      level.units = math.max(-level.capacity, level.units - usage[2] * 60000)
    end
  end
end
for _, level in pairs(levels) do refill(level, now) end
-- A level started from a view is lowered by what the view did not count: the other runs' usage
-- after the cursor the view was taken at, published while nobody tracked the bucket. Read only
-- when an ask starts a level.
local unread = {}
for _, ask in ipairs(asks) do
  if not levels[ask.field] and ask.settled then unread[ask.field] = 0 end
end
if views_after ~= '' and next(unread) then
  for _, item in ipairs(redis.call('XRANGE', KEYS[1], views_after, '+', 'COUNT', read_max)) do
    local values = item[2]
    for j = 1, #values - 1, 2 do
      if values[j] == 'u' then
        local parsed, found = pcall(entry_usage, values[j + 1], true)
        if parsed and found and not (found.router == router and found.run == run) then
          for _, usage in ipairs(found) do
            if unread[usage[1]] then unread[usage[1]] = unread[usage[1]] + usage[2] end
          end
        end
      end
    end
  end
end
local answers, asked = {}, {}
for i, ask in ipairs(asks) do
  asked[ask.field] = true
  local level = levels[ask.field]
  if not level and ask.settled then
    local view = ask.view - unread[ask.field] * 60000
    level = {units = math.max(-ask.capacity, math.min(view, ask.capacity))}
    levels[ask.field] = level
  elseif level then
    level.units = math.min(level.units, ask.capacity)
    -- A view lower than the level by more than an interval's refill knows usage the level
    -- does not (a bucket tracked from another router's stale view): the level comes down.
    -- Not a view that was never anchored since a replay or merged usage lowered it.
    if ask.settled then level.units = math.min(level.units, ask.view + ask.rate * interval) end
  end
  if level then
    level.rate = ask.rate
    level.capacity = ask.capacity
    answers[i] = level.units
  else
    -- An unsettled view starts no level either: it is answered with itself.
    answers[i] = math.max(-ask.capacity, math.min(ask.view, ask.capacity))
  end
end
-- The tracked buckets the entries used and nobody asked: the writer's view may be high.
local published = {}
for _, field in ipairs(fields) do
  local level = levels[field]
  if level and used[field] and not asked[field] then
    published[#published + 1] = field
    published[#published + 1] = level.units
  end
end
local out, gone = {}, swept
for _, field in ipairs(fields) do
  local level = levels[field]
  if level then
    if level.units >= level.capacity then
      gone[#gone + 1] = field
    else
      out[#out + 1] = field
      out[#out + 1] = string.format('%d,%d,%d,%d', level.units, now, level.rate, level.capacity)
    end
  end
end
-- Writes from here on.
local newest = false
for i = 1, n do
  local name = 'u'
  if i <= copies then name = 'c' end
  newest = redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], '*', name, ARGV[2 + i], 'l', '1')
end
for d = 4, days_end do
  local day = days[d]
  local pairs_out = {}
  for _, field in ipairs(day.add_fields) do
    pairs_out[#pairs_out + 1] = field
    pairs_out[#pairs_out + 1] = string.format('%d', day.current[field] + day.adds[field])
  end
  for field, amount in pairs(day.sets) do
    pairs_out[#pairs_out + 1] = field
    pairs_out[#pairs_out + 1] = string.format('%d', amount)
  end
  for first = 1, #pairs_out, 2000 do
    redis.call('HSET', KEYS[d], unpack(pairs_out, first, math.min(first + 1999, #pairs_out)))
  end
  redis.call('EXPIRE', KEYS[d], ttl)
end
for first = 1, #gone, 1000 do
  redis.call('HDEL', KEYS[2], unpack(gone, first, math.min(first + 999, #gone)))
end
if newest_applied then
  redis.call('HSET', KEYS[3], router,
    string.format('%d,%d,%d,%d', applied_run, applied_at, previous_run, previous_at))
  redis.call('EXPIRE', KEYS[3], levels_ttl)
end
for first = 1, #out, 2000 do
  redis.call('HSET', KEYS[2], unpack(out, first, math.min(first + 1999, #out)))
end
if #out > 0 then redis.call('EXPIRE', KEYS[2], levels_ttl) end
-- The marks beside the totals (`sync::counted`): the newest batch of each run they hold.
local marks = ARGV[base + 9 + a]
if marks then
  for d, of_run, at in string.gmatch(marks, '(%d+) (%d+) (%d+)') do
    redis.call('HSET', KEYS[tonumber(d)], '|' .. router .. '|' .. of_run, at)
  end
end
-- Last: the heartbeat says this router is live only beside the usage it published.
redis.call('HSET', KEYS[#KEYS], router, heartbeat)
return {newest, answers, published}
"#
);

/// The largest amount the script adds exactly: Lua's numbers are doubles. No day's tokens come
/// near it; a total past it is written as this (the budget refuses long before).
pub const AMOUNT_MAX: u64 = 1 << 53;

/// One daily total for the round: the field's parts and how it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DailyRow {
    pub day: u32,
    pub tenant: TenantId,
    pub model: Option<ModelKey>,
    /// `sync::daily_fields::daily_field` of the above: the field the script writes, and what the
    /// plain commands write when the store refuses scripts.
    pub field: String,
    pub write: DailyWrite,
}

/// The packed form of a round's daily totals (see the module doc): the models (`capability|name`)
/// and one blob per day, days ascending.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PackedTotals {
    pub models: Vec<String>,
    pub days: Vec<(u32, Vec<u8>)>,
}

pub fn pack(rows: &[DailyRow]) -> PackedTotals {
    let mut packed = PackedTotals::default();
    let mut model_index: std::collections::HashMap<(crate::base::ids::Capability, &str), u64> =
        std::collections::HashMap::new();
    let mut order: Vec<&DailyRow> = rows.iter().collect();
    order.sort_by_key(|row| row.day);
    for row in order {
        let model = match &row.model {
            None => 0,
            Some(model) => {
                let next = packed.models.len() as u64 + 1;
                *model_index
                    .entry((model.capability, &model.name))
                    .or_insert_with(|| {
                        packed
                            .models
                            .push(format!("{}|{}", model.capability.as_str(), model.name));
                        next
                    })
            }
        };
        let (whole, amount) = match row.write {
            DailyWrite::Add(amount) => (0, amount),
            DailyWrite::Set(amount) => (1, amount),
        };
        if packed.days.last().is_none_or(|(day, _)| *day != row.day) {
            packed.days.push((row.day, Vec::new()));
        }
        let blob = &mut packed.days.last_mut().expect("pushed above").1;
        blob.extend_from_slice(&row.tenant.0.to_le_bytes());
        put_varint(blob, model << 1 | whole);
        put_varint(blob, amount.min(AMOUNT_MAX));
    }
    packed
}

/// Bytes of `reply` as the store sent it (RESP2, what the connection speaks; RESP3 kinds are
/// sized as RESP3 sends them): `hivenet_sync_store_read_bytes_total`.
pub fn reply_bytes(reply: &redis::Value) -> u64 {
    use redis::Value;
    fn digits(value: u64) -> u64 {
        value.checked_ilog10().unwrap_or(0) as u64 + 1
    }
    fn signed(value: i64) -> u64 {
        digits(value.unsigned_abs()) + u64::from(value < 0)
    }
    // A type byte, the text, CRLF.
    let line = |text: u64| 1 + text + 2;
    let bulk = |len: u64| line(digits(len)) + len + 2;
    match reply {
        Value::Nil => line(2),
        Value::Int(value) => line(signed(*value)),
        Value::BulkString(bytes) => bulk(bytes.len() as u64),
        Value::Array(items) | Value::Set(items) => {
            line(digits(items.len() as u64)) + items.iter().map(reply_bytes).sum::<u64>()
        }
        Value::SimpleString(text) => line(text.len() as u64),
        Value::Okay => line(2),
        Value::Map(pairs) => {
            line(digits(pairs.len() as u64))
                + pairs
                    .iter()
                    .map(|(key, value)| reply_bytes(key) + reply_bytes(value))
                    .sum::<u64>()
        }
        Value::Attribute { data, attributes } => {
            line(digits(attributes.len() as u64))
                + attributes
                    .iter()
                    .map(|(key, value)| reply_bytes(key) + reply_bytes(value))
                    .sum::<u64>()
                + reply_bytes(data)
        }
        Value::Double(value) => line(value.to_string().len() as u64),
        Value::Boolean(_) => line(1),
        Value::VerbatimString { text, .. } => bulk(text.len() as u64 + 4),
        Value::BigNumber(number) => line(number.len() as u64),
        Value::Push { data, .. } => {
            line(digits(data.len() as u64 + 1)) + data.iter().map(reply_bytes).sum::<u64>()
        }
        Value::ServerError(error) => {
            line(error.code().len() as u64 + error.details().map_or(0, |d| d.len() as u64 + 1))
        }
        // A kind a later redis crate adds: at least its type byte and CRLF.
        _ => line(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::ids::Capability;

    #[test]
    fn a_script_is_named_by_the_sha1_of_its_text() {
        // `redis-cli SCRIPT LOAD "return 1"` answers this.
        assert_eq!(
            Script::new("return 1").sha1,
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn totals_pack_by_day_with_their_models_once() {
        let chat = ModelKey {
            name: "chat".into(),
            capability: Capability::Llm,
        };
        let row = |day, tenant, model: Option<&ModelKey>, write| DailyRow {
            day,
            tenant: TenantId(tenant),
            model: model.cloned(),
            field: String::new(),
            write,
        };
        let packed = pack(&[
            row(20_001, 0x0102_0304, None, DailyWrite::Add(300)),
            row(20_000, 7, Some(&chat), DailyWrite::Set(5)),
            row(20_001, 8, Some(&chat), DailyWrite::Add(1)),
        ]);
        assert_eq!(packed.models, vec!["llm|chat".to_string()]);
        assert_eq!(
            packed.days,
            vec![
                (20_000, vec![7, 0, 0, 0, 0b11, 5]),
                (20_001, vec![4, 3, 2, 1, 0, 0xac, 0x02, 8, 0, 0, 0, 0b10, 1]),
            ]
        );
    }

    #[test]
    fn replies_are_sized_as_resp_sends_them() {
        use redis::Value;
        assert_eq!(reply_bytes(&Value::Okay), b"+OK\r\n".len() as u64);
        assert_eq!(reply_bytes(&Value::Nil), b"$-1\r\n".len() as u64);
        assert_eq!(reply_bytes(&Value::Int(-12)), b":-12\r\n".len() as u64);
        assert_eq!(
            reply_bytes(&Value::Array(vec![
                Value::BulkString(b"router-0".to_vec()),
                Value::Int(0)
            ])),
            b"*2\r\n$8\r\nrouter-0\r\n:0\r\n".len() as u64
        );
        assert_eq!(
            reply_bytes(&Value::BulkString(vec![0; 10])),
            b"$10\r\n0123456789\r\n".len() as u64
        );
    }
}
