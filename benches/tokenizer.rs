//! Token counting throughput: the module's counter (`redis-mem`: src/tokenizer/piece_count.rs
//! and src/tokenizer/pretokenize.rs, included below, exactly as `Encoding::count` runs them)
//! against bpe-openai's own count and tiktoken-rs, on a deterministic mixed corpus
//! (English prose, source code, Chinese), on real English prose read from files
//! every Debian machine has (`english-real`, see `english_real`), and on the exact
//! 600-byte English message of the server benchmark.
//!
//! Run with `cargo bench --bench tokenizer`. Besides a human-readable table it
//! prints one machine-readable line per measurement:
//!   BENCH_TOKENIZER {"encoding":..,"corpus":..,"counter":..,"msgs":..,"bytes":..,
//!                    "mb_per_s":..,"mb_per_s_min":..,"mb_per_s_median":..,"us_per_msg":..,"tokens":..}
//! and a final `BENCH_TOKENIZER_CHECK {...}` line with the number of messages
//! whose counts differ from tiktoken-rs (must be 0).
//!
//! tiktoken-rs is only fed ordinary text with short pre-tokenizer pieces (no
//! long runs of one character, Chinese broken by punctuation): its BPE is
//! quadratic per piece and can stall or panic on pathological input.
//!
//! Environment: BENCH_SECS (CPU seconds per measurement, default 0.6; best of 5
//! rounds); BENCH_PROFILE=N (only the module's o200k counter, N passes over
//! english-real, for `perf record`; with BENCH_PROFILE_COLD each pass on a new
//! thread, its piece cache empty; with BENCH_PIECE_STATS only the corpus's pieces
//! counted: how many, how many distinct, how many more than one token; with
//! BENCH_SPLIT_ONLY the pre-tokenizer alone, the floor of counting; with
//! BENCH_MERGE the merge of the first-seen pieces of 2-16 bytes that are more
//! than one token, alone, in ns a piece). BENCH_CORPUS=file: NUL-separated
//! messages instead of english-real (benches/corpus.py writes them).

// Tables of counters side by side: their tuple types read best in place.
#![allow(clippy::type_complexity)]

// The module's own counting code (the crate is a cdylib whose allocator is
// Redis's, so it cannot be linked here as a library).
#[path = "../src/tokenizer/openai_tables.rs"]
mod openai_tables;
#[allow(dead_code)] // prepare: the module warms its caches; the bench counts cold and warm itself
#[path = "../src/tokenizer/piece_count.rs"]
mod piece_count;
#[allow(dead_code)]
#[path = "../src/tokenizer/pretokenize.rs"]
mod pretokenize;
#[path = "../src/tokenizer/short_bpe.rs"]
mod short_bpe;
/// The module keeps its caches in a region of its own (src/module_memory.rs);
/// here the process's allocator is the only one.
mod module_memory {
    pub fn for_module<T>(f: impl FnOnce() -> T) -> T {
        f()
    }
}

use std::hint::black_box;
use std::time::{Duration, Instant};

/// The module's tables of o200k_base and cl100k_base (build.rs's counting
/// tables, read as the module reads them).
fn module_tables() -> (
    &'static bpe_openai::byte_pair_encoding::BytePairEncoding,
    &'static bpe_openai::byte_pair_encoding::BytePairEncoding,
) {
    use bpe_openai::byte_pair_encoding::BytePairEncoding;
    static TABLES: std::sync::OnceLock<(BytePairEncoding, BytePairEncoding)> =
        std::sync::OnceLock::new();
    let (o, c) = TABLES.get_or_init(|| {
        (
            openai_tables::read(openai_tables::O200K_BASE).expect("o200k_base's tables"),
            openai_tables::read(openai_tables::CL100K_BASE).expect("cl100k_base's tables"),
        )
    });
    (o, c)
}

/// The exact message of the server benchmark (benches/bench.py reads the same file).
const MESSAGE_600: &str = include_str!("message_600.txt");

/// The tests' seeded RNG (rand's StdRng), so every run counts the same corpus.
#[path = "../tests/it/support/rng.rs"]
mod rng;
use rng::Rng;

