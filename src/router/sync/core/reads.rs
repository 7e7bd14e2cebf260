//! What a round reads besides its own transaction's replies: the other routers' agent lists,
//! the entries handed to the shards (each batch once), and today's totals read again at start,
//! after an outage, a data loss or a failover.

use super::*;

impl Round {
    /// Gives each of the other routers' records its agents: from the list held when its
    /// heartbeat names that version, else fetched (one `HMGET` for every list that changed,
    /// rarely more than one a round). A list that cannot be read leaves the router's agents
    /// unknown (`Heartbeat::resolve_agents`): it is never given up on its agents' word meanwhile.
    pub(super) async fn resolve_agent_lists(&mut self, records: &mut [site::Record]) {
        self.agent_lists
            .retain(|id, _| records.iter().any(|record| record.id == *id));
        let own = &self.settings.router_id;
        let missing: Vec<String> = records
            .iter()
            .filter(|record| record.id != *own)
            .filter(|record| {
                record.heartbeat.agents_version.is_some_and(|version| {
                    self.agent_lists
                        .get(&record.id)
                        .is_none_or(|list| list.version != version)
                })
            })
            .map(|record| record.id.clone())
            .collect();
        if !missing.is_empty() {
            match self.store.agent_lists(&missing).await {
                Ok(texts) => {
                    for (id, text) in missing.into_iter().zip(texts) {
                        match text.as_deref().and_then(AgentList::parse) {
                            Some(list) => {
                                self.agent_lists.insert(id, list);
                            }
                            None => {
                                self.agent_lists.remove(&id);
                            }
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "the other routers' agent lists could not be read");
                }
            }
        }
        for record in records.iter_mut() {
            record
                .heartbeat
                .resolve_agents(self.agent_lists.get(&record.id));
        }
    }

    /// Hands the shards the other routers' `entries` (this run's own are skipped, and so is a
    /// batch applied before, published again after a lost reply; an entry this router cannot
    /// read is logged and skipped). `rates_only`: the entries are already in the daily totals
    /// read (a replay). `anchors`: the site's levels the round returned, applied after the
    /// entries (they count them). Returns the age of the newest applied entry, in ms.
    pub(super) async fn apply_entries(
        &mut self,
        entries: &[(StreamId, Vec<u8>)],
        now_ms: u64,
        rates_only: bool,
        anchors: Vec<Anchor>,
    ) -> Option<u64> {
        let mut remote = RemoteUsage {
            anchors,
            replay: rates_only,
            // A start's replay lowers views at once: only one that ran alone a while (it
            // started while the store did not answer) took usage of its own meanwhile, and
            // its views are then stricter than the site's (`Bucket::unsettle`).
            unsettle: rates_only
                && now_ms.saturating_sub(self.run) > 3 * self.settings.interval.as_millis() as u64,
            ..RemoteUsage::default()
        };
        let mut lag_ms = None;
        {
            let tenants = self.shared.key_tenants();
            let registry = self.shared.registry();
            for (id, bytes) in entries {
                let mut entry = match Entry::decode(bytes) {
                    Ok(entry) => entry,
                    Err(error) => {
                        tracing::warn!(%error, id = %id, "skipping a usage entry this router cannot read");
                        continue;
                    }
                };
                if entry.router == self.settings.router_id && entry.run == self.run {
                    continue;
                }
                if !self
                    .applied
                    .first_time(&entry.router, entry.run, entry.admitted_at_unix_ms)
                {
                    continue;
                }
                lag_ms = Some(now_ms.saturating_sub(entry.admitted_at_unix_ms));
                // A previous run of this router ID (its journal, published by this run): its
                // daily usage is in this router's own totals already.
                let rates_only = rates_only || entry.router == self.settings.router_id;
                if !rates_only {
                    self.counts.take_new(&mut entry, &tenants);
                }
                remote
                    .batches
                    .push(round::remote_batch(&entry, now_ms, rates_only, |model| {
                        registry.find_model(&model.name, model.capability)
                    }));
            }
        }
        if !remote.batches.is_empty() || !remote.anchors.is_empty() {
            let remote = Arc::new(remote);
            self.shared
                .broadcast(|| ControlToShard::ApplyRemote(remote.clone()))
                .await;
        }
        lag_ms
    }

    /// The shards start from this router's own totals of `day` in `fields`: only what they add
    /// is written.
    fn restore_own(&mut self, day: Day, fields: &[(String, u64)]) {
        for (field, tokens) in fields {
            if daily_fields::parse_daily_field(field)
                .is_some_and(|(router, _, _)| router == self.settings.router_id)
            {
                self.ledger.restored(day.0, field, *tokens);
            }
        }
    }

    /// Reads today's totals and the stream's newest entry together and hands the totals to the
    /// shards. At start the entries of the last minute up to that one are applied to the rate
    /// buckets only (they are in the totals). Later (after an outage or a data loss) the entries
    /// since the last one applied are applied whole first, and the totals then count where they
    /// say more (`DailyBudget::set_others_total` never lowers): each is a lower bound of the
    /// others' usage, and neither is added to the other. Near midnight the next day's totals
    /// come too ([`round::days_to_read`]).
    pub(super) async fn read_totals(&mut self, now_ms: u64) -> redis::RedisResult<()> {
        let (day, ahead) = round::days_to_read(now_ms);
        let days: Vec<u32> = std::iter::once(day).chain(ahead).map(|day| day.0).collect();
        let daily = self.store.read_daily(&days).await?;
        self.whole_reads.read(
            daily.epoch.as_deref(),
            daily
                .heartbeats
                .iter()
                .map(|(id, text)| (id.as_str(), text.as_str())),
        );
        let (mut read, last) = (daily.days, daily.last);
        let ahead_read = ahead.map(|next| (next, read.pop().expect("the next day's totals")));
        let (mut fields, memory) = read.pop().expect("today's totals");
        let replay_from = match self.cursor {
            Some(cursor) => cursor,
            None => StreamId {
                ms: last.ms.saturating_sub(REPLAY_MS),
                seq: 0,
            },
        };
        let replay = if last > replay_from {
            self.store.read_range(replay_from, last).await?
        } else {
            Vec::new()
        };
        // Before the totals: see the doc.
        let caught_up = self.cursor.is_some();
        if caught_up {
            self.apply_entries(&replay, now_ms, false, Vec::new()).await;
        }
        if !self.own_restored {
            self.restore_own(day, &fields);
            // A previous run's journal holds more of this router's own totals than the store
            // when that run ended while the store did not answer: the shards start from it,
            // and the round writes it whole.
            if let Some(inherited) = &self.journaling.inherited {
                self.journaling.raised =
                    inherited.raise_own_totals(&self.settings.router_id, day.0, &mut fields);
            }
        }
        self.ledger.raise_to_known(day.0, &mut fields);
        let mut read = daily_fields::daily_records(
            &self.settings.router_id,
            day,
            daily_fields::field_rows(&fields),
            daily_fields::field_rows(&memory),
            !self.own_restored,
            |field, mark| self.ledger.sent_at(day.0, field, mark),
        );
        // At start, what the previous run counted of the others is a floor of their usage.
        if !self.own_restored
            && let Some(inherited) = &self.journaling.inherited
        {
            inherited.raise_others(&self.settings.router_id, day.0, &mut read);
        }
        read.bound(&mut self.counts);
        let mut records = read.records;
        // Near midnight, what the others counted of the next day: it starts that day on the
        // shards' budgets, as their usage of it does (`Quotas::restore`).
        // This router's own totals of the next day too, at start: a previous run whose clock
        // was ahead charged them, and this run's budgets start that day from them, as they do
        // today's (`Quotas::restore`); else a whole write of its field lost them
        // (`sync::simulation`, long-mode seed 39,903: 147 tokens). And raised by that run's
        // journal, as today's are, where it ended while the store did not answer: its
        // next-day usage was published by this run, its total written by none (seed 239,154:
        // 100 tokens missing from the store's totals for the rest of the day).
        if let Some((next, (mut next_fields, next_memory))) = ahead_read {
            if !self.own_restored {
                self.restore_own(next, &next_fields);
                if let Some(inherited) = &self.journaling.inherited {
                    let raised = inherited.raise_own_totals(
                        &self.settings.router_id,
                        next.0,
                        &mut next_fields,
                    );
                    self.journaling.raised.extend(raised);
                }
            }
            self.ledger.raise_to_known(next.0, &mut next_fields);
            let mut next_read = daily_fields::daily_records(
                &self.settings.router_id,
                next,
                daily_fields::field_rows(&next_fields),
                daily_fields::field_rows(&next_memory),
                !self.own_restored,
                |field, mark| self.ledger.sent_at(next.0, field, mark),
            );
            if !self.own_restored
                && let Some(inherited) = &self.journaling.inherited
            {
                inherited.raise_others(&self.settings.router_id, next.0, &mut next_read);
            }
            next_read.bound(&mut self.counts);
            records.extend(next_read.records);
        }
        let shards = self.shared.shard_count();
        let mut per_shard: HashMap<usize, Vec<_>> = HashMap::new();
        for record in records {
            per_shard
                .entry(record.tenant.owner(shards))
                .or_default()
                .push(record);
        }
        for shard in 0..shards {
            let records = per_shard.remove(&shard).unwrap_or_default();
            self.shared
                .send_to_shard(
                    shard,
                    ControlToShard::DailyTotals(DailyRestore { day, records }),
                )
                .await;
        }
        if !caught_up {
            self.apply_entries(&replay, now_ms, true, Vec::new()).await;
        }
        tracing::info!(
            totals = fields.len(),
            replayed = replay.len(),
            "today's totals read from the sync store"
        );
        // Entries up to `last` are in the totals (and their rate usage was just replayed); a
        // cursor past `last` means the store lost its data, and its new entries start lower.
        self.cursor = Some(last);
        self.own_restored = true;
        self.resync = false;
        Ok(())
    }
}
