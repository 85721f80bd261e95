//! Conformance of shared files written from a local file
//! ([`CheckpointStorage::write_shared_state_from_file`]): the same file and handle as
//! `write_shared_state` over the same bytes, whatever the size, and a local file that is
//! missing or of another length refused by name.

use super::helpers::{fail, fresh_job, must, ok, pattern};
use crate::CheckpointError;
use crate::storage::CheckpointStorage;
use bytes::Bytes;
use weir_core::handle::StreamStateHandle;
use weir_core::identity::Digest;
use weir_core::ids::CheckpointId;

/// Files of 17 bytes, 256 KiB and 20 MiB + 3 (several of a streaming storage's parts) behind a
/// head: each reads back whole (its size and digest checked) as head + file, and its handle is
/// what `write_shared_state` gives for the same bytes; a wrong length or a missing file is
/// `LocalFile`.
pub async fn check_shared_state_from_file(storage: &dyn CheckpointStorage) {
    let check = "shared_state_from_file";
    let job = fresh_job(storage, check).await;
    let location = ok(
        storage,
        check,
        "init_location",
        storage.init_location(job, CheckpointId(3)).await,
    );
    let dir = LocalDir::new();
    let head = Bytes::from_static(b"a head, as an identity frame would be");
    for (i, len) in [17usize, 256 * 1024, (20 << 20) + 3]
        .into_iter()
        .enumerate()
    {
        let body = pattern(len, 7 + i as u8);
        let path = dir.0.as_path().join(format!("local-{i}"));
        ok(
            storage,
            check,
            "write the local file",
            std::fs::write(&path, &body),
        );
        let streamed = ok(
            storage,
            check,
            "write_shared_state_from_file",
            storage
                .write_shared_state_from_file(
                    &location,
                    &format!("streamed-{i}"),
                    head.clone(),
                    &path,
                    len as u64,
                )
                .await,
        );
        let mut whole = head.to_vec();
        whole.extend_from_slice(&body);
        let whole = Bytes::from(whole);
        match &streamed {
            StreamStateHandle::File { path, size, digest } => {
                must(
                    storage,
                    check,
                    path == &format!("../shared/streamed-{i}"),
                    || format!("a shared file's path must be ../shared/<name>, got {path:?}"),
                );
                must(
                    storage,
                    check,
                    *size == whole.len() as u64 && *digest == Digest::of(&whole),
                    || format!("file {i}: the handle has the wrong size or digest"),
                );
            }
            StreamStateHandle::Inline(bytes) => {
                must(storage, check, bytes[..] == whole[..], || {
                    format!("file {i}: the inline handle holds other bytes")
                });
            }
            StreamStateHandle::LegacyFile { .. } => fail(
                storage,
                check,
                format!("file {i}: a legacy handle: {streamed:?}"),
            ),
        }
        let read = ok(
            storage,
            check,
            "read_state",
            storage.read_state(&location, &streamed, None).await,
        );
        must(storage, check, read == whole, || {
            format!("file {i} of {len} bytes reads back other bytes")
        });
        let direct = ok(
            storage,
            check,
            "write_shared_state",
            storage
                .write_shared_state(&location, &format!("direct-{i}"), whole.clone())
                .await,
        );
        must(
            storage,
            check,
            direct.size() == streamed.size()
                && matches!(&direct, StreamStateHandle::Inline(_))
                    == matches!(&streamed, StreamStateHandle::Inline(_)),
            || format!("file {i}: streamed {streamed:?}, written whole {direct:?}"),
        );
    }
    let path = dir.0.as_path().join("short");
    ok(
        storage,
        check,
        "write the local file",
        std::fs::write(&path, pattern(1000, 3)),
    );
    for (what, path, len) in [
        ("shorter than said", path.clone(), 30u64 << 20),
        ("longer than said", path.clone(), 10),
        ("missing", dir.0.as_path().join("missing"), 10),
    ] {
        let r = storage
            .write_shared_state_from_file(&location, "bad", head.clone(), &path, len)
            .await;
        must(
            storage,
            check,
            matches!(&r, Err(CheckpointError::LocalFile { .. })),
            || format!("a local file {what}: {r:?}, not LocalFile"),
        );
    }
}

/// A directory of local files for the check, removed when dropped.
struct LocalDir(std::path::PathBuf);

impl LocalDir {
    fn new() -> LocalDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weir-conformance-streamed-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::create_dir_all(&dir);
        LocalDir(dir)
    }
}

impl Drop for LocalDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
