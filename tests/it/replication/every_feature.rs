//! attack2: one session through MSGID + MAXAGE (mixed TS) + trims + summaries
//! + leases + imports + model switches + attributes; after every step the
//!   replica must match (digest + FORMAT JSON), and DEBUG RELOAD, DUMP/RESTORE
//!   and FORMAT JSON -> MEM.IMPORT must keep the session loadable.

use std::time::Duration;

use crate::support::server::*;
use crate::support::session;
use crate::support::session::{digest, json_text};

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn step(
    con: &mut redis::Connection,
    rcon: &mut redis::Connection,
    k: &str,
    what: &str,
    log: &mut Vec<String>,
) {
    let _ = redis::cmd("WAIT").arg(1).arg(2000).query::<i64>(con);
    std::thread::sleep(Duration::from_millis(30));
    let (dm, dr) = (digest(con, k), digest(rcon, k));
    if dm != dr {
        log.push(format!("{what}: replica digest differs"));
    }
    let (jm, jr) = (json_text(con, k), json_text(rcon, k));
    if jm != jr {
        log.push(format!(
            "{what}: replica JSON differs:\n m {jm:.400}\n r {jr:.400}"
        ));
    }
    // DUMP/RESTORE
    let d: Vec<u8> = redis::cmd("DUMP").arg(k).query(con).unwrap_or_default();
    if !d.is_empty() {
        let r: redis::RedisResult<()> = redis::cmd("RESTORE")
            .arg(format!("{k}:copy"))
            .arg(if session::pttl(con, k) > 0 {
                100_000_000
            } else {
                0
            })
            .arg(d)
            .arg("REPLACE")
            .query(con);
        if let Err(e) = r {
            log.push(format!("{what}: RESTORE refused: {e}"));
        } else if digest(con, &format!("{k}:copy")) != dm {
            log.push(format!("{what}: RESTORE digest differs"));
        }
        let _: () = redis::cmd("DEL")
            .arg(format!("{k}:copy"))
            .query(con)
            .unwrap();
    }
    // JSON round trip
    let r = cmd(con, &["MEM.IMPORT", &format!("{k}:imp"), &jm, "REPLACE"]);
    match r {
        Err(e) => log.push(format!("{what}: FORMAT JSON refused by MEM.IMPORT: {e}")),
        Ok(_) => {
            let back = json_text(con, &format!("{k}:imp"));
            let strip = |t: &str| {
                let mut v: serde_json::Value = serde_json::from_str(t).unwrap();
                v.as_object_mut().unwrap().remove("total_tokens");
                v
            };
            if strip(&back) != strip(&jm) {
                log.push(format!(
                    "{what}: import round trip differs:\n a {jm:.600}\n b {back:.600}"
                ));
            }
        }
    }
    if let Err(e) = cmd(con, &["DEBUG", "RELOAD"]) {
        log.push(format!("{what}: DEBUG RELOAD failed: {e}"));
    }
    if digest(con, k) != dm {
        log.push(format!("{what}: digest changed by DEBUG RELOAD"));
    }
}

#[test]
fn everything_combined_stays_loadable_and_replicated() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let k = "mem:{mix}";
    let mut log = Vec::new();
    let old = (now_ms() - 5_000).to_string();
    let recent = (now_ms() + 500).to_string();
    let batch = |i: usize, ts: &str| {
        format!(
            r#"[{{"role":"assistant","content":"call {i}","msgid":"b{i}a","ts":{ts}}},{{"role":"tool","content":"res {i}","msgid":"b{i}t"}},{{"role":"user","content":"u {i}","meta":{{"x":[1,2]}}}}]"#
        )
    };
    let steps: Vec<(String, Vec<String>)> = vec![
        (
            "attrset".into(),
            vec!["MEM.ATTRSET", k, "user_profile", r#"{"name":"A","n":1.50}"#]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        (
            "append maxage".into(),
            vec![
                "MEM.APPEND",
                k,
                "user",
                "hi",
                "MSGID",
                "m1",
                "MAXAGE",
                "3",
                "MAXMSGS",
                "8",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "append old ts".into(),
            vec![
                "MEM.APPEND",
                k,
                "assistant",
                "old call",
                "MSGID",
                "m2",
                "TS",
                &old,
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "append tool after old".into(),
            vec!["MEM.APPEND", k, "tool", "result", "MSGID", "m3"]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        (
            "batch".into(),
            vec!["MEM.APPENDBATCH".to_string(), k.into(), batch(1, &old)],
        ),
        (
            "batch2".into(),
            vec!["MEM.APPENDBATCH".to_string(), k.into(), batch(2, &recent)],
        ),
        (
            "retry".into(),
            vec!["MEM.APPEND", k, "user", "hi", "MSGID", "m1"]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        (
            "model switch".into(),
            vec![
                "MEM.APPEND",
                k,
                "user",
                "switch",
                "MODEL",
                "gpt-4",
                "MSGID",
                "m4",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "attrset2".into(),
            vec!["MEM.ATTRSET", k, "context", r#"[1,{"a":"\u00e9"}]"#]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        (
            "extset".into(),
            vec!["MEM.EXTSET", k, "dify", "c1"]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
    ];
    for (what, args) in &steps {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        if let Err(e) = cmd(&mut con, &a) {
            log.push(format!("{what}: {e}"));
        }
        step(&mut con, &mut rcon, k, what, &mut log);
    }
    // Many appends to trim; then a lease + summary.
    for i in 0..12 {
        let _ = cmd(
            &mut con,
            &[
                "MEM.APPEND",
                k,
                if i % 3 == 2 { "tool" } else { "user" },
                &format!("t{i}"),
                "MSGID",
                &format!("t{i}"),
            ],
        );
    }
    step(&mut con, &mut rcon, k, "trims", &mut log);
    let begin =
        as_fields(cmd(&mut con, &["MEM.SUMMARIZE_BEGIN", k, "60000", "KEEP", "2"]).unwrap());
    step(&mut con, &mut rcon, k, "begin", &mut log);
    let (lease, upto) = (int_field(&begin, "lease"), int_field(&begin, "upto"));
    if upto > 0 {
        if let Err(e) = cmd(
            &mut con,
            &[
                "MEM.SUMMARIZE",
                k,
                &upto.to_string(),
                "a summary",
                "LEASE",
                &lease.to_string(),
            ],
        ) {
            log.push(format!("summarize: {e}"));
        }
        step(&mut con, &mut rcon, k, "summarize", &mut log);
    }
    // Let the age limit pass: reads filter; then a write on master evicts.
    std::thread::sleep(Duration::from_millis(3500));
    step(&mut con, &mut rcon, k, "aged, no write", &mut log);
    let _ = cmd(&mut con, &["MEM.ATTRSET", k, "user_profile", "{}"]);
    step(&mut con, &mut rcon, k, "aged attrset", &mut log);
    let _ = cmd(&mut con, &["MEM.ATTRDEL", k, "context"]);
    step(&mut con, &mut rcon, k, "attrdel", &mut log);
    let _ = cmd(&mut con, &["MEM.APPEND", k, "user", "back", "MSGID", "t11"]);
    step(&mut con, &mut rcon, k, "retry departed", &mut log);
    let log_text = master.log();
    assert!(
        !log_text.contains("ASSERTION") && !log_text.contains("panick"),
        "master log: {log_text}"
    );
    assert!(log.is_empty(), "problems:\n{}", log.join("\n"));
}
