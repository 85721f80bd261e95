//! Runs test commands while echoing their output, and totals the tests they report.
//!
//! `cargo test` closes each test binary with `test result: ok. N passed; M failed; K ignored; ...`
//! and nextest closes its run with `Summary [...] T tests run: N passed, M failed, K skipped`. The
//! last of those lines is often a doc-test binary that ran nothing, so CI logs end with one plain
//! total instead: `tests: N passed, M failed, K skipped`.

use anyhow::{Context, Result, bail};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

/// Tests counted across runs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed (or timed out).
    pub failed: u64,
    /// Tests ignored or skipped.
    pub skipped: u64,
}

impl Counts {
    /// Adds what one output line reports, if it is a closing line of cargo test or nextest.
    pub fn add_line(&mut self, line: &str) {
        let line = strip_ansi(line);
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("test result: ") {
            // `ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s`
            let rest = rest.split_once(". ").map_or(rest, |(_, r)| r);
            for part in rest.split(';') {
                self.add_count(part);
            }
        } else if line.starts_with("Summary [")
            && let Some((_, rest)) = line
                .split_once(" tests run: ")
                .or(line.split_once(" test run: "))
        {
            // `53 tests run: 52 passed, 1 failed, 2 skipped` (zero counts may be left out)
            for part in rest.split(',') {
                self.add_count(part);
            }
        }
    }

    fn add_count(&mut self, part: &str) {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            return;
        };
        let Ok(n) = n.parse::<u64>() else { return };
        match what {
            "passed" => self.passed += n,
            "failed" | "timed" => self.failed += n,
            "ignored" | "skipped" => self.skipped += n,
            _ => {}
        }
    }

    /// The plain closing line.
    pub fn line(&self) -> String {
        format!(
            "tests: {} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`), in case colour was forced.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs `cmd`, echoing its stdout and stderr as they come, and adds its reported tests to `counts`.
pub fn run_counting(mut cmd: Command, counts: &mut Counts) -> Result<()> {
    let shown = crate::show(&cmd);
    println!("$ {shown}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{shown}`"))?;
    let shared = Arc::new(Mutex::new(Counts::default()));
    let out = child
        .stdout
        .take()
        .map(|s| echo(s, false, Arc::clone(&shared)));
    let err = child
        .stderr
        .take()
        .map(|s| echo(s, true, Arc::clone(&shared)));
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{shown}`"))?;
    for handle in [out, err].into_iter().flatten() {
        let _ = handle.join();
    }
    if let Ok(c) = shared.lock() {
        counts.passed += c.passed;
        counts.failed += c.failed;
        counts.skipped += c.skipped;
    }
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

fn echo(
    stream: impl Read + Send + 'static,
    to_stderr: bool,
    counts: Arc<Mutex<Counts>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let _ = if to_stderr {
                std::io::stderr().write_all(&buf)
            } else {
                std::io::stdout().write_all(&buf)
            };
            if let Ok(mut c) = counts.lock() {
                c.add_line(&String::from_utf8_lossy(&buf));
            }
            buf.clear();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(text: &str) -> Counts {
        let mut c = Counts::default();
        text.lines().for_each(|l| c.add_line(l));
        c
    }

    #[test]
    fn cargo_test_result_lines_add_up() {
        let c = count(
            "running 3 tests\n\
             test a ... ok\n\
             test result: ok. 20 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.00s\n\
             test result: FAILED. 2 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s\n\
             test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s\n",
        );
        assert_eq!(
            c,
            Counts {
                passed: 22,
                failed: 3,
                skipped: 1
            }
        );
    }

    #[test]
    fn nextest_summary_lines_add_up() {
        let c = count(
            "        PASS [   0.005s] (1/53) weir-core keygroup::tests::x\n\
             ────────────\n\
             \u{20}    Summary [   0.203s] 53 tests run: 52 passed, 1 failed, 0 skipped\n\
             \u{20}    Summary [   1.000s] 10 tests run: 9 passed, 1 timed out, 2 skipped\n\
             \u{20}    Summary [   0.100s] 1 test run: 1 passed, 0 skipped\n",
        );
        assert_eq!(
            c,
            Counts {
                passed: 62,
                failed: 2,
                skipped: 2
            }
        );
    }

    #[test]
    fn colour_codes_are_ignored() {
        let c = count(
            "test result: \u{1b}[32mok\u{1b}[0m. 4 passed; 0 failed; 0 ignored; 0 measured\n\
             \u{1b}[32;1m     Summary\u{1b}[0m [   0.2s] \u{1b}[1m5\u{1b}[0m tests run: \u{1b}[1m5\u{1b}[0m \u{1b}[32;1mpassed\u{1b}[0m, \u{1b}[1m1\u{1b}[0m \u{1b}[33;1mskipped\u{1b}[0m\n",
        );
        assert_eq!(
            c,
            Counts {
                passed: 9,
                failed: 0,
                skipped: 1
            }
        );
    }

    #[test]
    fn other_lines_count_nothing() {
        let c = count(
            "test result is what we print\nSummary of things: 3 passed\n3 passed, 0 failed\n",
        );
        assert_eq!(c, Counts::default());
        assert_eq!(c.line(), "tests: 0 passed, 0 failed, 0 skipped");
    }
}
