//! The sync core: a thread of its own that owns the store connection and runs the round every
//! `--sync-interval` (seed `run-several-routers.md`, "How it works"). Shards never talk to the
//! store; they hand their usage over and take the others' through their control queue.
//!
//! # One round
//! 1. Take every shard's usage since the last round and its changed daily totals
//!    ([`ControlShared::take_usage`]); they join the backlog of what is not published yet.
//! 2. In one transaction: read the entries published since the last round, publish the backlog
//!    as stream entries (one per round, each with the time it was admitted) with the changed
//!    daily totals (one script call, `store::scripts`), write this router's heartbeat (and its
//!    agent list when it changed, [`AgentList`]); then read every heartbeat. The other routers'
//!    agent lists are fetched only when a heartbeat names a version not held.
//! 3. Hand the other routers' entries to the shards ([`ControlToShard::ApplyRemote`]), and this
//!    router's share of every limit from the heartbeats ([`ControlToShard::Share`]).
//!
//! At start (and after an outage, when entries may have been missed) the round first reads
//! today's totals and the stream's newest entry together: the totals hold every entry up to it,
//! so entries up to it are applied to the rate buckets only (the last minute of them at start,
//! which is the replay) and nothing is counted twice.
//!
//! # Failure
//! A round that fails keeps its backlog for the next one (the backlog is bounded,
//! `round::BACKLOG_MAX`); after three in a row every router enforces its share alone
//! (`site::Health`), after ten the connection is rebuilt from the configured addresses.
//!
//! # Start, permissions and the router ID
//! Before the first round, when the store answers, the sync core checks that the store's ACL
//! allows every command the sync needs (`Store::refused`) and claims the router ID
//! (`sync::claim`); either failing refuses the start, with one ERROR line naming what is missing
//! or the other process. A store unreachable at start is checked at the first round that reaches
//! it, as is every new connection: a refusal then is logged as a permission error and counted in
//! `hivenet_sync_errors_total{kind="permission"}`. The round's transaction (entries, daily totals,
//! heartbeat, claim) is written whole or not at all; the occupancy pools' script runs after it,
//! on its own, so a store that refuses the scripts (`EVALSHA`, `EVAL`) costs budgeted models
//! their new credits and nothing else. A round that reads another process's claim on the router
//! ID steps down (`hivenet_sync_router_id_conflict`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use crate::base::clock::{now_unix_ms, utc_today};
use crate::base::ids::KeyId;
use crate::logic::limits::share::SILENCE_SHOWS_FROM_ROUND;
use crate::logic::limits::{BucketRef, Day, Share};
use crate::router::control::ControlShared;
use crate::router::control::site_routers::SiteRouter;
use crate::router::shard::messages::ControlToShard;
use crate::router::shard::owner::quotas::{
    Anchor, BucketView, DailyRestore, DailyTotal, RemoteUsage,
};

use super::SyncMetrics;
use super::claim;
use super::counted::{self, Counted};
use super::daily_fields;
use super::entry::{Entry, ModelName};
use super::journal::Journaling;
use super::levels::{self, Ask};
use super::pool_store::Grant;
use super::pools::{self, SiteCredits};
use super::republish;
use super::round::{self, Backlog, Batch, DailyLedger};
use super::site::{self, AfterFailure, AgentList, Health, Heartbeat, Peers, Sightings};
use super::store::{
    ClaimWrite, DailyRow, PoolRead, RoundWrites, Store, StreamId, refused_permission,
};
use super::whole;
use crate::router::config::sync::SyncSettings;
use crate::router::shard::owner::wallets::{CreditNews, Refill};
use crate::router::shard::redirect_claims::Claim;

mod credits;
mod journaling;
mod levels_round;
mod reads;
mod site_news;
mod store_checks;

