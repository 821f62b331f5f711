//! Stamps the module with a hash of the sources it is built from
//! (`INFO mem` field `build`), so the integration tests, compiled from the
//! same sources, can refuse to run against a stale `target/release` module.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut paths = vec![
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
        root.join("build.rs"),
    ];
    files(&root.join("src"), &mut paths);
    paths.sort();
    // DefaultHasher::new() has fixed keys: the same sources give the same hash.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in &paths {
        p.strip_prefix(root).unwrap_or(p).hash(&mut h);
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    println!("cargo:rustc-env=REDIS_MEM_SOURCE_HASH={:016x}", h.finish());
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=build.rs");
}
