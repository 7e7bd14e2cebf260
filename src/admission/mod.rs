//! Admission control (seed `admission-control.md`): the gates an LLM request passes before it
//! may wait for an agent slot.
//!
//! - [`occupancy`]: B2 pool occupancy and the B4 per-key occupancy share, on the model's owner.

pub mod occupancy;
