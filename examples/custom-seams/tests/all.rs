//! The weir-example-custom-seams integration tests, as one test binary: each file beside this one is a module
//! (linked once, with the generic code they share compiled once), run by nextest one test per
//! process as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each file includes the support modules it uses, as it did when it was a binary of its own.
#![allow(clippy::duplicate_mod)]

#[path = "conformance.rs"]
mod conformance;
#[path = "in_process.rs"]
mod in_process;
#[path = "process_kill.rs"]
mod process_kill;
