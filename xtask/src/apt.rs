//! Debian packages some tests need, installed with `apt-get` when missing and this runs as root
//! (as CI does): iproute2's `ip` and `ss` for the network-partition test's hosts (network
//! namespaces, `examples/tests/cluster_netns.rs`), and Chromium with its WebDriver for the web
//! UI test (`examples/tests/web_ui.rs`), and what building librdkafka from source needs for the
//! Kafka connectors (`connectors/kafka`): cmake, and the TLS, zlib and curl headers. Where they cannot
//! be installed, the tests or builds that need them fail, saying what they need.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian puts binaries, besides `PATH`.
const DIRS: [&str; 4] = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Where `name` is, on `PATH` or in one of [`DIRS`].
fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(DIRS.iter().map(Into::into))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether this process runs as root (`id -u` prints 0).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Makes sure `binaries` exist, installing `packages` with `apt-get update` and `apt-get
/// install -y --no-install-recommends` when one does not and this is root with `apt-get`; says
/// why not otherwise, without failing (the tests of `purpose` then fail with that reason).
fn ensure(purpose: &str, binaries: &[&str], packages: &[&str]) -> Result<()> {
    ensure_files(purpose, binaries, &[], packages)
}

/// [`ensure`], also for `headers` (absolute paths) that the packages install.
fn ensure_files(
    purpose: &str,
    binaries: &[&str],
    headers: &[&str],
    packages: &[&str],
) -> Result<()> {
    if binaries.iter().all(|b| find(b).is_some()) && headers.iter().all(|h| Path::new(h).is_file())
    {
        return Ok(());
    }
    let list = packages.join(" ");
    if !is_root() || !Path::new("/usr/bin/apt-get").is_file() {
        eprintln!(
            "xtask: {list} missing and cannot be installed here (needs root and apt-get): {purpose} \
             will fail"
        );
        return Ok(());
    }
    println!("xtask: installing {list} (apt-get) for {purpose}");
    let install = [&["install", "-y", "--no-install-recommends"][..], packages].concat();
    for args in [&["update"][..], &install] {
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

/// cmake, a C++ compiler and the OpenSSL, zlib and curl headers: `rdkafka` builds librdkafka
/// from source with them (Debian's librdkafka is too old for the crate). librdkafka 2.12 is
/// built without curl, but its cmake configuration defines `WITH_OAUTHBEARER_OIDC` as 0 and
/// `rdkafka_conf.c` tests it with `#ifdef`, so it includes `curl/curl.h` all the same: on a
/// machine without the curl headers the build failed (2026-12-04).
pub fn ensure_kafka_build() -> Result<()> {
    let curl = format!(
        "/usr/include/{}-linux-gnu/curl/curl.h",
        std::env::consts::ARCH
    );
    ensure_files(
        "building librdkafka (the Kafka connectors)",
        &["cmake", "g++"],
        &["/usr/include/openssl/ssl.h", "/usr/include/zlib.h", &curl],
        &[
            "cmake",
            "g++",
            "libssl-dev",
            "zlib1g-dev",
            "libcurl4-openssl-dev",
        ],
    )
}

/// `ip` and `ss` (iproute2), for the network partition test.
pub fn ensure_iproute2() -> Result<()> {
    ensure("the network partition test", &["ip", "ss"], &["iproute2"])
}

/// The variables that name the browser to the web UI test.
pub const CHROMIUM_VAR: &str = "WEIR_CHROMIUM_BIN";
pub const CHROMEDRIVER_VAR: &str = "WEIR_CHROMEDRIVER_BIN";

/// Chromium and its WebDriver (Debian's `chromium`, `chromium-driver`), for the web UI test;
/// where they are, to pass to the tests (unless the caller set the variables).
pub fn ensure_chromium() -> Result<Vec<(&'static str, PathBuf)>> {
    let mut found = Vec::new();
    let wanted = [
        (CHROMIUM_VAR, "chromium"),
        (CHROMEDRIVER_VAR, "chromedriver"),
    ];
    if wanted
        .iter()
        .all(|(var, _)| std::env::var_os(var).is_some())
    {
        return Ok(found);
    }
    ensure(
        "the web UI test",
        &["chromium", "chromedriver"],
        &["chromium", "chromium-driver"],
    )?;
    for (var, name) in wanted {
        if let (None, Some(path)) = (std::env::var_os(var), find(name)) {
            found.push((var, path));
        }
    }
    Ok(found)
}
