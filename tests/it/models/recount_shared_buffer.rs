//! attack3 (issue 12's MessageLog): a model switch re-counts a large
//! session on a worker from a snapshot that shares the session's buffer.
//! While the worker holds it (mem.debug-count-delay-ms), other clients
//! append at the caps (evicting every message the snapshot holds), add
//! large messages, summarize and set attributes. Afterwards every message
//! reads back as written with its cl100k count, the memory held during the
//! count stayed bounded, and a replica holds the same session.

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;

fn body(i: usize) -> String {
    format!("{i:06} {}", varied_text(1990, i * 3 + 2))
}

fn memory_usage(con: &mut redis::Connection, key: &str) -> i64 {
    int(con, &["MEMORY", "USAGE", key, "SAMPLES", "0"])
}

/// MEM.APPEND ... MODEL gpt-4 from another client: its reply or error.
fn switch_model(
    master: &Server,
) -> std::thread::JoinHandle<Result<Vec<(String, redis::Value)>, String>> {
    let url = master.url();
    std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        let args = [
            "MEM.APPEND",
            "mem:{ms3}",
            "user",
            "now on gpt-4",
            "MODEL",
            "gpt-4",
            "MAXMSGS",
            "200",
            "MAXTOKENS",
            "5000000",
        ];
        cmd(&mut c, &args).map(as_fields).map_err(|e| e.to_string())
    })
}

#[test]
fn model_switch_while_the_snapshot_shares_the_buffer() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let k = "mem:{ms3}";
    let caps = ["MAXMSGS", "200", "MAXTOKENS", "5000000"];
    let mut sent = std::collections::HashMap::new();
    for i in 0..200 {
        let id = int_field(
            &append(
                &mut con,
                k,
                if i % 4 == 3 { "critic" } else { "user" },
                &body(i),
                &caps,
            ),
            "id",
        );
        sent.insert(id, body(i));
    }
    let usage_before = memory_usage(&mut con, k);
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "2000"],
    );
    // Round 1: 300 appends at the cap meanwhile (all 200 snapshot messages
    // evicted), a summary, an attribute: more new text than the switch may
    // count inline, so it is refused with TRYAGAIN (nothing changed by it).
    let reply = switch_model(&master);
    poll_until(&mut con, "the switching append blocked on a worker", |c| {
        blocked_appends(c) == 1
    });
    let mut peak = 0;
    for i in 200..500 {
        let id = int_field(&append(&mut con, k, "assistant", &body(i), &caps), "id");
        sent.insert(id, body(i));
        if i == 350 {
            let upto = int_field(
                &map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", k, "KEEP", "150"]),
                "upto",
            )
            .to_string();
            ok(
                &mut con,
                &["MEM.SUMMARIZE", k, &upto, "summary while the worker counts"],
            );
            ok(&mut con, &["MEM.ATTRSET", k, "mood", r#""calm""#]);
        }
        if i % 25 == 0 {
            peak = peak.max(memory_usage(&mut con, k));
        }
    }
    let still_blocked = blocked_appends(&mut con) == 1;
    let first = reply.join().unwrap();
    println!("attack3 model: MEMORY USAGE {usage_before} before, peak {peak} during the count (blocked throughout: {still_blocked}); round 1: {first:?}");
    assert!(
        peak < usage_before * 2,
        "MEMORY USAGE grew to {peak} (was {usage_before}) while a snapshot was held"
    );
    if let Err(e) = &first {
        assert!(e.to_lowercase().contains("tryagain"), "round 1: {e}");
    }
    assert_eq!(
        str_field(&map_reply(&mut con, &["MEM.INFO", k]), "encoding"),
        "o200k_base"
    );
    // Round 2: 10 appends meanwhile (20 KB, counted inline on its return:
    // below cl100k_base's 32 KB inline cap).
    let reply = switch_model(&master);
    poll_until(&mut con, "the switching append blocked again", |c| {
        blocked_appends(c) == 1
    });
    for i in 500..510 {
        let id = int_field(&append(&mut con, k, "tool", &body(i), &caps), "id");
        sent.insert(id, body(i));
    }
    let reply = reply
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("round 2: {e}"));
    ok(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "0"],
    );
    assert_eq!(
        str_field(&map_reply(&mut con, &["MEM.INFO", k]), "encoding"),
        "cl100k_base"
    );
    let doc = session::parse_doc(&session::json_text(&mut con, k));
    for m in &doc.messages {
        assert_eq!(
            m.tokens as i64,
            mt_c(&m.role, &m.content),
            "id {} under cl100k",
            m.id
        );
        if let Some(want) = sent.get(&(m.id as i64)) {
            assert_eq!(&m.content, want, "id {} reads back wrong", m.id);
        }
    }
    assert_eq!(int_field(&reply, "total_tokens") as u64, doc.total_tokens);
    session::check_consistent(&mut con, k);
    let _: redis::Value = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    assert_eq!(session::digest(&mut con, k), session::digest(&mut rcon, k));
    assert_eq!(
        session::json_text(&mut con, k),
        session::json_text(&mut rcon, k)
    );
    // And it saves and loads.
    let before = session::snap(&mut con, k);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    session::assert_same(
        &before,
        &session::snap(&mut con, k),
        "DEBUG RELOAD after the switch",
        2000,
    );
}
