//! The JSON bodies of the REST API, made from a [`JobView`] and the checkpoint statistics:
//! Flink's field names (`/jobs/:jobid/checkpoints` and its details, `/jobs/:jobid`,
//! `/overview`), pure functions of their inputs.

use super::rates::VertexRate;
use super::routes::VertexFigures;
use crate::job::JobView;
use serde_json::{Value, json};
use std::time::Duration;
use weir_checkpoint::coordinator::{CheckpointStats, CheckpointStatus};
use weir_core::element::SnapshotKind;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// Flink's status names.
fn status(s: &CheckpointStatus) -> &'static str {
    match s {
        CheckpointStatus::InProgress => "IN_PROGRESS",
        CheckpointStatus::Completed => "COMPLETED",
        CheckpointStatus::Failed(_) => "FAILED",
    }
}

fn checkpoint_type(kind: SnapshotKind, unaligned: bool) -> &'static str {
    match kind {
        SnapshotKind::Checkpoint if unaligned => "UNALIGNED_CHECKPOINT",
        SnapshotKind::Checkpoint => "CHECKPOINT",
        SnapshotKind::Savepoint => "SAVEPOINT",
        SnapshotKind::SynchronousSavepoint => "SYNC_SAVEPOINT",
    }
}

/// The vertex id as Flink writes one (32 hex digits).
pub(super) fn vertex_id(id: u32) -> String {
    format!("{id:032x}")
}

/// One checkpoint's entry in the history, or its details (with `tasks` per vertex).
pub(super) fn checkpoint(s: &CheckpointStats, view: &JobView) -> Value {
    let unaligned = view.checkpoint_config.as_ref().is_some_and(|c| c.unaligned);
    let latest_ack = s
        .end_to_end
        .map_or(s.trigger_timestamp_ms, |d| s.trigger_timestamp_ms + ms(d));
    let alignment = s
        .subtasks
        .values()
        .map(|m| ms(m.alignment))
        .max()
        .unwrap_or(0);
    let mut tasks = serde_json::Map::new();
    for (id, _, parallelism) in &view.vertices {
        let subs: Vec<_> = s
            .subtasks
            .iter()
            .filter(|(k, _)| k.vertex.0 == *id)
            .collect();
        tasks.insert(
            vertex_id(*id),
            json!({
                "id": s.id.0,
                "status": status(&s.status),
                "num_subtasks": parallelism,
                "num_acknowledged_subtasks": subs.len(),
                "state_size": subs.iter().map(|(_, m)| m.state_size).sum::<u64>(),
                "end_to_end_duration": s.end_to_end.map_or(-1, |d| ms(d) as i64),
            }),
        );
    }
    let mut v = json!({
        "className": match s.status {
            CheckpointStatus::Completed => "completed",
            CheckpointStatus::InProgress => "in_progress",
            CheckpointStatus::Failed(_) => "failed",
        },
        "id": s.id.0,
        "status": status(&s.status),
        "is_savepoint": s.kind != SnapshotKind::Checkpoint,
        "checkpoint_type": checkpoint_type(s.kind, unaligned),
        "trigger_timestamp": s.trigger_timestamp_ms,
        "latest_ack_timestamp": latest_ack,
        "state_size": s.state_size,
        "checkpointed_size": s.checkpointed_size,
        "end_to_end_duration": s.end_to_end.map_or(-1, |d| ms(d) as i64),
        "persisted_data": s.in_flight_size,
        "processed_data": s.processed_size,
        "num_subtasks": s.num_subtasks,
        "num_acknowledged_subtasks": s.num_acknowledged,
        "max_alignment_duration": alignment,
        "tasks": tasks,
    });
    if let CheckpointStatus::Failed(reason) = &s.status {
        v["failure_message"] = json!(reason.to_string());
        v["failure_timestamp"] = json!(latest_ack);
    }
    v
}

