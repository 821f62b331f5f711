//! MAXAGE ("keep only the last N days"): every write evicts the messages
//! older than now - maxage, wherever they are; reads hide them before any
//! write; the tool rule; replicas, DEBUG RELOAD and mem.max-age.
//!
//! Old messages are made with explicit TS values in the past rather than
//! long sleeps; the only wait is a second or so for a read-time test.

use std::time::Duration;

use crate::support::server::*;
use crate::support::session::{digest, json_text, ok};

/// The server's clock in ms (TIME), so TS values are relative to it.
fn server_ms(con: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).unwrap();
    secs * 1000 + micros / 1000
}

fn append(
    con: &mut redis::Connection,
    key: &str,
    role: &str,
    ts: i64,
    extra: &[&str],
) -> Vec<(String, redis::Value)> {
    let ts = ts.to_string();
    let mut args = vec!["MEM.APPEND", key, role, "text", "TS", &ts];
    args.extend_from_slice(extra);
    map_reply(con, &args)
}

/// The ids MEM.GET returns (RESP), with its options.
fn ids(con: &mut redis::Connection, key: &str, opts: &[&str]) -> Vec<i64> {
    let mut args = vec!["MEM.GET", key];
    args.extend_from_slice(opts);
    let v = cmd(con, &args).unwrap();
    let redis::Value::Array(items) = v else {
        panic!("{v:?}")
    };
    items
        .into_iter()
        .map(|m| int_field(&as_fields(m), "id"))
        .collect()
}

fn json_ids(con: &mut redis::Connection, key: &str) -> Vec<i64> {
    let doc: serde_json::Value = serde_json::from_str(&json_text(con, key)).unwrap();
    doc["conversation_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect()
}

const HOUR_MS: i64 = 3_600_000;

#[test]
fn writes_evict_old_messages_wherever_they_are() {
    let server = Server::start();
    let mut con = server.client();
    let now = server_ms(&mut con);
    let old = now - 2 * HOUR_MS;
    append(&mut con, "s", "user", now, &["MAXAGE", "3600"]);
    // Its own append never evicts a message, even an old one.
    let r = append(&mut con, "s", "user", old, &[]);
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (0, 2)
    );
    // The next write evicts it, though a newer message comes before it.
    let r = append(&mut con, "s", "assistant", now - 1000, &[]);
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (1, 2)
    );
    append(&mut con, "s", "user", old - 5, &[]);
    let r = append(&mut con, "s", "user", now, &[]);
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (1, 3)
    );
    assert_eq!(ids(&mut con, "s", &[]), vec![1, 3, 5]);
    let info = map_reply(&mut con, &["MEM.INFO", "s"]);
    assert_eq!(
        int_field(&info, "total_tokens"),
        int_field(&r, "total_tokens")
    );
    assert_eq!(info_mem(&mut con, "messages_trimmed"), 2);
    // MAXAGE 0: no limit any more.
    append(&mut con, "s", "user", old, &["MAXAGE", "0"]);
    let r = append(&mut con, "s", "user", now, &[]);
    assert_eq!(int_field(&r, "trimmed"), 0);
}

#[test]
fn an_old_tool_call_goes_with_its_results() {
    let server = Server::start();
    let mut con = server.client();
    let now = server_ms(&mut con);
    let old = now - 2 * HOUR_MS;
    append(&mut con, "t", "user", now, &["MAXAGE", "3600"]);
    append(&mut con, "t", "assistant", old, &[]);
    // An old result keeps its old call while it is the newest message...
    let r = append(&mut con, "t", "tool", old, &[]);
    assert_eq!(int_field(&r, "trimmed"), 0);
    // ... and reads already hide both; the next write evicts both.
    assert_eq!(ids(&mut con, "t", &[]), vec![1]);
    let r = append(&mut con, "t", "user", now, &[]);
    assert_eq!(int_field(&r, "trimmed"), 2);
    assert_eq!(ids(&mut con, "t", &[]), vec![1, 4]);
    // A group with a result still young stays whole (SPEC v3: a result
    // never ages out on its own, nor its call while it is held).
    let batch = format!(
        r#"[{{"role":"assistant","content":"c","ts":{old}}},{{"role":"tool","content":"r1","ts":{now}}},{{"role":"tool","content":"r2","ts":{now}}},{{"role":"user","content":"q","ts":{now}}}]"#
    );
    ok(&mut con, &["MEM.APPENDBATCH", "t", &batch]);
    assert_eq!(ids(&mut con, "t", &[]), vec![1, 4, 5, 6, 7, 8]);
    // All of it old: it leaves whole.
    let batch = format!(
        r#"[{{"role":"assistant","content":"c","ts":{old}}},{{"role":"tool","content":"r1","ts":{old}}},{{"role":"tool","content":"r2","ts":{old}}},{{"role":"user","content":"q","ts":{now}}}]"#
    );
    ok(&mut con, &["MEM.APPENDBATCH", "t", &batch]);
    assert_eq!(ids(&mut con, "t", &[]), vec![1, 4, 5, 6, 7, 8, 12]);
}

