//! Weir's fuzzing: every decoder of its files and wire formats, fed mutated valid encodings by a
//! seeded loop that runs on the stable toolchain.
//!
//! - [`targets`]: one target per decoder: `_metadata`, keyed snapshots, channel state, operator
//!   state, the codec envelope, TCP frames, the cluster protocol. Each builds its seeds with the
//!   crates' own encoders and runs the production decoder.
//! - [`mutate`]: byte mutations (flips, sets, truncation, extension, splices, huge lengths,
//!   duplicated ranges) and re-sealing envelopes after a payload mutation.
//! - [`harness`]: the loop: generate an input from its seed, run it under `catch_unwind`, judge
//!   it against the bounds ([`harness::Bounds`]: 64 MiB for one allocation and for the peak,
//!   1 s per input in release, a watchdog for hangs).
//! - [`alloc`]: the counting global allocator behind the allocation bound.
//! - [`report`]: the summary table.
//!
//! Every failure names its input's seed; `weir-fuzz --target T --replay SEED` generates the same
//! input again and runs it.

pub mod alloc;
pub mod harness;
pub mod mutate;
pub mod report;
pub mod rng;
pub mod targets;
pub mod watchdog;
