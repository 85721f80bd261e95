//! A checkpoint's asynchronous part in a subtask: serialize the frozen state, frame each file
//! with its identity (`weir_core::identity`), write it through checkpoint storage, and collect
//! the handles the acknowledgement carries.

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tracing::warn;
use weir_checkpoint::CheckpointStorage;
use weir_checkpoint::coordinator::TaskKey;
use weir_checkpoint::storage::CheckpointLocation;
use weir_core::channel_state::ChannelSection;
use weir_core::element::SnapshotKind;
use weir_core::handle::{
    KeyedStateHandle, NativeFileHandle, NativeKeyedHandle, OperatorStateHandle,
    OperatorSubtaskState, StreamStateHandle, TaskStateSnapshot,
};
use weir_core::identity::{FileIdentity, StateFileKind};
use weir_core::ids::{CheckpointId, JobId, OperatorId};
use weir_state::SnapshotScope;

use crate::operator::OperatorSnapshotParts;

/// What later incremental checkpoints of a subtask build on.
#[derive(Debug, Default)]
pub(crate) struct IncrementalChains {
    /// Per operator, by checkpoint: the keyed-state handles of an incremental chain (a full
    /// snapshot, then its deltas in order), as the subtask's acknowledgement carries them.
    pub links: HashMap<OperatorId, BTreeMap<CheckpointId, Vec<KeyedStateHandle>>>,
    /// Native snapshots' files, uploaded once each.
    pub native: NativeUploads,
}

impl IncrementalChains {
    /// Chains that keep local-recovery copies of native files in `dir` (none for `None`).
    pub(crate) fn with_local_recovery(dir: Option<std::path::PathBuf>) -> IncrementalChains {
        let mut chains = IncrementalChains::default();
        chains.native.local.dir = dir;
        chains
    }
}

/// The files of native snapshots a subtask uploaded: a file a completed checkpoint holds is
/// referenced again by later checkpoints that list it, never uploaded twice. Files of a
/// checkpoint not known to be complete are not reused: it may still fail and take them along.
#[derive(Debug, Default)]
pub(crate) struct NativeUploads {
    pending: BTreeMap<CheckpointId, HashMap<OperatorId, Vec<NativeFileHandle>>>,
    confirmed: HashMap<OperatorId, HashMap<String, StreamStateHandle>>,
    /// Local-recovery copies of the files the pending and confirmed checkpoints reference.
    pub local: crate::local_recovery::LocalRecovery,
}

impl NativeUploads {
    /// The handle of `file` of `operator` a completed checkpoint holds.
    fn uploaded(&self, operator: OperatorId, file: &str) -> Option<StreamStateHandle> {
        self.confirmed.get(&operator)?.get(file).cloned()
    }

    /// Checkpoint `id`'s files of `operator`.
    fn record(&mut self, id: CheckpointId, operator: OperatorId, files: Vec<NativeFileHandle>) {
        self.pending.entry(id).or_default().insert(operator, files);
    }

    /// Checkpoint `id` completed: its files are what later checkpoints reuse.
    pub(crate) fn complete(&mut self, id: CheckpointId) {
        if let Some(by_operator) = self.pending.remove(&id) {
            for (operator, files) in by_operator {
                let by_name = files
                    .into_iter()
                    .map(|f| (file_key(&f.name, f.key_groups), f.stream))
                    .collect();
                self.confirmed.insert(operator, by_name);
            }
        }
        self.pending.retain(|c, _| *c > id);
        // Local recovery keeps what a restore of this checkpoint, or of a later one, reads.
        let pending = self.pending.values().flat_map(|o| o.values().flatten());
        let keep = self
            .confirmed
            .values()
            .flat_map(|files| files.values())
            .chain(pending.map(|f| &f.stream))
            .filter_map(|s| crate::local_recovery::local_name(s).map(str::to_string))
            .collect();
        self.local.retain(&keep, id);
    }

