//! `/metrics`: the job's metrics in Prometheus's text format (through `prometheus-client`),
//! under the names Flink's Prometheus reporter gives them (`flink_jobmanager_job_…`), so that a
//! dashboard made for Flink reads Weir.

use crate::job::JobView;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use weir_checkpoint::coordinator::{CheckpointStats, CheckpointStatus};
use weir_core::element::SnapshotKind;

type Labels = Vec<(String, String)>;

/// The metrics text for `view`, `stats` and the records per vertex at `now_ms`.
pub(super) fn render(
    view: &JobView,
    stats: &[CheckpointStats],
    records: &std::collections::BTreeMap<u32, u64>,
    now_ms: u64,
) -> String {
    let mut text = job_metrics(view, stats, now_ms);
    text.push_str(&task_metrics(view, records));
    text
}

/// Per vertex (Flink's task metrics, over the vertex's subtasks): records a source vertex
/// emitted (`numRecordsOut`), records another processed (`numRecordsIn`).
fn task_metrics(view: &JobView, records: &std::collections::BTreeMap<u32, u64>) -> String {
    let mut registry = Registry::with_prefix("flink_taskmanager_job_task");
    let records_in = Family::<Labels, Gauge>::default();
    let records_out = Family::<Labels, Gauge>::default();
    for (id, name, _) in &view.vertices {
        let labels: Labels = vec![
            ("job_id".into(), view.job_id.clone()),
            ("task_id".into(), super::views::vertex_id(*id)),
            ("task_name".into(), name.clone()),
        ];
        let n = records.get(id).copied().unwrap_or(0) as i64;
        if view.source_vertices.contains(id) {
            records_out.get_or_create(&labels).set(n);
        } else {
            records_in.get_or_create(&labels).set(n);
        }
    }
    registry.register(
        "numRecordsIn",
        "Records the vertex's subtasks processed",
        records_in,
    );
    registry.register(
        "numRecordsOut",
        "Records the source vertex's subtasks emitted",
        records_out,
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
    let gauges: [(&str, &str, i64); 11] = [
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
            "lastCompletedCheckpointId",
            "Id of the last completed checkpoint",
            last.map_or(-1, |s| s.id.0 as i64),
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
