//! Operator state (being written).

/// Operator state backend.
#[derive(Debug)]
pub struct OperatorStateBackend;
/// List state handle.
#[derive(Debug)]
pub struct ListState<T>(std::marker::PhantomData<T>);
/// Operator snapshot.
#[derive(Debug)]
pub struct OperatorSnapshot;
