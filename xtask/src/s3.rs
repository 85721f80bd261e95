//! The S3-compatible server the tests run against: [`ensure_s3s_fs`] installs a pinned `s3s-fs`
//! once, into a tools directory outside the clone, and returns the binary that `cargo xtask
//! test` and `ci` export to the tests as `WEIR_S3FS_BIN`.
//!
//! The tests start the server themselves (one per test, on a free loopback port, over a
//! temporary directory: `checkpoint/tests/support/s3_server.rs`); xtask only provides it.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The variable the tests read the binary's path from.
pub const BIN_VAR: &str = "WEIR_S3FS_BIN";
/// The variable naming the tools directory (default `$HOME/.cache/weir/tools`).
pub const TOOLS_VAR: &str = "WEIR_TOOLS_DIR";
/// The pinned version: later ones need a newer rustc than the workspace's.
pub const VERSION: &str = "0.14.1";

/// The directory tools are installed into with `cargo install --root`: `$WEIR_TOOLS_DIR`, else
/// `$HOME/.cache/weir/tools`. Outside the clone, so every clone and worktree reuses one install.
pub fn tools_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(TOOLS_VAR).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .with_context(|| format!("neither {TOOLS_VAR} nor HOME is set: cannot place tools"))?;
    Ok(PathBuf::from(home).join(".cache/weir/tools"))
}

/// The `s3s-fs` binary to test with, installing it first if needed:
/// - `$WEIR_S3FS_BIN` when it is set (it must be a file);
/// - else `<tools>/bin/s3s-fs` when it reports version [`VERSION`];
/// - else `cargo install s3s-fs@VERSION --locked --features binary --root <tools>` (about two
///   minutes on two cores, once), then that binary.
pub fn ensure_s3s_fs() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os(BIN_VAR).filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!(
                "{BIN_VAR}={} is not a file; unset it to let xtask install s3s-fs",
                bin.display()
            );
        }
        println!("s3s-fs: using {BIN_VAR}={}", bin.display());
        return Ok(bin);
    }
    let tools = tools_dir()?;
    let bin = tools
        .join("bin")
        .join(format!("s3s-fs{}", std::env::consts::EXE_SUFFIX));
    match installed_version(&bin) {
        Some(v) if v == VERSION => {
            println!("s3s-fs: using {} ({v})", bin.display());
            return Ok(bin);
        }
        Some(v) => println!(
            "s3s-fs: {} is version {v}, not {VERSION}; reinstalling",
            bin.display()
        ),
        None => {}
    }
    install(&tools)?;
    match installed_version(&bin) {
        Some(v) if v == VERSION => Ok(bin),
        other => bail!(
            "after `cargo install`, {} reports version {other:?}, not {VERSION}",
            bin.display()
        ),
    }
}

/// The version `bin --version` prints (`s3s-fs 0.14.1`), if it runs.
fn installed_version(bin: &Path) -> Option<String> {
    if !bin.is_file() {
        return None;
    }
    let out = Command::new(bin).arg("--version").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).map(str::to_string)
}

/// `cargo install`s the pinned version into `tools`.
fn install(tools: &Path) -> Result<()> {
    std::fs::create_dir_all(tools)
        .with_context(|| format!("cannot create the tools directory {}", tools.display()))?;
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.args([
        "install",
        &format!("s3s-fs@{VERSION}"),
        "--locked",
        "--force",
    ])
    .args(["--features", "binary", "--root"])
    .arg(tools)
    // Outside the workspace, so its configuration does not apply, and with cargo's own
    // temporary target directory rather than the workspace's.
    .current_dir(tools)
    .env_remove("CARGO_TARGET_DIR");
    println!(
        "s3s-fs: installing s3s-fs {VERSION} into {} (once; it takes about two minutes)",
        tools.display()
    );
    let start = Instant::now();
    crate::run_cmd(cmd).context("installing s3s-fs, the S3 server the tests need")?;
    println!("s3s-fs: installed in {:.0}s", start.elapsed().as_secs_f64());
    Ok(())
}
