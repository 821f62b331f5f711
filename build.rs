//! Stamps the module with a hash of the sources it is built from
//! (`INFO mem` field `build`), so the integration tests, compiled from the
//! same sources, can refuse to run against a stale `target/release` module;
//! and compiles the open-weight encodings' pre-tokenizer DFAs
//! (src/tokenizer/split_patterns.rs) into tables the module carries, and
//! OpenAI's encodings as counting reads them (src/tokenizer/counting_tables.rs).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

#[path = "src/tokenizer/split_patterns.rs"]
mod split_patterns;

#[path = "src/tokenizer/counting_tables.rs"]
mod counting_tables;

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

/// Writes each distinct stage's forward (dense) and reverse (sparse) DFA to
/// OUT_DIR, named by a hash of split_patterns.rs and the stage's sources, so
/// a rebuild after an edit elsewhere in src/ reuses them (compiling them all
/// takes ~10 s), and `split_tables.rs`, the table split.rs includes.
fn split_tables(out: &Path) {
    let definitions = include_str!("src/tokenizer/split_patterns.rs");
    let mut seen: Vec<Vec<&str>> = Vec::new();
    let mut table = String::from("pub static SHIPPED: &[Tables] = &[\n");
    for stage in split_patterns::ALL.iter().flat_map(|stages| stages.iter()) {
        let sources = split_patterns::sources(stage);
        if seen.contains(&sources) {
            continue;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (definitions, &sources).hash(&mut h);
        let name = format!("split_{:016x}", h.finish());
        let forward = out.join(format!("{name}.fwd"));
        let reverse = out.join(format!("{name}.rev"));
        if !forward.exists() || !reverse.exists() {
            let (bytes, pad) = split_patterns::forward(&sources)
                .expect("a pattern of split_patterns.rs compiles")
                .to_bytes_native_endian();
            write(&forward, &bytes[pad..]);
            let bytes = split_patterns::reverse(&sources)
                .expect("a pattern of split_patterns.rs compiles")
                .to_bytes_native_endian();
            write(&reverse, &bytes);
        }
        table.push_str(&format!(
            "    Tables {{ sources: &{sources:?}, forward: &Aligned(*include_bytes!({forward:?})), \
             reverse: include_bytes!({reverse:?}) }},\n"
        ));
        seen.push(sources);
    }
    table.push_str("];\n");
    write(&out.join("split_tables.rs"), table.as_bytes());
    // Tables of earlier versions of the patterns go.
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let current = table.contains(&format!("{name}."));
        if name.starts_with("split_") && name != "split_tables" && !current {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Writes `o200k_base.counting` and `cl100k_base.counting` to OUT_DIR (kept
/// while Cargo.lock and counting_tables.rs are unchanged: reading
/// bpe-openai's tables takes a second).
fn openai_counting_tables(out: &Path) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        include_str!("src/tokenizer/counting_tables.rs"),
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock")).unwrap_or_default(),
    )
        .hash(&mut h);
    let stamp = out.join("counting.stamp");
    let key = format!("{:016x}", h.finish());
    type Tokenizer = fn() -> &'static bpe_openai::Tokenizer;
    let tables: [(&str, Tokenizer); 2] = [
        ("o200k_base", bpe_openai::o200k_base),
        ("cl100k_base", bpe_openai::cl100k_base),
    ];
    let current = std::fs::read_to_string(&stamp).is_ok_and(|s| s == key)
        && tables
            .iter()
            .all(|(name, _)| out.join(format!("{name}.counting")).exists());
    if current {
        return;
    }
    for (name, tokenizer) in tables {
        let bytes = counting_tables::counting_only(&tokenizer().bpe, false)
            .expect("bpe-openai's tables transcode to counting's");
        write(&out.join(format!("{name}.counting")), &bytes);
    }
    write(&stamp, key.as_bytes());
}

/// Written whole or not at all (a build stopped midway leaves no table).
fn write(path: &Path, bytes: &[u8]) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).expect("OUT_DIR is writable");
    std::fs::rename(&partial, path).expect("OUT_DIR is writable");
}

fn main() {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    split_tables(Path::new(&out));
    openai_counting_tables(Path::new(&out));
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
