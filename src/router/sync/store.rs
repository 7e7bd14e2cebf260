//! The Valkey side of the sync round: one connection (directly, or to the primary the Sentinels
//! name), the keys of one site, the few commands a round needs, and the occupancy-credit calls
//! that run the scripts of `sync::pool_store`.
//!
//! # Keys (all under the hash tag `{site}`, so they live on one node)
//! - `hivenet:{site}:usage`: the usage stream, one entry per router and round (field `u`, the
//!   binary entry of `sync::entry`; `c` instead for a copy of usage published before,
//!   `sync::republish`), trimmed to the last ten minutes by the writers.
//! - `hivenet:{site}:routers`: hash, router ID -> heartbeat (JSON, `sync::site::Heartbeat`).
//! - `hivenet:{site}:agents`: hash, router ID -> the agents it serves (JSON,
//!   `sync::site::AgentList`), written when they change; the heartbeat names its version, and a
//!   reader fetches a list only when the version it holds is not the one named.
//! - `hivenet:{site}:daily:{day}`: hash, `router|tenant|capability|model` -> that router's
//!   running total of the day (`sync::daily_fields::daily_field`), written as increments so two
//!   writers of one field never lose each other's tokens (`sync::round::DailyLedger`): packed in
//!   the round's usage script (`store::scripts`), or one `HINCRBY` each when the store refuses
//!   scripts; expires two days after its last write. Beside the totals, `|router|run` -> the
//!   admission time of that run's newest batch they hold (`sync::counted`), in the same write.
//! - `hivenet:{site}:memory:{day}`: hash, written for a few rounds after the store lost its data:
//!   a router's field of each budget -> what it counts of the others, and beside it
//!   `|router|run|field` -> the newest batch of that run the count holds (`sync::counted`).
//! - `hivenet:{site}:owner:{router}`: which process runs under this router ID
//!   (`sync::claim`), set `NX` with an expiry and renewed by each round.
//! - `hivenet:{site}:probe:{router}:…`: keys the permission check touches (`Store::refused`);
//!   none outlives the check by more than a minute.
//! - `hivenet:{site}:redirect:{nonce}`: a spent redirect token, until it expires.
//! - `hivenet:{site}:pool:{capability}|{model}|{tokens,requests}`: an occupancy budget's pool,
//!   router ID -> `run:held[:short]` (`sync::pool_store`); `hivenet:{site}:pools`: the set of
//!   pools, for taking a router's holdings back from all of them.
//! - `hivenet:{site}:epoch`: set once by the first router to reach an empty store; a new value
//!   tells every router the store lost its data.
//!
//! # Error handling
//! Every call is bounded by the connection and response timeouts; any error drops the connection
//! so the next round connects again (asking the Sentinels for the primary: that is how a failover
//! is followed). [`Store::rebuild`] starts over from the configured addresses. A command the
//! store's ACL refuses is a permission error ([`refused_permission`]), not an unreachable store:
//! [`Store::refused`] names every command the sync needs that the store refuses, and a round
//! keeps apart what may fail alone (the occupancy pools' script, [`Store::pools`]) from what
//! must be written together (entries, daily totals, heartbeat, [`Store::round`]).

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisResult, Value};

use super::levels;
use super::pool_store::Grant;
use super::round::DailyWrite;
use crate::router::config::sync::StoreSettings;

mod credits;
mod permissions;
mod round;
mod scripts;
pub use permissions::{NEEDED, refused_permission};
pub use scripts::DailyRow;
use scripts::{GRANT, RELEASE, ROUND, Script, USAGE, noscript, noscript_error, pack, reply_bytes};

