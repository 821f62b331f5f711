//! What the fixtures of release 0.2 (v2) add to those of 0.1, and checks
//! that a fixture directory really holds the format it claims.
//!
//! Every answer must stay the same for years: no expiry (TTL 0) or ten
//! years, explicit TS values, MAXAGE of twenty years over messages of
//! 2025, a lease that has already expired (leases last a day at most), so
//! nothing depends on when the tests run.

use std::path::Path;

use redis::Value;
use serde_json::{json, Value as Json};

use crate::support::server::cmd;

/// 2025-12-01T00:00:00Z: recent messages (twenty years of MAXAGE keep them
/// until 2045).
const T: i64 = 1_764_547_200_000;
const TWENTY_YEARS: &str = "630720000";
const TEN_YEARS: &str = "315360000";

fn run(con: &mut redis::Connection, args: &[&str]) -> Value {
    cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn ts(offset_s: i64) -> String {
    (T + offset_s * 1000).to_string()
}

fn field(v: &Value, name: &str) -> i64 {
    let Value::Array(items) = v else {
        panic!("not a map: {v:?}")
    };
    let i = items
        .iter()
        .position(|x| matches!(x, Value::BulkString(b) if b == name.as_bytes()))
        .unwrap();
    redis::from_redis_value(&items[i + 1]).unwrap()
}

/// Sessions using what 0.2 added: MSGID (held and departed, by trim and by
/// summary; 0.2 had no TOKENS), leases (ended by a summary, and an expired one),
/// MAXAGE (with a message it hides), attributes (set, replaced, deleted,
/// a session holding only attributes), an imported document's members
/// edited, on top of summaries, meta, tool calls, custom roles, unicode
/// and external ids.
pub fn populate_v2(con: &mut redis::Connection) -> Vec<String> {
    let mut keys = Vec::new();

    let k = "mem:{msgid}";
    let call = r#"{"tool_calls":[{"id":"call_7","type":"function","function":{"name":"book","arguments":"{\"day\":\"Fri\"}"}}]}"#;
    let steps: [(&str, &str, &[&str]); 7] = [
        (
            "user",
            "Book a table for two",
            &["MSGID", "req-1", "TTL", "0", "MAXMSGS", "4"],
        ),
        (
            "assistant",
            "Which day?",
            &["MSGID", "req-2", "META", r#"{"model_used":"gpt-4o"}"#],
        ),
        ("user", "Friday 🍷, près de la gare", &["MSGID", "req-3"]),
        ("assistant", "", &["MSGID", "req-4", "META", call]),
        (
            "tool",
            "booked: #42",
            &["MSGID", "req-5", "META", r#"{"tool_call_id":"call_7"}"#],
        ),
        ("assistant", "Booked for Friday.", &["MSGID", "req-6"]),
        ("user", "thanks", &[]),
    ];
    for (i, (role, text, opts)) in steps.iter().enumerate() {
        let t = ts(i as i64);
        let mut args = vec!["MEM.APPEND", k, role, text, "TS", &t];
        args.extend_from_slice(opts);
        run(con, &args);
    }
    // A retry of a trimmed message is answered as a duplicate.
    let r = run(
        con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "Book a table for two",
            "MSGID",
            "req-1",
            "TS",
            &ts(0),
        ],
    );
    assert_eq!(field(&r, "duplicate"), 1, "release's MSGID retry");
    // req-4 and req-5 leave by the summary.
    run(
        con,
        &[
            "MEM.SUMMARIZE",
            k,
            "5",
            "Ann booked a table for Friday (#42).",
        ],
    );
    keys.push(k.to_owned());

    // Leases: one ended by its summary (token 1), one expired (token 2).
    let k = "mem:{lease}";
    let turns = [
        ("system", "Tu es un planificateur."),
        ("user", "Plan a week in 京都"),
        ("planner", "step 1: temples; step 2: 抹茶"),
        ("assistant", "Here is the plan."),
        ("user", "Shorter please"),
        ("assistant", "Temples, tea, done."),
    ];
    for (i, (role, text)) in turns.iter().enumerate() {
        run(
            con,
            &[
                "MEM.APPEND",
                k,
                role,
                text,
                "TS",
                &ts(i as i64),
                "TTL",
                "0",
                "MAXMSGS",
                "6",
            ],
        );
    }
    let b = run(con, &["MEM.SUMMARIZE_BEGIN", k, "60000", "KEEP", "2"]);
    assert_eq!(field(&b, "lease"), 1, "release's first lease: {b:?}");
    let upto = field(&b, "upto").to_string();
    run(
        con,
        &[
            "MEM.SUMMARIZE",
            k,
            &upto,
            "Résumé : un plan pour 京都.",
            "LEASE",
            "1",
        ],
    );
    for (i, text) in ["Add Nara", "Nara on day 3", "And Osaka?", "Osaka on day 4"]
        .iter()
        .enumerate()
    {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        run(
            con,
            &["MEM.APPEND", k, role, text, "TS", &ts(10 + i as i64)],
        );
    }
    let b = run(con, &["MEM.SUMMARIZE_BEGIN", k, "1", "KEEP", "2"]);
    assert_eq!(field(&b, "lease"), 2, "release's second lease: {b:?}");
    std::thread::sleep(std::time::Duration::from_millis(20));
    run(
        con,
        &["MEM.EXTSET", k, "dify", "conv-京都", "EX", TEN_YEARS],
    );
    keys.push(k.to_owned());

    // MAXAGE: the last message (2001) is older than now - maxage; its own
    // append keeps it, reads hide it, the next write evicts it.
    let k = "mem:{maxage}";
    run(
        con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "Plans for 2026?",
            "TS",
            &ts(0),
            "TTL",
            "0",
            "MAXAGE",
            TWENTY_YEARS,
        ],
    );
    run(
        con,
        &["MEM.APPEND", k, "assistant", "Travel more.", "TS", &ts(1)],
    );
    run(
        con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "an old note",
            "TS",
            "1000000000000",
        ],
    );
    keys.push(k.to_owned());

    // Attributes: set, replaced, deleted; names and values with unicode.
    let k = "mem:{attrs}";
    run(
        con,
        &["MEM.APPEND", k, "user", "Hello", "TS", &ts(0), "TTL", "0"],
    );
    run(
        con,
        &[
            "MEM.ATTRSET",
            k,
            "user_profile",
            r#"{"name":"Zoë","langs":["fr","日本語"]}"#,
        ],
    );
    run(
        con,
        &[
            "MEM.ATTRSET",
            k,
            "context",
            r#"{"topic":"travel","depth":{"a":[1,2.5,{"b":null}]}}"#,
        ],
    );
    run(con, &["MEM.ATTRSET", k, "préférences", r#""court""#]);
    run(con, &["MEM.ATTRSET", k, "scratch", "1"]);
    run(con, &["MEM.ATTRDEL", k, "scratch"]);
    run(con, &["MEM.ATTRSET", k, "context", r#"{"topic":"food"}"#]);
    keys.push(k.to_owned());

    // A session that holds only attributes (ATTRSET takes mem.ttl; PERSIST
    // keeps the key).
    let k = "mem:{attrs_only}";
    run(
        con,
        &[
            "MEM.ATTRSET",
            k,
            "profile",
            r#"{"tier":"gold","since":2019}"#,
        ],
    );
    run(con, &["PERSIST", k]);
    keys.push(k.to_owned());

    // An imported document's other members (one name with an escape, kept
    // as written), then edited.
    let k = "mem:{import_attrs}";
    let doc = r#"{"conversation_history":[
        {"id":3,"role":"user","content":"What's the weather?","timestamp":"2025-11-30T09:00:00Z"},
        {"id":4,"role":"assistant","content":"","ts":1764493201000,"meta":{"tool_calls":[{"id":"c1","type":"function","function":{"name":"weather","arguments":"{}"}}]}},
        {"id":5,"role":"tool","content":"sunny","ts":1764493202000,"meta":{"tool_call_id":"c1"}},
        {"id":6,"role":"assistant","content":"Sunny ☀","ts":1764493203000}],
      "summary":{"content":"Earlier: hello.","upto":2,"ts":1764493100000},
      "user_profile":{"name":"Bo"},
      "context":{"k":[true,false,null]},
      "caf\u00e9":1,
      "notes":["a","b"]}"#;
    run(con, &["MEM.IMPORT", k, doc, "TTL", "0"]);
    run(
        con,
        &[
            "MEM.ATTRSET",
            k,
            "user_profile",
            r#"{"name":"Bo","city":"Lyon"}"#,
        ],
    );
    run(con, &["MEM.ATTRDEL", k, "context"]);
    run(con, &["MEM.APPEND", k, "user", "Thanks", "TS", &ts(100)]);
    keys.push(k.to_owned());
    keys
}

/// Read commands 0.2 added, asked of every key of a v2 fixture.
pub fn v2_questions(key: &str) -> Vec<(&'static str, Vec<String>)> {
    let q = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("attrget", q(&["MEM.ATTRGET", key])),
        (
            "attrget_user_profile",
            q(&["MEM.ATTRGET", key, "user_profile"]),
        ),
        ("get_last3", q(&["MEM.GET", key, "LAST", "3"])),
    ]
}

/// Commands run after the reads, on the loaded sessions: what only a write
/// shows (departed msgids, the last lease token, a hidden message that the
/// next write evicts). Their answers are written with the fixtures, taken
/// after the files were.
pub fn writes_v2() -> Vec<Vec<String>> {
    let c = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        // Retries: trimmed (req-1), summarized (req-5), held (req-6).
        c(&[
            "MEM.APPEND",
            "mem:{msgid}",
            "user",
            "Book a table for two",
            "MSGID",
            "req-1",
            "TS",
            &ts(50),
        ]),
        c(&[
            "MEM.APPEND",
            "mem:{msgid}",
            "tool",
            "booked: #42",
            "MSGID",
            "req-5",
            "TS",
            &ts(50),
        ]),
        c(&[
            "MEM.APPEND",
            "mem:{msgid}",
            "assistant",
            "Booked for Friday.",
            "MSGID",
            "req-6",
            "TS",
            &ts(50),
        ]),
        c(&[
            "MEM.APPEND",
            "mem:{msgid}",
            "user",
            "one more",
            "MSGID",
            "req-8",
            "TS",
            &ts(51),
        ]),
        c(&[
            "MEM.APPEND",
            "mem:{msgid}",
            "user",
            "one more",
            "MSGID",
            "req-8",
            "TS",
            &ts(52),
        ]),
        c(&["MEM.GET", "mem:{msgid}"]),
        // The expired lease frees the session; the next token is 3.
        c(&["MEM.SUMMARIZE_BEGIN", "mem:{lease}", "60000", "KEEP", "2"]),
        c(&[
            "MEM.SUMMARIZE",
            "mem:{lease}",
            "8",
            "by the stale worker",
            "LEASE",
            "2",
        ]),
        c(&[
            "MEM.SUMMARIZE",
            "mem:{lease}",
            "8",
            "Plan: 京都, Nara.",
            "LEASE",
            "3",
        ]),
        // Not MEM.GET: a new summary's ts is the clock's.
        c(&["MEM.GET", "mem:{lease}", "AFTER", "0"]),
        c(&["MEM.SUMMARIZE_CHECK", "mem:{lease}", "KEEP", "2"]),
        // The message MAXAGE hides goes with the next write.
        c(&[
            "MEM.APPEND",
            "mem:{maxage}",
            "user",
            "still here?",
            "TS",
            &ts(2),
        ]),
        c(&["MEM.GET", "mem:{maxage}", "FORMAT", "JSON"]),
        c(&[
            "MEM.ATTRSET",
            "mem:{attrs_only}",
            "profile",
            r#"{"tier":"silver"}"#,
        ]),
        c(&["MEM.ATTRGET", "mem:{attrs_only}"]),
        // The member named with an escape: as written, as read.
        c(&["MEM.ATTRDEL", "mem:{import_attrs}", "caf\\u00e9"]),
        c(&["MEM.ATTRDEL", "mem:{import_attrs}", "café"]),
        c(&["MEM.GET", "mem:{import_attrs}", "FORMAT", "JSON"]),
    ]
}

