//! A router's sync round against the simulated store: what `sync::core` does around the pure
//! parts it drives (the round's transaction, reading today's totals, applying entries).

use super::*;

/// The command of a round's transaction whose reply is an error (the others ran).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failing {
    Usage,
    Heartbeat,
}

/// The outcome of a round's transaction as the router sees it.
enum Reply {
    Answered,
    /// The transaction ran (all of it, or all but one command) and the router heard nothing:
    /// it must treat the round as failed.
    Lost,
}

impl Sim {
    /// One round of router `index` (`sync::core`'s `tick`).
    pub(super) fn round(&mut self, index: usize, leaving: bool) {
        let now = self.now;
        let router = self.routers[index].as_mut().expect("a running router");
        router.next_round = now + router.interval_ms;
        let wall = router.wall(now);
        let day = router.day(now);
        let mut usage = Vec::new();
        let mut totals = Vec::new();
        let mut views = Vec::new();
        for shard in &mut router.shards {
            shard.take_usage(&mut usage);
            totals.extend(shard.take_changed_daily_totals());
            shard.anchor_views(Millis(now), &mut views);
        }
        // Every shard answers here.
        router.claim.gathered(true);
        // `sync::core`: after a loss, what this router remembers of the others' daily usage.
        let memory = if router.remember_rounds > 0 {
            others_counted(router)
        } else {
            Vec::new()
        };
        for used in &usage {
            if let crate::logic::limits::BucketRef::Daily { day, .. } = used.bucket {
                *self.truth.taken.entry((router.run, day.0)).or_default() += used.amount;
            }
        }
        router.backlog.push(Batch {
            admitted_at_unix_ms: wall,
            day,
            usage,
        });
        router.backlog.push_totals(totals);
        if day != router.read_day {
            router.read_day = day;
            router.ledger.forget_before(day.0.saturating_sub(1));
            router.counts.forget_before(day.0.saturating_sub(1));
        }
        let outcome = self.exchange(index, leaving, views, memory);
        let reached = outcome.is_ok();
        let router = self.routers[index].as_mut().expect("a running router");
        match outcome {
            Ok(peers) => {
                if router.health.succeeded(peers) {
                    router.resync_rounds =
                        router.resync_rounds.max(round::RESYNC_ROUNDS_AFTER_LOSS);
                }
            }
            Err(()) => {
                // `sync::core::journaling`: what the round could not publish is kept.
                if !router.backlog.is_empty() || router.journaling.inherited.is_some() {
                    let journal = held_back(router);
                    self.journals[index] = Some(journal.encode());
                    router.journaling.held_back(journal);
                }
                let was_up = router.health.is_up();
                router.sightings.missed_round();
                router.health.failed();
                if was_up && !router.health.is_up() {
                    router.resync = true;
                }
            }
        }
        let share = router.health.share();
        for shard in &mut router.shards {
            shard.set_share(share);
        }
        let run = router.run;
        let tenant = self
            .registry
            .get(self.rate_key)
            .expect("the rate key")
            .tenant_id;
        let left = router.shards[tenant.owner(SHARDS)].requests_left(tenant, Millis(now));
        let daily_tenant = self
            .registry
            .get(self.daily_key)
            .expect("the daily key")
            .tenant_id;
        let day = router.day(now);
        let daily = router.shards[daily_tenant.owner(SHARDS)].daily_used(daily_tenant, day);
        let truth = self.daily_charged.get(&day.0).copied();
        self.log(|| {
            format!(
                "router-{index} (run {run}) round: {share:?}, {left:?} requests left, daily used {daily:?} (site {truth:?})"
            )
        });
        self.note_outage(index, share, reached);
    }

