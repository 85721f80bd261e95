//! Puts the files of a subtask's keyed snapshots on local disk before it opens: native ones (Flink's
//! local recovery, `execution.state-recovery.from-local`): the subtask's local-recovery copy
//! where one is present and sound, else a download from checkpoint storage in bounded ranges,
//! checked on the way (size, digest, identity frame). A damaged download makes the checkpoint
//! unusable ([`TaskError::UnusableCheckpoint`]); a damaged local copy is only a download more.

use super::TaskEnv;
use crate::error::TaskError;
use crate::operator::{KeyedSections, NativeSource, RestoreContext};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::{info, warn};
use weir_checkpoint::{CheckpointLocation, CheckpointStorage};
use weir_core::handle::{NativeFileHandle, StreamStateHandle};
use weir_core::identity::{DigestHasher, ExpectedIdentity};

/// How much of a file one read from checkpoint storage fetches: a download holds no more than
/// this in memory, whatever the file's size.
pub(crate) const DOWNLOAD_RANGE: u64 = 8 << 20;

/// Counts of where restored native files came from, over all attempts (Flink reports local
/// recovery the same way: which state came from local disk).
#[derive(Debug, Default)]
pub(crate) struct RestoreFileCounts {
    /// Files a subtask took from its local-recovery copy.
    pub local_files: AtomicU64,
    /// Bytes of those.
    pub local_bytes: AtomicU64,
    /// Files downloaded from checkpoint storage.
    pub downloaded_files: AtomicU64,
    /// Bytes of those (payloads, without identity frames).
    pub downloaded_bytes: AtomicU64,
    /// Local copies refused by the state backend's check (then downloaded).
    pub local_refused: AtomicU64,
    /// Small files kept inline in `_metadata` (nothing to download).
    pub inline_files: AtomicU64,
    /// Canonical keyed snapshots (savepoints) whose sections were downloaded for a backend
    /// that reads them from local disk.
    pub canonical_files: AtomicU64,
    /// Bytes of those sections.
    pub canonical_bytes: AtomicU64,
}

impl RestoreFileCounts {
    /// The counts now.
    pub(crate) fn read(&self) -> crate::local_recovery::RestoreFiles {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        crate::local_recovery::RestoreFiles {
            local_files: get(&self.local_files),
            local_bytes: get(&self.local_bytes),
            downloaded_files: get(&self.downloaded_files),
            downloaded_bytes: get(&self.downloaded_bytes),
            local_refused: get(&self.local_refused),
            inline_files: get(&self.inline_files),
            canonical_files: get(&self.canonical_files),
            canonical_bytes: get(&self.canonical_bytes),
        }
    }
}

/// Removes a restore's downloads when dropped (after the open, when the backend holds links or
/// open files).
pub(crate) struct Downloads(Option<PathBuf>);

impl Downloads {
    /// The restore's download directory under `state_dir`, created on first use.
    fn dir(&mut self, state_dir: &Path, env: &TaskEnv) -> Result<PathBuf, TaskError> {
        static DOWNLOADS: AtomicU64 = AtomicU64::new(0);
        if let Some(d) = &self.0 {
            return Ok(d.clone());
        }
        std::fs::create_dir_all(state_dir).map_err(|e| io_error(env, "create", state_dir, e))?;
        // A directory of its own, even when another process with the same id (in another pid
        // namespace) shares the state directory, or a dead one left its downloads there.
        loop {
            let n = DOWNLOADS.fetch_add(1, Ordering::Relaxed);
            let d = state_dir.join(format!("restore-p{}-{n}", std::process::id()));
            match std::fs::create_dir(&d) {
                Ok(()) => {
                    self.0 = Some(d.clone());
                    return Ok(d);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_error(env, "create", &d, e)),
            }
        }
    }
}

