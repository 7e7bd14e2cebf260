//! Derived IDs from digests ([`assign_ids`]), and the same assignment kept up to date as
//! digests come and go ([`Assignment`]), so that one dynamic-key write does not derive every
//! key's ID again.
//!
//! Owns: the assignment rule, the two conditions under which one digest more or one less
//! leaves every other digest's ID as it was, and [`MAX_KEYS`], the bound on a registry's keys
//! that also bounds the IDs assigned.
//!
//! Must not: depend on the order digests arrived in. Every router of a site derives the IDs of
//! the keys it holds, and the shared limits in the store are keyed by them, so an assignment kept
//! write by write must equal [`assign_ids`] of the same set, whatever the writes' history. The
//! property test in this module checks exactly that, over digests whose windows collide often.

use std::collections::HashSet;

type Digest = [u8; 32];

/// Most keys one registry holds (static or dynamic). A bound, not a target: a 16 MiB replace body
/// holds about 65,000 entries of the shape `perf/memory.sh` sends (about 250 bytes each: 50,000
/// took 12.7 MB), so a registry this large is built by several writes.
pub const MAX_KEYS: usize = 1_000_000;

/// Window `w` (0..8) of a digest: its bytes `4w..4w+4`, big-endian.
fn window(digest: &Digest, w: usize) -> u32 {
    u32::from_be_bytes([
        digest[4 * w],
        digest[4 * w + 1],
        digest[4 * w + 2],
        digest[4 * w + 3],
    ])
}

/// Assigns one distinct non-zero ID per digest. Equal digests get distinct IDs too (callers
/// refuse duplicate inputs before this). Result `i` belongs to `digests[i]`.
///
/// In digest order, each digest takes the first of its eight windows that no earlier digest
/// took, else the first free value probing upwards from its first window. `0` is never taken.
pub(crate) fn assign_ids(digests: &[Digest]) -> Vec<u32> {
    assert!(
        digests.len() < MAX_KEYS * 2,
        "more ids than any registry may hold"
    );
    let mut order: Vec<usize> = (0..digests.len()).collect();
    order.sort_by(|a, b| digests[*a].cmp(&digests[*b]));
    let mut taken: HashSet<u32> = HashSet::with_capacity(digests.len() + 1);
    taken.insert(0);
    let mut ids = vec![0u32; digests.len()];
    for index in order {
        let digest = &digests[index];
        let mut chosen = (0..8)
            .map(|w| window(digest, w))
            .find(|candidate| !taken.contains(candidate));
        if chosen.is_none() {
            // All eight windows taken: probe upwards from the first. Ends because fewer than
            // 2^32 - 1 IDs exist (asserted above).
            let mut candidate = window(digest, 0);
            while taken.contains(&candidate) {
                candidate = candidate.wrapping_add(1);
            }
            chosen = Some(candidate);
        }
        let id = chosen.expect("an id was chosen");
        taken.insert(id);
        ids[index] = id;
    }
    ids
}

/// Whether `digest`, which holds `id`, met `other` taken before it settled on `id`: `other` is
/// one of its windows before `id`, or, when `id` came from the probe, any of its windows or a
/// value the probe passed.
fn passed_over(digest: &Digest, id: u32, other: u32) -> bool {
    for w in 0..8 {
        let candidate = window(digest, w);
        if candidate == id {
            return false;
        }
        if candidate == other {
            return true;
        }
    }
    // The probe from the first window went up to `id`, wrapping.
    other.wrapping_sub(window(digest, 0)) < id.wrapping_sub(window(digest, 0))
}

/// What [`assign_ids`] gives a set of digests, kept as digests are added and removed.
///
/// Two facts keep most changes local (with `n` keys, a 32-bit collision has a chance of about
/// `n / 2^32` per key):
/// - **adding** a digest whose first window nobody holds gives it that window and changes no
///   one else: no digest took or passed over a value that nobody holds;
/// - **removing** the digest holding `id` changes no one else when no *displaced* digest (one
///   that does not hold its first window) passed over `id` on its way to its own.
///
/// Otherwise the caller assigns the whole set again with [`assign_ids`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Assignment {
    /// Every ID held, and `0`, which is never given: one per digest of the set, so bounded by
    /// [`MAX_KEYS`].
    taken: HashSet<u32, foldhash::fast::RandomState>,
    /// The digests that do not hold their first window, with the ID they hold: few (none in
    /// most registries), at most one per digest.
    displaced: Vec<(Digest, u32)>,
}

impl Assignment {
    /// The bookkeeping for `ids`, which [`assign_ids`] gave `digests`.
    pub(crate) fn of(digests: &[Digest], ids: &[u32]) -> Assignment {
        debug_assert_eq!(digests.len(), ids.len());
        let mut taken = HashSet::with_capacity_and_hasher(ids.len() + 1, Default::default());
        taken.insert(0);
        taken.extend(ids.iter().copied());
        let displaced = digests
            .iter()
            .zip(ids)
            .filter(|(digest, id)| window(digest, 0) != **id)
            .map(|(digest, id)| (*digest, *id))
            .collect();
        Assignment { taken, displaced }
    }

    /// Adds `digest` and returns its ID when that changes no other digest's; `None` (and nothing
    /// changed) when the whole set must be assigned again.
    pub(crate) fn try_add(&mut self, digest: &Digest) -> Option<u32> {
        let first = window(digest, 0);
        self.taken.insert(first).then_some(first)
    }

