//! The weir-checkpoint integration tests, as one test binary: each file beside this one is a module
//! (linked once, with the generic code they share compiled once), run by nextest one test per
//! process as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each file includes the support modules it uses, as it did when it was a binary of its own.
#![allow(clippy::duplicate_mod)]

#[path = "fault_injection.rs"]
mod fault_injection;
#[path = "storage_conformance.rs"]
mod storage_conformance;
#[path = "storage_s3.rs"]
mod storage_s3;
