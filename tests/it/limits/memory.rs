//! Memory: writes above maxmemory fail with OOM and change nothing, and
//! MEMORY USAGE tracks the content's size.

use redis::Value;

use crate::support::server::*;
use crate::support::session::*;

#[test]
fn writes_under_maxmemory_fail_with_oom_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let big = "lorem ipsum dolor sit amet ".repeat(200);
    for s in 0..20 {
        let key = format!("mem:{{oom}}:{s}");
        for _ in 0..20 {
            ok(&mut con, &["MEM.APPEND", &key, "user", &big]);
        }
    }
    let key = "mem:{oom}:0";
    ok(&mut con, &["MEM.EXTSET", key, "dify", "before-oom"]);
    let before = snap(&mut con, key);
    let used: u64 = info_field(&mut con, "memory", "used_memory")
        .unwrap()
        .parse()
        .unwrap();
    ok(
        &mut con,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    ok(
        &mut con,
        &["CONFIG", "SET", "maxmemory", &(used / 2).to_string()],
    );
    let upto = int_field(&map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", key]), "upto").to_string();
    let doc = r#"{"conversation_history":[{"role":"user","content":"x"}]}"#;
    // A summary longer than the one message it replaces grows the session.
    let longer = big.repeat(2);
    let mut refused = 0;
    for args in [
        vec!["MEM.APPEND", key, "user", "no room"],
        vec!["MEM.APPEND", "mem:{oom}:new", "user", "no room"],
        vec!["MEM.SUMMARIZE", key, "1", &longer],
        vec!["MEM.EXTSET", key, "dify", "after-oom"],
        vec!["MEM.EXTSET", "mem:{oom}:new", "dify", "x"],
        vec!["MEM.IMPORT", "mem:{oom}:new", doc],
        vec!["MEM.IMPORT", key, doc, "REPLACE"],
    ] {
        let e = cmd(&mut con, &args).expect_err(&format!("{args:?} succeeded above maxmemory"));
        assert!(
            e.to_string().contains("OOM") || e.code() == Some("OOM"),
            "{args:?}: {e}"
        );
        refused += 1;
    }
    assert_same(
        &before,
        &snap(&mut con, key),
        "refused writes under maxmemory",
        1000,
    );
    assert_eq!(ok(&mut con, &["EXISTS", "mem:{oom}:new"]), Value::Int(0));
    // Reads still work.
    check_consistent(&mut con, key);
    ok(&mut con, &["MEM.SUMMARIZE_CHECK", key]);
    assert_eq!(
        ok(&mut con, &["MEM.EXTGET", key, "dify"]),
        Value::BulkString(b"before-oom".to_vec())
    );
    ok(&mut con, &["MEM.GET", key, "LAST", "2"]);
    // A summary is how a full server sheds a session's bytes: the lease and
    // a summary shorter than what it replaces are not refused (hostile pass
    // 29 F7: both were OOM).
    let begin = map_reply(&mut con, &["MEM.SUMMARIZE_BEGIN", key, "60000"]);
    let lease = int_field(&begin, "lease");
    assert!(lease > 0, "{begin:?}");
    let r = map_reply(
        &mut con,
        &[
            "MEM.SUMMARIZE",
            key,
            &upto,
            "a short summary",
            "LEASE",
            &lease.to_string(),
        ],
    );
    assert_eq!(int_field(&r, "id").to_string(), upto);
    // And writes again once there is room.
    ok(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    ok(&mut con, &["MEM.APPEND", key, "user", "room again"]);
    println!("hostile/oom: {refused} writes refused with OOM above maxmemory, session unchanged, reads served");
}

#[test]
fn memory_usage_tracks_content_size() {
    let server = Server::start();
    let mut con = server.client();
    let text = |n: usize| {
        let words = "the quick brown fox jumps over a lazy dog while counting tokens ";
        words.repeat(n / words.len() + 1)[..n].to_owned()
    };
    for (key, size) in [("mem:{mu}:small", 600), ("mem:{mu}:big", 6000)] {
        for i in 0..30 {
            let mut content = text(size);
            content.replace_range(0..4, &format!("{i:04}"));
            ok(
                &mut con,
                &[
                    "MEM.APPEND",
                    key,
                    "user",
                    &content,
                    "MAXMSGS",
                    "30",
                    "MAXTOKENS",
                    "1000000",
                ],
            );
        }
        let info = map_reply(&mut con, &["MEM.INFO", key]);
        assert_eq!(int_field(&info, "messages"), 30);
    }
    let usage = |con: &mut redis::Connection, key: &str| -> i64 {
        redis::from_redis_value(&ok(con, &["MEMORY", "USAGE", key, "SAMPLES", "0"])).unwrap()
    };
    let small = usage(&mut con, "mem:{mu}:small");
    let big = usage(&mut con, "mem:{mu}:big");
    let expected = 30 * (6000 - 600);
    let diff = big - small;
    println!("hostile/memory usage: 30 x 600 B -> {small} B, 30 x 6000 B -> {big} B, difference {diff} (content difference {expected})");
    assert!(
        small >= 30 * 600,
        "MEMORY USAGE {small} below the content size"
    );
    assert!(
        diff as f64 >= expected as f64 * 0.9 && diff as f64 <= expected as f64 * 1.5,
        "MEMORY USAGE difference {diff} does not track the content difference {expected}"
    );
    // Summarizing shrinks it.
    let upto = int_field(
        &map_reply(
            &mut con,
            &["MEM.SUMMARIZE_CHECK", "mem:{mu}:big", "KEEP", "5"],
        ),
        "upto",
    )
    .to_string();
    ok(&mut con, &["MEM.SUMMARIZE", "mem:{mu}:big", &upto, "short"]);
    let after = usage(&mut con, "mem:{mu}:big");
    assert!(
        after < big - 20 * 6000,
        "MEMORY USAGE after summarizing 25 messages: {after} (was {big})"
    );
}

/// Counting one long piece (on a worker: MEM.COUNT, keyless) raises Redis's
/// memory peak no more than any command of that size does: the counters'
/// scratch (heaps, links, bpe's encoder's stacks, a normalized copy) and the
/// worker's copy of the text are the module's own, outside used_memory. Charged to it, one
/// 4 MB piece took ~25 bytes a byte at once, and a keyless read made Redis
/// evict 4,185 keys under allkeys-lru (hostile pass 48). used_memory_peak
/// only rises (CONFIG RESETSTAT leaves it), so EXISTS of the same text, an
/// argument Redis parses and frees, sets the mark first.
#[test]
fn counting_a_long_piece_raises_used_memory_no_more_than_its_argument() {
    let server = Server::start();
    let mut con = server.client();
    // 1 MB: what was charged grew with the piece (25 bytes a byte).
    let n = 1024 * 1024 - 1;
    let texts = [
        ("gpt-4o", "-".repeat(n)),
        ("gpt-4", "a".repeat(n)),
        ("llama-3.1-8b", "a".repeat(n)),
        (
            "gpt-4o",
            format!("{} ", "=".repeat(65_535)).repeat(n / 65_536),
        ),
        // Normalized to NFC first (a copy of the text), split by the
        // vendor's pattern.
        ("qwen-plus", "cafe\u{301} ".repeat(n / 7)),
        ("deepseek-chat", "word, 12 words\n".repeat(n / 15)),
    ];
    for (model, _) in &texts {
        // The encoding built first (its tables are the module's too).
        cmd(&mut con, &["MEM.COUNT", model, "warm"]).unwrap();
    }
    let _: i64 = redis::cmd("EXISTS")
        .arg(&texts[0].1)
        .query(&mut con)
        .unwrap();
    let mark = info_int(&mut con, "memory", "used_memory_peak");
    for (model, text) in &texts {
        let count = redis::cmd("MEM.COUNT").arg(model).arg(text).clone();
        let what = format!("{model}, {} bytes", text.len());
        assert!(count_under_the_mark(&mut con, &count, mark, &what) > 0);
    }
}

/// The tokens `count` (a MEM.COUNT) replies, once it is checked that it
/// raised used_memory's peak less than 512 KB above `mark`.
fn count_under_the_mark(
    con: &mut redis::Connection,
    count: &redis::Cmd,
    mark: i64,
    what: &str,
) -> i64 {
    let tokens: i64 = count.query(con).unwrap();
    let peak = info_int(con, "memory", "used_memory_peak");
    assert!(
        peak - mark < 512 * 1024,
        "{what}: the peak rose {} bytes",
        peak - mark
    );
    tokens
}

/// A keyless count with a large META (its tool calls parsed and rendered on
/// a worker) raises Redis's memory peak no more than its argument does: what
/// the module builds for it is its own, outside used_memory (hostile pass
/// 49: 4-8 bytes a byte of META, and Redis evicted keys). Redis samples the
/// peak in its cron, so a transient of a few ms (a JSON reply's document)
/// is not seen here: that one is measured in docs/RELIABILITY.md.
#[test]
fn counting_a_large_meta_raises_used_memory_no_more_than_its_argument() {
    let server = Server::start();
    let mut con = server.client();
    cmd(&mut con, &["MEM.COUNT", "qwen-plus", "warm"]).unwrap();
    let arguments = format!("{{\"q\":\"{}\"}}", "x".repeat(4 * 1024 * 1024 - 256));
    let meta = serde_json::json!({"tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": arguments}}]})
    .to_string();
    let _: i64 = redis::cmd("EXISTS").arg(&meta).query(&mut con).unwrap();
    let mark = info_int(&mut con, "memory", "used_memory_peak");
    for model in ["gpt-4o", "qwen-plus"] {
        let count = redis::cmd("MEM.COUNT")
            .arg(model)
            .arg("hi")
            .arg("META")
            .arg(&meta)
            .clone();
        let what = format!("{model}, META of {} bytes", meta.len());
        assert!(count_under_the_mark(&mut con, &count, mark, &what) > 1000);
    }
}
