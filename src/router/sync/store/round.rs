//! The round's transaction against the store: the usage script (or its plain commands), the
//! heartbeat, the claim and the reads, and the stream read after a cursor.

use std::fmt::Write as _;

use super::*;

impl Store {
    /// One round: read the entries after `writes.after`, publish, write the daily totals, the
    /// heartbeat and the router ID's claim in one transaction, then read the claim, the epoch
    /// and the heartbeats. The entries and the totals must be written together: a start-up
    /// reads the totals and the stream's newest entry as one, and takes every entry up to it as
    /// counted in the totals. They go as one script call ([`scripts::USAGE`], atomic in
    /// itself): a `NOSCRIPT` answer means neither was written, and they are sent again with the
    /// script's text; a store whose ACL refuses the script gets them as plain commands. The
    /// occupancy pools are not part of it ([`Store::pools`]): a store that refuses their
    /// script must not keep limits from being shared.
    ///
    /// The stream is read before this round's entries are added, in the same transaction: no
    /// other router's entry can come between what was read and them, so the next round may
    /// read after them ([`RoundReads::own_newest`]) and a router does not read its own usage
    /// back (about 9 bytes a key it served, each round).
    pub async fn round(&mut self, writes: RoundWrites<'_>) -> RedisResult<RoundReads> {
        // A round with nothing to publish (an idle router) sends no usage writes at all.
        let idle = writes.entries.is_empty() && writes.totals.is_empty() && writes.asks.is_empty();
        let scripted = !self.usage_script_refused && !idle;
        let (replies, usage) = match self.round_once(&writes, scripted).await {
            // `EVALSHA` refused while queued: nothing ran. The round again, the long way.
            Err(error)
                if scripted
                    && refused_permission(&error)
                    && error.to_string().to_ascii_lowercase().contains("evalsha") =>
            {
                self.usage_script_refused = true;
                self.round_once(&writes, false).await?
            }
            other => other?,
        };
        let (own_newest, levels) = match usage {
            Usage::Written { newest, levels } => (newest, levels),
            // The script did not run (the store restarted, failed over, or its cache was
            // flushed): the entries and totals alone, with its text. Not in the transaction of
            // the read: another router's entry may come first, so the next round reads after
            // the read only.
            Usage::NoScript => {
                let script = self.usage_script(&writes, true);
                self.usage_alone(vec![script], &writes).await?;
                (None, None)
            }
            // Refused inside the script, before its first write (`HMGET` comes first).
            Usage::Refused => {
                self.usage_script_refused = true;
                let mut commands = self.usage_commands(&writes);
                commands.push(self.heartbeat_command(&writes));
                self.transaction(commands, 0).await?;
                (None, None)
            }
        };
        // Read whole (fewer than asked): what follows the newest entry read is this round's own.
        let read_whole = matches!(&replies[0], Value::Array(items) if items.len() < READ_MAX);
        let own_newest = own_newest.filter(|_| read_whole);
        // The levels count every entry up to this round's: only what was read whole is
        // applied before them.
        let levels =
            levels.filter(|levels| read_whole && levels.answers.len() == writes.asks.len());
        let unlevelled = unlevelled(&replies[0]);
        let entries = entries(&replies[0]);
        let claim_holder: Option<String> = redis::from_redis_value_ref(&replies[1])?;
        let epoch: String = redis::from_redis_value_ref(&replies[2])?;
        let heartbeats: HashMap<String, String> = redis::from_redis_value_ref(&replies[3])?;
        Ok(RoundReads {
            heartbeats,
            entries,
            own_newest,
            levels,
            unlevelled,
            epoch,
            claim_holder,
        })
    }

