//! Work off the main thread: the worker pool, lazy free, large inputs never counted inline, resumed appends.

mod lazyfree;
mod no_stall;
mod pool;
mod resume;
