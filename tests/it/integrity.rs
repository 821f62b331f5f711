//! No crash, no data destroyed, no half-applied write (SPEC §5 v3), against
//! real servers: a NUL in string configs, Redis's integer syntax, the
//! summary entry marked, lease tokens unique across a key name's lifetimes,
//! read access of MEM.SUMMARIZE_BEGIN's key spec, FORMAT JSON -> MEM.IMPORT
//! giving back the whole session, imports that keep a long history whole,
//! numeric timestamps, and replicas keeping diskless async loading.

use crate::support::reply::*;
use crate::support::rng::Rng;
use crate::support::server::*;
use redis::Value;
use serde_json::{json, Value as Json};

fn config_set_bytes(
    con: &mut redis::Connection,
    name: &str,
    value: &[u8],
) -> redis::RedisResult<Value> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
}

#[test]
fn a_nul_or_control_byte_in_a_string_config_is_refused_and_config_get_survives() {
    let mut server = Server::start();
    let mut con = server.client();
    for name in ["mem.default-model", "mem.models"] {
        let before = config_get(&mut con, name);
        for bad in [
            &b"a\0b"[..],
            b"\0",
            b"gpt-4o\x01",
            b"m=o200k_base:1000\0",
            "gpt-4o\u{2028}".as_bytes(),
            "gpt\u{85}4o".as_bytes(),
        ] {
            let e = config_set_bytes(&mut con, name, bad).expect_err("a NUL is refused");
            assert!(
                err_text(&e).contains("control characters"),
                "{name}: {}",
                err_text(&e)
            );
            assert_eq!(config_get(&mut con, name), before, "{name} unchanged");
        }
    }
    // A table error that quotes the value never carries a NUL to the crate.
    let e = config_set_bytes(&mut con, "mem.models", b"bad entry").expect_err("malformed");
    assert!(!err_text(&e).contains('\0'));
    // What every monitoring agent runs, and the module's own names.
    let all: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("*")
        .query(&mut con)
        .unwrap();
    assert!(all.iter().any(|n| n == "mem.default-model"));
    let _: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("mem.*")
        .query(&mut con)
        .unwrap();
    // Separators of mem.models (tab, newline) stay allowed.
    ok(
        &mut con,
        &[
            "CONFIG",
            "SET",
            "mem.models",
            "a-llm=qwen2:1000\tb-llm=llama3:2000\nc-*=default:0",
        ],
    );
    assert!(config_get(&mut con, "mem.models").contains("b-llm"));
    assert!(server.is_alive(), "the server survived");
    // A loadmodule argument with a control byte is refused at start, not a crash
    // of a running server: checked through CONFIG SET above (same setter).
}

#[test]
fn numbers_follow_redis_integer_syntax() {
    let server = Server::start();
    let mut con = server.client();
    append(&mut con, "k", "user", "hello", &[]);
    let before = snap(&mut con, "k");
    for bad in [
        "01",
        "+1",
        " 5",
        "5 ",
        "-0",
        "0x10",
        "1e3",
        "",
        "-1",
        "18446744073709551616",
    ] {
        for args in [
            vec!["MEM.GET", "k", "LAST", bad],
            vec!["MEM.APPEND", "k", "user", "x", "TTL", bad],
            vec!["MEM.APPEND", "k", "user", "x", "MAXMSGS", bad],
            vec!["MEM.SUMMARIZE_BEGIN", "k", bad],
            vec!["MEM.SUMMARIZE", "k", bad, "text"],
        ] {
            let e = err(&mut con, &args);
            assert!(
                e.contains("not an integer or out of range"),
                "{args:?}: {e}"
            );
        }
    }
    assert_unchanged(&mut con, "k", &before, "refused numbers");
    // Redis's own rule, for comparison: EXPIRE refuses 010 too.
    assert!(err(&mut con, &["EXPIRE", "k", "010"]).contains("not an integer"));
    // 0 itself and plain numbers are fine.
    assert_eq!(get(&mut con, &["MEM.GET", "k", "LAST", "0"]).len(), 0);
    assert_eq!(get(&mut con, &["MEM.GET", "k", "LAST", "10"]).len(), 1);
}

#[test]
fn the_summary_entry_is_marked_and_a_summary_role_message_is_not() {
    let server = Server::start();
    for resp3 in [false, true] {
        let mut con = if resp3 {
            server.client_resp3()
        } else {
            server.client()
        };
        let k = format!("mark{resp3}");
        append(&mut con, &k, "user", "one", &[]);
        append(&mut con, &k, "user", "two", &[]);
        ok(&mut con, &["MEM.SUMMARIZE", &k, "1", "the real summary"]);
        append(
            &mut con,
            &k,
            "summary",
            "a message whose role is summary",
            &[],
        );
        let Value::Array(items) = ok(&mut con, &["MEM.GET", &k]) else {
            panic!()
        };
        let entries: Vec<Vec<(String, Value)>> = items.into_iter().map(as_fields).collect();
        let marked: Vec<bool> = entries
            .iter()
            .map(|f| f.iter().any(|(n, _)| n == "summary"))
            .collect();
        assert_eq!(marked, [true, false, false], "resp3={resp3}");
        assert_eq!(int_field(&entries[0], "summary"), 1);
        assert_eq!(str_field(&entries[0], "content"), "the real summary");
        assert_eq!(str_field(&entries[2], "role"), "summary");
    }
}

#[test]
fn a_lease_token_is_never_granted_twice_for_a_key_name() {
    let server = Server::with_args(&["--appendonly", "yes"]);
    let mut con = server.client();
    let k = "mem:{lease}";
    let ready = |con: &mut redis::Connection| {
        for i in 0..10 {
            append(con, k, "user", &format!("turn {i}"), &["MAXMSGS", "10"]);
        }
    };
    let lease = |con: &mut redis::Connection| {
        int_field(
            &map_reply(con, &["MEM.SUMMARIZE_BEGIN", k, "60000", "KEEP", "2"]),
            "lease",
        )
    };
    ready(&mut con);
    let dumped = redis::cmd("DUMP")
        .arg(k)
        .query::<Vec<u8>>(&mut con)
        .unwrap();
    let mut stale = vec![lease(&mut con)];
    // Every way a key name gets a new lifetime.
    let remakes: [&dyn Fn(&mut redis::Connection); 4] = [
        &|c| {
            ok(c, &["DEL", k]);
        },
        &|c| {
            let doc = json_text(c, k);
            ok(c, &["MEM.IMPORT", k, &doc, "REPLACE"]);
        },
        &|c| {
            ok(c, &["PEXPIRE", k, "1"]);
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(int(c, &["EXISTS", k]), 0);
        },
        &|c| {
            let _: Value = redis::cmd("RESTORE")
                .arg(k)
                .arg(0)
                .arg(&dumped)
                .arg("REPLACE")
                .query(c)
                .unwrap();
        },
    ];
    for remake in remakes {
        remake(&mut con);
        if int(&mut con, &["EXISTS", k]) == 0 || int_field(&info(&mut con, k), "messages") < 10 {
            ready(&mut con);
        }
        let fresh = lease(&mut con);
        assert!(
            fresh > 0 && stale.iter().all(|t| *t < fresh),
            "{stale:?} then {fresh}"
        );
        for t in &stale {
            let e = err(
                &mut con,
                &[
                    "MEM.SUMMARIZE",
                    k,
                    "8",
                    "stale summary",
                    "LEASE",
                    &t.to_string(),
                ],
            );
            assert!(e.starts_with("LEASED"), "stale token {t}: {e}");
        }
        stale.push(fresh);
        // The current worker commits.
        let upto = int_field(&check(&mut con, k, &["KEEP", "2"]), "upto").to_string();
        ok(
            &mut con,
            &["MEM.SUMMARIZE", k, &upto, "s", "LEASE", &fresh.to_string()],
        );
    }
}

