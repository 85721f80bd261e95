//! Restore: finding the checkpoint to start from, and assigning its state to the new subtasks —
//! key-group ranges for keyed state (reading only the sections each subtask owns), and operator
//! state kept in place or redistributed by its mode.

use crate::error::JobError;
use crate::operator::{RestoreContext, RestoredOperatorState};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use tracing::warn;
use weir_checkpoint::storage::{
    CheckpointListing, CheckpointLocation, S3Config, is_s3_url, parse_checkpoint_dir,
};
use weir_checkpoint::{CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage};
use weir_core::fingerprint::JobFingerprint;
use weir_core::graph::JobGraph;
use weir_core::identity::StateFileKind;
use weir_core::ids::{JobId, SubtaskIndex, VertexId};
use weir_core::keygroup::compute_key_group_range_for_operator_index;

use crate::verify;

mod read;
#[cfg(feature = "cluster")]
pub(crate) use read::fetch_foreign_native;
use read::{corrupt, file_of, read_keyed, read_native, read_operator_state, verify_keyed_frames};

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

/// The complete checkpoints under a user-given path, newest first: the path itself if it is a
/// checkpoint, else its `chk-<n>` children, else those of its job directories. The path is a
/// local directory (or `file://…`), `s3://bucket/prefix`, a URL of a registered scheme, or a
/// location under the root of `configured` (a custom storage object the job writes to).
///
/// Also returns, for a storage opened here, its root as a location another process opens the
/// same storage from (`StorageConfig::from_location`): how task managers reach a restore point
/// outside the job's storage. `None` for the configured storage object.
pub(crate) async fn candidates_at(
    path: &Path,
    configured: Option<&Arc<dyn CheckpointStorage>>,
) -> Result<RestoreRoot, JobError> {
    let shown = path.display().to_string();
    let text = path.to_str();
    let (storage, rel, location) = match (text, configured) {
        (Some(t), Some(custom)) if under_root(custom, t).is_some() => {
            let rel = under_root(custom, t).unwrap_or_default();
            (custom.clone(), rel, None)
        }
        (Some(t), _) if t.starts_with("file://") => {
            let path = t.trim_start_matches("file://");
            // `file://localhost/dir` names the same directory as `file:///dir` (RFC 8089).
            local_root(
                Path::new(path.strip_prefix("localhost").unwrap_or(path)),
                &shown,
            )?
        }
        (Some(t), _) if is_s3_url(t) || crate::schemes::scheme_of(t).is_some() => {
            let (root, rel) = split_url(t);
            let storage: Arc<dyn CheckpointStorage> = if is_s3_url(t) {
                Arc::new(OpendalCheckpointStorage::s3(S3Config::from_url_and_env(
                    root,
                )?)?)
            } else {
                crate::schemes::open(root)?
            };
            (storage, rel, Some(root.to_string()))
        }
        _ => local_root(path, &shown)?,
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
    Ok(RestoreRoot {
        storage,
        location,
        listings: found,
    })
}

/// A storage opened for a restore path: the storage, the path under its root, and the root as
/// a location other processes open it from.
type OpenedRoot = (Arc<dyn CheckpointStorage>, String, Option<String>);

/// The storage a user-given restore path is in, and the complete checkpoints found there.
pub(crate) struct RestoreRoot {
    /// The storage.
    pub storage: Arc<dyn CheckpointStorage>,
    /// Its root as a location other processes open it from, if it was opened from one.
    pub location: Option<String>,
    /// The complete checkpoints, newest first.
    pub listings: Vec<CheckpointListing>,
}

/// A `chk-<n>` name.
fn is_chk(name: &str) -> bool {
    parse_checkpoint_dir(name).is_some()
}

/// A `<job-id>` name.
fn is_job(name: &str) -> bool {
    JobId::parse(name).is_some()
}

/// `url` (`scheme://root/…`) split into the storage root to open and the path under it: a
/// `chk-<n>` is opened from its parent, the job directory, so that the files its chains share
/// with other checkpoints (`../shared/`) are inside the root; and a job directory (a
/// `<job-id>` name) from its parent, the checkpoint root, so that every location names its job
/// (the `_metadata` check, the job's lock for claim mode).
fn split_url(url: &str) -> (&str, String) {
    let trimmed = url.trim_end_matches('/');
    let min = trimmed.find("://").map_or(0, |i| i + 3);
    match trimmed.rsplit_once('/') {
        Some((parent, name)) if is_chk(name) && parent.len() > min => {
            match parent.rsplit_once('/') {
                Some((root, job)) if is_job(job) && root.len() > min => {
                    (root, format!("{job}/{name}/"))
                }
                _ => (parent, format!("{name}/")),
            }
        }
        Some((parent, name)) if is_job(name) && parent.len() > min => (parent, format!("{name}/")),
        _ => (trimmed, String::new()),
    }
}

/// The path of `location` under the root of `storage` (as `location_path` shows locations), if
/// it is the root itself (`""`), one of its job directories (`<job-id>/`), one of their
/// checkpoints (`<job-id>/chk-<n>/`), or another directory under it (a savepoint's,
/// `savepoint-…/`): the forms a job prints. What the directory holds decides the rest
/// (`find_checkpoints`: `_metadata`, `chk-<n>` children, or none).
fn under_root(storage: &Arc<dyn CheckpointStorage>, location: &str) -> Option<String> {
    let root = storage.location_path(&CheckpointLocation { dir: String::new() });
    let root = root.trim_end_matches('/');
    if root.is_empty() || root.ends_with(':') {
        return None;
    }
    let rest = location.trim_end_matches('/').strip_prefix(root)?;
    if rest.is_empty() {
        return Some(String::new());
    }
    let rel = rest.strip_prefix('/')?;
    let parts: Vec<&str> = rel.split('/').collect();
    match parts.as_slice() {
        [job] if is_job(job) => Some(format!("{rel}/")),
        [job, chk] if is_job(job) && is_chk(chk) => Some(format!("{rel}/")),
        // Any other directory under the root (a savepoint's): it holds `_metadata` or nothing.
        parts
            if parts
                .iter()
                .all(|p| !p.is_empty() && *p != "." && *p != "..") =>
        {
            Some(format!("{rel}/"))
        }
        _ => None,
    }
}

/// A local directory opened as in [`split_url`]: a `chk-<n>` from its job directory's parent,
/// a job directory from its parent.
fn local_root(path: &Path, shown: &str) -> Result<OpenedRoot, JobError> {
    // Absolute first, so that a relative `chk-3` or `<job>/chk-3` has the parents it names.
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let path = absolute.as_path();
    if !path.is_dir() {
        return Err(JobError::Restore {
            path: shown.to_string(),
            reason: "no such directory".into(),
        });
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = path.parent().filter(|p| p.is_dir());
    let grandparent = parent.and_then(Path::parent).filter(|p| p.is_dir());
    let parent_name = parent
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let (root, rel) = match (parent, grandparent) {
        (Some(_), Some(root)) if is_chk(name) && is_job(parent_name) => {
            (root, format!("{parent_name}/{name}/"))
        }
        (Some(parent), _) if is_chk(name) || is_job(name) => (parent, format!("{name}/")),
        _ => (path, String::new()),
    };
    let location = root.to_str().map(str::to_string);
    Ok((Arc::new(OpendalCheckpointStorage::fs(root)?), rel, location))
}

/// Narrows the complete checkpoints under a user-given path (newest first) to one job's. A
/// checkpoint directory the user named is taken as it is. Under a root or job directory, every
/// run of a job has its own job directory; the checkpoints of all of them are candidates when
/// they are of one job (by fingerprint: graph and source settings; by name for files without
/// one). A root holding several jobs is refused, listing them, since picking one would be a
/// guess. Unreadable `_metadata`s stay candidates (the restore falls back past them) when they
/// lie in a job directory of the chosen job.
pub(crate) async fn one_jobs_candidates(
    storage: &dyn CheckpointStorage,
    path: &Path,
    listings: Vec<CheckpointListing>,
) -> Result<Vec<CheckpointLocation>, JobError> {
    let named = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| parse_checkpoint_dir(n).is_some());
    if named || listings.len() <= 1 {
        return Ok(listings.into_iter().map(|l| l.location).collect());
    }
    // (job key, a description) per readable candidate.
    let mut jobs: Vec<(String, String)> = Vec::new();
    let mut keyed: Vec<(CheckpointListing, Option<String>)> = Vec::new();
    for l in listings {
        let key = match storage.read_metadata(&l.location).await {
            Ok(m) => {
                let key = match &m.fingerprint {
                    Some(f) => format!("{:032x}/{:?}", f.graph_hash(), f.sources),
                    None => format!("name:{}", m.job_name),
                };
                if !jobs.iter().any(|(k, _)| *k == key) {
                    let sources: Vec<String> = m
                        .fingerprint
                        .iter()
                        .flat_map(|f| f.sources.iter().map(|(k, v)| format!("{k}={v}")))
                        .collect();
                    jobs.push((
                        key.clone(),
                        format!(
                            "'{}' ({}newest: {})",
                            m.job_name,
                            if sources.is_empty() {
                                String::new()
                            } else {
                                format!("{}; ", sources.join(", "))
                            },
                            storage.location_path(&l.location)
                        ),
                    ));
                }
                Some(key)
            }
            Err(_) => None,
        };
        keyed.push((l, key));
    }
    if jobs.len() > 1 {
        let list: Vec<&str> = jobs.iter().map(|(_, d)| d.as_str()).collect();
        return Err(JobError::Restore {
            path: path.display().to_string(),
            reason: format!(
                "it holds checkpoints of {} different jobs: {}; name the checkpoint directory \
                 to restore (--from <root>/<job-id>/chk-<n>)",
                jobs.len(),
                list.join(", ")
            ),
        });
    }
    let Some((key, _)) = jobs.first() else {
        // Nothing readable: the restore reports each one's damage.
        return Ok(keyed.into_iter().map(|(l, _)| l.location).collect());
    };
    let job_dirs: Vec<Option<JobId>> = keyed
        .iter()
        .filter(|(_, k)| k.as_ref() == Some(key))
        .map(|(l, _)| l.location.job_id())
        .collect();
    Ok(keyed
        .into_iter()
        .filter(|(l, k)| match k {
            Some(k) => k == key,
            None => job_dirs.contains(&l.location.job_id()),
        })
        .map(|(l, _)| l.location)
        .collect())
}

/// What a restore must check of a checkpoint besides its files: that it is of this job.
pub(crate) struct RestoreChecks<'a> {
    /// The fingerprint of the job about to restore.
    pub fingerprint: &'a JobFingerprint,
    /// Drop state of operators the job no longer has.
    pub allow_non_restored_state: bool,
    /// Restore although the source settings differ.
    pub allow_changed_sources: bool,
    /// Whether the subtasks download the sections of canonical keyed snapshots themselves
    /// (the job's state backend keeps files: [`weir_state::StateBackend::local_dir`]), so that
    /// a savepoint larger than memory restores; else the master reads and checks them.
    pub subtasks_fetch_sections: bool,
    /// The restore point's storage root as a location task managers open it from, when it is
    /// not the job's own storage (see [`candidates_at`]).
    pub storage_location: Option<String>,
}

