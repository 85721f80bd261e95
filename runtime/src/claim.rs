//! Claim mode and checkpoint garbage: which files of a job directory no kept checkpoint needs
//! (a pure plan over a listing), and carrying a plan out, for a run that claims the checkpoint it
//! restores from and for `weir checkpoints gc`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tracing::{info, warn};
use weir_checkpoint::storage::{
    CheckpointListing, SHARED_DIR_FROM_LOCATION, is_shared, parse_checkpoint_dir,
};
use weir_checkpoint::{CheckpointError, CheckpointLocation, CheckpointStorage};
use weir_core::ids::{CheckpointId, JobId};

use crate::lease::{self, LeaseKeeper, Liveness, LockContent};

/// What one job directory holds, read off a listing of its files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirListing {
    /// Every `chk-<n>` directory, and whether it holds `_metadata` (complete).
    pub checkpoints: BTreeMap<CheckpointId, bool>,
    /// The names in `shared/`.
    pub shared: BTreeSet<String>,
    /// Files that are neither checkpoints, shared files nor locks: never deleted.
    pub other: Vec<String>,
}

impl DirListing {
    /// Reads `files` (paths relative to the root, as `list_files` gives them) of `job`'s
    /// directory.
    pub fn of(job: JobId, files: &[String]) -> DirListing {
        let prefix = format!("{job}/");
        let mut out = DirListing::default();
        for path in files {
            let Some(rel) = path.strip_prefix(&prefix) else {
                continue;
            };
            let (first, rest) = rel.split_once('/').unwrap_or((rel, ""));
            if let Some(id) = parse_checkpoint_dir(first) {
                let complete = out.checkpoints.entry(id).or_insert(false);
                *complete |= rest == "_metadata";
            } else if first == "shared" && !rest.is_empty() && !rest.contains('/') {
                out.shared.insert(rest.to_string());
            } else if rest.is_empty() && first.starts_with("_lock") {
                // The lock: taken and released by its holder, never planned.
            } else {
                out.other.push(path.clone());
            }
        }
        out
    }

    /// Adds the checkpoint directories `listings` names in `job`'s directory: an empty
    /// directory (a checkpoint killed before its first file) has no file to list.
    pub fn add_checkpoints(&mut self, job: JobId, listings: &[CheckpointListing]) {
        for l in listings.iter().filter(|l| l.location.job_id() == Some(job)) {
            let complete = self.checkpoints.entry(l.id).or_insert(false);
            *complete |= l.complete;
        }
    }

    /// The complete checkpoints.
    pub fn complete(&self) -> impl Iterator<Item = CheckpointId> + '_ {
        self.checkpoints
            .iter()
            .filter(|(_, c)| **c)
            .map(|(id, _)| *id)
    }
}

/// What to delete in one job directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DirPlan {
    /// Checkpoint directories to delete whole, with whether each was complete.
    pub checkpoints: Vec<(CheckpointId, bool)>,
    /// Shared files no kept checkpoint references (names in `shared/`).
    pub shared: Vec<String>,
    /// Nothing is left once the plan is carried out: the directory itself can go.
    pub empties_dir: bool,
}

impl DirPlan {
    /// Whether there is nothing to delete.
    pub fn is_empty(&self) -> bool {
        self.checkpoints.is_empty() && self.shared.is_empty() && !self.empties_dir
    }
}

