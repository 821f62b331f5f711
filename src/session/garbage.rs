//! What a write drops that is slow to free, kept until the command ends and
//! then freed off the main thread (`offload::pool::free_dropped`, as Redis's
//! lazyfree): segments of 1 MB or more, and the msgids of many messages that
//! leave at once (100,000 small allocations took ~5 ms to free). The core
//! stays free of Redis and threads: it only sets things aside.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A departure of at least this many msgids is freed later.
pub const FREE_LATER_MSGIDS: usize = 1024;

type Garbage = Box<dyn Send>;

static DROPPED: Mutex<Vec<Garbage>> = Mutex::new(Vec::new());
/// Set once something is set aside: [`take`], called after every command,
/// locks only then (the lock and unlock were ~2% of a small MEM.COUNT).
static PENDING: AtomicBool = AtomicBool::new(false);

/// Sets `garbage` aside for [`take`]. Unit tests, which no worker serves,
/// and a poisoned lock (never: nothing panics holding it) free it here.
pub fn discard<T: Send + 'static>(garbage: T) {
    if cfg!(test) {
        return;
    }
    if let Ok(mut dropped) = DROPPED.lock() {
        dropped.push(Box::new(garbage));
        PENDING.store(true, Ordering::Release);
    }
}

/// What writes set aside since the last call, for the caller to free.
pub fn take() -> Vec<Garbage> {
    // A push whose flag this misses is taken by the next call.
    if !PENDING.load(Ordering::Acquire) || !PENDING.swap(false, Ordering::AcqRel) {
        return Vec::new();
    }
    DROPPED
        .lock()
        .map(|mut d| std::mem::take(&mut *d))
        .unwrap_or_default()
}