impl RestoreChecks<'_> {
    /// Refuses a checkpoint of another job: an operator whose kind or key groups changed, or
    /// other source settings (unless allowed). A user error, not corruption: no fallback.
    fn check_job(&self, point: &RestorePoint) -> Result<(), JobError> {
        let Some(recorded) = &point.metadata.fingerprint else {
            warn!(checkpoint = %point.describe(), "the checkpoint predates job fingerprints (format version {}); its job and source settings cannot be checked", point.metadata.format_version);
            return Ok(());
        };
        let diff = self.fingerprint.diff(recorded);
        let mut refused = diff.graph.clone();
        if !diff.sources.is_empty() {
            if self.allow_changed_sources {
                warn!(checkpoint = %point.describe(), differences = %diff.sources.join("; "), "restoring with changed source settings (allow_changed_sources)");
            } else {
                refused.extend(diff.sources.iter().cloned());
            }
        }
        if refused.is_empty() {
            return Ok(());
        }
        let hint = if diff.sources.is_empty() || self.allow_changed_sources {
            String::new()
        } else {
            "; a replay with other source settings reads other records, so the results would be \
             wrong: restore with the settings of the checkpoint, or allow changed sources \
             (--allow-changed-sources) if the sources replay the same records"
                .to_string()
        };
        Err(JobError::Restore {
            path: point.describe(),
            reason: format!(
                "the checkpoint is of another job: {}{hint}",
                refused.join("; ")
            ),
        })
    }
}

