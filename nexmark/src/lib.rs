//! The Nexmark benchmark on Weir: nexmark-flink's event generator as a replayable, splittable
//! source, queries q0–q5, q7, q8 and q11 as Weir jobs, and a plain single-threaded reference
//! of each written without the engine, to judge the jobs' results against.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use weir_nexmark::{GeneratorConfig, Query, queries};
//! let env = weir_runtime::StreamEnvironment::new();
//! env.set_parallelism(2);
//! let rows = queries::build(&env, Query::Q5, &GeneratorConfig::default())?.collect();
//! env.execute().await?;
//! println!("{} hot items", rows.records().len());
//! # Ok(()) }
//! ```

pub mod generator;
pub mod model;
pub mod queries;
pub mod reference;
pub mod rows;
pub mod sinks;

pub use generator::GeneratorConfig;
pub use model::{Auction, Bid, Event, Person};
pub use rows::{Query, Row, result_lines};