/// Message sizes in bytes (a chat mix: short turns, typical answers, long pastes).
const SIZES: [usize; 6] = [120, 300, 600, 600, 1500, 4000];

const WORDS: [&str; 64] = [
    "the",
    "model",
    "answer",
    "request",
    "because",
    "database",
    "connection",
    "timeout",
    "user",
    "server",
    "memory",
    "session",
    "should",
    "could",
    "would",
    "after",
    "before",
    "latency",
    "error",
    "message",
    "context",
    "summary",
    "tokens",
    "window",
    "cache",
    "please",
    "thanks",
    "deploy",
    "cluster",
    "replica",
    "config",
    "value",
    "result",
    "we",
    "they",
    "it",
    "is",
    "was",
    "will",
    "be",
    "not",
    "and",
    "or",
    "but",
    "with",
    "without",
    "into",
    "from",
    "about",
    "again",
    "quickly",
    "slowly",
    "carefully",
    "yesterday",
    "tomorrow",
    "Monday",
    "Redis",
    "Python",
    "Kubernetes",
    "OpenAI",
    "2024",
    "42",
    "3.14",
    "p99",
];

const PUNCT: [&str; 6] = [". ", ", ", "? ", "! ", "; ", ". "];

fn english(rng: &mut Rng, size: usize) -> String {
    let mut s = String::with_capacity(size + 32);
    let mut capital = true;
    while s.len() < size {
        let w = rng.pick(&WORDS);
        if capital {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
            capital = false;
        } else {
            s.push_str(w);
        }
        if rng.below(9) == 0 {
            let p = rng.pick(&PUNCT);
            s.push_str(p);
            capital = p != ", " && p != "; ";
        } else {
            s.push(' ');
        }
    }
    s
}

const IDENTS: [&str; 16] = [
    "session", "tokens", "total", "msg", "buf", "count", "limit", "user_id", "reply", "ctx", "key",
    "payload", "offset", "items", "result", "config",
];

fn code(rng: &mut Rng, size: usize) -> String {
    let mut s = String::with_capacity(size + 128);
    while s.len() < size {
        let a = rng.pick(&IDENTS);
        let b = rng.pick(&IDENTS);
        let n = rng.below(10_000);
        let line = match rng.below(6) {
            0 => format!("fn {a}_{n}(ctx: &Context, {b}: &[u8]) -> Result<usize, Error> {{\n"),
            1 => format!("    let {a} = {b}.iter().filter(|x| **x > {n}).count();\n"),
            2 => format!("    if {a}.len() >= {n} {{ return Err(Error::TooLarge({a}.len())); }}\n"),
            3 => format!(
                "def {a}_{n}({b}, limit={n}):\n    return [x for x in {b} if x % 7 == 0][:limit]\n"
            ),
            4 => format!("    // {a}: keep the newest {n} entries, drop the rest\n"),
            _ => format!(
                "    {a}[\"{b}\"] = json.loads(redis.get(f\"mem:{{{b}}}\") or \"{{}}\")\n}}\n"
            ),
        };
        s.push_str(&line);
    }
    s
}

const HANZI_PHRASES: [&str; 24] = [
    "我们",
    "在",
    "服务器",
    "里",
    "保存",
    "对话",
    "记忆",
    "用户",
    "模型",
    "回答",
    "问题",
    "数据库",
    "连接",
    "超时",
    "因为",
    "所以",
    "今天",
    "明天",
    "需要",
    "检查",
    "配置",
    "缓存",
    "摘要",
    "消息",
];
const HANZI_PUNCT: [&str; 4] = ["，", "。", "？", "！"];

fn chinese(rng: &mut Rng, size: usize) -> String {
    let mut s = String::with_capacity(size + 32);
    while s.len() < size {
        // Clauses of 3..8 phrases, then punctuation: short pre-tokenizer pieces.
        for _ in 0..3 + rng.below(6) {
            s.push_str(rng.pick(&HANZI_PHRASES));
        }
        s.push_str(rng.pick(&HANZI_PUNCT));
        if rng.below(6) == 0 {
            s.push_str(" Redis 7.0 ");
        }
    }
    s
}

