//! Corrupt and truncated DUMP payloads given to RESTORE: refused, never a
//! crash, nothing half-applied (crafted message sections:
//! persistence::restore_crafted).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

use crate::support::report::*;
use crate::support::server::*;
use crate::support::session::*;

fn restore_check(
    con: &mut redis::Connection,
    payload: &[u8],
    stats: &mut (usize, usize, usize),
    problems: &mut Violations,
    what: &str,
) {
    stats.0 += 1;
    let r = redis::cmd("RESTORE")
        .arg("mem:{cor}:target")
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query::<Value>(con);
    match r {
        Err(e) if e.is_io_error() || e.is_connection_dropped() => {
            panic!("{what}: connection lost: {e}")
        }
        Err(_) => stats.1 += 1,
        Ok(_) => {
            stats.2 += 1;
            if let Some(p) = consistency_problem(con, "mem:{cor}:target") {
                let class = if p.contains("not valid JSON") {
                    "RESTORE accepted a session whose FORMAT JSON is not valid JSON"
                } else {
                    "RESTORE accepted an inconsistent session"
                };
                problems.add(class, format!("{what}: {p}"));
            }
            // It must also take a write and come back from a DUMP.
            if let Err(e) = cmd(
                con,
                &["MEM.APPEND", "mem:{cor}:target", "user", "after restore"],
            ) {
                if e.code().is_none() {
                    panic!("{what}: append after restore: {e}");
                }
            }
            let d = dump(con, "mem:{cor}:target");
            if let Err(e) = redis::cmd("RESTORE")
                .arg("mem:{cor}:again")
                .arg(0)
                .arg(&d)
                .arg("REPLACE")
                .query::<Value>(con)
            {
                problems.add(
                    "restored session does not survive a second DUMP/RESTORE",
                    format!("{what}: {e}"),
                );
            }
        }
    }
}

#[test]
fn corrupt_and_truncated_dump_payloads_are_refused_never_crash() {
    let mut server = Server::start();
    let mut con = server.client();
    let mut stats = (0usize, 0usize, 0usize); // tried, refused, accepted
    let mut problems = Violations::default();
    for compression in ["no", "yes"] {
        ok(&mut con, &["CONFIG", "SET", "rdbcompression", compression]);
        let key = format!("mem:{{cor}}:src-{compression}");
        ok(
            &mut con,
            &[
                "MEM.IMPORT",
                &key,
                r#"{"conversation_history":[{"role":"user","content":"hello there, how are you doing today","timestamp":"2024-01-01T00:00:00"},{"role":"assistant","content":"fine","meta":{"tool_calls":[{"id":"a"}]}}],"user_profile":{"name":"Ana","tags":["a","b"]},"context":{"x":1}}"#,
                "TTL",
                "0",
            ],
        );
        for i in 0..6 {
            ok(
                &mut con,
                &[
                    "MEM.APPEND",
                    &key,
                    if i % 3 == 2 { "tool" } else { "user" },
                    &format!("message number {i} with some text"),
                ],
            );
        }
        let upto = int_field(
            &map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", &key, "KEEP", "3"]),
            "upto",
        )
        .to_string();
        ok(
            &mut con,
            &["MEM.SUMMARIZE", &key, &upto, "a summary of it all"],
        );
        ok(&mut con, &["MEM.EXTSET", &key, "dify", "conv-42"]);
        check_consistent(&mut con, &key);
        let full = dump(&mut con, &key);
        let (payload, ver) = split_dump(&full);
        let payload = payload.to_vec();

        // The intact payload restores to an identical session.
        redis::cmd("RESTORE")
            .arg("mem:{cor}:target")
            .arg(0)
            .arg(&full)
            .arg("REPLACE")
            .query::<()>(&mut con)
            .unwrap();
        assert_eq!(digest(&mut con, "mem:{cor}:target"), digest(&mut con, &key));

        for len in 0..full.len() {
            // Truncated as is (Redis's checksum refuses it) ...
            restore_check(
                &mut con,
                &full[..len],
                &mut stats,
                &mut problems,
                &format!("raw truncation at {len}"),
            );
        }
        for len in 0..payload.len() {
            // ... and truncated with a valid footer, reaching the loader.
            let p = with_footer(&payload[..len], ver);
            restore_check(
                &mut con,
                &p,
                &mut stats,
                &mut problems,
                &format!("truncation at {len} + footer"),
            );
        }
        for at in 0..payload.len() {
            for mask in [0x01u8, 0x02, 0x10, 0x80, 0xff] {
                let mut p = payload.clone();
                p[at] ^= mask;
                let p = with_footer(&p, ver);
                restore_check(
                    &mut con,
                    &p,
                    &mut stats,
                    &mut problems,
                    &format!("byte {at} ^ {mask:#04x} (compression {compression})"),
                );
            }
            if at % 200 == 0 {
                assert!(
                    server.is_alive(),
                    "crashed near byte {at}:\n{}",
                    tail(&server.log())
                );
            }
        }
        // Random garbage of plausible shape.
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..500 {
            let mut p = payload.clone();
            for _ in 0..rng.gen_range(1..8) {
                let at = rng.gen_range(0..p.len());
                p[at] = rng.gen();
            }
            restore_check(
                &mut con,
                &with_footer(&p, ver),
                &mut stats,
                &mut problems,
                "random bytes",
            );
        }
    }
    assert!(
        server.is_alive(),
        "server crashed:\n{}",
        tail(&server.log())
    );
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    println!(
        "hostile/corrupt dumps: {} payloads tried, {} refused, {} accepted (all consistent: {}), crashes 0",
        stats.0,
        stats.1,
        stats.2,
        problems.is_empty()
    );
    problems.print();
    assert!(problems.is_empty(), "problems:\n{}", problems.summary());
}
