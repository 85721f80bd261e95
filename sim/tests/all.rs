//! The weir-sim integration tests, as one test binary: each file beside this one is a module
//! (linked once, with the generic code they share compiled once), run by nextest one test per
//! process as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each file includes the support modules it uses, as it did when it was a binary of its own.
#![allow(clippy::duplicate_mod)]

#[path = "determinism.rs"]
mod determinism;
#[path = "mutations.rs"]
mod mutations;
#[path = "regressions.rs"]
mod regressions;
#[path = "seeds.rs"]
mod seeds;
