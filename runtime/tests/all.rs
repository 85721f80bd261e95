//! The runtime's integration tests, as one test binary: each file beside this one is a module
//! (linked once, with the generic code they share compiled once), run by nextest one test per
//! process as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// Each file includes the support modules it uses, as it did when it was a binary of its own.
#![allow(clippy::duplicate_mod)]

#[path = "broadcast.rs"]
mod broadcast;
#[path = "cancellation.rs"]
mod cancellation;
#[path = "cli.rs"]
mod cli;
#[path = "cli_s3.rs"]
mod cli_s3;
#[path = "cluster.rs"]
mod cluster;
#[path = "file_source.rs"]
mod file_source;
#[path = "finished_tasks.rs"]
mod finished_tasks;
#[path = "gc.rs"]
mod gc;
#[path = "idleness.rs"]
mod idleness;
#[path = "incremental.rs"]
mod incremental;
#[path = "integrity.rs"]
mod integrity;
#[path = "integrity_channels.rs"]
mod integrity_channels;
#[path = "integrity_s3.rs"]
mod integrity_s3;
#[path = "joins.rs"]
mod joins;
#[path = "one_writer.rs"]
mod one_writer;
#[path = "pipeline.rs"]
mod pipeline;
#[path = "recovery_gaps.rs"]
mod recovery_gaps;
#[path = "rest.rs"]
mod rest;
#[path = "state_kinds.rs"]
mod state_kinds;
#[path = "storage_faults.rs"]
mod storage_faults;
#[path = "storage_schemes.rs"]
mod storage_schemes;
#[path = "timers.rs"]
mod timers;
#[path = "transport_layer.rs"]
mod transport_layer;
#[path = "union.rs"]
mod union;
#[path = "windows.rs"]
mod windows;
