//! The giving side of a connection's move to its key's owner (`shard::handoff`, which holds the
//! message, the load counts and the rule): whether a connection should move, and sending it.
//! Apart from `handoff` so that the message and the counts, which the shard's state and the mesh
//! messages hold, import nothing of the shard.

use crate::router::metrics::ShardMetrics;
use crate::router::shard::handoff::Handoff;
use crate::router::shard::messages::ShardToShard;
use crate::router::shard::state::Shard;

impl Shard {
    /// The shard a connection whose first request presents `key` should move to, if any: the
    /// key is limited, owned elsewhere, and that owner is not too busy
    /// ([`Loads::may_move`](crate::router::shard::handoff::Loads::may_move)).
    pub fn handoff_target(&self, key: &crate::logic::auth::keys::KeyRecord) -> Option<usize> {
        let loads = self.settings.handoff.as_ref()?;
        if self.lifecycle.is_draining() || !crate::router::shard::owner::quotas::is_limited(key) {
            return None;
        }
        let owner = key.tenant_id.owner(self.count);
        (owner != self.id && loads.may_move(self.id, owner)).then_some(owner)
    }

    /// Gives the connection to shard `to`; hands it back when the ring there is full or other
    /// messages already wait for room (the caller then serves it itself).
    pub fn hand_off(&self, to: usize, handoff: Handoff) -> Result<(), Handoff> {
        let mut outbox = self.outbox.borrow_mut();
        if outbox.has_deferred() {
            return Err(handoff);
        }
        let loads = self.settings.handoff.as_ref();
        // Counted on the owner from now on, so the next decisions here and there see it.
        loads.inspect(|loads| loads.add(to, 1));
        let sent = outbox.send_wrapped(to, handoff, |handoff| {
            ShardToShard::Connection(Box::new(handoff))
        });
        match sent {
            Ok(()) => ShardMetrics::add(&self.metrics.connections_handed_off_total, 1),
            Err(_) => {
                if let Some(loads) = loads {
                    loads.add(to, -1);
                }
            }
        }
        sent
    }
}
