//! The sibling map and cross-site redirect: a site's routers redirect a request for a model that
//! is not served here to a sibling site that serves it, and hold at zero (seed `hold-at-zero.md`)
//! reads the same map to know which models may be held here.
//!
//! Pure logic: this module parses, validates and decides. It does no I/O, reads no clock (callers
//! pass `now`) and starts no thread; the admin endpoint, the request phases and the metrics wire
//! it in.
//!
//! - [`map`]: the sibling map pushed with `PUT /admin/sibling-map` — the sites, where each model
//!   is placed, the warm hints — and the redirect decision (which site a request goes to, or none).
//! - [`token`]: the signed token a `307` carries in its `Location`, because clients drop
//!   `Authorization` on a cross-origin redirect; and the record of spent tokens that makes each
//!   one single-use.

pub mod map;
pub mod token;