/// Min, max, average and percentiles of `values` (Flink's `StatsSummaryDto`).
fn summary(mut values: Vec<u64>) -> Value {
    if values.is_empty() {
        return json!({"min": 0, "max": 0, "avg": 0, "p50": 0.0, "p90": 0.0, "p95": 0.0,
            "p99": 0.0, "p999": 0.0});
    }
    values.sort_unstable();
    let pct = |p: f64| {
        let i = ((values.len() as f64 - 1.0) * p).round() as usize;
        values[i.min(values.len() - 1)] as f64
    };
    let sum: u128 = values.iter().map(|v| u128::from(*v)).sum();
    json!({
        "min": values[0],
        "max": values[values.len() - 1],
        "avg": (sum / values.len() as u128) as u64,
        "p50": pct(0.5), "p90": pct(0.9), "p95": pct(0.95), "p99": pct(0.99), "p999": pct(0.999),
    })
}

/// `GET /jobs/:jobid/checkpoints`: counts, summary, latest and history (newest first).
pub(super) fn checkpoints(stats: &[CheckpointStats], view: &JobView) -> Value {
    let completed: Vec<&CheckpointStats> = stats
        .iter()
        .filter(|s| s.status == CheckpointStatus::Completed)
        .collect();
    let in_progress = stats
        .iter()
        .filter(|s| s.status == CheckpointStatus::InProgress)
        .count() as u64;
    let latest = |pick: &dyn Fn(&&CheckpointStats) -> bool| {
        stats
            .iter()
            .rev()
            .find(pick)
            .map_or(Value::Null, |s| checkpoint(s, view))
    };
    json!({
        "counts": {
            "restored": view.restores,
            "total": view.completed + view.failed + in_progress,
            "in_progress": in_progress,
            "completed": view.completed,
            "failed": view.failed,
        },
        "summary": {
            "checkpointed_size": summary(completed.iter().map(|s| s.checkpointed_size).collect()),
            "state_size": summary(completed.iter().map(|s| s.state_size).collect()),
            "end_to_end_duration": summary(
                completed.iter().filter_map(|s| s.end_to_end).map(ms).collect(),
            ),
            "persisted_data": summary(completed.iter().map(|s| s.in_flight_size).collect()),
            "processed_data": summary(completed.iter().map(|s| s.processed_size).collect()),
            "alignment_duration": summary(
                completed
                    .iter()
                    .map(|s| s.subtasks.values().map(|m| ms(m.alignment)).max().unwrap_or(0))
                    .collect(),
            ),
        },
        "latest": {
            "completed": latest(&|s| s.status == CheckpointStatus::Completed
                && s.kind == SnapshotKind::Checkpoint),
            "savepoint": latest(&|s| s.status == CheckpointStatus::Completed
                && s.kind != SnapshotKind::Checkpoint),
            "failed": latest(&|s| matches!(s.status, CheckpointStatus::Failed(_))),
            "restored": view.last_restore.as_ref().map_or(Value::Null, |r| json!({
                "id": r.checkpoint_id,
                "restore_timestamp": r.timestamp_ms,
                "is_savepoint": r.is_savepoint,
                "external_path": r.path,
            })),
        },
        "history": stats.iter().rev().map(|s| checkpoint(s, view)).collect::<Vec<_>>(),
    })
}

