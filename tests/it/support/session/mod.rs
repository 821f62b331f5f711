//! Helpers shared by the reliability tests (persistence, replication,
//! stress, ...): snapshots of a session (digest, JSON, PTTL), consistency checks,
//! a varied set of sessions, the DUMP footer, and (payload.rs) an encoder of
//! the internal commands' payloads.
#![allow(dead_code)]

mod payload;
// Not every test file crafts payloads.
#[allow(unused_imports)]
pub use payload::*;

use std::time::{Duration, Instant};

use redis::Value;
use serde_json::Value as Json;

use crate::support::server::*;

/// Runs a command with binary arguments.
pub fn cmd_bin(con: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut c = redis::cmd(std::str::from_utf8(args[0]).unwrap_or("MEM.GET"));
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// `DEBUG DIGEST-VALUE key` as hex ("000..." for a missing key).
pub fn digest(con: &mut redis::Connection, key: &str) -> String {
    let v =
        cmd(con, &["DEBUG", "DIGEST-VALUE", key]).unwrap_or_else(|e| panic!("digest {key}: {e}"));
    match v {
        Value::Array(items) if items.len() == 1 => {
            redis::from_redis_value::<String>(&items[0]).unwrap()
        }
        other => panic!("unexpected DIGEST-VALUE reply {other:?}"),
    }
}

/// `MEM.GET key FORMAT JSON`.
pub fn json_text(con: &mut redis::Connection, key: &str) -> String {
    let v =
        cmd(con, &["MEM.GET", key, "FORMAT", "JSON"]).unwrap_or_else(|e| panic!("json {key}: {e}"));
    redis::from_redis_value::<String>(&v).unwrap()
}

pub fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::from_redis_value(&cmd(con, &["PTTL", key]).unwrap()).unwrap()
}

/// What must be equal between two copies of a session.
#[derive(Clone, Debug)]
pub struct Snap {
    pub key: String,
    pub digest: String,
    pub json: String,
    pub pttl: i64,
    /// PEXPIRETIME: equal on both sides means the expiry is unchanged, however
    /// long the test took between the two snapshots.
    pub expire_at: i64,
}

pub fn snap(con: &mut redis::Connection, key: &str) -> Snap {
    Snap {
        key: key.to_owned(),
        digest: digest(con, key),
        json: json_text(con, key),
        pttl: pttl(con, key),
        expire_at: redis::from_redis_value(&cmd(con, &["PEXPIRETIME", key]).unwrap()).unwrap(),
    }
}

pub fn snap_all(con: &mut redis::Connection, keys: &[String]) -> Vec<Snap> {
    keys.iter().map(|k| snap(con, k)).collect()
}

/// Digest and JSON equal; PTTL equal when there is none (-1/-2), else the
/// same absolute expiry or a PTTL within `ttl_slack_ms` (a copy made with a
/// relative TTL, a restart).
pub fn assert_same(before: &Snap, after: &Snap, what: &str, ttl_slack_ms: i64) {
    assert_eq!(
        before.digest, after.digest,
        "{what}: digest of {} differs",
        before.key
    );
    assert_eq!(
        before.json, after.json,
        "{what}: JSON of {} differs",
        before.key
    );
    if before.pttl < 0 || after.pttl < 0 {
        assert_eq!(
            before.pttl, after.pttl,
            "{what}: PTTL of {} differs",
            before.key
        );
    } else if before.expire_at != after.expire_at {
        assert!(
            (before.pttl - after.pttl).abs() <= ttl_slack_ms,
            "{what}: PTTL of {}: {} vs {}",
            before.key,
            before.pttl,
            after.pttl
        );
    }
}

/// A message as `MEM.GET ... FORMAT JSON` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Msg {
    pub id: u64,
    pub role: String,
    pub content: String,
    pub ts: i64,
    pub tokens: u64,
}

