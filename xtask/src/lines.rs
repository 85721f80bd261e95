//! Running benchmark binaries and reading their output: `key=value` lines, the last line,
//! medians.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// The last non-blank line of `text`.
pub fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().map(str::trim).find(|l| !l.is_empty())
}

/// Splits whitespace-separated `key=value` tokens; a token without `=`, an empty key or a
/// repeated key is an error.
pub fn parse_fields(text: &str) -> Result<BTreeMap<String, String>> {
    let mut fields = BTreeMap::new();
    for token in text.split_whitespace() {
        let Some((key, value)) = token.split_once('=') else {
            bail!("token {token:?} is not key=value");
        };
        if key.is_empty() || fields.insert(key.to_string(), value.to_string()).is_some() {
            bail!("bad or repeated key in {token:?}");
        }
    }
    Ok(fields)
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Runs `cmd` with its stderr shown, after printing it; returns the command as shown and its
/// stdout. Fails, naming the command, if it cannot start or exits unsuccessfully.
pub(crate) fn run_logged(cmd: &mut Command) -> Result<(String, String)> {
    let shown = crate::show(cmd);
    eprintln!("  $ {shown}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not start `{shown}`"))?;
    if !out.status.success() {
        bail!("`{shown}` failed ({})", out.status);
    }
    Ok((shown, String::from_utf8_lossy(&out.stdout).into_owned()))
}
