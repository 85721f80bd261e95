//! A two-host cluster whose link is cut past the heartbeat timeout recovers with exact totals.
//!
//! Two network namespaces joined by a veth pair stand for two hosts with their own addresses.
//! Host A runs the job manager, a task manager with two slots and the `s3s-fs` server the
//! checkpoints go to; host B runs the other task manager with two slots. `word_count` runs at
//! parallelism 4; once a checkpoint is complete, B's end of the link goes down for three
//! heartbeat timeouts and comes back up. Both sides lose each other, the job restarts from its
//! latest checkpoint once B's task manager registers again, and the job manager's totals equal
//! those computed without the engine.
//!
//! Privileged: it needs root and iproute2 (`ip`, `ss`), and without them fails, saying so.
//! `cargo xtask ci` and `cargo xtask test` run it (about 15 s in a debug build), installing
//! iproute2 with apt-get when it is missing, and set `WEIR_S3FS_BIN`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../runtime/tests/support/bounded.rs"]
mod bounded;
use bounded::BoundedCommand;

#[path = "support/processes.rs"]
mod processes;
#[path = "../../checkpoint/tests/support/s3_server.rs"]
mod s3_server;

use processes::{Processes, log_tail, parse_totals, summary_field, wait_output};
use s3_server::{ACCESS_KEY, BIN_VAR, REGION, SECRET_KEY, files_under};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use weir_examples::expected_totals;

/// Host A's and host B's addresses on the link (a /24 that exists only inside the two
/// namespaces, so it cannot clash with the machine's own networks).
const ADDR_A: &str = "10.213.77.1";
const ADDR_B: &str = "10.213.77.2";
const PREFIX_LEN: u8 = 24;
/// Ports on host A (a fresh namespace: nothing else listens there).
const JOBMANAGER_PORT: u16 = 6123;
const S3_PORT: u16 = 9000;
const BUCKET: &str = "weir-netns";
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the link stays down: well beyond the heartbeat timeout on both sides.
const CUT: Duration = Duration::from_secs(6);

/// `ip`: from `PATH`, else where iproute2 installs it.
fn ip_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("ip"));
    on_path
        .chain(["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"].map(PathBuf::from))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("this test needs iproute2's `ip` (not found on PATH nor in /usr/sbin, /sbin)")
        })
}

/// Runs `ip args...`; panics with its stderr when it fails.
fn ip(args: &[&str]) {
    let out = Command::new(ip_binary())
        .args(args)
        .output_bounded()
        .unwrap();
    assert!(
        out.status.success(),
        "`ip {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// The effective user id, from `/proc/self/status`.
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Two network namespaces joined by a veth pair, deleted (and the pair with them) when dropped.
struct Hosts {
    a: String,
    b: String,
    veth_b: String,
}

impl Hosts {
    /// Creates namespaces A and B (named after this process, so that concurrent runs do not
    /// meet), the veth pair between them with [`ADDR_A`] and [`ADDR_B`], and brings everything
    /// up. Panics, saying what is missing, when this is not root or `ip netns` does not work.
    fn create() -> Hosts {
        assert_eq!(
            effective_uid(),
            Some(0),
            "this test needs root: it creates network namespaces and a veth pair with `ip` \
             (run it as root, e.g. through `sudo -E cargo xtask chaos`)"
        );
        let pid = std::process::id();
        let hosts = Hosts {
            a: format!("weir-a-{pid}"),
            b: format!("weir-b-{pid}"),
            veth_b: format!("wvb{pid}"),
        };
        let veth_a = format!("wva{pid}");
        // Left over by an earlier process with this pid that could not clean up.
        hosts.delete();
        let probe = Command::new(ip_binary())
            .args(["netns", "add", &hosts.a])
            .output_bounded()
            .unwrap();
        assert!(
            probe.status.success(),
            "this test needs `ip netns` (iproute2, root, a kernel with network namespaces): \
             `ip netns add {}` failed: {}",
            hosts.a,
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        ip(&["netns", "add", &hosts.b]);
        ip(&[
            "link",
            "add",
            &veth_a,
            "netns",
            &hosts.a,
            "type",
            "veth",
            "peer",
            "name",
            &hosts.veth_b,
            "netns",
            &hosts.b,
        ]);
        for (ns, veth, addr) in [
            (&hosts.a, &veth_a, ADDR_A),
            (&hosts.b, &hosts.veth_b, ADDR_B),
        ] {
            let cidr = format!("{addr}/{PREFIX_LEN}");
            ip(&["-n", ns, "addr", "add", &cidr, "dev", veth]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", veth, "up"]);
        }
        hosts
    }

    /// Sets B's end of the link up or down.
    fn link_b(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.b, "link", "set", &self.veth_b, state]);
    }

    fn delete(&self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new(ip_binary())
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.delete();
    }
}

/// `program args...` inside namespace `ns`, with `env`, stdout piped, stderr to `log`.
fn spawn_in<I, S>(ns: &str, program: &Path, args: I, env: &[(&str, String)], log: &Path) -> Child
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(ip_binary())
        .args(["netns", "exec", ns])
        .arg(program)
        .args(args)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// The `s3s-fs` binary `WEIR_S3FS_BIN` names; a missing variable or file fails the test.
fn s3s_fs() -> PathBuf {
    let bin = std::env::var_os(BIN_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "{BIN_VAR} is not set: this test checkpoints to an s3s-fs server. Run it through \
                 `cargo xtask chaos`, which installs s3s-fs and sets {BIN_VAR}"
            )
        });
    assert!(bin.is_file(), "{BIN_VAR}={} is not a file", bin.display());
    bin
}

