//! Limits: values bounded so they round-trip, maxmemory and MEMORY USAGE, sessions at their caps.

mod memory;
mod scale;
mod values;
