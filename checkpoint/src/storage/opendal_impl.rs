//! [`CheckpointStorage`](super::CheckpointStorage) over an opendal `Operator` (being written).

/// Checkpoint storage over any opendal service.
#[derive(Debug)]
pub struct OpendalCheckpointStorage;
