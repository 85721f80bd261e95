//! Deterministic simulation of Weir's checkpoint protocol: a whole job (job master,
//! coordinator, tasks with their barrier handlers, channels with credits, storage, timers, the
//! restart strategy) run by its production code on one thread, under a tokio runtime whose
//! clock is paused (it advances only when every task waits), with a seeded
//! [`weir_core::sim::Simulator`] deciding every fault and pause. One seed, one schedule, bit
//! for bit: [`run_seed`] replays it, and its [`Outcome`] says which invariants broke.
//!
//! - [`scenario`]: the job's settings and fault rates a seed draws.
//! - [`simulator`]: the seeded decisions, the virtual wall clock and the trace.
//! - [`savepoints`]: the `sim://` scheme a run's savepoints go to.
//! - [`external`]: the external system the job's sink commits to, outliving its processes.
//! - [`check`]: the invariants (exactly-once output, complete restore points, intact files).
#![warn(missing_docs)]

pub mod check;
pub mod external;
mod run;
pub mod savepoints;
pub mod scenario;
pub mod simulator;

pub use run::{LIVENESS_BOUND, Outcome, Report, run_seed, run_seeds};
pub use scenario::{Barriers, Scenario};
