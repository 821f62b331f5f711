//! Stress: concurrent writers, the fuzzer, main-thread holds on sessions of tens of MB.

mod concurrent_writers;
mod fuzz;
mod holds;