    /// Steps 2 and 3 against the store (`sync::core`'s `exchange`).
    fn exchange(
        &mut self,
        index: usize,
        leaving: bool,
        views: Vec<BucketView>,
        memory: Vec<(u32, String, u64)>,
    ) -> Result<site::Peers, ()> {
        let now = self.now;
        let router = self.routers[index].as_mut().expect("a running router");
        if now < self.store.down_until || now < router.partitioned_until {
            return Err(());
        }
        if now < self.store.slow_until {
            // The transaction is sent and its answer comes past the deadline: whether it ran is
            // unknown (it did not, here).
            let totals: Vec<(u32, String, u64)> = router
                .backlog
                .totals()
                .map(|total| {
                    let field = daily_fields::daily_field(&router.id, total.tenant, None);
                    (total.day.0, field, total.tokens)
                })
                .collect();
            router.ledger.unsure(&totals);
            return Err(());
        }
        // `sync::core`'s `notice_failover`: a failover or a restart of the store may have lost
        // increments; every total is written whole once and read again.
        if router.failovers_seen != self.store.failovers {
            router.failovers_seen = self.store.failovers;
            router.ledger.lost();
            router.remember_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            for shard in &mut router.shards {
                shard.rewrite_daily_totals();
            }
            router.resync_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            router.anchor_lower_only_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            router.recent.store_may_have_lost();
        }
        let wall = router.wall(now);
        let day = router.day(now);
        // `sync::core`: the views were taken before a resync's read moves the cursor.
        let views_after = router.cursor;
        if router.resync || router.resync_rounds > 0 {
            router.resync_rounds = router.resync_rounds.saturating_sub(1);
            read_totals(
                router,
                &self.store.primary,
                &self.registry,
                &self.snapshot,
                now,
                day,
            );
            let replayed = std::mem::take(&mut router.replayed);
            self.count_applied(index, &replayed);
        }
        let router = self.routers[index].as_mut().expect("a running router");
        let totals: Vec<(u32, String, u64)> = router
            .backlog
            .totals()
            .map(|total| {
                (
                    total.day.0,
                    daily_fields::daily_field(&router.id, total.tenant, None),
                    total.tokens,
                )
            })
            .collect();
        // `sync::core::journaling`: the own totals a previous run's journal raised, whole.
        router.ledger.unsure(&router.journaling.raised);
        let mut writes = router.ledger.writes(&totals);
        writes.extend(
            router
                .journaling
                .raised_beside(&totals)
                .into_iter()
                .map(|(day, field, tokens)| (day, field, DailyWrite::Set(tokens))),
        );
        let heartbeat = Heartbeat {
            run: router.run,
            at_unix_ms: wall,
            interval_ms: router.interval_ms,
            peer_id: router.id.clone(),
            grpc_addr: None,
            agents: Vec::new(),
            agents_version: None,
            agents_unknown: false,
            // `sync::core`: said once the round has gone through, below.
            left: false,
            whole_in: router.claim.of_round(),
        };
        let reply = if router.lose_reply {
            router.lose_reply = false;
            Reply::Lost
        } else {
            Reply::Answered
        };
        // One command of the transaction fails (its reply is an error), the others ran: the
        // usage script (`sync::store::scripts`: the round's entries, daily totals, levels and
        // heartbeat, all or nothing, as it computes everything before its first write) or
        // another (the heartbeat, in a round without usage).
        let failing = if router.error_reply {
            router.error_reply = false;
            Some(if self.rng.chance(500) {
                Failing::Usage
            } else {
                Failing::Heartbeat
            })
        } else {
            None
        };
        let usage_ran = failing != Some(Failing::Usage);
        let copies_due = router.recent.due();
        let copies = copies_to_publish(router, now);
        let encoded = entries_to_publish(router);
        let store = &mut self.store;
        // What the views did not count, as the script reads it before the round's own entries:
        // the entries after the cursor the views were taken at, not this run's own (read only
        // when the round asks: only an ask starts a level).
        let unread: Vec<Entry> =
            views_after
                .filter(|_| !views.is_empty())
                .map_or_else(Vec::new, |after| {
                    store
                        .primary
                        .stream
                        .iter()
                        .filter(|stored| stored.id > after && !stored.copy)
                        .map(|stored| {
                            Entry::decode(&stored.bytes).expect("the simulation's entries decode")
                        })
                        .filter(|entry| !(entry.router == router.id && entry.run == router.run))
                        .collect()
                });
        // `sync::store::scripts`: the copies first, under `c`; they lower no level.
        for bytes in copies.iter().filter(|_| usage_ran) {
            let id = store.next_id(now);
            store.primary.stream.push(Stored {
                id,
                bytes: Arc::from(bytes.as_slice()),
                copy: true,
            });
        }
        let mut written = Vec::new();
        for bytes in encoded.iter().filter(|_| usage_ran) {
            let entry = Entry::decode(bytes).expect("the simulation's entries decode");
            let id = store.next_id(now);
            store.primary.stream.push(Stored {
                id,
                bytes: Arc::from(bytes.as_slice()),
                copy: false,
            });
            if self
                .truth
                .stored
                .insert((entry.run, entry.admitted_at_unix_ms))
            {
                for (bucket, amount) in entry.keys.iter().flat_map(|key| &key.buckets) {
                    if let crate::router::sync::entry::Bucket::Daily { day, .. } = bucket {
                        *self
                            .truth
                            .stored_daily
                            .entry((entry.run, day.0))
                            .or_default() += amount;
                    }
                }
            }
            written.push(entry);
        }
        if self.trace && usage_ran && !writes.is_empty() {
            let day = router.day(now).0;
            let written: Vec<String> = writes
                .iter()
                .filter(|(of, _, _)| *of == day)
                .map(|(_, field, write)| format!("{field} {write:?}"))
                .collect();
            // The totals, not the marks beside them (`sync::counted`).
            let stored: u64 = store
                .primary
                .daily
                .iter()
                .filter(|((of, field), _)| {
                    *of == day && daily_fields::parse_daily_field(field).is_some()
                })
                .map(|(_, tokens)| tokens)
                .sum();
            eprintln!(
                "{:>6} ms  router-{index} writes {written:?} over {stored}",
                now % 1_000_000
            );
        }
        for (day, field, write) in writes.iter().filter(|_| usage_ran) {
            let total = store
                .primary
                .daily
                .entry((*day, field.clone()))
                .or_default();
            match *write {
                DailyWrite::Add(tokens) => *total += tokens,
                DailyWrite::Set(tokens) => *total = tokens,
            }
        }
        // `sync::store`: the marks beside the totals, on the days the round writes totals of.
        let marks = counted::published_marks(&encoded);
        for &(day, run, at) in &marks {
            if usage_ran && writes.iter().any(|(of, _, _)| *of == day) {
                store
                    .primary
                    .daily
                    .insert((day, counted::published_field(&router.id, run)), at);
            }
        }
        for (day, field, tokens) in memory {
            store.primary.memory.insert((day, field), tokens);
        }
        // `sync::store`: a round with something to write runs the usage script, which writes
        // the heartbeat last, with its usage or not at all (another command's error reply then
        // fails the round); an idle round writes the heartbeat on its own.
        let scripted =
            !encoded.is_empty() || !copies.is_empty() || !writes.is_empty() || !views.is_empty();
        let heartbeat_written = if scripted {
            usage_ran
        } else {
            failing != Some(Failing::Heartbeat)
        };
        if heartbeat_written {
            store
                .primary
                .heartbeats
                .insert(router.id.clone(), heartbeat.clone());
        }
        // `sync::core`'s asks, and the script's levels (`sync::levels`) on the store's clock.
        let (asks, asked): (Vec<levels::Ask>, Vec<Anchor>) = views
            .into_iter()
            .filter_map(|view| {
                let (kind, model) = levels::kind_of(view.bucket)?;
                // The simulation's keys have flat rates only.
                model.is_none().then_some((
                    levels::Ask {
                        key: view.key,
                        kind,
                        model: None,
                        view: view.view,
                    },
                    Anchor {
                        key: view.key,
                        bucket: view.bucket,
                        site_units: 0,
                        lower_only: false,
                    },
                ))
            })
            .unzip();
        let site_levels = if usage_ran {
            store
                .primary
                .levels
                .round(now, router.interval_ms, &written, &asks, &unread)
        } else {
            levels::Answers::default()
        };
        let tokens = |units: &i64| units / crate::logic::limits::bucket::UNITS_PER_TOKEN;
        let levels_note = format!(
            "router-{index}: asked the levels of {:?}, the store answered {:?}, and {:?} for its usage",
            asks.iter()
                .map(|ask| tokens(&ask.view.level_units))
                .collect::<Vec<_>>(),
            site_levels.answers.iter().map(tokens).collect::<Vec<_>>(),
            site_levels
                .published
                .iter()
                .map(|(_, units)| tokens(units))
                .collect::<Vec<_>>(),
        );
        let published = levels::fields_of(router.backlog.batches(), |_| None);
        let keep_after = now.saturating_sub(120_000) * 1000;
        store.primary.stream.retain(|stored| stored.id > keep_after);
        if failing.is_some() || matches!(reply, Reply::Lost) {
            router.ledger.unsure(&totals);
            router.ledger.sent(&totals, &marks, router.run);
            self.log(|| format!("router-{index}: the round ran, its reply was lost"));
            return Err(());
        }
        router.recent.published(now, router.backlog.batches());
        router.backlog.clear();
        router.unpublished = 0;
        router.ledger.wrote(&totals);
        router.ledger.wrote(&router.journaling.raised);
        router.claim.went_through(heartbeat.whole_in.clone());
        // `sync::core::journaling`'s `journal_published`: the file becomes a checkpoint of
        // this router's totals (written at once: the simulation's disk never fails).
        let known = router.ledger.known_totals();
        let others = others_counted(router);
        match router
            .journaling
            .after_published(&router.id, router.run, known, others)
        {
            AfterPublished::Keep => {}
            AfterPublished::Remove => {
                router.journaling.removed();
                self.journals[index] = None;
            }
            AfterPublished::Checkpoint(journal) => {
                self.journals[index] = Some(journal.encode());
                router.journaling.checkpointed(journal);
            }
        }
        router.remember_rounds = router.remember_rounds.saturating_sub(1);
        let epoch = store.primary.epoch;
        if router.epoch.is_some_and(|known| known != epoch) {
            for shard in &mut router.shards {
                shard.rewrite_daily_totals();
            }
            router.ledger.lost();
            router.recent.store_may_have_lost();
            router.remember_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            router.resync = true;
            router.resync_rounds = round::RESYNC_ROUNDS_AFTER_LOSS;
            router.sightings.store_lost_data();
        }
        router.epoch = Some(epoch);
        if copies_due {
            router.recent.copies_went_through();
        }
        router.claim.learned(&epoch.to_string());
        router.reads.in_epoch(&epoch.to_string());
        let cursor = router.cursor.unwrap_or(0);
        let entries: Vec<Stored> = store
            .primary
            .stream
            .iter()
            .filter(|stored| stored.id > cursor)
            .cloned()
            .collect();
        let newest = entries
            .last()
            .map_or(cursor, |stored| cursor.max(stored.id));
        let heartbeats = records_as_stored(&store.primary);
        let records = router
            .sightings
            .read(
                heartbeats
                    .iter()
                    .map(|(id, text)| (id.as_str(), text.as_str())),
                wall,
            )
            .records;
        let mut peers = site::peers(&router.id, &heartbeat, &records, &HashMap::new());
        // `sync::core`: the unread routers, and a read of the totals once one claims the epoch.
        let unread = router.reads.unread(&router.id, &records);
        peers.unread = unread.routers;
        if unread.claimed {
            router.resync_rounds = router.resync_rounds.max(1);
        }
        // `sync::core`: the entries and anchors apply under the share this round's records show.
        let share = router.health.share_after(&peers);
        for shard in &mut router.shards {
            shard.set_share(share);
        }
        let applied = apply_entries(router, &self.registry, &self.snapshot, &entries, now, false);
        let lower_only = router.anchor_lower_only_rounds > 0;
        router.anchor_lower_only_rounds = router.anchor_lower_only_rounds.saturating_sub(1);
        let anchors = levels::anchors(asked, site_levels, &published);
        for mut anchor in anchors {
            anchor.lower_only = lower_only;
            let Some(record) = self.registry.get(anchor.key) else {
                continue;
            };
            router.shards[record.tenant_id.owner(SHARDS)].anchor(
                Millis(now),
                &self.registry,
                &anchor,
            );
        }
        router.cursor = Some(newest);
        self.count_applied(index, &applied);
        self.log(|| levels_note);
        if leaving {
            let left = Heartbeat {
                left: true,
                ..heartbeat
            };
            self.store
                .primary
                .heartbeats
                .insert(left.peer_id.clone(), left);
        }
        Ok(peers)
    }