/// How long usage stays on the stream: a router away longer re-reads the daily totals instead
/// of the entries it missed.
pub const STREAM_KEEP_MS: u64 = 10 * 60 * 1000;
/// Entries read per round at most; the rest are read next round.
pub const READ_MAX: usize = 10_000;
/// A daily hash outlives its day by this much (a router behind midnight still writes to it).
const DAILY_TTL_SECONDS: u64 = 2 * 86_400;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A stream entry ID (`ms-seq`), ordered as the store orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    pub fn parse(text: &str) -> Option<StreamId> {
        let (ms, seq) = text.split_once('-')?;
        Some(StreamId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What one round writes.
pub struct RoundWrites<'a> {
    /// Encoded entries, oldest first.
    pub entries: &'a [Vec<u8>],
    /// The first `copies` of `entries` are copies of usage published before
    /// (`sync::republish`): written under the field `c`, they lower no level.
    pub copies: usize,
    /// The daily totals: each an increment, or a whole total after the store lost its data.
    pub totals: &'a [DailyRow],
    pub heartbeat: &'a str,
    /// This router's agent list (`sync::site::AgentList`), when it changed since it was last
    /// written (or the store may have lost it).
    pub agents: Option<&'a str>,
    /// Read the entries after this ID.
    pub after: StreamId,
    /// The cursor the round's views (`asks`) were taken at, before a resync's read moved it:
    /// a level the round starts from a view is lowered by the other runs' usage after it
    /// (`sync::levels::Levels::round`'s `unread`). `None` before the first read (a start).
    pub views_after: Option<StreamId>,
    /// This process's run: its own entries after `views_after` are in its views.
    pub run: u64,
    /// The rate buckets whose site level the round asks for (`sync::levels`).
    pub asks: &'a [levels::Ask],
    /// The newest batch of each run whose daily usage this round's totals hold: (day, run,
    /// admitted at), written beside the totals of the day (`sync::counted`). One per (day, run)
    /// among the round's entries, so never more triples than `entries`.
    pub marks: &'a [(u32, u64, u64)],
    /// What this router remembers of the others' daily usage, after the store lost its data:
    /// (day, this router's field of the budget, tokens), written whole to `memory:{day}`.
    pub memory: &'a [(u32, String, u64)],
    /// The sync interval: a view below the site's level by more than its refill lowers the
    /// level (`sync::levels::Levels::round`).
    pub interval_ms: u64,
    /// Now (unix ms): an epoch this router sets begins now.
    pub now_ms: u64,
    /// This process's claim on its router ID (`sync::claim`): taken when free, renewed for
    /// `ttl_ms`, and read back. `release`: a clean shutdown gives it up instead.
    pub claim: ClaimWrite<'a>,
}

/// The claim a round writes: this process's value, how long it holds, and whether it is given
/// up (the last round of a clean shutdown).
pub struct ClaimWrite<'a> {
    pub value: &'a str,
    pub ttl_ms: u64,
    pub release: bool,
}

/// One occupancy pool in a round: what the router holds of it now (rewritten under `epoch`,
/// the epoch the router knows; `None`: only read), then a read of every holding.
pub struct PoolWrite<'a> {
    /// The pool's name under `pool:`.
    pub pool: &'a str,
    pub rewrite: Option<PoolRewrite<'a>>,
}

pub struct PoolRewrite<'a> {
    pub epoch: &'a str,
    pub run: u64,
    pub holding: u64,
    pub in_use: u64,
    pub short: bool,
}

/// What a round read of one pool: the rewrite's answer (`pool_store::ROUND`), and every
/// holding (router ID -> `run:held[:short]`).
pub struct PoolRead {
    pub rewritten: Option<i64>,
    pub holdings: HashMap<String, String>,
}

/// What one round reads back.
pub struct RoundReads {
    pub heartbeats: HashMap<String, String>,
    pub entries: Vec<(StreamId, Vec<u8>)>,
    /// The ID of this round's last entry, when the stream was read whole up to it in the same
    /// transaction: no other entry lies between `entries` and it, so the next round reads after
    /// it. `None`: nothing published, or not atomically with the read.
    pub own_newest: Option<StreamId>,
    /// The site's levels of the buckets asked, in order, counting every entry up to this
    /// round's; `None` when the round cannot tell (see `sync::levels`, "What is not anchored").
    pub levels: Option<levels::Answers>,
    /// An entry read was written without the levels (`sync::levels`).
    pub unlevelled: bool,
    /// The store's epoch (see the module doc).
    pub epoch: String,
    /// Who holds this router ID after the round's claim (`None` once released).
    pub claim_holder: Option<String>,
}

/// What the pools' step of a round read ([`Store::pools`]): one per pool, in order. A rewrite the
/// store refused (its ACL refuses the scripts) reads as no rewrite; `refused` holds the first refusal.
pub struct PoolsRead {
    pub pools: Vec<PoolRead>,
    pub refused: Option<redis::RedisError>,
}

/// One day's totals (field, tokens) and the routers' memory of each other's usage written after
/// the store lost its data (field, tokens).
pub type DayTotals = (Vec<(String, u64)>, Vec<(String, u64)>);