    /// `operator` restored `files` from a checkpoint of this job's own storage: later
    /// checkpoints reference them instead of uploading them again (a failover's first
    /// checkpoint uploads only what changed, and never re-uploads a local copy's bytes).
    pub(crate) fn restored<'a>(
        &mut self,
        operator: OperatorId,
        files: impl Iterator<Item = &'a NativeFileHandle>,
    ) {
        let by_name = self.confirmed.entry(operator).or_default();
        for f in files {
            by_name.insert(file_key(&f.name, f.key_groups), f.stream.clone());
        }
    }

    /// Forgets every upload: the next native snapshots upload all their files (new chains).
    pub(crate) fn clear(&mut self) {
        self.pending.clear();
        self.confirmed.clear();
    }
}

/// The names and redistribution modes of an operator snapshot's states.
type StateNames = Vec<(String, weir_core::handle::OperatorStateMode)>;

/// Room left before a payload for its identity frame (a frame takes about 100 bytes), so that
/// framing a file moves no payload byte.
const FRAME_ROOM: usize = 256;

/// A state file being serialized: room for its identity frame, then the payload.
struct FramedFile {
    buf: Vec<u8>,
}

impl FramedFile {
    fn new() -> FramedFile {
        FramedFile {
            buf: vec![0; FRAME_ROOM],
        }
    }

