//! A bound on every job a test runs: `env.execute().bounded().await` fails the test, naming
//! where it waited, when the job has not ended within [`JOB_LIMIT`], rather than hanging until
//! nextest's terminate-after (or CI's own limit). Included with `#[path]` by the runtime's and
//! the examples' test support modules, and by test files that have no support module.

// Each including binary uses some of these.
#![allow(dead_code)]

use std::future::Future;
use std::panic::Location;
use std::time::Duration;

/// How long any one job of a test may run. The longest job of the suite takes about 15 s on
/// two loaded cores; nextest kills a whole test after four minutes.
pub const JOB_LIMIT: Duration = Duration::from_secs(120);

/// Bounds a future (a job's `execute()`, or anything a test awaits that could hang).
pub trait Bounded: Future + Sized {
    /// This future, failing the test (with the caller's location) if it has not ended within
    /// [`JOB_LIMIT`].
    #[track_caller]
    fn bounded(self) -> impl Future<Output = Self::Output> {
        self.bounded_by(JOB_LIMIT)
    }

    /// This future, failing the test (with the caller's location) if it has not ended within
    /// `limit`.
    #[track_caller]
    fn bounded_by(self, limit: Duration) -> impl Future<Output = Self::Output> {
        let at = Location::caller();
        async move {
            tokio::time::timeout(limit, self)
                .await
                .unwrap_or_else(|_| panic!("{at}: still running after {limit:?}: a hang"))
        }
    }
}

impl<F: Future> Bounded for F {}

/// Bounds a child process the way [`Bounded`] bounds a job.
pub trait BoundedCommand {
    /// Runs the command to its end, as [`std::process::Command::output`] does (stdin empty,
    /// stdout and stderr captured), but kills it and fails the test (with the caller's location
    /// and the end of its stderr) if it has not ended within [`JOB_LIMIT`].
    #[track_caller]
    fn output_bounded(&mut self) -> std::io::Result<std::process::Output> {
        self.output_within(JOB_LIMIT)
    }

    /// The same with another limit (the heavy scenarios of `cargo xtask chaos`).
    #[track_caller]
    fn output_within(&mut self, limit: Duration) -> std::io::Result<std::process::Output>;
}

impl BoundedCommand for std::process::Command {
    #[track_caller]
    fn output_within(&mut self, limit: Duration) -> std::io::Result<std::process::Output> {
        use std::io::Read;
        use std::process::Stdio;
        let at = Location::caller();
        let mut child = self
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        // Read both pipes while waiting, so a child that prints much never blocks on them.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut bytes);
                }
                bytes
            })
        };
        let stdout = drain(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let stderr = drain(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let give_up = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > give_up {
                let _ = child.kill();
                let _ = child.wait();
                let err = stderr.join().unwrap_or_default();
                let err = String::from_utf8_lossy(&err);
                let tail: Vec<&str> = err.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!(
                    "{at}: {:?} still running after {limit:?}: a hang; its stderr ends:\n{}",
                    self.get_program(),
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Ok(std::process::Output {
            status,
            stdout: stdout.join().unwrap_or_default(),
            stderr: stderr.join().unwrap_or_default(),
        })
    }
}