/// Plans a job directory: every checkpoint directory that `keep` refuses goes, and every
/// shared file that `referenced` (the kept checkpoints' shared files) does not name. With
/// `referenced` unknown (a kept `_metadata` could not be read), every shared file stays: a file
/// a complete checkpoint may need is never deleted.
pub(crate) fn plan_dir(
    listing: &DirListing,
    keep: impl Fn(CheckpointId, bool) -> bool,
    referenced: Option<&BTreeSet<String>>,
) -> DirPlan {
    let checkpoints: Vec<(CheckpointId, bool)> = listing
        .checkpoints
        .iter()
        .filter(|(id, complete)| !keep(**id, **complete))
        .map(|(id, c)| (*id, *c))
        .collect();
    let shared: Vec<String> = match referenced {
        Some(r) => listing
            .shared
            .iter()
            .filter(|n| !r.contains(*n))
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    let empties_dir = checkpoints.len() == listing.checkpoints.len()
        && shared.len() == listing.shared.len()
        && listing.other.is_empty();
    DirPlan {
        checkpoints,
        shared,
        empties_dir,
    }
}

/// The shared files the checkpoints `ids` of `job` reference, by name; `None` when one of their
/// `_metadata`s cannot be read.
pub(crate) async fn referenced_shared(
    storage: &dyn CheckpointStorage,
    job: JobId,
    ids: impl IntoIterator<Item = CheckpointId>,
) -> Option<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for id in ids {
        let location = CheckpointLocation::for_checkpoint(job, id);
        match storage.read_metadata(&location).await {
            Ok(m) => names.extend(m.handles().filter(|h| is_shared(h)).filter_map(|h| {
                h.path()?
                    .strip_prefix(SHARED_DIR_FROM_LOCATION)
                    .map(str::to_string)
            })),
            Err(e) => {
                warn!(checkpoint = %storage.location_path(&location), error = %e, "cannot read a kept checkpoint's _metadata: its directory's shared files all stay");
                return None;
            }
        }
    }
    Some(names)
}

/// Carries a plan out: checkpoint directories, then shared files. A plan that empties the
/// directory leaves its lock: the caller deletes the directory while it still holds it
/// ([`discard_dir`]).
pub(crate) async fn apply(
    storage: &dyn CheckpointStorage,
    job: JobId,
    plan: &DirPlan,
) -> Result<(), CheckpointError> {
    for (id, _) in &plan.checkpoints {
        storage
            .discard(&CheckpointLocation::for_checkpoint(job, *id))
            .await?;
    }
    for name in &plan.shared {
        storage.delete_file(&format!("{job}/shared/{name}")).await?;
    }
    Ok(())
}

