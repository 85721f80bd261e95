//! The text of `weir checkpoints list | inspect | verify`: each report rendered for a terminal.

use super::format::{size_text, verdict, where_};
use super::native;
use super::report::{ListEntry, VerifyReport};
use super::{InspectReport, SubtaskReport};
use std::fmt::Write as _;

/// Renders a listing as a table, one line per checkpoint.
pub fn render_list(entries: &[ListEntry]) -> String {
    let dash = || "-".to_string();
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            [
                e.status.as_str().to_string(),
                e.id.map_or_else(|| "?".to_string(), |i| i.to_string()),
                e.job_name.clone().unwrap_or_else(dash),
                e.job_id.clone().unwrap_or_else(dash),
                e.completed_at.clone().unwrap_or_else(dash),
                e.kind.clone().unwrap_or_else(dash),
                e.state_size.map_or_else(dash, size_text),
            ]
        })
        .collect();
    let header = [
        "STATUS",
        "ID",
        "JOB",
        "JOB ID",
        "COMPLETED (UTC)",
        "KIND",
        "STATE SIZE",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    let line = |s: &mut String, cells: &[&str], last: &str| {
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            // The id is right-aligned; the rest left.
            if i == 1 {
                let _ = write!(s, "{cell:>w$}  ");
            } else {
                let _ = write!(s, "{cell:<w$}  ");
            }
        }
        s.push_str(last);
        let trimmed = s.trim_end().len();
        s.truncate(trimmed);
        s.push('\n');
    };
    line(&mut s, &header, "PATH");
    for (row, e) in rows.iter().zip(entries) {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        let last = match (&e.reason, e.unaligned, e.in_flight_size) {
            (Some(reason), _, _) => format!("{}  ({reason})", e.path),
            (None, Some(true), Some(size)) => {
                format!("{}  (unaligned: {} in flight)", e.path, size_text(size))
            }
            _ => e.path.clone(),
        };
        line(&mut s, &cells, &last);
    }
    s
}

/// Renders a verification: an `OK:` line, or one `CORRUPT:` line per problem.
pub fn render_verify(r: &VerifyReport) -> String {
    let mut s = String::new();
    if let Some(from) = &r.selected_from {
        let _ = writeln!(
            s,
            "Verifying {} (the latest complete checkpoint under {from})",
            r.checkpoint_dir
        );
    }
    if r.problems.is_empty() {
        let _ = writeln!(
            s,
            "OK: checkpoint {} of job {}: {} files, {} bytes verified",
            r.checkpoint_id
                .map_or_else(|| "?".to_string(), |i| i.to_string()),
            r.job_name.as_deref().unwrap_or("?"),
            r.files_verified,
            r.bytes_verified
        );
    } else {
        for p in &r.problems {
            let _ = writeln!(s, "CORRUPT: {}: {}", p.file, p.reason);
        }
    }
    s
}

