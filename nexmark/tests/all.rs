//! The nexmark crate's integration tests, one binary (each file a module).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "queries.rs"]
mod queries;
