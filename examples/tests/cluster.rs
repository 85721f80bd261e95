//! A loopback cluster of separate processes: a job manager and two task managers run
//! `word_count` at parallelism 4, checkpointing to S3 on a local `s3s-fs` server. One task
//! manager is killed with SIGKILL mid-run and a new one started; the job recovers from its
//! latest checkpoint and the job manager's totals equal those computed without the engine.
//! Needs `WEIR_S3FS_BIN` (`cargo xtask test` sets it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../runtime/tests/support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/processes.rs"]
mod processes;
#[path = "../../checkpoint/tests/support/s3_server.rs"]
mod s3_server;

use processes::{
    Processes, free_port, listening_addr, log_tail, parse_totals, summary_field, wait_output,
};
use s3_server::{S3Server, files_under};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir_examples::expected_totals;

/// `word_count` with the job arguments every process of the cluster shares, and `role`'s.
fn word_count(job: &[String], role: &[String], env: &[(&str, String)], log: &Path) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_word_count"));
    cmd.args(job)
        .args(role)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap());
    cmd.spawn().unwrap()
}

/// Two task managers of two slots each (`tm1`, `tm2`), registering with the job manager at
/// `addr`.
fn two_task_managers(
    job: &[String],
    addr: &str,
    log: &dyn Fn(&str) -> std::path::PathBuf,
) -> Vec<Child> {
    ["tm1", "tm2"]
        .into_iter()
        .map(|name| {
            let role = ["--jobmanager", addr, "--slots", "2"].map(String::from);
            word_count(job, &role, &[], &log(name))
        })
        .collect()
}

/// Waits up to `within` for the job manager's end, which must be a success: its stdout.
fn succeeded(jm: Child, within: Duration, log: &Path) -> String {
    let jm = wait_output(jm, within);
    let stdout = String::from_utf8_lossy(&jm.stdout).into_owned();
    assert!(jm.status.success(), "{stdout}\n{}", log_tail(log));
    stdout
}

/// The highest id of a complete checkpoint (`…/chk-<n>/_metadata`) in the bucket, or 0.
fn latest_checkpoint(bucket: &Path) -> u64 {
    files_under(bucket)
        .iter()
        .filter_map(|f| f.strip_suffix("/_metadata"))
        .filter_map(|d| d.rsplit('/').next()?.strip_prefix("chk-")?.parse().ok())
        .max()
        .unwrap_or(0)
}

fn completed_checkpoints(bucket: &Path) -> usize {
    files_under(bucket)
        .iter()
        .filter(|f| f.ends_with("/_metadata"))
        .count()
}