    /// Invariant 3's ledger: what router `index` applied of other runs' usage.
    fn count_applied(&mut self, index: usize, applied: &[(u64, BucketUsage)]) {
        let run = self.routers[index].as_ref().expect("running").run;
        for (sender, usage) in applied {
            if let crate::logic::limits::BucketRef::Daily { day, .. } = usage.bucket {
                *self.truth.applied.entry((run, *sender, day.0)).or_default() += usage.amount;
            }
        }
    }

    /// What was left of the daily budget at router `index`'s last successful round, and what it
    /// spent since (invariant 4: an outage starts after the last round that reached the store,
    /// and the split a router keeps alone is that round's).
    fn note_outage(&mut self, index: usize, share: Share, reached: bool) {
        let router = self.routers[index].as_ref().expect("running");
        if reached {
            let day = router.day(self.now);
            let used = self.daily_charged.get(&day.0).copied().unwrap_or(0);
            let lost = self.lost_in_crashes(day.0);
            let others_may_spend = (0..ROUTERS)
                .filter(|other| *other != index)
                .filter_map(|other| self.outage[other].as_ref())
                .filter(|outage| outage.alone && outage.day == day)
                .map(|outage| self.outage_part(outage).saturating_sub(outage.spent))
                .sum();
            self.outage[index] = Some(Outage {
                day,
                left: self.daily.saturating_sub(used),
                lost,
                spent: 0,
                in_flight: router.in_flight.len() as u64,
                alone: false,
                others_may_spend,
            });
        } else if let Some(outage) = &mut self.outage[index] {
            outage.alone = matches!(share, Share::Alone { .. });
        }
    }
}

