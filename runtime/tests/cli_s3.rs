//! The `weir checkpoints` command-line tool on S3: a small keyed job checkpoints to a real
//! `s3s-fs` server (loopback, started per test), then the built binary lists, inspects and
//! verifies `s3://` paths (configured from the AWS variables, as a job is), reporting every path
//! as `s3://bucket/prefix/…`, intact and after damage (a flipped byte in a state file and in
//! `_metadata`); bad `s3://` input is a usage error. Needs `WEIR_S3FS_BIN` (`cargo xtask test`
//! sets it); without it the server test fails, saying so.
#![cfg(feature = "cli")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/checkpointed.rs"]
mod checkpointed;
#[path = "../../checkpoint/tests/support/s3_server.rs"]
mod s3_server;

use checkpointed::{KeyedJob, complete_ids};
use s3_server::{ACCESS_KEY, REGION, S3Server, SECRET_KEY};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;
use weir_checkpoint::OpendalCheckpointStorage;
use weir_checkpoint::storage::S3Config;
use weir_runtime::{StorageConfig, StreamEnvironment};

const BUCKET: &str = "weir-cli";
const PREFIX: &str = "team/ckpt";
const JOB_NAME: &str = "cli-s3-test";
/// Distinct keys.
const KEYS: u64 = 5_000;
/// Records the job reads: enough that the slowed-down part outlasts [`WANTED`] checkpoints to S3
/// on a loaded machine (at 2 ms per 16 records, 30 s of it are 240,000 records); once they are
/// complete the rest goes at full speed.
const RECORDS: u64 = 400_000;
/// Records after which every key has state; from there on the job slows down until
/// [`WANTED`] checkpoints have completed.
const WARM_UP: u64 = 2 * KEYS;
/// Complete checkpoints wanted after the warm-up.
const WANTED: u64 = 2;

/// The AWS variables a developer's shell may hold, which would change what the binary reads.
const AWS_VARS: [&str; 7] = [
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
];

/// Runs generator → map → key_by → sum → latest_per_key with parallelism 2, checkpointing to
/// `s3://BUCKET/PREFIX` every 30 ms and keeping 3 checkpoints; the map slows the job down after
/// the warm-up until two checkpoints taken after it (so with every key in state) are complete.
/// The storage inlines nothing, so that every subtask's state is a file of its own.
/// `on_disk` is where the server keeps the prefix, to watch the checkpoints complete.
async fn run_job(server: &S3Server, on_disk: PathBuf) {
    let config = S3Config {
        endpoint: Some(server.endpoint()),
        region: REGION.into(),
        bucket: BUCKET.into(),
        prefix: PREFIX.into(),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        session_token: None,
        path_style: true,
    };
    let env = StreamEnvironment::new();
    env.set_job_name(JOB_NAME)
        .set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(30))
        .set_checkpoint_storage(StorageConfig::Custom(Arc::new(
            OpendalCheckpointStorage::s3(config)
                .unwrap()
                .with_inline_threshold(0),
        )));
    env.checkpoint_config().num_retained = 3;
    KeyedJob {
        keys: KEYS,
        records: RECORDS,
        warm_up: WARM_UP,
        wanted: WANTED,
        give_up: Duration::from_secs(30),
    }
    .run(env, on_disk)
    .await;
}

/// Runs the binary with `env` as its only AWS variables.
fn weir(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_weir"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE");
    for var in AWS_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.output_bounded().expect("cannot run the weir binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    )
}

/// Flips one bit of the byte at `offset`.
fn flip_byte(file: &Path, offset: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    bytes[offset] ^= 0x40;
    std::fs::write(file, bytes).unwrap();
}

