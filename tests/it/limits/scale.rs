//! attack3 (issue 12's MessageLog and format 3) at the limits: a session
//! of 100,000 messages (mem.max-messages-limit) at its cap, metas of MBs,
//! ids near 2^53 and a session of many MB: reads, MEMORY USAGE against
//! used_memory, DEBUG RELOAD, DUMP/RESTORE, replication.

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;

fn used_memory(con: &mut redis::Connection) -> i64 {
    session::info_int(con, "memory", "used_memory")
}

fn memory_usage(con: &mut redis::Connection, key: &str) -> i64 {
    int(con, &["MEMORY", "USAGE", key, "SAMPLES", "0"])
}

/// Builds the tokenizer's tables (lazily made on the first count, on the
/// main thread and the pool) before used_memory is sampled.
fn warm_up(con: &mut redis::Connection) {
    let batch: Vec<serde_json::Value> = (0..200)
        .map(|i| serde_json::json!({"role": "user", "content": varied_text(600, i)}))
        .collect();
    ok(
        con,
        &[
            "MEM.APPENDBATCH",
            "mem:{warm}",
            &serde_json::to_string(&batch).unwrap(),
        ],
    );
    append(con, "mem:{warm}", "user", &varied_text(70_000, 1), &[]);
    ok(con, &["DEL", "mem:{warm}"]);
    std::thread::sleep(std::time::Duration::from_millis(200));
}

fn roles(i: usize) -> &'static str {
    ["user", "assistant", "tool", "a-role-of-its-own", "system"][i % 5]
}

#[test]
fn hundred_thousand_messages_at_the_cap() {
    let master = Server::start();
    let mut con = master.client();
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens-limit", "1000000000"],
    );
    let k = "mem:{100k}";
    warm_up(&mut con);
    let used0 = used_memory(&mut con);
    let cap = ["MAXMSGS", "100000", "MAXTOKENS", "1000000000"];
    let text = |i: usize| {
        if i % 1000 == 7 {
            String::new()
        } else {
            format!("m{i} {}", "x".repeat(i % 90))
        }
    };
    for start in (0..101_000).step_by(1000) {
        let batch: Vec<serde_json::Value> = (start..start + 1000)
            .map(|i| {
                let mut m = serde_json::json!({"role": roles(i), "content": text(i), "ts": i as i64 * 1000});
                if i % 10 == 0 {
                    m["meta"] = serde_json::json!({"i": i});
                }
                m
            })
            .collect();
        ok(
            &mut con,
            &[
                "MEM.APPENDBATCH",
                k,
                &serde_json::to_string(&batch).unwrap(),
                cap[0],
                cap[1],
                cap[2],
                cap[3],
            ],
        );
    }
    // At the cap; a tool result left first goes with its call (99,999).
    let held = |c: &mut redis::Connection| int_field(&map_reply(c, &["MEM.INFO", k]), "messages");
    assert!((99_999..=100_000).contains(&held(&mut con)));
    // (No replica yet: its backlog and output buffer are not the session's.)
    let growth = used_memory(&mut con) - used0;
    let usage = memory_usage(&mut con, k);
    println!("attack3 scale: 100,000 messages: MEMORY USAGE {usage}, used_memory growth {growth}");
    assert!(
        (usage - growth).abs() * 10 <= growth,
        "MEMORY USAGE {usage} vs used_memory growth {growth}"
    );
    // The cap was applied as it went: the oldest are gone (and a tool
    // result left first went with its call).
    let all = get(&mut con, &["MEM.GET", k]);
    assert_eq!(all.len() as i64, held(&mut con));
    for e in &all {
        let i = (e.ts / 1000) as usize;
        assert_eq!(
            (e.role.as_str(), e.content.as_str()),
            (roles(i), text(i).as_str()),
            "id {}",
            e.id
        );
        assert_eq!(e.meta.is_some(), i.is_multiple_of(10));
    }
    assert_eq!(
        get(&mut con, &["MEM.GET", k, "LAST", "2"])
            .iter()
            .map(|e| e.ts / 1000)
            .collect::<Vec<_>>(),
        vec![100_998, 100_999]
    );
    // A replica syncs it (format 3 over a full sync), then takes the writes.
    let (_replica, mut rcon) = start_replica(&master);
    // One more is refused above the limit; one more at the cap evicts one.
    assert_err(
        &mut con,
        &["MEM.APPEND", k, "user", "x", "MAXMSGS", "100001"],
        "max-messages-limit",
    );
    append(&mut con, k, "user", "one more", &cap);
    assert!((99_999..=100_000).contains(&held(&mut con)));
    let _: redis::Value = redis::cmd("WAIT")
        .arg(1)
        .arg(10000)
        .query(&mut con)
        .unwrap();
    assert_eq!(session::digest(&mut con, k), session::digest(&mut rcon, k));
    let before = session::snap(&mut con, k);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    session::assert_same(
        &before,
        &session::snap(&mut con, k),
        "DEBUG RELOAD of 100,000 messages",
        30_000,
    );
    let d = session::dump(&mut con, k);
    redis::cmd("RESTORE")
        .arg("mem:{100k}:copy")
        .arg(0)
        .arg(&d)
        .query::<()>(&mut con)
        .unwrap();
    assert_eq!(json_text(&mut con, "mem:{100k}:copy"), before.json);
}