/// Rounds after which a router writes its unchanged agent list again: a list lost without a new
/// connection or a new epoch (deleted by hand) is back within this many rounds, at 1/60 of what
/// writing it every round cost.
const AGENTS_REWRITE_ROUNDS: u64 = 60;
/// How much usage a starting router replays: the rate buckets' window.
const REPLAY_MS: u64 = 60_000;
/// The longest shutdown waits for the last round.
const FINAL_ROUND_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a round did not share this router's limits with the site.
enum RoundFailure {
    /// The store did not answer, failed, or refused a command of the round's transaction
    /// ([`refused_permission`] tells which).
    Store(redis::RedisError),
    /// Another process holds this router ID (its claim value): this one stepped down.
    SteppedDown(String),
}

impl From<redis::RedisError> for RoundFailure {
    fn from(error: redis::RedisError) -> RoundFailure {
        RoundFailure::Store(error)
    }
}

/// The parts of the sync a store's ACL may refuse on their own, each with what its refusal costs
/// (for the one ERROR line logged per part until the store allows everything again).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Refused {
    Round,
    Pools,
    Grant,
    Acknowledge,
    Release,
    Forget,
}

impl Refused {
    fn cost(self) -> &'static str {
        match self {
            Refused::Round => {
                "the round's transaction: each router enforces its share of every limit alone"
            }
            Refused::Pools => {
                "the occupancy pools' rewrite (EVALSHA, EVAL): budgeted models keep the credits they hold; limits are still shared"
            }
            Refused::Grant => {
                "an occupancy grant (EVALSHA, EVAL): budgeted models get no new credits; limits are still shared"
            }
            Refused::Acknowledge => {
                "WAIT under Sentinel: grants count as unacknowledged, and this router keeps to its share of each budget"
            }
            Refused::Release => {
                "taking occupancy credits back (EVALSHA, EVAL): a stopped router's credits stay in the pools"
            }
            Refused::Forget => "removing heartbeats of routers gone for an hour (HDEL)",
        }
    }
}

/// The running sync core; [`SyncCore::finish`] publishes what is left and leaves the site.
pub struct SyncCore {
    stop: mpsc::Sender<oneshot::Sender<()>>,
}

