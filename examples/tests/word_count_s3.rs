//! End to end on S3: the `word_count` binary checkpoints to `--checkpoint-dir s3://…` on a real
//! `s3s-fs` server (loopback, started per test), recovers from an injected failure through those
//! checkpoints, and a second run resumes with `--from s3://…`; bad `s3://` flags are clear
//! errors. Needs `WEIR_S3FS_BIN` (`cargo xtask test` sets it); without it the server tests fail,
//! saying so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../runtime/tests/support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/processes.rs"]
mod processes;
#[path = "../../checkpoint/tests/support/s3_server.rs"]
mod s3_server;

use processes::{parse_totals, summary_field};
use s3_server::{S3Server, files_under};
use std::process::Command;
use weir_core::ids::JobId;
use weir_examples::expected_totals;

/// What a run printed, and how it ended.
struct Run {
    success: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

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

/// Runs the binary with `env` as its only AWS variables.
fn word_count(args: &[&str], env: &[(&str, String)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_word_count"));
    cmd.args(args)
        .env_remove("RUST_LOG")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    for var in AWS_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let out = cmd.output_bounded().unwrap();
    Run {
        success: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The id of the `latest checkpoint: …/chk-<n>` line.
fn latest_checkpoint(stdout: &str) -> u64 {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("latest checkpoint: "))
        .unwrap_or_else(|| panic!("no latest checkpoint line in:\n{stdout}"));
    line.rsplit("chk-")
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no chk-<n> in {line:?}"))
}

#[test]
fn word_count_checkpoints_to_s3_recovers_through_it_and_resumes_from_it() {
    let server = S3Server::start("weir-e2e");
    let env = server.env();
    let tmp = tempfile::tempdir().unwrap();
    let records = 400_000u64;
    let n = records.to_string();
    let out = tmp.path().join("totals.csv");
    let out_str = out.to_str().unwrap();

    // Checkpoints every 50k records (and 20 ms); the map fails once after 250k, and the job
    // restarts from its latest checkpoint, read back from S3.
    let run = word_count(
        &[
            "--records",
            &n,
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "20ms",
            "--checkpoint-every-records",
            "50000",
            "--fail-after",
            "250000",
            "--checkpoint-dir",
            "s3://weir-e2e/runs/wc",
            "--output",
            out_str,
        ],
        &env,
    );
    assert!(
        run.success,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert_eq!(
        parse_totals(&out),
        expected_totals(records, 42),
        "exactly-once totals after a failure, as without checkpoints"
    );
    assert_eq!(summary_field(&run.stdout, "restarts"), 1, "{}", run.stdout);
    assert!(
        summary_field(&run.stdout, "checkpoints") >= 1,
        "{}",
        run.stdout
    );

    // The checkpoints are objects in the bucket, under the prefix, in Flink's layout.
    // The run's own job directory: every run has a fresh job id.
    let job = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("latest checkpoint: s3://weir-e2e/runs/wc/"))
        .and_then(|rest| rest.split('/').next())
        .and_then(JobId::parse)
        .unwrap_or_else(|| panic!("no job id in the latest checkpoint line:\n{}", run.stdout));
    let latest = latest_checkpoint(&run.stdout);
    let metadata = server
        .bucket_dir()
        .join(format!("runs/wc/{job}/chk-{latest}/_metadata"));
    assert!(metadata.is_file(), "{} is missing", metadata.display());
    let objects = files_under(&server.bucket_dir());
    assert!(
        objects
            .iter()
            .all(|o| o.starts_with(&format!("runs/wc/{job}/"))),
        "objects outside the job's prefix: {objects:?}"
    );

    // A second run from the bucket with another seed is refused: its replay would read other
    // records. The checkpoint's fingerprint names the difference.
    let resumed = tmp.path().join("resumed.csv");
    let args = [
        "--records",
        &n,
        "--parallelism",
        "2",
        "--seed",
        "7",
        "--from",
        "s3://weir-e2e/runs/wc",
        "--output",
        resumed.to_str().unwrap(),
    ];
    let run = word_count(&args, &env);
    assert!(!run.success, "stdout:\n{}", run.stdout);
    assert!(
        run.stderr
            .contains("source setting 'seed' is 42 in the checkpoint and 7 in the job"),
        "{}",
        run.stderr
    );
    // With --allow-changed-sources it resumes: each record still counts once (the totals add
    // up to `records`), and the restored counts show (they differ from a fresh run with that
    // seed).
    let mut allowed = args.to_vec();
    allowed.push("--allow-changed-sources");
    let run = word_count(&allowed, &env);
    assert!(
        run.success,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let totals = parse_totals(&resumed);
    assert_eq!(totals.values().sum::<i64>(), records as i64, "{totals:?}");
    assert_ne!(
        totals,
        expected_totals(records, 7),
        "the run did not start from the checkpoint"
    );
    assert_eq!(summary_field(&run.stdout, "restarts"), 0);

    // A prefix with no checkpoint is a clear error, not a fresh start.
    let run = word_count(
        &["--records", "10", "--from", "s3://weir-e2e/nothing"],
        &env,
    );
    assert!(!run.success);
    assert!(
        run.stderr.contains("no complete checkpoint") && run.stderr.contains("s3://weir-e2e"),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_s3_checkpoint_dirs_are_clear_errors() {
    let creds = [
        ("AWS_ACCESS_KEY_ID", "A".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "S".to_string()),
    ];
    for (dir, env, needle) in [
        ("s3://", &creds[..], "names no bucket"),
        ("s3://Bad_Bucket/x", &creds[..], "bucket name"),
        ("s3://bucket/a/../b", &creds[..], "'..'"),
        ("s3://bucket/x", &[][..], "AWS_ACCESS_KEY_ID"),
    ] {
        let run = word_count(
            &[
                "--records",
                "10",
                "--checkpoint-interval",
                "1s",
                "--checkpoint-dir",
                dir,
            ],
            env,
        );
        assert!(!run.success, "{dir}: expected a failure:\n{}", run.stdout);
        assert_eq!(
            run.code,
            Some(2),
            "{dir}: a usage error (bad flags), not a panic:\n{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("--checkpoint-dir") && run.stderr.contains(needle),
            "{dir}: stderr should name the flag and {needle:?}:\n{}",
            run.stderr
        );
    }
}

#[test]
fn a_savepoint_on_s3_is_printed_as_a_path_to_resume_from() {
    let server = S3Server::start("weir-sp");
    let env = server.env();
    let tmp = tempfile::tempdir().unwrap();
    let records = 400_000u64;
    let n = records.to_string();
    // Stops with a savepoint in the bucket once 100k records were emitted, after checkpoints
    // at 25k, 50k and 75k records (a 20 ms interval alone left none once 100k records took
    // less than 20 ms).
    let run = word_count(
        &[
            "--records",
            &n,
            "--parallelism",
            "2",
            "--checkpoint-every-records",
            "25000",
            "--checkpoint-interval",
            "20ms",
            "--checkpoint-dir",
            "s3://weir-sp/checkpoints",
            "--savepoint-dir",
            "s3://weir-sp/savepoints",
            "--stop-with-savepoint-after",
            "100000",
        ],
        &env,
    );
    assert!(run.success, "{}\n{}", run.stdout, run.stderr);
    let savepoint = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint: "))
        .unwrap_or_else(|| panic!("no savepoint line in:\n{}", run.stdout))
        .to_string();
    assert!(
        savepoint.starts_with("s3://weir-sp/savepoints/savepoint-") && !savepoint.contains(' '),
        "{savepoint}"
    );
    let latest = run
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("latest checkpoint: "))
        .unwrap_or_else(|| panic!("no latest checkpoint line in:\n{}", run.stdout));
    assert!(
        latest.starts_with("s3://weir-sp/checkpoints/") && latest.contains("/chk-"),
        "{latest}"
    );
    // The printed path is what --from takes: the rest of the input counts once.
    let out = tmp.path().join("totals.csv");
    let run = word_count(
        &[
            "--records",
            &n,
            "--parallelism",
            "3",
            "--from",
            &savepoint,
            "--output",
            out.to_str().unwrap(),
        ],
        &env,
    );
    assert!(run.success, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(parse_totals(&out), expected_totals(records, 42));
    // Exact only because the savepoint's state was used: the sources resumed.
    processes::assert_restored(&run.stdout, records, &[]);
}
