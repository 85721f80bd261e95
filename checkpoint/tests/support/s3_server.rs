//! A real S3-compatible server for tests: an `s3s-fs` child process on loopback, over a fresh
//! temporary directory, killed when dropped.
//!
//! `cargo xtask test` and `cargo xtask ci` install `s3s-fs` (pinned, outside the clone) and
//! export its path as `WEIR_S3FS_BIN`. A test that needs the server and runs without that
//! variable fails, saying so: it never passes by skipping. This file is shared by the tests of
//! `weir-checkpoint` and `weir-examples` (`#[path]`), so it uses only `std` and `tempfile`.
#![allow(dead_code)]

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable naming the `s3s-fs` binary.
pub const BIN_VAR: &str = "WEIR_S3FS_BIN";
/// The access key the server accepts.
pub const ACCESS_KEY: &str = "weir-test-access-key";
/// The secret key the server accepts.
pub const SECRET_KEY: &str = "weir-test-secret-key";
/// The region requests are signed for (s3s-fs accepts any).
pub const REGION: &str = "us-east-1";
/// How long the server gets to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times a start is tried when the server exits at once (another process took the
/// port between our probe and its bind).
const START_ATTEMPTS: usize = 3;

/// A running `s3s-fs` serving one bucket from a temporary directory (`data/<bucket>/`, with
/// the server's stderr beside `data/`).
pub struct S3Server {
    child: Child,
    addr: SocketAddr,
    bucket: String,
    dir: tempfile::TempDir,
}

impl S3Server {
    /// Starts a server with an empty bucket `bucket`, on a free loopback port, and waits until
    /// it accepts connections. Panics with a clear message when `WEIR_S3FS_BIN` is not set,
    /// when the binary cannot be started, or when it does not listen in time.
    pub fn start(bucket: &str) -> S3Server {
        let bin = binary();
        let dir = tempfile::tempdir().expect("create the server's directory");
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join(bucket)).expect("create the bucket directory");
        let mut last_failure = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let stderr_path = dir.path().join("s3s-fs.stderr");
            let stderr = std::fs::File::create(&stderr_path).expect("create the server's log");
            let mut child = Command::new(&bin)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
                .arg(&data)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start {} ({BIN_VAR}): {e}; run `cargo xtask test`, which installs it",
                        bin.display()
                    )
                });
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            match wait_listening(&mut child, addr) {
                Ok(()) => {
                    return S3Server {
                        child,
                        addr,
                        bucket: bucket.to_string(),
                        dir,
                    };
                }
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let mut log = String::new();
                    if let Ok(mut f) = std::fs::File::open(&stderr_path) {
                        let _ = f.read_to_string(&mut log);
                    }
                    last_failure = format!("{why}; its stderr:\n{log}");
                }
            }
        }
        panic!(
            "s3s-fs ({}) did not start on 127.0.0.1 after {START_ATTEMPTS} attempts: {last_failure}",
            bin.display()
        );
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The bucket's directory on disk: object `a/b` is the file `<bucket_dir>/a/b`.
    pub fn bucket_dir(&self) -> PathBuf {
        self.dir.path().join("data").join(&self.bucket)
    }

    /// The environment a process needs to reach the bucket through the standard variables.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary `WEIR_S3FS_BIN` names; a missing variable or file fails the test, saying how to
/// run it.
fn binary() -> PathBuf {
    let Some(bin) = std::env::var_os(BIN_VAR).filter(|v| !v.is_empty()) else {
        panic!(
            "{BIN_VAR} is not set: this test needs the s3s-fs server. Run it through \
             `cargo xtask test` (or `cargo xtask ci`), which installs s3s-fs and sets {BIN_VAR}, \
             or set {BIN_VAR} to an s3s-fs 0.14 binary yourself"
        );
    };
    let bin = PathBuf::from(bin);
    if !bin.is_file() {
        panic!(
            "{BIN_VAR}={} is not a file; run `cargo xtask test`, which installs s3s-fs",
            bin.display()
        );
    }
    bin
}

/// A port nobody listens on now (the OS's pick for port 0).
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("find a free loopback port")
}

/// Waits until `addr` accepts a connection, the child exits, or the start timeout passes.
fn wait_listening(child: &mut Child, addr: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("it exited ({status}) before listening on {addr}"));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "it did not accept connections on {addr} within {START_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every file under `dir`, as paths relative to it with `/` separators, sorted.
pub fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if let Ok(rel) = path.strip_prefix(root) {
                out.push(
                    rel.components()
                        .map(|c| c.as_os_str().to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                        .join("/"),
                );
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}