/// What the round loop keeps between rounds.
struct Round {
    settings: SyncSettings,
    shared: Arc<ControlShared>,
    metrics: Arc<SyncMetrics>,
    store: Store,
    health: Health,
    /// When each router record in the store was first seen with its current value.
    sightings: Sightings,
    backlog: Backlog,
    /// Other routers' batches applied, so none is applied twice.
    applied: round::Applied,
    /// What this run published lately, published again after the store may have lost it.
    recent: republish::Recent,
    /// What this router counts of the others' daily usage, and which of their batches each
    /// count holds, so none is counted twice.
    counts: Counted,
    /// This run's start (unix ms): tells this run's entries from a previous run's.
    run: u64,
    peer_id: String,
    /// The newest entry applied; `None` until today's totals have been read.
    cursor: Option<StreamId>,
    /// Today's totals must be read again (start, after an outage, after the store lost its data).
    resync: bool,
    /// Rounds that read today's totals again after the store lost its data: the other routers
    /// write theirs again whole at their next round, and usage published between this router's
    /// last read and the loss is counted only in those.
    resync_rounds: u32,
    /// Rounds after a failover whose levels only lower this router's views: the promoted
    /// replica's may miss decrements it had not received.
    anchor_lower_only_rounds: u32,
    /// The rate buckets this round asks the store to anchor (`sync::levels`), from the shards.
    views: Vec<BucketView>,
    /// No anchoring before then (unix ms): an entry read was written without the levels.
    unlevelled_until: u64,
    /// Rounds left that write what this router remembers of the others' daily usage, after
    /// the store lost its data (`daily_fields::daily_records`).
    remember_rounds: u32,
    /// This round's memory rows: (day, field, tokens).
    memory: Vec<(u32, String, u64)>,
    /// What this router counted of the others at its last round, with `--sync-journal`: the
    /// journal keeps it (`Journal::others`).
    others_counted: Vec<(u32, String, u64)>,
    /// A failover was noticed: the shards report every daily total again at the next round.
    rewrite_daily: bool,
    /// The store's epoch as last seen: a new one means the store lost its data.
    epoch: Option<String>,
    /// This router's own totals were read back (only once: they are added).
    own_restored: bool,
    read_day: Day,
    /// Read by the shards' redirect-token claims.
    store_up: Arc<AtomicBool>,
    /// Occupancy credits: the pools of the budgets this router has credits for.
    credits: SiteCredits,
    /// Agents report routers the store does not list (no new credits within a settle window).
    unknown_routers: bool,
    /// The settle window last logged: when it ends, and how many budgets it held back.
    settle_announced: (u64, usize),
    /// Routers `--sync-min-routers` counts that the store does not list were logged, since
    /// the store last listed them all.
    unlisted_logged: bool,
    /// Failovers of the store noticed so far (`Store::failovers`).
    failovers_seen: u64,
    /// Agent sessions started here as of the last round that reached the store.
    sessions_at_last_answer: u64,
    /// Cut off from the store with an agent connected since: the shards admit nothing on
    /// budgeted models until the store answers (`CreditCap::Closed`).
    closed: bool,
    /// The last round reached the store: the shards' wallets give back what they do not use
    /// only then (what a round cannot write stays this router's in the pool).
    last_round_reached: bool,
    /// The last round rewrote this router's holdings in every pool (a refused script leaves them
    /// as they were, so the wallets keep their credits).
    pools_written: bool,
    /// The daily totals written so far: the next writes are increments of them.
    ledger: DailyLedger,
    /// This process's claim on its router ID (`sync::claim::value`) and its expiry.
    claim_value: String,
    claim_ttl: Duration,
    /// Another process holds the router ID (its claim value): this one writes nothing.
    stepped_down: Option<String>,
    /// `Store::connects` at the last permission check.
    connects_checked: u64,
    /// Parts the store refused, logged once each until a check finds everything allowed.
    refusals_logged: std::collections::HashSet<Refused>,
    /// The other routers' agent lists as last fetched, by router ID (at most one per record
    /// read: pruned each round to the records in the store).
    agent_lists: HashMap<String, AgentList>,
    /// This router's agent list as last written: its version, the connection (`Store::connects`)
    /// and the store's epoch then, and the round. A new connection (a failover, a restart) or a
    /// new epoch (the store lost its data) writes it again, since the store may have lost it;
    /// so does every [`AGENTS_REWRITE_ROUNDS`]th round.
    agents_written: Option<AgentsWritten>,
    /// Rounds tried so far.
    rounds: u64,
    /// `--sync-journal`: the usage held back while the store does not answer.
    journaling: Journaling,
    /// The epoch this router's heartbeat says its daily totals are whole in, and whose totals
    /// it read whole (`sync::whole`).
    whole_claim: whole::Claim,
    whole_reads: whole::Reads,
}

