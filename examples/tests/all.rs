//! The weir-examples integration tests, as one test binary: each file beside this one is a module
//! (linked once, with the generic code they share compiled once), run by nextest one test per
//! process as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each file includes the support modules it uses, as it did when it was a binary of its own.
#![allow(clippy::duplicate_mod)]

#[path = "bad_input.rs"]
mod bad_input;
#[path = "canonical_restore.rs"]
mod canonical_restore;
#[path = "claim_mode.rs"]
mod claim_mode;
#[path = "cluster.rs"]
mod cluster;
#[path = "cluster_netns.rs"]
mod cluster_netns;
#[path = "exactly_once.rs"]
mod exactly_once;
#[path = "larger_than_memory.rs"]
mod larger_than_memory;
#[path = "lifecycle.rs"]
mod lifecycle;
#[path = "local_recovery.rs"]
mod local_recovery;
#[path = "modes.rs"]
mod modes;
#[path = "process_kill.rs"]
mod process_kill;
#[path = "rescale.rs"]
mod rescale;
#[path = "standing_cluster.rs"]
mod standing_cluster;
#[path = "terminal.rs"]
mod terminal;
#[path = "unaligned.rs"]
mod unaligned;
#[path = "union_state.rs"]
mod union_state;
#[path = "web_ui.rs"]
mod web_ui;
#[path = "word_count_s3.rs"]
mod word_count_s3;