/// Loads each candidate newest first, falling back past corrupt ones (with a warning that names
/// the file), and returns the restore contexts of the first that loads entirely.
pub(crate) async fn load_first_good(
    storage: Arc<dyn CheckpointStorage>,
    candidates: &[CheckpointLocation],
    job: &JobGraph,
    checks: &RestoreChecks<'_>,
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
            // Damage first (a swapped `_metadata` falls back), then whether it is this job's.
            let problems = verify::metadata_problems(&point.location, &point.metadata);
            if let Some(first) = problems.first() {
                let more = match problems.len() {
                    1 => String::new(),
                    n => format!(" (and {} more problems)", n - 1),
                };
                return Err(corrupt(
                    point.location.metadata_path(),
                    format!("{first}{more}"),
                ));
            }
            checks.check_job(&point)?;
            let contexts = assign(&point, job, checks).await?;
            Ok::<_, JobError>((point, contexts))
        };
        match attempt.await {
            Ok(found) => return Ok(found),
            // A checkpoint that does not fit the job is a user error, not corruption.
            Err(e @ JobError::Restore { .. }) => return Err(e),
            // A storage error the storage calls temporary says nothing of the checkpoint: the
            // restore is retried (by the restart strategy), never moved to an older checkpoint,
            // whose successors' transactions sinks may have committed (found by the simulation,
            // seed 95).
            Err(e) if matches!(&e, JobError::Storage(c) if c.is_temporary()) => return Err(e),
            Err(e) => {
                weir_core::sim::observe(weir_core::sim::Observed::Unusable {
                    checkpoint: location.dir.clone(),
                    reason: e.to_string(),
                });
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

/// Assigns a checkpoint's state to every subtask of `job`, after the verifier's checks
/// ([`crate::verify`]) of `_metadata` and of every file read: a damaged, foreign or swapped
/// file is a corrupt checkpoint, so the caller falls back to the previous one.
pub(crate) async fn assign(
    point: &RestorePoint,
    job: &JobGraph,
    checks: &RestoreChecks<'_>,
) -> Result<HashMap<(VertexId, SubtaskIndex), RestoreContext>, JobError> {
    let allow_non_restored_state = checks.allow_non_restored_state;
    let meta = &point.metadata;
    let restore_error = |reason: String| JobError::Restore {
        path: point.describe(),
        reason,
    };
    verify_keyed_frames(point).await?;
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
        let old_blobs = read_operator_state(point, op).await?;
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
                native: Vec::new(),
            };
            for (&old, state) in &op.subtasks {
                for h in &state.keyed {
                    if let Some(r) = read_keyed(point, op, h, &range, checks).await? {
                        restored.keyed.push(r);
                    }
                }
                for h in &state.native {
                    if let Some(r) = read_native(point, op, old, h, &range).await? {
                        restored.native.push(r);
                    }
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
        let bytes = point
            .storage
            .read_state(&point.location, &entry.handle.stream, None)
            .await?;
        let expected = verify::expected(
            meta,
            entry.operator_id,
            entry.subtask,
            None,
            StateFileKind::ChannelState,
        );
        let file = file_of(point, &entry.handle.stream);
        let at =
            verify::open_file(meta, &bytes, &expected).map_err(|r| corrupt(file.clone(), r))?;
        // Every batch is decoded now: a corrupt checkpoint is skipped here, before deployment.
        let sections = verify::check_channel_payload(&entry.handle.sections, &bytes[at..], 1)
            .map_err(|e| corrupt(file, e.join("; ")))?;
        if let Some(ctx) = contexts.get_mut(&(vertex.id, entry.subtask)) {
            ctx.in_flight.extend(sections);
        }
    }
    Ok(())
}