/// Real English prose, when the machine has it: the Python language
/// reference (pydoc's topics), the licence texts every Debian system ships and
/// this repository's docs, cut at paragraph breaks into messages of the
/// `SIZES` mix. Unlike the generated corpus, its vocabulary is open, so the
/// piece cache misses as it would on users' text.
fn english_real() -> Vec<String> {
    let mut text = String::new();
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    for dir in ["/usr/lib"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            let mut py: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"))
                })
                .collect();
            py.sort();
            if let Some(p) = py.last() {
                files.push(p.join("pydoc_data/topics.py"));
            }
        }
    }
    for name in [
        "Apache-2.0",
        "Artistic",
        "BSD",
        "GFDL-1.3",
        "GPL-2",
        "GPL-3",
        "LGPL-2.1",
        "LGPL-3",
        "MPL-1.1",
        "MPL-2.0",
    ] {
        files.push(std::path::Path::new("/usr/share/common-licenses").join(name));
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    files.push(root.join("README.md"));
    // The README's reference moved to docs/ (issue 20): OPERATIONS, MODELS,
    // MIGRATION, TESTING and ARCHITECTURE keep that prose in the corpus.
    for doc in [
        "FORMAT.md",
        "RELIABILITY.md",
        "commands.md",
        "OPERATIONS.md",
        "MODELS.md",
        "MIGRATION.md",
        "TESTING.md",
        "ARCHITECTURE.md",
    ] {
        files.push(root.join("docs").join(doc));
    }
    for f in files {
        let Ok(body) = std::fs::read_to_string(&f) else {
            continue;
        };
        if f.extension().is_some_and(|e| e == "py") {
            // The string literals of pydoc's topics, unescaped enough for prose.
            for line in body.lines() {
                let (Some(a), Some(b)) = (line.find('\''), line.rfind('\'')) else {
                    continue;
                };
                if b > a + 1 {
                    text.push_str(
                        &line[a + 1..b]
                            .replace("\\n", "\n")
                            .replace("\\'", "'")
                            .replace("\\\\", "\\"),
                    );
                }
            }
        } else {
            text.push_str(&body);
        }
        text.push_str("\n\n");
    }
    let mut messages = Vec::new();
    let mut current = String::new();
    for para in text.split("\n\n") {
        current.push_str(para);
        current.push_str("\n\n");
        if current.len() >= SIZES[messages.len() % SIZES.len()] {
            messages.push(std::mem::take(&mut current));
        }
    }
    messages
}

struct Corpus {
    name: &'static str,
    messages: Vec<String>,
}

fn corpora() -> Vec<Corpus> {
    const PER_KIND: usize = 96; // 16 of each size: ~190 KB per kind
    let mut rng = Rng::seeded(0x9E37_79B9_7F4A_7C15);
    let mut make = |name: &'static str, f: fn(&mut Rng, usize) -> String| {
        let messages = (0..PER_KIND)
            .map(|i| f(&mut rng, SIZES[i % SIZES.len()]))
            .collect();
        Corpus { name, messages }
    };
    let en = make("english", english);
    let code = make("code", code);
    let zh = make("chinese", chinese);
    let mut mixed = Vec::new();
    for i in 0..PER_KIND {
        mixed.push(en.messages[i].clone());
        mixed.push(code.messages[i].clone());
        mixed.push(zh.messages[i].clone());
    }
    let real = english_real();
    let mut out = vec![
        Corpus {
            name: "msg600",
            messages: vec![MESSAGE_600.to_owned()],
        },
        en,
        code,
        zh,
        Corpus {
            name: "mixed",
            messages: mixed,
        },
    ];
    if !real.is_empty() {
        out.insert(
            2,
            Corpus {
                name: "english-real",
                messages: real,
            },
        );
    }
    out
}

struct Measure {
    msgs: u64,
    bytes: u64,
    tokens: u64,
    elapsed: Duration,
    /// MB/s of each round, ascending.
    rates: Vec<f64>,
}

