//! Replication: replicas identical to their master after every kind of write.

mod every_feature;
mod identical;
mod write_paths;