/// The totals of each day asked for, in order, the stream's newest entry, and the routers'
/// records and the store's epoch, read together.
pub struct DailyRead {
    pub days: Vec<DayTotals>,
    pub last: StreamId,
    /// (router ID, record text): whose totals are whole in `epoch` (`sync::whole`).
    pub heartbeats: Vec<(String, String)>,
    /// `None` before a router set one.
    pub epoch: Option<String>,
}

pub struct Store {
    settings: StoreSettings,
    prefix: String,
    /// This router's field in the heartbeat hash.
    router: String,
    /// The epoch this router sets when it finds the store without one, after the time it
    /// sets it: `{unix ms}-{router}-{random}` (the time starts the settle window).
    epoch_suffix: String,
    response_timeout: Duration,
    connection: Option<MultiplexedConnection>,
    /// The primary's replication ID (`INFO replication`, `master_replid`) at the last connect.
    replication_id: Option<String>,
    /// Times a connect found a new replication ID: a replica promoted, or the primary
    /// restarted; either may have lost its latest writes.
    failovers: u64,
    /// Connections made so far: a new one is checked for permissions ([`Store::refused`]).
    connects: u64,
    /// Bytes of every command this connection sent, as the store reads them (RESP), including
    /// what was sent when the answer did not come (`hivenet_sync_store_written_bytes_total`).
    written_bytes: u64,
    /// Bytes of every reply that came back whole (`hivenet_sync_store_read_bytes_total`).
    read_bytes: u64,
    /// The store's ACL refused the round's usage script: the round writes its entries and daily
    /// totals with plain commands (`XADD`, `HINCRBY`) until a permission check
    /// ([`Store::refused`], on each new connection) finds the scripts allowed again.
    usage_script_refused: bool,
    /// Where a pipeline is encoded to be measured; as large as the largest pipeline.
    measure: Vec<u8>,
}

impl Store {
    pub fn new(
        settings: StoreSettings,
        site: &str,
        router: &str,
        response_timeout: Duration,
    ) -> Store {
        if settings.tls {
            // The redis crate's rustls needs a process-wide provider; ours is ring.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        Store {
            settings,
            prefix: format!("hivenet:{{{site}}}"),
            router: router.to_owned(),
            epoch_suffix: format!("{router}-{:016x}", fastrand::u64(..)),
            response_timeout,
            connection: None,
            replication_id: None,
            failovers: 0,
            connects: 0,
            written_bytes: 0,
            read_bytes: 0,
            usage_script_refused: false,
            measure: Vec::new(),
        }
    }

