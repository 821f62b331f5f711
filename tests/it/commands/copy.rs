//! attack3 (issue 12's MessageLog): COPY shares the message buffer between
//! two keys (`Arc`), so neither key may ever reclaim its evicted bytes in
//! place. A session at its caps must not grow without bound after a COPY,
//! and both keys must read back what was written to each.

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;

fn memory_usage(con: &mut redis::Connection, key: &str) -> i64 {
    int(con, &["MEMORY", "USAGE", key, "SAMPLES", "0"])
}

fn used_memory(con: &mut redis::Connection) -> i64 {
    session::info_int(con, "memory", "used_memory")
}

fn body(i: usize) -> String {
    format!("{i:06} {}", varied_text(1990, i))
}

#[test]
fn copy_at_caps_does_not_grow_either_key() {
    let server = Server::start();
    let mut con = server.client();
    let (src, dst) = ("mem:{cp}:src", "mem:{cp}:dst");
    for i in 0..30 {
        append(
            &mut con,
            src,
            "user",
            &body(i),
            &["MAXMSGS", "30", "TS", &(1000 + i).to_string()],
        );
    }
    ok(&mut con, &["COPY", src, dst]);
    assert_eq!(digest(&mut con, src), digest(&mut con, dst));
    let usage_at_copy = memory_usage(&mut con, dst);
    let used_at_copy = used_memory(&mut con);

    // Both keys take 3,000 more messages at their cap of 30 (~6 MB each).
    for i in 30..3030 {
        let ts = (1000 + i).to_string();
        append(
            &mut con,
            dst,
            "assistant",
            &body(i),
            &["MAXMSGS", "30", "TS", &ts],
        );
        append(
            &mut con,
            src,
            "assistant",
            &body(i),
            &["MAXMSGS", "30", "TS", &ts],
        );
    }
    // Same writes, same messages: the copy and the original agree...
    assert_eq!(
        get(&mut con, &["MEM.GET", src]),
        get(&mut con, &["MEM.GET", dst])
    );
    let got = get(&mut con, &["MEM.GET", dst]);
    assert_eq!(got.len(), 30);
    for (n, e) in got.iter().enumerate() {
        assert_eq!(e.content, body(3000 + n), "message {} of the copy", e.id);
    }
    // ... and each still costs about 30 messages, not the 3,030 it was sent.
    let usage = memory_usage(&mut con, dst);
    assert!(
        usage < usage_at_copy * 2,
        "MEMORY USAGE of a copy at its caps grew from {usage_at_copy} to {usage} over 3,000 appends"
    );
    let growth = used_memory(&mut con) - used_at_copy;
    assert!(
        growth < 1_000_000,
        "used_memory grew {growth} B with two sessions of 30 x 2 KB at their caps"
    );
}

fn small(i: usize) -> String {
    format!("{i:06} {}", varied_text(290, i))
}

#[test]
fn copy_then_summarize_and_refill_reads_back() {
    let server = Server::start();
    let mut con = server.client();
    let (src, dst) = ("mem:{cp2}:src", "mem:{cp2}:dst");
    ok(&mut con, &["CONFIG", "SET", "rdbcompression", "no"]);
    for i in 0..150 {
        append(
            &mut con,
            src,
            if i % 2 == 0 { "user" } else { "my-own-role" },
            &small(i),
            &["TS", &(5000 + i).to_string(), "MAXMSGS", "1000"],
        );
    }
    ok(&mut con, &["COPY", src, dst]);
    // Summarize the copy down to nothing, then refill it; the source is untouched.
    let before = digest(&mut con, src);
    ok(
        &mut con,
        &["MEM.SUMMARIZE", dst, "150", "everything so far"],
    );
    assert_eq!(int_field(&info(&mut con, dst), "messages"), 0);
    for i in 150..210 {
        // One call, then its results (a result cannot open the session).
        let role = if i == 150 { "assistant" } else { "tool" };
        append(&mut con, dst, role, &small(i), &["META", r#"{"k":1}"#]);
    }
    assert_eq!(
        digest(&mut con, src),
        before,
        "a write to the copy changed the source"
    );
    let src_msgs = get(&mut con, &["MEM.GET", src]);
    assert_eq!(src_msgs.len(), 150);
    for (n, e) in src_msgs.iter().enumerate() {
        assert_eq!(e.content, small(n));
        assert_eq!(e.role, if n % 2 == 0 { "user" } else { "my-own-role" });
    }
    // MEM.GET leads with the summary.
    let mut dst_msgs = get(&mut con, &["MEM.GET", dst]);
    assert_eq!(
        (dst_msgs[0].role.as_str(), dst_msgs[0].content.as_str()),
        ("summary", "everything so far")
    );
    dst_msgs.remove(0);
    assert_eq!(
        dst_msgs.len(),
        60,
        "{:?}",
        dst_msgs
            .iter()
            .map(|e| (e.id, e.role.clone(), e.content.len()))
            .collect::<Vec<_>>()
    );
    for (n, e) in dst_msgs.iter().enumerate() {
        assert_eq!(
            (e.content.as_str(), e.role.as_str(), e.meta.as_deref()),
            (
                small(150 + n).as_str(),
                if n == 0 { "assistant" } else { "tool" },
                Some(r#"{"k":1}"#)
            )
        );
    }
    // Both survive DUMP/RESTORE unchanged.
    for k in [src, dst] {
        let d = session::dump(&mut con, k);
        let before = (
            digest(&mut con, k),
            json_text(&mut con, k),
            session::module_payload(&d),
        );
        // Keeps the TTL (a digest counts whether the key expires).
        let ttl = session::pttl(&mut con, k).max(0);
        redis::cmd("RESTORE")
            .arg(k)
            .arg(ttl)
            .arg(&d)
            .arg("REPLACE")
            .query::<()>(&mut con)
            .unwrap();
        let d2 = session::dump(&mut con, k);
        let after = (
            digest(&mut con, k),
            json_text(&mut con, k),
            session::module_payload(&d2),
        );
        if before != after {
            let (p, q) = (&before.2, &after.2);
            let at = p.iter().zip(q.iter()).position(|(x, y)| x != y);
            panic!("{k}: DUMP/RESTORE changed it: json equal {}, payload lengths {} {}, first difference at {at:?}: {:?} vs {:?}",
                before.1 == after.1, p.len(), q.len(), at.map(|a| &p[a.saturating_sub(8)..(a + 8).min(p.len())]), at.map(|a| &q[a.saturating_sub(8)..(a + 8).min(q.len())]));
        }
    }
}
