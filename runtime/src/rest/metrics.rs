//! `/metrics`: the job's metrics in Prometheus's text format (through `prometheus-client`),
//! under the names Flink's Prometheus reporter gives them (`flink_jobmanager_job_…`), so that a
//! dashboard made for Flink reads Weir.

use super::routes::VertexFigures;
use crate::job::JobView;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use weir_checkpoint::coordinator::{CheckpointStats, CheckpointStatus};
use weir_core::element::SnapshotKind;

type Labels = Vec<(String, String)>;

/// The metrics text for `view`, `stats` and the vertices' `figures` at `now_ms`.
pub(super) fn render(
    view: &JobView,
    stats: &[CheckpointStats],
    figures: &VertexFigures,
    now_ms: u64,
) -> String {
    let mut text = job_metrics(view, stats, now_ms);
    text.push_str(&task_metrics(view, stats, figures));
    text
}

/// The task metrics' families (Flink's names), each a gauge.
struct TaskFamilies {
    records_in: Family<Labels, Gauge>,
    records_out: Family<Labels, Gauge>,
    records_in_rate: Family<Labels, Gauge<f64, AtomicU64>>,
    records_out_rate: Family<Labels, Gauge<f64, AtomicU64>>,
    backpressured: Family<Labels, Gauge<f64, AtomicU64>>,
    alignment: Family<Labels, Gauge>,
    start_delay: Family<Labels, Gauge>,
}

/// Per vertex (Flink's task metrics, over the vertex's subtasks): records a source vertex
/// emitted (`numRecordsOut`, `numRecordsOutPerSecond`), records another processed
/// (`numRecordsIn`, `numRecordsInPerSecond`); per subtask, the ms a second it was
/// back-pressured (`backPressuredTimeMsPerSecond`), and the last completed checkpoint's
/// alignment and start delay (`checkpointAlignmentTime`, `checkpointStartDelayNanos`, in ns).
fn task_metrics(view: &JobView, stats: &[CheckpointStats], figures: &VertexFigures) -> String {
    let f = TaskFamilies {
        records_in: Family::default(),
        records_out: Family::default(),
        records_in_rate: Family::default(),
        records_out_rate: Family::default(),
        backpressured: Family::default(),
        alignment: Family::default(),
        start_delay: Family::default(),
    };
    let last = stats
        .iter()
        .rev()
        .find(|s| s.status == CheckpointStatus::Completed);
    for (id, name, parallelism) in &view.vertices {
        let labels: Labels = vec![
            ("job_id".into(), view.job_id.clone()),
            ("task_id".into(), super::views::vertex_id(*id)),
            ("task_name".into(), name.clone()),
        ];
        let (sample, rate) = figures.get(id).cloned().unwrap_or_default();
        let (count, per_second) = if view.source_vertices.contains(id) {
            (&f.records_out, &f.records_out_rate)
        } else {
            (&f.records_in, &f.records_in_rate)
        };
        count.get_or_create(&labels).set(sample.records as i64);
        per_second
            .get_or_create(&labels)
            .set(rate.records_per_second);
        for subtask in 0..*parallelism {
            let mut labels = labels.clone();
            labels.push(("subtask_index".into(), subtask.to_string()));
            let ms = rate
                .backpressured_ms_per_second
                .get(subtask as usize)
                .copied()
                .unwrap_or(0.0);
            f.backpressured.get_or_create(&labels).set(ms);
            let acked = last.and_then(|s| {
                s.subtasks
                    .iter()
                    .find(|(k, _)| k.vertex.0 == *id && k.subtask == subtask)
                    .map(|(_, m)| m)
            });
            if let Some(m) = acked {
                f.alignment
                    .get_or_create(&labels)
                    .set(m.alignment.as_nanos() as i64);
                f.start_delay
                    .get_or_create(&labels)
                    .set(m.start_delay.as_nanos() as i64);
            }
        }
    }
    let mut registry = Registry::with_prefix("flink_taskmanager_job_task");
    registry.register(
        "numRecordsIn",
        "Records the vertex's subtasks processed",
        f.records_in,
    );
    registry.register(
        "numRecordsOut",
        "Records the source vertex's subtasks emitted",
        f.records_out,
    );
    registry.register(
        "numRecordsInPerSecond",
        "Records the vertex's subtasks processed a second, over the last seconds",
        f.records_in_rate,
    );
    registry.register(
        "numRecordsOutPerSecond",
        "Records the source vertex's subtasks emitted a second, over the last seconds",
        f.records_out_rate,
    );
    registry.register(
        "backPressuredTimeMsPerSecond",
        "Ms a second the subtask waited for credits to send, over the last seconds",
        f.backpressured,
    );
    registry.register(
        "checkpointAlignmentTime",
        "Ns the last completed checkpoint's barrier alignment took at the subtask",
        f.alignment,
    );
    registry.register(
        "checkpointStartDelayNanos",
        "Ns from the last completed checkpoint's trigger to its barrier reaching the subtask",
        f.start_delay,
    );
    let mut text = String::new();
    let _ = encode(&mut text, &registry);
    text
}