/// Reads today's totals and replays the stream up to its newest entry (`sync::core`'s
/// `read_totals`): the entries up to it are in the totals, so only their rate usage applies.
fn read_totals(
    router: &mut Router,
    data: &Data,
    registry: &KeyRegistry,
    snapshot: &RoutingSnapshot,
    now: u64,
    day: Day,
) {
    let fields: Vec<(&str, u64)> = data
        .daily
        .iter()
        .filter(|((of, _), _)| *of == day.0)
        .map(|((_, field), tokens)| (field.as_str(), *tokens))
        .collect();
    let last = data.stream.last().map_or(0, |stored| stored.id);
    let replay_from = router
        .cursor
        .unwrap_or_else(|| last.saturating_sub(60_000 * 1000));
    let replay: Vec<Stored> = data
        .stream
        .iter()
        .filter(|stored| stored.id > replay_from && stored.id <= last)
        .cloned()
        .collect();
    if !router.own_restored {
        for (field, tokens) in &fields {
            if daily_fields::parse_daily_field(field)
                .is_some_and(|(owner, _, _)| owner == router.id)
            {
                router.ledger.restored(day.0, field, *tokens);
            }
        }
    }
    // `sync::core::reads`: a previous run's journal raises this router's own totals.
    let mut owned: Vec<(String, u64)> = fields
        .iter()
        .map(|(field, tokens)| ((*field).to_owned(), *tokens))
        .collect();
    if !router.own_restored
        && let Some(inherited) = &router.journaling.inherited
    {
        router.journaling.raised = inherited.raise_own_totals(&router.id, day.0, &mut owned);
    }
    router.ledger.raise_to_known(day.0, &mut owned);
    let fields: Vec<(&str, u64)> = owned
        .iter()
        .map(|(field, tokens)| (field.as_str(), *tokens))
        .collect();
    // `sync::core`'s rule: caught up (not a start), the entries since the cursor are applied
    // whole before the totals, which count only where they say more.
    let caught_up = router.cursor.is_some();
    let mut replayed = Vec::new();
    if caught_up {
        replayed = apply_entries(router, registry, snapshot, &replay, now, false);
    }
    let memory = data
        .memory
        .iter()
        .filter(|((of, _), _)| *of == day.0)
        .map(|((_, field), tokens)| (field.as_str(), *tokens));
    let mut read = daily_fields::daily_records(
        &router.id,
        day,
        fields,
        memory,
        !router.own_restored,
        |field, mark| router.ledger.sent_at(day.0, field, mark),
    );
    if !router.own_restored
        && let Some(inherited) = &router.journaling.inherited
    {
        inherited.raise_others(&router.id, day.0, &mut read);
    }
    read.bound(&mut router.counts);
    let mut records = read.records;
    // `sync::core::reads`: near midnight, the next day's totals too.
    if let (_, Some(next)) = round::days_to_read(router.wall(now)) {
        let of_next = |rows: &BTreeMap<(u32, String), u64>| -> Vec<(String, u64)> {
            rows.iter()
                .filter(|((of, _), _)| *of == next.0)
                .map(|((_, field), tokens)| (field.clone(), *tokens))
                .collect()
        };
        let mut next_fields = of_next(&data.daily);
        // `sync::core::reads`: this router's own next-day totals too, at start, raised by a
        // previous run's journal.
        if !router.own_restored {
            for (field, tokens) in &next_fields {
                if daily_fields::parse_daily_field(field)
                    .is_some_and(|(owner, _, _)| owner == router.id)
                {
                    router.ledger.restored(next.0, field, *tokens);
                }
            }
            if let Some(inherited) = &router.journaling.inherited {
                let raised = inherited.raise_own_totals(&router.id, next.0, &mut next_fields);
                router.journaling.raised.extend(raised);
            }
        }
        router.ledger.raise_to_known(next.0, &mut next_fields);
        let mut next_read = daily_fields::daily_records(
            &router.id,
            next,
            daily_fields::field_rows(&next_fields),
            daily_fields::field_rows(&of_next(&data.memory)),
            !router.own_restored,
            |field, mark| router.ledger.sent_at(next.0, field, mark),
        );
        if !router.own_restored
            && let Some(inherited) = &router.journaling.inherited
        {
            inherited.raise_others(&router.id, next.0, &mut next_read);
        }
        next_read.bound(&mut router.counts);
        records.extend(next_read.records);
    }
    for (shard_index, shard) in router.shards.iter_mut().enumerate() {
        shard.restore(
            snapshot,
            DailyRestore {
                day,
                records: records
                    .iter()
                    .filter(|record| record.tenant.owner(SHARDS) == shard_index)
                    .cloned()
                    .collect(),
            },
        );
    }
    if !caught_up {
        replayed = apply_entries(router, registry, snapshot, &replay, now, true);
    }
    router.replayed = replayed;
    router.cursor = Some(last);
    // `sync::store`'s `read_daily`: the heartbeats and the epoch in the same transaction.
    let epoch = data.epoch.to_string();
    let heartbeats = records_as_stored(data);
    router.reads.read(
        Some(&epoch),
        heartbeats
            .iter()
            .map(|(id, text)| (id.as_str(), text.as_str())),
    );
    router.own_restored = true;
    router.resync = false;
}

