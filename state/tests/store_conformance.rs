//! Runs the keyed-state conformance suite against the store backend over the in-memory
//! [`MemoryKeyedStore`], and its model checks: a store of bytes gives the whole typed contract.

use weir_core::keygroup::KeyGroupRange;
use weir_state::StateKey;
use weir_state::conformance;
use weir_state::store::{MemoryKeyedStore, StoreKeyedStateBackend};

fn memory<K: StateKey>(max_p: u32, range: KeyGroupRange) -> StoreKeyedStateBackend<K> {
    StoreKeyedStateBackend::new(Box::new(MemoryKeyedStore::new()), max_p, range)
}

/// The memory store: one test per check of the suite.
mod memory_store {
    use super::memory;
    weir_state::keyed_backend_conformance!(memory::<String>, memory::<u64>);
}

/// A store with one deliberate fault, to show the suite catches it.
struct Broken {
    inner: MemoryKeyedStore,
    fault: Fault,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// `delete` does nothing.
    KeepsDeleted,
    /// `put` of an existing key is dropped.
    IgnoresOverwrites,
    /// `scan` of the live store stops after one entry (a timer restore misses timers).
    ScansOne,
}

use weir_core::keygroup::KeyGroup;
use weir_state::StateError;
use weir_state::store::{EntryVisitor, FrozenStore, KeyedStore, StoreStateId};

impl KeyedStore for Broken {
    fn get(
        &mut self,
        state: StoreStateId,
        kg: KeyGroup,
        key: &[u8],
        value: &mut Vec<u8>,
    ) -> Result<bool, StateError> {
        self.inner.get(state, kg, key, value)
    }

    fn put(
        &mut self,
        state: StoreStateId,
        kg: KeyGroup,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StateError> {
        if let Fault::IgnoresOverwrites = self.fault {
            let mut old = Vec::new();
            if self.inner.get(state, kg, key, &mut old)? {
                return Ok(());
            }
        }
        self.inner.put(state, kg, key, value)
    }

    fn delete(&mut self, state: StoreStateId, kg: KeyGroup, key: &[u8]) -> Result<(), StateError> {
        match self.fault {
            Fault::KeepsDeleted => Ok(()),
            _ => self.inner.delete(state, kg, key),
        }
    }

    fn scan(
        &mut self,
        state: StoreStateId,
        kg: KeyGroup,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), StateError> {
        let mut seen = 0;
        self.inner.scan(state, kg, &mut |k, v| {
            seen += 1;
            match self.fault {
                Fault::ScansOne if seen > 1 => Ok(()),
                _ => visit(k, v),
            }
        })
    }

    fn freeze(&mut self) -> Result<Box<dyn FrozenStore>, StateError> {
        self.inner.freeze()
    }
}

#[test]
fn a_broken_store_fails_the_suite() {
    for fault in [
        Fault::KeepsDeleted,
        Fault::IgnoresOverwrites,
        Fault::ScansOne,
    ] {
        let make_string = move |max_p, range| {
            StoreKeyedStateBackend::<String>::new(
                Box::new(Broken {
                    inner: MemoryKeyedStore::new(),
                    fault,
                }),
                max_p,
                range,
            )
        };
        let make_u64 = move |max_p, range| {
            StoreKeyedStateBackend::<u64>::new(
                Box::new(Broken {
                    inner: MemoryKeyedStore::new(),
                    fault,
                }),
                max_p,
                range,
            )
        };
        let failed = std::panic::catch_unwind(|| conformance::run_all(make_string, make_u64));
        let message = failed
            .err()
            .and_then(|p| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| panic!("the suite passed a store that {fault:?}"));
        assert!(
            message.contains("keyed-state conformance ["),
            "{fault:?}: {message}"
        );
    }
}
