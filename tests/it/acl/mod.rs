//! ACL: the `mem` category, key patterns on every command, and ACL changes while a large append is counted.

mod category;
mod key_patterns;
mod resumed_append;
