//! Admission control (seed `admission-control.md`): the pure logic that decides, before a
//! request is forwarded, whether it may run now.

pub mod estimator;