/// CPU time of this thread: on a shared machine, wall time also counts the
/// time other processes held the core.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Counts the whole corpus repeatedly for `budget` split in five rounds (each
/// at least one pass), timed in thread CPU time; keeps the fastest round (the
/// machine may be shared) and the spread of the rounds' rates.
fn measure(messages: &[String], budget: Duration, count: &dyn Fn(&str) -> usize) -> Measure {
    // One untimed pass warms caches and lazily built tables.
    for m in messages {
        black_box(count(black_box(m)));
    }
    const ROUNDS: u32 = 5;
    let mut best: Option<Measure> = None;
    let mut rates = Vec::new();
    for _ in 0..ROUNDS {
        let mut m = Measure {
            msgs: 0,
            bytes: 0,
            tokens: 0,
            elapsed: Duration::ZERO,
            rates: Vec::new(),
        };
        let start = thread_cpu();
        loop {
            for text in messages {
                m.tokens += count(black_box(text)) as u64;
                m.msgs += 1;
                m.bytes += text.len() as u64;
            }
            m.elapsed = thread_cpu()
                .saturating_sub(start)
                .max(Duration::from_nanos(1));
            if m.elapsed >= budget / ROUNDS {
                break;
            }
        }
        let rate = |x: &Measure| x.bytes as f64 / x.elapsed.as_secs_f64();
        rates.push(rate(&m) / 1e6);
        if best.as_ref().is_none_or(|b| rate(&m) > rate(b)) {
            best = Some(m);
        }
    }
    rates.sort_by(f64::total_cmp);
    let mut best = best.expect("five rounds");
    best.rates = rates;
    best
}

/// The first pass over `messages` on a new thread: its piece cache starts
/// empty, as a server's does (the encoding's tables are built already).
fn measure_cold(messages: &[String], count: fn(&str) -> usize) -> (f64, u64) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = thread_cpu();
            let mut tokens = 0u64;
            let mut bytes = 0u64;
            for m in messages {
                tokens += count(black_box(m)) as u64;
                bytes += m.len() as u64;
            }
            let secs = thread_cpu().saturating_sub(start).as_secs_f64().max(1e-9);
            (bytes as f64 / secs / 1e6, tokens)
        })
        .join()
        .unwrap_or((0.0, 0))
    })
}