/// `GET /jobs/:jobid/checkpoints/details/:cid/subtasks/:vertexid`: per-subtask figures.
pub(super) fn subtasks(s: &CheckpointStats, vertex: u32, parallelism: u32) -> Value {
    let subtasks: Vec<Value> = (0..parallelism)
        .map(|i| {
            let m = s
                .subtasks
                .iter()
                .find(|(k, _)| k.vertex.0 == vertex && k.subtask == i)
                .map(|(_, m)| m);
            match m {
                Some(m) => json!({
                    "index": i,
                    "status": "completed",
                    "ack_timestamp": s.trigger_timestamp_ms + ms(m.start_delay + m.alignment
                        + m.sync_duration + m.async_duration),
                    "end_to_end_duration": ms(m.start_delay + m.alignment + m.sync_duration
                        + m.async_duration),
                    "state_size": m.state_size,
                    "checkpoint": {"sync": ms(m.sync_duration), "async": ms(m.async_duration)},
                    "alignment": {"duration": ms(m.alignment), "processed": m.processed_data},
                    "start_delay": ms(m.start_delay),
                    "aborted": false,
                }),
                None => json!({"index": i, "status": "pending_or_failed"}),
            }
        })
        .collect();
    json!({
        "id": s.id.0,
        "status": status(&s.status),
        "subtasks": subtasks,
    })
}

/// `GET /jobs/:jobid/checkpoints/config`.
pub(super) fn checkpoint_config(view: &JobView) -> Value {
    let Some(c) = &view.checkpoint_config else {
        return json!({});
    };
    let retain = !matches!(
        c.externalized_retention,
        weir_core::config::ExternalizedRetention::DeleteOnCancellation
    );
    json!({
        "mode": match c.mode {
            weir_core::config::CheckpointingMode::ExactlyOnce => "exactly_once",
            weir_core::config::CheckpointingMode::AtLeastOnce => "at_least_once",
        },
        "interval": c.interval.map_or(i64::MAX, |d| ms(d) as i64),
        "timeout": ms(c.timeout),
        "min_pause": ms(c.min_pause),
        "max_concurrent": c.max_concurrent,
        "externalization": {"enabled": true, "delete_on_cancellation": !retain},
        "state_backend": view.state_backend,
        "checkpoint_storage": view.checkpoint_storage,
        "unaligned_checkpoints": c.unaligned,
        "tolerable_failed_checkpoints": c.tolerable_failed_checkpoints.unwrap_or(0),
        "aligned_checkpoint_timeout": ms(c.aligned_checkpoint_timeout),
        "checkpoints_after_tasks_finish": true,
        "state_changelog_enabled": false,
    })
}

/// `GET /jobs/:jobid`: the job, its vertices with their records, rates and back-pressured
/// time (`figures`), and its plan (the vertices and the exchanges between them).
pub(super) fn job(view: &JobView, figures: &VertexFigures, now_ms: u64) -> Value {
    let end = view.end_time_ms.map_or(-1, |e| e as i64);
    let duration = view
        .end_time_ms
        .unwrap_or(now_ms)
        .saturating_sub(view.start_time_ms);
    let complete = view.end_time_ms.is_some();
    let vertices: Vec<Value> = view
        .vertices
        .iter()
        .map(|(id, name, parallelism)| {
            let (sample, rate) = figures.get(id).cloned().unwrap_or_default();
            let backpressured = rate
                .backpressured_ms_per_second
                .iter()
                .copied()
                .fold(0.0, f64::max);
            // What is counted: a source's records written, another vertex's records read.
            let (count, per_second) = if view.source_vertices.contains(id) {
                ("write-records", "numRecordsOutPerSecond")
            } else {
                ("read-records", "numRecordsInPerSecond")
            };
            json!({
                "id": vertex_id(*id),
                "name": name,
                "parallelism": parallelism,
                "status": view.state,
                "start-time": view.start_time_ms,
                "end-time": end,
                "duration": duration,
                "metrics": {
                    count: sample.records,
                    format!("{count}-complete"): complete,
                    per_second: rate.records_per_second,
                    "accumulated-backpressured-time": sample.backpressured_ms.iter().sum::<u64>(),
                    "backPressuredTimeMsPerSecond": backpressured,
                    "backpressure-level": super::rates::level(backpressured / 1000.0),
                },
            })
        })
        .collect();
    json!({
        "jid": view.job_id,
        "name": view.name,
        "isStoppable": false,
        "state": view.state,
        "start-time": view.start_time_ms,
        "end-time": end,
        "duration": duration,
        "now": now_ms,
        "vertices": vertices,
        "plan": plan(view),
    })
}

