//! The dynamic registry's snapshot, kept up to date write by write.
//!
//! A write to one key changes that key's record in place of building the whole registry again:
//! the records are in copy-on-write chunks ([`super::chunks`]), so the new snapshot shares every
//! chunk but one with the snapshot the shards are reading, and its lookup tables are copied, not
//! rebuilt. At 50,000 keys a build took about 80 ms of the control core per admin write.
//!
//! Owns: the snapshot and what keeping it costs: which key and tenant IDs are taken
//! ([`Assignment`]), and each owner's tenant and key count.
//!
//! Invariant: the snapshot equals [`KeyRegistry::build`] of the same keys, IDs included, however
//! the writes came; a write that would move another key's or tenant's ID (a 32-bit collision,
//! rare) builds the registry again. Checked by the property test in `dynamic/tests.rs`.

use std::sync::Arc;

use hashbrown::HashMap;

use super::assign::Assignment;
use super::{
    KeyHash, KeyId, KeyInput, KeyRecord, KeyRegistry, KeySource, RegistryMode, TenantId,
    dynamic_key_digest, tenant_digest,
};

/// The snapshot of the dynamic keys, and the bookkeeping that keeps it without rebuilding.
#[derive(Debug, Clone)]
pub(crate) struct LiveRegistry {
    current: Arc<KeyRegistry>,
    key_ids: Assignment,
    tenant_ids: Assignment,
    /// Each owner's tenant, and how many keys it has (an owner with none has no tenant ID): at
    /// most one entry per key.
    owners: HashMap<Arc<str>, Owner, foldhash::fast::RandomState>,
}

#[derive(Debug, Clone, Copy)]
struct Owner {
    tenant_id: TenantId,
    keys: u32,
}

impl Default for LiveRegistry {
    fn default() -> Self {
        LiveRegistry::build(Vec::new())
    }
}

/// Two registries are equal when their snapshots are the same build or change: what the tests
/// of refused writes compare.
impl PartialEq for LiveRegistry {
    fn eq(&self, other: &Self) -> bool {
        self.current.version() == other.current.version()
    }
}

impl LiveRegistry {
    /// A registry of dynamic keys (every input's source is `KeySource::Dynamic`).
    pub(crate) fn build(inputs: Vec<KeyInput>) -> LiveRegistry {
        debug_assert!(
            inputs
                .iter()
                .all(|input| matches!(input.source, KeySource::Dynamic { .. }))
        );
        let built = KeyRegistry::build_parts(RegistryMode::Dynamic, inputs);
        let mut owners: HashMap<Arc<str>, Owner, _> = HashMap::default();
        for record in built.registry.iter() {
            owners
                .entry(record.owner.clone())
                .or_insert(Owner {
                    tenant_id: record.tenant_id,
                    keys: 0,
                })
                .keys += 1;
        }
        LiveRegistry {
            current: Arc::new(built.registry),
            key_ids: Assignment::of(&built.key_digests, &built.key_ids),
            tenant_ids: Assignment::of(&built.owner_digests, &built.tenant_ids),
            owners,
        }
    }

    /// The snapshot for the shards.
    pub(crate) fn snapshot(&self) -> Arc<KeyRegistry> {
        self.current.clone()
    }

    /// The record of the key with this registry id.
    pub(crate) fn record(&self, registry_id: &str) -> Option<&KeyRecord> {
        let at = self.current.position_of(registry_id)?;
        Some(self.current.records.get(at))
    }

    /// The registry id of the key with this hash.
    pub(crate) fn registry_id_of_hash(&self, hash: &KeyHash) -> Option<&str> {
        self.current.registry_id_of_hash(hash)
    }

    /// Adds the key, or replaces the one with the same registry id.
    pub(crate) fn put(&mut self, input: KeyInput) {
        let KeySource::Dynamic { id } = &input.source else {
            panic!("a live registry holds dynamic keys only");
        };
        let existing = self.current.position_of(id);
        let key_id = match existing {
            Some(at) => Some(self.current.records.get(at).key_id),
            None => self.key_ids.try_add(&dynamic_key_digest(id)).map(KeyId),
        };
        let previous_owner = existing.map(|at| self.current.records.get(at).owner.clone());
        let owner = match &previous_owner {
            Some(previous) if **previous == *input.owner => Some(previous.clone()),
            _ => self.add_owner(&input.owner),
        };
        let left = match &previous_owner {
            Some(previous) if **previous != *input.owner => self.remove_owner(previous),
            _ => true,
        };
        let (Some(key_id), Some(owner), true) = (key_id, owner, left) else {
            // An ID would move: assign them all again.
            return self.rebuild(Some(input), None);
        };
        let tenant_id = self.owners[&owner].tenant_id;
        let record = input.into_record(key_id, tenant_id, owner);
        let registry = Arc::make_mut(&mut self.current);
        match existing {
            Some(at) => registry.replace(at, record),
            None => registry.push(record),
        }
    }

