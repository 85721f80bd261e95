//! The watchdog: a thread that ends the process, naming the input, when a decoder has run on
//! one input for longer than the hang bound (a hang cannot be interrupted from outside).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The exit status of a process the watchdog ends.
pub const HANG_EXIT: i32 = 3;

/// What one fuzzing thread is doing, as the watchdog sees it.
#[derive(Debug)]
pub struct Slot {
    target: &'static str,
    hang: Duration,
    /// Microseconds since the watchdog's epoch when the current input started, plus one; 0
    /// while no input runs.
    since: AtomicU64,
    seed: AtomicU64,
}

impl Slot {
    /// An input with `seed` starts.
    pub fn begin(&self, seed: u64) {
        self.seed.store(seed, Ordering::Relaxed);
        self.since.store(now_us() + 1, Ordering::Release);
    }

    /// The input ended.
    pub fn end(&self) {
        self.since.store(0, Ordering::Release);
    }
}

struct Watched {
    slots: Mutex<Vec<Weak<Slot>>>,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    u64::try_from(epoch().elapsed().as_micros()).unwrap_or(u64::MAX - 1)
}

fn watched() -> &'static Watched {
    static WATCHED: OnceLock<Watched> = OnceLock::new();
    WATCHED.get_or_init(|| {
        epoch();
        // Without a watchdog thread hangs go unreported, but fuzzing still works.
        let _ = std::thread::Builder::new()
            .name("weir-fuzz-watchdog".to_string())
            .spawn(watch);
        Watched {
            slots: Mutex::new(Vec::new()),
        }
    })
}

/// A slot for a thread fuzzing `target`, watched while it is alive.
pub fn register(target: &'static str, hang: Duration) -> Arc<Slot> {
    let slot = Arc::new(Slot {
        target,
        hang,
        since: AtomicU64::new(0),
        seed: AtomicU64::new(0),
    });
    let mut slots = watched().slots.lock().unwrap_or_else(|e| e.into_inner());
    slots.retain(|s| s.strong_count() > 0);
    slots.push(Arc::downgrade(&slot));
    slot
}

fn watch() {
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let slots: Vec<Arc<Slot>> = {
            let slots = watched().slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.iter().filter_map(Weak::upgrade).collect()
        };
        let now = now_us();
        for slot in slots {
            let since = slot.since.load(Ordering::Acquire);
            if since == 0 {
                continue;
            }
            let running = Duration::from_micros(now.saturating_sub(since - 1));
            if running > slot.hang {
                let seed = slot.seed.load(Ordering::Relaxed);
                eprintln!(
                    "weir-fuzz: HANG: target {} has run input seed {seed:#018x} for {running:?}, \
                     more than {:?}; replay it with `cargo xtask chaos fuzz --target {} --replay \
                     {seed:#018x}`",
                    slot.target, slot.hang, slot.target
                );
                std::process::exit(HANG_EXIT);
            }
        }
    }
}
