//! `weir checkpoints gc`: what no complete checkpoint under a root needs (incomplete checkpoint
//! directories, unreferenced shared files, job directories of runs killed before their first
//! checkpoint), listed, and deleted with `--delete`, in job directories no running job holds.

use crate::claim::{
    DirListing, DirPlan, apply, discard_dir, job_dirs, plan_dir, referenced_shared,
};
use crate::lease::{self, LeaseKeeper, Liveness, LockContent};
use serde::Serialize;
use std::sync::Arc;
use weir_checkpoint::{CheckpointError, CheckpointStorage};
use weir_core::ids::JobId;

/// One thing `gc` found.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct GcItem {
    /// `INCOMPLETE` (a checkpoint directory without `_metadata`), `UNREFERENCED` (a shared file
    /// no complete checkpoint references) or `EMPTY-JOB` (a job directory with no complete
    /// checkpoint, deleted whole).
    pub kind: &'static str,
    /// Where, as a local path or `s3://` URL.
    pub path: String,
}

/// What `gc` found and did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GcReport {
    /// The root.
    pub root: String,
    /// What no complete checkpoint needs.
    pub garbage: Vec<GcItem>,
    /// Job directories left alone, with why (held by a running job; a `_metadata` unreadable, so
    /// its shared files all stay).
    pub skipped: Vec<String>,
    /// Whether the garbage was deleted.
    pub deleted: bool,
}

/// Finds (and with `delete`, deletes) the garbage under the checkpoint root of `storage`;
/// `display` shows a path relative to the root as the user knows it. Locked job directories are
/// watched for one lease first: one whose lock is renewed belongs to a running job and is
/// skipped.
pub async fn gc(
    storage: Arc<dyn CheckpointStorage>,
    display: &dyn Fn(&str) -> String,
    delete: bool,
) -> Result<GcReport, CheckpointError> {
    let files = storage.list_files("").await?;
    let checkpoints = storage.find_checkpoints("").await?;
    let mut dirs = job_dirs(&files);
    for l in &checkpoints {
        if let Some(job) = l.location.job_id() {
            dirs.entry(job).or_default();
        }
    }
    let jobs: Vec<JobId> = dirs.keys().copied().collect();
    let seen = lease::observe(&*storage, &jobs).await?;
    let mut report = GcReport {
        root: display(""),
        deleted: delete,
        ..GcReport::default()
    };
    let content = LockContent {
        holder: format!("weir checkpoints gc, process {}", std::process::id()),
        lease: lease::DEFAULT_JOB_LOCK_LEASE,
        renewal: 0,
    };
    for (job, files) in &dirs {
        let liveness = &seen[job];
        if let Liveness::Held { holder } = liveness {
            report.skipped.push(format!(
                "{}: held by a running job ({holder})",
                display(&job.to_string())
            ));
            continue;
        }
        let mut listing = DirListing::of(*job, files);
        listing.add_checkpoints(*job, &checkpoints);
        let complete: Vec<_> = listing.complete().collect();
        let referenced = referenced_shared(&*storage, *job, complete.iter().copied()).await;
        if referenced.is_none() && !listing.shared.is_empty() {
            report.skipped.push(format!(
                "{}/shared: a complete checkpoint's _metadata cannot be read, so every shared file stays",
                display(&job.to_string())
            ));
        }
        let plan = plan_dir(&listing, |_, complete| complete, referenced.as_ref());
        if plan.is_empty() {
            continue;
        }
        report.garbage.extend(items(display, *job, &plan));
        if delete && let Err(e) = delete_dir(&storage, *job, liveness, &content, &plan).await {
            report
                .skipped
                .push(format!("{}: {e}", display(&job.to_string())));
        }
    }
    Ok(report)
}

/// Deletes what `plan` names in `job`'s directory while holding it (a lock taken over as judged,
/// renewed throughout), so that no run takes the directory meanwhile; the directory goes whole
/// only if gc still holds it at the end.
async fn delete_dir(
    storage: &Arc<dyn CheckpointStorage>,
    job: JobId,
    liveness: &Liveness,
    content: &LockContent,
    plan: &DirPlan,
) -> Result<(), CheckpointError> {
    let Some(generation) = lease::take_over(&**storage, job, liveness, content).await? else {
        return Err(CheckpointError::Config(
            "taken by another run while gc looked".to_string(),
        ));
    };
    let keeper = LeaseKeeper::start(content.clone());
    keeper.hold(storage.clone(), job, generation).await;
    let result = apply(&**storage, job, plan).await;
    if result.is_ok() && plan.empties_dir {
        keeper.forget(job).await;
        discard_dir(&**storage, job, generation).await?;
    }
    keeper.release().await;
    result
}

/// The report's lines for one directory's plan.
fn items(display: &dyn Fn(&str) -> String, job: JobId, plan: &DirPlan) -> Vec<GcItem> {
    if plan.empties_dir {
        return vec![GcItem {
            kind: "EMPTY-JOB",
            path: display(&job.to_string()),
        }];
    }
    let checkpoints = plan.checkpoints.iter().map(|(id, _)| GcItem {
        kind: "INCOMPLETE",
        path: display(&format!("{job}/chk-{}", id.0)),
    });
    let shared = plan.shared.iter().map(|name| GcItem {
        kind: "UNREFERENCED",
        path: display(&format!("{job}/shared/{name}")),
    });
    checkpoints.chain(shared).collect()
}

/// The report as text.
pub fn render_gc(r: &GcReport) -> String {
    let mut s = String::new();
    for item in &r.garbage {
        s.push_str(&format!("{:<13}{}\n", item.kind, item.path));
    }
    for skipped in &r.skipped {
        s.push_str(&format!("SKIPPED      {skipped}\n"));
    }
    let verb = if r.deleted {
        "deleted"
    } else {
        "found (run with --delete to delete)"
    };
    s.push_str(&format!(
        "gc: {} items no complete checkpoint under {} needs, {verb}\n",
        r.garbage.len(),
        r.root
    ));
    s
}