    pub fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.prefix)
    }

    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(self.response_timeout))
    }

    async fn connect(&self) -> RedisResult<MultiplexedConnection> {
        let settings = &self.settings;
        let certificates = || redis::TlsCertificates {
            client_tls: None,
            root_cert: settings.tls_ca.clone(),
        };
        let redis_info = {
            let info = redis::RedisConnectionInfo::default();
            let info = match &settings.username {
                Some(username) => info.set_username(username),
                None => info,
            };
            match &settings.password {
                Some(password) => info.set_password(password),
                None => info,
            }
        };
        match &settings.sentinel_master {
            None => {
                let (host, port) = settings.addrs[0].clone();
                let addr = if settings.tls {
                    redis::ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure: false,
                        tls_params: None,
                    }
                } else {
                    redis::ConnectionAddr::Tcp(host, port)
                };
                let info = redis::IntoConnectionInfo::into_connection_info(addr)?
                    .set_redis_settings(redis_info);
                let client = if settings.tls {
                    redis::Client::build_with_tls(info, certificates())?
                } else {
                    redis::Client::open(info)?
                };
                tokio::time::timeout(
                    CONNECT_TIMEOUT + self.response_timeout,
                    client.get_multiplexed_async_connection_with_config(&self.config()),
                )
                .await
                .map_err(timed_out)?
            }
            Some(master) => {
                let sentinels = settings.addrs.iter().map(|(host, port)| {
                    if settings.tls {
                        redis::ConnectionAddr::TcpTls {
                            host: host.clone(),
                            port: *port,
                            insecure: false,
                            tls_params: None,
                        }
                    } else {
                        redis::ConnectionAddr::Tcp(host.clone(), *port)
                    }
                });
                let mut builder = redis::sentinel::SentinelClientBuilder::new(
                    sentinels,
                    master,
                    redis::sentinel::SentinelServerType::Master,
                )?;
                if let Some(password) = &settings.password {
                    builder = builder
                        .set_client_to_redis_password(password)
                        .set_client_to_sentinel_password(password);
                }
                if let Some(username) = &settings.username {
                    builder = builder.set_client_to_redis_username(username);
                }
                if settings.tls {
                    builder = builder
                        .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                        .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
                        .set_client_to_redis_certificates(certificates())
                        .set_client_to_sentinel_certificates(certificates());
                }
                let mut client = builder.build()?;
                tokio::time::timeout(
                    CONNECT_TIMEOUT * 3 + self.response_timeout,
                    client.get_async_connection_with_config(&self.config()),
                )
                .await
                .map_err(timed_out)?
            }
        }
    }

    async fn connection(&mut self) -> RedisResult<MultiplexedConnection> {
        if let Some(connection) = &self.connection {
            return Ok(connection.clone());
        }
        let mut connection = self.connect().await?;
        let mut info_command = redis::cmd("INFO");
        info_command.arg("replication");
        self.written_bytes += info_command.get_packed_command().len() as u64;
        let info: RedisResult<Value> = tokio::time::timeout(
            self.response_timeout,
            info_command.query_async(&mut connection),
        )
        .await
        .map_err(timed_out)?;
        if let Ok(reply) = &info {
            self.read_bytes += reply_bytes(reply);
        }
        let info = info.and_then(|reply| match reply {
            Value::ServerError(error) => Err(error.into()),
            reply => redis::from_redis_value::<String>(reply).map_err(Into::into),
        });
        let info = match info {
            Ok(info) => Some(info),
            Err(error) if error.is_io_error() || error.is_timeout() => return Err(error),
            // Refused (an ACL without INFO): no failover is noticed through this connection. The
            // check of the new connection (`Store::refused`) reports it as a permission error,
            // and refuses a start.
            Err(error) => {
                tracing::warn!(%error, "the sync store refuses INFO (permission): a failover that loses occupancy grants cannot be noticed");
                None
            }
        };
        let replication_id = info.as_deref().and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("master_replid:"))
                .map(|id| id.trim().to_owned())
        });
        if self.replication_id.is_some()
            && replication_id.is_some()
            && replication_id != self.replication_id
        {
            self.failovers += 1;
        }
        if replication_id.is_some() {
            self.replication_id = replication_id;
        }
        self.connects += 1;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// Bytes of the commands sent so far on this store's behalf, however they ended.
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes
    }

    /// Bytes of the replies read so far (those that came back whole; the connection's own
    /// handshake, `AUTH` and `HELLO`, is the redis crate's and not counted either way).
    pub fn read_bytes(&self) -> u64 {
        self.read_bytes
    }

    /// Connections made so far (each new one is worth a [`Store::refused`] check).
    pub fn connects(&self) -> u64 {
        self.connects
    }

    /// Connects when there is no connection (noting a failover, [`Store::failovers`]).
    pub async fn ensure_connected(&mut self) -> RedisResult<()> {
        self.connection().await.map(|_| ())
    }

    /// Times a connect found the primary with a new replication ID since this store was made.
    pub fn failovers(&self) -> u64 {
        self.failovers
    }

    /// Runs `pipe` (made by [`pipe`]: every reply comes back, errors included) and returns one
    /// reply per command, counting the bytes both ways. An error reply is the caller's to
    /// judge ([`all_ok`]); any other error drops the connection so the next call connects again.
    async fn query(&mut self, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
        let mut connection = self.connection().await?;
        self.measure.clear();
        for command in pipe.cmd_iter() {
            command.write_packed_command(&mut self.measure);
        }
        self.written_bytes += self.measure.len() as u64;
        let result: RedisResult<Vec<Value>> = tokio::time::timeout(
            self.response_timeout + Duration::from_millis(100),
            pipe.query_async(&mut connection),
        )
        .await
        .map_err(timed_out)
        .and_then(|result| result);
        match &result {
            Ok(replies) => self.read_bytes += replies.iter().map(reply_bytes).sum::<u64>(),
            Err(_) => self.connection = None,
        }
        result
    }

    /// [`Store::query`] where any error reply fails the call (the first one, in command order).
    async fn query_ok(&mut self, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
        let replies = self.query(pipe).await?;
        all_ok(replies).map_err(|error| self.failed(error))
    }

    /// An error reply that fails a call: the connection is dropped, so the next call connects
    /// again (through the Sentinels: `READONLY` from a primary demoted by a failover, `LOADING`,
    /// `NOAUTH` are left behind that way), unless the reply is one a new connection would get
    /// the same (the ACL's refusal) or one the caller answers on this one (`NOSCRIPT`).
    fn failed(&mut self, error: redis::RedisError) -> redis::RedisError {
        if !refused_permission(&error) && !noscript_error(&error) {
            self.connection = None;
        }
        error
    }

    /// After ten failed rounds: forget the connection (the next one starts from the configured
    /// addresses, resolved again).
    pub fn rebuild(&mut self) {
        self.connection = None;
    }

    /// Takes this router ID for `value` when no process holds it (`SET NX PX`, expiring after
    /// `ttl_ms` unless renewed), and returns who holds it now (`None`: the claim expired between
    /// the two commands; ask again).
    pub async fn claim(&mut self, value: &str, ttl_ms: u64) -> RedisResult<Option<String>> {
        let key = self.key(&format!("owner:{}", self.router));
        let mut pipe = pipe();
        pipe.cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms.max(1));
        pipe.cmd("GET").arg(&key);
        let replies = self.query_ok(&pipe).await?;
        Ok(redis::from_redis_value_ref(last(&replies)?)?)
    }

    /// The totals of every router on each of `days` (today's, and the next day's near midnight)
    /// and the stream's newest entry, read together: every entry up to that one is in the totals
    /// (each router writes its entry and its totals in one transaction). With them the routers'
    /// records and the epoch: a record that says its totals are whole in that epoch was written
    /// with them (`sync::whole`). Once per start or
    /// outage; the reply holds one field per router and daily budget used that day, bounded by
    /// the keys and routers of the site, not by traffic.
    pub async fn read_daily(&mut self, days: &[u32]) -> RedisResult<DailyRead> {
        let mut commands = Vec::with_capacity(2 * days.len() + 1);
        for day in days {
            let mut totals = redis::cmd("HGETALL");
            totals.arg(self.key(&format!("daily:{day}")));
            let mut memory = redis::cmd("HGETALL");
            memory.arg(self.key(&format!("memory:{day}")));
            commands.extend([totals, memory]);
        }
        let mut last = redis::cmd("XREVRANGE");
        last.arg(self.key("usage"))
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1);
        commands.push(last);
        let mut heartbeats = redis::cmd("HGETALL");
        heartbeats.arg(self.key("routers"));
        let mut epoch = redis::cmd("GET");
        epoch.arg(self.key("epoch"));
        commands.extend([heartbeats, epoch]);
        let reads = commands.len();
        let replies = self.transaction(commands, reads).await?;
        let mut read = Vec::with_capacity(days.len());
        for pair in replies[..2 * days.len()].chunks_exact(2) {
            let totals: HashMap<String, u64> = redis::from_redis_value_ref(&pair[0])?;
            let memory: HashMap<String, u64> = redis::from_redis_value_ref(&pair[1])?;
            read.push((totals.into_iter().collect(), memory.into_iter().collect()));
        }
        let after_days = 2 * days.len();
        let heartbeats: HashMap<String, String> =
            redis::from_redis_value_ref(&replies[after_days + 1])?;
        Ok(DailyRead {
            days: read,
            last: last_id(&replies[after_days]),
            heartbeats: heartbeats.into_iter().collect(),
            epoch: redis::from_redis_value_ref(&replies[after_days + 2])?,
        })
    }

    /// Runs `commands` as one `MULTI` … `EXEC` and returns the replies of the last `reads` of
    /// them. `MULTI` and `EXEC` go as plain commands of a pipeline: the redis crate's own
    /// transactions underflow a counter (a panic in debug builds) when the store refuses `MULTI`
    /// itself, as it does without the password (`NOAUTH`) or while loading (`LOADING`).
    async fn transaction(
        &mut self,
        commands: Vec<redis::Cmd>,
        reads: usize,
    ) -> RedisResult<Vec<Value>> {
        let replies = self.transaction_replies(commands).await?;
        exec_replies(replies, reads).map_err(|what| self.unknown_state(what))
    }

    /// Runs `commands` as one `MULTI` … `EXEC` and returns every reply of `EXEC`, error replies
    /// of commands that ran included; a command refused while queued (the ACL, a wrong argument
    /// count) fails the call, and then none ran.
    async fn transaction_replies(&mut self, commands: Vec<redis::Cmd>) -> RedisResult<Vec<Value>> {
        let mut pipe = pipe();
        pipe.cmd("MULTI");
        for command in commands {
            pipe.add_command(command);
        }
        pipe.cmd("EXEC");
        let replies = self.query(&pipe).await?;
        // Queued, each answered `+QUEUED` or an error: an error here aborts the transaction
        // (`EXECABORT`), and is the reason worth reporting (`NOPERM`, `NOAUTH`, `LOADING`).
        let (exec, queued) = replies.split_last().ok_or_else(short_reply)?;
        if let Some(Value::ServerError(error)) = queued
            .iter()
            .find(|reply| matches!(reply, Value::ServerError(_)))
        {
            return Err(self.failed(error.clone().into()));
        }
        match exec {
            Value::Array(replies) => Ok(replies.clone()),
            Value::ServerError(error) => Err(self.failed(error.clone().into())),
            other => {
                Err(self.unknown_state(format!("the store did not run the transaction: {other:?}")))
            }
        }
    }

    /// An answer that leaves the connection in an unknown state: it is not used again.
    fn unknown_state(&mut self, what: String) -> redis::RedisError {
        self.connection = None;
        redis::RedisError::from(std::io::Error::other(what))
    }

    /// Entries after `after` up to and including `upto`, oldest first: at most 10 × [`READ_MAX`]
    /// (a start-up replay of one minute; older ones are in the daily totals, and the rate
    /// buckets have refilled them).
    pub async fn read_range(
        &mut self,
        after: StreamId,
        upto: StreamId,
    ) -> RedisResult<Vec<(StreamId, Vec<u8>)>> {
        let mut pipe = pipe();
        pipe.cmd("XRANGE")
            .arg(self.key("usage"))
            .arg(format!("({after}"))
            .arg(upto.to_string())
            .arg("COUNT")
            .arg(READ_MAX * 10);
        let replies = self.query_ok(&pipe).await?;
        Ok(entries(last(&replies)?))
    }

    /// Writes this router's heartbeat alone: the one that says it left, once its last round
    /// published everything it admitted.
    pub async fn write_heartbeat(&mut self, heartbeat: &str) -> RedisResult<()> {
        let mut pipe = pipe();
        pipe.cmd("HSET")
            .arg(self.key("routers"))
            .arg(&self.router)
            .arg(heartbeat);
        self.query_ok(&pipe).await.map(|_| ())
    }

    /// Removes heartbeats and agent lists of routers given up (silent for over an hour, or
    /// left).
    pub async fn forget_routers(&mut self, ids: &[String]) -> RedisResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut pipe = pipe();
        pipe.cmd("HDEL").arg(self.key("routers")).arg(ids);
        pipe.cmd("HDEL").arg(self.key("agents")).arg(ids);
        self.query_ok(&pipe).await.map(|_| ())
    }

    /// The agent lists of `ids` (`sync::site::AgentList`, as stored; `None` where there is
    /// none): fetched when a heartbeat names a version the reader does not hold.
    pub async fn agent_lists(&mut self, ids: &[String]) -> RedisResult<Vec<Option<String>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = pipe();
        pipe.cmd("HMGET").arg(self.key("agents")).arg(ids);
        let replies = self.query_ok(&pipe).await?;
        Ok(redis::from_redis_value_ref(last(&replies)?)?)
    }

    /// Marks redirect tokens spent for the whole site, one pipeline for all of `nonces` (hex
    /// nonce, milliseconds to remember it); per nonce, false when it already was.
    pub async fn spend_tokens(&mut self, nonces: &[(String, u64)]) -> RedisResult<Vec<bool>> {
        if nonces.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = pipe();
        for (nonce, ttl_ms) in nonces {
            pipe.cmd("SET")
                .arg(self.key(&format!("redirect:{nonce}")))
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg((*ttl_ms).max(1));
        }
        let set: Vec<Option<String>> =
            redis::from_redis_value(Value::Array(self.query_ok(&pipe).await?))?;
        Ok(set.into_iter().map(|set| set.is_some()).collect())
    }
}