#[test]
fn a_task_manager_killed_mid_run_is_replaced_and_the_totals_are_exact() {
    let server = S3Server::start("weir-cluster");
    let env = server.env();
    let tmp = tempfile::tempdir().unwrap();
    let records = 1_500_000u64;
    let out = tmp.path().join("totals.csv");
    let sums = tmp.path().join("sums");
    let job: Vec<String> = [
        "--records",
        &records.to_string(),
        "--parallelism",
        "4",
        "--checkpoint-interval",
        "50ms",
        "--checkpoint-dir",
        "s3://weir-cluster/wc",
        "--running-sums",
        sums.to_str().unwrap(),
        // Stretches the run so that the kill lands in its middle.
        "--sink-delay",
        "2us",
        "--heartbeat-interval",
        "100ms",
        "--heartbeat-timeout",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let mut procs = Processes(Vec::new());
    procs.0.push(word_count(
        &job,
        &[
            "--role".into(),
            "jobmanager".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--output".into(),
            out.to_str().unwrap().into(),
        ],
        &env,
        &log("jobmanager"),
    ));
    let addr = listening_addr(&log("jobmanager"), Duration::from_secs(60));
    let task_manager = |name: &str| {
        word_count(
            &job,
            &[
                "--jobmanager".into(),
                addr.clone(),
                "--slots".into(),
                "2".into(),
            ],
            &env,
            &log(name),
        )
    };
    procs.0.push(task_manager("tm1"));
    procs.0.push(task_manager("tm2"));

    // Once checkpoint 8 is complete in the bucket (far enough in that the restore visibly
    // resumes the sources), the first task manager dies.
    let give_up = Instant::now() + Duration::from_secs(120);
    while latest_checkpoint(&server.bucket_dir()) < 8 {
        assert!(
            Instant::now() < give_up,
            "no checkpoint completed; job manager log:\n{}",
            log_tail(&log("jobmanager"))
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    procs.0[1].kill().unwrap();
    procs.0[1].wait().unwrap();
    procs.0.push(task_manager("tm3"));

    let jm = procs.0.remove(0);
    let jm = wait_output(jm, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&jm.stdout).into_owned();
    assert!(
        jm.status.success(),
        "job manager failed; stdout:\n{stdout}\nlog:\n{}",
        log_tail(&log("jobmanager"))
    );
    assert_eq!(
        parse_totals(&out),
        expected_totals(records, 42),
        "exactly-once totals after losing a task manager, as computed without the engine"
    );
    // Each running count was committed once, by the lost task manager or by another.
    processes::assert_running_sums(&sums, &parse_totals(&out));
    assert!(
        summary_field(&stdout, "restarts") >= 1,
        "the kill did not land mid-run:\n{stdout}"
    );
    // The failover restored the checkpoint: the sources resumed rather than started over.
    processes::assert_restored(&stdout, records, &[]);
    let jm_log = std::fs::read_to_string(log("jobmanager")).unwrap();
    assert!(
        jm_log.contains("a task manager running subtasks was lost"),
        "the loss was not detected by heartbeats:\n{}",
        log_tail(&log("jobmanager"))
    );
    assert!(
        jm_log.contains("restoring"),
        "the job did not restore from a checkpoint:\n{}",
        log_tail(&log("jobmanager"))
    );

    // The survivors and the replacement leave when the job ends.
    for tm in procs.0.drain(1..) {
        let o = wait_output(tm, Duration::from_secs(30));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        assert!(String::from_utf8_lossy(&o.stdout).contains("task manager done"));
    }
    let tm3_log = std::fs::read_to_string(log("tm3")).unwrap();
    assert!(
        tm3_log.contains("deployed"),
        "the replacement ran no subtasks:\n{}",
        log_tail(&log("tm3"))
    );
}

#[test]
fn a_task_manager_with_other_job_arguments_is_refused_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let chk = tmp.path().join("chk");
    let job = |parallelism: &str| -> Vec<String> {
        [
            "--records",
            "1000",
            "--parallelism",
            parallelism,
            "--checkpoint-interval",
            "50ms",
            "--checkpoint-dir",
            chk.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut procs = Processes(Vec::new());
    procs.0.push(word_count(
        &job("2"),
        &[
            "--role".into(),
            "jobmanager".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ],
        &[],
        &tmp.path().join("jobmanager.log"),
    ));
    let addr = listening_addr(&tmp.path().join("jobmanager.log"), Duration::from_secs(60));
    // Built with parallelism 3, its job graph is not the job manager's.
    let tm = word_count(
        &job("3"),
        &[
            "--jobmanager".into(),
            addr.clone(),
            "--slots".into(),
            "2".into(),
        ],
        &[],
        &tmp.path().join("tm.log"),
    );
    let out = wait_output(tm, Duration::from_secs(60));
    assert!(!out.status.success(), "a mismatched task manager ran");
    let log = std::fs::read_to_string(tmp.path().join("tm.log")).unwrap();
    assert!(
        log.contains("registration refused") && log.contains("another job graph"),
        "{log}"
    );
    // The job manager is still up, waiting for a fitting task manager; nothing was written.
    assert!(procs.0[0].try_wait().unwrap().is_none());
    assert!(
        !chk.exists() || files_under(&chk).iter().all(|f| !f.ends_with("_metadata")),
        "a checkpoint completed without task managers"
    );
}

#[test]
fn a_job_manager_started_again_with_from_resumes_the_job_on_the_same_task_managers() {
    let server = S3Server::start("weir-jm");
    let env = server.env();
    let tmp = tempfile::tempdir().unwrap();
    let records = 1_500_000u64;
    let out = tmp.path().join("totals.csv");
    let addr = format!("127.0.0.1:{}", free_port());
    let job: Vec<String> = [
        "--records",
        &records.to_string(),
        "--parallelism",
        "4",
        "--checkpoint-interval",
        "50ms",
        "--checkpoint-dir",
        "s3://weir-jm/wc",
        "--sink-delay",
        "2us",
        "--heartbeat-interval",
        "100ms",
        "--heartbeat-timeout",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let job_manager = |name: &str, extra: &[&str]| {
        let mut role: Vec<String> = vec![
            "--role".into(),
            "jobmanager".into(),
            "--listen".into(),
            addr.clone(),
            "--output".into(),
            out.to_str().unwrap().into(),
        ];
        role.extend(extra.iter().map(|s| s.to_string()));
        word_count(&job, &role, &env, &log(name))
    };
    let mut procs = Processes(Vec::new());
    procs.0.push(job_manager("jm1", &[]));
    for name in ["tm1", "tm2"] {
        procs.0.push(word_count(
            &job,
            &[
                "--jobmanager".into(),
                addr.clone(),
                "--slots".into(),
                "2".into(),
            ],
            &env,
            &log(name),
        ));
    }
    let give_up = Instant::now() + Duration::from_secs(120);
    while completed_checkpoints(&server.bucket_dir()) == 0 {
        assert!(
            Instant::now() < give_up,
            "no checkpoint completed; job manager log:\n{}",
            log_tail(&log("jm1"))
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The job manager dies; the task managers lose it, stop their subtasks and keep trying to
    // register. A new job manager at the same address resumes from the latest checkpoint.
    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    assert!(!out.exists(), "the first job manager wrote totals");
    let jm = job_manager("jm2", &["--from", "s3://weir-jm/wc"]);
    let jm = wait_output(jm, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&jm.stdout).into_owned();
    assert!(
        jm.status.success(),
        "the second job manager failed; stdout:\n{stdout}\nlog:\n{}",
        log_tail(&log("jm2"))
    );
    assert_eq!(
        parse_totals(&out),
        expected_totals(records, 42),
        "exactly-once totals across a job manager restart"
    );
    let jm2_log = std::fs::read_to_string(log("jm2")).unwrap();
    assert!(jm2_log.contains("restoring"), "{}", log_tail(&log("jm2")));
    // Exact only because the checkpoint's state was used: the sources resumed.
    processes::assert_restored(&stdout, records, &[]);
    for tm in procs.0.drain(1..) {
        let o = wait_output(tm, Duration::from_secs(30));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }
    for name in ["tm1", "tm2"] {
        let text = std::fs::read_to_string(log(name)).unwrap();
        assert!(
            text.matches("registered with the job manager").count() >= 2,
            "{name} did not register with the new job manager:\n{}",
            log_tail(&log(name))
        );
    }
}

#[test]
fn stop_with_savepoint_on_a_cluster_resumes_exactly_in_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let records = 1_500_000u64;
    let savepoints = tmp.path().join("savepoints");
    let sums = tmp.path().join("sums");
    let job: Vec<String> = [
        "--records",
        &records.to_string(),
        "--parallelism",
        "4",
        "--checkpoint-interval",
        "50ms",
        "--checkpoint-dir",
        tmp.path().join("chk").to_str().unwrap(),
        "--savepoint-dir",
        savepoints.to_str().unwrap(),
        "--running-sums",
        sums.to_str().unwrap(),
        "--sink-delay",
        "2us",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let mut procs = Processes(Vec::new());
    let jm = word_count(
        &job,
        &[
            "--role".into(),
            "jobmanager".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--stop-with-savepoint-after".into(),
            "300000".into(),
        ],
        &[],
        &log("jobmanager"),
    );
    let addr = listening_addr(&log("jobmanager"), Duration::from_secs(60));
    procs.0.extend(two_task_managers(&job, &addr, &log));
    let stdout = succeeded(jm, Duration::from_secs(120), &log("jobmanager"));
    let savepoint = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint: "))
        .unwrap_or_else(|| panic!("no savepoint line:\n{stdout}"))
        .trim_start_matches("file://")
        .to_string();
    // Every task manager took the savepoint's directory before its barriers.
    for name in ["tm1", "tm2"] {
        let text = std::fs::read_to_string(log(name)).unwrap();
        assert!(
            text.contains("savepoint target taken"),
            "{name}:\n{}",
            log_tail(&log(name))
        );
    }
    for tm in procs.0.drain(..) {
        let o = wait_output(tm, Duration::from_secs(30));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }
    // The rest of the input, in one process at another parallelism: each record counts once.
    let out = tmp.path().join("totals.csv");
    let run = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args([
            "--records",
            &records.to_string(),
            "--parallelism",
            "3",
            "--sink-delay",
            "2us",
            "--from",
            &savepoint,
            "--checkpoint-dir",
            tmp.path().join("chk2").to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--running-sums",
            sums.to_str().unwrap(),
        ])
        .output_bounded()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(parse_totals(&out), expected_totals(records, 42));
    // Exact only because the cluster's savepoint was used: this run resumed from it.
    processes::assert_restored(
        &String::from_utf8_lossy(&run.stdout),
        records,
        &[Path::new(&savepoint)],
    );
    // Each running count was committed once, by the cluster or by the one process.
    processes::assert_running_sums(&sums, &parse_totals(&out));
}

/// A savepoint outside the job's checkpoint storage restores into the disk backend on task
/// managers: the job manager reads only the headers, and each task manager opens the savepoint's
/// storage from its location and downloads the sections its subtasks own (so the restore is
/// bounded by neither process's memory). The savepoint is taken in one process at parallelism
/// 2; the cluster resumes at 4, and its totals are exact.
#[test]
fn a_savepoint_restores_into_disk_on_task_managers_that_download_their_sections() {
    let tmp = tempfile::tempdir().unwrap();
    let records = 600_000u64;
    let savepoints = tmp.path().join("savepoints");
    let path = |name: &str| tmp.path().join(name).to_str().unwrap().to_string();
    let shared: Vec<String> = [
        "--records",
        &records.to_string(),
        "--key-space",
        "5000",
        "--state-backend",
        "disk",
        "--state-dir",
        &path("state"),
        "--checkpoint-interval",
        "50ms",
        "--sink-delay",
        "2us",
        "--no-rest",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let first = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args(&shared)
        .args([
            "--parallelism",
            "2",
            "--checkpoint-dir",
            &path("chk-1"),
            "--savepoint-dir",
            savepoints.to_str().unwrap(),
            "--stop-with-savepoint-after",
            "200000",
        ])
        .output_bounded()
        .unwrap();
    let stdout = String::from_utf8_lossy(&first.stdout).into_owned();
    assert!(first.status.success(), "{stdout}");
    let savepoint = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stopped with savepoint: "))
        .unwrap_or_else(|| panic!("no savepoint line:\n{stdout}"))
        .trim_start_matches("file://")
        .to_string();
    let mut job = shared;
    job.extend(
        ["--parallelism", "4", "--checkpoint-dir", &path("chk-2")]
            .iter()
            .map(|s| s.to_string()),
    );
    let out = tmp.path().join("totals.csv");
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let mut procs = Processes(Vec::new());
    let jm = word_count(
        &job,
        &[
            "--role".into(),
            "jobmanager".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--from".into(),
            savepoint.clone(),
            "--output".into(),
            out.to_str().unwrap().into(),
        ],
        &[],
        &log("jobmanager"),
    );
    let addr = listening_addr(&log("jobmanager"), Duration::from_secs(60));
    procs.0.extend(two_task_managers(&job, &addr, &log));
    let stdout = succeeded(jm, Duration::from_secs(180), &log("jobmanager"));
    assert_eq!(
        parse_totals(&out),
        weir_examples::expected_totals_in(records, 42, 5000)
    );
    processes::assert_restored(&stdout, records, &[Path::new(&savepoint)]);
    for tm in procs.0.drain(..) {
        let o = wait_output(tm, Duration::from_secs(30));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    }
    // Each task manager downloaded its subtasks' sections from the savepoint's directory.
    for name in ["tm1", "tm2"] {
        let text = std::fs::read_to_string(log(name)).unwrap();
        assert!(
            text.contains("downloaded the keyed sections of canonical snapshots"),
            "{name}:\n{}",
            log_tail(&log(name))
        );
    }
}

/// A task manager lost with no replacement: the failover cannot find enough slots within the
/// slot timeout, which, like Flink's NoResourceAvailableException, is a failure for the restart
/// strategy: the job manager deploys again, and again, until a replacement registers; the job
/// then resumes from its checkpoint and its totals are exact.
#[test]
fn a_task_manager_lost_with_no_replacement_waits_through_the_restart_strategy() {
    let tmp = tempfile::tempdir().unwrap();
    let records = 1_500_000u64;
    let out = tmp.path().join("totals.csv");
    let chk = tmp.path().join("chk");
    let job: Vec<String> = [
        "--records",
        &records.to_string(),
        "--parallelism",
        "4",
        "--checkpoint-interval",
        "50ms",
        "--checkpoint-dir",
        chk.to_str().unwrap(),
        "--sink-delay",
        "2us",
        "--heartbeat-interval",
        "100ms",
        "--heartbeat-timeout",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let mut procs = Processes(Vec::new());
    procs.0.push(word_count(
        &job,
        &[
            "--role".into(),
            "jobmanager".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--slot-timeout".into(),
            "500ms".into(),
            "--output".into(),
            out.to_str().unwrap().into(),
        ],
        &[],
        &log("jobmanager"),
    ));
    let addr = listening_addr(&log("jobmanager"), Duration::from_secs(60));
    let task_manager = |name: &str| {
        word_count(
            &job,
            &[
                "--jobmanager".into(),
                addr.clone(),
                "--slots".into(),
                "2".into(),
            ],
            &[],
            &log(name),
        )
    };
    procs.0.push(task_manager("tm1"));
    procs.0.push(task_manager("tm2"));
    let give_up = Instant::now() + Duration::from_secs(120);
    while !chk.is_dir() || files_under(&chk).iter().all(|f| !f.ends_with("/_metadata")) {
        assert!(
            Instant::now() < give_up,
            "no checkpoint completed; job manager log:\n{}",
            log_tail(&log("jobmanager"))
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    procs.0[1].kill().unwrap();
    procs.0[1].wait().unwrap();
    // No replacement until the job manager went through the restart strategy twice.
    let deploying_again = |text: &str| text.matches("not enough slots; deploying again").count();
    while deploying_again(&std::fs::read_to_string(log("jobmanager")).unwrap_or_default()) < 2 {
        assert!(
            Instant::now() < give_up,
            "the missing slots never went to the restart strategy; job manager log:\n{}",
            log_tail(&log("jobmanager"))
        );
        assert!(
            procs.0[0].try_wait().unwrap().is_none(),
            "the job manager gave up instead of restarting:\n{}",
            log_tail(&log("jobmanager"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    procs.0.push(task_manager("tm3"));
    let jm = procs.0.remove(0);
    let jm = wait_output(jm, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&jm.stdout).into_owned();
    assert!(
        jm.status.success(),
        "job manager failed; stdout:\n{stdout}\nlog:\n{}",
        log_tail(&log("jobmanager"))
    );
    assert_eq!(parse_totals(&out), expected_totals(records, 42));
    assert!(
        summary_field(&stdout, "restarts") >= 3,
        "the loss and two deployments without slots are restarts:\n{stdout}"
    );
}
