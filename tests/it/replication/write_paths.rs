//! attack3 (issue 12's MessageLog and format 3): every way a write gets in
//! and every way a session travels. A master with AOF and a replica take
//! each kind of write on sessions that evict, summarize and refill (large
//! appends counted on the pool, batches, MULTI/EXEC, Lua, imports, model
//! switches, COPY); after each, the replica holds exactly what the master
//! holds. Then the sessions go through BGREWRITEAOF (with and without the
//! RDB preamble) and a restart, DEBUG RELOAD, DUMP/RESTORE and MIGRATE, and
//! come back identical.

use crate::support::faults::{assert_replica_same, conn, master_and_replica, wait_replicas};
use crate::support::reply;
use crate::support::reply::{append, get, int, ok};
use crate::support::server::*;
use crate::support::session;

fn big(i: usize, bytes: usize) -> String {
    format!("{i:06} {}", varied_text(bytes, i * 7 + 1))
}

/// Every key's snapshot (digest, JSON, PTTL).
fn snaps(con: &mut redis::Connection) -> Vec<session::Snap> {
    let mut keys: Vec<String> = redis::from_redis_value(&ok(con, &["KEYS", "mem:*"])).unwrap();
    keys.sort();
    session::snap_all(con, &keys)
}

fn assert_all_same(before: &[session::Snap], after: &[session::Snap], what: &str) {
    assert_eq!(before.len(), after.len(), "{what}: key count");
    for (b, a) in before.iter().zip(after) {
        session::assert_same(b, a, what, 5000);
    }
}

/// Each message of `key` reads back as one of what was sent (by its id).
fn check_reads(
    con: &mut redis::Connection,
    key: &str,
    sent: &std::collections::HashMap<i64, String>,
) {
    for e in get(con, &["MEM.GET", key]) {
        if e.role == "summary" {
            continue;
        }
        if let Some(want) = sent.get(&e.id) {
            assert_eq!(&e.content, want, "{key}: message {} reads back wrong", e.id);
        }
    }
}