fn main() {
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v: &f64| *v > 0.0 && *v < 60.0)
        .unwrap_or(0.6);
    let budget = Duration::from_secs_f64(secs);
    let corpora = corpora();

    // BENCH_LONG_PIECES: texts at the inline caps that are one long piece
    // (a run of one or two punctuation characters, random punctuation,
    // letters): the module's count of each, best of 3, against bpe's
    // backtracking encoder's count of the same piece; the slowest of each.
    if std::env::var("BENCH_LONG_PIECES").is_ok() {
        long_pieces();
        return;
    }
    // BENCH_PROFILE=N: only the module's o200k counter, N passes over the
    // real English corpus (for perf record / whole-process timing).
    if std::env::var("BENCH_PROFILE").is_ok() {
        let real = corpora.iter().find(|c| c.name == "english-real").unwrap();
        // BENCH_CORPUS=file: NUL-separated messages instead (benches/corpus.py's).
        let file: Option<Vec<String>> = std::env::var("BENCH_CORPUS").ok().map(|f| {
            let raw = std::fs::read(f).unwrap_or_default();
            raw.split(|b| *b == 0)
                .map(|m| String::from_utf8_lossy(m).into_owned())
                .collect()
        });
        let messages: &[String] = file.as_deref().unwrap_or(&real.messages);
        let bpe = module_tables().0;
        if std::env::var("BENCH_PIECE_STATS").is_ok() {
            piece_stats(bpe, messages);
            return;
        }
        // BENCH_MERGE: the merge of first-seen pieces of 2-16 bytes that
        // are more than one token, alone (short_bpe.rs).
        if std::env::var("BENCH_MERGE").is_ok() {
            let short = short_bpe::ShortRanks::build(bpe).expect("o200k_base's short tables");
            let mut seen = std::collections::HashSet::new();
            let mut pieces: Vec<Vec<u8>> = Vec::new();
            for m in messages {
                pretokenize::for_each_piece(Pattern::O200k, m, |p| {
                    if (2..=16).contains(&p.len()) && seen.insert(p.to_vec()) {
                        pieces.push(p.to_vec());
                    }
                });
            }
            let multi: Vec<&Vec<u8>> = pieces
                .iter()
                .filter(|p| short.count(p) != Some(1))
                .collect();
            for round in 0..4 {
                let t = Instant::now();
                let mut n = 0;
                for p in &multi {
                    n += short.count(p).unwrap_or(0);
                }
                black_box(n);
                println!(
                    "round {round}: {} multi-token pieces {:.0} ns each",
                    multi.len(),
                    t.elapsed().as_nanos() as f64 / multi.len() as f64
                );
            }
            return;
        }
        // BENCH_SPLIT_ONLY: the pre-tokenizer alone (the floor of counting).
        if std::env::var("BENCH_SPLIT_ONLY").is_ok() {
            let bytes: usize = messages.iter().map(String::len).sum();
            for _ in 0..5 {
                let t = Instant::now();
                let mut n = 0usize;
                for m in messages {
                    pretokenize::for_each_piece(Pattern::O200k, m, |p| n += p.len() ^ 1);
                }
                black_box(n);
                println!(
                    "split {:.1} MB/s",
                    bytes as f64 / t.elapsed().as_secs_f64() / 1e6
                );
            }
            return;
        }
        let t = Instant::now();
        let mut n = 0usize;
        let mut bytes = 0usize;
        let passes: usize = std::env::var("BENCH_PROFILE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40);
        let cold = std::env::var("BENCH_PROFILE_COLD").is_ok(); // each pass on a new thread
        for _ in 0..passes {
            let pass = || {
                let mut n = 0usize;
                for m in messages {
                    n += piece_count::count(bpe, Pattern::O200k, 0, m);
                }
                n
            };
            n += if cold {
                std::thread::scope(|s| s.spawn(pass).join().unwrap_or(0))
            } else {
                pass()
            };
            bytes += messages.iter().map(String::len).sum::<usize>();
        }
        println!(
            "{n} tokens {:.1} MB/s",
            bytes as f64 / t.elapsed().as_secs_f64() / 1e6
        );
        return;
    }
    // Table construction (first use) of each counter.
    let t = Instant::now();
    let bpe_o200k = bpe_openai::o200k_base();
    black_box(bpe_o200k.count("warm up"));
    let init_bpe_o200k = t.elapsed();
    let t = Instant::now();
    let tik_o200k = tiktoken_rs::o200k_base().expect("tiktoken o200k_base");
    let init_tik_o200k = t.elapsed();
    let t = Instant::now();
    let bpe_cl100k = bpe_openai::cl100k_base();
    black_box(bpe_cl100k.count("warm up"));
    let init_bpe_cl100k = t.elapsed();
    let t = Instant::now();
    let tik_cl100k = tiktoken_rs::cl100k_base().expect("tiktoken cl100k_base");
    let init_tik_cl100k = t.elapsed();
    // What the module builds on top of bpe-openai: the class table of the
    // hand-written split (once) and each encoding's token set.
    let t = Instant::now();
    pretokenize::warm_up();
    let init_classes = t.elapsed();
    let t = Instant::now();
    let (mem_o200k, mem_cl100k) = module_tables();
    black_box(piece_count::count(
        mem_o200k,
        pretokenize::Pattern::O200k,
        0,
        "warm up",
    ));
    let init_mem_o200k = t.elapsed();
    let t = Instant::now();
    black_box(piece_count::count(
        mem_cl100k,
        pretokenize::Pattern::Cl100k,
        1,
        "warm up",
    ));
    let init_mem_cl100k = t.elapsed();
    for (enc, counter, d) in [
        ("all", "redis-mem class table", init_classes),
        ("o200k_base", "redis-mem token set + cache", init_mem_o200k),
        (
            "cl100k_base",
            "redis-mem token set + cache",
            init_mem_cl100k,
        ),
        ("o200k_base", "bpe-openai", init_bpe_o200k),
        ("o200k_base", "tiktoken-rs", init_tik_o200k),
        ("cl100k_base", "bpe-openai", init_bpe_cl100k),
        ("cl100k_base", "tiktoken-rs", init_tik_cl100k),
    ] {
        println!(
            "BENCH_TOKENIZER_INIT {{\"encoding\":\"{enc}\",\"counter\":\"{counter}\",\"ms\":{:.1}}}",
            d.as_secs_f64() * 1e3
        );
    }

    // Both counters must agree on every message of the corpus.
    let mut checked = 0u64;
    let mut mismatches = 0u64;
    for c in &corpora {
        for m in &c.messages {
            checked += 2;
            if bpe_o200k.count(m.as_str()) != tik_o200k.encode_ordinary(m).len() {
                mismatches += 1;
            }
            if bpe_cl100k.count(m.as_str()) != tik_cl100k.encode_ordinary(m).len() {
                mismatches += 1;
            }
        }
    }

    println!(
        "{:<12} {:<12} {:<24} {:>6} {:>9} {:>10} {:>11}",
        "encoding", "corpus", "counter", "msgs", "KB", "MB/s", "us/msg"
    );
    let bpe_o = |t: &str| bpe_o200k.count(t);
    let tik_o = |t: &str| tik_o200k.encode_ordinary(t).len();
    let bpe_c = |t: &str| bpe_cl100k.count(t);
    let tik_c = |t: &str| tik_cl100k.encode_ordinary(t).len();
    // The module counts `role` and `content` of each message: msg600 includes
    // the role ("user"), exactly what MEM.APPEND does for the server benchmark.
    let bpe_o_msg = |t: &str| bpe_o200k.count("user") + bpe_o200k.count(t);
    let tik_o_msg =
        |t: &str| tik_o200k.encode_ordinary("user").len() + tik_o200k.encode_ordinary(t).len();
    // The module's counter (piece_count::count on the module's tables, as
    // Encoding::count calls it).
    use pretokenize::Pattern;
    let mem_o = |t: &str| piece_count::count(mem_o200k, Pattern::O200k, 0, t);
    let mem_c = |t: &str| piece_count::count(mem_cl100k, Pattern::Cl100k, 1, t);
    let mem_o_msg = |t: &str| mem_o("user") + mem_o(t);
    for c in &corpora {
        for m in &c.messages {
            checked += 2;
            mismatches += u64::from(mem_o(m) != tik_o200k.encode_ordinary(m).len());
            mismatches += u64::from(mem_c(m) != tik_cl100k.encode_ordinary(m).len());
        }
    }
    let counters: [(&str, &str, &dyn Fn(&str) -> usize, &dyn Fn(&str) -> usize); 6] = [
        ("o200k_base", "redis-mem", &mem_o, &mem_o_msg),
        ("cl100k_base", "redis-mem", &mem_c, &mem_c),
        ("o200k_base", "bpe-openai", &bpe_o, &bpe_o_msg),
        ("o200k_base", "tiktoken-rs", &tik_o, &tik_o_msg),
        ("cl100k_base", "bpe-openai", &bpe_c, &bpe_c),
        ("cl100k_base", "tiktoken-rs", &tik_c, &tik_c),
    ];
    for (enc, counter, f, f_msg) in counters {
        for c in &corpora {
            if enc == "cl100k_base" && c.name != "mixed" && c.name != "english-real" {
                continue; // cl100k: the mixed and real corpora only, to keep the run short
            }
            let f = if c.name == "msg600" { f_msg } else { f };
            let m = measure(&c.messages, budget, f);
            let s = m.elapsed.as_secs_f64();
            let mb_s = m.bytes as f64 / s / 1e6;
            let us_msg = s * 1e6 / m.msgs as f64;
            let kb = c.messages.iter().map(String::len).sum::<usize>() as f64 / 1024.0;
            println!(
                "{enc:<12} {:<12} {counter:<24} {:>6} {kb:>9.1} {mb_s:>10.2} {us_msg:>11.2}",
                c.name,
                c.messages.len()
            );
            println!(
                "BENCH_TOKENIZER {{\"encoding\":\"{enc}\",\"corpus\":\"{}\",\"counter\":\"{counter}\",\"msgs\":{},\"bytes\":{},\"tokens\":{},\"secs\":{s:.4},\"mb_per_s\":{mb_s:.3},\"mb_per_s_min\":{:.3},\"mb_per_s_median\":{:.3},\"us_per_msg\":{us_msg:.3}}}",
                c.name, m.msgs, m.bytes, m.tokens,
                m.rates.first().copied().unwrap_or(0.0),
                m.rates.get(m.rates.len() / 2).copied().unwrap_or(0.0)
            );
        }
    }

    // Cold: one pass on a new thread, the piece cache empty (what a server
    // sees on text it has not counted before). The module's counter only.
    let cold: [(&str, fn(&str) -> usize); 2] = [
        ("o200k_base", |t| {
            piece_count::count(module_tables().0, Pattern::O200k, 0, t)
        }),
        ("cl100k_base", |t| {
            piece_count::count(module_tables().1, Pattern::Cl100k, 1, t)
        }),
    ];
    for (enc, f) in cold {
        for c in corpora
            .iter()
            .filter(|c| matches!(c.name, "english-real" | "mixed"))
        {
            // Best of three new threads (each starts empty).
            let (mb_s, tokens) = (0..3)
                .map(|_| measure_cold(&c.messages, f))
                .fold((0.0f64, 0u64), |a, b| if b.0 > a.0 { b } else { a });
            let bytes: usize = c.messages.iter().map(String::len).sum();
            println!(
                "{enc:<12} {:<12} {:<24} {:>6} {:>9.1} {mb_s:>10.2}",
                c.name,
                "redis-mem(cold)",
                c.messages.len(),
                bytes as f64 / 1024.0
            );
            println!(
                "BENCH_TOKENIZER {{\"encoding\":\"{enc}\",\"corpus\":\"{}\",\"counter\":\"redis-mem(cold)\",\"msgs\":{},\"bytes\":{bytes},\"tokens\":{tokens},\"mb_per_s\":{mb_s:.3},\"us_per_msg\":{:.3}}}",
                c.name, c.messages.len(), bytes as f64 / mb_s / c.messages.len() as f64
            );
        }
    }

    // Where bpe-openai's time goes (o200k_base), for whoever optimizes the
    // module: the pre-tokenizer regex alone, and a what-if memo of piece counts
    // (exact: a text's count is the sum of its pieces' counts). Not what the
    // module does today.
    let split_only = |t: &str| bpe_o200k.split(t).count();
    let pretokenize_only = |t: &str| {
        let mut n = 0;
        pretokenize::for_each_piece(Pattern::O200k, t, |_| n += 1);
        n
    };
    let memo = std::cell::RefCell::new(std::collections::HashMap::<Box<str>, u32>::new());
    let memo_count = |t: &str| -> usize {
        let mut memo = memo.borrow_mut();
        let mut n = 0usize;
        for piece in bpe_o200k.split(t) {
            if piece.len() > 32 {
                n += bpe_o200k.bpe.count(piece.as_bytes());
            } else if let Some(&c) = memo.get(piece) {
                n += c as usize;
            } else {
                let c = bpe_o200k.bpe.count(piece.as_bytes());
                if memo.len() < 65_536 {
                    memo.insert(piece.into(), c as u32);
                }
                n += c;
            }
        }
        n
    };
    for c in &corpora {
        for m in &c.messages {
            checked += 1;
            if memo_count(m) != bpe_o200k.count(m.as_str()) {
                mismatches += 1;
            }
        }
    }
    for (counter, f) in [
        ("regex-split-only", &split_only as &dyn Fn(&str) -> usize),
        ("pretokenize-only", &pretokenize_only),
        (
            "bpe-openai+piece-memo(what-if)",
            &memo_count as &dyn Fn(&str) -> usize,
        ),
    ] {
        for c in corpora
            .iter()
            .filter(|c| matches!(c.name, "msg600" | "mixed" | "english-real"))
        {
            let m = measure(&c.messages, budget, f);
            let s = m.elapsed.as_secs_f64();
            let mb_s = m.bytes as f64 / s / 1e6;
            let us_msg = s * 1e6 / m.msgs as f64;
            println!(
                "BENCH_TOKENIZER {{\"encoding\":\"o200k_base\",\"corpus\":\"{}\",\"counter\":\"{counter}\",\"msgs\":{},\"bytes\":{},\"tokens\":{},\"secs\":{s:.4},\"mb_per_s\":{mb_s:.3},\"us_per_msg\":{us_msg:.3}}}",
                c.name, m.msgs, m.bytes, m.tokens
            );
        }
    }
    println!("BENCH_TOKENIZER_CHECK {{\"checked\":{checked},\"mismatches\":{mismatches}}}");
}

