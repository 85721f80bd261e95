//! Restore: finding the checkpoint to start from, and assigning its state to the new subtasks —
//! key-group ranges for keyed state (reading only the sections each subtask owns), and operator
//! state kept in place or redistributed by its mode.

use crate::error::JobError;
use crate::operator::{RestoreContext, RestoredKeyed, RestoredOperatorState};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tracing::warn;
use weir_checkpoint::storage::{CheckpointListing, CheckpointLocation, S3Config, is_s3_url};
use weir_checkpoint::{
    CheckpointError, CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage,
};
use weir_core::graph::JobGraph;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{SubtaskIndex, VertexId};
use weir_core::keygroup::KeyGroupRange;
use weir_core::keygroup::compute_key_group_range_for_operator_index;
use weir_state::format::{SnapshotHeader, part_sections};
use weir_state::{RestorePart, StateError};

/// A checkpoint chosen for a restore.
pub(crate) struct RestorePoint {
    pub storage: Arc<dyn CheckpointStorage>,
    pub location: CheckpointLocation,
    pub metadata: CheckpointMetadata,
}

impl RestorePoint {
    pub fn describe(&self) -> String {
        self.storage.location_path(&self.location)
    }
}

/// The complete checkpoints under a user-given path (a local directory or `s3://bucket/prefix`),
/// newest first: the path itself if it is a checkpoint, else its `chk-<n>` children, else those
/// of its job directories.
pub(crate) async fn candidates_at(
    path: &Path,
) -> Result<(Arc<dyn CheckpointStorage>, Vec<CheckpointListing>), JobError> {
    let shown = path.display().to_string();
    // A `chk-<n>` directory (or prefix) is opened from its parent, the job directory, so that
    // the files its chains share with other checkpoints (`../shared/`) are inside the root.
    let is_chk = |name: &str| {
        name.strip_prefix("chk-")
            .is_some_and(|id| id.parse::<u64>().is_ok())
    };
    let (storage, rel): (Arc<dyn CheckpointStorage>, String) =
        match path.to_str().filter(|p| is_s3_url(p)) {
            // `s3://bucket/prefix`: the prefix is the path, configured from the AWS variables.
            Some(url) => {
                let trimmed = url.trim_end_matches('/');
                let (root, rel) = match trimmed.rsplit_once('/') {
                    Some((parent, name)) if is_chk(name) && parent.len() > "s3://".len() => {
                        (parent, format!("{name}/"))
                    }
                    _ => (trimmed, String::new()),
                };
                let config = S3Config::from_url_and_env(root)?;
                (Arc::new(OpendalCheckpointStorage::s3(config)?), rel)
            }
            None => {
                if !path.is_dir() {
                    return Err(JobError::Restore {
                        path: shown,
                        reason: "no such directory".into(),
                    });
                }
                let chk_name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .filter(|n| is_chk(n));
                let (root, rel) = match (chk_name, path.parent()) {
                    (Some(name), Some(parent)) if parent.is_dir() => (parent, format!("{name}/")),
                    _ => (path, String::new()),
                };
                (Arc::new(OpendalCheckpointStorage::fs(root)?), rel)
            }
        };
    let mut found = storage.find_checkpoints(&rel).await?;
    found.retain(|l| l.complete);
    if found.is_empty() {
        return Err(JobError::Restore {
            path: shown,
            reason: "no complete checkpoint: no _metadata in it, in its chk-* directories, or in their job directories".into(),
        });
    }
    found.reverse();
    Ok((storage, found))
}

/// Loads each candidate newest first, falling back past corrupt ones (with a warning that names
/// the file), and returns the restore contexts of the first that loads entirely.
pub(crate) async fn load_first_good(
    storage: Arc<dyn CheckpointStorage>,
    candidates: &[CheckpointLocation],
    job: &JobGraph,
    allow_non_restored_state: bool,
) -> Result<
    (
        RestorePoint,
        HashMap<(VertexId, SubtaskIndex), RestoreContext>,
    ),
    JobError,
