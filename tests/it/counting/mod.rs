//! Token counts: against tiktoken-rs, counted on a worker (the large-content path), and the tool calls a META carries.

mod async_count;
mod tokens;
mod tool_calls;