#[test]
fn reads_hide_messages_once_they_are_old_without_a_write() {
    let server = Server::start();
    let mut con = server.client();
    let now = server_ms(&mut con);
    // Message 2 is 1 s old and the limit 2 s: it turns old in about a
    // second, in the middle of the history (1 and 3 carry later times).
    append(
        &mut con,
        "r",
        "user",
        now + 60_000,
        &["MAXAGE", "2", "TTL", "0"],
    );
    append(&mut con, "r", "assistant", now - 1000, &[]);
    let r3 = append(&mut con, "r", "user", now + 60_000, &[]);
    assert_eq!(ids(&mut con, "r", &[]), vec![1, 2, 3]);
    let before = digest(&mut con, "r");
    std::thread::sleep(Duration::from_millis(1300));
    assert_eq!(ids(&mut con, "r", &[]), vec![1, 3]);
    assert_eq!(ids(&mut con, "r", &["LAST", "5"]), vec![1, 3]);
    assert_eq!(ids(&mut con, "r", &["AFTER", "1"]), vec![3]);
    assert_eq!(ids(&mut con, "r", &["BUDGET", "100000"]), vec![1, 3]);
    assert_eq!(json_ids(&mut con, "r"), vec![1, 3]);
    let doc: serde_json::Value = serde_json::from_str(&json_text(&mut con, "r")).unwrap();
    let tokens = 2 * int_field(&r3, "tokens");
    assert_eq!(doc["total_tokens"].as_i64(), Some(tokens));
    let info = map_reply(&mut con, &["MEM.INFO", "r"]);
    assert_eq!(
        (int_field(&info, "messages"), int_field(&info, "first_id")),
        (2, 1)
    );
    assert_eq!(int_field(&info, "total_tokens"), tokens);
    let check = map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", "r", "KEEP", "1"]);
    assert_eq!(
        (int_field(&check, "messages"), int_field(&check, "upto")),
        (2, 1)
    );
    let e = cmd(&mut con, &["MEM.SUMMARIZE", "r", "2", "sum"]).unwrap_err();
    assert!(e.to_string().contains("not the id of a message"), "{e}");
    // Reads and the refusal changed nothing: the session still holds it.
    assert_eq!(digest(&mut con, "r"), before);
    let r = map_reply(&mut con, &["MEM.SUMMARIZE", "r", "1", "sum"]);
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (1, 1)
    );
    assert_eq!(ids(&mut con, "r", &["AFTER", "0"]), vec![3]);
}

#[test]
fn other_writes_evict_too() {
    let server = Server::start();
    let mut con = server.client();
    let now = server_ms(&mut con);
    let old = now - 2 * HOUR_MS;
    for key in ["e", "a"] {
        append(&mut con, key, "user", old, &["MAXAGE", "3600"]);
        append(&mut con, key, "user", now, &[]);
    }
    ok(&mut con, &["MEM.EXTSET", "e", "dify", "c1"]);
    ok(&mut con, &["MEM.ATTRSET", "a", "context", "{}"]);
    for key in ["e", "a"] {
        let info = map_reply(&mut con, &["MEM.INFO", key]);
        assert_eq!(
            (int_field(&info, "messages"), int_field(&info, "first_id")),
            (1, 2),
            "{key}"
        );
        assert_eq!(json_ids(&mut con, key), vec![2]);
    }
    assert_eq!(info_mem(&mut con, "messages_trimmed"), 2);
}

