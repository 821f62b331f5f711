//! The `INFO mem` section.

use std::os::raw::c_int;

use redis_module::{raw, Context};

use crate::data_type::LIVE_SESSIONS;
use crate::stats::{self, read};
use crate::tokenizer::{self, Encoding};

pub fn register(ctx: &Context) {
    // Replaces the crate's default handler, which knows nothing of ours.
    raw::register_info_function(ctx.ctx, Some(info_func));
}

extern "C" fn info_func(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    crate::guard::or((), || {
        raw::add_info_section(ctx, None);
        for (name, value) in counters() {
            raw::add_info_field_unsigned_long_long(ctx, name, value);
        }
        let names: Vec<&str> = Encoding::ALL.iter().map(|e| e.name()).collect();
        raw::add_info_field_str(ctx, "encodings", &names.join(","));
        let loaded: Vec<&str> = Encoding::ALL
            .iter()
            .filter(|e| tokenizer::is_loaded(**e))
            .map(|e| e.name())
            .collect();
        raw::add_info_field_str(ctx, "encodings_loaded", &loaded.join(","));
        // One line per encoding, as Redis's keyspace lines: state, the bytes
        // its tables hold, how long the build took.
        for e in Encoding::ALL {
            let (bytes, usec) = tokenizer::footprint(e);
            let line = format!(
                "state={},memory_bytes={bytes},load_usec={usec}",
                tokenizer::state(e).name()
            );
            raw::add_info_field_str(ctx, &format!("encoding_{}", e.name()), &line);
        }
        // Hash of the sources this module was built from (build.rs).
        raw::add_info_field_str(ctx, "build", env!("REDIS_MEM_SOURCE_HASH"));
    })
}

/// The section's numeric fields, in the order INFO lists them (a data
/// table: one line a field).
fn counters() -> [(&'static str, u64); 26] {
    let sessions = LIVE_SESSIONS.load(std::sync::atomic::Ordering::Relaxed);
    let (threads, queued) = crate::offload::pool::gauges();
    let in_flight = crate::offload::IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed);
    // Encodings are built on first use: their totals are those loaded.
    let (memory, load_usec) = Encoding::ALL
        .iter()
        .map(|&e| tokenizer::footprint(e))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    [
        ("sessions", sessions.max(0) as u64),
        ("appends", read(&stats::APPENDS)),
        ("tokens_counted", read(&stats::TOKENS_COUNTED)),
        ("messages_trimmed", read(&stats::MESSAGES_TRIMMED)),
        ("threshold_events", read(&stats::THRESHOLD_EVENTS)),
        ("summaries_applied", read(&stats::SUMMARIES_APPLIED)),
        ("summaries_rejected_stale", read(&stats::SUMMARIES_REJECTED)),
        ("imports", read(&stats::IMPORTS)),
        ("extsets", read(&stats::EXT_SETS)),
        ("attrsets", read(&stats::ATTR_SETS)),
        ("attrdels", read(&stats::ATTR_DELS)),
        ("tokenizer_calls", read(&stats::TOKENIZER_CALLS)),
        ("tokenizer_usec", read(&stats::TOKENIZER_MICROS)),
        ("count_threads", threads),
        ("count_queue", queued),
        ("counts_off_thread", read(&crate::offload::pool::JOBS_DONE)),
        ("counts_in_flight", in_flight as u64),
        ("resumed_refused", read(&stats::RESUMED_REFUSED)),
        ("encodings_load_usec", load_usec),
        ("encodings_memory_bytes", memory),
        ("duplicates", read(&stats::DUPLICATES)),
        ("leases_granted", read(&stats::LEASES_GRANTED)),
        ("leases_busy", read(&stats::LEASES_BUSY)),
        (
            "summaries_refused_lease",
            read(&stats::SUMMARIES_REFUSED_LEASE),
        ),
        // The module's own memory (encoding tables, piece caches), kept
        // out of used_memory and so of maxmemory (module_memory.rs).
        ("module_memory_bytes", crate::module_memory::in_use()),
        (
            "module_memory_region",
            u64::from(crate::module_memory::has_region()),
        ),
    ]
}
