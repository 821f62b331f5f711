//! Models and their encodings: every family, the model table, first use of an encoding, model switches.

mod encodings;
mod first_use;
mod recount_shared_buffer;
mod switch;
mod table_changes;
mod table_config;