fn job_metrics(view: &JobView, stats: &[CheckpointStats], now_ms: u64) -> String {
    let mut registry = Registry::with_prefix("flink_jobmanager_job");
    let labels: Labels = vec![
        ("job_id".into(), view.job_id.clone()),
        ("job_name".into(), view.name.clone()),
    ];
    let in_progress = stats
        .iter()
        .filter(|s| s.status == CheckpointStatus::InProgress)
        .count() as i64;
    let last = stats
        .iter()
        .rev()
        .find(|s| s.status == CheckpointStatus::Completed && s.kind == SnapshotKind::Checkpoint);
    let uptime = match view.end_time_ms {
        Some(_) => 0,
        None => now_ms.saturating_sub(view.start_time_ms) as i64,
    };
    let gauges: [(&str, &str, i64); 13] = [
        (
            "numberOfCompletedCheckpoints",
            "Checkpoints completed",
            view.completed as i64,
        ),
        (
            "numberOfFailedCheckpoints",
            "Checkpoints failed",
            view.failed as i64,
        ),
        (
            "numberOfInProgressCheckpoints",
            "Checkpoints in progress",
            in_progress,
        ),
        (
            "totalNumberOfCheckpoints",
            "Checkpoints triggered",
            (view.completed + view.failed) as i64 + in_progress,
        ),
        (
            "lastCheckpointDuration",
            "End-to-end duration of the last completed checkpoint, ms",
            last.and_then(|s| s.end_to_end)
                .map_or(-1, |d| d.as_millis() as i64),
        ),
        (
            "lastCheckpointSize",
            "Bytes the last completed checkpoint wrote (incremental: the new files)",
            last.map_or(-1, |s| s.checkpointed_size as i64),
        ),
        (
            "lastCheckpointFullSize",
            "Bytes of state of the last completed checkpoint",
            last.map_or(-1, |s| s.state_size as i64),
        ),
        (
            "lastCheckpointPersistedData",
            "In-flight bytes the last completed checkpoint persisted (unaligned)",
            last.map_or(-1, |s| s.in_flight_size as i64),
        ),
        (
            "lastCheckpointProcessedData",
            "Bytes of records the last completed checkpoint's subtasks processed while aligning",
            last.map_or(-1, |s| s.processed_size as i64),
        ),
        (
            "lastCompletedCheckpointId",
            "Id of the last completed checkpoint",
            last.map_or(-1, |s| s.id.0 as i64),
        ),
        (
            "lastCheckpointRestoreTimestamp",
            "When the job last restored from a checkpoint, ms since the Unix epoch",
            view.last_restore
                .as_ref()
                .map_or(-1, |r| r.timestamp_ms as i64),
        ),
        (
            "numRestarts",
            "Restarts of the job",
            i64::from(view.restarts),
        ),
        ("uptime", "Time the job has been running, ms", uptime),
    ];
    for (name, help, value) in gauges {
        let family = Family::<Labels, Gauge>::default();
        family.get_or_create(&labels).set(value);
        registry.register(name, help, family);
    }
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}