#[test]
fn metas_of_megabytes_and_ids_near_two_to_the_53() {
    let server = Server::start();
    let mut con = server.client();
    let k = "mem:{meta}";
    // META as large as mem.max-message-bytes allows (4 MB): a 3-byte length.
    let inner = "y".repeat(4 * 1024 * 1024 - 20);
    let meta = format!(r#"{{"blob":"{inner}"}}"#);
    assert!(meta.len() <= 4 * 1024 * 1024);
    append(&mut con, k, "user", "", &["META", &meta]);
    append(
        &mut con,
        k,
        "critic",
        "after the blob",
        &["META", r#"{"n":1}"#],
    );
    let got = get(&mut con, &["MEM.GET", k]);
    assert_eq!(got[0].meta.as_deref(), Some(meta.as_str()));
    assert_eq!(
        (
            got[1].role.as_str(),
            got[1].content.as_str(),
            got[1].meta.as_deref()
        ),
        ("critic", "after the blob", Some(r#"{"n":1}"#))
    );
    let before = session::snap(&mut con, k);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    session::assert_same(
        &before,
        &session::snap(&mut con, k),
        "DEBUG RELOAD with a 4 MB meta",
        2000,
    );
    // Ids: an import whose summary covers up to 2^53 - 3 leaves two ids.
    let top: u64 = (1 << 53) - 1;
    let doc = serde_json::json!({
        "conversation_history": [{"role": "user", "content": "near the top", "timestamp": "2025-01-01T00:00:00"}],
        "summary": {"text": "long ago", "upto": top - 2},
    });
    let r = cmd(&mut con, &["MEM.IMPORT", "mem:{ids}", &doc.to_string()]);
    match r {
        Ok(_) => {
            let got = get(&mut con, &["MEM.GET", "mem:{ids}"]);
            let ids: Vec<i64> = got.iter().map(|e| e.id).collect();
            println!("attack3 scale: import near 2^53: ids {ids:?}");
            let last = *ids.last().unwrap() as u64;
            assert!(last <= top);
            // Appends up to the top, then one is refused.
            let mut refused = false;
            for _ in 0..3 {
                if cmd(&mut con, &["MEM.APPEND", "mem:{ids}", "user", "up"]).is_err() {
                    refused = true;
                    break;
                }
            }
            assert!(refused, "appends went past 2^53 - 1");
            let last = get(&mut con, &["MEM.GET", "mem:{ids}", "LAST", "1"])
                .last()
                .unwrap()
                .id as u64;
            assert_eq!(last, top);
            let before = session::snap(&mut con, "mem:{ids}");
            ok(&mut con, &["DEBUG", "RELOAD"]);
            session::assert_same(
                &before,
                &session::snap(&mut con, "mem:{ids}"),
                "DEBUG RELOAD near 2^53",
                2000,
            );
        }
        Err(e) => println!("attack3 scale: import with summary upto 2^53-3 refused: {e}"),
    }
}

#[test]
fn a_session_of_sixty_megabytes_round_trips() {
    let server = Server::start();
    let mut con = server.client();
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens-limit", "1000000000"],
    );
    let k = "mem:{60mb}";
    warm_up(&mut con);
    let used0 = used_memory(&mut con);
    // 15 messages of 4 MB (max-message-bytes), each counted on the pool.
    for i in 0..15 {
        let content = varied_text(4 * 1024 * 1024 - 100, i);
        append(
            &mut con,
            k,
            roles(i),
            &content,
            &["MAXMSGS", "100", "MAXTOKENS", "1000000000"],
        );
    }
    let growth = used_memory(&mut con) - used0;
    let usage = memory_usage(&mut con, k);
    println!("attack3 scale: 15 x 4 MB: MEMORY USAGE {usage}, used_memory growth {growth}");
    assert!(
        (usage - growth).abs() * 10 <= growth,
        "MEMORY USAGE {usage} vs used_memory growth {growth}"
    );
    let before = session::snap(&mut con, k);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    session::assert_same(
        &before,
        &session::snap(&mut con, k),
        "DEBUG RELOAD of 60 MB",
        30_000,
    );
    // Loaded, it holds its bytes in their size class (no write slack).
    let usage_loaded = memory_usage(&mut con, k);
    println!("attack3 scale: 15 x 4 MB: MEMORY USAGE after DEBUG RELOAD {usage_loaded}");
    assert!(usage_loaded <= usage);
    let got = get(&mut con, &["MEM.GET", k, "LAST", "2"]);
    assert_eq!(
        got.last().unwrap().content,
        varied_text(4 * 1024 * 1024 - 100, 14)
    );
}

#[test]
fn summarizing_a_hundred_thousand_messages_gives_the_memory_back() {
    let server = Server::start();
    let mut con = server.client();
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.max-tokens-limit", "1000000000"],
    );
    let k = "mem:{shrink}";
    let cap = ["MAXMSGS", "100000", "MAXTOKENS", "1000000000"];
    for start in (0..100_000).step_by(1000) {
        let batch: Vec<serde_json::Value> = (start..start + 1000)
            .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")}))
            .collect();
        ok(
            &mut con,
            &[
                "MEM.APPENDBATCH",
                k,
                &serde_json::to_string(&batch).unwrap(),
                cap[0],
                cap[1],
                cap[2],
                cap[3],
            ],
        );
    }
    let full = memory_usage(&mut con, k);
    let used = used_memory(&mut con);
    let last = int_field(&map_reply(&mut con, &["MEM.INFO", k]), "last_id");
    ok(
        &mut con,
        &["MEM.SUMMARIZE", k, &(last - 100).to_string(), "most of it"],
    );
    let after = memory_usage(&mut con, k);
    let freed = used - used_memory(&mut con);
    println!("attack3 scale: 100,000 tiny messages summarized to 100: MEMORY USAGE {full} -> {after}, used_memory -{freed}");
    // The heads' ring (3 MB for 100,000) is given back with the bytes.
    assert!(
        after < 64 * 1024,
        "MEMORY USAGE {after} B for 100 messages (was {full})"
    );
    assert!(
        freed * 10 >= (full - after) * 9,
        "used_memory fell {freed}, MEMORY USAGE {}",
        full - after
    );
    append(&mut con, k, "user", "after", &cap);
    let got = get(&mut con, &["MEM.GET", k]);
    assert_eq!(got.len(), 102); // the summary, 100 kept, the new one
    assert_eq!(got[1].content, format!("m{}", 100_000 - 100));
}