#[test]
fn a_write_only_user_cannot_read_through_a_write() {
    let server = Server::start();
    let mut con = server.client();
    for i in 0..10 {
        append(
            &mut con,
            "mem:{w}",
            "user",
            &format!("turn {i}"),
            &["MAXMSGS", "10"],
        );
    }
    ok(
        &mut con,
        &["ACL", "SETUSER", "writer", "on", ">pw", "%W~mem:*", "+@all"],
    );
    ok(
        &mut con,
        &["ACL", "SETUSER", "reader", "on", ">pw", "%R~mem:*", "+@all"],
    );
    let mut w = server.client();
    ok(&mut w, &["AUTH", "writer", "pw"]);
    // Writes whose reply shows stored data (a retry's original id and
    // tokens, the session's totals, the check map) declare read access,
    // as INCR does.
    for args in [
        vec!["MEM.SUMMARIZE_BEGIN", "mem:{w}", "1000"],
        vec!["MEM.SUMMARIZE_CHECK", "mem:{w}"],
        vec!["MEM.GET", "mem:{w}"],
        vec!["MEM.INFO", "mem:{w}"],
        vec!["MEM.APPEND", "mem:{w}", "user", "x", "MSGID", "m1"],
        vec![
            "MEM.APPENDBATCH",
            "mem:{w}",
            r#"[{"role":"user","content":"x"}]"#,
        ],
        vec!["MEM.SUMMARIZE", "mem:{w}", "1", "s"],
    ] {
        assert!(
            err(&mut w, &args).starts_with("NOPERM"),
            "{args:?} by a write-only user"
        );
    }
    // Writes that reply OK or a count stay open to it.
    ok(&mut w, &["MEM.EXTSET", "mem:{w}", "dify", "c1"]);
    ok(&mut w, &["MEM.ATTRSET", "mem:{w}", "p", "1"]);
    // A read-only user may not take a lease (a write).
    let mut r = server.client();
    ok(&mut r, &["AUTH", "reader", "pw"]);
    assert!(err(&mut r, &["MEM.SUMMARIZE_BEGIN", "mem:{w}", "1000"]).starts_with("NOPERM"));
    // The key spec says so.
    let Value::Array(keys) = ok(
        &mut con,
        &[
            "COMMAND",
            "GETKEYSANDFLAGS",
            "MEM.SUMMARIZE_BEGIN",
            "mem:{w}",
            "1000",
        ],
    ) else {
        panic!()
    };
    let flags = format!("{keys:?}");
    assert!(
        flags.contains("access") && flags.contains("RW") && flags.contains("update"),
        "{flags}"
    );
}

/// Everything a FORMAT JSON document says of a session, but its timestamps
/// of creation (not in the document).
fn session_facts(con: &mut redis::Connection, key: &str) -> (Json, Vec<(String, Value)>, i64) {
    let mut doc = json_doc(con, key);
    doc.as_object_mut().unwrap().remove("x");
    let mut i = info(con, key);
    i.retain(|(n, _)| !matches!(n.as_str(), "created" | "updated"));
    (doc, i, int(con, &["PTTL", key]))
}

#[test]
fn format_json_then_import_gives_back_the_whole_session() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{a}";
    for i in 0..45 {
        append(
            &mut con,
            k,
            "user",
            &format!("turn {i}"),
            &[
                "MAXMSGS",
                "40",
                "MAXTOKENS",
                "90000",
                "TTL",
                "5000",
                "MAXAGE",
                "86400",
                "MSGID",
                &format!("m{i}"),
            ],
        );
    }
    // A provider's count (TOKENS) survives the round trip: it is not recounted.
    append(
        &mut con,
        k,
        "assistant",
        "a reply the provider counted",
        &["TOKENS", "412"],
    );
    ok(&mut con, &["MEM.EXTSET", k, "dify", "conv-1", "EX", "3000"]);
    ok(&mut con, &["MEM.EXTSET", k, "n8n", "exec-9", "EX", "9000"]);
    ok(
        &mut con,
        &["MEM.ATTRSET", k, "user_profile", r#"{"name":"Ann"}"#],
    );
    let doc = json_doc(&mut con, k);
    let stored = &doc["redis_mem"];
    assert_eq!(
        (
            stored["ttl"].clone(),
            stored["maxmsgs"].clone(),
            stored["maxtokens"].clone(),
            stored["maxage"].clone()
        ),
        (json!(5000), json!(40), json!(90000), json!(86400))
    );
    assert_eq!(stored["external"]["dify"]["id"], "conv-1");
    assert_eq!(
        stored["departed_msgids"].as_array().unwrap().len(),
        6,
        "m0..m5 left"
    );
    // Two reads of an unchanged session give the same document.
    assert_eq!(json_text(&mut con, k), json_text(&mut con, k));

    let text = json_text(&mut con, k);
    ok(&mut con, &["MEM.IMPORT", "mem:{b}", &text]);
    let (a, ai, apttl) = session_facts(&mut con, k);
    let (b, bi, bpttl) = session_facts(&mut con, "mem:{b}");
    assert_eq!(a, b, "the imported document equals the exported one");
    assert_eq!(ai, bi, "MEM.INFO equal");
    assert_eq!(int_field(&bi, "messages"), 40, "not cut to the default 30");
    let newest = &b["conversation_history"][39];
    assert_eq!(
        (newest["tokens"].clone(), newest["role"].clone()),
        (json!(412), json!("assistant"))
    );
    // The key's expiry: the latest of the session TTL and the external ids.
    assert!(
        (apttl - bpttl).abs() < 2_000 && bpttl > 8_000_000,
        "{apttl} vs {bpttl}"
    );
    // A retry of a trimmed message is still recognised on the copy.
    let r = append(&mut con, "mem:{b}", "user", "turn 2", &["MSGID", "m2"]);
    assert_eq!(int_field(&r, "duplicate"), 1);
    assert_eq!(
        ok(&mut con, &["MEM.EXTGET", "mem:{b}", "n8n"]),
        Value::BulkString(b"exec-9".to_vec())
    );
    // Options still win over the document's settings.
    ok(
        &mut con,
        &["MEM.IMPORT", "mem:{c}", &text, "MAXMSGS", "10", "TTL", "60"],
    );
    assert_eq!(int_field(&info(&mut con, "mem:{c}"), "maxmsgs"), 10);
    assert_eq!(int_field(&info(&mut con, "mem:{c}"), "messages"), 10);
    assert_eq!(int_field(&info(&mut con, "mem:{c}"), "ttl"), 60);
}

