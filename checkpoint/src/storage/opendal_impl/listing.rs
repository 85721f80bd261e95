//! Listing what the storage holds (children, `chk-<n>` directories, files) and deleting it
//! (locations, state files, single files).

use super::OpendalCheckpointStorage;
use super::names::{METADATA_FILE, dir_of, last_segment, normalize_dir, parse_chk, resolve};
use crate::CheckpointError;
use crate::storage::{CheckpointListing, CheckpointLocation, CheckpointStorage};
use futures::{StreamExt, TryStreamExt};
use opendal::ErrorKind;
use tracing::debug;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

/// How many `_metadata` stats a listing runs at once.
const LIST_CONCURRENCY: usize = 16;

impl OpendalCheckpointStorage {
    /// The immediate children of directory `dir` (`""` or ending in `/`): each child's name
    /// without a trailing `/`, and whether it is a directory.
    pub(super) async fn list_children(
        &self,
        dir: &str,
    ) -> Result<Vec<(String, bool)>, CheckpointError> {
        let entries = self
            .op
            .list_with(dir)
            .recursive(false)
            .await
            .map_err(self.storage_err(dir))?;
        let mut children = Vec::with_capacity(entries.len());
        for entry in entries {
            let path = entry.path();
            let Some(rest) = path.strip_prefix(dir) else {
                continue;
            };
            let rest = rest.strip_prefix('/').unwrap_or(rest);
            let is_dir = rest.ends_with('/') || entry.metadata().mode().is_dir();
            let name = rest.trim_end_matches('/');
            if name.is_empty() || name.contains('/') {
                // The directory itself, or something deeper that a service returned anyway.
                continue;
            }
            children.push((name.to_string(), is_dir));
        }
        children.sort();
        children.dedup();
        Ok(children)
    }

    /// The `chk-<n>` directories directly under `dir`, with their completeness, sorted by id.
    pub(super) async fn checkpoints_in(
        &self,
        dir: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        let children = self.list_children(dir).await?;
        let candidates: Vec<(CheckpointId, CheckpointLocation)> = children
            .into_iter()
            .filter(|(_, is_dir)| *is_dir)
            .filter_map(|(name, _)| {
                parse_chk(&name).map(|id| {
                    (
                        id,
                        CheckpointLocation {
                            dir: format!("{dir}{name}/"),
                        },
                    )
                })
            })
            .collect();
        let mut listings: Vec<CheckpointListing> = futures::stream::iter(candidates)
            .map(|(id, location)| async move {
                let complete = self.has_metadata(&location).await?;
                Ok::<_, CheckpointError>(CheckpointListing {
                    id,
                    location,
                    complete,
                })
            })
            .buffered(LIST_CONCURRENCY)
            .try_collect()
            .await?;
        listings.sort_by(|a, b| (a.id, &a.location).cmp(&(b.id, &b.location)));
        Ok(listings)
    }

    /// Whether `location` holds a `_metadata` file.
    async fn has_metadata(&self, location: &CheckpointLocation) -> Result<bool, CheckpointError> {
        let path = location.metadata_path();
        match self.op.stat(&path).await {
            Ok(meta) => Ok(meta.mode().is_file()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.storage_err(&path)(e)),
        }
    }

    /// `CheckpointStorage::discard_state` for this storage.
    pub(super) async fn discard_state_file(
        &self,
        location: &CheckpointLocation,
        handle: &StreamStateHandle,
    ) -> Result<(), CheckpointError> {
        let Some(path) = handle.path() else {
            return Ok(());
        };
        let rel = resolve(&dir_of(location), path)?;
        match self.op.delete(&rel).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.storage_err(&rel)(e)),
        }
        debug!(path = %self.full_path(&rel), "discarded state file");
        Ok(())
    }

    /// `CheckpointStorage::discard` for this storage.
    pub(super) async fn discard_location(
        &self,
        location: &CheckpointLocation,
    ) -> Result<(), CheckpointError> {
        let dir = dir_of(location);
        if dir.is_empty() {
            return Err(CheckpointError::Config(format!(
                "refusing to discard the storage root {}",
                self.description
            )));
        }
        // `_metadata` first: from then on the checkpoint is incomplete, so a discard cut short
        // (a killed process) never leaves a complete checkpoint whose files are gone (found by
        // the deterministic simulation, seed 12211).
        let metadata = format!("{dir}{METADATA_FILE}");
        match self.op.delete(&metadata).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.storage_err(&metadata)(e)),
        }
        match self.op.delete_with(&dir).recursive(true).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(self.storage_err(&dir)(e)),
        }
        debug!(location = %self.full_path(&dir), "discarded checkpoint location");
        Ok(())
    }

    /// `CheckpointStorage::list_files` for this storage.
    pub(super) async fn list_files_under(&self, dir: &str) -> Result<Vec<String>, CheckpointError> {
        let dir = normalize_dir(dir)?;
        let entries = match self.op.list_with(&dir).recursive(true).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.storage_err(&dir)(e)),
        };
        let mut files: Vec<String> = entries
            .into_iter()
            .filter(|e| !e.path().ends_with('/') && !e.metadata().mode().is_dir())
            .map(|e| e.path().trim_start_matches('/').to_string())
            .filter(|p| p.starts_with(&dir))
            .collect();
        files.sort();
        files.dedup();
        Ok(files)
    }

    /// `CheckpointStorage::delete_file` for this storage.
    pub(super) async fn delete_one_file(&self, path: &str) -> Result<(), CheckpointError> {
        if path.is_empty() || path.ends_with('/') || path.split('/').any(|s| s == "..") {
            return Err(CheckpointError::Config(format!(
                "cannot delete {path:?}: it is not a file path under the root"
            )));
        }
        match self.op.delete(path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.storage_err(path)(e)),
        }
    }

    /// `CheckpointStorage::find_checkpoints` for this storage.
    pub(super) async fn find_checkpoints_at(
        &self,
        path: &str,
    ) -> Result<Vec<CheckpointListing>, CheckpointError> {
        let dir = normalize_dir(path)?;
        let children = self.list_children(&dir).await?;
        let own_id = parse_chk(last_segment(&dir));

        // The path itself holds `_metadata` (a checkpoint or savepoint directory).
        if children.iter().any(|(n, d)| n == METADATA_FILE && !d) {
            let location = CheckpointLocation { dir };
            let id = match own_id {
                Some(id) => id,
                None => self.read_metadata(&location).await?.checkpoint_id,
            };
            return Ok(vec![CheckpointListing {
                id,
                location,
                complete: true,
            }]);
        }
        // The path is a `chk-<n>` directory without `_metadata`: a partial checkpoint (listed
        // even when empty, as `list_checkpoints` lists an initialised location).
        if let Some(id) = own_id
            && (!children.is_empty()
                || self.op.exists(&dir).await.map_err(self.storage_err(&dir))?)
        {
            return Ok(vec![CheckpointListing {
                id,
                location: CheckpointLocation { dir },
                complete: false,
            }]);
        }
        // Its `chk-<n>` children (a job directory).
        let here = self.checkpoints_in(&dir).await?;
        if !here.is_empty() {
            return Ok(here);
        }
        // The `chk-<n>` of its `<job-id>` children (a storage root).
        let mut all = Vec::new();
        for (name, is_dir) in &children {
            if *is_dir && JobId::parse(name).is_some() {
                all.extend(self.checkpoints_in(&format!("{dir}{name}/")).await?);
            }
        }
        all.sort_by(|a, b| (a.id, &a.location).cmp(&(b.id, &b.location)));
        Ok(all)
    }
}
