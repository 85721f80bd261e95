//! Weir's state: keyed state by key group, operator state, and their snapshots.
//!
//! - [`keyed`]: the [`KeyedStateBackend`] seam, state descriptors and typed state handles.
//! - [`backend`]: the [`StateBackend`] a job chooses (a factory of keyed backends) and
//!   [`KeyedBackend`], what a keyed operator runs on.
//! - [`store`]: the [`store::KeyedStore`] seam, keyed state as bytes (Flink's RocksDB shape), and
//!   the typed backend over any store.
//! - [`disk`]: the on-disk backend: keyed state larger than memory in sorted runs on local
//!   disk, a [`store::KeyedStore`].
//! - [`heap`]: the heap backend: per-key-group tables with copy-on-write snapshots.
//! - `conformance` (feature `conformance`): the keyed-backend contract as a suite every
//!   [`KeyedStateBackend`] must pass (Flink's `StateBackendTestBase`), one test per check
//!   through `keyed_backend_conformance!`.
//! - [`operator`]: operator (non-keyed) list state, which sources use for their offsets, and
//!   [`operator::redistribute`], which splits it for a new parallelism.
//! - [`format`](mod@format): the keyed snapshot format: versioned header, one checksummed section per key
//!   group, optionally compressed per key group ([`Compression`]), and the offsets that let a
//!   restore read only the groups it owns (`docs/keyed-snapshot-format.md`).
//!
//! Architecture invariant: this crate never knows where snapshots go. It writes into a
//! `std::io::Write` it is handed and restores from bytes it is handed; it knows nothing of
//! checkpoint storage, the network, or tokio.
#![warn(missing_docs)]

pub mod backend;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod cow_group;
pub mod disk;
pub mod error;
pub mod format;
pub mod heap;
pub mod keyed;
pub mod operator;
mod restored;
pub mod store;
mod zstd_codec;

pub use backend::{
    BUILT_IN_BACKENDS as BUILT_IN_STATE_BACKENDS, DiskStateBackend, HeapStateBackend, KeyedBackend,
    KeyedBackendKind, KeyedBackendParameters, MemoryStoreStateBackend, StateBackend, ValueAccess,
    built_in as built_in_state_backend, default_disk_dir,
};
pub use disk::DiskOptions;
pub use error::StateError;
pub use format::{Compression, ParseCompressionError};
pub use heap::HeapKeyedStateBackend;
pub use keyed::{
    AggregateFunction, AggregatingState, AggregatingStateDescriptor, KeyedAccess, KeyedSnapshot,
    KeyedSnapshotLayout, KeyedStateBackend, ListState, ListStateDescriptor, MapKey, MapState,
    MapStateDescriptor, NativeFile, NativeFiles, NativeRestorePart, ReducingState,
    ReducingStateDescriptor, RestoreFilePart, RestorePart, SnapshotScope, StateKey, StateKind,
    StateOptions, StateTtlConfig, StateValue, TtlUpdateType, TtlValue, TtlVisibility, ValueState,
    ValueStateDescriptor,
};
pub use operator::{ListState as OperatorListState, OperatorSnapshot, OperatorStateBackend};
