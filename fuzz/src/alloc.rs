//! The counting global allocator: per thread, the bytes live, their peak and the largest single
//! allocation, so the harness can bound what one input makes a decoder allocate.
//!
//! Every binary that links `weir-fuzz` (the `weir-fuzz` runner, its tests) allocates through
//! it. Counts are per thread (a const thread-local, which never allocates), so tests running
//! side by side do not see each other's allocations; memory freed on another thread than the
//! one that allocated it moves the counts of the freeing thread. Allocations of the C library
//! zstd makes with its own `malloc` are not seen.
//!
//! A request larger than [`HARD_LIMIT`] is refused: the allocator prints the target and seed of
//! the input running on the thread (see [`set_current`]) and returns null, so the process aborts
//! with Rust's "memory allocation failed" instead of exhausting the machine. Anything up to the
//! limit is allowed and measured; the harness judges it against its bound after the input.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write;

/// The largest single allocation the allocator grants (1 GiB).
pub const HARD_LIMIT: usize = 1 << 30;

/// The global allocator of every binary linking this crate.
#[global_allocator]
static GLOBAL: Counting = Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TARGET: Cell<&'static str> = const { Cell::new("") };
    static SEED: Cell<u64> = const { Cell::new(0) };
}

/// [`System`], counting.
pub struct Counting;

fn grew(size: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().wrapping_add(size as isize);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

fn shrank(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().wrapping_sub(size as isize)));
}

/// Says which input asked for `size` bytes, without allocating.
fn refuse(size: usize) {
    let target = TARGET.try_with(Cell::get).unwrap_or("");
    let seed = SEED.try_with(Cell::get).unwrap_or(0);
    let _ = writeln!(
        std::io::stderr(),
        "weir-fuzz: refusing an allocation of {size} bytes (more than the hard limit of \
         {HARD_LIMIT}) for target {target:?}, input seed {seed:#018x}; replay it with \
         `cargo xtask chaos fuzz --target {target} --replay {seed:#018x}`"
    );
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, and only
// updates thread-local counters besides (which neither allocate nor unwind).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_LIMIT {
            refuse(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > HARD_LIMIT {
            refuse(layout.size());
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > HARD_LIMIT {
            refuse(new_size);
            return std::ptr::null_mut();
        }
        // SAFETY: forwarded as received.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrank(layout.size());
            grew(new_size);
        }
        p
    }
}

/// What this thread allocated since [`start`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// The most bytes live at once, beyond those live at the start.
    pub peak: usize,
    /// The largest single allocation (or reallocation's new size).
    pub largest: usize,
}

/// A measurement on this thread: its peak and largest allocation are counted from here.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    live: isize,
}

/// Starts measuring on this thread.
pub fn start() -> Mark {
    let live = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(live));
    LARGEST.with(|l| l.set(0));
    Mark { live }
}

/// What this thread allocated since `mark`.
pub fn usage(mark: Mark) -> Usage {
    Usage {
        peak: usize::try_from(PEAK.with(Cell::get).wrapping_sub(mark.live)).unwrap_or(0),
        largest: LARGEST.with(Cell::get),
    }
}

/// Names the input this thread runs, for the message of a refused allocation.
pub fn set_current(target: &'static str, seed: u64) {
    TARGET.with(|t| t.set(target));
    SEED.with(|s| s.set(seed));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_and_largest_allocations_are_counted_per_thread() {
        let mark = start();
        let big = vec![1u8; 3 << 20];
        let small: Vec<Vec<u8>> = (0..10).map(|_| vec![0u8; 1000]).collect();
        drop(big);
        let usage = usage(mark);
        assert!(usage.largest >= 3 << 20, "{usage:?}");
        assert!(usage.peak >= 3 << 20, "{usage:?}");
        assert!(usage.peak < 4 << 20, "{usage:?}");
        drop(small);
        // Another thread's allocations are its own.
        let mark = start();
        std::thread::spawn(|| vec![0u8; 8 << 20].len())
            .join()
            .unwrap();
        assert!(super::usage(mark).largest < 8 << 20);
    }
}
