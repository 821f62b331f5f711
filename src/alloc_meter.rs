//! The module's global allocator (Redis's, in the server) wrapped to measure
//! what one piece of work on one thread keeps allocated: an encoding's tables
//! are built on a worker while other threads allocate too, so the server's
//! `used_memory` before and after cannot tell their size.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

use crate::module_memory;

pub struct Metered<A>(pub A);

thread_local! {
    /// Bytes allocated minus bytes freed on this thread while measuring
    /// (None: not measuring). Const-initialised, no destructor: reading it
    /// inside the allocator allocates nothing.
    static NET: Cell<Option<i64>> = const { Cell::new(None) };
}

fn note(delta: i64) {
    let _ = NET.try_with(|net| {
        if let Some(n) = net.get() {
            net.set(Some(n.saturating_add(delta)));
        }
    });
}

// SAFETY: every call goes to the module's region (module_memory.rs) when
// it holds the pointer or the thread asked for it, else unchanged to the
// wrapped allocator; the wrapper only adds to a thread-local counter, which
// allocates nothing.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Metered<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = match unsafe { module_memory::alloc(layout, false) } {
            Some(p) => p,
            None => unsafe { self.0.alloc(layout) },
        };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded.
        let p = match unsafe { module_memory::alloc(layout, true) } {
            Some(p) => p,
            None => unsafe { self.0.alloc_zeroed(layout) },
        };
        if !p.is_null() {
            note(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as i64));
        // SAFETY: the caller's contract, forwarded to whichever allocator
        // made `ptr`.
        if !unsafe { module_memory::dealloc(ptr, layout) } {
            unsafe { self.0.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, forwarded to whichever allocator
        // made `ptr`; a region that cannot grow it hands it to the wrapped
        // allocator (copied, then freed in the region).
        let p = match unsafe { module_memory::realloc(ptr, layout, new_size) } {
            Some(p) if !p.is_null() => p,
            Some(_) => unsafe {
                let moved = self
                    .0
                    .alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
                if !moved.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
                    module_memory::dealloc(ptr, layout);
                }
                moved
            },
            None => unsafe { self.0.realloc(ptr, layout, new_size) },
        };
        if !p.is_null() {
            note(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// Runs `f` and returns what it kept allocated on this thread (bytes
/// allocated minus bytes freed), with its result.
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let outer = NET.with(|n| n.replace(Some(0)));
    let result = f();
    let kept = NET.with(|n| n.replace(outer)).unwrap_or(0);
    if let Some(o) = outer {
        NET.with(|n| n.set(Some(o.saturating_add(kept))));
    }
    (result, kept.max(0) as u64)
}
