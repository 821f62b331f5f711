//! Counters behind `INFO mem`.

use std::sync::atomic::{AtomicU64, Ordering};

pub static APPENDS: AtomicU64 = AtomicU64::new(0);
pub static TOKENS_COUNTED: AtomicU64 = AtomicU64::new(0);
pub static MESSAGES_TRIMMED: AtomicU64 = AtomicU64::new(0);
pub static THRESHOLD_EVENTS: AtomicU64 = AtomicU64::new(0);
pub static SUMMARIES_APPLIED: AtomicU64 = AtomicU64::new(0);
pub static SUMMARIES_REJECTED: AtomicU64 = AtomicU64::new(0);
pub static IMPORTS: AtomicU64 = AtomicU64::new(0);
pub static EXT_SETS: AtomicU64 = AtomicU64::new(0);
pub static ATTR_SETS: AtomicU64 = AtomicU64::new(0);
pub static ATTR_DELS: AtomicU64 = AtomicU64::new(0);
pub static TOKENIZER_MICROS: AtomicU64 = AtomicU64::new(0);
pub static TOKENIZER_CALLS: AtomicU64 = AtomicU64::new(0);
/// Resumed writes refused by the checks of a fresh command (pause, redirect,
/// replica, OOM).
pub static RESUMED_REFUSED: AtomicU64 = AtomicU64::new(0);
/// Retried writes recognised (MSGID, or the same summary again): answered
/// as the original, nothing stored.
pub static DUPLICATES: AtomicU64 = AtomicU64::new(0);
/// Summarizer leases granted by MEM.SUMMARIZE_BEGIN, and the calls told
/// `lease 0` because another worker's lease was live.
pub static LEASES_GRANTED: AtomicU64 = AtomicU64::new(0);
pub static LEASES_BUSY: AtomicU64 = AtomicU64::new(0);
/// Summaries refused because another worker's lease was live.
pub static SUMMARIES_REFUSED_LEASE: AtomicU64 = AtomicU64::new(0);

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

pub fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}