pub struct Doc {
    pub messages: Vec<Msg>,
    pub summary_upto: u64,
    pub summary_tokens: u64,
    pub total_tokens: u64,
    pub json: Json,
}

pub fn parse_doc(text: &str) -> Doc {
    let json: Json = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("bad JSON document ({e}): {text:.300}"));
    let messages = json["conversation_history"]
        .as_array()
        .expect("conversation_history")
        .iter()
        .map(|m| Msg {
            id: m["id"].as_u64().expect("id"),
            role: m["role"].as_str().expect("role").to_owned(),
            content: m["content"].as_str().expect("content").to_owned(),
            ts: m["ts"].as_i64().expect("ts"),
            tokens: m["tokens"].as_u64().expect("tokens"),
        })
        .collect();
    let (summary_upto, summary_tokens) = match &json["summary"] {
        Json::Null => (0, 0),
        s => (s["upto"].as_u64().unwrap(), s["tokens"].as_u64().unwrap()),
    };
    Doc {
        messages,
        summary_upto,
        summary_tokens,
        total_tokens: json["total_tokens"].as_u64().expect("total_tokens"),
        json,
    }
}

/// Reads a session and checks that its views agree: ids strictly increasing
/// (and above the summary's upto), total_tokens = summary + sum of message
/// tokens, MEM.INFO's counts and ids match, the RESP reply has the same
/// entries. Returns the parsed document.
pub fn check_consistent(con: &mut redis::Connection, key: &str) -> Doc {
    try_consistent(con, key).unwrap_or_else(|e| panic!("{e}"))
}

/// [`check_consistent`] without panicking: the first problem found.
pub fn try_consistent(con: &mut redis::Connection, key: &str) -> Result<Doc, String> {
    macro_rules! ensure {
        ($cond:expr, $($fmt:tt)*) => {
            if !$cond {
                return Err(format!($($fmt)*));
            }
        };
    }
    let info = cmd(con, &["MEM.INFO", key]).map_err(|e| format!("{key}: MEM.INFO failed: {e}"))?;
    let resp = cmd(con, &["MEM.GET", key]).map_err(|e| format!("{key}: MEM.GET failed: {e}"))?;
    let text = match cmd(con, &["MEM.GET", key, "FORMAT", "JSON"]) {
        Ok(v) => {
            redis::from_redis_value::<String>(&v).map_err(|e| format!("{key}: JSON reply: {e}"))?
        }
        Err(e) => return Err(format!("{key}: MEM.GET FORMAT JSON failed: {e}")),
    };
    let Value::Array(entries) = resp else {
        return Err(format!("MEM.GET {key} not an array"));
    };
    if info == Value::Nil {
        ensure!(
            entries.is_empty(),
            "{key}: MEM.INFO nil but MEM.GET has entries"
        );
        let doc = parse_doc(&text);
        ensure!(
            doc.messages.is_empty(),
            "{key}: MEM.INFO nil but the JSON has messages"
        );
        return Ok(doc);
    }
    let info = as_fields(info);
    let summary_upto = int_field(&info, "summary_upto") as u64;
    let mut messages = Vec::new();
    let mut summary_tokens = 0;
    for (i, e) in entries.into_iter().enumerate() {
        let f = as_fields(e);
        if i == 0 && summary_upto > 0 {
            ensure!(
                str_field(&f, "role") == "summary",
                "{key}: first entry is not the summary"
            );
            ensure!(
                int_field(&f, "id") as u64 == summary_upto,
                "{key}: summary id vs MEM.INFO summary_upto"
            );
            summary_tokens = int_field(&f, "tokens") as u64;
            continue;
        }
        messages.push(Msg {
            id: int_field(&f, "id") as u64,
            role: str_field(&f, "role"),
            content: str_field(&f, "content"),
            ts: int_field(&f, "ts"),
            tokens: int_field(&f, "tokens") as u64,
        });
    }
    let mut prev = summary_upto;
    let mut sum = summary_tokens as u128;
    for m in &messages {
        ensure!(m.id > prev, "{key}: id {} not above {prev}", m.id);
        ensure!(
            !m.role.is_empty() && m.role.len() <= 64,
            "{key}: bad role {:?} at id {}",
            m.role,
            m.id
        );
        prev = m.id;
        sum += m.tokens as u128;
    }
    let total_tokens = int_field(&info, "total_tokens") as u64;
    ensure!(
        total_tokens as u128 == sum,
        "{key}: total_tokens {total_tokens} is not the sum of the tokens {sum}"
    );
    ensure!(
        int_field(&info, "messages") as usize == messages.len(),
        "{key}: MEM.INFO messages"
    );
    let first = messages.first().map_or(0, |m| m.id);
    ensure!(
        int_field(&info, "first_id") as u64 == first,
        "{key}: MEM.INFO first_id"
    );
    ensure!(
        int_field(&info, "last_id") as u64 >= prev,
        "{key}: MEM.INFO last_id below a message id"
    );
    ensure!(
        int_field(&info, "maxmsgs") >= 1 && int_field(&info, "maxtokens") >= 1,
        "{key}: a cap below 1"
    );
    // The JSON document must parse (META and imported members are bounded
    // so that it always does) and agree with the RESP reply.
    let json = match serde_json::from_str::<Json>(&text) {
        Ok(json) => {
            let doc = parse_doc(&text);
            ensure!(doc.total_tokens == total_tokens, "{key}: JSON total_tokens");
            ensure!(
                doc.messages == messages,
                "{key}: JSON history differs from the RESP reply"
            );
            ensure!(doc.summary_upto == summary_upto, "{key}: JSON summary upto");
            json
        }
        Err(e) => {
            return Err(format!(
                "{key}: MEM.GET FORMAT JSON is not valid JSON ({e}): {text:.300}"
            ))
        }
    };
    Ok(Doc {
        messages,
        summary_upto,
        summary_tokens,
        total_tokens,
        json,
    })
}

