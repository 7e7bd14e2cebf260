//! What the store must allow, and who runs under this router ID (issue 37, "Store permissions"
//! and "One process per router ID"): the start-up check (every command allowed, the router ID
//! claimed or waited for), the check of each new connection, and the parts of the sync a store
//! refuses on their own, each logged once with what its refusal costs.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Refused, Round, RoundFailure};
use crate::base::clock::now_unix_ms;
use crate::router::sync::claim::{self, AtStart, Decision};

/// How often a start-up reads a claim another process holds, while it waits for it to expire.
const CLAIM_POLL: Duration = Duration::from_millis(100);

/// The longest the start-up check waits for the store to answer before starting without it.
const CONNECT_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The one line that names what the store refuses: each command, what it is needed for, and
/// where to grant it.
fn refused_message(refused: &[(String, &'static str)], site: &str) -> String {
    let commands: Vec<String> = refused
        .iter()
        .map(|(command, needed_for)| format!("{command} ({needed_for})"))
        .collect();
    format!(
        "the sync store's ACL refuses commands the sync needs (permission): {}; grant them to the store's user on the keys hivenet:{{{site}}}:*",
        commands.join(", ")
    )
}

impl Round {
    /// Before the first round, when the store answers: every command the sync needs is allowed,
    /// and this process holds its router ID. `Err` names what refuses the start (logged as one
    /// ERROR line). A store unreachable now is checked at the first round that reaches it.
    pub(super) async fn check_at_start(&mut self) -> Result<(), String> {
        let reach = CONNECT_CHECK_TIMEOUT;
        if !matches!(
            tokio::time::timeout(reach, self.store.ensure_connected()).await,
            Ok(Ok(()))
        ) {
            tracing::warn!(
                "the sync store is unreachable at start: its permissions and this router ID's claim are checked at the first round that reaches it"
            );
            return Ok(());
        }
        let sentinel = self.settings.store.sentinel_master.is_some();
        match self.store.refused(sentinel).await {
            Ok(refused) if !refused.is_empty() => {
                let message = refused_message(&refused, &self.settings.site);
                tracing::error!("{message}");
                return Err(message);
            }
            Ok(_) => self.connects_checked = self.store.connects(),
            Err(error) => {
                tracing::warn!(%error, "the sync store stopped answering at start: its permissions and this router ID's claim are checked at the first round that reaches it");
                return Ok(());
            }
        }
        let mut start = AtStart::new(&self.claim_value, self.settings.interval);
        let mut waiting = false;
        loop {
            let holder = match self
                .store
                .claim(&self.claim_value, self.claim_ttl.as_millis() as u64)
                .await
            {
                Ok(holder) => holder,
                Err(error) => {
                    tracing::warn!(%error, "the sync store stopped answering at start: this router ID is claimed at the first round that reaches it");
                    return Ok(());
                }
            };
            match start.read(now_unix_ms().max(0) as u64, holder.as_deref()) {
                Decision::Ours => return Ok(()),
                Decision::Wait => {
                    if !waiting && let Some(holder) = &holder {
                        waiting = true;
                        tracing::info!(router_id = %self.settings.router_id, other = %holder, patience = ?start.patience(), "another process claimed this --router-id: waiting for its claim to expire (a process that crashed renews it no more)");
                    }
                    tokio::time::sleep(CLAIM_POLL).await;
                }
                Decision::Refuse(other) => {
                    let message = format!(
                        "another process runs under --router-id {}: {other} (it renewed its claim in the sync store); one router ID runs one process at a time: stop that process, or give this one its own --router-id",
                        self.settings.router_id
                    );
                    self.metrics.router_id_conflict.store(1, Ordering::Relaxed);
                    tracing::error!("{message}");
                    return Err(message);
                }
            }
        }
    }

    /// After each new connection: the commands the sync needs that the store refuses are logged
    /// as a permission error, once per connection (the round goes on: what is refused fails on
    /// its own).
    pub(super) async fn check_permissions(&mut self) -> redis::RedisResult<()> {
        if self.store.connects() == self.connects_checked {
            return Ok(());
        }
        let sentinel = self.settings.store.sentinel_master.is_some();
        let refused = self.store.refused(sentinel).await?;
        self.connects_checked = self.store.connects();
        if refused.is_empty() {
            self.refusals_logged.clear();
        } else {
            self.metrics
                .permission_errors_total
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!("{}", refused_message(&refused, &self.settings.site));
        }
        Ok(())
    }

    /// A part of the sync the store's ACL refused: counted each time, logged once (until a
    /// connection's check finds everything allowed).
    pub(super) fn refused(&mut self, part: Refused, error: &redis::RedisError) {
        self.metrics
            .permission_errors_total
            .fetch_add(1, Ordering::Relaxed);
        if self.refusals_logged.insert(part) {
            tracing::error!(%error, refused = part.cost(), "the sync store's ACL refuses a command the sync needs (permission error): grant it to the store's user");
        } else {
            tracing::debug!(%error, ?part, "the sync store refused a command (permission)");
        }
    }

    /// A process that stepped down from its router ID (another held it) claims it again once
    /// the other stopped; until then, and in a leaving round, the round fails as stepped down.
    pub(super) async fn claim_back(&mut self, leaving: bool) -> Result<(), RoundFailure> {
        let Some(holder) = self.stepped_down.clone() else {
            return Ok(());
        };
        if leaving {
            return Err(RoundFailure::SteppedDown(holder));
        }
        let now_holder = self
            .store
            .claim(&self.claim_value, self.claim_ttl.as_millis() as u64)
            .await?;
        if let Some(other) = claim::other_holder(&self.claim_value, now_holder.as_deref()) {
            self.stepped_down = Some(other.to_owned());
            return Err(RoundFailure::SteppedDown(other.to_owned()));
        }
        tracing::info!(router_id = %self.settings.router_id, "the other process under this --router-id stopped: this one holds the ID again and shares limits with the site");
        self.stepped_down = None;
        self.metrics.router_id_conflict.store(0, Ordering::Relaxed);
        self.resync = true;
        Ok(())
    }
}
