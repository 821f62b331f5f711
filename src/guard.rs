//! Keeps panics out of Redis: a panic inside a module aborts the server and
//! loses every unsaved write. Every entry point Redis calls runs through
//! [`or`], and a panic hook writes the panic to the Redis log.

use std::panic::{self, AssertUnwindSafe};

use redis_module::logging;

/// Installs a hook that logs panics (with their location) to the Redis log.
pub fn install_panic_hook() {
    panic::set_hook(Box::new(|info| {
        log_warning(&format!("redis-mem: internal error (panic): {info}"));
    }));
}

/// Writes `msg` to the Redis log. The crate's logger unwraps a CString: a
/// NUL in a message (a panic or load error quoting stored bytes) would panic
/// inside the hook and abort the server, so NULs are replaced first.
pub fn log_warning(msg: &str) {
    logging::log_warning(msg.replace('\0', "?"));
}

/// Runs `f`; if it panics, logs it (through the hook) and returns `fallback`.
pub fn or<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// [`or`] whose fallback is made only on a panic (an error's message is
/// two allocations every command made and dropped).
pub fn or_else<T>(fallback: impl FnOnce() -> T, f: impl FnOnce() -> T) -> T {
    panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| fallback())
}