    /// One try of the round's transaction (see [`Store::round`]): the replies of its four reads
    /// (entries, claim, epoch, heartbeats) and how the usage writes went.
    async fn round_once(
        &mut self,
        writes: &RoundWrites<'_>,
        scripted: bool,
    ) -> RedisResult<([Value; 4], Usage)> {
        let mut commands = vec![self.range_after(writes.after)];
        let usage = if scripted {
            vec![self.usage_script(writes, false)]
        } else {
            self.usage_commands(writes)
        };
        let usage_count = usage.len();
        commands.extend(usage);
        // A scripted round's heartbeat is written by the script, after its usage.
        commands.extend(self.round_rest(writes, !scripted));
        let count = commands.len();
        let mut replies = self.transaction_replies(commands).await?;
        if replies.len() != count {
            return Err(self.unknown_state(format!(
                "the transaction answered {} replies to {count} commands",
                replies.len()
            )));
        }
        let usage_replies: Vec<Value> = replies.drain(1..1 + usage_count).collect();
        if let Some(error) = replies
            .iter()
            .find(|reply| matches!(reply, Value::ServerError(_)))
        {
            return Err(self.unknown_state(format!("the store refused a command: {error:?}")));
        }
        let usage = if scripted {
            match usage_replies.into_iter().next() {
                Some(reply) if noscript(&reply) => Usage::NoScript,
                Some(Value::ServerError(error)) => {
                    let error = redis::RedisError::from(error);
                    if !refused_permission(&error) {
                        return Err(self.failed(error));
                    }
                    Usage::Refused
                }
                Some(Value::Array(reply)) if reply.len() == 3 => Usage::Written {
                    newest: stream_id(&reply[0]),
                    levels: site_levels(&reply[1], &reply[2]),
                },
                Some(_) => {
                    return Err(self.unknown_state(
                        "the usage script answered something else than its entry and levels"
                            .to_owned(),
                    ));
                }
                None => return Err(short_reply()),
            }
        } else {
            if let Some(Value::ServerError(error)) = usage_replies
                .iter()
                .find(|reply| matches!(reply, Value::ServerError(_)))
            {
                return Err(self.unknown_state(format!("the store refused a command: {error:?}")));
            }
            // The `XADD`s come first, one per entry: the last one's ID.
            let own_newest = writes
                .entries
                .len()
                .checked_sub(1)
                .and_then(|last| usage_replies.get(last))
                .and_then(stream_id);
            Usage::Written {
                newest: own_newest,
                levels: None,
            }
        };
        // The read of the entries first; the claim, the epoch and the heartbeats last.
        let heartbeats = replies.pop().ok_or_else(short_reply)?;
        let epoch = replies.pop().ok_or_else(short_reply)?;
        let claim = replies.pop().ok_or_else(short_reply)?;
        let entries = replies.into_iter().next().ok_or_else(short_reply)?;
        Ok(([entries, claim, epoch, heartbeats], usage))
    }

    /// The round's usage script sent again on its own, with its text, after a `NOSCRIPT`: a
    /// refusal inside it (the ACL) writes the same with plain commands instead.
    async fn usage_alone(
        &mut self,
        script: Vec<redis::Cmd>,
        writes: &RoundWrites<'_>,
    ) -> RedisResult<()> {
        let mut pipe = pipe();
        for command in script {
            pipe.add_command(command);
        }
        match self.query(&pipe).await?.pop() {
            Some(Value::ServerError(error)) => {
                let error = redis::RedisError::from(error);
                if !refused_permission(&error) {
                    return Err(self.failed(error));
                }
                self.usage_script_refused = true;
                let mut commands = self.usage_commands(writes);
                commands.push(self.heartbeat_command(writes));
                self.transaction(commands, 0).await.map(|_| ())
            }
            Some(_) => Ok(()),
            None => Err(short_reply()),
        }
    }