    /// Removes `digest`, which holds `id`, when that changes no other digest's ID; `false` (and
    /// nothing changed) when the whole set must be assigned again.
    pub(crate) fn try_remove(&mut self, digest: &Digest, id: u32) -> bool {
        let passed = self
            .displaced
            .iter()
            .any(|(other, other_id)| *other_id != id && passed_over(other, *other_id, id));
        if passed {
            return false;
        }
        self.taken.remove(&id);
        self.displaced
            .retain(|(other, other_id)| !(*other_id == id && other == digest));
        true
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A digest whose eight windows are small numbers: among a few dozen digests, windows collide
    /// all the time, so displaced digests and probes are common. `tag` keeps digests distinct.
    fn digest(windows: [u8; 8], tag: u8) -> Digest {
        let mut digest = [0; 32];
        for (w, value) in windows.iter().enumerate() {
            digest[4 * w + 3] = *value;
        }
        digest[4 * 7 + 2] = tag;
        digest
    }

    #[derive(Debug, Clone)]
    enum Change {
        Add([u8; 8], u8),
        /// Removes the held digest at this position (modulo how many are held).
        Remove(usize),
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            3 => (proptest::array::uniform8(0u8..12), 0u8..4).prop_map(|(w, t)| Change::Add(w, t)),
            2 => any::<usize>().prop_map(Change::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Whatever the history, the kept assignment equals a fresh one of the same set; and the
        /// fresh one is what the caller falls back to when a change is not local.
        #[test]
        fn kept_assignment_equals_a_fresh_one(changes in proptest::collection::vec(change(), 1..80)) {
            let mut held: BTreeMap<Digest, u32> = BTreeMap::new();
            let mut kept = Assignment::default();
            kept.taken.insert(0);
            for change in changes {
                let local = match change {
                    Change::Add(windows, tag) => {
                        let digest = digest(windows, tag);
                        if held.contains_key(&digest) {
                            continue;
                        }
                        match kept.try_add(&digest) {
                            Some(id) => {
                                held.insert(digest, id);
                                true
                            }
                            None => {
                                held.insert(digest, 0);
                                false
                            }
                        }
                    }
                    Change::Remove(at) => {
                        if held.is_empty() {
                            continue;
                        }
                        let (digest, id) = held.iter().nth(at % held.len()).map(|(d, i)| (*d, *i)).unwrap();
                        let local = kept.try_remove(&digest, id);
                        held.remove(&digest);
                        local
                    }
                };
                let digests: Vec<Digest> = held.keys().copied().collect();
                let fresh = assign_ids(&digests);
                if local {
                    let kept_ids: Vec<u32> = held.values().copied().collect();
                    prop_assert_eq!(&kept_ids, &fresh, "a change taken as local moved another ID");
                    let again = Assignment::of(&digests, &fresh);
                    prop_assert_eq!(&kept.taken, &again.taken);
                    let mut displaced = kept.displaced.clone();
                    displaced.sort();
                    let mut expected = again.displaced.clone();
                    expected.sort();
                    prop_assert_eq!(displaced, expected);
                } else {
                    for (slot, id) in held.values_mut().zip(&fresh) {
                        *slot = *id;
                    }
                    kept = Assignment::of(&digests, &fresh);
                }
            }
        }
    }

    #[test]
    fn a_free_first_window_is_local_and_a_taken_one_is_not() {
        let mut kept = Assignment::of(&[], &[]);
        let a = digest([1, 2, 3, 4, 5, 6, 7, 8], 0);
        let b = digest([1, 9, 3, 4, 5, 6, 7, 8], 1);
        assert_eq!(kept.try_add(&a), Some(1));
        assert_eq!(kept.try_add(&b), None, "b's first window is a's");
        // A refused add changes nothing.
        assert_eq!(kept.taken.len(), 2);
    }

    #[test]
    fn removing_an_id_a_displaced_digest_passed_over_is_not_local() {
        let a = digest([1, 2, 3, 4, 5, 6, 7, 8], 0);
        let b = digest([1, 9, 3, 4, 5, 6, 7, 8], 1);
        let c = digest([7, 7, 7, 7, 7, 7, 7, 7], 2);
        let ids = assign_ids(&[a, b, c]);
        assert_eq!(ids, [1, 9, 7]);
        let mut kept = Assignment::of(&[a, b, c], &ids);
        assert!(!kept.try_remove(&a, 1), "b passed over 1 and would take it");
        assert!(kept.try_remove(&c, 7), "nobody passed over 7");
        assert!(kept.try_remove(&b, 9), "the displaced digest itself may go");
        assert!(kept.displaced.is_empty());
    }

    #[test]
    fn the_probe_passes_over_the_values_between_the_first_window_and_the_id() {
        let full = digest([5; 8], 0);
        // Held 8 after probing 5, 6, 7: it passed over 5, 6 and 7, not 4 or 9.
        assert!(passed_over(&full, 8, 5));
        assert!(passed_over(&full, 8, 7));
        assert!(!passed_over(&full, 8, 4));
        assert!(!passed_over(&full, 8, 9));
        // Wrapping: held 1 after probing from u32::MAX.
        let mut high = [0xff; 32];
        high[28..].copy_from_slice(&[0, 0, 0, 9]);
        assert!(passed_over(&high, 1, u32::MAX));
        assert!(passed_over(&high, 1, 0));
        assert!(!passed_over(&high, 1, 2));
    }
}
