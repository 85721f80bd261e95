//! The network-namespace test hosts of the partition test (`examples/tests/cluster_netns.rs`)
//! need iproute2's `ip` and `ss`: [`ensure_iproute2`] installs Debian's package when they are
//! missing and this runs as root (as CI does); otherwise that test fails, saying what it needs.

use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Command;

/// Where iproute2 puts `ip` and `ss`, besides `PATH`.
const DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Whether `name` is on `PATH` or in one of [`DIRS`].
fn found(name: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(DIRS.iter().map(Into::into))
        .any(|d| d.join(name).is_file())
}

/// Whether this process runs as root (`id -u` prints 0).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Makes sure `ip` and `ss` exist, with `apt-get update` and `apt-get install -y iproute2`
/// when they do not and this is root with `apt-get`; says why not otherwise, without failing
/// (the partition test then fails with that reason).
pub fn ensure_iproute2() -> Result<()> {
    if found("ip") && found("ss") {
        return Ok(());
    }
    if !is_root() || !Path::new("/usr/bin/apt-get").is_file() {
        eprintln!(
            "xtask: iproute2 (`ip`, `ss`) is missing and cannot be installed here (needs root \
             and apt-get): the network partition test will fail"
        );
        return Ok(());
    }
    println!("xtask: installing iproute2 (apt-get) for the network partition test");
    for args in [
        &["update"][..],
        &["install", "-y", "--no-install-recommends", "iproute2"],
    ] {
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .with_context(|| format!("apt-get {}", args.join(" ")))?;
        if !status.success() {
            bail!("apt-get {} failed: {status}", args.join(" "));
        }
    }
    Ok(())
}