    /// The round's entries and daily totals as one call of [`scripts::USAGE`] (`full`: with its
    /// text, after the store answered `NOSCRIPT`).
    fn usage_script(&self, writes: &RoundWrites<'_>, full: bool) -> redis::Cmd {
        let packed = pack(writes.totals);
        let (ask_models, asks) = levels::pack(writes.asks);
        let mut call = USAGE.call(full);
        call.arg(4 + packed.days.len())
            .arg(self.key("usage"))
            .arg(self.key("levels"))
            .arg(self.key("levels:applied"));
        for (day, _) in &packed.days {
            call.arg(self.key(&format!("daily:{day}")));
        }
        call.arg(self.key("routers"));
        call.arg(writes.after.ms.saturating_sub(STREAM_KEEP_MS))
            .arg(writes.entries.len());
        for entry in writes.entries {
            call.arg(entry.as_slice());
        }
        call.arg(&self.router)
            .arg(DAILY_TTL_SECONDS)
            .arg(packed.models.len());
        for model in &packed.models {
            call.arg(model);
        }
        for (_, blob) in &packed.days {
            call.arg(blob.as_slice());
        }
        call.arg(levels::LEVELS_TTL_SECONDS)
            .arg(levels::SWEEP_FIELDS)
            .arg(writes.interval_ms)
            .arg(ask_models.len());
        for model in &ask_models {
            call.arg(model);
        }
        call.arg(asks)
            .arg(
                // Read only when an ask starts a level: a round without asks sends nothing.
                writes
                    .views_after
                    .filter(|_| !writes.asks.is_empty())
                    .map_or_else(String::new, |after| format!("({after}")),
            )
            .arg(writes.run)
            .arg(READ_MAX)
            .arg(writes.heartbeat);
        // The marks beside the totals, by the index of their day's key. A day without totals
        // this round has no key in the call and gets no mark: a router whose count comes from
        // these totals applies such a batch again if it is published again (the safe side).
        let mut marks = String::new();
        for (day, run, at) in writes.marks {
            if let Some(index) = packed.days.iter().position(|(of, _)| of == day) {
                let _ = write!(marks, "{} {run} {at} ", 4 + index);
            }
        }
        call.arg(marks).arg(writes.copies);
        call
    }

    /// The round's entries and daily totals as plain commands, for a store whose ACL refuses
    /// the script: per entry an `XADD` (under `c` for a copy, `sync::republish`); per day one
    /// `HINCRBY` per changed total (an increment of this process's own, so another writer of
    /// the field loses nothing), one `HSET` with the whole totals written again after the store
    /// lost its data, and the day's expiry.
    fn usage_commands(&self, writes: &RoundWrites<'_>) -> Vec<redis::Cmd> {
        let usage = self.key("usage");
        let mut commands = Vec::with_capacity(writes.entries.len() + writes.totals.len() + 2);
        for (index, entry) in writes.entries.iter().enumerate() {
            let mut xadd = redis::cmd("XADD");
            xadd.arg(&usage)
                .arg("MINID")
                .arg("~")
                .arg(writes.after.ms.saturating_sub(STREAM_KEEP_MS))
                .arg("*")
                .arg(if index < writes.copies { "c" } else { "u" })
                .arg(entry.as_slice());
            commands.push(xadd);
        }
        let mut days: Vec<u32> = writes.totals.iter().map(|row| row.day).collect();
        days.sort_unstable();
        days.dedup();
        for day in days {
            let key = self.key(&format!("daily:{day}"));
            let mut whole = redis::cmd("HSET");
            whole.arg(&key);
            let mut wholes = 0;
            for row in writes.totals.iter().filter(|row| row.day == day) {
                match row.write {
                    DailyWrite::Add(tokens) => {
                        let mut add = redis::cmd("HINCRBY");
                        add.arg(&key).arg(&row.field).arg(tokens);
                        commands.push(add);
                    }
                    DailyWrite::Set(tokens) => {
                        whole.arg(&row.field).arg(tokens);
                        wholes += 1;
                    }
                }
            }
            if wholes > 0 {
                commands.push(whole);
            }
            for (_, run, at) in writes.marks.iter().filter(|(of, _, _)| *of == day) {
                let mut mark = redis::cmd("HSET");
                mark.arg(&key)
                    .arg(crate::router::sync::counted::published_field(
                        &self.router,
                        *run,
                    ))
                    .arg(*at);
                commands.push(mark);
            }
            let mut expire = redis::cmd("EXPIRE");
            expire.arg(&key).arg(DAILY_TTL_SECONDS);
            commands.push(expire);
        }
        commands
    }

    /// This router's heartbeat, written on its own (a round that runs no usage script).
    fn heartbeat_command(&self, writes: &RoundWrites<'_>) -> redis::Cmd {
        let mut heartbeat = redis::cmd("HSET");
        heartbeat
            .arg(self.key("routers"))
            .arg(&self.router)
            .arg(writes.heartbeat);
        heartbeat
    }