/// BENCH_PIECE_STATS: what the piece cache faces on a corpus (the pieces
/// the o200k split cuts, the distinct ones, those that need BPE).
fn piece_stats(
    bpe: &'static bpe_openai::byte_pair_encoding::BytePairEncoding,
    messages: &[String],
) {
    use pretokenize::Pattern;
    let mut seen: std::collections::HashMap<Vec<u8>, (usize, usize)> = Default::default();
    let mut total = 0usize;
    for m in messages {
        pretokenize::for_each_piece(Pattern::O200k, m, |p| {
            total += 1;
            seen.entry(p.to_vec()).or_insert((0, bpe.count(p))).0 += 1;
        });
    }
    let once = seen.values().filter(|(n, _)| *n == 1).count();
    let multi: Vec<_> = seen.iter().filter(|(_, (_, c))| *c > 1).collect();
    let multi_occurrences: usize = multi.iter().map(|(_, (n, _))| n).sum();
    let multi_once = multi.iter().filter(|(_, (n, _))| *n == 1).count();
    let multi_bytes: usize = multi.iter().map(|(p, _)| p.len()).sum();
    println!(
        "pieces {total}, distinct {} ({once} seen once); more than one token: {} distinct \
         ({multi_once} seen once, {:.1} bytes on average), {multi_occurrences} occurrences",
        seen.len(),
        multi.len(),
        multi_bytes as f64 / multi.len().max(1) as f64
    );
}

