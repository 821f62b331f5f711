//! Helpers of the tests, named by what they hold.

pub mod cluster;
pub mod faults;
pub mod fixtures;
/// The module's own LEB128 (the crate is a cdylib: not linkable here).
#[allow(dead_code)]
#[path = "../../../src/leb128.rs"]
pub mod leb128;
pub mod reply;
pub mod report;
pub mod rng;
pub mod server;
pub mod session;
