//! Pure logic: decisions as plain data structures that take `now` as an argument. Nothing here
//! does I/O, reads a clock or starts a task.

pub mod admission;
pub mod auth;
pub mod credits;
pub mod hold;
pub mod limits;
pub mod policy;
pub mod routing;
pub mod sibling;
pub mod snapshot;
pub mod usage;
