//! Usage entries of the sync round (`sync::entry`): what other routers of the site, possibly of
//! another version or a corrupted store, put on the shared stream.
//!
//! Asserts:
//! - `Entry::decode` never panics and allocates no more than the bytes can describe;
//! - round trip: whatever decodes encodes to bytes that decode to the same entry.
#![no_main]

use hivenet_router::router::sync::entry::Entry;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entry) = Entry::decode(data) {
        let again = Entry::decode(&entry.encode()).expect("an encoded entry decodes");
        assert_eq!(again, entry);
    }
});
