//! Token counts of MEM.APPEND (and MEM.SUMMARIZE) against tiktoken-rs on a
//! varied corpus generated here deterministically, under both encodings; and
//! 4 MB inputs of pathological shapes, which must neither fail nor crash.

use crate::support::rng::Rng;
use crate::support::server::*;

use std::fmt::Write as _;

// ---------------------------------------------------------------- corpus

const WORDS: &[&str] = &[
    "the",
    "memory",
    "session",
    "token",
    "Redis",
    "module",
    "assistant",
    "conversation",
    "summary",
    "window",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "antidisestablishmentarianism",
    "don't",
    "it's",
    "they'll",
    "we've",
    "I'M",
    "YOU'RE",
    "she'd",
    "HTTP",
    "camelCaseWord",
    "snake_case_word",
    "kebab-case",
    "naïve",
    "café",
    "über",
    "façade",
    "coöperate",
    "résumé",
    "Zürich",
    "São",
    "Paulo",
    "Ελλάδα",
    "Москва",
    "x",
    "a",
    "I",
    "OK",
    "GPT-4o",
    "o200k_base",
    "cl100k_base",
    "2024",
    "3.14159",
    "1e-9",
    "v1.2.3",
];

const SENTENCES: &[&str] = &[
    "我们在 Redis 里保存对话记忆，每个会话一个键。",
    "大型语言模型的上下文窗口是有限的，所以需要摘要。",
    "今日はいい天気ですね。明日は雨が降るかもしれません。",
    "トークン数を正確に数えることが大切です。カタカナとひらがなと漢字。",
    "안녕하세요, 반갑습니다. 오늘 회의는 세 시에 시작합니다.",
    "مرحبا بالعالم، هذه رسالة اختبار باللغة العربية.",
    "नमस्ते दुनिया, यह एक परीक्षण संदेश है।",
    "Привет, мир! Это тестовое сообщение на русском языке.",
    "Γειά σου Κόσμε! Αυτό είναι ένα δοκιμαστικό μήνυμα.",
    "สวัสดีชาวโลก นี่คือข้อความทดสอบ",
    "שלום עולם, זו הודעת בדיקה.",
    "Tiếng Việt có dấu: Xin chào thế giới.",
    "Ünïcödé wïth dïäcrïtïcs ånd lïgätürës: ﬁ ﬂ Æ œ ß.",
    "e\u{301}e\u{301} combining acute, a\u{308} combining diaeresis, \u{200d}zwj\u{200b}zwsp\u{feff}bom",
    "Math: ∀x∈ℝ, ∃y: x² + y² ≥ 0; ∑ᵢ aᵢ ≈ ∫ f(x) dx ≠ ∞ ± ε.",
    "Box drawing ┌──┬──┐ │░▒▓│ └──┴──┘ and arrows ← ↑ → ↓ ⇒ ⇔.",
    "Control chars \u{1}\u{2}\u{7f} and a NUL \0 inside.",
    "<|endoftext|> <|im_start|>user<|im_end|> <|fim_prefix|> look like special tokens but are text.",
];

const EMOJI: &[&str] = &[
    "😀",
    "🎉",
    "🚀",
    "👍🏽",
    "👩‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇫🇷",
    "🇯🇵",
    "❤️",
    "1️⃣",
    "🤖",
    "🧑🏿‍💻",
    "🐍",
    "☕",
    "✅",
    "⚠️",
];

const CODE: &[&str] = &[
    "fn main() {\n    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "def fib(n):\n\tif n < 2:\n\t\treturn n\n\treturn fib(n - 1) + fib(n - 2)\n\nprint([fib(i) for i in range(20)])",
    "const add = (a, b) => a + b;\nexport default async function handler(req, res) {\n  res.status(200).json({ ok: true });\n}",
    "SELECT id, role, content FROM messages WHERE session_id = $1 AND id > $2 ORDER BY id DESC LIMIT 10;",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.log; do gzip -9 \"$f\" && echo \"done: $f\"; done 2>&1 | tee out.txt",
    "<html><head><title>Test &amp; more</title></head><body><p class=\"x\">Hello</p></body></html>",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
    "    indented    code    with    wide    gaps\t\tand\ttabs   \n        nested();\n",
];