impl SyncCore {
    /// Starts the thread. `peer_id`: this router's, published with its heartbeat.
    ///
    /// `tokens`: the end of [`crate::router::shard::redirect_claims::SiteTokens`] the shards claim redirect tokens
    /// through, and the flag that tells them whether the store answers. `core`: a core no shard
    /// runs on, when the machine has one to spare (the thread is pinned there).
    pub fn start(
        settings: SyncSettings,
        shared: Arc<ControlShared>,
        peer_id: String,
        metrics: Arc<SyncMetrics>,
        tokens: (mpsc::Receiver<Claim>, Arc<AtomicBool>),
        refills: mpsc::Receiver<Refill>,
        core: Option<core_affinity::CoreId>,
    ) -> anyhow::Result<SyncCore> {
        let (stop, stopped) = mpsc::channel(1);
        let response_timeout = settings.interval.min(Duration::from_secs(2));
        let store = Store::new(
            settings.store.clone(),
            &settings.site,
            &settings.router_id,
            response_timeout,
        );
        let (claims, store_up) = tokens;
        let token_store = Store::new(
            settings.store.clone(),
            &settings.site,
            &settings.router_id,
            crate::router::shard::redirect_claims::SPEND_WAIT,
        );
        // No list for agents until the store answers: this router cannot tell who is alive.
        shared.site_routers.publish(None);
        let run = now_unix_ms().max(0) as u64;
        let claim_value = claim::value(fastrand::u64(..), std::process::id(), &host(), &peer_id);
        let claim_ttl = claim::ttl(settings.interval);
        let credits = SiteCredits::new(
            &settings.router_id,
            run,
            settings.settle_window().as_millis() as u64,
        );
        let journaling = Journaling::open(settings.journal.clone(), &settings.router_id);
        let round = Round {
            health: Health::new(settings.min_routers),
            sightings: Sightings::default(),
            settings,
            shared,
            metrics,
            store,
            backlog: Backlog::default(),
            applied: round::Applied::default(),
            recent: republish::Recent::default(),
            counts: Counted::default(),
            run,
            peer_id,
            cursor: None,
            resync: true,
            resync_rounds: 0,
            anchor_lower_only_rounds: 0,
            views: Vec::new(),
            unlevelled_until: 0,
            remember_rounds: 0,
            memory: Vec::new(),
            others_counted: Vec::new(),
            rewrite_daily: false,
            epoch: None,
            own_restored: false,
            read_day: utc_today(),
            last_round_reached: true,
            pools_written: true,
            ledger: DailyLedger::default(),
            claim_value,
            claim_ttl,
            stepped_down: None,
            connects_checked: 0,
            refusals_logged: std::collections::HashSet::new(),
            agent_lists: HashMap::new(),
            agents_written: None,
            rounds: 0,
            store_up,
            credits,
            unknown_routers: false,
            settle_announced: (0, 0),
            unlisted_logged: false,
            sessions_at_last_answer: 0,
            failovers_seen: 0,
            closed: false,
            journaling,
            whole_claim: whole::Claim::default(),
            whole_reads: whole::Reads::default(),
        };
        let (checked, check) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("sync".into())
            .spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core);
                }
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("building the sync core's runtime");
                let mut round = round;
                let refused = runtime.block_on(round.check_at_start());
                let failed = refused.is_err();
                let _ = checked.send(refused);
                if failed {
                    return;
                }
                runtime.spawn(super::redirect_claims::serve(token_store, claims));
                runtime.block_on(round.run(stopped, refills));
            })?;
        // Bounded: every call of the check has its timeout, and the wait on another process's
        // claim its patience (`claim::AtStart`).
        match check.recv() {
            Ok(Ok(())) => Ok(SyncCore { stop }),
            Ok(Err(refused)) => Err(anyhow::anyhow!(refused)),
            Err(_) => Err(anyhow::anyhow!(
                "the sync core stopped before its start-up check"
            )),
        }
    }

    /// Publishes the usage not yet published and marks this router as left, so the others stop
    /// counting it at once. False when that did not finish in time.
    pub async fn finish(self) -> bool {
        let (done, finished) = oneshot::channel();
        if self.stop.send(done).await.is_err() {
            return false;
        }
        matches!(
            tokio::time::timeout(FINAL_ROUND_TIMEOUT + Duration::from_secs(1), finished).await,
            Ok(Ok(()))
        )
    }
}