/// Waits until something in namespace `ns` listens on `addr` (`ss`: this process is not in
/// the namespace, so it cannot connect to find out).
fn wait_listening(ns: &str, addr: &str, server: &mut Child, log: &Path) {
    let give_up = Instant::now() + Duration::from_secs(20);
    loop {
        let out = Command::new(ip_binary())
            .args(["netns", "exec", ns, "ss", "-ltnH"])
            .output_bounded()
            .unwrap();
        assert!(
            out.status.success(),
            "`ss` (iproute2) failed in {ns}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        if String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .any(|w| w == addr)
        {
            return;
        }
        if let Some(status) = server.try_wait().unwrap() {
            panic!(
                "s3s-fs exited ({status}) before listening on {addr}:\n{}",
                log_tail(log)
            );
        }
        assert!(
            Instant::now() < give_up,
            "s3s-fs did not listen on {addr} in {ns}:\n{}",
            log_tail(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn completed_checkpoints(bucket: &Path) -> usize {
    files_under(bucket)
        .iter()
        .filter(|f| f.ends_with("/_metadata"))
        .count()
}

#[test]
fn a_link_cut_longer_than_the_heartbeat_timeout_is_survived_with_exact_totals() {
    let s3s_fs = s3s_fs();
    // Dropped last: the processes inside the namespaces are killed first.
    let hosts = Hosts::create();
    let tmp = tempfile::tempdir().unwrap();
    let log = |name: &str| tmp.path().join(format!("{name}.log"));
    let mut procs = Processes(Vec::new());

    // The checkpoints' S3 server lives on host A; host B reaches it over the link.
    let data = tmp.path().join("s3");
    let bucket_dir = data.join(BUCKET);
    std::fs::create_dir_all(&bucket_dir).unwrap();
    let s3_addr = format!("{ADDR_A}:{S3_PORT}");
    let port = S3_PORT.to_string();
    procs.0.push(spawn_in(
        &hosts.a,
        &s3s_fs,
        [
            "--host",
            ADDR_A,
            "--port",
            &port,
            "--access-key",
            ACCESS_KEY,
            "--secret-key",
            SECRET_KEY,
            data.to_str().unwrap(),
        ],
        &[],
        &log("s3s-fs"),
    ));
    wait_listening(&hosts.a, &s3_addr, &mut procs.0[0], &log("s3s-fs"));
    let env = [
        ("AWS_ENDPOINT_URL", format!("http://{s3_addr}")),
        ("AWS_REGION", REGION.to_string()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
    ];

    // Sized (release build) so that the job runs well past the cut and the recovery: about
    // 9 s undisturbed, 17 s with the cut.
    let records = 4_000_000u64;
    let out = tmp.path().join("totals.csv");
    let jobmanager = format!("{ADDR_A}:{JOBMANAGER_PORT}");
    let job: Vec<String> = [
        "--records",
        &records.to_string(),
        "--parallelism",
        "4",
        "--checkpoint-interval",
        "50ms",
        "--checkpoint-dir",
        &format!("s3://{BUCKET}/wc"),
        "--sink-delay",
        "2us",
        "--heartbeat-interval",
        "100ms",
        "--heartbeat-timeout",
        &format!("{}s", HEARTBEAT_TIMEOUT.as_secs()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let word_count = |ns: &str, role: &[&str], name: &str| {
        let args = job.iter().map(String::as_str).chain(role.iter().copied());
        spawn_in(
            ns,
            Path::new(env!("CARGO_BIN_EXE_word_count")),
            args,
            &env,
            &log(name),
        )
    };
    let started = Instant::now();
    procs.0.push(word_count(
        &hosts.a,
        &[
            "--role",
            "jobmanager",
            "--listen",
            &jobmanager,
            "--output",
            out.to_str().unwrap(),
        ],
        "jobmanager",
    ));
    let task_manager = |ns: &str, bind: &str, name: &str| {
        word_count(
            ns,
            &[
                "--jobmanager",
                &jobmanager,
                "--slots",
                "2",
                "--data-bind",
                bind,
            ],
            name,
        )
    };
    procs.0.push(task_manager(&hosts.a, ADDR_A, "tm1"));
    procs.0.push(task_manager(&hosts.b, ADDR_B, "tm2"));

    // Once a checkpoint is complete, the link goes down for longer than the heartbeat timeout.
    let give_up = Instant::now() + Duration::from_secs(60);
    while completed_checkpoints(&bucket_dir) == 0 {
        assert!(
            Instant::now() < give_up,
            "no checkpoint completed; job manager log:\n{}",
            log_tail(&log("jobmanager"))
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let cut_at = started.elapsed();
    hosts.link_b(false);
    std::thread::sleep(CUT);
    hosts.link_b(true);
    let restored_at = started.elapsed();

    let jm = procs.0.remove(1);
    let jm = wait_output(jm, Duration::from_secs(120));
    let jm_done_at = started.elapsed();
    eprintln!(
        "link cut at {cut_at:.1?}, restored at {restored_at:.1?}; job manager done at \
         {jm_done_at:.1?}"
    );
    let stdout = String::from_utf8_lossy(&jm.stdout).into_owned();
    assert!(
        jm.status.success(),
        "job manager failed; stdout:\n{stdout}\nlog:\n{}",
        log_tail(&log("jobmanager"))
    );
    assert_eq!(
        parse_totals(&out),
        expected_totals(records, 42),
        "exactly-once totals after the link was cut, as computed without the engine"
    );
    assert!(
        summary_field(&stdout, "restarts") >= 1,
        "the cut did not land mid-run:\n{stdout}"
    );
    let jm_log = std::fs::read_to_string(log("jobmanager")).unwrap();
    assert!(
        jm_log.contains("a task manager running subtasks was lost"),
        "the job manager did not lose host B's task manager:\n{}",
        log_tail(&log("jobmanager"))
    );
    assert!(
        jm_log.contains("restoring"),
        "the job did not restore from a checkpoint:\n{}",
        log_tail(&log("jobmanager"))
    );

    // Both task managers leave when the job ends.
    for (tm, name) in procs.0.drain(1..).zip(["tm1", "tm2"]) {
        let o = wait_output(tm, Duration::from_secs(30));
        let tm_stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && tm_stdout.contains("task manager done"),
            "{name} failed ({}); stdout:\n{tm_stdout}\nlog:\n{}",
            o.status,
            log_tail(&log(name))
        );
    }
    let registrations = std::fs::read_to_string(log("tm2"))
        .unwrap()
        .matches("registered with the job manager")
        .count();
    assert!(
        registrations >= 2,
        "host B's task manager registered {registrations} time(s), not again after the cut:\n{}",
        log_tail(&log("tm2"))
    );
}
