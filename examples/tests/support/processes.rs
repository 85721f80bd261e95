//! What the tests that run the `word_count` binary as processes share: a guard that kills them,
//! waiting with a deadline, reading what they print (the totals file, the summary line) and the
//! end of their logs. Included with `#[path]` by each such test.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// Children killed when the test ends, whatever happened.
pub struct Processes(pub Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A port free on loopback now (the tests start a job manager on it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits for `child` to end and returns what it printed; kills it and fails after `within`.
pub fn wait_output(child: Child, within: Duration) -> Output {
    let give_up = Instant::now() + within;
    let mut child = child;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > give_up {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "did not end within {within:?}; stdout:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The `key,total` lines of a `--output` file.
pub fn parse_totals(file: &Path) -> BTreeMap<String, i64> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(',').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// The value of `key=` in the `summary:` line.
pub fn summary_field(stdout: &str, key: &str) -> u64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("summary: "))
        .unwrap_or_else(|| panic!("no summary line in:\n{stdout}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .parse()
        .unwrap()
}

/// The last 40 lines of a log file (empty if it cannot be read).
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