#[test]
fn an_import_refuses_a_redis_mem_member_it_cannot_keep_and_changes_nothing() {
    let server = Server::with_module_args(&[], &["max-messages-limit", "500"]);
    let mut con = server.client();
    append(&mut con, "k", "user", "kept", &[]);
    let before = snap(&mut con, "k");
    let history = r#"[{"id":1,"role":"user","content":"a"},{"id":3,"role":"user","content":"b"}]"#;
    for member in [
        r#"{"maxmsgs":501}"#,
        r#"{"maxmsgs":0}"#,
        r#"{"ttl":3153600001}"#,
        r#"{"ttl":-1}"#,
        r#"{"external":{"":{"id":"x","expires":99999999999999}}}"#,
        r#"{"external":{"d":{"id":5,"expires":1}}}"#,
        r#"{"departed_msgids":[{"msgid":"x","id":1,"tokens":1}]}"#,
        r#"{"departed_msgids":[{"msgid":"x","id":4,"tokens":1}]}"#,
        r#"{"departed_msgids":[{"msgid":"x","id":2,"tokens":1},{"msgid":"x","id":2,"tokens":1}]}"#,
        r#"{"departed_msgids":[{"msgid":"","id":2,"tokens":1}]}"#,
        r#""not an object""#,
        r#"{"maxtoken":100}"#,
        r#"{"ttl":60,"ttl":70}"#,
    ] {
        let doc = format!(r#"{{"conversation_history":{history},"redis_mem":{member}}}"#);
        let e = err(&mut con, &["MEM.IMPORT", "k", &doc, "REPLACE"]);
        assert!(e.starts_with("ERR"), "{member}: {e}");
        assert_unchanged(&mut con, "k", &before, member);
    }
    // An expired external id is simply not carried.
    let doc = format!(
        r#"{{"conversation_history":{history},"redis_mem":{{"external":{{"old":{{"id":"x","expires":1}}}},"departed_msgids":[{{"msgid":"gone","id":2,"tokens":4}}]}}}}"#
    );
    ok(&mut con, &["MEM.IMPORT", "k2", &doc]);
    assert_eq!(ok(&mut con, &["MEM.EXTGET", "k2", "old"]), Value::Nil);
    assert_eq!(
        int_field(
            &append(&mut con, "k2", "user", "b", &["MSGID", "gone"]),
            "duplicate"
        ),
        1
    );
}

#[test]
fn a_long_history_imports_whole_with_maxmsgs_and_maxtokens() {
    let server = Server::start();
    let mut con = server.client();
    let history: Vec<Json> = (0..5000).map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message {i}")})).collect();
    let doc = json!({ "conversation_history": history }).to_string();
    let r = map_reply(
        &mut con,
        &[
            "MEM.IMPORT",
            "mem:{huge}",
            &doc,
            "MAXMSGS",
            "5000",
            "MAXTOKENS",
            "1000000",
        ],
    );
    assert_eq!(
        (int_field(&r, "messages"), int_field(&r, "trimmed")),
        (5000, 0)
    );
    assert_eq!(int_field(&info(&mut con, "mem:{huge}"), "maxmsgs"), 5000);
    // Without them: the caps (30) and the reply says what was dropped.
    let r = map_reply(&mut con, &["MEM.IMPORT", "mem:{cut}", &doc]);
    assert_eq!(
        (int_field(&r, "messages"), int_field(&r, "trimmed")),
        (30, 4970)
    );
    // Above the operator's limits: refused.
    assert!(err(
        &mut con,
        &["MEM.IMPORT", "mem:{x}", &doc, "MAXMSGS", "100001"]
    )
    .contains("mem.max-messages-limit"));
}

#[test]
fn numeric_timestamps_import_as_unix_seconds_or_milliseconds() {
    let server = Server::start();
    let mut con = server.client();
    let doc = r#"{"conversation_history":[
        {"role":"user","content":"int seconds","timestamp":1714557600},
        {"role":"user","content":"float seconds","timestamp":1714557600.5},
        {"role":"user","content":"ms","timestamp":1714557600123},
        {"role":"user","content":"iso","timestamp":"2024-05-01T10:00:00Z"}]}"#;
    ok(&mut con, &["MEM.IMPORT", "t", doc]);
    let ts: Vec<i64> = get(&mut con, &["MEM.GET", "t"])
        .iter()
        .map(|e| e.ts)
        .collect();
    assert_eq!(
        ts,
        [1714557600000, 1714557600500, 1714557600123, 1714557600000]
    );
    for bad in ["-5", "1e400", "\"yesterday\""] {
        let d = format!(
            r#"{{"conversation_history":[{{"role":"user","content":"x","timestamp":{bad}}}]}}"#
        );
        assert!(
            err(&mut con, &["MEM.IMPORT", "t2", &d]).starts_with("ERR"),
            "{bad}"
        );
    }
}

