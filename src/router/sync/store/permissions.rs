//! The store's ACL, checked where it matters (issue 37, "Store permissions"): every command the
//! sync needs ([`NEEDED`]), run once, harmlessly, on probe keys at start and on each new
//! connection ([`Store::refused`]), and the test that tells a permission refusal from a store
//! that is unreachable or failing otherwise ([`refused_permission`]).

use redis::{RedisResult, Value};

use super::Store;
use super::scripts::Script;

/// [`PROBE_SCRIPT`] with its SHA1.
static PROBE: std::sync::LazyLock<Script> = std::sync::LazyLock::new(|| Script::new(PROBE_SCRIPT));

/// Every command a router's sync sends, and what it needs it for (`Store::refused` checks each).
/// `WAIT` is needed with Sentinel only; the scripts' own commands are checked inside a script
/// ([`PROBE_SCRIPT`]). `HINCRBY` writes the daily totals only when the store refuses the
/// round's usage script (`store::scripts`), and is checked all the same: an ACL that refuses
/// both would lose the totals.
pub const NEEDED: [(&str, &str); 19] = [
    ("MULTI", "the round's transaction"),
    ("EXEC", "the round's transaction"),
    ("XADD", "publishing usage"),
    ("XRANGE", "reading the others' usage"),
    ("XREVRANGE", "reading today's totals at start"),
    ("HINCRBY", "writing daily totals"),
    ("HSET", "daily totals and the heartbeat"),
    ("HGETALL", "reading heartbeats, totals and pools"),
    ("HMGET", "reading the agent lists of other routers"),
    ("HDEL", "forgetting routers gone for an hour"),
    ("EXPIRE", "daily totals' expiry"),
    (
        "SET",
        "the epoch, the router ID's claim and redirect tokens",
    ),
    ("GET", "the epoch and the router ID's claim"),
    ("PEXPIRE", "renewing the router ID's claim"),
    ("DEL", "releasing the router ID's claim"),
    (
        "EVALSHA",
        "occupancy credits of budgeted models, and the round's usage writes (scripts run by their SHA1)",
    ),
    (
        "EVAL",
        "occupancy credits of budgeted models (a script's text, when the store does not know its SHA1)",
    ),
    ("INFO", "noticing a failover (INFO replication)"),
    (
        "WAIT",
        "a replica's acknowledgement of occupancy grants under Sentinel",
    ),
];

/// Runs each command the scripts (`pool_store`'s `GRANT`, `RELEASE`, `ROUND`, and the round's
/// usage script of `store::scripts`) run, on the probe keys, and returns the names of those the
/// store's ACL refuses (a script's commands are checked against the user's ACL one by one, so
/// `EVAL` alone allowed is not enough). Leaves nothing: what it adds it removes again,
/// atomically; its `XADD` creates no stream (`NOMKSTREAM`).
const PROBE_SCRIPT: &str = r#"
local refused = {}
local calls = {
  {'GET', KEYS[1]}, {'HGETALL', KEYS[2]}, {'HGET', KEYS[2], 'f'}, {'HSET', KEYS[2], 'f', '0'},
  {'HMGET', KEYS[2], 'f'}, {'EXPIRE', KEYS[2], '60'},
  {'HDEL', KEYS[2], 'f'}, {'SADD', KEYS[3], 'm'}, {'SMEMBERS', KEYS[3]}, {'SREM', KEYS[3], 'm'},
  {'EXISTS', KEYS[2]}, {'XADD', KEYS[4], 'NOMKSTREAM', 'MINID', '~', '0', '*', 'u', ''},
  {'TIME'}, {'HRANDFIELD', KEYS[2], '1', 'WITHVALUES'}, {'XRANGE', KEYS[4], '-', '+', 'COUNT', '1'},
}
for _, call in ipairs(calls) do
  local reply = redis.pcall(unpack(call))
  if type(reply) == 'table' and reply.err and (string.find(reply.err, 'NOPERM', 1, true)
      or string.find(reply.err, 'ACL', 1, true)
      or string.find(string.lower(reply.err), 'no permissions', 1, true)) then
    table.insert(refused, call[1])
  end
end
return refused
"#;

/// Whether `error` is the store's ACL refusing a command or a key (`NOPERM`, or an `ACL failure`
/// inside a script), as opposed to the store being unreachable or failing otherwise.
pub fn refused_permission(error: &redis::RedisError) -> bool {
    if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        || error.code() == Some("NOPERM")
    {
        return true;
    }
    permission_text(&error.to_string())
}

fn permission_text(text: &str) -> bool {
    text.contains("NOPERM")
        || text.contains("ACL failure")
        || text.to_ascii_lowercase().contains("no permissions")
}