#[test]
fn mem_max_age_is_the_default_and_maxage_is_bounded() {
    let server = Server::start();
    let mut con = server.client();
    assert_eq!(
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("mem.max-age")
            .query::<Vec<String>>(&mut con)
            .unwrap(),
        vec!["mem.max-age".to_owned(), "0".to_owned()]
    );
    ok(&mut con, &["CONFIG", "SET", "mem.max-age", "3600"]);
    assert!(cmd(&mut con, &["CONFIG", "SET", "mem.max-age", "-1"]).is_err());
    assert!(cmd(&mut con, &["CONFIG", "SET", "mem.max-age", "3153600001"]).is_err());
    let now = server_ms(&mut con);
    append(&mut con, "d", "user", now - 2 * HOUR_MS, &[]);
    let r = append(&mut con, "d", "user", now, &[]);
    assert_eq!(int_field(&r, "trimmed"), 1);
    // The setting stays with the session when the default changes.
    ok(&mut con, &["CONFIG", "SET", "mem.max-age", "0"]);
    append(&mut con, "d", "user", now - 2 * HOUR_MS, &[]);
    assert_eq!(
        int_field(&append(&mut con, "d", "user", now, &[]), "trimmed"),
        1
    );
    for bad in ["-1", "x", "3153600001", "99999999999999999999"] {
        let before = digest(&mut con, "d");
        let e = cmd(&mut con, &["MEM.APPEND", "d", "user", "x", "MAXAGE", bad]).unwrap_err();
        assert!(e.to_string().contains("MAXAGE"), "{bad}: {e}");
        assert_eq!(digest(&mut con, "d"), before);
    }
    let e = cmd(
        &mut con,
        &["MEM.APPEND", "d", "user", "x", "MAXAGE", "1", "MAXAGE", "2"],
    )
    .unwrap_err();
    assert!(e.to_string().to_lowercase().contains("maxage"), "{e}");
    let e = cmd(
        &mut con,
        &[
            "MEM.APPENDBATCH",
            "d",
            r#"[{"role":"user","content":"x"}]"#,
            "MAXAGE",
            "-1",
        ],
    )
    .unwrap_err();
    assert!(e.to_string().contains("MAXAGE"), "{e}");
}

#[test]
fn replicas_and_reloads_evict_the_same() {
    let master = Server::with_args(&["--repl-diskless-sync-delay", "0"]);
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let now = server_ms(&mut con);
    let old = now - 2 * HOUR_MS;
    append(&mut con, "m", "user", now, &["MAXAGE", "3600"]);
    append(&mut con, "m", "assistant", old, &[]);
    append(&mut con, "m", "tool", old, &[]);
    append(&mut con, "m", "user", old, &[]);
    append(&mut con, "m", "user", now, &[]);
    ok(&mut con, &["MEM.EXTSET", "m", "dify", "c"]);
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    assert_eq!(n, 1);
    assert_eq!(ids(&mut con, "m", &[]), vec![1, 5]);
    assert_eq!(digest(&mut rcon, "m"), digest(&mut con, "m"));
    assert_eq!(json_text(&mut rcon, "m"), json_text(&mut con, "m"));
    // The setting is stored: after a reload a write still evicts by age.
    let before = digest(&mut con, "m");
    ok(&mut con, &["DEBUG", "RELOAD"]);
    assert_eq!(digest(&mut con, "m"), before);
    append(&mut con, "m", "user", old, &[]);
    assert_eq!(
        int_field(&append(&mut con, "m", "user", now, &[]), "trimmed"),
        1
    );
    let n: i64 = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    assert_eq!(n, 1);
    assert_eq!(digest(&mut rcon, "m"), digest(&mut con, "m"));
}

#[test]
fn an_import_drops_what_is_past_maxage_before_the_caps() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "mem.max-age", "3600"]);
    ok(&mut con, &["CONFIG", "SET", "mem.max-messages", "3"]);
    let now = server_ms(&mut con);
    let old = now - 7_200_000;
    let doc = serde_json::json!({"conversation_history": [
        {"role": "user", "content": "new 1", "ts": now - 5000},
        {"role": "assistant", "content": "", "ts": old, "meta": {"tool_calls": [{"id": "c"}]}},
        {"role": "tool", "content": "result of an old call", "ts": old, "meta": {"tool_call_id": "c"}},
        {"role": "user", "content": "new 2", "ts": now - 3000},
        {"role": "user", "content": "old", "ts": old},
        {"role": "assistant", "content": "new 3", "ts": now - 2000},
    ]});
    let r = map_reply(&mut con, &["MEM.IMPORT", "mem:{imp}", &doc.to_string()]);
    // The old call and its result, and the old message, go first; the caps
    // (3) then keep all three new ones; ids stay those of the document order.
    assert_eq!(json_ids(&mut con, "mem:{imp}"), vec![1, 4, 6]);
    assert_eq!(int_field(&r, "trimmed"), 3);
    // Streamed off the main thread, the same result.
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.async-threshold-bytes", "100"],
    );
    map_reply(&mut con, &["MEM.IMPORT", "mem:{imp2}", &doc.to_string()]);
    assert_eq!(json_ids(&mut con, "mem:{imp2}"), vec![1, 4, 6]);
}

