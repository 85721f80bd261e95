//! Runs the checkpoint-storage conformance suite against S3 (a real `s3s-fs` server on loopback,
//! started per test), and tests what only S3 shows: the objects on the server's disk, multipart
//! uploads of large state, and signatures checked. Needs `WEIR_S3FS_BIN`
//! (`cargo xtask test` sets it); without it every test here fails, saying so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/s3_server.rs"]
mod s3_server;

use bytes::Bytes;
use opendal::ErrorKind;
use s3_server::{S3Server, files_under};
use weir_checkpoint::storage::conformance;
use weir_checkpoint::storage::{S3Config, is_s3_url};
use weir_checkpoint::{
    CheckpointError, CheckpointMetadata, CheckpointStorage, OpendalCheckpointStorage,
};
use weir_core::element::SnapshotKind;
use weir_core::handle::StreamStateHandle;
use weir_core::ids::{CheckpointId, JobId};

const BUCKET: &str = "weir-test";

/// The configuration of `prefix` in the server's bucket, as `from_url_and_env` reads it.
fn config(server: &S3Server, prefix: &str) -> S3Config {
    let env = server.env();
    let url = format!("s3://{}/{prefix}", server.bucket());
    S3Config::from_url_and_vars(&url, |name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .unwrap()
}

fn storage(server: &S3Server, prefix: &str) -> OpendalCheckpointStorage {
    OpendalCheckpointStorage::s3(config(server, prefix)).unwrap()
}

fn metadata(job: JobId, id: u64) -> CheckpointMetadata {
    CheckpointMetadata {
        job_id: job,
        job_name: "test".to_string(),
        checkpoint_id: CheckpointId(id),
        kind: SnapshotKind::Checkpoint,
        trigger_timestamp_ms: 1,
        completion_timestamp_ms: 2,
        weir_version: "test".to_string(),
        operators: Vec::new(),
        in_flight: Vec::new(),
        fingerprint: None,
        tuning: None,
        format_version: weir_checkpoint::metadata::METADATA_VERSION,
    }
}

/// Deterministic bytes that differ by position, so a misplaced part shows.
fn pattern(len: usize) -> Bytes {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn s3_passes_the_conformance_suite() {
    let server = S3Server::start(BUCKET);
    let storage = storage(&server, "conformance/run-1");
    assert!(!storage.operator().info().capability().rename);
    conformance::run_all_with_raw(&storage, storage.operator()).await;
    conformance::check_inline_threshold(&storage, storage.inline_threshold()).await;
    // Running it again on the same storage works: each check clears its own job.
    conformance::run_all(&storage).await;
}

#[tokio::test]
async fn s3_at_the_bucket_root_and_with_a_threshold_of_zero_passes_the_conformance_suite() {
    let server = S3Server::start(BUCKET);
    let storage = storage(&server, "").with_inline_threshold(0);
    conformance::check_inline_threshold(&storage, 0).await;
    conformance::run_all(&storage).await;
}

#[tokio::test]
async fn s3_describes_itself_with_its_endpoint() {
    let server = S3Server::start(BUCKET);
    let storage = storage(&server, "a/b");
    assert_eq!(
        storage.describe(),
        format!(
            "s3://{BUCKET}/a/b (endpoint {}, region us-east-1)",
            server.endpoint()
        )
    );
    assert!(is_s3_url("s3://x/y") && !is_s3_url("/tmp/s3://x"));
}

#[tokio::test]
async fn s3_objects_follow_flinks_layout_on_the_servers_disk() {
    let server = S3Server::start(BUCKET);
    let storage = storage(&server, "ckpt/word-count").with_inline_threshold(4);
    storage.check_writable().await.unwrap();
    let job = JobId::from_name("layout");
    let loc = storage.init_location(job, CheckpointId(7)).await.unwrap();
    let chk = format!("ckpt/word-count/{job}/chk-7");
    assert!(
        !server.bucket_dir().join(&chk).exists(),
        "init_location writes no directory marker on S3"
    );
    storage
        .write_state(&loc, "op-0", Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    let inline = storage
        .write_state(&loc, "op-1", Bytes::from_static(b"abc"))
        .await
        .unwrap();
    assert_eq!(inline, StreamStateHandle::Inline(b"abc".to_vec()));
    storage
        .write_metadata(&loc, &metadata(job, 7))
        .await
        .unwrap();
    assert_eq!(
        files_under(&server.bucket_dir()),
        [format!("{chk}/_metadata"), format!("{chk}/op-0")],
        "exactly _metadata and the one state file, and no write probe, under the prefix"
    );
    assert_eq!(
        std::fs::read(server.bucket_dir().join(&chk).join("op-0")).unwrap(),
        b"0123456789"
    );
    let listed = storage.list_checkpoints(job).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].complete);

    storage.discard(&loc).await.unwrap();
    assert_eq!(
        files_under(&server.bucket_dir()),
        Vec::<String>::new(),
        "a recursive discard removes every object of the location"
    );
    assert!(storage.list_checkpoints(job).await.unwrap().is_empty());
}

#[tokio::test]
async fn s3_large_state_round_trips_through_a_multipart_upload() {
    let server = S3Server::start(BUCKET);
    let storage = storage(&server, "large");
    let job = JobId::from_name("large");
    let loc = storage.init_location(job, CheckpointId(1)).await.unwrap();
    let len = 12 * 1024 * 1024;
    let data = pattern(len);
    let handle = storage
        .write_state(&loc, "keyed", data.clone())
        .await
        .unwrap();
    assert_eq!(
        handle,
        StreamStateHandle::File {
            path: "keyed".to_string(),
            size: len as u64,
            digest: weir_core::identity::Digest::of(&data)
        }
    );
    let on_disk = server.bucket_dir().join(format!("large/{job}/chk-1/keyed"));
    assert_eq!(std::fs::metadata(&on_disk).unwrap().len(), len as u64);
    // S3 gives a multipart object an ETag ending in `-<parts>`: 12 MiB in 8 MiB parts is two.
    let meta = storage
        .operator()
        .stat(&format!("{job}/chk-1/keyed"))
        .await
        .unwrap();
    let etag = meta.etag().unwrap_or_default();
    assert!(etag.trim_matches('"').ends_with("-2"), "ETag {etag:?}");
    assert_eq!(storage.read_state(&loc, &handle, None).await.unwrap(), data);
    // A range across the boundary of the two parts.
    let (a, b) = (8 * 1024 * 1024 - 100, 8 * 1024 * 1024 + 100);
    let part = storage
        .read_state(&loc, &handle, Some((a as u64, b as u64)))
        .await
        .unwrap();
    assert_eq!(part, data.slice(a..b));
    // Shared state takes the same path.
    let shared = storage
        .write_shared_state(&loc, "base", data.clone())
        .await
        .unwrap();
    assert_eq!(storage.read_state(&loc, &shared, None).await.unwrap(), data);
    assert!(
        server
            .bucket_dir()
            .join(format!("large/{job}/shared/base"))
            .is_file()
    );
}

#[tokio::test]
async fn s3_a_wrong_secret_is_refused_by_the_server() {
    let server = S3Server::start(BUCKET);
    let mut config = config(&server, "x");
    config.secret_access_key = Some("not-the-secret".to_string());
    let storage = OpendalCheckpointStorage::s3(config).unwrap();
    let e = storage.check_writable().await.unwrap_err();
    assert!(
        matches!(&e, CheckpointError::Storage { path, .. } if path.starts_with(&format!("s3://{BUCKET}/x/"))),
        "{e:?}"
    );
    assert_eq!(e.storage_kind(), Some(ErrorKind::PermissionDenied), "{e:?}");
    assert_eq!(files_under(&server.bucket_dir()), Vec::<String>::new());
}

#[test]
fn s3_configuration_problems_are_config_errors_before_any_request() {
    for (mut config, names) in [
        (S3Config::new("ok-bucket", "p"), "no credentials"),
        (S3Config::new("", "p"), "bucket name"),
        (S3Config::new("ok-bucket", "a/../b"), "key prefix"),
    ] {
        if names != "no credentials" {
            config.access_key_id = Some("A".into());
            config.secret_access_key = Some("S".into());
        }
        match OpendalCheckpointStorage::s3(config) {
            Err(CheckpointError::Config(msg)) => assert!(msg.contains(names), "{msg}"),
            other => panic!("expected a Config error naming {names}, got {other:?}"),
        }
    }
}