impl Store {
    /// The commands the sync needs that the store's ACL refuses, each with what it is needed
    /// for (empty: every one is allowed). Each command runs once, harmlessly, on probe keys under
    /// the site's hash tag (`probe:{router}:…`): a stream write that creates nothing (`XADD
    /// NOMKSTREAM`), writes that find nothing to change (`SET XX`, `EXPIRE` and `PEXPIRE` of a
    /// missing key), a hash field added and removed, an empty `MULTI`/`EXEC`, and a script that
    /// runs the scripts' own commands, sent with its text (`EVAL`) and then by its SHA1
    /// (`EVALSHA`, which the `EVAL` just cached). `WAIT` is checked with `sentinel` only. Neither
    /// `ACL DRYRUN` nor `COMMAND` is used: an ordinary user may not run them.
    pub async fn refused(&mut self, sentinel: bool) -> RedisResult<Vec<(String, &'static str)>> {
        let stream = self.key(&format!("probe:{}:stream", self.router));
        let hash = self.key(&format!("probe:{}:hash", self.router));
        let string = self.key(&format!("probe:{}:string", self.router));
        let set = self.key(&format!("probe:{}:set", self.router));
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut names: Vec<&'static str> = Vec::new();
        let mut add = |pipe: &mut redis::Pipeline, name: &'static str, args: &[&str]| {
            let mut command = redis::cmd(name);
            for arg in args {
                command.arg(*arg);
            }
            pipe.add_command(command);
            names.push(name);
        };
        add(
            &mut pipe,
            "XADD",
            &[&stream, "NOMKSTREAM", "MINID", "~", "0", "*", "u", ""],
        );
        add(&mut pipe, "XRANGE", &[&stream, "-", "+", "COUNT", "1"]);
        add(&mut pipe, "XREVRANGE", &[&stream, "+", "-", "COUNT", "1"]);
        add(&mut pipe, "HINCRBY", &[&hash, "f", "0"]);
        add(&mut pipe, "HSET", &[&hash, "f", "0"]);
        add(&mut pipe, "EXPIRE", &[&hash, "60"]);
        add(&mut pipe, "HGETALL", &[&hash]);
        add(&mut pipe, "HMGET", &[&hash, "f"]);
        add(&mut pipe, "HDEL", &[&hash, "f"]);
        add(&mut pipe, "SET", &[&string, "1", "XX", "PX", "1"]);
        add(&mut pipe, "GET", &[&string]);
        add(&mut pipe, "PEXPIRE", &[&string, "1"]);
        add(&mut pipe, "DEL", &[&string]);
        add(
            &mut pipe,
            "EVAL",
            &[PROBE_SCRIPT, "4", &string, &hash, &set, &stream],
        );
        add(
            &mut pipe,
            "EVALSHA",
            &[&PROBE.sha1, "4", &string, &hash, &set, &stream],
        );
        add(&mut pipe, "INFO", &["replication"]);
        if sentinel {
            add(&mut pipe, "WAIT", &["0", "0"]);
        }
        // Last: should `EXEC` be refused after `MULTI` was allowed, the connection is left
        // inside a transaction, and is dropped below.
        add(&mut pipe, "MULTI", &[]);
        add(&mut pipe, "EXEC", &[]);
        let replies: Vec<Value> = self.query(&pipe).await?;
        let mut refused: Vec<(String, &'static str)> = Vec::new();
        for (name, reply) in names.iter().zip(&replies) {
            match reply {
                Value::ServerError(error)
                    if error.kind() == Some(redis::ServerErrorKind::NoPerm)
                        || permission_text(&format!(
                            "{} {}",
                            error.code(),
                            error.details().unwrap_or("")
                        )) =>
                {
                    refused.push((name.to_string(), needed_for(name)));
                }
                // The probe script's answer: the scripts' commands it was refused (the same
                // from `EVALSHA`, when `EVAL` was refused).
                Value::Array(inner)
                    if *name == "EVAL"
                        || (*name == "EVALSHA"
                            && refused.iter().any(|(refused, _)| refused == "EVAL")) =>
                {
                    for command in inner {
                        if let Ok(command) = redis::from_redis_value_ref::<String>(command) {
                            refused.push((format!("{command} (in a script)"), needed_for("EVAL")));
                        }
                    }
                }
                _ => {}
            }
        }
        if refused.iter().any(|(name, _)| name == "EXEC") {
            self.connection = None;
        }
        // The round's usage script again, once the store allows scripts and what they run.
        if !refused
            .iter()
            .any(|(name, _)| name.starts_with("EVAL") || name.ends_with("(in a script)"))
        {
            self.usage_script_refused = false;
        }
        Ok(refused)
    }
}

/// What the sync needs `command` for ([`NEEDED`]).
fn needed_for(command: &str) -> &'static str {
    NEEDED
        .iter()
        .find(|(name, _)| *name == command)
        .map_or("the sync", |(_, why)| why)
}