pub fn ok(con: &mut redis::Connection, args: &[&str]) -> Value {
    cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Fills a varied set of sessions under `prefix` (e.g. "mem:{v}") and returns
/// their keys: plain, meta, summary, external ids, an import with extra
/// members, a TTL 0 session, a cl100k session, tool messages, a migrated
/// client-side document.
pub fn populate_variety(con: &mut redis::Connection, prefix: &str) -> Vec<String> {
    let k = |s: &str| format!("{prefix}:{s}");
    let mut keys = Vec::new();

    let plain = k("plain");
    for i in 0..8 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        ok(
            con,
            &[
                "MEM.APPEND",
                &plain,
                role,
                &format!("plain message {i} héllo wörld 🚀"),
            ],
        );
    }
    keys.push(plain);

    let meta = k("meta");
    ok(
        con,
        &[
            "MEM.APPEND",
            &meta,
            "system",
            "You are terse.",
            "TS",
            "1700000000000",
        ],
    );
    ok(
        con,
        &[
            "MEM.APPEND",
            &meta,
            "assistant",
            "",
            "META",
            r#"{"tool_calls":[{"id":"c1","name":"f","arguments":"{\"a\":1}"}]}"#,
        ],
    );
    ok(
        con,
        &[
            "MEM.APPEND",
            &meta,
            "tool",
            "42",
            "META",
            r#"{"tool_call_id":"c1","name":"f"}"#,
        ],
    );
    ok(
        con,
        &[
            "MEM.APPEND",
            &meta,
            "user",
            "thanks",
            "META",
            "{}",
            "TTL",
            "5000",
        ],
    );
    keys.push(meta);

    let summ = k("summary");
    for i in 0..15 {
        ok(
            con,
            &[
                "MEM.APPEND",
                &summ,
                "user",
                &format!("turn {i} of a long chat"),
            ],
        );
    }
    let check = as_fields(ok(con, &["MEM.SUMMARIZE_CHECK", &summ, "KEEP", "5"]));
    let upto = int_field(&check, "upto");
    ok(
        con,
        &[
            "MEM.SUMMARIZE",
            &summ,
            &upto.to_string(),
            "The user counted turns.",
        ],
    );
    ok(
        con,
        &["MEM.APPEND", &summ, "assistant", "after the summary"],
    );
    keys.push(summ);

    let ext = k("ext");
    ok(con, &["MEM.APPEND", &ext, "user", "with external ids"]);
    ok(con, &["MEM.EXTSET", &ext, "dify", "conv-123"]);
    ok(con, &["MEM.EXTSET", &ext, "n8n", "exec-9", "EX", "200000"]);
    keys.push(ext);

    let only_ext = k("onlyext");
    ok(
        con,
        &["MEM.EXTSET", &only_ext, "dify", "conv-only", "EX", "3600"],
    );
    keys.push(only_ext);

    let imp = k("import");
    let doc = r#"{"conversation_history":[{"role":"user","content":"hi from the old app","timestamp":"2024-05-01T10:00:00"},{"role":"assistant","content":"hello!","timestamp":"2024-05-01T10:00:01Z"}],"user_profile":{"name":"Ana","prefs":{"lang":"pt","tz":"Europe/Lisbon"}},"context":{"topic":"billing","n":[1,2,3]}}"#;
    ok(con, &["MEM.IMPORT", &imp, doc]);
    ok(
        con,
        &["MEM.APPEND", &imp, "user", "continuing after import"],
    );
    keys.push(imp);

    let ttl0 = k("ttl0");
    ok(
        con,
        &["MEM.APPEND", &ttl0, "user", "never expires", "TTL", "0"],
    );
    ok(con, &["MEM.APPEND", &ttl0, "assistant", "indeed"]);
    ok(con, &["MEM.EXTSET", &ttl0, "dify", "c-ttl0"]);
    keys.push(ttl0);

    let gpt4 = k("gpt4");
    ok(
        con,
        &["MEM.APPEND", &gpt4, "user", "counted with o200k first"],
    );
    ok(
        con,
        &[
            "MEM.APPEND",
            &gpt4,
            "assistant",
            "then cl100k",
            "MODEL",
            "gpt-4",
        ],
    );
    ok(
        con,
        &[
            "MEM.APPEND",
            &gpt4,
            "user",
            "claude now",
            "MODEL",
            "claude-3-5-sonnet",
        ],
    );
    keys.push(gpt4);

    let trimmed = k("trimmed");
    for i in 0..12 {
        let role = if i % 3 == 2 { "tool" } else { "user" };
        ok(
            con,
            &[
                "MEM.APPEND",
                &trimmed,
                role,
                &format!("trim me {i}"),
                "MAXMSGS",
                "5",
            ],
        );
    }
    keys.push(trimmed);

    let roundtrip = k("roundtrip");
    let exported = json_text(con, &keys[2]);
    ok(con, &["MEM.IMPORT", &roundtrip, &exported, "TTL", "0"]);
    keys.push(roundtrip);

    for key in &keys {
        check_consistent(con, key);
    }
    keys
}