    /// Removes the key with this registry id, if there is one.
    pub(crate) fn remove(&mut self, registry_id: &str) {
        let Some(at) = self.current.position_of(registry_id) else {
            return;
        };
        let record = self.current.records.get(at);
        let owner = record.owner.clone();
        let local = self
            .key_ids
            .try_remove(&dynamic_key_digest(registry_id), record.key_id.0)
            && self.remove_owner(&owner);
        if !local {
            return self.rebuild(None, Some(registry_id));
        }
        Arc::make_mut(&mut self.current).remove(at);
    }

    /// One key more for `owner`; its tenant's name shared with its other keys. `None`: a new
    /// owner whose tenant ID would move another's.
    fn add_owner(&mut self, owner: &str) -> Option<Arc<str>> {
        if let Some((name, counts)) = self.owners.get_key_value_mut(owner) {
            counts.keys += 1;
            return Some(name.clone());
        }
        let tenant_id = TenantId(self.tenant_ids.try_add(&tenant_digest(owner))?);
        let name: Arc<str> = owner.into();
        self.owners
            .insert(name.clone(), Owner { tenant_id, keys: 1 });
        Some(name)
    }

    /// One key fewer for `owner`. `false`: its last key went and its tenant ID going would move
    /// another's.
    fn remove_owner(&mut self, owner: &str) -> bool {
        let counts = self
            .owners
            .get_mut(owner)
            .expect("a key's owner is counted");
        if counts.keys > 1 {
            counts.keys -= 1;
            return true;
        }
        let tenant_id = counts.tenant_id;
        if !self
            .tenant_ids
            .try_remove(&tenant_digest(owner), tenant_id.0)
        {
            return false;
        }
        self.owners.remove(owner);
        true
    }

    /// Builds the registry again from its records, with `put` added or in place of its
    /// namesake, and without `removed`.
    fn rebuild(&mut self, put: Option<KeyInput>, removed: Option<&str>) {
        let replaced = put.as_ref().and_then(|input| input.registry_id());
        let mut inputs: Vec<KeyInput> = self
            .current
            .iter()
            .filter(|record| {
                let id = record.registry_id();
                id != removed && id != replaced
            })
            .map(KeyRecord::to_input)
            .collect();
        inputs.extend(put);
        *self = LiveRegistry::build(inputs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logic::auth::config::KeySettings;

    fn input(id: &str, owner: &str, raw_key: &str) -> KeyInput {
        KeyInput {
            source: KeySource::Dynamic { id: id.to_owned() },
            hash: KeyHash::of_raw_key(raw_key.as_bytes()),
            preview: "sk-...".to_owned(),
            name: format!("key {id}"),
            owner: owner.to_owned(),
            expires_at_unix_ms: None,
            enabled: true,
            settings: KeySettings::unrestricted(),
        }
    }

    fn live() -> LiveRegistry {
        LiveRegistry::build(
            (0..200)
                .map(|i| input(&format!("k{i}"), &format!("o{}", i % 7), &format!("raw{i}")))
                .collect(),
        )
    }

    /// The fallback a write takes when an ID would move gives the snapshot the local change
    /// gives: every kind of write, both ways.
    #[test]
    fn a_rebuild_gives_what_a_local_write_gives() {
        let writes: Vec<(Option<KeyInput>, Option<&str>)> = vec![
            // A new key of a known owner, and of a new owner.
            (Some(input("new", "o1", "raw-new")), None),
            (Some(input("new", "o-new", "raw-new")), None),
            // A key's hash, and its owner, changed.
            (Some(input("k3", "o3", "raw-rotated")), None),
            (Some(input("k3", "o-new", "raw3")), None),
            // The last key of an owner moves to another.
            (Some(input("k0", "o1", "raw0")), None),
            // Removed: the first, a middle and the last record.
            (None, Some("k0")),
            (None, Some("k100")),
            (None, Some("k199")),
        ];
        for (put, removed) in writes {
            let mut local = live();
            let mut rebuilt = local.clone();
            match (&put, removed) {
                (Some(put), _) => local.put(put.clone()),
                (None, Some(id)) => local.remove(id),
                (None, None) => unreachable!(),
            }
            rebuilt.rebuild(put, removed);
            rebuilt.current.assert_same_keys(&local.current);
            local.current.assert_same_keys(&rebuilt.current);
            assert_eq!(local.owners.len(), rebuilt.owners.len());
        }
    }

    #[test]
    fn a_write_leaves_the_snapshot_before_it_as_it_was() {
        let mut live = live();
        let before = live.snapshot();
        live.put(input("k5", "o5", "raw-rotated"));
        let after = live.snapshot();
        assert!(!Arc::ptr_eq(&before, &after));
        assert!(after.version() > before.version());
        // The snapshot the shards held is unchanged.
        assert!(matches!(
            before.authenticate(Some(b"raw5"), 0),
            crate::logic::auth::keys::AuthOutcome::Authenticated { .. }
        ));
        assert!(matches!(
            after.authenticate(Some(b"raw5"), 0),
            crate::logic::auth::keys::AuthOutcome::Unknown
        ));
    }
}