> {
    let mut last_error = None;
    for (i, location) in candidates.iter().enumerate() {
        let older_remain = i + 1 < candidates.len();
        let attempt = async {
            let metadata = storage.read_metadata(location).await?;
            let point = RestorePoint {
                storage: storage.clone(),
                location: location.clone(),
                metadata,
            };
            let contexts = assign(&point, job, allow_non_restored_state).await?;
            Ok::<_, JobError>((point, contexts))
        };
        match attempt.await {
            Ok(found) => return Ok(found),
            // A checkpoint that does not fit the job is a user error, not corruption.
            Err(e @ JobError::Restore { .. }) => return Err(e),
            Err(e) => {
                if older_remain {
                    warn!(checkpoint = %location.dir, error = %e, "checkpoint unusable; falling back to the previous complete checkpoint");
                } else {
                    warn!(checkpoint = %location.dir, error = %e, "checkpoint unusable, and no older complete checkpoint remains");
                }
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| JobError::Restore {
        path: storage.describe(),
        reason: "no complete checkpoint".into(),
    }))
}

/// Assigns a checkpoint's state to every subtask of `job`.
pub(crate) async fn assign(
    point: &RestorePoint,
    job: &JobGraph,
    allow_non_restored_state: bool,
) -> Result<HashMap<(VertexId, SubtaskIndex), RestoreContext>, JobError> {
    let meta = &point.metadata;
    let restore_error = |reason: String| JobError::Restore {
        path: point.describe(),
        reason,
    };
    let mut contexts: HashMap<(VertexId, SubtaskIndex), RestoreContext> = HashMap::new();
    for v in &job.vertices {
        for i in 0..v.parallelism {
            contexts.insert(
                (v.id, i),
                RestoreContext {
                    operators: HashMap::new(),
                    checkpoint: Some(meta.checkpoint_id),
                    in_flight: Vec::new(),
                },
            );
        }
    }
    for op in &meta.operators {
        let node = job
            .stream_graph
            .nodes
            .iter()
            .find(|n| n.operator_id == op.operator_id);
        let Some(node) = node else {
            if op.subtasks.values().all(|s| s.is_empty()) {
                continue;
            }
            if allow_non_restored_state {
                warn!(operator = %op.name, uid = ?op.uid, id = %op.operator_id, "dropping state that maps to no operator of this job (allow_non_restored_state)");
                continue;
            }
            return Err(restore_error(format!(
                "the checkpoint has state for operator '{}' (uid {:?}, id {}) that maps to no operator of this job; set allow_non_restored_state to drop it",
                op.name, op.uid, op.operator_id
            )));
        };
        if node.max_parallelism != op.max_parallelism {
            return Err(restore_error(format!(
                "operator '{}' has max parallelism {} in the checkpoint but {} in the job; key groups cannot be mapped",
                node.name, op.max_parallelism, node.max_parallelism
            )));
        }
        let vertex = job.vertex_of[node.id.0 as usize];
        let p_new = node.parallelism;
        // Operator state: blobs per old subtask.
        let mut old_blobs: Vec<Vec<Vec<u8>>> = Vec::new();
        for state in op.subtasks.values() {
            let mut blobs = Vec::new();
            for h in &state.operator {
                blobs.push(
                    point
                        .storage
                        .read_state(&point.location, &h.stream, None)
                        .await?
                        .to_vec(),
                );
            }
            old_blobs.push(blobs);
        }
        let has_operator_state = old_blobs.iter().any(|b| !b.is_empty());
        let new_blobs: Vec<Vec<Vec<u8>>> = if !has_operator_state {
            vec![Vec::new(); p_new as usize]
        } else if p_new == op.parallelism && op.subtasks.len() == p_new as usize {
            old_blobs
        } else {
            let flat: Vec<&[u8]> = old_blobs.iter().flatten().map(|b| b.as_slice()).collect();
            weir_state::operator::redistribute(&flat, p_new)
                .map_err(|e| restore_error(e.to_string()))?
                .into_iter()
                .map(|b| vec![b])
                .collect()
        };
        for i in 0..p_new {
            let range = compute_key_group_range_for_operator_index(node.max_parallelism, p_new, i);
            let mut restored = RestoredOperatorState {
                keyed: Vec::new(),
                operator: new_blobs.get(i as usize).cloned().unwrap_or_default(),
            };
            for state in op.subtasks.values() {
                for h in &state.keyed {
                    let Some((start, end)) = h.byte_range_for(&range) else {
                        continue;
                    };
                    let header = point
                        .storage
                        .read_state(&point.location, &h.stream, Some(h.header))
                        .await?
                        .to_vec();
                    let sections = point
                        .storage
                        .read_state(&point.location, &h.stream, Some((start, end)))
                        .await?;
                    let r = RestoredKeyed {
                        handle: h.clone(),
                        header,
                        sections,
                        sections_offset: start,
                    };
                    verify_keyed(&r, &range).map_err(|e| {
                        let file = match &h.stream {
                            StreamStateHandle::File { path, .. } => {
                                format!("{}{path}", point.location.dir)
                            }
                            StreamStateHandle::Inline(_) => point.location.metadata_path(),
                        };
                        JobError::Storage(CheckpointError::Corrupt {
                            path: file,
                            reason: e.to_string(),
                        })
                    })?;
                    restored.keyed.push(r);
                }
            }
            if let Some(ctx) = contexts.get_mut(&(vertex, i)) {
                ctx.operators.insert(node.operator_id, restored);
            }
        }
    }
    assign_in_flight(point, job, allow_non_restored_state, &mut contexts).await?;
    Ok(contexts)
}

/// Hands each subtask the in-flight data its previous incarnation persisted. In-flight data is
/// per channel, so every operator must keep its parallelism; rescaling goes through a savepoint
/// (always aligned) or an aligned checkpoint.
async fn assign_in_flight(
    point: &RestorePoint,
    job: &JobGraph,
    allow_non_restored_state: bool,
    contexts: &mut HashMap<(VertexId, SubtaskIndex), RestoreContext>,
) -> Result<(), JobError> {
    let meta = &point.metadata;
    if meta.in_flight.is_empty() {
        return Ok(());
    }
    let restore_error = |reason: String| JobError::Restore {
        path: point.describe(),
        reason,
    };
    for op in &meta.operators {
        if let Some(node) = job
            .stream_graph
            .nodes
            .iter()
            .find(|n| n.operator_id == op.operator_id)
            && node.parallelism != op.parallelism
        {
            return Err(restore_error(format!(
                "checkpoint {} is unaligned and holds in-flight data, which cannot be redistributed: operator '{}' would change parallelism from {} to {}; rescale from a savepoint or an aligned checkpoint instead",
                meta.checkpoint_id, node.name, op.parallelism, node.parallelism
            )));
        }
    }
    for entry in &meta.in_flight {
        let vertex = job
            .vertices
            .iter()
            .find(|v| job.stream_graph.node(v.head()).operator_id == entry.operator_id);
        let Some(vertex) = vertex else {
            if allow_non_restored_state {
                warn!(operator = %entry.operator_id, subtask = entry.subtask, "dropping in-flight data of a chain this job does not have (allow_non_restored_state)");
                continue;
            }
            return Err(restore_error(format!(
                "the checkpoint has in-flight data for a chain headed by operator {} that this job does not have; set allow_non_restored_state to drop it",
                entry.operator_id
            )));
        };
        let file = match &entry.handle.stream {
            StreamStateHandle::File { path, .. } => format!("{}{path}", point.location.dir),
            StreamStateHandle::Inline(_) => point.location.metadata_path(),
        };
        let bytes = point
            .storage
            .read_state(&point.location, &entry.handle.stream, None)
            .await?;
        let sections = weir_core::channel_state::decode_file(&file, &bytes).map_err(|e| {
            JobError::Storage(CheckpointError::Corrupt {
                path: file.clone(),
                reason: e.to_string(),
            })
        })?;
        // Decode every batch now: a corrupt checkpoint is skipped here, before deployment.
        for section in &sections {
            if let Err(e) = section.verify() {
                return Err(JobError::Storage(CheckpointError::Corrupt {
                    path: file.clone(),
                    reason: e.to_string(),
                }));
            }
        }
        if let Some(ctx) = contexts.get_mut(&(vertex.id, entry.subtask)) {
            ctx.in_flight.extend(sections);
        }
    }
    Ok(())
}

/// Checks the header and every section a subtask will restore, before anything is deployed, so
/// that a corrupt checkpoint is skipped in favour of the previous one instead of failing every
/// restart.
fn verify_keyed(r: &RestoredKeyed, range: &KeyGroupRange) -> Result<(), StateError> {
    let header = SnapshotHeader::decode(&r.header)?;
    let part = RestorePart {
        handle: &r.handle,
        header: &r.header,
        sections: r.sections.clone(),
        sections_offset: r.sections_offset,
    };
    for (kg, bytes) in part_sections(&part, range)? {
        header.parse_section(kg, bytes)?;
    }
    Ok(())
}
