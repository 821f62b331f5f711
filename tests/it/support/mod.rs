//! Helpers of the tests, named by what they hold.

pub mod cluster;
pub mod faults;
pub mod fixtures;
pub mod reply;
pub mod report;
pub mod server;
pub mod session;
