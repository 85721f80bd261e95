//! A user's own keyed state store, checkpoint storage and transport, plugged into real Weir jobs
//! through the public API alone.
//!
//! - [`store`]: [`BTreeMapStore`], a `KeyedStore` over `BTreeMap`s frozen by copy-on-write, and
//!   [`BTreeMapStateBackend`], the `StateBackend` that makes one per keyed operator subtask
//!   (`env.set_state_backend`).
//! - [`storage`]: [`CountingStorage`], a `CheckpointStorage` over a local directory, reached by
//!   `counting:///abs/dir` URLs once [`register_counting_scheme`] ran.
//! - [`transport`]: [`CountingTransport`], a layer over the engine's transport
//!   (`env.set_transport`).
//! - [`job`]: the word count the binary `custom_seams_job` and the tests run on all three.
//!
//! Each counts what it does, so a test (or the binary's `summary:` line) shows that the engine
//! went through it on every path: processing, snapshots, restores after failures, restores in
//! a new process, and rescaling.

pub mod job;
pub mod storage;
pub mod store;
pub mod transport;

pub use job::{JobOptions, Seams, configure, running_counts, word};
pub use storage::{
    CountingStorage, SCHEME, StorageCounters, StorageCounts, counting_url,
    register_counting_scheme, register_scheme,
};
pub use store::{BTreeMapStateBackend, BTreeMapStore, StoreCounters, StoreCounts};
pub use transport::{CountingTransport, Opened, TransportCounters};
