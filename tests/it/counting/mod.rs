//! Token counts: against tiktoken-rs, and counted on a worker (the large-content path).

mod async_count;
mod tokens;
