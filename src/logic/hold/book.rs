//! The bookkeeping of hold at zero (seed `hold-at-zero.md`): which requests are held for a model
//! that is asleep on this site, the hold limits, and the pending demand an autoscaler reads.
//!
//! Pure logic: no clock, no I/O. Each shard keeps one book for the models it owns; the router-wide
//! total of held requests is [`super::HeldTotal`], shared by the shards. The seed's rules it owns:
//! - **Hold limits** ("Hold limits"): at most `per_model` requests held per model, `per_key` per
//!   API key and model (requests without a key have only the other limits). A request beyond
//!   either is refused and not counted in the pending demand. "Model" is the name, whatever the
//!   endpoint's kind: a chat and an embedding request for one name count against the same
//!   limits, which is why every capability of a name has the same owner shard
//!   ([`ModelId::owner`]), this book's.
//! - **Pending demand** ("Pending demand and the autoscaler"): the distinct requests waiting for
//!   a model — held now, or released by a wake and still without a slot. Requests of one key
//!   with the same client request ID (a UUID) count once; requests without an ID count on their
//!   own; different keys always count separately, even with the same ID.
//! - A released request no longer counts against the hold limits (they bound what is held, and
//!   with it the request bodies kept for the hold); it stays in the pending demand until it gets
//!   a slot, is answered, or its client leaves.
//!
//! Invariants (checked by the proptest below): every count returns to zero once every request
//! has left; the pending demand never exceeds the requests in the book, and equals the number of
//! distinct (key, client ID) pairs plus the requests without an ID.

use std::collections::HashMap;

use crate::base::ids::KeyId;
use crate::base::ids::Ticket;
use crate::base::ids::{ModelId, ModelNameId};

/// The per-model hold limits a book enforces; each at least 1 (start-up refuses anything else).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldLimits {
    /// `--wake-hold-max`.
    pub per_model: u32,
    /// `--wake-hold-max-per-key`.
    pub per_key: u32,
}

impl Default for HoldLimits {
    /// The seed's defaults: 100 per model, 20 per key and model.
    fn default() -> Self {
        HoldLimits {
            per_model: 100,
            per_key: 20,
        }
    }
}

/// A client request ID (`X-Client-Request-ID` or `X-Request-ID`), only when it is a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
/// Kept as bytes (alignment 1): it travels inside every parsed request.
pub struct ClientId(pub [u8; 16]);

impl ClientId {
    /// Parses a UUID in any letter case; anything else is no client ID.
    pub fn parse(text: &[u8]) -> Option<ClientId> {
        if text.len() != 36 {
            return None;
        }
        let mut value: u128 = 0;
        for (index, byte) in text.iter().enumerate() {
            if matches!(index, 8 | 13 | 18 | 23) {
                if *byte != b'-' {
                    return None;
                }
                continue;
            }
            let digit = (*byte as char).to_digit(16)?;
            value = (value << 4) | u128::from(digit);
        }
        Some(ClientId(value.to_be_bytes()))
    }

    /// The client request ID of a request: `X-Client-Request-ID`, else `X-Request-ID`, when it
    /// is a UUID. A header that is not a UUID is ignored (the seed: "the router ignores any other
    /// value").
    pub fn of_headers(
        client_request_id: Option<&[u8]>,
        request_id: Option<&[u8]>,
    ) -> Option<ClientId> {
        client_request_id
            .and_then(ClientId::parse)
            .or_else(|| request_id.and_then(ClientId::parse))
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    model: ModelId,
    key: Option<KeyId>,
    client: Option<ClientId>,
    /// Still held (counts against the limits); false once released by a wake.
    held: bool,
    /// Arrival order, for releasing the oldest first.
    arrival: u64,
}

/// One model (name and capability): its pending demand, `hivenet_pending_demand` per kind.
#[derive(Debug, Default, Clone)]
struct ModelCounts {
    /// Held now (not yet released): the entry goes once this and `pending` are 0.
    held: u32,
    /// Distinct waiting requests (held or released without a slot).
    pending: u32,
}

/// One model name, every kind: what the hold limits count.
#[derive(Debug, Default, Clone)]
struct NameCounts {
    held: u32,
    held_per_key: HashMap<KeyId, u32>,
}

/// Why a request was not held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldRefusal {
    /// A hold limit is reached: `503 model_waking` ("too many requests are already waiting").
    Full,
}