/// Flink's job plan: one node per vertex, with its inputs (producer and ship strategy).
fn plan(view: &JobView) -> Value {
    let nodes: Vec<Value> = view
        .vertices
        .iter()
        .map(|(id, name, parallelism)| {
            let inputs: Vec<Value> = view
                .edges
                .iter()
                .filter(|(_, target, _)| target == id)
                .enumerate()
                .map(|(num, (source, _, strategy))| {
                    json!({
                        "num": num,
                        "id": vertex_id(*source),
                        "ship_strategy": strategy,
                        "exchange": "pipelined_bounded",
                    })
                })
                .collect();
            json!({
                "id": vertex_id(*id),
                "parallelism": parallelism,
                "operator": "",
                "operator_strategy": "",
                "description": name,
                "inputs": inputs,
                "optimizer_properties": {},
            })
        })
        .collect();
    json!({"jid": view.job_id, "name": view.name, "type": "STREAMING", "nodes": nodes})
}

/// `GET /jobs/:jobid/vertices/:vertexid/backpressure` from the vertex's rates (Flink's
/// `JobVertexBackPressureInfo`; the ratio is the share of time a subtask waited for credits).
pub(super) fn backpressure(rate: &VertexRate, now_ms: u64) -> Value {
    let ratios: Vec<f64> = rate
        .backpressured_ms_per_second
        .iter()
        .map(|ms| ms / 1000.0)
        .collect();
    let worst = ratios.iter().copied().fold(0.0, f64::max);
    json!({
        "status": "ok",
        "backpressure-level": super::rates::level(worst),
        "end-timestamp": now_ms,
        "subtasks": ratios.iter().enumerate().map(|(i, r)| json!({
            "subtask": i,
            "attempt-number": 0,
            "backpressure-level": super::rates::level(*r),
            "ratio": r,
        })).collect::<Vec<_>>(),
    })
}

/// The jobs that ran on the cluster before this one (in cluster mode), oldest first.
pub(super) fn past_jobs(view: &JobView) -> impl Iterator<Item = &crate::job::PastJob> {
    view.past_jobs.iter().filter(|p| p.id != view.job_id)
}

/// A past job's entry in `/jobs/overview`.
pub(super) fn past_job(p: &crate::job::PastJob) -> Value {
    json!({
        "jid": p.id,
        "name": p.name,
        "state": p.state,
        "start-time": p.start_time_ms,
        "end-time": p.end_time_ms,
        "duration": p.end_time_ms.saturating_sub(p.start_time_ms),
        "last-modification": p.end_time_ms,
    })
}

/// `GET /overview`.
pub(super) fn overview(view: &JobView) -> Value {
    let slots: u32 = view.vertices.iter().map(|(_, _, p)| *p).max().unwrap_or(0);
    let count = |s: &str| {
        u32::from(view.state == s) + past_jobs(view).filter(|p| p.state == s).count() as u32
    };
    json!({
        "taskmanagers": 1,
        "slots-total": slots,
        "slots-available": 0,
        "jobs-running": count("RUNNING"),
        "jobs-finished": count("FINISHED"),
        "jobs-cancelled": count("CANCELED"),
        "jobs-failed": count("FAILED"),
        "flink-version": concat!("weir ", env!("CARGO_PKG_VERSION")),
        "flink-commit": "",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_has_flink_s_percentiles() {
        let s = summary((1..=100).collect());
        assert_eq!(s["min"], 1);
        assert_eq!(s["max"], 100);
        assert_eq!(s["avg"], 50);
        assert_eq!(s["p50"], 51.0);
        assert_eq!(s["p99"], 99.0);
        assert_eq!(summary(Vec::new())["max"], 0);
    }
}
