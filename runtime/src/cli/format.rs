//! How the reports and renderings write times, snapshot kinds, sizes, places and verdicts.

use super::report::{StreamReport, Verification};
use std::time::{Duration, UNIX_EPOCH};
use weir_core::element::SnapshotKind;

pub(super) fn where_(stream: &StreamReport) -> String {
    match (&stream.file, &stream.checksum) {
        (Some(file), Some(sum)) => format!("file {file} ({sum})"),
        (Some(file), None) => format!("file {file}"),
        _ => "inline in _metadata".to_string(),
    }
}

pub(super) fn verdict(v: &Verification) -> String {
    if v.ok {
        format!("OK ({})", v.detail)
    } else {
        format!("FAILED: {}", v.detail)
    }
}

/// A time in ms since the Unix epoch as UTC ISO-8601 with milliseconds.
pub(super) fn format_time(ms: u64) -> String {
    match UNIX_EPOCH.checked_add(Duration::from_millis(ms)) {
        Some(t) => humantime::format_rfc3339_millis(t).to_string(),
        None => format!("{ms} ms after the Unix epoch"),
    }
}

pub(super) fn kind_name(kind: SnapshotKind) -> &'static str {
    match kind {
        SnapshotKind::Checkpoint => "checkpoint",
        SnapshotKind::Savepoint => "savepoint",
        SnapshotKind::SynchronousSavepoint => "synchronous savepoint",
    }
}

/// A size in bytes, and in binary units when that says more (`1536 bytes (1.5 KiB)`).
pub(super) fn size_text(bytes: u64) -> String {
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else {
        format!("{bytes} bytes ({})", human_size(bytes))
    }
}

/// Bytes in binary units (`1.5 KiB`).
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS.get(unit).copied().unwrap_or("PiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(human_size(5 * 1024 * 1024), "5.0 MiB");
    }

    #[test]
    fn times_are_utc_iso8601() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
