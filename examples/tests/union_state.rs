//! Union operator state in a job: a partitioned source keeps its partitions' offsets in union list state (Flink's Kafka source pattern); rescaled 2 → 4 → 1 through savepoints, every subtask is handed every offset, takes its own partitions', and the totals are exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use weir_core::handle::OperatorStateMode;
use weir_runtime::operator::SubtaskInfo;
use weir_runtime::source::{SourceFunction, SourceStatus};
use weir_runtime::state::{OperatorListState, OperatorStateBackend};
use weir_runtime::{JobStatus, LatestHandle, StreamEnvironment, TaskError};

/// The source's partitions, spread over its subtasks: partition `p` belongs to subtask
/// `p % parallelism`.
const PARTITIONS: u64 = 12;
/// Records per partition: partition `p` holds `p, p + PARTITIONS, p + 2 PARTITIONS, ...`.
const PER_PARTITION: u64 = 60_000;
/// Keys of the sum downstream.
const KEYS: u64 = 97;
/// Each stopped run stops once its sources emitted this many records (over all runs).
const STOP_EVERY: u64 = 150_000;

/// A source reading `PARTITIONS` partitions, each subtask its own, with the offsets of its
/// partitions in union list state.
struct PartitionedSource {
    /// `(partition, next offset)` of the partitions this subtask reads.
    owned: Vec<(u64, u64)>,
    turn: usize,
    offsets: Option<OperatorListState<(u64, u64)>>,
}

impl SourceFunction<u64> for PartitionedSource {
    fn open(
        &mut self,
        info: &SubtaskInfo,
        state: &mut OperatorStateBackend,
    ) -> Result<(), TaskError> {
        let offsets =
            state.list_state::<(u64, u64)>("partition-offsets", OperatorStateMode::Union)?;
        let all = state.get(&offsets)?;
        let fail = |message: String| TaskError::Operator {
            operator: "PartitionedSource".into(),
            message,
        };
        // Union: a restored subtask sees every partition's offset, whatever the old parallelism.
        let mut by_partition = BTreeMap::new();
        for (p, next) in &all {
            if by_partition.insert(*p, *next).is_some() {
                return Err(fail(format!("partition {p} appears twice in {all:?}")));
            }
        }
        if info.restored && by_partition.len() as u64 != PARTITIONS {
            return Err(fail(format!(
                "a restored subtask sees {} of {PARTITIONS} partitions: {all:?}",
                by_partition.len()
            )));
        }
        let parallelism = u64::from(info.parallelism);
        self.owned = (0..PARTITIONS)
            .filter(|p| p % parallelism == u64::from(info.index))
            .map(|p| (p, by_partition.get(&p).copied().unwrap_or(0)))
            .collect();
        self.offsets = Some(offsets);
        Ok(())
    }

    fn next_batch(&mut self, out: &mut Vec<u64>, max: usize) -> Result<SourceStatus, TaskError> {
        let live: Vec<usize> = (0..self.owned.len())
            .filter(|&i| self.owned[i].1 < PER_PARTITION)
            .collect();
        if live.is_empty() {
            return Ok(SourceStatus::End);
        }
        // Round robin over the live partitions, a few records each.
        let i = live[self.turn % live.len()];
        self.turn += 1;
        let (p, next) = &mut self.owned[i];
        while out.len() < max.min(64) && *next < PER_PARTITION {
            out.push(*p + *next * PARTITIONS);
            *next += 1;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot_state(&mut self, state: &mut OperatorStateBackend) -> Result<(), TaskError> {
        if let Some(offsets) = &self.offsets {
            state.update(offsets, &self.owned)?;
        }
        Ok(())
    }
}

/// The totals per key, computed without the engine.
fn expected() -> BTreeMap<u64, i64> {
    let mut out = BTreeMap::new();
    for v in 0..PARTITIONS * PER_PARTITION {
        *out.entry(v % KEYS).or_insert(0) += 1;
    }
    out
}

fn job(parallelism: u32, from: Option<&Path>) -> (StreamEnvironment, LatestHandle<u64, i64>) {
    let env = StreamEnvironment::new();
    env.set_job_name("union-state")
        .set_parallelism(parallelism)
        .set_max_parallelism(128)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_storage(weir_runtime::StorageConfig::Memory);
    if let Some(from) = from {
        env.restore_from(from);
    }
    let totals = env
        .add_source("Partitions", |_| {
            Box::new(PartitionedSource {
                owned: Vec::new(),
                turn: 0,
                offsets: None,
            })
        })
        .uid("partitions")
        .map(|v: u64| (v % KEYS, 1i64))
        .uid("pairs")
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .uid("sum")
        .latest_per_key();
    (env, totals)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_offsets_survive_a_2_4_1_round_trip_with_exact_totals() {
    let tmp = tempfile::tempdir().unwrap();
    let (env, _) = job(2, None);
    let (first, savepoint) = support::run_and_stop(env, STOP_EVERY, tmp.path(), "2").await;
    let (env, _) = job(4, Some(&savepoint));
    let (second, savepoint) = support::run_and_stop(env, STOP_EVERY, tmp.path(), "4").await;
    assert!(second.restored_from.is_some());
    let (env, totals) = job(1, Some(&savepoint));
    let last = env.execute().bounded().await.unwrap();
    assert_eq!(last.status, JobStatus::Finished);
    assert!(last.restored_from.is_some());
    let emitted = first.source_records + second.source_records + last.source_records;
    assert_eq!(
        emitted,
        PARTITIONS * PER_PARTITION,
        "every record is read exactly once over the three runs ({} + {} + {})",
        first.source_records,
        second.source_records,
        last.source_records
    );
    assert_eq!(totals.get(), expected());
}