/// A reply or error as JSON, without the fields that depend on the clock
/// (a new lease's expiry).
pub fn answer_json(r: redis::RedisResult<Value>, to_json: impl Fn(&Value) -> Json) -> Json {
    match r {
        Err(e) => json!({ "error": without_lease_time(&e.to_string()) }),
        Ok(v) => match to_json(&v) {
            Json::Array(a)
                if a.len() % 2 == 0 && a.chunks(2).any(|kv| kv[0] == "lease_expires") =>
            {
                Json::Array(
                    a.chunks(2)
                        .filter(|kv| kv[0] != "lease_expires")
                        .flatten()
                        .cloned()
                        .collect(),
                )
            }
            other => other,
        },
    }
}

/// A LEASED error names the lease's time left in ms, which depends on when
/// the answer was taken: written as `N`.
pub fn without_lease_time(error: &str) -> String {
    let Some(at) = error.find(" lease for ") else {
        return error.to_owned();
    };
    let from = at + " lease for ".len();
    let digits = error[from..].bytes().take_while(u8::is_ascii_digit).count();
    format!("{}N{}", &error[..from], &error[from + digits..])
}

// ---- format checks ----------------------------------------------------

/// (RDB encoding version, payload format) of a DUMP payload of the module's
/// type: opcode 7 (module, v2), the 64-bit module id (the low 10 bits are
/// the encoding version), then a string opcode (5) and the payload, plain
/// or LZF-compressed (an LZF stream starts with a literal run, so its
/// first byte is the payload's first).
pub fn dump_versions(dump: &[u8]) -> (u64, u8) {
    assert_eq!(&dump[..2], &[7, 0x81], "module value with a 64-bit id");
    let id = u64::from_be_bytes(dump[2..10].try_into().unwrap());
    assert_eq!(dump[10], 5, "string opcode");
    let format = if dump[11] == 0xc3 {
        let (_compressed, at) = rdb_len(dump, 12);
        let (_plain, at) = rdb_len(dump, at);
        assert!(dump[at] < 32, "LZF stream starts with a literal run");
        dump[at + 1]
    } else {
        let (_len, at) = rdb_len(dump, 11);
        dump[at]
    };
    (id & 1023, format)
}

