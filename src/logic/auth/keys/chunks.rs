//! A vector in copy-on-write chunks: a clone shares every chunk, and a change copies only the
//! chunk it touches (and the list of chunk pointers). The key registry keeps its records in one,
//! so a dynamic-key write to a registry of 50,000 keys copies 64 records, not 50,000, while the
//! shards go on reading the snapshot before it.
//!
//! Reading an element is one more dependent load than a plain vector: the chunk's pointer.
//! Holds what its owner puts in it (the key registry: at most `MAX_KEYS` records).

use std::sync::Arc;

/// Elements per chunk. Not 64: a chunk is one allocation of the `Arc`'s two counts (16 bytes)
/// and its elements, and 16 + 64 key records (192 bytes each) is 12,304 bytes, just past the
/// allocator's 12 KiB size class: mimalloc gave each such chunk a 14 KiB block, 32 bytes a key
/// (a loaded static key measured 212 B in `perf/memory.sh` instead of 184). With 63 the chunk
/// fits 12 KiB with 176 bytes to spare. Positions divide by a constant: a multiply and a shift.
pub(crate) const CHUNK: usize = 63;

#[derive(Debug, Clone)]
pub(crate) struct Chunks<T> {
    /// Every chunk but the last holds [`CHUNK`] elements; the last holds 1 to [`CHUNK`].
    chunks: Vec<Arc<[T]>>,
    len: usize,
}

impl<T> Default for Chunks<T> {
    fn default() -> Self {
        Chunks {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Clone> Chunks<T> {
    pub(crate) fn from_vec(elements: Vec<T>) -> Chunks<T> {
        let len = elements.len();
        let mut chunks = Vec::with_capacity(len.div_ceil(CHUNK));
        let mut rest = elements.into_iter();
        while rest.len() > 0 {
            chunks.push(rest.by_ref().take(CHUNK).collect());
        }
        Chunks { chunks, len }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The element at `at`; panics past the end, like a slice (the last chunk holds exactly the
    /// elements past the full ones, so indexing it checks the end).
    #[inline(always)]
    pub(crate) fn get(&self, at: usize) -> &T {
        &self.chunks[at / CHUNK][at % CHUNK]
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|chunk| chunk.iter())
    }

    /// Replaces the element at `at`, copying its chunk if a clone shares it; returns the one
    /// replaced.
    pub(crate) fn set(&mut self, at: usize, element: T) -> T {
        assert!(at < self.len, "position {at} past the end ({})", self.len);
        let chunk = &mut self.chunks[at / CHUNK];
        if Arc::get_mut(chunk).is_none() {
            *chunk = chunk.iter().cloned().collect();
        }
        let slot = &mut Arc::get_mut(chunk).expect("the chunk was just copied")[at % CHUNK];
        std::mem::replace(slot, element)
    }

    pub(crate) fn push(&mut self, element: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => {
                *last = last.iter().cloned().chain([element]).collect();
            }
            _ => self.chunks.push(Arc::new([element])),
        }
        self.len += 1;
    }

    /// Removes the element at `at` and puts the last one in its place, as
    /// [`Vec::swap_remove`]; returns the removed element.
    pub(crate) fn swap_remove(&mut self, at: usize) -> T {
        assert!(at < self.len, "position {at} past the end ({})", self.len);
        let last = self.pop();
        if at < self.len {
            self.set(at, last)
        } else {
            last
        }
    }

    fn pop(&mut self) -> T {
        let last_chunk = self.chunks.pop().expect("not empty");
        let mut elements: Vec<T> = last_chunk.iter().cloned().collect();
        let last = elements.pop().expect("chunks are never empty");
        if !elements.is_empty() {
            self.chunks.push(elements.into());
        }
        self.len -= 1;
        last
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Change {
        Push(u32),
        Set(usize, u32),
        SwapRemove(usize),
        /// Keep a clone, which must not see later changes.
        Snapshot,
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            4 => any::<u32>().prop_map(Change::Push),
            2 => (any::<usize>(), any::<u32>()).prop_map(|(at, v)| Change::Set(at, v)),
            2 => any::<usize>().prop_map(Change::SwapRemove),
            1 => Just(Change::Snapshot),
        ]
    }

    proptest! {
        /// The chunks behave as a `Vec` under every change, and a clone taken before a change
        /// still reads as the `Vec` did then.
        #[test]
        fn chunks_behave_as_a_vec_and_clones_do_not_see_later_changes(
            start in proptest::collection::vec(any::<u32>(), 0..200),
            changes in proptest::collection::vec(change(), 0..300),
        ) {
            let mut chunks = Chunks::from_vec(start.clone());
            let mut model = start;
            let mut snapshots: Vec<(Chunks<u32>, Vec<u32>)> = Vec::new();
            for change in changes {
                match change {
                    Change::Push(v) => {
                        chunks.push(v);
                        model.push(v);
                    }
                    Change::Set(at, v) if !model.is_empty() => {
                        let at = at % model.len();
                        chunks.set(at, v);
                        model[at] = v;
                    }
                    Change::SwapRemove(at) if !model.is_empty() => {
                        let at = at % model.len();
                        prop_assert_eq!(chunks.swap_remove(at), model.swap_remove(at));
                    }
                    Change::Snapshot => snapshots.push((chunks.clone(), model.clone())),
                    _ => {}
                }
                prop_assert_eq!(chunks.len(), model.len());
                prop_assert_eq!(chunks.iter().copied().collect::<Vec<_>>(), model.clone());
            }
            for (snapshot, then) in snapshots {
                prop_assert_eq!(snapshot.iter().copied().collect::<Vec<_>>(), then.clone());
                for (at, value) in then.iter().enumerate() {
                    prop_assert_eq!(snapshot.get(at), value);
                }
            }
        }
    }

    #[test]
    #[should_panic]
    fn reading_past_the_end_panics_inside_the_last_chunk() {
        let chunks = Chunks::from_vec(vec![1, 2, 3]);
        chunks.get(3);
    }

    #[test]
    fn a_change_copies_only_its_chunk() {
        let chunks = Chunks::from_vec((0..CHUNK as u32 * 3).collect());
        let mut changed = chunks.clone();
        changed.set(CHUNK + 1, 7);
        assert!(Arc::ptr_eq(&chunks.chunks[0], &changed.chunks[0]));
        assert!(!Arc::ptr_eq(&chunks.chunks[1], &changed.chunks[1]));
        assert!(Arc::ptr_eq(&chunks.chunks[2], &changed.chunks[2]));
        assert_eq!(*chunks.get(CHUNK + 1), CHUNK as u32 + 1);
    }
}