/// BENCH_LONG_PIECES (see main).
fn long_pieces() {
    use pretokenize::Pattern;
    let (o200k, cl100k) = module_tables();
    let punct: Vec<u8> = (33u8..127).filter(|b| !b.is_ascii_alphanumeric()).collect();
    for (name, bpe, pattern, slot, n) in [
        ("o200k_base", o200k, Pattern::O200k, 0, 16_383usize),
        ("cl100k_base", cl100k, Pattern::Cl100k, 1, 32_767),
    ] {
        let mut shapes: Vec<(String, Vec<u8>)> = Vec::new();
        for &a in &punct {
            shapes.push(((a as char).to_string(), vec![a; n]));
            for &b in &punct {
                if a < b {
                    let two = [a, b].iter().cycle().take(n).copied().collect();
                    shapes.push((format!("{}{}", a as char, b as char), two));
                }
            }
        }
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut random = |alphabet: &[u8]| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    alphabet[(x % alphabet.len() as u64) as usize]
                })
                .collect()
        };
        shapes.push(("random punctuation".into(), random(&punct)));
        shapes.push(("random a-z".into(), random(b"abcdefghijklmnopqrstuvwxyz")));
        let best_ms = |f: &dyn Fn() -> usize| {
            (0..3)
                .map(|_| {
                    let t = Instant::now();
                    black_box(f());
                    t.elapsed().as_secs_f64() * 1e3
                })
                .fold(f64::MAX, f64::min)
        };
        let (mut module, mut backtracking) = ((0.0, String::new()), (0.0, String::new()));
        for (shape, bytes) in &shapes {
            let text = std::str::from_utf8(bytes).unwrap();
            let ours = best_ms(&|| piece_count::count(bpe, pattern, slot, text));
            let theirs = best_ms(&|| bpe.count(bytes));
            assert_eq!(
                piece_count::count(bpe, pattern, slot, text),
                bpe.count(bytes),
                "{shape}"
            );
            if ours > module.0 {
                module = (ours, shape.clone());
            }
            if theirs > backtracking.0 {
                backtracking = (theirs, shape.clone());
            }
        }
        println!(
            "BENCH_LONG_PIECES {{\"encoding\":\"{name}\",\"bytes\":{n},\"shapes\":{},\"module_worst_ms\":{:.2},\"module_worst_shape\":{:?},\"backtracking_worst_ms\":{:.2},\"backtracking_worst_shape\":{:?}}}",
            shapes.len(),
            module.0,
            module.1,
            backtracking.0,
            backtracking.1
        );
    }
}