#[derive(Debug, Default)]
pub struct HoldBook {
    limits: HoldLimits,
    entries: HashMap<Ticket, Entry>,
    models: HashMap<ModelId, ModelCounts>,
    /// The held requests of each model name, against the hold limits.
    names: HashMap<ModelNameId, NameCounts>,
    /// Live entries per (key, client ID, model): the first makes the pair count in the demand.
    duplicates: HashMap<(Option<KeyId>, ClientId, ModelId), u32>,
    held_total: u32,
    arrivals: u64,
}

impl HoldBook {
    pub fn new(limits: HoldLimits) -> HoldBook {
        HoldBook {
            limits,
            ..HoldBook::default()
        }
    }

    /// Holds the request `ticket` for `model`, or refuses it when a hold limit is reached. A
    /// ticket already in the book is refused too (it cannot be held twice).
    pub fn hold(
        &mut self,
        ticket: Ticket,
        model: ModelId,
        key: Option<KeyId>,
        client: Option<ClientId>,
    ) -> Result<(), HoldRefusal> {
        if self.entries.contains_key(&ticket) {
            return Err(HoldRefusal::Full);
        }
        let counts = self.names.get(&model.name());
        let held_for_model = counts.map_or(0, |counts| counts.held);
        let held_for_key = match (counts, key) {
            (Some(counts), Some(key)) => counts.held_per_key.get(&key).copied().unwrap_or(0),
            _ => 0,
        };
        if held_for_model >= self.limits.per_model
            || (key.is_some() && held_for_key >= self.limits.per_key)
        {
            return Err(HoldRefusal::Full);
        }
        let arrival = self.arrivals;
        self.arrivals += 1;
        let name = self.names.entry(model.name()).or_default();
        name.held += 1;
        if let Some(key) = key {
            *name.held_per_key.entry(key).or_insert(0) += 1;
        }
        let counts = self.models.entry(model).or_default();
        counts.held += 1;
        let first_of_its_kind = match client {
            None => true,
            Some(client) => {
                let live = self.duplicates.entry((key, client, model)).or_insert(0);
                *live += 1;
                *live == 1
            }
        };
        if first_of_its_kind {
            counts.pending += 1;
        }
        self.held_total += 1;
        self.entries.insert(
            ticket,
            Entry {
                model,
                key,
                client,
                held: true,
                arrival,
            },
        );
        Ok(())
    }

    /// A wake released the request: it leaves the hold limits and waits for a slot, still in the
    /// pending demand.
    pub fn release(&mut self, ticket: Ticket) {
        let Some(entry) = self.entries.get_mut(&ticket) else {
            return;
        };
        if !entry.held {
            return;
        }
        entry.held = false;
        let entry = *entry;
        self.unhold(&entry);
    }

    /// The request got a slot, was answered, or its client left: it leaves the book.
    pub fn finish(&mut self, ticket: Ticket) {
        let Some(entry) = self.entries.remove(&ticket) else {
            return;
        };
        if entry.held {
            self.unhold(&entry);
        }
        let last_of_its_kind = match entry.client {
            None => true,
            Some(client) => {
                let pair = (entry.key, client, entry.model);
                let live = self
                    .duplicates
                    .get_mut(&pair)
                    .expect("a live entry has its duplicate count");
                *live -= 1;
                let last = *live == 0;
                if last {
                    self.duplicates.remove(&pair);
                }
                last
            }
        };
        let counts = self
            .models
            .get_mut(&entry.model)
            .expect("a live entry has its model's counts");
        if last_of_its_kind {
            counts.pending -= 1;
        }
        if counts.pending == 0 && counts.held == 0 {
            self.models.remove(&entry.model);
        }
    }

    /// `hivenet_pending_demand{model}`.
    pub fn pending_demand(&self, model: ModelId) -> u32 {
        self.models.get(&model).map_or(0, |counts| counts.pending)
    }