impl Store {
    /// Runs `script` by its SHA1, and again with its text when the store does not know it
    /// (`NOSCRIPT`: it did not run). `args` adds the key count, keys and arguments.
    async fn script(
        &mut self,
        script: &Script,
        args: impl Fn(&mut redis::Cmd),
    ) -> RedisResult<Value> {
        for full in [false, true] {
            let mut call = script.call(full);
            args(&mut call);
            let mut pipe = pipe();
            pipe.add_command(call);
            match self.query_ok(&pipe).await {
                Err(error) if !full && noscript_error(&error) => continue,
                Err(error) => return Err(error),
                Ok(mut replies) => return replies.pop().ok_or_else(short_reply),
            }
        }
        Err(redis::RedisError::from(std::io::Error::other(
            "the store answered NOSCRIPT to EVAL",
        )))
    }
}

/// A stream entry ID as `XADD` (or the usage script) answers it.
fn stream_id(reply: &Value) -> Option<StreamId> {
    match reply {
        Value::BulkString(id) => StreamId::parse(std::str::from_utf8(id).ok()?),
        Value::SimpleString(id) => StreamId::parse(id),
        _ => None,
    }
}

/// The last `reads` replies of an `EXEC` reply, or why the transaction did not run whole.
fn exec_replies(mut replies: Vec<Value>, reads: usize) -> Result<Vec<Value>, String> {
    if let Some(error) = replies
        .iter()
        .find(|reply| matches!(reply, Value::ServerError(_)))
    {
        return Err(format!("the store refused a command: {error:?}"));
    }
    if replies.len() < reads {
        return Err(format!(
            "the transaction answered {} replies",
            replies.len()
        ));
    }
    Ok(replies.split_off(replies.len() - reads))
}

