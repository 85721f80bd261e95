//! The weir-state integration tests, as one test binary: each file beside this one is a module
//! (linked once, with the generic code they share compiled once), run by nextest one test per
//! process as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each file includes the support modules it uses, as it did when it was a binary of its own.
#![allow(clippy::duplicate_mod)]

#[path = "compression.rs"]
mod compression;
#[path = "conformance.rs"]
mod conformance;
#[path = "disk_conformance.rs"]
mod disk_conformance;
#[path = "disk_native.rs"]
mod disk_native;
#[path = "operator.rs"]
mod operator;
#[path = "store_conformance.rs"]
mod store_conformance;
#[path = "ttl.rs"]
mod ttl;
