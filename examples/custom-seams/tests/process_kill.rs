//! The `custom_seams_job` binary killed with SIGKILL after a checkpoint completed, then run
//! again from that checkpoint's `counting://` URL: the committed output is exactly the word
//! counts computed here, and the second run's summary shows the restore read the counting
//! storage and loaded the BTreeMap stores.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;
use support::{assert_exactly_once, expected_totals, read_committed};

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RECORDS: u64 = 200_000;
const SEED: u64 = 11;

/// A child killed (SIGKILL) and reaped when the test ends, whatever happened.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary with the job's flags, its stderr into `log`.
fn job(dir: &Path, log: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_custom_seams_job"));
    cmd.env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "0")
        .args(["--records", &RECORDS.to_string()])
        .args(["--seed", &SEED.to_string()])
        .args(["--parallelism", "2", "--checkpoint-interval", "20ms"])
        .arg("--checkpoint-dir")
        .arg(dir.join("checkpoints"))
        .arg("--output")
        .arg(dir.join("output"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join(log)).unwrap());
    cmd
}

/// A child's stdout, line by line, from a thread (ends when the child closes it).
fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for the child to end, killing it and failing after `within`.
fn wait(child: &mut Child, within: Duration, log: &Path) -> ExitStatus {
    let give_up = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            panic!(
                "custom_seams_job did not end within {within:?}; its stderr:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The value of `key=` in the `summary:` line.
fn field(stdout: &[String], key: &str) -> u64 {
    let line = stdout
        .iter()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary line in:\n{}", stdout.join("\n")));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .parse()
        .unwrap()
}

#[test]
fn sigkill_after_a_checkpoint_then_restore_from_its_url_is_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // A paced run (1 ms every 100 records: seconds for the whole input), killed once a
    // checkpoint completed and the sink committed a part file (so the second run must not
    // commit those records again).
    let mut first = Killed(
        job(dir, "first.log")
            .args(["--pace", "100"])
            .spawn()
            .unwrap(),
    );
    let printed = lines(&mut first.0);
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    let committed_a_part = || {
        std::fs::read_dir(dir.join("output"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("part-"))
    };
    while !(seen
        .iter()
        .any(|l: &String| l.starts_with("checkpoint completed: "))
        && committed_a_part())
    {
        match printed.recv_timeout(Duration::from_millis(5)) {
            Ok(line) => seen.push(line),
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < give_up => {}
            Err(e) => panic!(
                "no completed checkpoint and committed part file ({e:?}); it printed:\n{}\n\
                 stderr:\n{}",
                seen.join("\n"),
                std::fs::read_to_string(dir.join("first.log")).unwrap_or_default()
            ),
        }
    }
    first.0.kill().unwrap();
    let status = wait(
        &mut first.0,
        Duration::from_secs(10),
        &dir.join("first.log"),
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9),
        "{status}"
    );
    seen.extend(printed.iter());
    assert!(
        !seen.iter().any(|l| l.starts_with("summary: ")),
        "the first run finished before the kill:\n{}",
        seen.join("\n")
    );
    // The newest checkpoint it reported: still there, since a checkpoint is reported before
    // the job learns that it completed (and so before an older one is deleted).
    let latest = seen
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("checkpoint completed: "))
        .unwrap()
        .to_string();
    assert!(latest.starts_with("counting:///"), "{latest}");

    // The second run, from that URL, to the end.
    let mut second = Killed(
        job(dir, "second.log")
            .args(["--from", &latest])
            .spawn()
            .unwrap(),
    );
    let printed = lines(&mut second.0);
    let status = wait(
        &mut second.0,
        Duration::from_secs(60),
        &dir.join("second.log"),
    );
    let stdout: Vec<String> = printed.iter().collect();
    assert!(
        status.success(),
        "{status}; stdout:\n{}\nstderr:\n{}",
        stdout.join("\n"),
        std::fs::read_to_string(dir.join("second.log")).unwrap_or_default()
    );
    assert!(
        stdout.contains(&format!("restored from: {latest}")),
        "{}",
        stdout.join("\n")
    );
    assert!(
        field(&stdout, "since_restore") < RECORDS,
        "the sources started over"
    );
    assert_eq!(field(&stdout, "restarts"), 0);

    // Exactly once over both runs: the committed running counts are 1..=total for each word.
    assert_exactly_once(
        &read_committed(&dir.join("output")),
        &expected_totals(RECORDS, SEED),
    );

    // The restore went through the custom seams: `_metadata` and state read from the counting
    // storage, the restored words put into the new stores before any read, and the keyed
    // exchange's 2 × 2 channels opened through the counting transport.
    assert!(field(&stdout, "storage_metadata_reads") > 0);
    assert!(field(&stdout, "storage_state_reads") > 0);
    assert_eq!(field(&stdout, "store_created"), 2);
    assert_eq!(field(&stdout, "store_created_for_restarts"), 0);
    assert_eq!(field(&stdout, "store_created_restoring"), 2);
    let loaded = field(&stdout, "store_load_puts");
    assert!((1..=16).contains(&loaded), "store_load_puts={loaded}");
    assert!(field(&stdout, "store_freezes") > 0);
    assert_eq!(field(&stdout, "transport_channels"), 4);
}
