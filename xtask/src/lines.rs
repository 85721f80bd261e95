//! Reading benchmark binaries' output: `key=value` lines, the last line, medians.

use anyhow::{Result, bail};
use std::collections::BTreeMap;

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