/// Deletes the job directory `job` whole, lock included, if the lock's newest generation is
/// still `generation` (the caller's, no longer renewed): a directory taken over meanwhile stays.
pub(crate) async fn discard_dir(
    storage: &dyn CheckpointStorage,
    job: JobId,
    generation: u64,
) -> Result<bool, CheckpointError> {
    match storage.read_lock(job).await? {
        Some(l) if l.generation == generation => {
            storage
                .discard(&CheckpointLocation {
                    dir: format!("{job}/"),
                })
                .await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// A run that leaves nothing in its own job directory (no checkpoint retained or begun, no shared
/// file) deletes it, lock included, while it still holds it: it stops renewing first, and
/// [`discard_dir`] checks that the lock is still `generation`.
pub(crate) async fn leave_if_empty(
    storage: &dyn CheckpointStorage,
    job: JobId,
    generation: u64,
    keeper: &LeaseKeeper,
) {
    let mut forgotten = false;
    let result = async {
        let mut listing = DirListing::of(job, &storage.list_files(&format!("{job}/")).await?);
        listing.add_checkpoints(job, &storage.list_checkpoints(job).await?);
        if listing != DirListing::default() {
            return Ok(false);
        }
        keeper.forget(job).await;
        forgotten = true;
        crate::lease::retrying(|| discard_dir(storage, job, generation)).await
    }
    .await;
    if let Err(e) = &result {
        warn!(%job, error = %e, "cannot remove the empty job directory");
    }
    // The keeper no longer holds the lock, and the directory is not (all) gone: as when a retry
    // found an older lock generation after the first attempt deleted ours. Give every lock of
    // this generation and older up here, as the keeper's release would have (idempotent).
    if forgotten
        && !matches!(result, Ok(true))
        && let Err(e) = crate::lease::retrying(|| storage.release_lock(job, generation)).await
    {
        warn!(%job, error = %e, "cannot give the job directory up");
    }
}

/// The job directories under a storage root (the first segment of `files`), with their files.
pub(crate) fn job_dirs(files: &[String]) -> BTreeMap<JobId, Vec<String>> {
    let mut out: BTreeMap<JobId, Vec<String>> = BTreeMap::new();
    for f in files {
        if let Some(job) = f.split('/').next().and_then(JobId::parse) {
            out.entry(job).or_default().push(f.clone());
        }
    }
    out
}

/// A run's claim (claim mode): the job directories of the runs it descends from, taken over,
/// and the checkpoint it restored from until its own checkpoints subsume it.
pub(crate) struct Claim {
    storage: Arc<dyn CheckpointStorage>,
    /// The claimed directories, with the generation of their lock this run holds.
    dirs: Vec<(JobId, u64)>,
    restored: Option<(JobId, CheckpointId)>,
}

impl Claim {
    /// Takes over the lineage: the job directories holding `candidates` (one job's checkpoints,
    /// as the restore narrowed them) and those holding no complete checkpoint at all (runs killed
    /// before their first), other than `own`. A directory whose lock is renewed within its lease
    /// belongs to a running job and is left alone. Returns the claim and the locks taken, for
    /// the run's lease keeper.
    pub async fn start(
        storage: Arc<dyn CheckpointStorage>,
        candidates: &[CheckpointLocation],
        own: JobId,
        content: &LockContent,
    ) -> Result<(Claim, Vec<(JobId, u64)>), CheckpointError> {
        let files = storage.list_files("").await?;
        let mut lineage: BTreeSet<JobId> = candidates.iter().filter_map(|l| l.job_id()).collect();
        for (job, files) in job_dirs(&files) {
            if DirListing::of(job, &files).complete().next().is_none() {
                lineage.insert(job);
            }
        }
        lineage.remove(&own);
        let lineage: Vec<JobId> = lineage.into_iter().collect();
        let seen = lease::observe(&*storage, &lineage).await?;
        let mut dirs = Vec::new();
        let mut taken = Vec::new();
        for (job, liveness) in &seen {
            if let Liveness::Held { holder } = liveness {
                warn!(%job, %holder, "not claimed: a running job holds this job directory");
                continue;
            }
            match lease::take_over(&*storage, *job, liveness, content).await {
                Ok(Some(generation)) => {
                    dirs.push((*job, generation));
                    taken.push((*job, generation));
                }
                Ok(None) => {}
                // One directory that cannot be taken (a file named like a job, a storage error)
                // does not stop the run: it is left alone.
                Err(e) => {
                    warn!(%job, error = %e, "not claimed: cannot take the job directory over")
                }
            }
        }
        info!(
            claimed = dirs.len(),
            "claimed the job directories of earlier runs"
        );
        Ok((
            Claim {
                storage,
                dirs,
                restored: None,
            },
            taken,
        ))
    }

    /// The run restored from `location`: every claimed directory keeps only that checkpoint and
    /// the complete ones newer than it (which the restore skipped as damaged: left to inspect);
    /// the rest goes. A directory left empty goes whole, its lock with it.
    pub async fn restored(&mut self, location: &CheckpointLocation, keeper: &LeaseKeeper) {
        let (Some(job), Some(id)) = (location.job_id(), location.checkpoint_id()) else {
            return;
        };
        if self.dirs.iter().any(|(d, _)| *d == job) {
            self.restored = Some((job, id));
        } else {
            warn!(checkpoint = %self.storage.location_path(location), "the restored checkpoint is not claimed: its job directory is held by a running job");
        }
        for (dir, _) in self.dirs.clone() {
            self.clean(dir, |c| c >= id, keeper).await;
        }
    }

    /// The run's own retained checkpoints subsume the restored one: it goes, with what only it
    /// needed.
    pub async fn subsume(&mut self, keeper: &LeaseKeeper) {
        let Some((job, id)) = self.restored.take() else {
            return;
        };
        info!(checkpoint = %self.storage.location_path(&CheckpointLocation::for_checkpoint(job, id)), "the claimed checkpoint is subsumed: deleting it");
        self.clean(job, |c| c > id, keeper).await;
    }

    /// Deletes what of `job`'s directory no checkpoint that `keep` keeps needs.
    async fn clean(
        &mut self,
        job: JobId,
        keep: impl Fn(CheckpointId) -> bool,
        keeper: &LeaseKeeper,
    ) {
        let result = async {
            let files = self.storage.list_files(&format!("{job}/")).await?;
            let mut listing = DirListing::of(job, &files);
            listing.add_checkpoints(job, &self.storage.list_checkpoints(job).await?);
            let kept: Vec<CheckpointId> = listing.complete().filter(|id| keep(*id)).collect();
            let referenced = referenced_shared(&*self.storage, job, kept.iter().copied()).await;
            let plan = plan_dir(&listing, |id, complete| complete && keep(id), referenced.as_ref());
            apply(&*self.storage, job, &plan).await?;
            if plan.empties_dir {
                let generation = self
                    .dirs
                    .iter()
                    .find(|(d, _)| *d == job)
                    .map_or(0, |(_, g)| *g);
                keeper.forget(job).await;
                self.dirs.retain(|(d, _)| *d != job);
                discard_dir(&*self.storage, job, generation).await?;
            }
            info!(%job, checkpoints = plan.checkpoints.len(), shared = plan.shared.len(), whole = plan.empties_dir, "deleted what the claimed job directory no longer needs");
            Ok::<_, CheckpointError>(())
        }
        .await;
        if let Err(e) = result {
            warn!(%job, error = %e, "cannot delete what a claimed job directory no longer needs; `weir checkpoints gc` can, later");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(job: JobId, rel: &[&str]) -> Vec<String> {
        rel.iter().map(|r| format!("{job}/{r}")).collect()
    }

    #[test]
    fn a_listing_sorts_checkpoints_shared_files_locks_and_the_rest() {
        let job = JobId(7);
        let l = DirListing::of(
            job,
            &files(
                job,
                &[
                    "_lock",
                    "_lock.2",
                    "chk-3/_metadata",
                    "chk-3/k",
                    "chk-4/k",
                    "shared/a",
                    "shared/b",
                    "notes.txt",
                ],
            ),
        );
        assert_eq!(
            l.checkpoints,
            BTreeMap::from([(CheckpointId(3), true), (CheckpointId(4), false)])
        );
        assert_eq!(l.shared, BTreeSet::from(["a".to_string(), "b".to_string()]));
        assert_eq!(l.other, vec![format!("{job}/notes.txt")]);
        assert_eq!(l.complete().collect::<Vec<_>>(), [CheckpointId(3)]);
    }

    #[test]
    fn a_plan_keeps_what_kept_checkpoints_need_and_never_guesses() {
        let job = JobId(7);
        let l = DirListing::of(
            job,
            &files(
                job,
                &[
                    "chk-1/_metadata",
                    "chk-2/x",
                    "chk-3/_metadata",
                    "shared/a",
                    "shared/b",
                ],
            ),
        );
        // Keep complete checkpoints (gc): the incomplete one and the unreferenced file go.
        let refs = BTreeSet::from(["a".to_string()]);
        let p = plan_dir(&l, |_, complete| complete, Some(&refs));
        assert_eq!(p.checkpoints, [(CheckpointId(2), false)]);
        assert_eq!(p.shared, ["b"]);
        assert!(!p.empties_dir);
        // A kept _metadata that cannot be read: no shared file is deleted.
        let p = plan_dir(&l, |_, complete| complete, None);
        assert!(p.shared.is_empty());
        // Keep nothing: the directory goes whole.
        let p = plan_dir(&l, |_, _| false, Some(&BTreeSet::new()));
        assert_eq!(p.checkpoints.len(), 3);
        assert!(p.empties_dir);
        // A file of unknown kind keeps the directory.
        let mut other = l.clone();
        other.other.push("x".into());
        assert!(!plan_dir(&other, |_, _| false, Some(&BTreeSet::new())).empties_dir);
        // Nothing to do.
        let p = plan_dir(
            &l,
            |_, _| true,
            Some(&BTreeSet::from(["a".into(), "b".into()])),
        );
        assert!(p.is_empty());
    }

    #[test]
    fn job_dirs_group_by_the_first_segment_and_skip_other_names() {
        let (a, b) = (JobId(1), JobId(2));
        let mut all = files(a, &["_lock", "chk-1/_metadata"]);
        all.extend(files(b, &["shared/x"]));
        all.push("savepoint-x/_metadata".into());
        let dirs = job_dirs(&all);
        assert_eq!(dirs.keys().copied().collect::<Vec<_>>(), [a, b]);
        assert_eq!(dirs[&a].len(), 2);
    }
}