/// An RDB length at `at`: (length, where what follows starts).
fn rdb_len(b: &[u8], at: usize) -> (u64, usize) {
    match (b[at] >> 6, b[at]) {
        (0, x) => (u64::from(x & 63), at + 1),
        (1, x) => ((u64::from(x & 63) << 8) | u64::from(b[at + 1]), at + 2),
        (_, 0x80) => (
            u64::from(u32::from_be_bytes(b[at + 1..at + 5].try_into().unwrap())),
            at + 5,
        ),
        (_, 0x81) => (
            u64::from_be_bytes(b[at + 1..at + 9].try_into().unwrap()),
            at + 9,
        ),
        (_, x) => panic!("length encoding {x:#x}"),
    }
}

/// The 8 bytes of the module id of a value at `encver`, as an RDB holds
/// them, from the id in one of the fixture's DUMP payloads.
pub fn module_id_bytes(dump: &[u8], encver: u64) -> [u8; 8] {
    let id = u64::from_be_bytes(dump[2..10].try_into().unwrap());
    ((id & !1023) | encver).to_be_bytes()
}

pub fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

/// Every command of an AOF without RDB preamble, as its arguments.
pub fn aof_commands(path: &Path) -> Vec<Vec<Vec<u8>>> {
    let bytes = std::fs::read(path).unwrap();
    let mut at = 0;
    let line = |at: &mut usize| -> String {
        let end = *at + bytes[*at..].windows(2).position(|w| w == b"\r\n").unwrap();
        let s = String::from_utf8(bytes[*at..end].to_vec()).unwrap();
        *at = end + 2;
        s
    };
    let mut commands = Vec::new();
    while at < bytes.len() {
        let n: usize = line(&mut at)
            .strip_prefix('*')
            .expect("array")
            .parse()
            .unwrap();
        let mut args = Vec::new();
        for _ in 0..n {
            let len: usize = line(&mut at)
                .strip_prefix('$')
                .expect("bulk")
                .parse()
                .unwrap();
            args.push(bytes[at..at + len].to_vec());
            at += len + 2;
        }
        commands.push(args);
    }
    commands
}
