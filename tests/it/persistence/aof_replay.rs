//! attack2: the combined v2 writes (MSGID retries, MAXAGE evictions with
//! mixed TS, batches, leases, summaries, attributes, model switches) replayed
//! from the AOF, with and without a rewrite, give back the same session.

use std::time::Duration;

use crate::support::server::*;
use crate::support::session;
use crate::support::session::digest;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn run(con: &mut redis::Connection, k: &str) {
    let old = (now_ms() - 5_000).to_string();
    let c = |con: &mut redis::Connection, a: &[&str]| {
        let _ = cmd(con, a);
    };
    c(
        con,
        &[
            "MEM.ATTRSET",
            k,
            "user_profile",
            r#"{"n":1.50,"s":"\ud83c\udf89"}"#,
        ],
    );
    c(
        con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "hi",
            "MSGID",
            "m1",
            "MAXAGE",
            "2",
            "MAXMSGS",
            "6",
        ],
    );
    c(
        con,
        &[
            "MEM.APPEND",
            k,
            "assistant",
            "call",
            "MSGID",
            "m2",
            "TS",
            &old,
        ],
    );
    c(con, &["MEM.APPEND", k, "tool", "res", "MSGID", "m3"]);
    c(
        con,
        &[
            "MEM.APPENDBATCH",
            k,
            r#"[{"role":"user","content":"a","msgid":"m4"},{"role":"user","content":"b","msgid":"m1"},{"role":"tool","content":"c"}]"#,
        ],
    );
    c(
        con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "switch",
            "MODEL",
            "gpt-4",
            "MSGID",
            "m5",
        ],
    );
    for i in 0..10 {
        c(
            con,
            &[
                "MEM.APPEND",
                k,
                "user",
                &format!("x{i}"),
                "MSGID",
                &format!("x{i}"),
            ],
        );
    }
    c(con, &["MEM.APPEND", k, "user", "x0", "MSGID", "x0"]);
    let begin = as_fields(
        cmd(
            con,
            &[
                "MEM.SUMMARIZE_BEGIN",
                k,
                "60000",
                "KEEP",
                "2",
                "CONTEXT",
                "100",
            ],
        )
        .unwrap(),
    );
    let (lease, upto) = (int_field(&begin, "lease"), int_field(&begin, "upto"));
    if upto > 0 {
        c(
            con,
            &[
                "MEM.SUMMARIZE",
                k,
                &upto.to_string(),
                "summary",
                "LEASE",
                &lease.to_string(),
            ],
        );
    }
    c(con, &["MEM.SUMMARIZE_BEGIN", k, "60000", "CONTEXT", "10"]);
    std::thread::sleep(Duration::from_millis(2200));
    c(con, &["MEM.ATTRSET", k, "context", "[]"]);
    c(con, &["MEM.ATTRDEL", k, "user_profile"]);
    c(con, &["MEM.EXTSET", k, "n8n", "c"]);
    c(
        con,
        &[
            "MEM.APPEND",
            k,
            "user",
            "again",
            "MSGID",
            "x9",
            "MODEL",
            "gpt-4o",
        ],
    );
    c(con, &["MEM.APPEND", k, "user", "new", "TS", &old]);
}

#[test]
fn combined_writes_survive_aof_replay_and_rewrite() {
    for rewrite in [false, true] {
        let mut server = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
        let mut con = server.client();
        let k = "mem:{aof}";
        run(&mut con, k);
        if rewrite {
            let _ = cmd(&mut con, &["BGREWRITEAOF"]);
            session::wait_persistence_idle(&mut con);
        }
        let before = (digest(&mut con, k), session::json_text(&mut con, k));
        server.restart();
        let mut con = server.client();
        let after = (digest(&mut con, k), session::json_text(&mut con, k));
        let log = server.log();
        assert!(
            !log.contains("ASSERTION") && !log.contains("panick"),
            "log: {log}"
        );
        assert_eq!(
            before, after,
            "rewrite={rewrite}: the session changed through the AOF"
        );
    }
}