#[test]
fn list_inspect_and_verify_name_s3_paths_and_find_damage() {
    let server = S3Server::start(BUCKET);
    let env = server.env();
    let on_disk = server.bucket_dir().join(PREFIX);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run_job(&server, on_disk.clone()));
    let ids = complete_ids(&on_disk);
    assert!(
        ids.len() >= 2,
        "expected retained checkpoints, found {ids:?}"
    );
    let jobs: Vec<String> = std::fs::read_dir(&on_disk)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job_id = &jobs[0];
    let root = format!("s3://{BUCKET}/{PREFIX}");
    let job = format!("{root}/{job_id}");
    let latest = *ids.last().unwrap();
    let chk = format!("{job}/chk-{latest}");

    // list: the root, the job prefix (with a trailing `/`) and one checkpoint.
    let o = weir(&["checkpoints", "list", &root], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let rows: Vec<&str> = out
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("COMPLETED "))
        .collect();
    assert_eq!(rows.len(), ids.len(), "{out}");
    for (row, id) in rows.iter().zip(&ids) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], id.to_string(), "{row}");
        assert_eq!(cells[2], JOB_NAME, "{row}");
        assert_eq!(cells[3], job_id, "{row}");
        assert!(row.ends_with(&format!(" {job}/chk-{id}")), "{row}");
    }
    assert!(
        out.lines()
            .skip(1)
            .all(|l| l.starts_with("COMPLETED ") || l.starts_with("INCOMPLETE ")),
        "{out}"
    );
    let o = weir(&["checkpoints", "list", &format!("{job}/")], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), out, "a job prefix lists as its root");
    let o = weir(&["checkpoints", "list", "--json", &chk], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let entries = v.as_array().unwrap();
    assert_eq!(entries.len(), 1, "{v:#}");
    assert_eq!(entries[0]["status"], "COMPLETED");
    assert_eq!(entries[0]["id"], latest);
    assert_eq!(entries[0]["path"], chk);
    assert_eq!(entries[0]["job_id"], job_id.as_str());

    // inspect: every file is an `s3://` path inside the checkpoint, every check passes.
    let o = weir(&["checkpoints", "inspect", "--json", &chk], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["checkpoint_id"], latest);
    assert_eq!(v["job_name"], JOB_NAME);
    assert_eq!(v["checkpoint_dir"], chk);
    assert_eq!(v["metadata_file"], format!("{chk}/_metadata"));
    assert!(v["selected_from"].is_null());
    assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{v:#}");
    let mut keyed_files = Vec::new();
    for op in v["operators"].as_array().unwrap() {
        for sub in op["subtasks"].as_array().unwrap() {
            for k in sub["keyed"].as_array().unwrap() {
                assert_eq!(k["verification"]["ok"], true, "{k:#}");
                if let Some(file) = k["stream"]["file"].as_str() {
                    assert!(file.starts_with(&format!("{chk}/")), "{file}");
                    keyed_files.push(file.to_string());
                }
            }
        }
    }
    assert!(!keyed_files.is_empty(), "no keyed state in files: {v:#}");
    let o = weir(&["checkpoints", "inspect", &chk], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let text = stdout(&o);
    assert!(text.contains(&format!("Checkpoint {chk}\n")), "{text}");
    assert!(
        text.contains(&format!("_metadata:      {chk}/_metadata (")),
        "{text}"
    );
    assert!(text.contains(&keyed_files[0]), "{text}");
    // Given the root, the latest complete checkpoint, and which.
    let o = weir(&["checkpoints", "inspect", "--json", &root], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["checkpoint_dir"], chk);
    assert_eq!(v["selected_from"], root);

    // verify: every intact checkpoint, and the root.
    for id in &ids {
        let o = weir(&["checkpoints", "verify", &format!("{job}/chk-{id}")], &env);
        assert_eq!(o.status.code(), Some(0), "{}", show(&o));
        assert!(
            stdout(&o).starts_with(&format!("OK: checkpoint {id} of job {JOB_NAME}: ")),
            "{}",
            show(&o)
        );
    }
    let o = weir(&["checkpoints", "verify", &root], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert!(
        stdout(&o).starts_with(&format!(
            "Verifying {chk} (the latest complete checkpoint under {root})\nOK: checkpoint {latest} "
        )),
        "{}",
        show(&o)
    );

    // A flipped byte in a keyed state file: verify names it as an `s3://` path.
    let victim = &keyed_files[0];
    let victim_on_disk = server
        .bucket_dir()
        .join(victim.strip_prefix(&format!("s3://{BUCKET}/")).unwrap());
    let len = std::fs::metadata(&victim_on_disk).unwrap().len() as usize;
    flip_byte(&victim_on_disk, len / 2);
    let o = weir(&["checkpoints", "verify", &chk], &env);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    assert!(!out.is_empty());
    for line in out.lines() {
        assert!(line.starts_with(&format!("CORRUPT: {victim}: ")), "{out}");
    }
    assert!(out.contains("checksum mismatch"), "{out}");
    let o = weir(&["checkpoints", "inspect", &chk], &env);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(stdout(&o).contains(victim.as_str()), "{}", show(&o));

    // A flipped byte in the `_metadata` of another checkpoint: verify and inspect name it, list
    // marks it corrupt.
    let older = ids[ids.len() - 2];
    let older_chk = format!("{job}/chk-{older}");
    flip_byte(&on_disk.join(format!("{job_id}/chk-{older}/_metadata")), 40);
    let o = weir(&["checkpoints", "verify", &older_chk], &env);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with(&format!("CORRUPT: {older_chk}/_metadata: ")),
        "{out}"
    );
    assert!(out.contains("checksum mismatch"), "{out}");
    let o = weir(&["checkpoints", "inspect", &older_chk], &env);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        stderr(&o).contains(&format!("{older_chk}/_metadata")),
        "{}",
        show(&o)
    );
    let o = weir(&["checkpoints", "list", &root], &env);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let out = stdout(&o);
    let row = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&older.to_string()))
        .unwrap_or_else(|| panic!("checkpoint {older} is not listed: {out}"));
    assert!(row.starts_with("CORRUPT "), "{out}");
    assert!(row.contains(&older_chk), "{out}");
    assert!(row.contains("_metadata: checksum mismatch"), "{out}");

    // A prefix that holds nothing, and a checkpoint that does not exist: no checkpoint there.
    for cmd in ["list", "inspect", "verify"] {
        let nothing = format!("s3://{BUCKET}/nothing/here");
        let o = weir(&["checkpoints", cmd, &nothing], &env);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", show(&o));
        assert!(
            stderr(&o).contains(&format!("no checkpoint under '{nothing}'")),
            "{cmd}: {}",
            show(&o)
        );
    }
    let missing = format!("{job}/chk-999999");
    let o = weir(&["checkpoints", "verify", &missing], &env);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(stderr(&o).contains(&missing), "{}", show(&o));

    // A bucket that does not exist is a failure naming the path, not a crash.
    let other = "s3://no-such-bucket/x".to_string();
    let o = weir(&["checkpoints", "list", &other], &env);
    assert!(matches!(o.status.code(), Some(1 | 2)), "{}", show(&o));
    assert!(stderr(&o).contains(&other), "{}", show(&o));
    assert!(!stderr(&o).contains("internal error"), "{}", show(&o));
}

