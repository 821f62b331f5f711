//! Memory the module holds for itself (encoding tables, piece caches), kept
//! out of what Redis's `maxmemory` counts. Redis evicts keys and refuses
//! writes by `used_memory`, the sum of what went through its allocator: an
//! encoding built there (25-45 MB) would make a keyless read (MEM.COUNT)
//! evict every session. Redis keeps its Lua VM out of `used_memory` for the
//! same reason.
//!
//! Work that builds such tables runs inside [`for_module`]; the global
//! allocator then takes its memory from one region mapped once (4 GiB of
//! address space, MAP_NORESERVE: pages are backed only once touched) and
//! managed by talc. Every free and realloc asks whether the pointer lies in
//! the region, whoever frees it and whatever mode the thread is in, so a
//! table built here and freed anywhere goes back where it came from. Without
//! the region (mmap refused), module memory falls back to Redis's allocator,
//! as before.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use talc::source::Claim;
use talc::TalcLock;

/// Address space reserved for the module's own memory.
const REGION_BYTES: usize = 4 << 30;

/// The region's base (0: not mapped yet or refused) and end.
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// 0 not tried, 1 mapping, 2 mapped, 3 refused.
static STATE: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated in the region and not freed (INFO mem).
static IN_USE: AtomicU64 = AtomicU64::new(0);

/// A block of this size or more gives its whole pages back to the kernel
/// before talc takes it back (freed, moved or shrunk): talc never returns
/// memory, and an encoding's build frees 1-2x its tables in intermediate
/// ones (a Llama 3 build left RSS 57 MB up for 25 MB of tables). A later
/// allocation there faults in zeroed pages.
const RETURN_PAGES_BYTES: usize = 256 << 10;

static TALC: TalcLock<spinning_top::RawSpinlock, Claim> = TalcLock::new(Claim::standby());

thread_local! {
    /// Depth of `for_module` on this thread. Const-initialised, no
    /// destructor: reading it inside the allocator allocates nothing.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f` with this thread's allocations taken from the module's region.
pub fn for_module<T>(f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
    let _restore = Restore;
    f()
}

/// Bytes of the module's own memory in use (outside `used_memory`).
pub fn in_use() -> u64 {
    IN_USE.load(Ordering::Relaxed)
}

/// Whether the region is mapped (false: module memory is Redis's).
pub fn has_region() -> bool {
    STATE.load(Ordering::Acquire) == 2
}

fn wanted() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(false)
}

fn owns(ptr: *mut u8) -> bool {
    let p = ptr as usize;
    p >= BASE.load(Ordering::Relaxed) && p < END.load(Ordering::Relaxed)
}

/// Maps the region once; false if it cannot be had.
fn region() -> bool {
    match STATE.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {}
        Err(2) => return true,
        // Refused, or another thread is mapping it: this allocation goes to
        // Redis's allocator (correct either way).
        Err(_) => return false,
    }
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choice: no existing memory is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            REGION_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        STATE.store(3, Ordering::Release);
        return false;
    }
    // SAFETY: the region is mapped, writable, and given to talc alone.
    let claimed = unsafe { TALC.lock().claim(base.cast(), REGION_BYTES) };
    if claimed.is_none() {
        STATE.store(3, Ordering::Release);
        return false;
    }
    END.store(base as usize + REGION_BYTES, Ordering::Relaxed);
    BASE.store(base as usize, Ordering::Relaxed);
    STATE.store(2, Ordering::Release);
    true
}

/// An allocation from the region, or None (not wanted, no region, full).
///
/// # Safety
/// `layout` has a non-zero size (GlobalAlloc's contract).
pub unsafe fn alloc(layout: Layout, zeroed: bool) -> Option<*mut u8> {
    if !wanted() || !region() {
        return None;
    }
    // SAFETY: the caller's contract.
    let p = unsafe {
        if zeroed {
            TALC.alloc_zeroed(layout)
        } else {
            TALC.alloc(layout)
        }
    };
    if p.is_null() {
        return None;
    }
    IN_USE.fetch_add(layout.size() as u64, Ordering::Relaxed);
    Some(p)
}

