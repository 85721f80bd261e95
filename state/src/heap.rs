//! The heap keyed-state backend (being written).

/// The heap backend.
#[derive(Debug)]
pub struct HeapKeyedStateBackend<K>(std::marker::PhantomData<K>);