#[test]
fn a_replica_keeps_diskless_async_loading_with_the_module() {
    let master = Server::with_args(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let mut con = master.client();
    populated(&mut con, "mem:{r}");
    let replica = Server::with_args(&[
        "--repl-diskless-load",
        "swapdb",
        "--replicaof",
        "127.0.0.1",
        &master.port.to_string(),
    ]);
    let mut rcon = replica.client();
    poll_until(&mut rcon, "the replica to sync", |c| {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(c)
            .unwrap_or_default();
        info.contains("master_link_status:up") && int(c, &["EXISTS", "mem:{r}"]) == 1
    });
    let log = replica.log();
    assert!(
        !log.contains("Skipping diskless-load"),
        "the replica turned diskless load off:\n{log}"
    );

    assert_eq!(
        json_text(&mut rcon, "mem:{r}"),
        json_text(&mut con, "mem:{r}")
    );
    assert_eq!(digest(&mut rcon, "mem:{r}"), digest(&mut con, "mem:{r}"));
}

const CALL_AB: &str = r#"{"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"{}"}}]}"#;

#[test]
fn the_caps_never_break_a_tool_group() {
    let server = Server::start();
    let mut con = server.client();
    let batch = json!([
        {"role": "assistant", "content": "", "meta": serde_json::from_str::<Json>(CALL_AB).unwrap()},
        {"role": "tool", "content": "ra", "meta": {"tool_call_id": "a"}},
        {"role": "tool", "content": "rb", "meta": {"tool_call_id": "b"}},
    ])
    .to_string();
    ok(&mut con, &["MEM.APPENDBATCH", "b", &batch, "MAXMSGS", "2"]);
    let roles = |con: &mut redis::Connection, k: &str| -> Vec<String> {
        get(con, &["MEM.GET", k, "LAST", "5"])
            .into_iter()
            .map(|e| e.role)
            .collect()
    };
    // The group is held whole over the cap, until a later write.
    assert_eq!(roles(&mut con, "b"), ["assistant", "tool", "tool"]);
    append(&mut con, "b", "assistant", "Both done.", &[]);
    assert_eq!(roles(&mut con, "b"), ["assistant"]);
    // A lone append of the last result does the same.
    append(
        &mut con,
        "a",
        "assistant",
        "",
        &["META", CALL_AB, "MAXMSGS", "2"],
    );
    append(&mut con, "a", "tool", "ra", &[]);
    let r = append(&mut con, "a", "tool", "rb", &[]);
    assert_eq!(
        (int_field(&r, "messages"), int_field(&r, "trimmed")),
        (3, 0)
    );
    assert_eq!(roles(&mut con, "a"), ["assistant", "tool", "tool"]);
    // MAXTOKENS alike: a user turn, then a group bigger than the cap.
    append(&mut con, "t", "user", "hello there", &["MAXTOKENS", "40"]);
    append(&mut con, "t", "assistant", "", &["META", CALL_AB]);
    let big = "result ".repeat(60);
    let r = append(&mut con, "t", "tool", &big, &[]);
    assert_eq!(
        int_field(&r, "trimmed"),
        1,
        "the user turn goes, the group stays"
    );
    assert_eq!(roles(&mut con, "t"), ["assistant", "tool"]);
}

#[test]
fn maxage_never_separates_a_result_from_its_call() {
    let server = Server::start();
    let mut con = server.client();
    let k = "age";
    let now = now_ms();
    let old = (now - 10 * 86_400_000).to_string();
    append(&mut con, k, "user", "look it up", &["MAXAGE", "86400"]);
    append(&mut con, k, "assistant", "", &["META", CALL_AB]);
    append(&mut con, k, "tool", "r1", &["TS", &old]);
    append(&mut con, k, "tool", "r2", &[]);
    let roles = |con: &mut redis::Connection| -> Vec<String> {
        get(con, &["MEM.GET", k])
            .into_iter()
            .map(|e| e.role)
            .collect()
    };
    assert_eq!(
        roles(&mut con),
        ["user", "assistant", "tool", "tool"],
        "reads keep the group"
    );
    let r = append(&mut con, k, "assistant", "done", &[]);
    assert_eq!(int_field(&r, "trimmed"), 0);
    assert_eq!(
        roles(&mut con),
        ["user", "assistant", "tool", "tool", "assistant"]
    );
    // A whole group older than maxage leaves together.
    let g = "oldgroup";
    append(&mut con, g, "user", "q", &["MAXAGE", "86400"]);
    append(&mut con, g, "assistant", "", &["META", CALL_AB, "TS", &old]);
    append(&mut con, g, "tool", "r1", &["TS", &old]);
    append(&mut con, g, "tool", "r2", &["TS", &old]);
    let r = append(&mut con, g, "user", "next", &[]);
    assert_eq!(int_field(&r, "trimmed"), 3);
    let roles: Vec<String> = get(&mut con, &["MEM.GET", g])
        .into_iter()
        .map(|e| e.role)
        .collect();
    assert_eq!(roles, ["user", "user"]);
}

#[test]
fn building_encodings_never_evicts_a_key_nor_fails_a_write() {
    // A small maxmemory with an LRU policy: what Redis's own maxmemory tests
    // and a shared instance run. The module's tables (25-45 MB each) live
    // outside used_memory, so a keyless read by a user allowed only
    // MEM.COUNT evicts nothing.
    let server = Server::with_args(&["--maxmemory", "12mb", "--maxmemory-policy", "allkeys-lru"]);
    let mut con = server.client();
    assert_eq!(info_mem(&mut con, "module_memory_region"), 1);
    let used = |con: &mut redis::Connection| -> i64 {
        let info: String = redis::cmd("INFO").arg("memory").query(con).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    assert!(
        used(&mut con) < 4 << 20,
        "the default encoding is not in used_memory: {}",
        used(&mut con)
    );
    // Redis's own maxmemory unit starts so: a plain write on a fresh server.
    ok(&mut con, &["SETRANGE", "plain", "0", "x"]);
    for i in 0..300 {
        append(
            &mut con,
            &format!("mem:{{s{i}}}"),
            "user",
            &format!("session {i} remembers this"),
            &[],
        );
    }
    ok(
        &mut con,
        &[
            "ACL",
            "SETUSER",
            "counter",
            "on",
            ">pw",
            "-@all",
            "+mem.count",
        ],
    );
    let mut counter = server.client();
    ok(&mut counter, &["AUTH", "counter", "pw"]);
    // gpt-4: cl100k_base, whose tables were built outside the module's
    // memory by a first look at the encoding (17.7 MB of used_memory).
    for model in [
        "deepseek-chat",
        "qwen2.5-72b-instruct",
        "mistral-large-latest",
        "kimi-k2",
        "gpt-4",
    ] {
        let n = int(&mut counter, &["MEM.COUNT", model, "hi"]);
        assert!(n >= 1, "{model}");
    }
    // Counted again, now inline: the main thread's piece cache of each
    // encoding (96 KB) is the module's memory too (it was used_memory: ~1 MB
    // for the open-weight families evicted keys at a tight maxmemory).
    let before = used(&mut con);
    for model in [
        "deepseek-chat",
        "qwen2.5-72b-instruct",
        "mistral-large-latest",
        "kimi-k2",
    ] {
        int(&mut counter, &["MEM.COUNT", model, "hello again"]);
    }
    let grown = used(&mut con) - before;
    assert!(
        grown < 128 << 10,
        "inline counts grew used_memory by {grown} bytes"
    );
    let stats: String = redis::cmd("INFO").arg("stats").query(&mut con).unwrap();
    let evicted: i64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(evicted, 0, "building encodings evicted keys");
    assert_eq!(int(&mut con, &["DBSIZE"]), 301);
    // o200k_base and four open-weight encodings' counting tables: ~70 MB.
    assert!(
        info_mem(&mut con, "module_memory_bytes") > 48 << 20,
        "the tables are reported as the module's"
    );
    assert!(used(&mut con) < 8 << 20, "used_memory {}", used(&mut con));
    append(&mut con, "mem:{s0}", "user", "writes still succeed", &[]);
    ok(&mut con, &["SET", "after", "v"]);
}

#[test]
fn mem_encodings_restricts_what_may_be_built_and_counted() {
    let server = Server::with_module_args(&[], &["encodings", "o200k_base,cl100k_base"]);
    let mut con = server.client();
    assert_eq!(
        config_get(&mut con, "mem.encodings"),
        "o200k_base,cl100k_base"
    );
    let e = err(&mut con, &["MEM.COUNT", "deepseek-chat", "hi"]);
    assert!(e.contains("not in mem.encodings"), "{e}");
    let e = err(
        &mut con,
        &[
            "MEM.APPEND",
            "k",
            "user",
            "hi",
            "MODEL",
            "qwen2.5-72b-instruct",
        ],
    );
    assert!(e.contains("not in mem.encodings"), "{e}");
    assert_eq!(int(&mut con, &["EXISTS", "k"]), 0, "nothing written");
    let batch = r#"[{"role":"user","content":"hi"}]"#;
    assert!(err(
        &mut con,
        &["MEM.APPENDBATCH", "k", batch, "MODEL", "llama-3.1-8b"]
    )
    .contains("not in mem.encodings"));
    let doc = r#"{"conversation_history":[{"role":"user","content":"hi"}],"model":"kimi-k2"}"#;
    assert!(err(&mut con, &["MEM.IMPORT", "k", doc]).contains("not in mem.encodings"));
    assert_eq!(int(&mut con, &["EXISTS", "k"]), 0);
    // Listed ones work; nothing else was built.
    append(&mut con, "k", "user", "hi", &["MODEL", "gpt-4"]);
    assert_eq!(int(&mut con, &["MEM.COUNT", "gpt-4o", "hi"]), o200("hi"));
    let info: String = redis::cmd("INFO").arg("mem").query(&mut con).unwrap();
    assert!(
        info.contains("encoding_deepseek_v3:state=unloaded"),
        "{info}"
    );
    // A default that counts with a left-out encoding is refused where it is
    // set, not at every append to a new session.
    let e = err(
        &mut con,
        &["CONFIG", "SET", "mem.default-model", "deepseek-chat"],
    );
    assert!(e.contains("leaves out"), "{e}");
    assert_eq!(config_get(&mut con, "mem.default-model"), "gpt-4o");
    ok(&mut con, &["CONFIG", "SET", "mem.default-model", "gpt-4"]);
    ok(&mut con, &["CONFIG", "SET", "mem.default-model", "gpt-4o"]);
    // Given tokens need no encoding.
    append(
        &mut con,
        "c",
        "user",
        "hi",
        &["MODEL", "deepseek-chat", "TOKENS", "5"],
    );
    // Built already, still refused once left out (an import too).
    ok(&mut con, &["CONFIG", "SET", "mem.encodings", "all"]);
    assert!(int(&mut con, &["MEM.COUNT", "qwen2.5-72b-instruct", "hi"]) >= 1);
    ok(&mut con, &["CONFIG", "SET", "mem.encodings", "o200k_base"]);
    let doc = r#"{"conversation_history":[{"role":"user","content":"hi"}],"model":"qwen2.5-72b-instruct"}"#;
    assert!(err(&mut con, &["MEM.IMPORT", "q", doc]).contains("not in mem.encodings"));
    assert!(err(&mut con, &["MEM.COUNT", "qwen2.5-72b-instruct", "hi"])
        .contains("not in mem.encodings"));
    assert_eq!(int(&mut con, &["EXISTS", "q"]), 0);
    // CONFIG SET: unknown names and empty lists refused; all restores.
    assert!(err(
        &mut con,
        &["CONFIG", "SET", "mem.encodings", "o200k_base,nope"]
    )
    .contains("unknown encoding"));
    assert!(err(&mut con, &["CONFIG", "SET", "mem.encodings", ""]).contains("at least one"));
    ok(&mut con, &["CONFIG", "SET", "mem.encodings", "all"]);
    assert_eq!(config_get(&mut con, "mem.encodings"), "all");
    assert!(int(&mut con, &["MEM.COUNT", "deepseek-chat", "hi"]) >= 1);
}

/// A JSON value of `bytes` bytes, number-heavy (the slowest to walk).
fn big_json(bytes: usize, bad_at_end: bool) -> String {
    let mut s = String::from("{\"a\":[");
    while s.len() < bytes {
        s.push_str("1.5e10,-3,");
    }
    s.push_str(if bad_at_end { "1e400]}" } else { "0]}" });
    s
}

#[test]
fn large_json_values_are_checked_off_the_main_thread() {
    let server = Server::start();
    let mut con = server.client();
    let big = big_json(1_200_000, false);
    let bad = big_json(1_200_000, true);
    let off = |con: &mut redis::Connection| info_mem(con, "counts_off_thread");
    let before = off(&mut con);
    ok(&mut con, &["MEM.ATTRSET", "k", "ctx", &big]);
    assert_eq!(
        off(&mut con),
        before + 1,
        "the ATTRSET value went to a worker"
    );
    assert_eq!(string(&mut con, &["MEM.ATTRGET", "k", "ctx"]), big);
    append(&mut con, "k", "assistant", "", &["META", &big]);
    assert_eq!(off(&mut con), before + 2, "the META went to a worker");
    assert_eq!(
        get(&mut con, &["MEM.GET", "k", "LAST", "1"])[0]
            .meta
            .as_deref(),
        Some(big.as_str())
    );
    // Refused as the inline check refuses, changing nothing.
    let snapshot = snap(&mut con, "k");
    assert!(err(&mut con, &["MEM.ATTRSET", "k", "ctx", &bad]).contains("number out of range"));
    assert!(
        err(&mut con, &["MEM.APPEND", "k", "user", "x", "META", &bad])
            .contains("number out of range")
    );
    assert_unchanged(&mut con, "k", &snapshot, "refused large JSON");
    // MULTI cannot wait for a worker: refused at once, naming the way out.
    ok(&mut con, &["MULTI"]);
    ok(&mut con, &["MEM.ATTRSET", "k", "ctx", &big]);
    let e = err(&mut con, &["EXEC"]);
    assert!(e.contains("MULTI/EXEC"), "{e}");
    // Small values stay inline.
    let before = off(&mut con);
    ok(&mut con, &["MEM.ATTRSET", "k", "small", r#"{"a":1}"#]);
    append(&mut con, "k", "user", "hi", &["META", r#"{"b":2}"#]);
    assert_eq!(off(&mut con), before);
}

/// Fresh text of about `bytes` bytes: CJK and Hangul with Latin letters
/// of mixed case, no spaces (one long pre-token for most encodings), from
/// `seed` (a new text each run: no cache has seen it).
fn fresh_mixed_script(bytes: usize, seed: u64) -> String {
    let mut rng = Rng::seeded(seed);
    let mut out = String::new();
    while out.len() < bytes {
        let x = rng.next();
        let c = match x % 4 {
            0 => char::from_u32(0x4E00 + (x >> 8) as u32 % 0x5200),
            1 => char::from_u32(0xAC00 + (x >> 8) as u32 % 0x2BA4),
            2 => char::from_u32(u32::from(b'a') + (x >> 8) as u32 % 26),
            _ => char::from_u32(u32::from(b'A') + (x >> 8) as u32 % 26),
        };
        out.extend(c);
    }
    out
}

/// The longest SLOWLOG duration (µs) of `command` since the last reset.
fn longest_hold(con: &mut redis::Connection, command: &str) -> i64 {
    let Value::Array(entries) = ok(con, &["SLOWLOG", "GET", "-1"]) else {
        panic!("SLOWLOG GET")
    };
    entries
        .into_iter()
        .filter_map(|e| {
            let Value::Array(f) = e else { return None };
            let Value::Array(args) = &f[3] else {
                return None;
            };
            let name: String = redis::from_redis_value(&args[0]).ok()?;
            name.eq_ignore_ascii_case(command)
                .then(|| redis::from_redis_value::<i64>(&f[2]).unwrap_or(0))
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn hostile_inputs_within_the_limits_count_right_and_report_their_holds() {
    // Behaviour is asserted; the holds are printed (quickest of the
    // measured runs, fresh text each run), never asserted: docs/PERFORMANCE.md has the figures.
    let server = Server::with_args(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "1000",
    ]);
    let mut con = server.client();
    let mut report = Vec::new();
    for model in [
        "mistral-large-latest",
        "kimi-k2",
        "minimax-m2",
        "deepseek-chat",
        "qwen2.5-72b-instruct",
        "llama-3.1-8b",
        "gpt-4o",
    ] {
        let _ = int(&mut con, &["MEM.COUNT", model, "warm"]);
        let mut best = (i64::MAX, i64::MAX);
        for run in 0..measured_runs() as u64 {
            let text = fresh_mixed_script(3_900, run + 1);
            ok(&mut con, &["SLOWLOG", "RESET"]);
            let counted = int(&mut con, &["MEM.COUNT", model, &text]);
            let again = int(&mut con, &["MEM.COUNT", model, &text]);
            assert_eq!(counted, again, "{model}: the same text counts the same");
            let key = format!("h:{model}:{run}");
            let r = append(&mut con, &key, "user", &text, &["MODEL", model]);
            assert_eq!(
                int_field(&r, "tokens"),
                3 + int(&mut con, &["MEM.COUNT", model, "user"]) + counted,
                "{model}"
            );
            best = (
                best.0.min(longest_hold(&mut con, "MEM.COUNT")),
                best.1.min(longest_hold(&mut con, "MEM.APPEND")),
            );
        }
        report.push(format!(
            "{model}: 3.9 KB fresh mixed-script MEM.COUNT {} us, MEM.APPEND {} us",
            best.0, best.1
        ));
    }
    // A 60 KB document under Tekken goes to the pool (below
    // mem.async-threshold-bytes, above Tekken's inline limit).
    let mut best = i64::MAX;
    for run in 0..3u64 {
        let before = info_mem(&mut con, "counts_off_thread");
        let history: Vec<Json> = (0..15)
            .map(|i| json!({"role": "user", "content": fresh_mixed_script(4_000, 100 * run + i)}))
            .collect();
        let doc =
            json!({"conversation_history": history, "model": "mistral-large-latest"}).to_string();
        assert!(doc.len() < 65_536);
        ok(&mut con, &["SLOWLOG", "RESET"]);
        ok(&mut con, &["MEM.IMPORT", &format!("h:import{run}"), &doc]);
        assert!(
            info_mem(&mut con, "counts_off_thread") > before,
            "the import was counted off the main thread"
        );
        best = best.min(longest_hold(&mut con, "MEM.IMPORT"));
    }
    report.push(format!("MEM.IMPORT of ~60 KB under Tekken: {best} us"));
    // 20,000 imported members (IMPORT now refuses more than 1,024; a
    // session loaded from an earlier release may hold them): ATTRGET is one pass.
    let members: serde_json::Map<String, Json> =
        (0..1024).map(|i| (format!("m{i}"), json!(i))).collect();
    let mut doc = json!({"conversation_history": []});
    doc.as_object_mut().unwrap().extend(members);
    ok(&mut con, &["MEM.IMPORT", "h:attrs", &doc.to_string()]);
    ok(&mut con, &["SLOWLOG", "RESET"]);
    assert_eq!(
        as_fields(ok(&mut con, &["MEM.ATTRGET", "h:attrs"])).len(),
        1024
    );
    report.push(format!(
        "MEM.ATTRGET of 1,024 members: {} us",
        longest_hold(&mut con, "MEM.ATTRGET")
    ));
    let too_many: serde_json::Map<String, Json> =
        (0..1025).map(|i| (format!("m{i}"), json!(i))).collect();
    let mut doc = json!({"conversation_history": []});
    doc.as_object_mut().unwrap().extend(too_many);
    assert!(err(&mut con, &["MEM.IMPORT", "h:attrs2", &doc.to_string()]).contains("at most 1024"));
    // A 3.2 MB number-heavy META and attribute value.
    let big = big_json(3_200_000, false);
    ok(&mut con, &["SLOWLOG", "RESET"]);
    append(&mut con, "h:meta", "assistant", "", &["META", &big]);
    ok(&mut con, &["MEM.ATTRSET", "h:meta", "ctx", &big]);
    let _ = string(&mut con, &["MEM.GET", "h:meta", "FORMAT", "JSON"]);
    report.push(format!(
        "3.2 MB JSON: APPEND META {} us, ATTRSET {} us, MEM.GET FORMAT JSON {} us",
        longest_hold(&mut con, "MEM.APPEND"),
        longest_hold(&mut con, "MEM.ATTRSET"),
        longest_hold(&mut con, "MEM.GET")
    ));
    // A batch at its size cap: 1,000 x 16 KB.
    let items: Vec<Json> = (0..1000)
        .map(|i| json!({"role": "user", "content": format!("{i:05} {}", varied_text(16_000, i))}))
        .collect();
    let batch = Json::Array(items).to_string();
    ok(&mut con, &["SLOWLOG", "RESET"]);
    let Value::Array(replies) = ok(&mut con, &["MEM.APPENDBATCH", "h:batch", &batch]) else {
        panic!()
    };
    assert_eq!(replies.len(), 1000);
    let i = info(&mut con, "h:batch");
    assert!(
        int_field(&i, "messages") <= 30 && int_field(&i, "total_tokens") <= 80_000,
        "{i:?}"
    );
    assert_eq!(int_field(&i, "last_id"), 1000);
    report.push(format!(
        "MEM.APPENDBATCH 1,000 x 16 KB: {} us",
        longest_hold(&mut con, "MEM.APPENDBATCH")
    ));
    eprintln!(
        "holds (SLOWLOG, quickest of the runs):\n  {}",
        report.join("\n  ")
    );
}

#[test]
fn an_aged_message_in_the_middle_costs_reads_nothing_and_leaves_whole() {
    let server = Server::with_args(&[
        "--slowlog-log-slower-than",
        "0",
        "--slowlog-max-len",
        "1000",
    ]);
    let mut con = server.client();
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens-limit", "1000000000"],
    );
    let big = varied_text(2_000_000, 3);
    let k = "aged";
    for _ in 0..20 {
        append(
            &mut con,
            k,
            "user",
            &big,
            &[
                "MAXAGE",
                "86400",
                "MAXTOKENS",
                "100000000",
                "MAXMSGS",
                "100",
            ],
        );
    }
    let old = (now_ms() - 10 * 86_400_000).to_string();
    append(
        &mut con,
        k,
        "user",
        "an old one",
        &["TS", &old, "MSGID", "old-1"],
    );
    let digest_before = digest(&mut con, k);
    // Reads leave it out, change nothing.
    assert_eq!(get(&mut con, &["MEM.GET", k, "LAST", "1"])[0].id, 20);
    assert_eq!(int_field(&info(&mut con, k), "messages"), 20);
    assert_eq!(int_field(&info(&mut con, k), "last_id"), 21);
    let doc = json_doc(&mut con, k);
    assert_eq!(doc["conversation_history"].as_array().unwrap().len(), 20);
    assert_eq!(doc["redis_mem"]["departed_msgids"][0]["msgid"], "old-1");
    assert_eq!(digest(&mut con, k), digest_before, "reads changed nothing");
    let mut holds = Vec::new();
    for cmd in [
        vec!["MEM.GET", k, "LAST", "1"],
        vec!["MEM.INFO", k],
        vec!["MEM.SUMMARIZE_CHECK", k],
    ] {
        ok(&mut con, &["SLOWLOG", "RESET"]);
        let _ = cmd_value(&mut con, &cmd);
        holds.push(format!("{} {} us", cmd[0], longest_hold(&mut con, cmd[0])));
    }
    // The next write evicts it; the others stay, byte for byte.
    ok(&mut con, &["SLOWLOG", "RESET"]);
    let r = append(&mut con, k, "user", "new", &[]);
    holds.push(format!(
        "the evicting MEM.APPEND {} us",
        longest_hold(&mut con, "MEM.APPEND")
    ));
    assert_eq!(
        (int_field(&r, "trimmed"), int_field(&r, "messages")),
        (1, 21)
    );
    let e = get(&mut con, &["MEM.GET", k]);
    assert!(e[..20].iter().all(|m| m.content == big));
    assert_eq!(e[20].content, "new");
    assert_eq!(
        int_field(
            &append(&mut con, k, "user", "an old one", &["MSGID", "old-1"]),
            "duplicate"
        ),
        1
    );
    eprintln!(
        "holds with an aged message in a 40 MB session: {}",
        holds.join(", ")
    );
}

fn cmd_value(con: &mut redis::Connection, args: &[&str]) -> Value {
    ok(con, args)
}

#[test]
fn a_batch_finds_retries_among_many_held_msgids() {
    // 30 batches of 1,000 messages, each with its msgid: every retry of one
    // (in a later batch, or within its own) is recognised, the rest stored.
    let server = Server::start();
    let mut con = server.client();
    for b in 0..30 {
        let mut items: Vec<Json> = (0..1000).map(|i| json!({"role": "user", "content": format!("m{b}-{i}"), "msgid": format!("id-{b}-{i}")})).collect();
        if b > 0 {
            items[0] =
                json!({"role": "user", "content": "again", "msgid": format!("id-{}-7", b - 1)});
        }
        let Value::Array(replies) = ok(
            &mut con,
            &[
                "MEM.APPENDBATCH",
                "many",
                &Json::Array(items).to_string(),
                "MAXMSGS",
                "100000",
                "MAXTOKENS",
                "10000000",
            ],
        ) else {
            panic!()
        };
        let dup = |r: &Value| int_field(&as_fields(r.clone()), "duplicate");
        assert_eq!(dup(&replies[0]), i64::from(b > 0), "batch {b}");
        assert!(replies[1..].iter().all(|r| dup(r) == 0), "batch {b}");
    }
    assert_eq!(
        int_field(&info(&mut con, "many"), "messages"),
        30 * 1000 - 29
    );
}

/// Names a client gives (MODEL, role, MSGID, an external system, an
/// attribute) refuse ASCII control characters on every way in (APPEND,
/// APPENDBATCH, IMPORT, EXTSET, ATTRSET, COUNT), changing nothing; content
/// and values keep any text. `mem.encodings` takes `all` alone.
#[test]
fn control_characters_in_names_are_refused_on_every_way_in() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{ctl}";
    append(&mut con, k, "user", "first\u{1}line\nsecond", &[]);
    let before = json_text(&mut con, k);
    let cases: Vec<Vec<&str>> = vec![
        vec!["MEM.APPEND", k, "us\ner", "hi"],
        vec!["MEM.APPEND", k, "user", "hi", "MODEL", "gpt-4o\r"],
        vec!["MEM.APPEND", k, "user", "hi", "MSGID", "m\u{7f}1"],
        vec!["MEM.APPEND", k, "user", "hi", "MSGID", "m\t1"],
        vec![
            "MEM.APPENDBATCH",
            k,
            r#"[{"role":"user","content":"ok"},{"role":"us\u0000er","content":"x"}]"#,
        ],
        vec![
            "MEM.APPENDBATCH",
            k,
            r#"[{"role":"user","content":"ok","msgid":"a\nb"}]"#,
        ],
        vec!["MEM.EXTSET", k, "di\nfy", "conv"],
        vec!["MEM.ATTRSET", k, "pro\u{1b}file", "{}"],
        vec!["MEM.COUNT", "gpt-4o\n", "hi"],
        // C1 controls and Unicode's line / paragraph separators too.
        vec!["MEM.APPEND", k, "us\u{2028}er", "hi"],
        vec!["MEM.APPEND", k, "user", "hi", "MODEL", "gpt-4o\u{85}"],
        vec!["MEM.APPEND", k, "user", "hi", "MSGID", "m\u{2029}1"],
        vec!["MEM.EXTSET", k, "di\u{9b}fy", "conv"],
        vec!["MEM.ATTRSET", k, "pro\u{2028}file", "{}"],
    ];
    for args in &cases {
        let e = err(&mut con, args);
        assert!(e.contains("control characters"), "{args:?}: {e}");
    }
    assert_eq!(json_text(&mut con, k), before, "nothing changed");
    for doc in [
        r#"{"conversation_history":[{"role":"us\ner","content":"x"}]}"#,
        r#"{"conversation_history":[{"role":"user","content":"x","msgid":"a\u0001"}]}"#,
    ] {
        let e = err(&mut con, &["MEM.IMPORT", "mem:{ctl2}", doc]);
        assert!(e.contains("control characters"), "{doc}: {e}");
    }
    assert_eq!(int(&mut con, &["EXISTS", "mem:{ctl2}"]), 0);
    // Values keep any text.
    ok(&mut con, &["MEM.EXTSET", k, "dify", "conv\n1"]);
    ok(&mut con, &["MEM.ATTRSET", k, "profile", r#"{"a":"b\nc"}"#]);
    let e = err(
        &mut con,
        &["CONFIG", "SET", "mem.encodings", "all o200k_base"],
    );
    assert!(e.contains("stands alone"), "{e}");
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.encodings", "o200k_base o200k_base"],
    );
    assert_eq!(config_get(&mut con, "mem.encodings"), "o200k_base");
}

/// An empty conversation id is refused on both ways in (EXTSET, IMPORT's
/// redis_mem member), changing nothing: EXTGET answers nil for no id.
#[test]
fn an_empty_external_conversation_id_is_refused() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{ext0}";
    let e = err(&mut con, &["MEM.EXTSET", k, "dify", ""]);
    assert!(e.contains("conversation_id must be 1 to 4096 bytes"), "{e}");
    assert_eq!(int(&mut con, &["EXISTS", k]), 0, "not created");
    ok(&mut con, &["MEM.EXTSET", k, "dify", "c1"]);
    assert!(err(&mut con, &["MEM.EXTSET", k, "dify", ""]).contains("must be 1 to"));
    let id: String = redis::cmd("MEM.EXTGET")
        .arg(k)
        .arg("dify")
        .query(&mut con)
        .unwrap();
    assert_eq!(id, "c1", "kept");
    let doc = r#"{"conversation_history":[{"role":"user","content":"x"}],"redis_mem":{"external":{"dify":{"id":"","expires":99999999999999}}}}"#;
    let e = err(&mut con, &["MEM.IMPORT", "mem:{ext1}", doc]);
    assert!(e.contains("conversation_id must be 1 to"), "{e}");
    assert_eq!(int(&mut con, &["EXISTS", "mem:{ext1}"]), 0);
}

/// External ids are identifiers, bounded where they come in (hostile pass
/// 42: a 4 MB id or system name held MEM.EXTSET 21-23 ms and each FORMAT
/// JSON 25 ms): a system name of at most 64 bytes, an id of at most 4096,
/// at most 1024 systems a session; IMPORT takes only what EXTSET takes.
/// A refused EXTSET changes nothing.
#[test]
fn external_ids_are_bounded_on_every_way_in() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{extb}";
    let (name64, name65) = ("s".repeat(64), "s".repeat(65));
    let (id4096, id4097) = ("i".repeat(4096), "i".repeat(4097));
    ok(&mut con, &["MEM.EXTSET", k, &name64, &id4096]);
    let e = err(&mut con, &["MEM.EXTSET", k, &name65, "c"]);
    assert!(e.contains("system must be 1 to 64 bytes"), "{e}");
    let e = err(&mut con, &["MEM.EXTSET", k, "dify", &id4097]);
    assert!(e.contains("conversation_id must be 1 to 4096 bytes"), "{e}");
    let huge = "x".repeat(4 << 20);
    assert!(err(&mut con, &["MEM.EXTSET", k, &huge, "c"]).contains("1 to 64 bytes"));
    assert!(err(&mut con, &["MEM.EXTSET", k, "dify", &huge]).contains("1 to 4096 bytes"));
    let mut pipe = redis::pipe();
    for i in 1..1024 {
        pipe.cmd("MEM.EXTSET")
            .arg(k)
            .arg(format!("sys{i}"))
            .arg("c")
            .ignore();
    }
    pipe.query::<()>(&mut con).unwrap();
    let e = err(&mut con, &["MEM.EXTSET", k, "one-more", "c"]);
    assert!(e.contains("at most 1024 external ids"), "{e}");
    // A system it holds can still be set again; an expired one makes room.
    ok(&mut con, &["MEM.EXTSET", k, "sys7", "again", "EX", "1"]);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    ok(&mut con, &["MEM.EXTSET", k, "one-more", "c"]);
    let info = map_reply(&mut con, &["MEM.INFO", k]);
    assert!(!format!("{info:?}").contains(&name65));
    // IMPORT: the same bounds on the document's ids.
    let doc = |external: String| {
        format!(
            r#"{{"conversation_history":[{{"role":"user","content":"x"}}],"redis_mem":{{"external":{external}}}}}"#
        )
    };
    let one = |system: &str, id: &str| {
        format!(r#"{{"{system}":{{"id":"{id}","expires":99999999999999}}}}"#)
    };
    for (external, why) in [
        (one(&name65, "c"), "1 to 64 bytes"),
        (one("dify", &id4097), "1 to 4096 bytes"),
        (
            format!(
                "{{{}}}",
                (0..1025)
                    .map(|i| format!(r#""s{i}":{{"id":"c","expires":99999999999999}}"#))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            "more than 1024 live systems",
        ),
    ] {
        let e = err(&mut con, &["MEM.IMPORT", "mem:{exti}", &doc(external)]);
        assert!(e.contains(why), "{why}: {e}");
        assert_eq!(int(&mut con, &["EXISTS", "mem:{exti}"]), 0);
    }
    ok(
        &mut con,
        &["MEM.IMPORT", "mem:{exti}", &doc(one(&name64, &id4096))],
    );
    // Expired ids do not count (as for EXTSET): 1024 live and 5 long gone.
    let live_and_gone = format!(
        "{{{}}}",
        (0..1029)
            .map(|i| {
                let expires = if i < 1024 {
                    99_999_999_999_999i64
                } else {
                    1000
                };
                format!(r#""s{i}":{{"id":"c","expires":{expires}}}"#)
            })
            .collect::<Vec<_>>()
            .join(",")
    );
    ok(&mut con, &["MEM.IMPORT", "mem:{extj}", &doc(live_and_gone)]);
}

/// A redis-server without the module, that MODULE LOAD may load it into.
struct BareServer(std::process::Child);

impl Drop for BareServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_bad_module_argument_refuses_the_load_and_the_server_lives() {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("redis-mem-bare-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
    let child = std::process::Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args([
            "--enable-module-command",
            "yes",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start redis-server");
    let _server = BareServer(child);
    let url = format!("redis://127.0.0.1:{port}/");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut con = loop {
        let ok = redis::Client::open(url.as_str())
            .and_then(|c| c.get_connection())
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).map(|_| c));
        match ok {
            Ok(c) => break c,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            Err(e) => panic!("redis-server did not start: {e}"),
        }
    };
    let module = module_path().display().to_string();
    // The crate's RedisModule_OnLoad made a CString of a string config's
    // default, and of the error naming an unknown enum value: a NUL there
    // aborted the server.
    for (name, value) in [
        ("default-model", &b"a\0b"[..]),
        ("models", b"\0"),
        ("encodings", b"all\0"),
        ("default-encoding", b"x\0"),
    ] {
        let e = redis::cmd("MODULE")
            .arg("LOAD")
            .arg(&module)
            .arg(name)
            .arg(value)
            .query::<Value>(&mut con)
            .expect_err("a NUL in a module argument refuses the load");
        assert!(err_text(&e).starts_with("ERR"), "{name}: {}", err_text(&e));
        let pong: String = redis::cmd("PING")
            .query(&mut con)
            .expect("the server lives");
        assert_eq!(pong, "PONG");
    }
    // Module arguments are held to what CONFIG SET takes: ranges, Redis's
    // integer syntax, known names, name value pairs (`count-threads 0` left
    // every large append waiting forever; `ttl -1` made sessions immortal;
    // a mistyped name was ignored).
    for args in [
        &["count-threads", "0"][..],
        &["ttl", "-1"],
        &["ext-ttl", "0"],
        &["summarize-ratio", "0"],
        &["max-age", "99999999999"],
        &["max-message-bytes", "0"],
        &["ttl", "01"],
        &["ttl", "+5"],
        &["tll", "60"],
        &["ttl", "60", "ttl", "70"],
        &["encodings", "o200k_base", "cl100k_base"],
        &["default-model", "gpt-4o\n"],
    ] {
        let e = redis::cmd("MODULE")
            .arg("LOAD")
            .arg(&module)
            .arg(args)
            .query::<Value>(&mut con)
            .expect_err("refused");
        assert!(
            err_text(&e).starts_with("ERR"),
            "{args:?}: {}",
            err_text(&e)
        );
        // Redis 8 lists its own modules (vectorset): only `mem` must be absent.
        let modules: Vec<Vec<Value>> = redis::cmd("MODULE").arg("LIST").query(&mut con).unwrap();
        let names: Vec<String> = modules
            .iter()
            .filter_map(|m| {
                let at = m
                    .iter()
                    .position(|v| *v == Value::BulkString(b"name".to_vec()))?;
                redis::from_redis_value(m.get(at + 1)?).ok()
            })
            .collect();
        assert!(
            !names.iter().any(|n| n == "mem"),
            "{args:?}: loaded ({names:?})"
        );
    }
    // Arguments without a NUL still set the configs' defaults.
    let _: Value = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(&module)
        .arg("ttl")
        .arg("77")
        .arg("default-model")
        .arg("gpt-4")
        .arg("default-encoding")
        .arg("cl100k_base")
        .query(&mut con)
        .expect("load with arguments");
    assert_eq!(config_get(&mut con, "mem.ttl"), "77");
    assert_eq!(config_get(&mut con, "mem.default-model"), "gpt-4");
    assert_eq!(config_get(&mut con, "mem.default-encoding"), "cl100k_base");
    let _ = std::fs::remove_dir_all(&dir);
}

/// What MEM.IMPORT takes from a document is held to what the commands take
/// (hostile pass): no control characters in external system names,
/// departed msgids or member (attribute) names, a message's `tokens` at
/// most mem.max-tokens-limit as TOKENS, a departed msgid's tokens what a
/// message can count; and mem.default-model refuses what MODEL refuses.
#[test]
fn an_import_takes_only_what_the_commands_take() {
    let server = Server::start();
    let mut con = server.client();
    let ours = |member: &str, history: &str| {
        format!(
            r#"{{"model":"gpt-4o","conversation_history":[{history}],"redis_mem":{{"ttl":600{member}}}}}"#
        )
    };
    let one = r#"{"id":3,"role":"user","content":"hi","tokens":5}"#;
    for (doc, why) in [
        (
            ours(
                r#","external":{"s\u0001":{"id":"c","expires":99999999999999}}"#,
                one,
            ),
            "control characters",
        ),
        (
            ours(
                r#","last_id":3,"departed_msgids":[{"msgid":"a\u0001","id":1,"tokens":3}]"#,
                one,
            ),
            "control characters",
        ),
        (
            ours(
                r#","last_id":3,"departed_msgids":[{"msgid":"a","id":1,"tokens":18446744073709551615}]"#,
                one,
            ),
            "tokens",
        ),
        (
            ours("", r#"{"role":"user","content":"hi","tokens":10000001}"#),
            "mem.max-tokens-limit",
        ),
        (
            r#"{"conversation_history":[],"a\u001b[31m":{}}"#.to_owned(),
            "control characters",
        ),
    ] {
        let e = err(&mut con, &["MEM.IMPORT", "mem:{imp}", &doc]);
        assert!(e.contains(why), "{doc}: {e}");
        assert_eq!(int(&mut con, &["EXISTS", "mem:{imp}"]), 0);
    }
    // At the limit it is kept, as TOKENS keeps it.
    let doc = ours("", r#"{"role":"user","content":"hi","tokens":10000000}"#);
    ok(&mut con, &["MEM.IMPORT", "mem:{imp}", &doc]);
    assert_eq!(
        int_field(&info(&mut con, "mem:{imp}"), "total_tokens"),
        10_000_000
    );
    let e = err(
        &mut con,
        &["CONFIG", "SET", "mem.default-model", "gpt-4o\n"],
    );
    assert!(e.contains("control characters"), "{e}");
}

/// Hostile finding (fixed): CONTEXT above ~1.8e17 gave a threshold far too
/// low (the window's percentage saturated at u64::MAX / 100). CONTEXT is a
/// window: bounded at 2^53 - 1 as the model table bounds windows.
#[test]
fn context_is_bounded_as_a_model_window() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["MEM.APPEND", "ctx", "user", "hello"]);
    for command in ["MEM.SUMMARIZE_CHECK", "MEM.SUMMARIZE_BEGIN"] {
        let mut args = vec![command, "ctx"];
        if command == "MEM.SUMMARIZE_BEGIN" {
            args.push("60000");
        }
        for too_large in ["9007199254740992", "9223372036854775807"] {
            let mut a = args.clone();
            a.extend(["CONTEXT", too_large]);
            let e = cmd(&mut con, &a).unwrap_err();
            assert!(e.to_string().contains("at most 9007199254740991"), "{e}");
        }
    }
    // The largest window: its threshold is the session's cap less headroom,
    // as for any window whose percentage is above it.
    let at = |con: &mut redis::Connection, context: &str| {
        let r = map_reply(con, &["MEM.SUMMARIZE_CHECK", "ctx", "CONTEXT", context]);
        int_field(&r, "threshold_tokens")
    };
    assert_eq!(
        at(&mut con, "9007199254740991"),
        at(&mut con, "100000000000")
    );
}

/// Hostile finding (fixed): `mem.max-tokens` set above `mem.max-tokens-limit`
/// gave new sessions a cap no client may set, so their FORMAT JSON did not
/// import back. A new session's caps stop at the limits.
#[test]
fn default_caps_above_the_limits_stop_at_them_and_round_trip() {
    let server = Server::start();
    let mut con = server.client();
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens", "9223372036854775807"],
    );
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-messages", "9223372036854775807"],
    );
    ok(&mut con, &["MEM.APPEND", "caps", "user", "hello"]);
    let info = map_reply(&mut con, &["MEM.INFO", "caps"]);
    assert_eq!(int_field(&info, "maxtokens"), 10_000_000);
    assert_eq!(int_field(&info, "maxmsgs"), 100_000);
    let doc: String = redis::cmd("MEM.GET")
        .arg("caps")
        .arg("FORMAT")
        .arg("JSON")
        .query(&mut con)
        .unwrap();
    ok(&mut con, &["MEM.IMPORT", "caps2", &doc]);
    let again: String = redis::cmd("MEM.GET")
        .arg("caps2")
        .arg("FORMAT")
        .arg("JSON")
        .query(&mut con)
        .unwrap();
    assert_eq!(again, doc, "the same session back");
}