impl Drop for Downloads {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Turns every native file source of `restore` into a local file.
pub(crate) async fn fetch_native(
    restore: &mut RestoreContext,
    env: &TaskEnv,
) -> Result<Downloads, TaskError> {
    let mut downloads = Downloads(None);
    let needed = restore.operators.values().any(|o| !o.native.is_empty());
    // A backend without a directory cannot take native files: the open says so.
    let Some(state_dir) = env.state_backend.local_dir().filter(|_| needed) else {
        return Ok(downloads);
    };
    let local = crate::local_recovery::local_recovery_dir(&state_dir, env.job_id, env.task);
    let counts = &env.metrics.restore_files;
    for (&operator, state) in restore.operators.iter_mut() {
        for r in &mut state.native {
            if r.storage.is_none()
                && let Ok(mut chains) = env.chains.lock()
            {
                let used = r.handle.files.iter().zip(&r.files);
                chains
                    .native
                    .restored(operator, used.filter(|(_, s)| s.is_some()).map(|(f, _)| f));
            }
            let storage = r.storage.clone().unwrap_or_else(|| env.storage.clone());
            let location = CheckpointLocation {
                dir: r.location_dir.clone(),
            };
            for (f, source) in r.handle.files.iter().zip(r.files.iter_mut()) {
                let Some(taken) = source.take() else {
                    continue;
                };
                let dir = downloads.dir(&state_dir, env)?;
                let target = dir.join(format!(
                    "{}@{}-{}",
                    f.name, f.key_groups.start, f.key_groups.end
                ));
                *source = Some(match taken {
                    NativeSource::Local { path, size } => NativeSource::Local { path, size },
                    NativeSource::Fetched(bytes) => {
                        std::fs::write(&target, &bytes)
                            .map_err(|e| io_error(env, "write", &target, e))?;
                        NativeSource::Local {
                            path: target,
                            size: bytes.len() as u64,
                        }
                    }
                    NativeSource::Stored { stream, expected } => {
                        if let Some(found) = local_copy(env, &local, &stream, f, &r.handle.format) {
                            counts.local_files.fetch_add(1, Ordering::Relaxed);
                            counts.local_bytes.fetch_add(found.1, Ordering::Relaxed);
                            NativeSource::Local {
                                path: found.0,
                                size: found.1,
                            }
                        } else {
                            let size =
                                download(&*storage, &location, &stream, &expected, &target, env)
                                    .await?;
                            if matches!(stream, StreamStateHandle::Inline(_)) {
                                counts.inline_files.fetch_add(1, Ordering::Relaxed);
                            } else {
                                counts.downloaded_files.fetch_add(1, Ordering::Relaxed);
                                counts.downloaded_bytes.fetch_add(size, Ordering::Relaxed);
                            }
                            NativeSource::Local { path: target, size }
                        }
                    }
                });
            }
        }
    }
    Ok(downloads)
}

/// Downloads the sections of every canonical keyed snapshot the job master left in checkpoint
/// storage ([`KeyedSections::Stored`]: the state backend keeps files) into the backend's
/// directory, checked on the way (a file the subtask owns whole: the digest of its recorded size; each
/// section's checksum when the backend reads it), so that a savepoint larger than memory
/// restores.
pub(crate) async fn fetch_keyed(
    restore: &mut RestoreContext,
    env: &TaskEnv,
    downloads: &mut Downloads,
) -> Result<(), TaskError> {
    let stored = |s: &KeyedSections| matches!(s, KeyedSections::Stored { .. });
    let needed = restore
        .operators
        .values()
        .any(|o| o.keyed.iter().any(|r| stored(&r.sections)));
    if !needed {
        return Ok(());
    }
    let Some(state_dir) = env.state_backend.local_dir() else {
        return Err(TaskError::Operator {
            operator: env.name.clone(),
            message: format!(
                "the job master left canonical keyed snapshots for the subtask to fetch, and the \
                 state backend '{}' has no local directory",
                env.state_backend.name()
            ),
        });
    };
    let counts = &env.metrics.restore_files;
    // One file per operator: its snapshots' sections one after the other (one file descriptor
    // while the backend holds them, whatever the chain's length or the old parallelism).
    for (n, state) in restore.operators.values_mut().enumerate() {
        if !state.keyed.iter().any(|r| stored(&r.sections)) {
            continue;
        }
        let target = downloads
            .dir(&state_dir, env)?
            .join(format!("canonical-{n}"));
        let mut out =
            std::fs::File::create(&target).map_err(|e| io_error(env, "create", &target, e))?;
        let mut at = 0u64;
        for r in &mut state.keyed {
            let KeyedSections::Stored {
                stream,
                end,
                whole,
                location_dir,
                storage,
                ..
            } = &r.sections
            else {
                continue;
            };
            let location = CheckpointLocation {
                dir: location_dir.clone(),
            };
            let storage = storage.clone().unwrap_or_else(|| env.storage.clone());
            let file = crate::verify::stream_file(&location, stream);
            let span = (r.sections_offset, *end);
            let whole = *whole;
            let len = download_sections(
                &*storage,
                &location,
                stream,
                span,
                whole,
                (&mut out, &target),
                env,
            )
            .await?;
            counts.canonical_files.fetch_add(1, Ordering::Relaxed);
            counts.canonical_bytes.fetch_add(len, Ordering::Relaxed);
            r.sections = KeyedSections::Local {
                path: target.clone(),
                at,
                len,
                digest_checked: whole && matches!(stream, StreamStateHandle::File { .. }),
                location_dir: location.dir,
                file,
            };
            at += len;
        }
        // Flushed, not synced: the file serves this process only (a crash of the machine takes
        // the process with it).
        out.flush()
            .map_err(|e| io_error(env, "write", &target, e))?;
        info!(task = %env.name, bytes = at, file = %target.display(), "downloaded the keyed sections of canonical snapshots");
    }
    Ok(())
}

/// Downloads the bytes `span` of a canonical keyed snapshot, appending them to `out` (the
/// file `target`), in ranges of [`DOWNLOAD_RANGE`]; with `whole`, the whole file is read, and
/// its digest checked against the handle's. Returns the bytes written. A file that fails a check is
/// [`TaskError::UnusableCheckpoint`], naming it.
async fn download_sections(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    stream: &StreamStateHandle,
    span: (u64, u64),
    whole: bool,
    (out, target): (&mut std::fs::File, &Path),
    env: &TaskEnv,
) -> Result<u64, TaskError> {
    let unusable = |reason: String| unusable(location, stream, reason);
    let failed = |e| read_failed(location, stream, e);
    let digest = match stream {
        StreamStateHandle::File { size, digest, .. } if whole => Some((*size, *digest)),
        _ => None,
    };
    // Ranges of a file; an inline stream (served from `_metadata`) and a legacy file the
    // subtask owns whole (whose length the storage checks) are read whole, and cut.
    let ranged = match stream {
        StreamStateHandle::File { .. } => true,
        StreamStateHandle::Inline(_) => false,
        _ => !whole,
    };
    // What is read: the whole file to check its digest, else the sections only.
    let (from, to) = match digest {
        Some((size, _)) => (0, size),
        None => span,
    };
    let mut hasher = DigestHasher::new();
    let mut at = from;
    let mut written = 0u64;
    while at < to {
        let chunk = if ranged {
            let end = to.min(at + DOWNLOAD_RANGE);
            storage
                .read_state(location, stream, Some((at, end)))
                .await
                .map_err(failed)?
        } else {
            // Inline (served from `_metadata`, whose envelope is checked) or a legacy file:
            // read whole, as the storage verifies it, and cut to the range.
            let all = storage
                .read_state(location, stream, None)
                .await
                .map_err(failed)?;
            let (a, b) = (at.min(all.len() as u64), to.min(all.len() as u64));
            all.slice(a as usize..b as usize)
        };
        if chunk.is_empty() {
            return Err(unusable(format!(
                "nothing to read at byte {at} of {to}: the file is shorter than its handle says"
            )));
        }
        hasher.update(&chunk);
        // The part of the chunk inside the sections.
        let chunk_end = at + chunk.len() as u64;
        let (a, b) = (span.0.max(at), span.1.min(chunk_end));
        if a < b {
            out.write_all(&chunk[(a - at) as usize..(b - at) as usize])
                .map_err(|e| io_error(env, "write", target, e))?;
            written += b - a;
        }
        at = chunk_end;
    }
    if let Some((size, digest)) = digest {
        let got = hasher.finish();
        if at != size || got != digest {
            return Err(unusable(format!(
                "{at} bytes with digest {got}, and the handle says {size} bytes with digest \
                 {digest}"
            )));
        }
    }
    if span.1.checked_sub(span.0) != Some(written) {
        return Err(unusable(format!(
            "{written} bytes of the sections [{}, {}) were read: the file is shorter than its \
             handle says",
            span.0, span.1
        )));
    }
    Ok(written)
}

/// A file of checkpoint `location` found damaged: the checkpoint is unusable.
fn unusable(
    location: &CheckpointLocation,
    stream: &StreamStateHandle,
    reason: String,
) -> TaskError {
    TaskError::UnusableCheckpoint {
        location: location.dir.clone(),
        file: crate::verify::stream_file(location, stream),
        reason,
    }
}

/// A read of a file of checkpoint `location` failed. As `restore::load_first_good` decides for
/// the files the master reads: an error the storage calls temporary is retried (the same
/// checkpoint, by the restart strategy); any other (a missing, truncated or damaged file) makes
/// the checkpoint unusable.
fn read_failed(
    location: &CheckpointLocation,
    stream: &StreamStateHandle,
    e: weir_checkpoint::CheckpointError,
) -> TaskError {
    if e.is_temporary() {
        TaskError::Checkpoint(e)
    } else {
        unusable(location, stream, e.to_string())
    }
}

fn io_error(env: &TaskEnv, what: &str, path: &Path, e: std::io::Error) -> TaskError {
    TaskError::Operator {
        operator: env.name.clone(),
        message: format!("cannot {what} {}: {e}", path.display()),
    }
}

/// The subtask's local-recovery copy of `f` and its length, when present and sound by the
/// state backend's check; a copy the check refuses is removed (and downloaded instead).
fn local_copy(
    env: &TaskEnv,
    local: &Path,
    stream: &StreamStateHandle,
    f: &NativeFileHandle,
    format: &str,
) -> Option<(PathBuf, u64)> {
    let path = local.join(crate::local_recovery::local_name(stream)?);
    let size = std::fs::metadata(&path).ok()?.len();
    let file = weir_state::NativeFile {
        name: f.name.clone(),
        key_groups: f.key_groups,
        size,
        path: path.clone(),
    };
    match env.state_backend.check_native_file(format, &file) {
        Ok(()) => Some((path, size)),
        Err(e) => {
            warn!(task = %env.name, file = %path.display(), error = %e, "the local-recovery copy is unusable; downloading the file");
            env.metrics
                .restore_files
                .local_refused
                .fetch_add(1, Ordering::Relaxed);
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// Downloads one native file to `target` in ranges of [`DOWNLOAD_RANGE`], checking its
/// identity frame against `expected` and its size and digest against the handle's; returns the
/// payload's length. A file that fails a check is [`TaskError::UnusableCheckpoint`], naming it.
async fn download(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    stream: &StreamStateHandle,
    expected: &ExpectedIdentity,
    target: &Path,
    env: &TaskEnv,
) -> Result<u64, TaskError> {
    let unusable = |reason: String| unusable(location, stream, reason);
    let (size, digest) = match stream {
        StreamStateHandle::File { size, digest, .. } => (*size, Some(*digest)),
        // Inline (served from `_metadata`, whose envelope is checked) or a legacy file (which
        // a native snapshot never is): read whole, as the storage verifies it.
        _ => (stream.size(), None),
    };
    let mut out = std::fs::File::create(target).map_err(|e| io_error(env, "create", target, e))?;
    let mut hasher = DigestHasher::new();
    let mut at = 0u64;
    let mut payload = 0u64;
    let mut framed = false;
    let failed = |e| read_failed(location, stream, e);
    while at < size || !framed {
        let chunk = if digest.is_some() {
            let end = size.min(at + DOWNLOAD_RANGE);
            storage
                .read_state(location, stream, Some((at, end)))
                .await
                .map_err(failed)?
        } else {
            storage
                .read_state(location, stream, None)
                .await
                .map_err(failed)?
        };
        if chunk.is_empty() {
            return Err(unusable(format!(
                "nothing to read at byte {at} of {size}: the file is shorter than its handle says"
            )));
        }
        hasher.update(&chunk);
        at += chunk.len() as u64;
        let mut body = &chunk[..];
        if !framed {
            let (identity, len) = weir_core::identity::open_frame(&chunk)
                .map_err(|e| unusable(format!("identity frame: {e}")))?;
            crate::verify::check_native_identity(&identity, expected)
                .map_err(|e| unusable(format!("identity frame: {e}")))?;
            body = &chunk[len..];
            framed = true;
        }
        out.write_all(body)
            .map_err(|e| io_error(env, "write", target, e))?;
        payload += body.len() as u64;
        if digest.is_none() {
            break;
        }
    }
    if let Some(digest) = digest {
        let got = hasher.finish();
        if at != size || got != digest {
            return Err(unusable(format!(
                "{at} bytes with digest {got}, and the handle says {size} bytes with digest \
                 {digest}"
            )));
        }
    }
    out.sync_data()
        .map_err(|e| io_error(env, "write", target, e))?;
    Ok(payload)
}