/// Frees `ptr` if the region holds it; false if it is Redis's.
///
/// # Safety
/// GlobalAlloc::dealloc's contract.
pub unsafe fn dealloc(ptr: *mut u8, layout: Layout) -> bool {
    if !owns(ptr) {
        return false;
    }
    IN_USE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    if layout.size() >= RETURN_PAGES_BYTES {
        // SAFETY: the caller's block, no longer used (being freed).
        unsafe { return_pages(ptr, layout.size()) };
    }
    // SAFETY: allocated by TALC with `layout` (the region holds only its
    // allocations), the caller's contract otherwise.
    unsafe { TALC.dealloc(ptr, layout) };
    true
}

/// Reallocates `ptr` in the region if the region holds it.
///
/// # Safety
/// GlobalAlloc::realloc's contract.
pub unsafe fn realloc(ptr: *mut u8, layout: Layout, new_size: usize) -> Option<*mut u8> {
    if !owns(ptr) {
        return None;
    }
    let p = if layout.size() >= RETURN_PAGES_BYTES {
        // SAFETY: as in `dealloc`.
        unsafe { realloc_returning_pages(ptr, layout, new_size) }
    } else {
        // SAFETY: as in `dealloc`.
        unsafe { TALC.realloc(ptr, layout, new_size) }
    };
    if !p.is_null() {
        IN_USE.fetch_add(new_size as u64, Ordering::Relaxed);
        IN_USE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
    }
    Some(p)
}

/// talc's realloc, but what a large block leaves (a shrunk tail, the old
/// block of a move) gives its pages back first.
///
/// # Safety
/// GlobalAlloc::realloc's contract, `ptr` in the region.
unsafe fn realloc_returning_pages(ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
    if new_size <= layout.size() {
        // SAFETY: the tail is the caller's and no longer used; then talc
        // shrinks in place.
        unsafe {
            return_pages(ptr.add(new_size), layout.size() - new_size);
            return TALC.realloc(ptr, layout, new_size);
        }
    }
    // SAFETY: `ptr` was allocated by TALC with `layout`; new_size > size.
    if unsafe { TALC.lock().try_grow_in_place(ptr, layout, new_size) } {
        return ptr;
    }
    let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
        return std::ptr::null_mut();
    };
    // SAFETY: new_size is non-zero (larger than a non-zero size).
    let moved = unsafe { TALC.alloc(new_layout) };
    if moved.is_null() {
        return moved;
    }
    // SAFETY: both blocks are the caller's, distinct, at least
    // `layout.size()` long; the old one is then given back and freed.
    unsafe {
        std::ptr::copy_nonoverlapping(ptr, moved, layout.size());
        return_pages(ptr, layout.size());
        TALC.dealloc(ptr, layout);
    }
    moved
}

/// Gives the whole pages inside `[start, start + len)` back to the kernel.
///
/// # Safety
/// The bytes are the caller's and no longer needed (they read as zero
/// after this).
unsafe fn return_pages(start: *mut u8, len: usize) {
    // SAFETY: sysconf has no preconditions.
    let page = match usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }) {
        Ok(p) if p.is_power_of_two() => p,
        _ => return,
    };
    let first = (start as usize).saturating_add(page - 1) & !(page - 1);
    let end = (start as usize).saturating_add(len) & !(page - 1);
    if end > first {
        // SAFETY: whole pages inside the caller's bytes, in the region's
        // private anonymous mapping; a failure leaves them as they were.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_keep_their_bytes_through_growth_shrinking_and_frees() {
        // Blocks above RETURN_PAGES_BYTES give their pages back as they are
        // freed, moved or shrunk: what is still held must read as written.
        for_module(|| {
            let mut held = Vec::new();
            for round in 0..6u32 {
                let mut v: Vec<u32> = Vec::with_capacity(100_000);
                for i in 0..2_000_000u32 {
                    v.push(i ^ round); // grows through several moves
                }
                assert!(v.iter().enumerate().all(|(i, x)| *x == i as u32 ^ round));
                v.truncate(300_000 + round as usize);
                v.shrink_to_fit(); // a tail of MBs returned in place
                assert!(v.iter().enumerate().all(|(i, x)| *x == i as u32 ^ round));
                let freed = vec![round as u8; 3 << 20];
                assert!(freed.iter().all(|b| *b == round as u8));
                drop(freed);
                // A new block where the freed one was reads as allocated.
                let zeroed = vec![0u8; 3 << 20];
                assert!(zeroed.iter().all(|b| *b == 0));
                held.push(v);
            }
            for (round, v) in held.iter().enumerate() {
                assert!(v
                    .iter()
                    .enumerate()
                    .all(|(i, x)| *x == i as u32 ^ round as u32));
            }
            assert!(has_region());
        });
    }
}