    /// Every model with a pending demand in this book, and its demand.
    pub fn demand(&self) -> impl Iterator<Item = (ModelId, u32)> + '_ {
        self.models
            .iter()
            .map(|(model, counts)| (*model, counts.pending))
    }

    /// Requests held now (not yet released), across this book's models.
    pub fn held_total(&self) -> u32 {
        self.held_total
    }

    /// The held (not yet released) requests of `model`, oldest first, for a wake to release.
    pub fn held_for(&self, model: ModelId) -> Vec<Ticket> {
        let mut held: Vec<(u64, Ticket)> = self
            .entries
            .iter()
            .filter(|(_, entry)| entry.held && entry.model == model)
            .map(|(ticket, entry)| (entry.arrival, *ticket))
            .collect();
        held.sort_unstable_by_key(|(arrival, _)| *arrival);
        held.into_iter().map(|(_, ticket)| ticket).collect()
    }

    fn unhold(&mut self, entry: &Entry) {
        self.held_total -= 1;
        let counts = self
            .models
            .get_mut(&entry.model)
            .expect("a held entry has its model's counts");
        counts.held -= 1;
        let name = self
            .names
            .get_mut(&entry.model.name())
            .expect("a held entry has its name's counts");
        name.held -= 1;
        if let Some(key) = entry.key {
            let per_key = name
                .held_per_key
                .get_mut(&key)
                .expect("a held keyed entry has its key's count");
            *per_key -= 1;
            if *per_key == 0 {
                name.held_per_key.remove(&key);
            }
        }
        if name.held == 0 {
            self.names.remove(&entry.model.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::base::ids::Capability;

    const M: ModelId = ModelId(0);

    fn model(name: u32, capability: Capability) -> ModelId {
        ModelId::new(ModelNameId(name), capability)
    }

    /// A book that hands out tickets in order, as requesters do.
    struct Counter(u64);

    impl Counter {
        fn hold(
            &mut self,
            book: &mut HoldBook,
            model: ModelId,
            key: Option<KeyId>,
            client: Option<ClientId>,
        ) -> Result<Ticket, HoldRefusal> {
            self.0 += 1;
            let ticket = Ticket {
                shard: 0,
                sequence: self.0,
            };
            book.hold(ticket, model, key, client).map(|()| ticket)
        }
    }

    fn id(text: &str) -> Option<ClientId> {
        ClientId::parse(text.as_bytes())
    }

    #[test]
    fn client_ids_are_uuids_in_any_case() {
        assert_eq!(
            id("8b9e4a6d-dfb4-4b95-bada-319e7e5b878a"),
            id("8B9E4A6D-DFB4-4B95-BADA-319E7E5B878A")
        );
        assert!(id("8b9e4a6d-dfb4-4b95-bada-319e7e5b878a").is_some());
        for bad in [
            "",
            "retry-1",
            "8b9e4a6d_dfb4-4b95-bada-319e7e5b878a",
            "8b9e4a6d-dfb4-4b95-bada-319e7e5b878g",
        ] {
            assert_eq!(id(bad), None, "{bad}");
        }
    }

    #[test]
    fn limits_refuse_without_counting_demand() {
        let mut book = HoldBook::new(HoldLimits {
            per_model: 3,
            per_key: 2,
        });
        let mut tickets = Counter(0);
        let key = Some(KeyId(7));
        tickets.hold(&mut book, M, key, None).unwrap();
        let second = tickets.hold(&mut book, M, key, None).unwrap();
        assert_eq!(
            tickets.hold(&mut book, M, key, None),
            Err(HoldRefusal::Full),
            "per key"
        );
        // Without a key only the other limits apply.
        tickets.hold(&mut book, M, None, None).unwrap();
        assert_eq!(
            tickets.hold(&mut book, M, None, None),
            Err(HoldRefusal::Full),
            "per model"
        );
        // Another model has its own limit; a ticket cannot be held twice.
        let other = model(1, Capability::Llm);
        tickets.hold(&mut book, other, None, None).unwrap();
        assert_eq!(book.hold(second, other, None, None), Err(HoldRefusal::Full));
        assert_eq!(book.pending_demand(M), 3);
        assert_eq!(book.held_total(), 4);
    }

    #[test]
    fn limits_count_per_model_name_whatever_the_kind() {
        let mut book = HoldBook::new(HoldLimits {
            per_model: 2,
            per_key: 1,
        });
        let mut tickets = Counter(0);
        let (chat, embedding) = (model(0, Capability::Llm), model(0, Capability::Embedding));
        let key = Some(KeyId(7));
        tickets.hold(&mut book, chat, key, None).unwrap();
        // Per key and model: the key's embedding request is its second for the model.
        assert_eq!(
            tickets.hold(&mut book, embedding, key, None),
            Err(HoldRefusal::Full)
        );
        tickets.hold(&mut book, embedding, None, None).unwrap();
        // Per model: two held, one of each kind.
        assert_eq!(
            tickets.hold(&mut book, model(0, Capability::Reranker), None, None),
            Err(HoldRefusal::Full)
        );
        // Another name has its own limits; the demand stays per kind.
        tickets
            .hold(&mut book, model(1, Capability::Embedding), key, None)
            .unwrap();
        assert_eq!(book.pending_demand(chat), 1);
        assert_eq!(book.pending_demand(embedding), 1);
    }

    #[test]
    fn retries_with_one_client_id_count_once_per_key() {
        let mut book = HoldBook::new(HoldLimits::default());
        let mut tickets = Counter(0);
        let client = id("8b9e4a6d-dfb4-4b95-bada-319e7e5b878a");
        let first = tickets.hold(&mut book, M, Some(KeyId(1)), client).unwrap();
        let retry = tickets.hold(&mut book, M, Some(KeyId(1)), client).unwrap();
        assert_eq!(book.pending_demand(M), 1);
        // Another key with the same ID counts separately; no ID counts on its own.
        tickets.hold(&mut book, M, Some(KeyId(2)), client).unwrap();
        tickets.hold(&mut book, M, Some(KeyId(1)), None).unwrap();
        assert_eq!(book.pending_demand(M), 3);
        book.finish(first);
        assert_eq!(book.pending_demand(M), 3, "the retry still waits");
        book.finish(retry);
        assert_eq!(book.pending_demand(M), 2);
    }

    #[test]
    fn released_requests_leave_the_limits_but_stay_in_the_demand() {
        let mut book = HoldBook::new(HoldLimits {
            per_model: 1,
            per_key: 1,
        });
        let mut tickets = Counter(0);
        let first = tickets.hold(&mut book, M, Some(KeyId(1)), None).unwrap();
        assert_eq!(book.held_for(M), vec![first]);
        book.release(first);
        assert_eq!(book.held_total(), 0);
        assert_eq!(book.pending_demand(M), 1);
        // The model is asleep again: a new request may be held beside the released one.
        let second = tickets.hold(&mut book, M, Some(KeyId(1)), None).unwrap();
        assert_eq!(book.pending_demand(M), 2);
        book.finish(first);
        book.finish(second);
        assert_eq!(book.pending_demand(M), 0);
        assert_eq!(book.held_total(), 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Hold {
            model: u32,
            key: Option<u32>,
            client: Option<u8>,
        },
        Release(usize),
        Finish(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                // Two names, every kind of each.
                0u32..6,
                proptest::option::of(0u32..3),
                proptest::option::of(0u8..3)
            )
                .prop_map(|(model, key, client)| Op::Hold { model, key, client }),
            (0usize..64).prop_map(Op::Release),
            (0usize..64).prop_map(Op::Finish),
        ]
    }

    proptest! {
        /// Any interleaving keeps the demand equal to the distinct waiting requests and returns
        /// every count to zero when everyone has left.
        #[test]
        fn demand_counts_distinct_requests_and_returns_to_zero(ops in proptest::collection::vec(op(), 1..200)) {
            let mut book = HoldBook::new(HoldLimits { per_model: 5, per_key: 3 });
            let mut tickets = Counter(0);
            let mut live: Vec<(Ticket, ModelId, Option<KeyId>, Option<ClientId>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Hold { model, key, client } => {
                        let (model, key) = (ModelId(model), key.map(KeyId));
                        let client = client.map(|client| ClientId(u128::from(client).to_be_bytes()));
                        if let Ok(id) = tickets.hold(&mut book, model, key, client) {
                            live.push((id, model, key, client));
                        }
                    }
                    Op::Release(index) if !live.is_empty() => book.release(live[index % live.len()].0),
                    Op::Finish(index) if !live.is_empty() => {
                        let (id, ..) = live.swap_remove(index % live.len());
                        book.finish(id);
                    }
                    _ => {}
                }
                prop_assert!(book.held_total() <= 10);
                for counts in book.names.values() {
                    prop_assert!(counts.held <= 5);
                    prop_assert!(counts.held_per_key.values().all(|held| *held <= 3));
                }
                for model in 0..6 {
                    let oldest_first = book.held_for(ModelId(model));
                    prop_assert!(oldest_first.windows(2).all(|pair| pair[0].sequence < pair[1].sequence));
                }
                for model in 0..6 {
                    let model = ModelId(model);
                    let mut distinct = std::collections::HashSet::new();
                    let mut anonymous = 0;
                    for (_, entry_model, key, client) in &live {
                        if *entry_model != model {
                            continue;
                        }
                        match client {
                            Some(client) => { distinct.insert((*key, *client)); }
                            None => anonymous += 1,
                        }
                    }
                    prop_assert_eq!(book.pending_demand(model) as usize, distinct.len() + anonymous);
                }
            }
            for (id, ..) in live {
                book.finish(id);
            }
            prop_assert_eq!(book.held_total(), 0);
            prop_assert!(book.models.is_empty());
            prop_assert!(book.names.is_empty());
            prop_assert!(book.duplicates.is_empty());
            prop_assert!(book.entries.is_empty());
        }
    }
}