/// The routers' records as the store keeps them: (router ID, text).
fn records_as_stored(data: &Data) -> Vec<(String, String)> {
    data.heartbeats
        .iter()
        .map(|(id, beat)| {
            let text = serde_json::to_string(beat).expect("a heartbeat serializes");
            (id.clone(), text)
        })
        .collect()
}

/// Hands other runs' entries to the owner shards (`sync::core`'s `apply_entries` and
/// `shard::owner`'s `apply_remote`); returns what was applied, with the sending run.
fn apply_entries(
    router: &mut Router,
    registry: &KeyRegistry,
    snapshot: &RoutingSnapshot,
    entries: &[Stored],
    now: u64,
    rates_only: bool,
) -> Vec<(u64, BucketUsage)> {
    let wall = router.wall(now);
    let day = router.day(now);
    // `sync::core`'s rule: a start's replay unsettles only after the router ran alone a while.
    let cold = now.saturating_sub(router.started_at) > 3 * router.interval_ms;
    let mut remote = RemoteUsage::default();
    let mut senders = Vec::new();
    for stored in entries {
        let mut entry = Entry::decode(&stored.bytes).expect("the simulation's entries decode");
        if entry.router == router.id && entry.run == router.run {
            continue;
        }
        if !router
            .applied
            .first_time(&entry.router, entry.run, entry.admitted_at_unix_ms)
        {
            continue;
        }
        // `sync::core::reads`: a previous run of this router ID (its journal): its daily usage
        // is in this router's own totals.
        let rates_only = rates_only || entry.router == router.id;
        if !rates_only {
            router.counts.take_new(&mut entry, |key| {
                registry.get(key).map(|record| record.tenant_id)
            });
        }
        let batch = round::remote_batch(&entry, wall, rates_only, |_| None);
        senders.push((entry.run, batch.usage.clone()));
        remote.batches.push(batch);
    }
    if rates_only {
        // `shard::owner`'s `apply_remote` of a start's replay.
        for (index, shard) in router.shards.iter_mut().enumerate() {
            shard.replay(
                Millis(now),
                day,
                registry,
                snapshot,
                &remote.batches,
                |tenant| tenant.owner(SHARDS) == index,
                cold,
            );
        }
    } else {
        for batch in &remote.batches {
            for usage in &batch.usage {
                let Some(record) = registry.get(usage.key) else {
                    continue;
                };
                let shard = &mut router.shards[record.tenant_id.owner(SHARDS)];
                shard.apply_remote(Millis(now), day, registry, snapshot, usage, batch.age_ms);
            }
        }
    }
    senders
        .into_iter()
        .flat_map(|(run, usage)| usage.into_iter().map(move |used| (run, used)))
        .collect()
}