impl Round {
    async fn run(
        mut self,
        mut stop: mpsc::Receiver<oneshot::Sender<()>>,
        mut refills: mpsc::Receiver<Refill>,
    ) {
        let mut ticks = tokio::time::interval(self.settings.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => self.tick(false).await,
                Some(refill) = refills.recv() => self.refill(refill).await,
                done = stop.recv() => {
                    let _ = tokio::time::timeout(FINAL_ROUND_TIMEOUT, async {
                        self.tick(true).await;
                        self.release_credits().await;
                    })
                    .await;
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                    return;
                }
            }
        }
    }

    async fn tick(&mut self, leaving: bool) {
        let started = Instant::now();
        let remember = self.remember_rounds > 0;
        let usage = self
            .shared
            .take_usage(
                self.last_round_reached,
                remember || self.journaling.path.is_some(),
            )
            .await;
        self.views = usage.views;
        self.whole_claim
            .gathered(usage.answered == self.shared.shard_count());
        let mut counted = self.memory_rows(&usage.memory);
        let marks = daily_fields::marks_beside(&self.counts, &counted);
        counted.extend(marks);
        if self.journaling.path.is_some() {
            self.others_counted = counted.clone();
        }
        // Written to the store only for a few rounds after it lost its data.
        self.memory = if remember { counted } else { Vec::new() };
        let now_ms = now_unix_ms().max(0) as u64;
        let today = utc_today();
        self.backlog.push(Batch {
            admitted_at_unix_ms: now_ms,
            day: today,
            usage: usage.usage,
        });
        self.backlog.push_totals(usage.daily);
        {
            let registry = self.shared.registry();
            self.credits
                .take_holdings(now_ms, usage.credits, |model| registry.model_key(model));
        }
        if today != self.read_day {
            // Every budget starts the new day at zero on every router: nothing to read.
            self.read_day = today;
            // A router behind midnight may still report yesterday's totals; none older.
            self.ledger.forget_before(today.0.saturating_sub(1));
            self.counts.forget_before(today.0.saturating_sub(1));
        }
        let outcome = self.exchange(now_ms, leaving).await;
        if matches!(outcome, Err(RoundFailure::Store(_))) {
            self.journal_held_back().await;
        }
        self.metrics
            .tick_seconds
            .observe(started.elapsed().as_secs_f64());
        self.count_store_bytes();
        let outcome_ok = outcome.is_ok();
        self.last_round_reached = outcome_ok && self.pools_written;
        match outcome {
            Ok(peers) => {
                let was_up = self.health.is_up();
                if self.health.succeeded(peers) {
                    // A router that joins writes its totals whole if the store lost them
                    // while it was away: they are read again.
                    self.resync_rounds = self.resync_rounds.max(round::RESYNC_ROUNDS_AFTER_LOSS);
                }
                // Today's totals are read (the first round reads them before anything else).
                self.shared.readiness.store_reached();
                if !was_up {
                    tracing::info!(site = %self.settings.site, "the sync store answers: limits are shared with the routers of the site");
                }
            }
            Err(failure) => {
                // A refusal or a step-down is logged as such, never as an unreachable store.
                let logged_as_such = match &failure {
                    RoundFailure::Store(error) if refused_permission(error) => {
                        self.refused(Refused::Round, error);
                        true
                    }
                    RoundFailure::Store(_) => {
                        self.metrics.errors_total.fetch_add(1, Ordering::Relaxed);
                        false
                    }
                    // Logged when it stepped down.
                    RoundFailure::SteppedDown(_) => true,
                };
                let error = match &failure {
                    RoundFailure::Store(error) => error.to_string(),
                    RoundFailure::SteppedDown(holder) => {
                        format!("another process holds this router ID: {holder}")
                    }
                };
                let was_up = self.health.is_up();
                self.sightings.missed_round();
                if self.health.failed() == AfterFailure::Reconnect {
                    tracing::warn!(%error, "the sync store has not answered for ten rounds: reconnecting from the configured addresses");
                    self.store.rebuild();
                }
                if was_up && !self.health.is_up() {
                    if !logged_as_such {
                        tracing::warn!(%error, "the sync store is unreachable: each router enforces its share of every limit alone");
                    }
                    // Entries published meanwhile may be trimmed before this router is back.
                    self.resync = true;
                } else {
                    tracing::debug!(%error, "sync round failed");
                }
            }
        }
        self.metrics
            .up
            .store(i64::from(self.health.is_up()), Ordering::Relaxed);
        self.store_up.store(self.health.is_up(), Ordering::Relaxed);
        self.metrics.set_share(self.health.share());
        self.log_unlisted();
        self.close_if_reached_while_cut_off(outcome_ok).await;
        // While the store answers, a new session routes once a heartbeat has published it; while
        // it does not, at once (budgeted models are closed to an agent that connects then).
        self.shared
            .hold_unpublished_agents(self.health.is_up())
            .await;
        self.publish_site();
        let share = self.health.share();
        self.shared.broadcast(|| ControlToShard::Share(share)).await;
    }

    /// Steps 2 and 3 of the round against the store; the peers seen on success.
    async fn exchange(&mut self, now_ms: u64, leaving: bool) -> Result<Peers, RoundFailure> {
        self.pools_written = false;
        self.store.ensure_connected().await?;
        self.check_permissions().await?;
        self.notice_failover(now_ms);
        if std::mem::take(&mut self.rewrite_daily) {
            self.shared.broadcast(|| ControlToShard::RewriteDaily).await;
        }
        self.claim_back(leaving).await?;
        // The views count the entries up to the cursor; a resync's read moves it.
        let views_after = self.cursor;
        if self.resync || self.resync_rounds > 0 {
            self.read_totals(now_ms).await?;
            self.resync_rounds = self.resync_rounds.saturating_sub(1);
        }
        let cursor = self.cursor.unwrap_or_default();
        // The copies first (`sync::republish`): the script tells them by their place.
        let copies_due = self.recent.due();
        let mut entries = self.copies_to_publish(now_ms);
        let copies = entries.len();
        entries.extend(self.entries_to_publish());
        let (totals, models): (Vec<(u32, String, u64)>, Vec<_>) = {
            let registry = self.shared.registry();
            self.backlog
                .totals()
                .filter_map(|total| {
                    let (field, model) = self.budget_field(&registry, &total)?;
                    Some(((total.day.0, field, total.tokens), (total.tenant, model)))
                })
                .unzip()
        };
        let (asks, asked) = self.asks();
        let (sessions, agents) = self.shared.served_sessions();
        let agent_list = AgentList::new(agents);
        // A leaving round's heartbeat does not say so yet: written beside usage that failed to
        // go in (one error reply inside the transaction), it let the others drop this router's
        // part while its usage waited in its journal (`sync::simulation`, seed 3,043: 10,644
        // tokens past a budget of 161,803). It says so once the round has gone through.
        let heartbeat = self.heartbeat(now_ms, false, agent_list.version);
        let heartbeat_json = serde_json::to_string(&heartbeat).expect("a heartbeat serializes");
        self.rounds += 1;
        let agents_as = AgentsWritten {
            version: agent_list.version,
            connects: self.store.connects(),
            epoch: self.epoch.clone().unwrap_or_default(),
            round: self.rounds,
        };
        let agents_json = self
            .agents_written
            .as_ref()
            .is_none_or(|written| !written.still_stands(&agents_as))
            .then(|| serde_json::to_string(&agent_list).expect("an agent list serializes"));
        let bytes: usize = entries.iter().map(Vec::len).sum();
        let raised = self.raised_rows(&totals);
        let daily_writes: Vec<DailyRow> = totals
            .iter()
            .zip(models)
            .filter_map(|((day, field, total), (tenant, model))| {
                Some(DailyRow {
                    day: *day,
                    tenant,
                    model,
                    field: field.clone(),
                    write: self.ledger.write_of(*day, field, *total)?,
                })
            })
            .chain(raised)
            .collect();
        let marks = counted::published_marks(&entries);
        let reads = self
            .store
            .round(RoundWrites {
                entries: &entries,
                copies,
                totals: &daily_writes,
                marks: &marks,
                heartbeat: &heartbeat_json,
                agents: agents_json.as_deref(),
                after: cursor,
                views_after,
                run: self.run,
                asks: &asks,
                memory: &std::mem::take(&mut self.memory),
                interval_ms: self.settings.interval.as_millis() as u64,
                now_ms,
                claim: ClaimWrite {
                    value: &self.claim_value,
                    ttl_ms: self.claim_ttl.as_millis() as u64,
                    release: leaving,
                },
            })
            .await;
        let mut reads = match reads {
            Ok(reads) => reads,
            Err(error) => {
                // The transaction may have run with its reply lost: these totals are written
                // whole next time, so an increment is never added twice.
                self.ledger.unsure(&totals);
                self.ledger.sent(&totals, &marks, self.run);
                return Err(error.into());
            }
        };
        // The buckets of the levels the script returned for this round's usage, by field.
        let published = self.published_fields(reads.levels.as_ref());
        self.recent.published(now_ms, self.backlog.batches());
        self.backlog.clear();
        self.ledger.wrote(&totals);
        self.ledger.wrote(&self.journaling.raised);
        self.whole_claim.went_through(heartbeat.whole_in.clone());
        self.journal_published().await;
        self.remember_rounds = self.remember_rounds.saturating_sub(1);
        if agents_json.is_some() {
            self.agents_written = Some(AgentsWritten {
                epoch: reads.epoch.clone(),
                ..agents_as
            });
        }
        self.metrics
            .published_bytes_total
            .fetch_add(bytes as u64, Ordering::Relaxed);
        if let Some(other) = claim::other_holder(&self.claim_value, reads.claim_holder.as_deref()) {
            // This round's usage is written (it is additive, lost by no one); nothing else of
            // this process is, until the other one stops.
            tracing::error!(
                router_id = %self.settings.router_id,
                other = %other,
                "another process holds this --router-id in the sync store: this process steps down from the site, enforces its share of every limit alone and writes nothing more to the store until the other one stops; one router ID runs one process at a time"
            );
            self.metrics.router_id_conflict.store(1, Ordering::Relaxed);
            self.stepped_down = Some(other.to_owned());
            self.resync = true;
            return Err(RoundFailure::SteppedDown(other.to_owned()));
        }
        // The sessions in the heartbeat may route now: the others will ask their agents before
        // giving this router up.
        if !leaving {
            self.shared.agents_published(&sessions).await;
        }
        // Before the epoch is taken as known: the pools' views need to tell a new one.
        self.pools_step(now_ms, leaving, &reads.epoch).await;
        self.take_epoch(&reads.epoch).await;
        if copies_due {
            // In the epoch just read: a loss this round learned of came before them.
            self.recent.copies_went_through();
        }
        // XRANGE answers in stream order: the last entry is the newest. This round's own entries
        // follow it with nothing between, when they were added in the read's transaction.
        let newest = reads
            .entries
            .last()
            .map_or(cursor, |(id, _)| cursor.max(*id));
        let newest = reads.own_newest.map_or(newest, |own| newest.max(own));
        let roster = self.sightings.read(
            reads
                .heartbeats
                .iter()
                .map(|(id, text)| (id.as_str(), text.as_str())),
            now_ms,
        );
        self.note_malformed(&roster.newly_malformed);
        let mut records = roster.records;
        self.resolve_agent_lists(&mut records).await;
        let reports = self.shared.agent_reports();
        let mut peers = site::peers(&self.settings.router_id, &heartbeat, &records, &reports);
        let unread = self.whole_reads.unread(&self.settings.router_id, &records);
        peers.unread = unread.routers;
        if unread.claimed {
            // Its totals are whole now: read them at the next round.
            self.resync_rounds = self.resync_rounds.max(1);
        }
        // The round's entries and anchors apply under the share its records show, not the last
        // round's ([`site::Health::share_after`]): a router back from silence is live when the
        // usage it held back is subtracted, from the whole bucket.
        let share = self.health.share_after(&peers);
        self.shared.broadcast(|| ControlToShard::Share(share)).await;
        let anchors = self.anchors(
            now_ms,
            reads.unlevelled,
            reads.levels.take(),
            asked,
            &published,
        );
        if let Some(lag_ms) = self
            .apply_entries(&reads.entries, now_ms, false, anchors)
            .await
        {
            self.metrics.lag_ms.store(lag_ms as i64, Ordering::Relaxed);
        }
        self.cursor = Some(newest);
        self.metrics
            .peers
            .store(i64::from(peers.live), Ordering::Relaxed);
        let given_up = site::given_up(&self.settings.router_id, &records, &reports);
        for (router, run) in given_up {
            self.reclaim(&router, run).await;
        }
        self.forget_gone(&records).await;
        if leaving {
            self.say_left(heartbeat).await;
        }
        Ok(peers)
    }

    /// Router records this router could not read for the first time: counted and logged once.
    fn note_malformed(&self, newly_malformed: &[String]) {
        if newly_malformed.is_empty() {
            return;
        }
        self.metrics
            .malformed_records_total
            .fetch_add(newly_malformed.len() as u64, Ordering::Relaxed);
        tracing::warn!(
            routers = ?newly_malformed,
            "ignoring router records in the sync store this router cannot read (a newer version, or a writer that is not a router of this site)"
        );
    }

    /// Removes the records of routers gone for over an hour (silent, or left); a router that
    /// left more recently keeps its record, which says it left. Age is this router's reading
    /// ([`site::Record::age_ms`]), so a record dated in the future goes too.
    async fn forget_gone(&mut self, records: &[site::Record]) {
        let gone: Vec<String> = records
            .iter()
            .filter(|record| {
                record.id != self.settings.router_id && record.age_ms > site::SILENT_FOR_AT_MOST_MS
            })
            .map(|record| record.id.clone())
            .collect();
        if !gone.is_empty()
            && let Err(error) = self.store.forget_routers(&gone).await
            && refused_permission(&error)
        {
            self.refused(Refused::Forget, &error);
        }
    }

    /// The last round went through: its heartbeat, written again, says this router left.
    async fn say_left(&mut self, heartbeat: Heartbeat) {
        let left = Heartbeat {
            left: true,
            ..heartbeat
        };
        let left = serde_json::to_string(&left).expect("a heartbeat serializes");
        if let Err(error) = self.store.write_heartbeat(&left).await {
            // The others see this router silent and keep its part a while: the safe side.
            tracing::warn!(%error, "the last round went through but the heartbeat saying this router left did not: the others count it silent");
        }
    }

    /// This router's field of a daily budget in the store (`daily_fields::daily_field`) and the
    /// budget's model by name; `None` for a model this router no longer knows.
    fn budget_field(
        &self,
        registry: &crate::router::control::registry::Registry,
        total: &DailyTotal,
    ) -> Option<(String, Option<crate::logic::snapshot::ModelKey>)> {
        let model = match total.model {
            None => None,
            Some(model) => Some(registry.model_key(model)?),
        };
        let field =
            daily_fields::daily_field(&self.settings.router_id, total.tenant, model.as_ref());
        Some((field, model))
    }

    /// This router's heartbeat; its agents are listed apart, under `agents_version`.
    fn heartbeat(&self, now_ms: u64, leaving: bool, agents_version: u64) -> Heartbeat {
        Heartbeat {
            run: self.run,
            at_unix_ms: now_ms,
            interval_ms: self.settings.interval.as_millis() as u64,
            peer_id: self.peer_id.clone(),
            grpc_addr: self.settings.advertise_grpc_addr.clone(),
            agents: vec![site::AGENTS_LISTED_APART.to_owned()],
            agents_version: Some(agents_version),
            agents_unknown: false,
            left: leaving,
            whole_in: self.whole_claim.of_round(),
        }
    }
}

/// When this router's agent list was written (see [`Round::agents_written`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct AgentsWritten {
    version: u64,
    connects: u64,
    epoch: String,
    round: u64,
}

impl AgentsWritten {
    /// The list written then needs no write now (`now`: this round's list, connection, epoch).
    fn still_stands(&self, now: &AgentsWritten) -> bool {
        self.version == now.version
            && self.connects == now.connects
            && self.epoch == now.epoch
            && now.round.saturating_sub(self.round) < AGENTS_REWRITE_ROUNDS
    }
}

/// This machine's name, for the claim value another process's log shows.
fn host() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|| "an unknown host".to_owned())
}