fn writes(m: &mut redis::Connection, r: &mut redis::Connection) {
    let mut sent = std::collections::HashMap::new();
    let k = "mem:{p}:a";
    let step = |m: &mut redis::Connection, r: &mut redis::Connection, what: &str| {
        wait_replicas(m, 1);
        assert_replica_same(m, r, what);
    };
    // Fresh appends, some large (>= 64 KB: counted on the pool), at a cap of
    // 12 messages so they evict; metas and written-out roles.
    for i in 0..40 {
        let size = if i % 5 == 0 { 70_000 } else { 900 };
        let content = big(i, size);
        let role = ["user", "assistant", "tool", "critic-ü", "system"][i % 5];
        let meta = format!(r#"{{"i":{i}}}"#);
        let opts: Vec<&str> = if i % 3 == 0 {
            vec!["MAXMSGS", "12", "META", &meta]
        } else {
            vec!["MAXMSGS", "12"]
        };
        let id = int_field(&append(m, k, role, &content, &opts), "id");
        sent.insert(id, content);
    }
    check_reads(m, k, &sent);
    step(m, r, "appends with evictions");
    // Summarize most, refill with large ones.
    let upto = int_field(
        &map_reply(m, &["MEM.SUMMARIZE_CHECK", k, "KEEP", "4"]),
        "upto",
    )
    .to_string();
    ok(m, &["MEM.SUMMARIZE", k, &upto, "summary of the start"]);
    step(m, r, "summarize");
    for i in 40..46 {
        let content = big(i, 80_000);
        sent.insert(
            int_field(&append(m, k, "user", &content, &["MAXMSGS", "12"]), "id"),
            content,
        );
    }
    check_reads(m, k, &sent);
    step(m, r, "refill after summarize");
    // Summarize everything, then refill.
    let last = get(m, &["MEM.GET", k, "LAST", "1"]).last().unwrap().id;
    ok(m, &["MEM.SUMMARIZE", k, &last.to_string(), "all of it"]);
    for i in 46..50 {
        let content = big(i, 300);
        sent.insert(
            int_field(&append(m, k, "assistant", &content, &[]), "id"),
            content,
        );
    }
    check_reads(m, k, &sent);
    step(m, r, "emptied by summarize, refilled");
    // Large messages laid out by the worker (kept as their own segment) and
    // large METAs and attribute values replicated apart from their op's
    // header, around small appends that fill the segments' spare room.
    for i in 0..3 {
        let meta =
            serde_json::json!({"i": i, "blob": big(500 + i, 70_000 + i * 9_000)}).to_string();
        let content = big(510 + i, 60_000 + i * 40_000);
        let id = int_field(
            &append(
                m,
                k,
                "assistant",
                &content,
                &["META", &meta, "MAXMSGS", "12"],
            ),
            "id",
        );
        sent.insert(id, content);
        let small = big(520 + i, 200);
        sent.insert(int_field(&append(m, k, "user", &small, &[]), "id"), small);
    }
    let value = serde_json::json!({"ctx": big(530, 300_000)}).to_string();
    ok(m, &["MEM.ATTRSET", k, "context", &format!(" {value}\n")]);
    ok(
        m,
        &[
            "MEM.ATTRSET",
            k,
            "short",
            &serde_json::to_string(&big(531, 90_000)).unwrap(),
            "EX",
            "3600",
        ],
    );
    assert_eq!(
        ok(m, &["MEM.ATTRGET", k, "context"]),
        redis::Value::BulkString(value.into_bytes())
    );
    check_reads(m, k, &sent);
    step(m, r, "large messages, METAs and attribute values");
    // A batch, some of it large.
    let batch: Vec<serde_json::Value> = (50..60)
        .map(|i| serde_json::json!({"role": "user", "content": big(i, if i == 55 { 100_000 } else { 500 }), "meta": {"b": i}}))
        .collect();
    ok(
        m,
        &[
            "MEM.APPENDBATCH",
            k,
            &serde_json::to_string(&batch).unwrap(),
            "MAXMSGS",
            "20",
        ],
    );
    step(m, r, "batch");
    // MULTI/EXEC with appends just under o200k_base's 16 KB inline cap (inline there), an EXTSET, an ATTRSET.
    let mut pipe = redis::pipe();
    pipe.atomic();
    for i in 60..64 {
        pipe.cmd("MEM.APPEND")
            .arg(k)
            .arg("user")
            .arg(big(i, 15_000))
            .arg("MAXMSGS")
            .arg("15");
    }
    pipe.cmd("MEM.EXTSET").arg(k).arg("dify").arg("conv-1");
    pipe.cmd("MEM.ATTRSET")
        .arg(k)
        .arg("profile")
        .arg(r#"{"name":"Ana"}"#);
    pipe.query::<redis::Value>(m).unwrap();
    step(m, r, "MULTI/EXEC");
    // Lua: appends and a summarize in one script.
    let script = r#"
        for i = 1, 5 do
            redis.call('MEM.APPEND', KEYS[1], 'user', string.rep('lua ' .. i .. ' ', 2400), 'MAXMSGS', '10')
        end
        local last = redis.call('MEM.GET', KEYS[1], 'LAST', '3')
        return #last
    "#;
    let n: i64 = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg(k)
        .query(m)
        .unwrap();
    // LAST 3: three messages, after the summary when the session keeps one.
    let summarized = int_field(&map_reply(m, &["MEM.INFO", k]), "summary_upto") > 0;
    assert_eq!(n, 3 + i64::from(summarized));
    step(m, r, "Lua");
    // A model switch to a cl100k model on a large session, then more writes.
    let kb = "mem:{p}:b";
    for i in 0..30 {
        append(
            m,
            kb,
            "user",
            &big(100 + i, 20_000),
            &["MAXMSGS", "100", "MAXTOKENS", "5000000"],
        );
    }
    append(m, kb, "user", "switch", &["MODEL", "gpt-4"]);
    assert_eq!(
        str_field(&map_reply(m, &["MEM.INFO", kb]), "encoding"),
        "cl100k_base"
    );
    for e in get(m, &["MEM.GET", kb]) {
        if e.content != "switch" {
            assert_eq!(
                e.tokens,
                reply::mt_c(&e.role, &e.content),
                "message {} after the switch",
                e.id
            );
        }
    }
    step(m, r, "model switch");
    // An import of a large document.
    let doc = serde_json::json!({
        "conversation_history": (0..200).map(|i| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": big(200 + i, 3000), "timestamp": "2025-01-01T00:00:00"})).collect::<Vec<_>>(),
        "user_profile": {"name": "Bo"},
    });
    ok(m, &["MEM.IMPORT", "mem:{p}:c", &doc.to_string()]);
    step(m, r, "import");
    // COPY, then write to both.
    ok(m, &["COPY", k, "mem:{p}:a-copy"]);
    for i in 0..20 {
        append(
            m,
            "mem:{p}:a-copy",
            "user",
            &big(300 + i, 2000),
            &["MAXMSGS", "8"],
        );
        append(m, k, "assistant", &big(400 + i, 2000), &["MAXMSGS", "8"]);
    }
    step(m, r, "COPY then writes to both");
}

fn round_trips(extra: &[&str], what: &str) {
    let (mut master, replica) = master_and_replica(extra);
    let mut m = conn(master.port, 0);
    let mut r = conn(replica.port, 0);
    writes(&mut m, &mut r);
    let before = snaps(&mut m);

    // AOF rewrite (its preamble as configured), restart from it.
    ok(&mut m, &["BGREWRITEAOF"]);
    session::wait_persistence_idle(&mut m);
    // A write after the rewrite lands in the incremental AOF.
    append(&mut m, "mem:{p}:late", "user", &big(999, 70_000), &[]);
    let before_late = snaps(&mut m);
    master.restart();
    let mut m = conn(master.port, 0);
    assert_all_same(
        &before_late,
        &snaps(&mut m),
        &format!("{what}: restart from the rewritten AOF"),
    );
    ok(&mut m, &["DEL", "mem:{p}:late"]);

    // DEBUG RELOAD (an RDB of format 3 saved and loaded).
    ok(&mut m, &["DEBUG", "RELOAD"]);
    assert_all_same(&before, &snaps(&mut m), &format!("{what}: DEBUG RELOAD"));

    // DUMP/RESTORE of every key onto a fresh server, and MIGRATE.
    let other = Server::start();
    let mut o = other.client();
    for s in &before {
        let d = session::dump(&mut m, &s.key);
        redis::cmd("RESTORE")
            .arg(&s.key)
            .arg(s.pttl.max(0))
            .arg(&d)
            .query::<()>(&mut o)
            .unwrap();
    }
    assert_all_same(&before, &snaps(&mut o), &format!("{what}: DUMP/RESTORE"));
    let third = Server::start();
    let mut t = third.client();
    for s in &before {
        ok(
            &mut o,
            &[
                "MIGRATE",
                "127.0.0.1",
                &third.port.to_string(),
                &s.key,
                "0",
                "5000",
            ],
        );
    }
    assert_all_same(&before, &snaps(&mut t), &format!("{what}: MIGRATE"));
    assert_eq!(int(&mut o, &["DBSIZE"]), 0);
}

#[test]
fn every_write_path_replicates_and_round_trips_with_rdb_preamble() {
    round_trips(
        &["--appendonly", "yes", "--aof-use-rdb-preamble", "yes"],
        "preamble",
    );
}

#[test]
fn every_write_path_replicates_and_round_trips_without_rdb_preamble() {
    round_trips(
        &["--appendonly", "yes", "--aof-use-rdb-preamble", "no"],
        "no preamble",
    );
}
