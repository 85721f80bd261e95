//! Native keyed snapshots in `weir checkpoints inspect` and `verify`: each manifest and file
//! read whole (size and digest), its identity frame checked, then reported and rendered beside
//! the keyed and operator state of its subtask.

use super::{
    Checker, KeyGroups, StreamReport, Verification, checksum_name, size_text, verdict, where_,
};
use crate::verify;
use serde::Serialize;
use std::fmt::Write as _;
use weir_checkpoint::CheckpointMetadata;
use weir_core::handle::{NativeKeyedHandle, StreamStateHandle, saturating_sum};
use weir_core::identity::StateFileKind;
use weir_core::ids::{OperatorId, SubtaskIndex};
use weir_core::keygroup::KeyGroupRange;

/// One native keyed snapshot of a subtask: its backend's own files, each uploaded once and
/// shared by the checkpoints that list it, and the manifest the backend wrote.
#[derive(Clone, Debug, Serialize)]
pub struct NativeHandleReport {
    /// The backend's file format (`weir-disk-runs/2`).
    pub format: String,
    /// The key groups of the subtask that took it.
    pub key_groups: KeyGroups,
    /// Bytes of its manifest and files.
    pub size: u64,
    /// Its manifest.
    pub manifest: NativeManifestReport,
    /// Its files, in the backend's order.
    pub files: Vec<NativeFileReport>,
}

/// The manifest of a native keyed snapshot (written by each checkpoint).
#[derive(Clone, Debug, Serialize)]
pub struct NativeManifestReport {
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// The verification of its bytes and identity frame.
    pub verification: Verification,
}

/// One file of a native keyed snapshot (shared: in the job's `shared/` directory, or inline).
#[derive(Clone, Debug, Serialize)]
pub struct NativeFileReport {
    /// The backend's name for it, the same in every checkpoint that lists it.
    pub name: String,
    /// The key groups it answers for.
    pub key_groups: KeyGroups,
    /// Its size in bytes.
    pub size: u64,
    /// Where it is.
    pub stream: StreamReport,
    /// The checkpoint that uploaded it, from its identity frame (an older one when the file is
    /// shared with earlier checkpoints); `None` when the frame could not be read or checked.
    pub uploaded_by: Option<u64>,
    /// The verification of its bytes and identity frame.
    pub verification: Verification,
}

impl Checker<'_> {
    /// Checks one native keyed snapshot of `op`'s subtask `subtask`: its manifest and every
    /// file, each read whole (size and digest), with its identity frame.
    pub(super) async fn native(
        &mut self,
        m: &CheckpointMetadata,
        operator_id: OperatorId,
        subtask: SubtaskIndex,
        h: &NativeKeyedHandle,
        who: &str,
    ) -> NativeHandleReport {
        let at = (operator_id, subtask);
        let (verification, _) = self
            .native_stream(
                m,
                at,
                &h.manifest,
                (StateFileKind::NativeManifest, h.key_group_range),
                &format!("native keyed state manifest of {who}"),
            )
            .await;
        let manifest = NativeManifestReport {
            size: h.manifest.size(),
            stream: self.stream_report(&h.manifest),
            verification,
        };
        let mut files = Vec::with_capacity(h.files.len());
        for f in &h.files {
            let (verification, uploaded_by) = self
                .native_stream(
                    m,
                    at,
                    &f.stream,
                    (StateFileKind::NativeFile, f.key_groups),
                    &format!("native keyed state file {:?} of {who}", f.name),
                )
                .await;
            files.push(NativeFileReport {
                name: f.name.clone(),
                key_groups: f.key_groups.into(),
                size: f.stream.size(),
                stream: self.stream_report(&f.stream),
                uploaded_by,
                verification,
            });
        }
        NativeHandleReport {
            format: h.format.clone(),
            key_groups: h.key_group_range.into(),
            size: saturating_sum(
                std::iter::once(manifest.size).chain(files.iter().map(|f| f.size)),
            ),
            manifest,
            files,
        }
    }

    /// Reads one stream of a native snapshot whole (verifying a file's size and digest) and
    /// checks its identity frame; returns its verification and the checkpoint that wrote it.
    async fn native_stream(
        &mut self,
        m: &CheckpointMetadata,
        (operator_id, subtask): (OperatorId, SubtaskIndex),
        stream: &StreamStateHandle,
        (kind, key_groups): (StateFileKind, KeyGroupRange),
        what: &str,
    ) -> (Verification, Option<u64>) {
        self.note_file(stream);
        let subject = self.subject(stream, what);
        let mut errors = Vec::new();
        let mut written_by = None;
        match self.read_whole(stream).await {
            Ok(bytes) => {
                match verify::check_native_frame(m, operator_id, subtask, key_groups, kind, &bytes)
                {
                    Ok((identity, _)) => written_by = Some(identity.checkpoint_id.0),
                    Err(e) => errors.push(e),
                }
            }
            Err(reason) => errors.push(reason),
        }
        let ok = match stream {
            StreamStateHandle::Inline(_) => {
                "inline (covered by _metadata's checksum); identity frame checked".to_string()
            }
            _ => format!(
                "size and {} match; identity frame checked",
                checksum_name(stream)
            ),
        };
        (self.conclude(&subject, errors, ok), written_by)
    }
}

/// Renders a subtask's native keyed snapshots, in the style of its keyed state.
pub(super) fn render(s: &mut String, native: &[NativeHandleReport]) {
    for n in native {
        let kg = &n.key_groups;
        let _ = writeln!(
            s,
            "    native keyed state: key groups [{}, {}] ({}), format {}, {} file{}, {}",
            kg.start,
            kg.end,
            kg.count,
            n.format,
            n.files.len(),
            if n.files.len() == 1 { "" } else { "s" },
            size_text(n.size)
        );
        let _ = writeln!(
            s,
            "      manifest: {}, {}",
            size_text(n.manifest.size),
            where_(&n.manifest.stream)
        );
        let _ = writeln!(
            s,
            "        verification: {}",
            verdict(&n.manifest.verification)
        );
        for f in &n.files {
            let uploaded = match f.uploaded_by {
                Some(c) => format!(", uploaded by checkpoint {c}"),
                None => String::new(),
            };
            let _ = writeln!(
                s,
                "      file {:?}: key groups [{}, {}] ({}), {}, {}{uploaded}",
                f.name,
                f.key_groups.start,
                f.key_groups.end,
                f.key_groups.count,
                size_text(f.size),
                where_(&f.stream)
            );
            let _ = writeln!(s, "        verification: {}", verdict(&f.verification));
        }
    }
}
