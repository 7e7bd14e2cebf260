//! Whether the daily totals this router read of another router hold all that router's usage of
//! the day (pure).
//!
//! A router counts the others' daily usage from their entries on the stream, and reads their
//! totals when it starts, comes back, or hears that the store lost its data. After a loss the
//! stream's entries are gone and the totals are what each router writes whole again, in the
//! round after the one whose reply told it of the loss. A router that read the totals before
//! another had written its own whole counted that router short: by everything it published while
//! the reader was cut off, thousands of tokens. Alone in an outage that followed, it split what
//! it believed was left by the routers and spent a part of tokens the site had already charged
//! (`sync::simulation`, seed 102,286: router-0 read at 627.65 s, router-1 wrote its total whole at
//! 627.70 s, the store went down at 628.1 s, and router-0 spent 3,588 tokens where 324 were left).
//!
//! So each router says in its heartbeat the store epoch its totals are written whole in
//! ([`Heartbeat::whole_in`], [`Claim`]), written in the same transaction as the totals. A reader
//! reads the heartbeats and the epoch in the transaction that reads the totals ([`Reads`]): a
//! router that claimed that epoch then is read whole until the store loses its data again. A
//! live router not read whole is *unread* (`Share::Shared`'s `unread`): each daily budget leaves
//! it its part of the whole budget, and an outage that follows holds every daily budget
//! (`limits::daily`), as a router that cannot read a total does.
//!
//! [`Heartbeat::whole_in`]: super::site::Heartbeat::whole_in

use std::collections::HashSet;

use super::site::{Heartbeat, PeerState, Record, WHOLE_IN_EVERY_EPOCH};

/// What a heartbeat claims of the epoch `epoch`.
fn claims(heartbeat: &Heartbeat, epoch: &str) -> bool {
    heartbeat
        .whole_in
        .as_deref()
        .is_some_and(|claimed| claimed == epoch || claimed == WHOLE_IN_EVERY_EPOCH)
}

/// This router's claim: the epoch its own totals in the store are whole in.
///
/// A new epoch (the store lost its data) or the first this run sees makes the claim *pending*:
/// the shards report every total again (at start, the run's first read restored them), and the
/// first round whose usage was gathered after that, from every shard, writes them whole and
/// claims the epoch in the same transaction. A round that ran with its reply lost wrote both or
/// neither, so the claim stays pending until a round goes through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// The epoch the last round that went through claimed.
    claimed: Option<String>,
    /// The epoch to claim once a round writes every total whole; `ready` once a round's usage
    /// was gathered from every shard since.
    pending: Option<(String, bool)>,
}

impl Claim {
    /// The store's epoch as a round read it. One this router neither claims nor is about to (the
    /// store lost its data, or this run sees its first) is claimed once every total is written
    /// whole in it.
    pub fn learned(&mut self, epoch: &str) {
        let known = self.claimed.as_deref() == Some(epoch)
            || self
                .pending
                .as_ref()
                .is_some_and(|(pending, _)| pending == epoch);
        if !known {
            self.pending = Some((epoch.to_owned(), false));
        }
    }

    /// A round gathered the shards' usage: from every shard (`every_shard`), its totals are all
    /// there, and the round writes them whole.
    pub fn gathered(&mut self, every_shard: bool) {
        if let Some((_, ready)) = &mut self.pending {
            *ready |= every_shard;
        }
    }

    /// What this round's heartbeat claims.
    pub fn of_round(&self) -> Option<String> {
        match &self.pending {
            Some((epoch, true)) => Some(epoch.clone()),
            _ => self.claimed.clone(),
        }
    }

    /// The round whose heartbeat claimed `claimed` went through.
    pub fn went_through(&mut self, claimed: Option<String>) {
        if self
            .pending
            .as_ref()
            .is_some_and(|(epoch, ready)| *ready && claimed.as_ref() == Some(epoch))
        {
            self.pending = None;
        }
        self.claimed = claimed;
    }
}

/// The other routers whose totals this router read whole, in the store's current epoch. Bound:
/// one ID per router of the site, emptied when the store loses its data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reads {
    epoch: Option<String>,
    whole: HashSet<String>,
}

impl Reads {
    /// The totals were read in one transaction with `heartbeats` (router ID, record text) and
    /// the store's `epoch` (`None`: the store had none yet). Routers that claimed that epoch are
    /// read whole; a record that does not parse claims nothing.
    pub fn read<'a>(
        &mut self,
        epoch: Option<&str>,
        heartbeats: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) {
        let Some(epoch) = epoch else { return };
        self.in_epoch(epoch);
        for (id, text) in heartbeats {
            if serde_json::from_str::<Heartbeat>(text).is_ok_and(|beat| claims(&beat, epoch)) {
                self.whole.insert(id.to_owned());
            }
        }
    }

    /// The store's epoch as a round read it: another one than the reads' empties them.
    pub fn in_epoch(&mut self, epoch: &str) {
        if self.epoch.as_deref() != Some(epoch) {
            self.epoch = Some(epoch.to_owned());
            self.whole.clear();
        }
    }

    /// Of `records` (this router's, `own_id`, aside), the live routers not read whole, and
    /// whether one of them now claims the epoch: a read of the totals would read it whole.
    pub fn unread(&self, own_id: &str, records: &[Record]) -> Unread {
        let mut unread = Unread::default();
        for record in records.iter().filter(|record| record.id != own_id) {
            if record.heartbeat.state(record.age_ms) != PeerState::Live
                || self.whole.contains(&record.id)
            {
                continue;
            }
            unread.routers += 1;
            unread.claimed |= self
                .epoch
                .as_deref()
                .is_some_and(|epoch| claims(&record.heartbeat, epoch));
        }
        unread
    }
}

/// See [`Reads::unread`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unread {
    pub routers: u32,
    /// One of them claims the epoch: read the totals again.
    pub claimed: bool,
}

#[cfg(test)]
mod tests;