    /// The rest of the round's transaction: the heartbeat unless the usage script writes it
    /// (and the agent list), the epoch, the claim, then three reads: the claim's holder, the
    /// epoch, the heartbeats.
    fn round_rest(&self, writes: &RoundWrites<'_>, heartbeat: bool) -> Vec<redis::Cmd> {
        let routers = self.key("routers");
        let claim = self.key(&format!("owner:{}", self.router));
        let mut commands = Vec::with_capacity(11);
        if heartbeat {
            commands.push(self.heartbeat_command(writes));
        }
        if let Some(agents) = writes.agents {
            let mut list = redis::cmd("HSET");
            list.arg(self.key("agents")).arg(&self.router).arg(agents);
            commands.push(list);
        }
        let mut days: Vec<u32> = writes.memory.iter().map(|(day, _, _)| *day).collect();
        days.sort_unstable();
        days.dedup();
        for day in days {
            let key = self.key(&format!("memory:{day}"));
            let mut remember = redis::cmd("HSET");
            remember.arg(&key);
            for (_, field, tokens) in writes.memory.iter().filter(|(of, _, _)| *of == day) {
                remember.arg(field).arg(tokens);
            }
            commands.push(remember);
            let mut expire = redis::cmd("EXPIRE");
            expire.arg(&key).arg(DAILY_TTL_SECONDS);
            commands.push(expire);
        }
        let mut set_epoch = redis::cmd("SET");
        set_epoch
            .arg(self.key("epoch"))
            .arg(format!("{}-{}", writes.now_ms, self.epoch_suffix))
            .arg("NX");
        commands.push(set_epoch);
        if writes.claim.release {
            let mut release = redis::cmd("DEL");
            release.arg(&claim);
            commands.push(release);
        } else {
            // Taken when free, and renewed: renewing another process's claim is harmless (this
            // one steps down on reading it, and the other renews it anyway).
            let mut take = redis::cmd("SET");
            take.arg(&claim)
                .arg(writes.claim.value)
                .arg("NX")
                .arg("PX")
                .arg(writes.claim.ttl_ms.max(1));
            commands.push(take);
            let mut renew = redis::cmd("PEXPIRE");
            renew.arg(&claim).arg(writes.claim.ttl_ms.max(1));
            commands.push(renew);
        }
        let mut holder = redis::cmd("GET");
        holder.arg(&claim);
        commands.push(holder);
        let mut epoch = redis::cmd("GET");
        epoch.arg(self.key("epoch"));
        commands.push(epoch);
        let mut heartbeats = redis::cmd("HGETALL");
        heartbeats.arg(&routers);
        commands.push(heartbeats);
        commands
    }

    /// The round's read of the entries after `after`, at most [`READ_MAX`].
    fn range_after(&self, after: StreamId) -> redis::Cmd {
        let mut range = redis::cmd("XRANGE");
        range
            .arg(self.key("usage"))
            .arg(format!("({after}"))
            .arg("+")
            .arg("COUNT")
            .arg(READ_MAX);
        range
    }
}

/// The usage script's answers about levels: one per ask, then (field, level) pairs. `None`
/// when they do not read as such.
fn site_levels(answers: &Value, published: &Value) -> Option<levels::Answers> {
    let (Value::Array(answers), Value::Array(published)) = (answers, published) else {
        return None;
    };
    let answers = answers
        .iter()
        .map(|level| match level {
            Value::Int(units) => Some(*units),
            _ => None,
        })
        .collect::<Option<Vec<i64>>>()?;
    let published = published
        .chunks(2)
        .map(|pair| match pair {
            [Value::BulkString(field), Value::Int(units)] => {
                Some((String::from_utf8(field.clone()).ok()?, *units))
            }
            _ => None,
        })
        .collect::<Option<Vec<(String, i64)>>>()?;
    Some(levels::Answers { answers, published })
}

/// How the round's usage writes went in its transaction.
enum Usage {
    /// Written; the ID of the last entry added, when there was one, and the levels asked for
    /// (`None` when the script did not answer them: the plain commands).
    Written {
        newest: Option<StreamId>,
        levels: Option<levels::Answers>,
    },
    /// The store did not know the script: nothing was written.
    NoScript,
    /// The store's ACL refused a command inside the script, before its first write.
    Refused,
}
