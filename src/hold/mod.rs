//! Hold at zero (seed `hold-at-zero.md`): requests for a model asleep on this site wait for its
//! wake instead of failing.
//!
//! - [`book`]: which requests are held, the hold limits and the pending demand (pure logic; not
//!   wired into the request path yet — it needs the sibling map of cross-site redirect).

pub mod book;
