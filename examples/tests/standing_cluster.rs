//! A standing cluster (Flink's session cluster): two task managers started with only
//! `--jobmanager` and `--slots` run job after job, each built from the arguments of the job
//! manager that runs it, with different parallelism, records and seeds; each job's totals are
//! exact, and the last job manager's REST API lists the jobs that ran on the cluster before it,
//! as its task managers remember them.

#[path = "support/processes.rs"]
mod processes;

use processes::{Processes, StderrLines, free_port, log_tail, parse_totals, wait_output};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir_examples::expected_totals;

fn word_count(args: &[&str], log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// A job manager at `listen` running `job`, its REST API on a free port, announced on stderr.
fn job_manager(listen: &str, job: &[&str]) -> (Child, StderrLines) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_word_count"))
        .args(job)
        .args(["--role", "jobmanager", "--listen", listen])
        .args(["--heartbeat-interval", "100ms", "--heartbeat-timeout", "2s"])
        .args(["--rest-address", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = StderrLines::read(child.stderr.take().unwrap());
    (child, lines)
}

/// The REST API's address and the job's id, from the job manager's stderr.
fn rest_of(lines: &mut StderrLines) -> (String, String) {
    lines.wait_for("REST API: http://", Duration::from_secs(60));
    let line = lines
        .so_far()
        .iter()
        .find(|l| l.contains("REST API: http://"))
        .unwrap()
        .clone();
    let address = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let job = line
        .rsplit("(job ")
        .next()
        .unwrap()
        .trim_end_matches(')')
        .to_string();
    (address, job)
}

/// A GET on the REST API: the JSON it answers.
fn get(address: &str, path: &str) -> Value {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    // axum answers these with a length, not in chunks.
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

fn finished_exactly(jm: Child, lines: StderrLines, out: &Path, records: u64, seed: u64) {
    let o = wait_output(jm, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = lines.all(Duration::from_secs(5));
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        parse_totals(out),
        expected_totals(records, seed),
        "exact totals of {records} records of seed {seed}, computed without the engine"
    );
}

#[test]
fn standing_task_managers_run_job_after_job_and_the_cluster_lists_its_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name).to_string_lossy().to_string();
    let listen = format!("127.0.0.1:{}", free_port());
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    // The task managers come first, and wait: no job manager is up yet.
    let mut tms = Processes(Vec::new());
    for name in ["tm1", "tm2"] {
        tms.0.push(word_count(
            &["--jobmanager", &listen, "--slots", "2"],
            &log(name),
        ));
    }

    // Job 1: parallelism 4 over both task managers, checkpoints every 50 ms.
    let ck = path("ck");
    let out1 = path("out1.csv");
    let (jm, mut lines) = job_manager(
        &listen,
        &[
            "--records",
            "300000",
            "--parallelism",
            "4",
            "--checkpoint-interval",
            "50ms",
            "--checkpoint-dir",
            &ck,
            "--output",
            &out1,
        ],
    );
    let (_, job1) = rest_of(&mut lines);
    finished_exactly(jm, lines, Path::new(&out1), 300_000, 42);
    // The task managers outlived the job.
    for (i, tm) in tms.0.iter_mut().enumerate() {
        assert!(
            tm.try_wait().unwrap().is_none(),
            "task manager {} exited after the first job:\n{}",
            i + 1,
            log_tail(&log(&format!("tm{}", i + 1)))
        );
    }

    // Job 2, another job manager at the same address: other records, seed and parallelism. At
    // parallelism 3 it needs both task managers' slots, so each must build it (at 2 it fitted in
    // one task manager, and finished before the other asked the new job manager for a job).
    let out2 = path("out2.csv");
    let (jm, mut lines) = job_manager(
        &listen,
        &[
            "--records",
            "200000",
            "--seed",
            "7",
            "--parallelism",
            "3",
            "--checkpoint-interval",
            "50ms",
            "--checkpoint-dir",
            &ck,
            "--output",
            &out2,
        ],
    );
    let (_, job2) = rest_of(&mut lines);
    finished_exactly(jm, lines, Path::new(&out2), 200_000, 7);

    // Job 3 runs until cancelled; its REST API lists the cluster's jobs.
    let (jm, mut lines) = job_manager(
        &listen,
        &[
            "--records",
            "0",
            "--parallelism",
            "4",
            "--checkpoint-interval",
            "100ms",
            "--checkpoint-dir",
            &ck,
        ],
    );
    let (rest, job3) = rest_of(&mut lines);
    let give_up = Instant::now() + Duration::from_secs(60);
    let listed = loop {
        let jobs = get(&rest, "/jobs/overview");
        let running = jobs["jobs"][0]["state"] == "RUNNING"
            && get(&rest, &format!("/jobs/{job3}/checkpoints"))["counts"]["completed"].as_u64()
                > Some(0);
        if running && jobs["jobs"].as_array().unwrap().len() == 3 {
            break jobs;
        }
        assert!(
            Instant::now() < give_up,
            "the cluster's jobs were not listed: {jobs}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let entries: Vec<(String, String)> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["jid"].as_str().unwrap().to_string(),
                j["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        entries,
        vec![
            (job3.clone(), "RUNNING".to_string()),
            (job1, "FINISHED".to_string()),
            (job2, "FINISHED".to_string()),
        ]
    );
    assert_eq!(get(&rest, "/overview")["jobs-finished"], 2);
    // A past job answers as its task managers remember it.
    let past = get(&rest, &format!("/jobs/{}", entries[1].0));
    assert_eq!(
        (past["jid"].as_str(), past["state"].as_str()),
        (Some(entries[1].0.as_str()), Some("FINISHED"))
    );
    assert!(
        past["end-time"].as_u64() >= past["start-time"].as_u64(),
        "{past}"
    );
    // The task managers' counts reach the job manager: every vertex's records move.
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let job = get(&rest, &format!("/jobs/{job3}"));
        let counted: Vec<u64> = job["vertices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                let m = &v["metrics"];
                m["write-records"]
                    .as_u64()
                    .or(m["read-records"].as_u64())
                    .unwrap()
            })
            .collect();
        if counted.len() == 2 && counted.iter().all(|n| *n > 10_000) {
            break;
        }
        assert!(Instant::now() < give_up, "no records counted: {job}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // `weir list` shows them, with Flink's line per job.
    let cli = <weir_runtime::cli::Cli as clap::Parser>::try_parse_from([
        "weir".to_string(),
        "list".to_string(),
        "--rest".to_string(),
        format!("http://{rest}"),
    ])
    .unwrap();
    let mut out = Vec::new();
    let code = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(weir_runtime::cli::run(&cli, &mut out))
        .unwrap();
    assert_eq!(code, 0);
    let out = String::from_utf8(out).unwrap();
    // Flink's sections: the running job, then the terminated ones.
    assert!(
        out.starts_with("------------------ Running/Restarting Jobs"),
        "{out}"
    );
    assert!(
        out.contains("---------------------- Terminated Jobs"),
        "{out}"
    );
    let lines: Vec<&str> = out.lines().filter(|l| l.contains(" : ")).collect();
    assert_eq!(lines.len(), 3, "{out}");
    for ((id, state), line) in entries.iter().zip(&lines) {
        assert!(
            line.contains(&format!(" : {id} : word_count ({state})")),
            "{line}"
        );
    }
    let mut stream = std::net::TcpStream::connect(&rest).unwrap();
    write!(
        stream,
        "PATCH /jobs/{job3}?mode=cancel HTTP/1.1\r\nHost: {rest}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let o = wait_output(jm, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(130), "job 3 was cancelled");

    // Each task manager built each job from its job manager's arguments.
    for name in ["tm1", "tm2"] {
        let text = std::fs::read_to_string(log(name)).unwrap();
        let built = text.matches("building the job manager's job").count();
        assert!(
            built >= 3,
            "{name} built {built} jobs:\n{}",
            log_tail(&log(name))
        );
    }
    drop(tms);
}

/// A job manager killed mid-job, and another at the same address with other arguments (the same
/// graph): the standing task managers do not go on with the lost job's arguments, they build
/// the new job from its job manager's, and its totals are exact.
#[test]
fn after_a_job_manager_is_killed_the_next_job_is_built_from_its_own_arguments() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |name: &str| tmp.path().join(name).to_string_lossy().to_string();
    let listen = format!("127.0.0.1:{}", free_port());
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let mut tms = Processes(Vec::new());
    for name in ["tm1", "tm2"] {
        tms.0.push(word_count(
            &[
                "--jobmanager",
                &listen,
                "--slots",
                "1",
                "--heartbeat-interval",
                "100ms",
                "--heartbeat-timeout",
                "2s",
            ],
            &log(name),
        ));
    }
    let ck = path("ck");
    // Job A: unbounded, seed 42; killed once it has checkpointed.
    let (mut jm, mut lines) = job_manager(
        &listen,
        &[
            "--records",
            "0",
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "50ms",
            "--checkpoint-dir",
            &ck,
        ],
    );
    let (rest, job_a) = rest_of(&mut lines);
    let give_up = Instant::now() + Duration::from_secs(60);
    while get(&rest, &format!("/jobs/{job_a}/checkpoints"))["counts"]["completed"].as_u64()
        < Some(2)
    {
        assert!(Instant::now() < give_up, "job A did not checkpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    jm.kill().unwrap();
    jm.wait().unwrap();
    // Job B at once, before the task managers' heartbeats give A up: bounded, seed 7.
    let out = path("out-b.csv");
    let (jm, lines) = job_manager(
        &listen,
        &[
            "--records",
            "100000",
            "--seed",
            "7",
            "--parallelism",
            "2",
            "--checkpoint-interval",
            "50ms",
            "--checkpoint-dir",
            &ck,
            "--output",
            &out,
        ],
    );
    finished_exactly(jm, lines, Path::new(&out), 100_000, 7);
    for name in ["tm1", "tm2"] {
        let text = std::fs::read_to_string(log(name)).unwrap();
        assert_eq!(
            text.matches("building the job manager's job").count(),
            2,
            "{name} did not build job B from its arguments:\n{}",
            log_tail(&log(name))
        );
    }
    drop(tms);
}