/// Renders an inspection as text.
pub fn render_inspect(r: &InspectReport) -> String {
    let mut s = String::new();
    match &r.selected_from {
        Some(from) => {
            let _ = writeln!(
                s,
                "Checkpoint {} (the latest complete checkpoint under {from})",
                r.checkpoint_dir
            );
        }
        None => {
            let _ = writeln!(s, "Checkpoint {}", r.checkpoint_dir);
        }
    }
    let took = r
        .completion_timestamp_ms
        .saturating_sub(r.trigger_timestamp_ms);
    let _ = writeln!(s, "  job:            {} ({})", r.job_name, r.job_id);
    let _ = writeln!(s, "  checkpoint:     {} ({})", r.checkpoint_id, r.kind);
    let _ = writeln!(s, "  triggered:      {}", r.trigger_time);
    let _ = writeln!(
        s,
        "  completed:      {} (took {took} ms)",
        r.completion_time
    );
    let _ = writeln!(s, "  weir version:   {}", r.weir_version);
    let _ = writeln!(s, "  format version: {}", r.format_version);
    let _ = writeln!(
        s,
        "  _metadata:      {} ({} bytes, checksum OK)",
        r.metadata_file, r.metadata_size
    );
    let _ = writeln!(s, "  state size:     {}", size_text(r.state_size));
    if r.in_flight.is_empty() {
        let _ = writeln!(s, "  in-flight data: none");
    } else {
        let _ = writeln!(
            s,
            "  in-flight data: {} in {} subtask{} (unaligned checkpoint)",
            size_text(r.in_flight_size),
            r.in_flight.len(),
            if r.in_flight.len() == 1 { "" } else { "s" }
        );
    }
    let _ = writeln!(s, "  operators:      {}", r.operators.len());
    for op in &r.operators {
        s.push('\n');
        let uid = match &op.uid {
            Some(uid) => format!("uid {uid:?}"),
            None => "(no uid)".to_string(),
        };
        let _ = writeln!(
            s,
            "Operator {uid}, id {}, name {:?}: parallelism {}, max parallelism {}, state {}",
            op.operator_id,
            op.name,
            op.parallelism,
            op.max_parallelism,
            if op.subtasks.is_empty() {
                "none".to_string()
            } else {
                size_text(op.state_size)
            }
        );
        for sub in &op.subtasks {
            render_subtask(&mut s, sub);
        }
    }
    for f in &r.in_flight {
        s.push('\n');
        let operator = match (&f.operator, &f.uid) {
            (Some(name), Some(uid)) => format!("operator {name:?} (uid {uid:?})"),
            (Some(name), None) => format!("operator {name:?} (id {})", f.operator_id),
            _ => format!("operator {} (not in the checkpoint)", f.operator_id),
        };
        let _ = writeln!(
            s,
            "In-flight data of {operator}, subtask {}: {} section{}, {} records, {}, {}",
            f.subtask,
            f.sections.len(),
            if f.sections.len() == 1 { "" } else { "s" },
            f.records,
            size_text(f.size),
            where_(&f.stream)
        );
        for c in &f.sections {
            let names = match (&c.from_operator, &c.to_operator) {
                (Some(from), Some(to)) => format!(" ({from:?} -> {to:?})"),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "  {:<6} channel {}{names}: {} records, {}",
                c.direction,
                c.channel,
                c.records,
                size_text(c.bytes)
            );
        }
        let _ = writeln!(s, "  verification: {}", verdict(&f.verification));
    }
    s.push('\n');
    if r.problems.is_empty() {
        let _ = writeln!(
            s,
            "Verification: OK: {} files, {} bytes verified",
            r.files_verified, r.bytes_verified
        );
    } else {
        let _ = writeln!(
            s,
            "Verification: {} problem{} in {} files, {} bytes:",
            r.problems.len(),
            if r.problems.len() == 1 { "" } else { "s" },
            r.files_verified,
            r.bytes_verified
        );
        for p in &r.problems {
            let _ = writeln!(s, "  CORRUPT: {}: {}", p.file, p.reason);
        }
    }
    s
}

/// Renders one subtask's state: keyed, operator and native, each with its verification.
fn render_subtask(s: &mut String, sub: &SubtaskReport) {
    let _ = writeln!(s, "  subtask {}:", sub.subtask);
    for k in &sub.keyed {
        let _ = writeln!(
            s,
            "    keyed state: key groups [{}, {}] ({}), {}, {}",
            k.key_groups.start,
            k.key_groups.end,
            k.key_groups.count,
            size_text(k.size),
            where_(&k.stream)
        );
        for st in &k.states {
            let _ = writeln!(
                s,
                "      state {:?}: {}, key {}, value {}",
                st.name, st.kind, st.key_type, st.value_type
            );
        }
        let _ = writeln!(s, "      verification: {}", verdict(&k.verification));
    }
    for o in &sub.operator {
        let states: Vec<String> = o
            .states
            .iter()
            .map(|e| format!("{:?} ({})", e.name, e.mode))
            .collect();
        let _ = writeln!(
            s,
            "    operator state: {}, {}, {}",
            if states.is_empty() {
                "no states".to_string()
            } else {
                states.join(", ")
            },
            size_text(o.size),
            where_(&o.stream)
        );
        let _ = writeln!(s, "      verification: {}", verdict(&o.verification));
    }
    native::render(s, &sub.native);
}