/// Splits a DUMP reply into (payload, rdb version bytes) after checking its
/// footer.
pub fn split_dump(dump: &[u8]) -> (&[u8], [u8; 2]) {
    assert!(dump.len() > 10);
    let (body, crc) = dump.split_at(dump.len() - 8);
    assert_eq!(
        u64::from_le_bytes(crc.try_into().unwrap()),
        crc64(body),
        "DUMP checksum"
    );
    let (payload, ver) = body.split_at(body.len() - 2);
    (payload, [ver[0], ver[1]])
}

pub fn crc64(bytes: &[u8]) -> u64 {
    crc::Crc::<u64>::new(&crc::CRC_64_REDIS).checksum(bytes)
}

/// A DUMP payload with a valid footer (so RESTORE reaches the module loader).
pub fn with_footer(payload: &[u8], ver: [u8; 2]) -> Vec<u8> {
    let mut out = payload.to_vec();
    out.extend_from_slice(&ver);
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Reads an RDB length: (value, bytes used, is_special_encoding).
fn rdb_len(b: &[u8]) -> (u64, usize, bool) {
    match b[0] >> 6 {
        0 => ((b[0] & 0x3f) as u64, 1, false),
        1 => ((((b[0] & 0x3f) as u64) << 8) | b[1] as u64, 2, false),
        2 if b[0] == 0x80 => (
            u32::from_be_bytes(b[1..5].try_into().unwrap()) as u64,
            5,
            false,
        ),
        2 => (u64::from_be_bytes(b[1..9].try_into().unwrap()), 9, false),
        _ => ((b[0] & 0x3f) as u64, 1, true),
    }
}

/// The module's own payload (format byte + body) inside a DUMP taken with
/// `rdbcompression no`: type 7, module id, opcode 5 (string), the string.
pub fn module_payload(dump: &[u8]) -> Vec<u8> {
    let (payload, _) = split_dump(dump);
    assert_eq!(payload[0], 7, "not a module value (RDB_TYPE_MODULE_2)");
    let (_, n, _) = rdb_len(&payload[1..]);
    let mut at = 1 + n;
    let (opcode, n, _) = rdb_len(&payload[at..]);
    assert_eq!(opcode, 5, "module opcode string");
    at += n;
    let (len, n, special) = rdb_len(&payload[at..]);
    assert!(!special, "compressed string: set rdbcompression no");
    at += n;
    payload[at..at + len as usize].to_vec()
}

/// DUMP as bytes.
pub fn dump(con: &mut redis::Connection, key: &str) -> Vec<u8> {
    let v = cmd(con, &["DUMP", key]).unwrap();
    redis::from_redis_value::<Vec<u8>>(&v).unwrap()
}

/// Waits until `cond` holds (bounded), panicking with `what` otherwise.
pub fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_owned())
    })
}

