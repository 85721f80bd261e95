//! The REST API against a running job, over a real socket: Flink's read endpoints answer with
//! the job's checkpoints, a savepoint triggered over HTTP lands on disk, `/metrics` carries
//! Flink's checkpoint metric names, malformed and oversized requests get a JSON 4xx, a
//! read-only API refuses every change, and a cancel over HTTP ends the job.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::Bounded;

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use weir_runtime::rest::RestOptions;
use weir_runtime::{JobClient, JobError, JobStatus, StreamEnvironment};

/// One HTTP/1.1 request; the status and body.
fn http(address: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // A server may answer (and close) before reading all of an oversized body.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

fn json(address: &str, path: &str) -> Value {
    let (status, body) = http(address, "GET", path, b"");
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// An unbounded job with checkpoints every 20 ms, its REST API on a free loopback port.
fn job(read_only: bool) -> (StreamEnvironment, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(20))
        .set_checkpoint_dir(dir.path().join("checkpoints"))
        .set_savepoint_dir(dir.path().join("savepoints"));
    env.config_mut().rest = Some(RestOptions {
        address: "127.0.0.1:0".parse().unwrap(),
        port_attempts: 0,
        allow_remote: false,
        read_only,
    });
    let _ = env
        .from_generator(None, |i| (i % 7, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .latest_per_key();
    (env, dir)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn address_of(client: &JobClient) -> String {
    let mut address = None;
    wait_for("the REST API", || {
        address = client.view().rest_address;
        address.is_some()
    });
    address.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_api_reports_checkpoints_takes_a_savepoint_and_cancels() {
    let (env, dir) = job(false);
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    let job_id = tokio::task::spawn_blocking(move || {
        let a = address_of(&c);
        let jobs = json(&a, "/jobs");
        let id = jobs["jobs"][0]["id"].as_str().unwrap().to_string();
        assert_eq!(id.len(), 32);
        assert_eq!(jobs["jobs"][0]["status"], "RUNNING");
        assert_eq!(json(&a, "/overview")["jobs-running"], 1);
        let job = json(&a, &format!("/jobs/{id}"));
        assert_eq!(job["state"], "RUNNING");
        assert!(!job["vertices"].as_array().unwrap().is_empty());
        // Checkpoints complete; their statistics are Flink's.
        wait_for("two completed checkpoints", || {
            json(&a, &format!("/jobs/{id}/checkpoints"))["counts"]["completed"]
                .as_u64()
                .unwrap()
                >= 2
        });
        let cps = json(&a, &format!("/jobs/{id}/checkpoints"));
        let latest = &cps["latest"]["completed"];
        assert_eq!(latest["status"], "COMPLETED");
        assert!(latest["state_size"].as_u64().unwrap() > 0);
        assert!(
            cps["summary"]["end_to_end_duration"]["max"]
                .as_u64()
                .is_some()
        );
        assert!(!cps["history"].as_array().unwrap().is_empty());
        let cid = latest["id"].as_u64().unwrap();
        let details = json(&a, &format!("/jobs/{id}/checkpoints/details/{cid}"));
        assert_eq!(details["id"], cid);
        let vertex = details["tasks"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        let subtasks = json(
            &a,
            &format!("/jobs/{id}/checkpoints/details/{cid}/subtasks/{vertex}"),
        );
        assert_eq!(subtasks["subtasks"].as_array().unwrap().len(), 2);
        let config = json(&a, &format!("/jobs/{id}/checkpoints/config"));
        assert_eq!(config["interval"], 20);
        assert_eq!(config["mode"], "exactly_once");
        // /metrics: Prometheus text with Flink's names.
        let (status, metrics) = http(&a, "GET", "/metrics", b"");
        assert_eq!(status, 200);
        let completed = metrics
            .lines()
            .find(|l| l.starts_with("flink_jobmanager_job_numberOfCompletedCheckpoints{"))
            .unwrap_or_else(|| panic!("{metrics}"));
        let n: f64 = completed.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 2.0, "{completed}");
        assert!(metrics.contains("flink_jobmanager_job_lastCheckpointDuration{"));
        assert!(metrics.contains("flink_jobmanager_job_numRestarts{"));
        // Per subtask, the last completed checkpoint's alignment and start delay (ns).
        for name in ["checkpointAlignmentTime", "checkpointStartDelayNanos"] {
            let lines = metrics
                .lines()
                .filter(|l| l.starts_with(&format!("flink_taskmanager_job_task_{name}{{")))
                .count();
            assert_eq!(
                lines, 6,
                "{name}: three vertices of two subtasks:\n{metrics}"
            );
        }
        // Records per vertex: the source's written, the sum's read, both moving.
        let count = |m: &str, name: &str| -> f64 {
            m.lines()
                .filter(|l| l.starts_with(name))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum()
        };
        assert!(
            count(&metrics, "flink_taskmanager_job_task_numRecordsOut{") > 0.0,
            "{metrics}"
        );
        assert!(
            count(&metrics, "flink_taskmanager_job_task_numRecordsIn{") > 0.0,
            "{metrics}"
        );
        let job = json(&a, &format!("/jobs/{id}"));
        let vertices = job["vertices"].as_array().unwrap();
        assert!(
            vertices
                .iter()
                .any(|v| v["metrics"]["write-records"].as_u64() > Some(0))
        );
        assert!(
            vertices
                .iter()
                .any(|v| v["metrics"]["read-records"].as_u64() > Some(0))
        );
        // A savepoint over HTTP: a trigger id, then its location, a savepoint on disk.
        let (status, body) = http(&a, "POST", &format!("/jobs/{id}/savepoints"), b"{}");
        assert_eq!(status, 202, "{body}");
        let trigger: Value = serde_json::from_str(&body).unwrap();
        let trigger = trigger["request-id"].as_str().unwrap().to_string();
        let mut location = String::new();
        wait_for("the savepoint", || {
            let op = json(&a, &format!("/jobs/{id}/savepoints/{trigger}"));
            if op["status"]["id"] == "COMPLETED" {
                location = op["operation"]["location"].as_str().unwrap().to_string();
                true
            } else {
                false
            }
        });
        let on_disk = location.strip_prefix("file://").unwrap_or(&location);
        assert!(
            std::path::Path::new(on_disk).join("_metadata").is_file(),
            "{location}"
        );
        // Bad requests: JSON errors, never a panic.
        for (method, path, body, want) in [
            (
                "POST",
                format!("/jobs/{id}/savepoints"),
                b"{not json".to_vec(),
                400,
            ),
            (
                "POST",
                format!("/jobs/{id}/savepoints"),
                b"[1,2]".to_vec(),
                400,
            ),
            (
                "POST",
                format!("/jobs/{id}/savepoints"),
                br#"{"cancel-job": 3}"#.to_vec(),
                400,
            ),
            (
                "POST",
                format!("/jobs/{id}/stop"),
                br#"{"drain": "yes"}"#.to_vec(),
                400,
            ),
            (
                "POST",
                format!("/jobs/{id}/savepoints"),
                vec![b' '; 200_000],
                413,
            ),
            (
                "GET",
                format!("/jobs/{id}/checkpoints/details/x"),
                vec![],
                400,
            ),
            (
                "GET",
                format!("/jobs/{id}/checkpoints/details/99999"),
                vec![],
                404,
            ),
            ("GET", "/jobs/0123/checkpoints".to_string(), vec![], 404),
            ("GET", "/no/such/path".to_string(), vec![], 404),
            ("PATCH", format!("/jobs/{id}?mode=stop"), vec![], 400),
            ("DELETE", format!("/jobs/{id}"), vec![], 405),
            ("GET", format!("/jobs/{id}%FF/checkpoints"), vec![], 400),
            (
                "POST",
                format!("/jobs/{id}/savepoints"),
                br#"{"target-directory": " "}"#.to_vec(),
                400,
            ),
        ] {
            let (status, text) = http(&a, method, &path, &body);
            assert_eq!(status, want, "{method} {path}: {text}");
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{text}"));
            assert!(v["errors"].is_array(), "{text}");
        }
        // Cancel.
        let (status, _) = http(&a, "PATCH", &format!("/jobs/{id}?mode=cancel"), b"");
        assert_eq!(status, 202);
        id
    })
    .await
    .unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.status, JobStatus::Canceled);
    assert_eq!(client.view().job_id, job_id);
    assert_eq!(client.view().state, "CANCELED");
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_rest_api_refuses_every_change() {
    let (env, _dir) = job(true);
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    tokio::task::spawn_blocking(move || {
        let a = address_of(&c);
        let id = c.view().job_id;
        for (method, path) in [
            ("POST", format!("/jobs/{id}/savepoints")),
            ("POST", format!("/jobs/{id}/checkpoints")),
            ("POST", format!("/jobs/{id}/stop")),
            ("PATCH", format!("/jobs/{id}?mode=cancel")),
        ] {
            let (status, body) = http(&a, method, &path, b"{}");
            assert_eq!(status, 403, "{method} {path}: {body}");
            assert!(body.contains("read-only"), "{body}");
        }
        assert_eq!(json(&a, &format!("/jobs/{id}"))["state"], "RUNNING");
    })
    .await
    .unwrap();
    client.cancel();
    assert_eq!(run.await.unwrap().unwrap().status, JobStatus::Canceled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_api_on_another_address_than_loopback_needs_allowing() {
    let (env, _dir) = job(false);
    env.config_mut().rest.as_mut().unwrap().address = "0.0.0.0:0".parse().unwrap();
    match env.execute().bounded().await {
        Err(JobError::Invalid(m)) => assert!(m.contains("not a loopback address"), "{m}"),
        other => panic!("{other:?}"),
    }
}

fn weir(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .output()
        .unwrap()
}

/// `weir list | checkpoint | savepoint | stop | cancel --rest URL` against running jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_weir_tool_lists_checkpoints_saves_and_stops_a_job_over_rest() {
    let (env, dir) = job(false);
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    let savepoints = dir.path().join("by-cli");
    let sp = savepoints.to_string_lossy().to_string();
    let stop_out = tokio::task::spawn_blocking(move || {
        let rest = format!("http://{}", address_of(&c));
        let id = c.view().job_id;
        let ok = |out: std::process::Output| {
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let listed = ok(weir(&["list", "--rest", &rest]));
        assert!(
            listed.contains(&id) && listed.contains("(RUNNING)"),
            "{listed}"
        );
        let cp = ok(weir(&["checkpoint", &id, "--rest", &rest]));
        assert!(cp.starts_with("Checkpoint completed"), "{cp}");
        let saved = ok(weir(&["savepoint", &id, &sp, "--rest", &rest]));
        let path = saved
            .trim()
            .strip_prefix("Savepoint completed. Path: ")
            .unwrap();
        let on_disk = path.strip_prefix("file://").unwrap_or(path);
        assert!(
            std::path::Path::new(on_disk).join("_metadata").is_file(),
            "{saved}"
        );
        assert!(on_disk.starts_with(&sp), "{on_disk} not under {sp}");
        // Usage errors: an unknown job, a bad URL; a server that is not there fails.
        let unknown = weir(&["cancel", "0123", "--rest", &rest]);
        assert_eq!(unknown.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&unknown.stderr).contains("not found"));
        assert_eq!(
            weir(&["list", "--rest", "https://x:1"]).status.code(),
            Some(2)
        );
        let gone = weir(&["list", "--rest", "http://127.0.0.1:9"]);
        assert_eq!(gone.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&gone.stderr).contains("cannot reach"));
        ok(weir(&[
            "stop",
            "--savepoint-path",
            &sp,
            &id,
            "--rest",
            &rest,
        ]))
    })
    .await
    .unwrap();
    assert!(
        stop_out.starts_with("Savepoint completed. Path: "),
        "{stop_out}"
    );
    let result = run.await.unwrap().unwrap();
    assert_eq!(
        result.status,
        JobStatus::Finished,
        "stopped with a savepoint"
    );
}

/// Live tuning: `PATCH /jobs/:jobid/checkpoints/config` shortens a running job's interval
/// (from an hour to 20 ms: checkpoints start at once), bad changes are refused naming the
/// problem, and a run restored from one of its checkpoints keeps the tuning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_s_checkpoint_interval_is_tuned_live_and_the_tuning_survives_a_restore() {
    let (env, dir) = job(false);
    env.enable_checkpointing(Duration::from_secs(3600));
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    tokio::task::spawn_blocking(move || {
        let a = address_of(&c);
        let id = c.view().job_id;
        let config = format!("/jobs/{id}/checkpoints/config");
        assert_eq!(json(&a, &config)["interval"], 3_600_000);
        for (body, says) in [
            (r#"{"interval": 0}"#, "greater than zero"),
            (r#"{"intervall": 5}"#, "'intervall' cannot be changed"),
            (r#"{"interval": "5"}"#, "whole number"),
            (r#"{}"#, "nothing to change"),
        ] {
            let (status, text) = http(&a, "PATCH", &config, body.as_bytes());
            assert_eq!(status, 400, "{body}: {text}");
            assert!(text.contains(says), "{body}: {text}");
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            json(&a, &format!("/jobs/{id}/checkpoints"))["counts"]["completed"],
            0,
            "no checkpoint within the hour"
        );
        let (status, text) = http(
            &a,
            "PATCH",
            &config,
            br#"{"interval": 20, "timeout": 60000}"#,
        );
        assert_eq!(status, 200, "{text}");
        let tuned: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (tuned["interval"].clone(), tuned["timeout"].clone()),
            (20.into(), 60_000.into())
        );
        wait_for("checkpoints at the new interval", || {
            json(&a, &format!("/jobs/{id}/checkpoints"))["counts"]["completed"]
                .as_u64()
                .unwrap()
                >= 3
        });
    })
    .await
    .unwrap();
    client.cancel();
    let first = run.await.unwrap().unwrap();
    let checkpoint = first.latest_checkpoint.expect("a retained checkpoint");
    // A new run, configured with the hour again, restored from the tuned job's checkpoint.
    let (env, _dir2) = job(false);
    env.enable_checkpointing(Duration::from_secs(3600))
        .set_checkpoint_dir(dir.path().join("checkpoints"))
        .restore_from(&checkpoint);
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    tokio::task::spawn_blocking(move || {
        let a = address_of(&c);
        let id = c.view().job_id;
        wait_for("the restored tuning", || {
            json(&a, &format!("/jobs/{id}/checkpoints/config"))["interval"] == 20
        });
        wait_for("checkpoints at the restored interval", || {
            json(&a, &format!("/jobs/{id}/checkpoints"))["counts"]["completed"]
                .as_u64()
                .unwrap()
                >= 2
        });
        // The restore, as Flink reports it: counted, its checkpoint and when.
        let cps = json(&a, &format!("/jobs/{id}/checkpoints"));
        assert_eq!(cps["counts"]["restored"], 1, "{cps}");
        let restored = &cps["latest"]["restored"];
        assert_eq!(restored["is_savepoint"], false, "{restored}");
        assert!(restored["id"].as_u64() > Some(0), "{restored}");
        let at = restored["restore_timestamp"].as_u64().unwrap();
        assert!(at >= c.view().start_time_ms, "{restored}");
        let (_, metrics) = http(&a, "GET", "/metrics", b"");
        assert_eq!(
            metric(
                &metrics,
                "flink_jobmanager_job_lastCheckpointRestoreTimestamp{"
            ),
            at as f64
        );
    })
    .await
    .unwrap();
    client.cancel();
    let second = run.await.unwrap().unwrap();
    assert_eq!(second.restored_from.as_deref(), Some(checkpoint.as_str()));
}

/// A client that holds a half-sent request open keeps neither the job nor its result: the
/// server is given a few seconds after the job's end, then dropped. An explicit address whose
/// port is taken fails the job naming it, rather than moving elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_client_does_not_hold_the_job_and_a_taken_port_is_refused() {
    let (env, _dir) = job(false);
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    let stalled = tokio::task::spawn_blocking(move || {
        let a = address_of(&c);
        let mut s = TcpStream::connect(&a).unwrap();
        s.write_all(b"GET /overview HTTP/1.1\r\nHost: x\r\n")
            .unwrap();
        (s, a)
    })
    .await
    .unwrap();
    let cancelled = Instant::now();
    client.cancel();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.status, JobStatus::Canceled);
    assert!(
        cancelled.elapsed() < Duration::from_secs(15),
        "the job waited {:?} for a stalled client",
        cancelled.elapsed()
    );
    let (_socket, taken) = stalled;
    // The address the first job had is free again; hold it and ask for it explicitly.
    let holder = std::net::TcpListener::bind(&taken).unwrap();
    let (env, _dir) = job(false);
    env.config_mut().rest.as_mut().unwrap().address = holder.local_addr().unwrap();
    match env.execute().bounded().await {
        Err(JobError::Invalid(m)) => assert!(m.contains("cannot listen on"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// The value of the metric line that starts with `prefix`.
fn metric(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in:\n{metrics}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_pressure_is_measured_where_the_credits_run_out_and_the_page_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let env = StreamEnvironment::new();
    env.set_parallelism(2)
        .enable_checkpointing(Duration::from_millis(50))
        .set_checkpoint_dir(dir.path().join("checkpoints"));
    env.config_mut().rest = Some(RestOptions {
        address: "127.0.0.1:0".parse().unwrap(),
        port_attempts: 0,
        allow_remote: false,
        read_only: false,
    });
    // The gate, after the exchange, holds every record: the source's output waits for credits
    // all the time, the gated vertex never.
    let gate = weir_runtime::testing::Gate::closed();
    let _ = env
        .from_generator(None, |i| (i % 7, 1i64))
        .key_by(|t: &(u64, i64)| &t.0)
        .sum()
        .through_gate(&gate)
        .latest_per_key();
    let client = JobClient::default();
    let run = tokio::spawn(env.execute_with(client.clone()).bounded());
    let c = client.clone();
    tokio::task::spawn_blocking(move || {
        let a = address_of(&c);
        let id = c.view().job_id;
        let job = json(&a, &format!("/jobs/{id}"));
        // The plan: the source feeds the sum's chain by hash, which feeds the sink's.
        let nodes = job["plan"]["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 3, "{job}");
        assert_eq!(nodes[2]["inputs"][0]["id"], nodes[1]["id"]);
        assert_eq!(nodes[0]["inputs"].as_array().unwrap().len(), 0);
        assert_eq!(nodes[1]["inputs"][0]["id"], nodes[0]["id"]);
        assert_eq!(nodes[1]["inputs"][0]["ship_strategy"], "HASH");
        let (source, sum) = (
            nodes[0]["id"].as_str().unwrap().to_string(),
            nodes[1]["id"].as_str().unwrap().to_string(),
        );
        // Over the rates' window (once it spans seconds) the source is back-pressured nearly
        // all the time.
        let source_metrics = |field: &str| {
            let job = json(&a, &format!("/jobs/{id}"));
            job["vertices"][0]["metrics"][field].clone()
        };
        wait_for("a second back-pressured per source subtask", || {
            source_metrics("accumulated-backpressured-time").as_u64() > Some(2000)
        });
        wait_for("the source's back pressure", || {
            let bp = json(&a, &format!("/jobs/{id}/vertices/{source}/backpressure"));
            bp["backpressure-level"] == "high"
                && bp["subtasks"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|s| s["ratio"].as_f64().unwrap() > 0.5)
        });
        let bp = json(&a, &format!("/jobs/{id}/vertices/{sum}/backpressure"));
        assert_eq!(bp["backpressure-level"], "ok", "{bp}");
        assert_eq!(bp["subtasks"].as_array().unwrap().len(), 2);
        let job = json(&a, &format!("/jobs/{id}"));
        let vertex = |vid: &str| {
            job["vertices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["id"] == vid)
                .unwrap()["metrics"]
                .clone()
        };
        assert_eq!(vertex(&source)["backpressure-level"], "high", "{job}");
        assert_eq!(vertex(&sum)["backpressure-level"], "ok", "{job}");
        let (status, metrics) = http(&a, "GET", "/metrics", b"");
        assert_eq!(status, 200);
        let source_label = format!("task_id=\"{source}\"");
        let bp_line = metrics
            .lines()
            .find(|l| {
                l.starts_with("flink_taskmanager_job_task_backPressuredTimeMsPerSecond{")
                    && l.contains(&source_label)
            })
            .unwrap_or_else(|| panic!("{metrics}"));
        let ms: f64 = bp_line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(ms > 500.0, "{bp_line}");
        assert_eq!(
            metric(
                &metrics,
                "flink_jobmanager_job_lastCheckpointRestoreTimestamp{"
            ),
            -1.0
        );
        for name in ["numRecordsOutPerSecond", "numRecordsInPerSecond"] {
            assert!(
                metrics.contains(&format!("flink_taskmanager_job_task_{name}{{")),
                "{name}: {metrics}"
            );
        }
        // The web UI: the page, its script and its style, from this server, with a policy that
        // lets it load nothing from elsewhere.
        for (path, kind, needle) in [
            ("/", "text/html", "checkpoint-timeline"),
            ("/web/app.js", "text/javascript", "renderTimeline"),
            ("/web/style.css", "text/css", ".cp-bar"),
        ] {
            let (status, head, body) = http_with_head(&a, path);
            assert_eq!(status, 200, "{path}");
            assert!(
                head.contains(&format!("content-type: {kind}")),
                "{path}: {head}"
            );
            assert!(
                head.contains("content-security-policy: default-src 'self'"),
                "{head}"
            );
            assert!(body.contains(needle), "{path}");
        }
        c.cancel();
    })
    .await
    .unwrap();
    let result = run.await.unwrap().unwrap();
    assert_eq!(result.status, JobStatus::Canceled);
    // The subtasks stopped mid-wait: their waits ended with them, none goes on being counted.
    let before = client.vertex_metrics();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(client.vertex_metrics(), before);
    assert!(
        before
            .values()
            .any(|v| v.backpressured_ms.iter().any(|ms| *ms > 0))
    );
}

/// A GET's status, its head (lower case) and its body.
fn http_with_head(address: &str, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// Flink's processed data: the bytes of records a subtask processed while it aligned barriers.
/// Exactly-once alignment processes some (the channels whose barrier is late go on); an
/// at-least-once job never aligns, so it reports none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_processed_during_alignment_is_reported_and_none_without_alignment() {
    for mode in [
        weir_runtime::CheckpointingMode::ExactlyOnce,
        weir_runtime::CheckpointingMode::AtLeastOnce,
    ] {
        let (env, _dir) = job(false);
        env.set_checkpointing_mode(mode);
        let client = JobClient::default();
        let run = tokio::spawn(env.execute_with(client.clone()).bounded());
        let c = client.clone();
        tokio::task::spawn_blocking(move || {
            let a = address_of(&c);
            let id = c.view().job_id;
            let processed = |cps: &Value| -> Vec<u64> {
                cps["history"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|h| h["status"] == "COMPLETED")
                    .map(|h| h["processed_data"].as_u64().unwrap())
                    .collect()
            };
            if mode == weir_runtime::CheckpointingMode::ExactlyOnce {
                wait_for("a checkpoint that processed data while aligning", || {
                    let cps = json(&a, &format!("/jobs/{id}/checkpoints"));
                    processed(&cps).iter().any(|n| *n > 0)
                });
                let cps = json(&a, &format!("/jobs/{id}/checkpoints"));
                assert!(cps["summary"]["processed_data"]["max"].as_u64() > Some(0));
                let (_, metrics) = http(&a, "GET", "/metrics", b"");
                assert!(
                    metric(
                        &metrics,
                        "flink_jobmanager_job_lastCheckpointProcessedData{"
                    ) >= 0.0
                );
            } else {
                wait_for("ten completed checkpoints", || {
                    let cps = json(&a, &format!("/jobs/{id}/checkpoints"));
                    cps["counts"]["completed"].as_u64() >= Some(10)
                });
                let cps = json(&a, &format!("/jobs/{id}/checkpoints"));
                assert!(processed(&cps).iter().all(|n| *n == 0), "{cps}");
            }
            c.cancel();
        })
        .await
        .unwrap();
        run.await.unwrap().unwrap();
    }
}
