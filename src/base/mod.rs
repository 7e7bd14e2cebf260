//! Leaves: small types and helpers every other layer may use. Nothing here imports another
//! module of this crate outside `base`.

pub mod challenge;
pub mod clock;
pub mod credentials;
pub mod doc_guard;
pub mod duration;
pub mod fatal;
pub mod huge_pages;
pub mod identity;
pub mod ids;
pub mod latch;
pub mod log_limit;
pub mod spare_buffers;
