//! Restored runs taken into a store: linked (or copied) into its directory and opened, checked
//! against their snapshot, on a few threads.

use super::run::{Run, parse_run_name};
use super::store::Shared;
use crate::StateError;
use crate::keyed::NativeFile;
use std::path::Path;
use std::sync::Arc;
use weir_core::keygroup::KeyGroupRange;

/// Restored runs opened per thread, at least: below this a restore opens its runs on its own
/// thread.
const RUNS_PER_OPENING_THREAD: usize = 8;

/// The most threads a restore opens its runs on (RocksDB's `max_file_opening_threads` is 16).
const MAX_OPENING_THREADS: usize = 4;

/// Adopts restored runs, in their order, on up to [`MAX_OPENING_THREADS`] threads: each is a link,
/// an open, a few reads and the digest of its index, and a restore's time is theirs (34 runs:
/// 1.1 ms on one thread).
pub(super) fn adopt_all(
    shared: &Shared,
    files: &[(&NativeFile, KeyGroupRange)],
) -> Result<Vec<Arc<Run>>, StateError> {
    let threads = (files.len() / RUNS_PER_OPENING_THREAD).clamp(1, MAX_OPENING_THREADS);
    if threads == 1 {
        return files.iter().map(|(f, c)| adopt(shared, f, *c)).collect();
    }
    let chunk = files.len().div_ceil(threads);
    let opened: Vec<Result<Vec<Arc<Run>>, StateError>> = std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|(f, c)| adopt(shared, f, *c))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join().unwrap_or_else(|_| {
                    Err(StateError::Restore(
                        "a thread opening restored runs panicked".to_string(),
                    ))
                })
            })
            .collect()
    });
    let mut runs = Vec::with_capacity(files.len());
    for part in opened {
        runs.extend(part?);
    }
    Ok(runs)
}

/// Links (or copies) a restored run into the store's directory and opens it, answering for
/// `clip`.
fn adopt(shared: &Shared, file: &NativeFile, clip: KeyGroupRange) -> Result<Arc<Run>, StateError> {
    let identity = parse_run_name(&file.name)
        .ok_or_else(|| StateError::Restore(format!("{:?} is not the name of a run", file.name)))?;
    let local = shared
        .dir
        .path
        .join(format!("{}.{}-{}.run", file.name, clip.start, clip.end));
    link_or_copy(&file.path, &local)?;
    let run = Run::open(&local, &identity, clip, Some(Arc::clone(&shared.dir)))?;
    if run.bytes != file.size {
        run.make_obsolete();
        return Err(StateError::Disk {
            path: file.path.clone(),
            reason: format!(
                "run {} has {} bytes, and its snapshot says {}",
                file.name, run.bytes, file.size
            ),
        });
    }
    Ok(Arc::new(run))
}

/// Hard-links `from` to `to`, or copies it where a link cannot be made (another file system).
fn link_or_copy(from: &Path, to: &Path) -> Result<(), StateError> {
    let _ = std::fs::remove_file(to);
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| StateError::Disk {
            path: from.to_path_buf(),
            reason: format!("cannot copy the run to {}: {e}", to.display()),
        })
}
