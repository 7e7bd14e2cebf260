//! Transparent huge pages off for the whole process, unless the operator keeps them.
//!
//! Why: mimalloc, the router's and the agent's allocator, asks the kernel for transparent huge
//! pages on its arenas (`madvise(MADV_HUGEPAGE)`, honoured where THP is in `madvise` mode, the
//! common default). A thread heap's first touch of a region then makes 2 MiB resident where it
//! needs kilobytes, once for every shard's heap. Measured with `perf/stream-memory.sh`, two
//! shards (`perf/notes/2026-12-07-memory-per-open-stream-slope.md`, before and after alternating
//! in one run): the idle router held 36 MB with them and 16.2 without, and the first thousand
//! open streams cost router + agent 41–58 KB a stream with them against 30.6–31.2 without. A
//! stream beyond those costs the same either way (31 KB): what the huge pages add is held once
//! per heap region, not per stream.
//!
//! `MIMALLOC_ALLOW_THP=1` in the environment keeps them (mimalloc's own switch, which it reads
//! too). The flag is the kernel's per process (`PR_SET_THP_DISABLE`): it holds for memory mapped
//! before it was set as well, from the next page fault on.

use std::ffi::OsStr;

/// What [`keep_off`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum HugePages {
    /// Off for this process from now on.
    Off,
    /// Kept: `MIMALLOC_ALLOW_THP=1`.
    Kept,
}

/// [`keep_off`] with `MIMALLOC_ALLOW_THP` from the environment; a failure is logged (the process
/// runs on with the huge pages). Called by the router's and the agent's `main` once logging is up.
pub fn keep_off_at_start() {
    if let Err(error) = keep_off(std::env::var_os("MIMALLOC_ALLOW_THP").as_deref()) {
        tracing::warn!(%error, "could not turn transparent huge pages off: each shard's heap holds more memory");
    }
}

/// Turns transparent huge pages off for this process unless `allow` (the value of
/// `MIMALLOC_ALLOW_THP`) is `1`.
pub fn keep_off(allow: Option<&OsStr>) -> std::io::Result<HugePages> {
    if allow.is_some_and(|value| value == "1") {
        return Ok(HugePages::Kept);
    }
    // SAFETY: prctl(PR_SET_THP_DISABLE) takes integers only and changes one flag of this
    // process; it reads and writes no memory of ours.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(HugePages::Off)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disabled() -> i32 {
        // SAFETY: as in `keep_off`; PR_GET_THP_DISABLE returns the flag.
        unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) }
    }

    #[test]
    fn the_operator_keeps_them_with_mimallocs_switch() {
        assert_eq!(keep_off(Some(OsStr::new("1"))).unwrap(), HugePages::Kept);
    }

    #[test]
    fn otherwise_the_process_has_them_off() {
        assert_eq!(keep_off(Some(OsStr::new("0"))).unwrap(), HugePages::Off);
        assert_eq!(keep_off(None).unwrap(), HugePages::Off);
        assert_eq!(disabled(), 1);
    }
}
