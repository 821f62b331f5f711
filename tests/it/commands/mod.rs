//! The MEM.* commands one by one (append, batch, import, get, summarize, config), COPY and WATCH.

mod append;
mod batch;
mod config;
mod copy;
mod import_get;
mod import_large;
mod json_roundtrip;
mod summarize;
mod summarize_headroom;
mod watch;
