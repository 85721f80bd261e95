//! Where a run's savepoints go: the `sim://` scheme, registered once per process, opens the
//! checkpoint storage of the run on the calling thread (each run has its own thread-local
//! storage), so savepoints land beside its checkpoints and a resume finds them under its root.

use std::cell::RefCell;
use std::sync::{Arc, Once};
use weir_checkpoint::{CheckpointError, CheckpointStorage};

/// The savepoint directory a run passes to its triggers.
pub const DIR: &str = "sim://savepoints";

thread_local! {
    static CURRENT: RefCell<Option<Arc<dyn CheckpointStorage>>> = const { RefCell::new(None) };
}

/// Serves `storage` as this thread's `sim://` storage from now on.
pub fn serve(storage: Arc<dyn CheckpointStorage>) {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let registered = weir_runtime::register_storage_scheme("sim", |_url: &str| {
            CURRENT.with(|c| c.borrow().clone()).ok_or_else(|| {
                CheckpointError::Config("sim:// is served only on a simulation's thread".into())
            })
        });
        if let Err(e) = registered {
            eprintln!("weir-sim: cannot register sim:// ({e}); savepoints will fail");
        }
    });
    CURRENT.with(|c| *c.borrow_mut() = Some(storage));
}