/// An integer field of an INFO section (`memory`, `clients`...).
pub fn info_int(con: &mut redis::Connection, section: &str, field: &str) -> i64 {
    info_field(con, section, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no integer {field} in INFO {section}"))
}

/// Waits for a background AOF rewrite / save to finish.
pub fn wait_persistence_idle(con: &mut redis::Connection) {
    wait_until("persistence idle", 60, || {
        info_field(con, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(con, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
            && info_field(con, "persistence", "rdb_bgsave_in_progress").as_deref() == Some("0")
    });
}

/// The first consistency problem of `key`, if any (panics inside count as
/// problems too).
pub fn consistency_problem(con: &mut redis::Connection, key: &str) -> Option<String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| try_consistent(con, key))) {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e),
        Err(p) => Some(format!(
            "{key}: consistency check panicked: {}",
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

// ---- AOF files written by hand -------------------------------------------

/// One command in the RESP form an AOF holds.
pub fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A server that loads `commands` from an AOF at start: the path (with the
/// master link) on which the internal commands run, so crafted payloads can
/// reach them. An old-style `appendonly.aof`, which Redis 7 adopts as the
/// base of its AOF directory.
pub fn server_loading_aof(commands: &[Vec<Vec<u8>>]) -> Server {
    let mut server = Server::start();
    let mut aof = Vec::new();
    for c in commands {
        let refs: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
        aof.extend(resp_command(&refs));
    }
    std::fs::write(server.dir.join("appendonly.aof"), aof).unwrap();
    server.restart_with(&["--appendonly", "yes"]);
    server
}

/// The errors commands replied while the AOF loaded: Redis 7.0 logs each
/// (`== CRITICAL == ... sending an error to its AOF-loading-client`), skips
/// the command and loads on (`propagation-error-behavior ignore`).
pub fn aof_load_errors(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("AOF-loading-client"))
        .map(str::to_owned)
        .collect()
}
