//! What the tests that run the `word_count` binary as processes share: a guard that kills them,
//! waiting with a deadline, sending Ctrl-C, watching their stderr for a line, reading what they
//! print (the totals file, the summary line) and the end of their logs. Included with `#[path]`
//! by each such test.
// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, ChildStderr, Output};
use std::sync::mpsc;
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

/// The address a job manager started with `--listen 127.0.0.1:0` bound, read from its log
/// (`RUST_LOG=info`) as soon as it is there: no port is picked before the bind, so no other
/// test can take it in between.
pub fn listening_addr(log: &Path, within: Duration) -> String {
    let give_up = Instant::now() + within;
    loop {
        let text = strip_ansi(&std::fs::read_to_string(log).unwrap_or_default());
        let found = text
            .lines()
            .filter(|l| l.contains("job manager listening"))
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|t| t.strip_prefix("addr="))
                    .map(str::to_string)
            });
        if let Some(addr) = found {
            return addr;
        }
        assert!(
            Instant::now() < give_up,
            "the job manager did not listen within {within:?}; its log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `text` without terminal colour sequences (`ESC [ … m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A port free on loopback now, for a job manager that must come back on the same address
/// after it is killed (prefer `--listen 127.0.0.1:0` with [`listening_addr`]).
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

/// Checks the running counts that `--running-sums DIR` committed against the final `totals`:
/// for each word, the counts 1, 2, …, total, each exactly once. A lost and a duplicated update
/// of the same word cancel out in a total; here the duplicate shows twice and the lost one not
/// at all. Every part file's name must be `part-<subtask>-<transaction>` (in-progress files are
/// hidden, and none may be left over).
pub fn assert_running_sums(dir: &Path, totals: &BTreeMap<String, i64>) {
    let mut sums: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list the running sums in {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        assert!(
            name.starts_with("part-"),
            "a foreign file {name} in {}",
            dir.display()
        );
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let pair = line.strip_prefix('(').and_then(|l| l.strip_suffix(')'));
            let (word, count) = pair
                .and_then(|p| p.split_once(','))
                .unwrap_or_else(|| panic!("{name}: not a (word,count) line: {line:?}"));
            let count: i64 = count
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {line:?}: {e}"));
            sums.entry(word.to_string()).or_default().push(count);
        }
    }
    assert_eq!(
        sums.keys().collect::<Vec<_>>(),
        totals.keys().collect::<Vec<_>>(),
        "the words with running counts are not the words with totals"
    );
    for (word, counts) in &mut sums {
        counts.sort_unstable();
        let total = totals[word];
        assert_eq!(
            counts.len() as i64,
            total,
            "word {word}: {} running counts committed for a total of {total}",
            counts.len()
        );
        if let Some((at, (got, want))) = counts
            .iter()
            .zip(1..)
            .enumerate()
            .find(|(_, (g, w))| *g != w)
        {
            panic!(
                "word {word}: the committed running counts, sorted, have {got} where {want} belongs \
                 (position {at}): an update was lost or committed twice"
            );
        }
    }
}

/// What a restored run printed proves that it restored: `restored from:` names a checkpoint or
/// savepoint (under one of `under`, when given), and its sources emitted fewer than `records`
/// records since the latest restore (`since_restore=`, which after a failover counts only the
/// attempt that restored), so they resumed rather than started over. With exact results, which
/// the caller checks, that is only possible when the restored state was used.
pub fn assert_restored(stdout: &str, records: u64, under: &[&Path]) -> String {
    let from = stdout
        .lines()
        .find_map(|l| l.strip_prefix("restored from: "))
        .unwrap_or_else(|| panic!("the run did not restore (no `restored from:`):\n{stdout}"))
        .to_string();
    assert!(
        under.is_empty() || under.iter().any(|u| from.contains(&*u.to_string_lossy())),
        "restored from {from:?}, not under {under:?}"
    );
    let emitted = summary_field(stdout, "since_restore");
    assert!(
        emitted < records,
        "since the restore, the sources emitted {emitted} of {records} records: they started over"
    );
    from
}

/// The last 40 lines of a log file (empty if it cannot be read).
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Sends SIGINT (what Ctrl-C sends) to `child`.
pub fn interrupt(child: &Child) {
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -INT {} failed", child.id());
}

/// A child's stderr read line by line on a thread, so that a test can wait for a line while the
/// child runs and still see everything it wrote.
pub struct StderrLines {
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl StderrLines {
    /// Reads `stderr` (taken from a child spawned with `Stdio::piped()`).
    pub fn read(stderr: ChildStderr) -> StderrLines {
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        StderrLines {
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits until a line contains `needle`; fails after `within` or when stderr closes first.
    pub fn wait_for(&mut self, needle: &str, within: Duration) {
        let give_up = Instant::now() + within;
        loop {
            if self.seen.iter().any(|l| l.contains(needle)) {
                return;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(e) => panic!(
                    "no line with {needle:?} on stderr ({e:?}); it said:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Every line written so far.
    pub fn so_far(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    /// Everything written so far and until the child closes stderr (waiting at most `within`).
    pub fn all(mut self, within: Duration) -> String {
        let give_up = Instant::now() + within;
        while let Ok(line) = self
            .lines
            .recv_timeout(give_up.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }
}