fn english(rng: &mut Rng) -> String {
    let n = 3 + rng.below(30);
    let mut s = String::new();
    for i in 0..n {
        let w = rng.pick(WORDS);
        let w = match rng.below(10) {
            0 => w.to_uppercase(),
            1 => {
                let mut c = w.chars();
                c.next().map_or(String::new(), |f| {
                    f.to_uppercase().collect::<String>() + c.as_str()
                })
            }
            _ => w.to_owned(),
        };
        if i > 0 {
            s.push_str(rng.pick(&[" ", " ", " ", ", ", "; ", " - ", "  ", " (", ") "]));
        }
        s.push_str(&w);
    }
    s.push_str(rng.pick(&[".", "!", "?", "...", "", "\n", ":"]));
    s
}

fn json_text(rng: &mut Rng, depth: usize) -> serde_json::Value {
    use serde_json::Value;
    match if depth > 2 {
        rng.below(4)
    } else {
        rng.below(6)
    } {
        0 => Value::from(rng.next() as i64 % 1_000_000),
        1 => Value::from(english(rng)),
        2 => Value::Bool(rng.chance(50)),
        3 => Value::from((rng.next() % 10_000) as f64 / 7.0),
        4 => Value::Array(
            (0..rng.below(4))
                .map(|_| json_text(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let mut m = serde_json::Map::new();
            for i in 0..1 + rng.below(4) {
                m.insert(
                    format!("key_{i}_{}", rng.pick(WORDS)),
                    json_text(rng, depth + 1),
                );
            }
            Value::Object(m)
        }
    }
}

fn whitespace(rng: &mut Rng) -> String {
    let parts = [
        " ", "  ", "\t", "\n", "\r\n", "\n\n", "\u{a0}", "\u{3000}", "\u{2003}", " \n ", "\x0b",
        "\x0c",
    ];
    let n = 1 + rng.below(40);
    let mut s = String::new();
    for _ in 0..n {
        s.push_str(rng.pick(&parts));
        if rng.chance(30) {
            s.push_str(rng.pick(WORDS));
        }
    }
    s
}

fn numbers(rng: &mut Rng) -> String {
    let mut s = String::new();
    for _ in 0..1 + rng.below(6) {
        match rng.below(7) {
            0 => {
                let len = 1 + rng.below(40);
                for _ in 0..len {
                    s.push(char::from(b'0' + rng.below(10) as u8));
                }
            }
            1 => write!(s, "{}.{:03}", rng.next() % 100_000, rng.next() % 1000).unwrap(),
            2 => write!(s, "-{}", rng.next() % 1_000_000_007).unwrap(),
            3 => write!(
                s,
                "{},{:03},{:03}",
                rng.next() % 1000,
                rng.next() % 1000,
                rng.next() % 1000
            )
            .unwrap(),
            4 => write!(
                s,
                "+1 (555) {:03}-{:04}",
                rng.next() % 1000,
                rng.next() % 10_000
            )
            .unwrap(),
            5 => write!(
                s,
                "2025-{:02}-{:02}T{:02}:{:02}:00Z",
                1 + rng.next() % 12,
                1 + rng.next() % 28,
                rng.next() % 24,
                rng.next() % 60
            )
            .unwrap(),
            _ => write!(s, "０１２３４５６７８９ ٣٤٥ ४५६ {}", rng.next() % 99).unwrap(),
        }
        s.push_str(rng.pick(&[" ", "\n", ", ", "", "\t"]));
    }
    s
}

fn url(rng: &mut Rng) -> String {
    let hosts = [
        "example.com",
        "api.openai.com",
        "redis.io",
        "例え.jp",
        "sub.domain.co.uk:8443",
    ];
    let mut s = format!(
        "{}://{}/",
        rng.pick(&["https", "http", "ftp", "wss"]),
        rng.pick(&hosts)
    );
    for _ in 0..rng.below(5) {
        write!(s, "{}/", rng.pick(WORDS).replace(' ', "%20")).unwrap();
    }
    if rng.chance(60) {
        write!(
            s,
            "?q={}&page={}&utm_source=chat#section-{}",
            rng.pick(WORDS),
            rng.below(100),
            rng.below(9)
        )
        .unwrap();
    }
    if rng.chance(30) {
        write!(s, " mailto:user.name+tag{}@example.org", rng.below(1000)).unwrap();
    }
    s
}

fn emoji(rng: &mut Rng) -> String {
    let mut s = String::new();
    for _ in 0..1 + rng.below(20) {
        s.push_str(rng.pick(EMOJI));
        if rng.chance(30) {
            s.push(' ');
        }
    }
    s
}

/// Runs of one shape, a few thousand bytes at most (tiktoken-rs's own BPE is
/// quadratic in a piece's length; the 4 MB versions are in another test).
fn run(rng: &mut Rng) -> String {
    let n = 1 + rng.below(3000);
    match rng.below(8) {
        0 => " ".repeat(n),
        1 => "a".repeat(n),
        2 => "\n".repeat(n),
        3 => "0123456789".repeat(n / 10 + 1),
        4 => "🎉".repeat(n / 4 + 1),
        5 => "ab".repeat(n / 2 + 1),
        6 => "!?".repeat(n / 2 + 1),
        _ => "\t \n".repeat(n / 3 + 1),
    }
}

fn piece(rng: &mut Rng) -> String {
    match rng.below(12) {
        0..=2 => english(rng),
        3 => rng.pick(CODE).to_string(),
        4 => {
            let v = json_text(rng, 0);
            if rng.chance(50) {
                serde_json::to_string_pretty(&v).unwrap()
            } else {
                v.to_string()
            }
        }
        5 | 6 => rng.pick(SENTENCES).to_string(),
        7 => emoji(rng),
        8 => whitespace(rng),
        9 => numbers(rng),
        10 => url(rng),
        _ => {
            if rng.chance(40) {
                run(rng)
            } else {
                // Single characters and tiny strings.
                rng.pick(&[
                    "", " ", "a", "\n", "é", "中", "🎉", "'s", "'", "0", "\u{a0}", "...",
                ])
                .to_string()
            }
        }
    }
}

const ROLES: &[&str] = &[
    "user",
    "user",
    "assistant",
    "assistant",
    "system",
    "tool",
    "function",
    "developer",
    "narrator",
    "角色",
    "🤖 bot",
    "Role With Spaces",
];

/// The deterministic corpus: (role, content) pairs.
fn corpus(n: usize) -> Vec<(String, String)> {
    let mut rng = Rng::seeded(0x9E37_79B9_7F4A_7C15);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let role = if i == 7 {
            "r".repeat(64)
        } else {
            rng.pick(ROLES).to_string()
        };
        let mut content = String::new();
        for _ in 0..1 + rng.below(6) {
            if !content.is_empty() {
                content.push_str(rng.pick(&[" ", "\n", "", "\n\n", "\t"]));
            }
            content.push_str(&piece(&mut rng));
        }
        out.push((role, content));
    }
    // Large messages (above mem.async-threshold-bytes, 64 KB): long prose.
    for i in 0..3 {
        let mut big = String::new();
        while big.len() < 70_000 + i * 40_000 {
            big.push_str(&english(&mut rng));
            big.push(' ');
            if rng.chance(5) {
                big.push_str(rng.pick(SENTENCES));
            }
        }
        out.push(("user".to_owned(), big));
    }
    out
}

// ---------------------------------------------------------------- comparisons

struct Tally {
    compared: usize,
    agreed: usize,
    mismatches: Vec<String>,
}

/// Appends every corpus message under `model` and compares the reply's
/// `tokens` with 3 + count(role) + count(content) from tiktoken-rs.
fn compare_corpus(model: &str, bpe: &tiktoken_rs::CoreBPE) -> Tally {
    // The whole corpus stays in one session (no trimming): caps above the
    // default limits.
    let server = Server::with_module_args(&[], &["max-tokens-limit", "1000000000"]);
    let mut con = server.client();
    let count = |s: &str| bpe.encode_ordinary(s).len() as i64;
    let key = format!("corpus:{model}");
    let mut tally = Tally {
        compared: 0,
        agreed: 0,
        mismatches: Vec::new(),
    };
    let mut total = 0i64;
    let corpus = corpus(600);
    for (i, (role, content)) in corpus.iter().enumerate() {
        let mut args = vec!["MEM.APPEND", key.as_str(), role.as_str(), content.as_str()];
        if i == 0 {
            args.extend_from_slice(&[
                "MODEL",
                model,
                "MAXMSGS",
                "100000",
                "MAXTOKENS",
                "1000000000",
                "TTL",
                "0",
            ]);
        }
        let r = map_reply(&mut con, &args);
        let got = int_field(&r, "tokens");
        let want = 3 + count(role) + count(content);
        total += want;
        tally.compared += 1;
        if got == want {
            tally.agreed += 1;
        } else {
            let preview: String = content.chars().take(80).collect();
            tally.mismatches.push(format!(
                "{model} message {} (role {role:?}, {} bytes, {preview:?}): module {got}, tiktoken {want}",
                i + 1,
                content.len()
            ));
        }
        assert_eq!(int_field(&r, "id"), i as i64 + 1);
        assert_eq!(int_field(&r, "trimmed"), 0);
        assert_eq!(
            int_field(&r, "total_tokens"),
            total,
            "{model}: total after message {}",
            i + 1
        );
    }
    // MEM.GET returns the same counts the replies gave.
    let entries = match cmd(&mut con, &["MEM.GET", &key]).unwrap() {
        redis::Value::Array(items) => items,
        other => panic!("{other:?}"),
    };
    let stored: i64 = entries
        .into_iter()
        .map(|e| int_field(&as_fields(e), "tokens"))
        .sum();
    assert_eq!(stored, total);
    // Summaries are counted as a system message.
    let mut rng = Rng::seeded(42);
    for near in [50, 120, 300] {
        // The first message after upto (index upto) is not a tool result,
        // which a summary would separate from its call.
        let upto = (near..).find(|&u| corpus[u].0 != "tool").unwrap();
        let text = (0..5)
            .map(|_| piece(&mut rng))
            .collect::<Vec<_>>()
            .join("\n");
        let r = map_reply(&mut con, &["MEM.SUMMARIZE", &key, &upto.to_string(), &text]);
        let want = 3 + count("system") + count(&text);
        tally.compared += 1;
        if int_field(&r, "tokens") == want {
            tally.agreed += 1;
        } else {
            tally.mismatches.push(format!(
                "{model} summary upto {upto}: module {}, tiktoken {want}",
                int_field(&r, "tokens")
            ));
        }
    }
    tally
}

fn report(name: &str, t: &Tally) {
    println!(
        "{name}: {} messages compared, {} agree with tiktoken-rs",
        t.compared, t.agreed
    );
    for m in t.mismatches.iter().take(20) {
        println!("  mismatch: {m}");
    }
    assert!(t.compared >= 600);
    assert!(
        t.mismatches.is_empty(),
        "{name}: {} of {} counts differ from tiktoken-rs:\n{}",
        t.mismatches.len(),
        t.compared,
        t.mismatches.join("\n")
    );
}

#[test]
fn corpus_counts_equal_tiktoken_o200k_base() {
    let t = compare_corpus("gpt-4o", tiktoken_rs::o200k_base_singleton());
    report("o200k_base (gpt-4o)", &t);
}

#[test]
fn corpus_counts_equal_tiktoken_cl100k_base() {
    let t = compare_corpus("gpt-4", tiktoken_rs::cl100k_base_singleton());
    report("cl100k_base (gpt-4)", &t);
}

#[test]
fn corpus_is_varied() {
    // The corpus covers what it claims to: scripts, emoji, code, runs, sizes.
    let c = corpus(600);
    let all: String = c.iter().map(|(_, s)| s.as_str()).collect();
    for needle in [
        "我们",
        "トークン",
        "안녕",
        "مرحبا",
        "👩‍👩‍👧‍👦",
        "fn main",
        "SELECT",
        "https://",
        "\r\n",
        "\u{3000}",
        "<|endoftext|>",
        "{\n",
    ] {
        assert!(all.contains(needle), "corpus lacks {needle:?}");
    }
    assert!(c.iter().any(|(_, s)| s.is_empty() || s.len() < 3));
    assert!(c.iter().filter(|(_, s)| s.len() >= 65_536).count() >= 3);
    assert!(c.iter().any(|(_, s)| s.contains(&" ".repeat(500))));
    assert!(c.iter().any(|(_, s)| s.contains(&"a".repeat(500))));
    assert_eq!(corpus(600), c, "the corpus is deterministic");
}

// ---------------------------------------------------------------- pathological 4 MB inputs

#[test]
fn four_megabyte_pathological_inputs() {
    let mut server = Server::start();
    let mut con = server.client();
    cmd(&mut con, &["CONFIG", "SET", "mem.max-message-bytes", "5mb"]).unwrap();
    const N: usize = 4 * 1024 * 1024;
    let digits: String = "0123456789".repeat(N / 10 + 1)[..N].to_owned();
    let shapes: Vec<(&str, String)> = vec![
        ("spaces", " ".repeat(N)),
        ("one letter", "a".repeat(N)),
        ("digits", digits.clone()),
        ("newlines", "\n".repeat(N)),
        ("emoji", "🎉".repeat(N / 4)),
        // Shapes that would make the hand-written pre-tokenizer (src/pretokenize.rs)
        // quadratic if it backtracked per character: a capitals run (the first
        // alternative fails only at its end), combining marks (prefix and
        // letter at once), contractions, line breaks between spaces, case flips.
        ("capitals", "A".repeat(N)),
        ("combining marks", "\u{301}".repeat(N / 2)),
        ("contractions", "'s".repeat(N / 2)),
        ("line breaks and spaces", "\n ".repeat(N / 2 - 1) + "x"),
        ("case flips", "aA".repeat(N / 2)),
        ("spaced punctuation", " !".repeat(N / 2)),
    ];
    for (model, enc) in [
        ("gpt-4o", bpe_openai::o200k_base()),
        ("gpt-4", bpe_openai::cl100k_base()),
    ] {
        for (name, content) in &shapes {
            assert!(content.len() <= N);
            let key = format!("big:{model}:{name}");
            let r = map_reply(
                &mut con,
                &["MEM.APPEND", &key, "user", content, "MODEL", model],
            );
            let tokens = int_field(&r, "tokens");
            assert!(tokens > 3 + 1, "{model} {name}: {tokens}");
            assert_eq!(int_field(&r, "messages"), 1);
            // The expectation of bpe-openai (linear time, the same algorithm
            // family as tiktoken's merges).
            let want = 3 + enc.count("user") as i64 + enc.count(content.as_str()) as i64;
            assert_eq!(tokens, want, "{model} {name}");
            assert!(server.is_alive(), "server died on {model} {name}");
            let pong: String = redis::cmd("PING").query(&mut con).unwrap();
            assert_eq!(pong, "PONG");
        }
    }
    // Digits have a tiktoken expectation without running its BPE on 4 MB:
    // the pre-tokenizer splits digit runs into groups of 3, each counted alone.
    for (model, bpe) in [
        ("gpt-4o", tiktoken_rs::o200k_base_singleton()),
        ("gpt-4", tiktoken_rs::cl100k_base_singleton()),
    ] {
        let mut cache = std::collections::HashMap::new();
        let mut want = 3 + bpe.encode_ordinary("user").len() as i64;
        for chunk in digits.as_bytes().chunks(3) {
            let chunk = std::str::from_utf8(chunk).unwrap();
            want += *cache
                .entry(chunk)
                .or_insert_with(|| bpe.encode_ordinary(chunk).len() as i64);
        }
        let key = format!("big:{model}:digits");
        let info = map_reply(&mut con, &["MEM.INFO", &key]);
        assert_eq!(
            int_field(&info, "total_tokens"),
            want,
            "{model}: 4 MB of digits vs tiktoken 3-digit groups"
        );
    }
    // Above the configured limit: refused, nothing stored.
    let over = "x".repeat(5 * 1024 * 1024 + 1);
    let e = cmd(&mut con, &["MEM.APPEND", "over", "user", &over]).unwrap_err();
    assert_eq!(e.code(), Some("ERR"), "{e}");
    assert_eq!(
        cmd(&mut con, &["EXISTS", "over"]).unwrap(),
        redis::Value::Int(0)
    );
    assert!(server.is_alive());
}
