//! Byte buffers of this thread lent to whoever has something to write now and given back before
//! it waits: a client connection's output (`front::writer`), a stream's relay of one upstream
//! chunk (`api::forward`). An idle keep-alive connection, or a stream between two tokens, holds
//! no 4 KiB buffer of its own, and taking one from this list costs about 30 instructions where
//! the allocator takes about 300 (a 4 KiB block is past its small-object fast path).
//!
//! Per thread (a shard's, on a thread-per-core runtime) and bounded: at most [`SPARE_MAX`]
//! buffers, none grown past [`KEPT_BYTES_MAX`] (a buffer a long response grew is freed).

use std::cell::RefCell;

/// The room of a lent buffer (a response longer than this is written in parts, or grows it).
pub const BYTES: usize = 4 * 1024;
/// Buffers kept per thread.
pub const SPARE_MAX: usize = 256;
/// A buffer grown past this is freed, not kept.
pub const KEPT_BYTES_MAX: usize = 4 * BYTES;

thread_local! {
    static SPARE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for at least [`BYTES`].
pub fn take() -> Vec<u8> {
    SPARE
        .with_borrow_mut(Vec::pop)
        .unwrap_or_else(|| Vec::with_capacity(BYTES))
}

/// Keeps `buffer` for [`take`] unless the list is full or `buffer` grew past [`KEPT_BYTES_MAX`].
pub fn give_back(mut buffer: Vec<u8>) {
    if buffer.capacity() < BYTES || buffer.capacity() > KEPT_BYTES_MAX {
        return;
    }
    buffer.clear();
    SPARE.with_borrow_mut(|spare| {
        if spare.len() < SPARE_MAX {
            spare.push(buffer);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_lent_again_within_bounds() {
        let lent = take();
        assert!(lent.capacity() >= BYTES);
        let address = lent.as_ptr();
        give_back(lent);
        let again = take();
        assert_eq!(again.as_ptr(), address, "the spare buffer is lent again");
        assert!(again.is_empty());

        // A buffer a long response grew is not kept, nor an empty one.
        give_back(Vec::with_capacity(KEPT_BYTES_MAX + 1));
        give_back(Vec::new());
        assert_eq!(SPARE.with_borrow(Vec::len), 0);

        // At most SPARE_MAX are kept.
        for _ in 0..SPARE_MAX + 10 {
            give_back(Vec::with_capacity(BYTES));
        }
        assert_eq!(SPARE.with_borrow(Vec::len), SPARE_MAX);
        drop(again);
    }
}