/// A pipeline whose every reply comes back, error replies included (see [`Store::query`]).
fn pipe() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe
}

/// `replies`, or the first error reply among them.
fn all_ok(replies: Vec<Value>) -> RedisResult<Vec<Value>> {
    match replies
        .iter()
        .find(|reply| matches!(reply, Value::ServerError(_)))
    {
        Some(Value::ServerError(error)) => Err(error.clone().into()),
        _ => Ok(replies),
    }
}

/// The last reply of a pipeline (the one its caller asked for).
fn last(replies: &[Value]) -> RedisResult<&Value> {
    replies.last().ok_or_else(short_reply)
}

fn short_reply() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::other(
        "the store answered fewer replies than commands",
    ))
}

fn timed_out(_: tokio::time::error::Elapsed) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the store did not answer in time",
    ))
}

/// The ID of the one entry an `XREVRANGE … COUNT 1` returned.
fn last_id(reply: &Value) -> StreamId {
    match reply {
        Value::Array(items) => items.iter().rev().find_map(entry_id).unwrap_or_default(),
        _ => StreamId::default(),
    }
}

/// The ID of one entry of an `XRANGE` / `XREVRANGE` reply (`[id, [field, value, …]]`).
fn entry_id(entry: &Value) -> Option<StreamId> {
    let Value::Array(pair) = entry else {
        return None;
    };
    match pair.first()? {
        Value::BulkString(id) => StreamId::parse(std::str::from_utf8(id).ok()?),
        Value::SimpleString(id) => StreamId::parse(id),
        _ => None,
    }
}

/// Whether an entry of an `XRANGE` reply was written without the levels (no field `l`: the
/// plain commands, or a router of the version before).
fn unlevelled(reply: &Value) -> bool {
    let Value::Array(items) = reply else {
        return false;
    };
    items.iter().any(|item| {
        let Value::Array(pair) = item else {
            return false;
        };
        let Some(Value::Array(fields)) = pair.get(1) else {
            return false;
        };
        !fields
            .chunks(2)
            .any(|field| matches!(field, [Value::BulkString(name), _] if name == b"l"))
    })
}

/// (ID, usage) of each entry of an `XRANGE` reply: its field `u`, or `c` for a copy of usage
/// published before (`sync::republish`, applied once like the original); entries without
/// either are skipped.
fn entries(reply: &Value) -> Vec<(StreamId, Vec<u8>)> {
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let id = entry_id(item)?;
            let Value::Array(pair) = item else {
                return None;
            };
            let Value::Array(fields) = pair.get(1)? else {
                return None;
            };
            fields.chunks(2).find_map(|field| match field {
                [Value::BulkString(name), Value::BulkString(value)]
                    if name == b"u" || name == b"c" =>
                {
                    Some((id, value.clone()))
                }
                _ => None,
            })
        })
        .collect()
}