/// MAXAGE against leases and MSGID retries: MEM.SUMMARIZE_BEGIN and a
/// retry's reply count only the messages not past maxage (defects found
/// in the v2 review).
mod with_leases_and_retries {
    use crate::support::reply::*;
    use crate::support::server::*;
    use std::time::Duration;

    fn fields(con: &mut redis::Connection, args: &[&str]) -> Vec<(String, redis::Value)> {
        as_fields(ok(con, args))
    }

    /// SPEC MAXAGE: "reads never return them, even before the next write";
    /// SUMMARIZE_BEGIN is "the MEM.SUMMARIZE_CHECK map plus lease". Today
    /// MEM.SUMMARIZE_BEGIN (src/commands/lease.rs:31, `session.begin` on the raw
    /// session, not `session.live(now)`) counts messages past maxage, reports
    /// summarize 1 / messages 30 where MEM.SUMMARIZE_CHECK says 0 / 0, and grants
    /// a lease for an `upto` that MEM.SUMMARIZE then refuses (the id was aged
    /// out): the worker makes an LLM call for nothing and the lease blocks.
    #[test]
    fn summarize_begin_counts_messages_past_maxage() {
        let server = Server::start();
        let mut con = server.client();
        let k = "mem:{aged-begin}";
        for i in 1..=30 {
            append(&mut con, k, "user", &format!("m{i}"), &["MAXAGE", "1"]);
        }
        std::thread::sleep(Duration::from_millis(1300));
        let check = fields(&mut con, &["MEM.SUMMARIZE_CHECK", k]);
        assert_eq!(int_field(&check, "messages"), 0);
        let begin = fields(&mut con, &["MEM.SUMMARIZE_BEGIN", k, "60000"]);
        let mismatch = [
            "summarize",
            "total_tokens",
            "messages",
            "upto",
            "upto_tokens",
        ]
        .iter()
        .filter(|f| int_field(&begin, f) != int_field(&check, f))
        .map(|f| {
            format!(
                "{f}: check {} begin {}",
                int_field(&check, f),
                int_field(&begin, f)
            )
        })
        .collect::<Vec<_>>();
        let lease = int_field(&begin, "lease");
        let upto = int_field(&begin, "upto");
        let committed = if lease > 0 {
            cmd(
                &mut con,
                &[
                    "MEM.SUMMARIZE",
                    k,
                    &upto.to_string(),
                    "sum",
                    "LEASE",
                    &lease.to_string(),
                ],
            )
            .map(drop)
            .map_err(|e| e.to_string())
        } else {
            Ok(())
        };
        assert!(
            mismatch.is_empty() && committed.is_ok(),
            "SUMMARIZE_BEGIN disagrees with SUMMARIZE_CHECK on a session whose messages are past maxage: {mismatch:?}; lease {lease} for upto {upto}, MEM.SUMMARIZE with it: {committed:?}"
        );
    }

    /// SPEC MSGID: a retry's reply carries "the session's current totals"; MAXAGE:
    /// reads never return aged messages. Today the duplicate reply
    /// (src/commands/write.rs:56 -> Session::duplicate_outcome, retry.rs, on the
    /// raw session) reports the messages past maxage: `messages 30`,
    /// `total_tokens 180`, `summarize 1`, while MEM.INFO says 0 / 0.
    #[test]
    fn retry_reply_counts_messages_past_maxage() {
        let server = Server::start();
        let mut con = server.client();
        let k = "mem:{aged-retry}";
        for i in 1..=30 {
            append(
                &mut con,
                k,
                "user",
                &format!("m{i}"),
                &["MAXAGE", "1", "MSGID", &format!("q{i}")],
            );
        }
        std::thread::sleep(Duration::from_millis(1300));
        let inf = info(&mut con, k);
        let r = append(&mut con, k, "user", "m30", &["MSGID", "q30"]);
        assert_eq!(int_field(&r, "duplicate"), 1);
        assert_eq!(
            (
                int_field(&r, "messages"),
                int_field(&r, "total_tokens"),
                int_field(&r, "summarize")
            ),
            (
                int_field(&inf, "messages"),
                int_field(&inf, "total_tokens"),
                0
            ),
            "a retry's reply shows messages past maxage that MEM.INFO/MEM.GET no longer show"
        );
    }
}