/// Bad `s3://` input is a usage error naming the problem, before any request.
#[test]
fn bad_s3_urls_and_missing_credentials_are_usage_errors() {
    let creds = [
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9".to_string()),
        ("AWS_ACCESS_KEY_ID", "a".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "s".to_string()),
    ];
    for cmd in ["list", "inspect", "verify"] {
        let o = weir(&["checkpoints", cmd, "s3:///x"], &creds);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {}", show(&o));
        let err = stderr(&o);
        assert!(
            err.contains("s3:///x") && err.contains("no bucket"),
            "{err}"
        );
        assert!(!err.contains("internal error"), "{err}");
    }
    let o = weir(&["checkpoints", "list", "s3://Bad_Bucket/p"], &creds);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(stderr(&o).contains("bucket name"), "{}", show(&o));

    let o = weir(&["checkpoints", "verify", "s3://bucket/p/chk-3"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    let err = stderr(&o);
    assert!(
        err.contains("no credentials") && err.contains("AWS_ACCESS_KEY_ID"),
        "{err}"
    );
    let o = weir(
        &["checkpoints", "inspect", "s3://bucket/p"],
        &[("AWS_ACCESS_KEY_ID", "a".to_string())],
    );
    assert_eq!(o.status.code(), Some(2), "{}", show(&o));
    assert!(stderr(&o).contains("AWS_SECRET_ACCESS_KEY"), "{}", show(&o));
}
