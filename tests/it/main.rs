//! The integration tests, in one binary: real redis-server processes with
//! the module (target/release/libredis_mem.so, or REDIS_MEM_MODULE) loaded,
//! one module per feature. `cargo test --release --test it` runs them all;
//! a filter picks a feature or a test, e.g.
//! `cargo test --release --test it -- commands::append` or `-- --exact smoke::module_loads_and_appends`.
//! Helpers are in support/.

mod support;

mod acl;
mod attrs;
mod cluster;
mod commands;
mod counting;
mod faults;
mod integrity;
mod internal;
mod leases;
mod limits;
mod maxage;
mod models;
mod msgid;
mod observability;
mod offload;
mod persistence;
mod replication;
mod smoke;
mod stress;
