//! Persistence: AOF, RDB, DUMP/RESTORE (crafted and corrupt payloads), the fixtures of earlier releases.

mod aof_replay;
mod durability;
mod fixtures;
mod restore_corrupt;
mod restore_crafted;