    /// Where the payload is written.
    fn payload(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Puts the identity frame in front of the payload, with the payload's format version
    /// (bytes 4..6 of its envelope header); returns the file and the frame's length.
    fn finish(self, mut identity: FileIdentity) -> Result<(Bytes, u64), String> {
        let payload = &self.buf[FRAME_ROOM..];
        identity.format_version = match payload {
            [_, _, _, _, lo, hi, ..] => u16::from_le_bytes([*lo, *hi]),
            _ => 0,
        };
        let frame = identity.frame().map_err(|e| e.to_string())?;
        let len = frame.len();
        if len <= FRAME_ROOM {
            let start = FRAME_ROOM - len;
            let mut buf = self.buf;
            buf[start..FRAME_ROOM].copy_from_slice(&frame);
            Ok((Bytes::from(buf).slice(start..), len as u64))
        } else {
            let mut out = frame;
            out.extend_from_slice(payload);
            Ok((Bytes::from(out), len as u64))
        }
    }
}

/// A keyed layout counted from the start of the file: the backend counted from its payload.
fn shift_layout(
    mut layout: weir_state::KeyedSnapshotLayout,
    by: u64,
) -> weir_state::KeyedSnapshotLayout {
    layout.header = (layout.header.0 + by, layout.header.1 + by);
    for o in &mut layout.offsets {
        *o += by;
    }
    layout.end += by;
    layout
}

/// A native keyed snapshot: its files on local disk, and the snapshot, which keeps them there
/// until the upload is done and then writes the manifest.
struct SerializedNative {
    files: weir_state::NativeFiles,
    snapshot: Box<dyn weir_state::KeyedSnapshot>,
}

/// One operator's state, serialized and framed.
struct Serialized {
    operator_id: OperatorId,
    keyed: Option<(weir_state::KeyedSnapshotLayout, Bytes)>,
    native: Option<SerializedNative>,
    /// For an incremental snapshot: the chain it extends.
    chain: Option<Vec<KeyedStateHandle>>,
    operator: Option<(StateNames, Bytes)>,
}

/// What one subtask's checkpoint uploads.
pub(crate) struct Upload {
    pub job_id: JobId,
    pub kind: SnapshotKind,
    /// The chain's head operator, under which channel state is filed.
    pub head_operator: OperatorId,
    pub id: CheckpointId,
    pub task: TaskKey,
    pub generation: u64,
    pub parts: Vec<OperatorSnapshotParts>,
    /// Per part: the chain its keyed delta extends (empty for anything else).
    pub bases: Vec<Vec<KeyedStateHandle>>,
    pub in_flight: Vec<ChannelSection>,
    pub chains: Arc<Mutex<IncrementalChains>>,
}

/// Serializes the frozen parts and writes them to checkpoint storage. Incremental keyed
/// snapshots go to the job's shared directory, and the acknowledgement carries their whole
/// chain, which is remembered for the deltas that will extend it.
pub(crate) async fn upload(
    storage: Arc<dyn CheckpointStorage>,
    location: CheckpointLocation,
    upload: Upload,
) -> Result<TaskStateSnapshot, String> {
    let Upload {
        job_id,
        kind: snapshot,
        head_operator,
        id,
        task,
        generation,
        parts,
        bases,
        in_flight,
        chains,
    } = upload;
    let snapshot_kind = snapshot;
    let identity = move |operator_id, kind, key_groups, base| FileIdentity {
        job_id,
        checkpoint_id: id,
        snapshot,
        operator_id,
        subtask: task.subtask,
        key_groups,
        kind,
        base,
        format_version: 0,
    };
    let serialize = move || -> Result<Vec<Serialized>, String> {
        let mut out = Vec::with_capacity(parts.len());
        for (p, base) in parts.into_iter().zip(bases) {
            let mut chain = None;
            let mut native = None;
            let mut keyed = p.keyed;
            if let Some(k) = keyed.as_mut()
                && let Some(files) = k.native_files().map_err(|e| e.to_string())?
            {
                native = keyed
                    .take()
                    .map(|snapshot| SerializedNative { files, snapshot });
            }
            let keyed = match keyed {
                Some(k) => {
                    let (file_kind, link_base) = match k.scope() {
                        SnapshotScope::Incremental { base: b } => {
                            chain = Some(base);
                            (StateFileKind::KeyedLink, b.map(CheckpointId))
                        }
                        SnapshotScope::SelfContained => (StateFileKind::Keyed, None),
                    };
                    let mut file = FramedFile::new();
                    let layout = k.write_to(file.payload()).map_err(|e| e.to_string())?;
                    let who = identity(
                        p.operator_id,
                        file_kind,
                        Some(layout.key_group_range),
                        link_base,
                    );
                    let (bytes, shift) = file.finish(who)?;
                    Some((shift_layout(layout, shift), bytes))
                }
                None => None,
            };
            let operator = match p.operator {
                Some(o) if !o.is_empty() => {
                    let states = o.states();
                    let mut file = FramedFile::new();
                    o.write_to(file.payload()).map_err(|e| e.to_string())?;
                    let who = identity(p.operator_id, StateFileKind::Operator, None, None);
                    Some((states, file.finish(who)?.0))
                }
                _ => None,
            };
            out.push(Serialized {
                operator_id: p.operator_id,
                keyed,
                native,
                chain,
                operator,
            });
        }
        Ok(out)
    };
    // Off the runtime's threads; under a simulation, in line, as it has one thread only.
    let serialized = if weir_core::sim::active() {
        serialize()?
    } else {
        tokio::task::spawn_blocking(serialize).await.map_err(|e| {
            if e.is_cancelled() {
                "snapshot serialization was cancelled: the job is shutting down".to_string()
            } else {
                format!("snapshot serialization panicked: {e}")
            }
        })??
    };

    let mut snapshot = TaskStateSnapshot::default();
    if !in_flight.is_empty() {
        let sections = in_flight.iter().map(|s| s.summary()).collect();
        let mut file = FramedFile::new();
        let encoded =
            weir_core::channel_state::encode_file(&in_flight).map_err(|e| e.to_string())?;
        file.payload().extend_from_slice(&encoded);
        let who = identity(head_operator, StateFileKind::ChannelState, None, None);
        let (bytes, _) = file.finish(who)?;
        let name = format!("v{}-{}-g{generation}-channels", task.vertex.0, task.subtask);
        let stream = write_file(&*storage, &location, &name, bytes, false).await?;
        snapshot.in_flight =
            Some(weir_core::channel_state::ChannelStateHandle { stream, sections });
    }
    // Shared files this upload wrote: deleted again if it fails, as no checkpoint will hold them.
    let mut new_shared: Vec<StreamStateHandle> = Vec::new();
    let mut new_chains = Vec::new();
    let written = write_parts(
        &*storage,
        &location,
        (id, task, generation, snapshot_kind, job_id),
        serialized,
        &mut snapshot,
        &mut new_shared,
        &mut new_chains,
        &chains,
    )
    .await;
    if let Err(reason) = written {
        for handle in &new_shared {
            if let Err(e) = storage.discard_state(&location, handle).await {
                warn!(checkpoint = id.0, %task, error = %e, "cannot delete a shared file of a failed upload");
            }
        }
        return Err(reason);
    }
    if let Ok(mut chains) = chains.lock() {
        for (operator_id, chain) in new_chains {
            chains
                .links
                .entry(operator_id)
                .or_default()
                .insert(id, chain);
        }
    }
    snapshot.new_shared = new_shared
        .iter()
        .filter_map(|h| h.path().map(str::to_string))
        .collect();
    Ok(snapshot)
}

/// Writes each operator's serialized state and fills `snapshot` with the handles; the shared
/// files written go to `new_shared`, and the incremental chains completed to `new_chains`.
#[allow(clippy::too_many_arguments)]
async fn write_parts(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    who: Who,
    serialized: Vec<Serialized>,
    snapshot: &mut TaskStateSnapshot,
    new_shared: &mut Vec<StreamStateHandle>,
    new_chains: &mut Vec<(OperatorId, Vec<KeyedStateHandle>)>,
    chains: &Mutex<IncrementalChains>,
) -> Result<(), String> {
    let (id, task, generation, _, _) = who;
    for s in serialized {
        let short = format!("{}", s.operator_id);
        let short = &short[..8];
        let mut state = OperatorSubtaskState::default();
        if let Some(native) = s.native {
            let handle = write_native(
                storage,
                location,
                who,
                s.operator_id,
                native,
                new_shared,
                chains,
            )
            .await?;
            if let Ok(mut c) = chains.lock() {
                c.native.record(id, s.operator_id, handle.files.clone());
            }
            state.native.push(handle);
        }
        match (s.keyed, s.chain) {
            (Some((layout, buf)), None) => {
                let name = format!(
                    "v{}-{}-g{generation}-{short}-keyed",
                    task.vertex.0, task.subtask
                );
                let stream = write_file(storage, location, &name, buf, false).await?;
                state.keyed.push(layout.into_handle(stream));
            }
            (Some((layout, buf)), Some(mut chain)) => {
                // Shared: later checkpoints' chains reference it. The name is unique per job:
                // the checkpoint id and generation tell attempts apart.
                let name = format!(
                    "v{}-{}-g{generation}-{short}-c{}-keyed",
                    task.vertex.0, task.subtask, id.0
                );
                let stream = write_file(storage, location, &name, buf, true).await?;
                if matches!(stream, StreamStateHandle::File { .. }) {
                    new_shared.push(stream.clone());
                }
                chain.push(layout.into_handle(stream));
                new_chains.push((s.operator_id, chain.clone()));
                state.keyed.extend(chain);
            }
            (None, _) => {}
        }
        if let Some((states, buf)) = s.operator {
            let name = format!(
                "v{}-{}-g{generation}-{short}-op",
                task.vertex.0, task.subtask
            );
            let stream = write_file(storage, location, &name, buf, false).await?;
            state.operator.push(OperatorStateHandle { states, stream });
        }
        if !state.is_empty() {
            snapshot.operators.insert(s.operator_id, state);
        }
    }
    Ok(())
}

/// What tells one uploaded native file from another: the backend's name and the key groups the
/// file answers for (the same run restored into two key-group ranges is two files, each framed
/// with its own).
fn file_key(name: &str, key_groups: weir_core::keygroup::KeyGroupRange) -> String {
    format!("{name}@{}-{}", key_groups.start, key_groups.end)
}

/// Whose upload: the checkpoint, the subtask, its generation, the snapshot's kind and the job.
type Who = (CheckpointId, TaskKey, u64, SnapshotKind, JobId);

/// Uploads a native snapshot: each file no completed checkpoint holds goes to the shared
/// directory behind an identity frame, the others are referenced again; then the manifest,
/// after which the snapshot lets its files go.
async fn write_native(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    (id, task, generation, kind, job_id): Who,
    operator_id: OperatorId,
    native: SerializedNative,
    new_shared: &mut Vec<StreamStateHandle>,
    chains: &Mutex<IncrementalChains>,
) -> Result<NativeKeyedHandle, String> {
    let SerializedNative { files, snapshot } = native;
    let short = format!("{operator_id}");
    let short = &short[..8];
    let identity = |kind_of_file, key_groups| FileIdentity {
        job_id,
        checkpoint_id: id,
        snapshot: kind,
        operator_id,
        subtask: task.subtask,
        key_groups: Some(key_groups),
        kind: kind_of_file,
        base: None,
        format_version: 0,
    };
    let mut handles = Vec::with_capacity(files.files.len());
    for f in &files.files {
        let key = file_key(&f.name, f.key_groups);
        let reused = chains
            .lock()
            .ok()
            .and_then(|c| c.native.uploaded(operator_id, &key));
        let stream = match reused {
            Some(handle) => handle,
            None => {
                let mut who = identity(StateFileKind::NativeFile, f.key_groups);
                who.format_version = format_version_of(&f.path)?;
                let frame = Bytes::from(who.frame().map_err(|e| e.to_string())?);
                // Unique per upload: a run uploaded again (its first checkpoint never
                // confirmed) must not overwrite the file another checkpoint may reference.
                let name = format!(
                    "v{}-{}-g{generation}-{short}-c{}-{key}",
                    task.vertex.0, task.subtask, id.0
                );
                // Streamed from local disk: a run of any size costs a bounded buffer.
                let handle = storage
                    .write_shared_state_from_file(location, &name, frame, &f.path, f.size)
                    .await
                    .map_err(|e| e.to_string())?;
                if matches!(handle, StreamStateHandle::File { .. }) {
                    new_shared.push(handle.clone());
                }
                handle
            }
        };
        if let Ok(c) = chains.lock() {
            c.native.local.keep(&f.path, &stream);
        }
        handles.push(NativeFileHandle {
            name: f.name.clone(),
            key_groups: f.key_groups,
            stream,
        });
    }
    let mut file = FramedFile::new();
    let layout = snapshot
        .write_to(file.payload())
        .map_err(|e| e.to_string())?;
    let (bytes, _) = file.finish(identity(
        StateFileKind::NativeManifest,
        layout.key_group_range,
    ))?;
    let name = format!(
        "v{}-{}-g{generation}-{short}-c{}-manifest",
        task.vertex.0, task.subtask, id.0
    );
    let manifest = write_file(storage, location, &name, bytes, false).await?;
    Ok(NativeKeyedHandle {
        key_group_range: layout.key_group_range,
        format: files.format,
        manifest,
        files: handles,
    })
}

/// The format version of a local file's payload (bytes 4..6 of its envelope header), for its
/// identity frame.
fn format_version_of(path: &std::path::Path) -> Result<u16, String> {
    use std::io::Read;
    let mut head = [0u8; 6];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .map_err(|e| format!("cannot read the native file {}: {e}", path.display()))?;
    Ok(u16::from_le_bytes([head[4], head[5]]))
}

/// Writes one state file into `location` (or, `shared`, beside it) and returns its handle.
///
/// Under a simulation acting out `Mutation::AckBeforeDurable`, a write that failed is
/// acknowledged anyway, with the handle it would have had: the deliberate bug of acknowledging
/// state that is not durable.
async fn write_file(
    storage: &dyn CheckpointStorage,
    location: &CheckpointLocation,
    name: &str,
    bytes: bytes::Bytes,
    shared: bool,
) -> Result<StreamStateHandle, String> {
    let mutated = weir_core::sim::mutated(weir_core::sim::Mutation::AckBeforeDurable);
    let kept = mutated.then(|| bytes.clone());
    let written = if shared {
        storage.write_shared_state(location, name, bytes).await
    } else {
        storage.write_state(location, name, bytes).await
    };
    match (written, kept) {
        (Ok(handle), _) => Ok(handle),
        (Err(_), Some(bytes)) => Ok(StreamStateHandle::File {
            path: if shared {
                format!(
                    "{}{name}",
                    weir_checkpoint::storage::SHARED_DIR_FROM_LOCATION
                )
            } else {
                name.to_string()
            },
            size: bytes.len() as u64,
            digest: weir_core::identity::Digest::of(&bytes),
        }),
        (Err(e), None) => Err(e.to_string()),
    }
}