/// The stream entries a round publishes (`sync::core::journaling`'s `entries_to_publish`): a
/// previous run's held back first, then the backlog's.
fn entries_to_publish(router: &Router) -> Vec<Vec<u8>> {
    let own = router
        .backlog
        .batches()
        .iter()
        .map(|batch| round::entry_of(&router.id, router.run, batch, |_| None))
        .filter(|entry| !entry.is_empty())
        .map(|entry| entry.encode());
    router.journaling.entries_with(own)
}

/// The copies a round publishes again (`sync::core::journaling`'s `copies_to_publish`).
fn copies_to_publish(router: &mut Router, now: u64) -> Vec<Vec<u8>> {
    let (id, run) = (&router.id, router.run);
    router
        .recent
        .copies(now)
        .map(|batch| round::entry_of(id, run, batch, |_| None))
        .filter(|entry| !entry.is_empty())
        .map(|entry| entry.encode())
        .collect()
}

/// What the router counts of the others on each budget, as the journal keeps it (`sync::core`'s
/// `others_counted`).
fn others_counted(router: &Router) -> Vec<(u32, String, u64)> {
    let mut counts: Vec<(u32, String, u64)> = router
        .shards
        .iter()
        .flat_map(|shard| shard.daily_memory())
        .map(|total| {
            let field = daily_fields::daily_field(&router.id, total.tenant, None);
            (total.day.0, field, total.tokens)
        })
        .collect();
    let marks = daily_fields::marks_beside(&router.counts, &counts);
    counts.extend(marks);
    counts
}

/// What a failed round keeps in the journal (`sync::core::journaling`'s `journal_held_back`).
fn held_back(router: &Router) -> Journal {
    router.journaling.keep_under(Journal {
        router: router.id.clone(),
        run: router.run,
        entries: entries_to_publish(router),
        totals: router
            .backlog
            .totals()
            .map(|total| {
                let field = daily_fields::daily_field(&router.id, total.tenant, None);
                (total.day.0, field, total.tokens)
            })
            .collect(),
        others: others_counted(router),
    })
}
