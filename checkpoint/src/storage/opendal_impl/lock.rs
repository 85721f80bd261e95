//! The job directory's lock files: one per generation (`_lock`, `_lock.<n>`), taken by a
//! conditional create, renewed, read back and released.

use super::OpendalCheckpointStorage;
use crate::CheckpointError;
use crate::storage::{CheckpointStorage, JobLock};
use opendal::ErrorKind;
use tracing::debug;
use weir_core::ids::JobId;

/// The file a run holds its job directory with, for a generation: `_lock` for the first holder,
/// `_lock.<n>` for the n-th that took the directory over.
fn lock_file(generation: u64) -> String {
    match generation {
        0 => "_lock".to_string(),
        n => format!("_lock.{n}"),
    }
}

/// The generation of a lock file's name (the inverse of [`lock_file`]).
fn parse_lock_file(name: &str) -> Option<u64> {
    match name.strip_prefix("_lock")? {
        "" => Some(0),
        rest => {
            let digits = rest.strip_prefix('.')?;
            let n: u64 = digits.parse().ok()?;
            (n > 0 && format!(".{n}") == rest).then_some(n)
        }
    }
}

/// At most this many characters of a lock file are read back.
const MAX_LOCK_CONTENT: usize = 1000;

/// The first line of a lock's content (who holds it), shortened for messages.
fn lock_holder_line(content: &str) -> String {
    content
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

impl OpendalCheckpointStorage {
    /// `CheckpointStorage::read_lock` for this storage.
    pub(super) async fn read_newest_lock(
        &self,
        job: JobId,
    ) -> Result<Option<JobLock>, CheckpointError> {
        let dir = format!("{job}/");
        let newest = self
            .list_children(&dir)
            .await?
            .into_iter()
            .filter(|(_, is_dir)| !is_dir)
            .filter_map(|(name, _)| parse_lock_file(&name))
            .max();
        let Some(generation) = newest else {
            return Ok(None);
        };
        let path = format!("{dir}{}", lock_file(generation));
        match self.op.read(&path).await {
            Ok(b) => Ok(Some(JobLock {
                generation,
                content: String::from_utf8_lossy(&b.to_vec())
                    .chars()
                    .take(MAX_LOCK_CONTENT)
                    .collect(),
            })),
            // Released between the listing and the read.
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.storage_err(&path)(e)),
        }
    }

    /// `CheckpointStorage::take_lock` for this storage.
    pub(super) async fn take_lock_generation(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        let dir = format!("{job}/");
        let path = format!("{dir}{}", lock_file(generation));
        if self.create_dirs {
            self.op
                .create_dir(&dir)
                .await
                .map_err(self.storage_err(&dir))?;
        }
        match self
            .op
            .write_with(&path, content.as_bytes().to_vec())
            .if_not_exists(true)
            .await
        {
            Ok(_) => {
                debug!(path = %self.full_path(&path), generation, "took the job directory");
                Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConditionNotMatch | ErrorKind::AlreadyExists
                ) =>
            {
                let holder = match self.op.read(&path).await {
                    Ok(b) => lock_holder_line(&String::from_utf8_lossy(&b.to_vec())),
                    Err(_) => "unknown holder".to_string(),
                };
                Err(CheckpointError::Locked {
                    path: self.full_path(&dir).trim_end_matches('/').to_string(),
                    holder,
                })
            }
            Err(e) => Err(self.storage_err(&path)(e)),
        }
    }

    /// `CheckpointStorage::renew_lock` for this storage.
    pub(super) async fn renew_lock_generation(
        &self,
        job: JobId,
        generation: u64,
        content: &str,
    ) -> Result<(), CheckpointError> {
        let dir = format!("{job}/");
        let lost = |by: String| CheckpointError::LockLost {
            path: self.full_path(&dir).trim_end_matches('/').to_string(),
            by,
        };
        // Taken over? The newest generation decides, before and after the write.
        match self.read_lock(job).await? {
            Some(l) if l.generation > generation => return Err(lost(lock_holder_line(&l.content))),
            Some(l) if l.generation == generation => {}
            _ => return Err(lost("nobody: the lock file is gone".into())),
        }
        let path = format!("{dir}{}", lock_file(generation));
        self.op
            .write(&path, content.as_bytes().to_vec())
            .await
            .map_err(self.storage_err(&path))?;
        match self.read_lock(job).await? {
            Some(l) if l.generation > generation => Err(lost(lock_holder_line(&l.content))),
            _ => Ok(()),
        }
    }

    /// `CheckpointStorage::release_lock` for this storage.
    pub(super) async fn release_lock_generations(
        &self,
        job: JobId,
        generation: u64,
    ) -> Result<(), CheckpointError> {
        let dir = format!("{job}/");
        let children = self.list_children(&dir).await?;
        // Taken over: the older lock files stay, so no later run takes generation 0 beside the
        // new holder without watching its lease first.
        let newest = children
            .iter()
            .filter(|(_, is_dir)| !is_dir)
            .filter_map(|(name, _)| parse_lock_file(name))
            .max();
        if newest.is_some_and(|n| n > generation) {
            return Ok(());
        }
        for (name, is_dir) in children {
            if is_dir || parse_lock_file(&name).is_none_or(|g| g > generation) {
                continue;
            }
            let path = format!("{dir}{name}");
            match self.op.delete(&path).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(self.storage_err(&path)(e)),
            }
        }
        Ok(())
    }
}
