//! Large sessions are freed off the main thread (the type's free_effort):
//! UNLINK, FLUSHALL ASYNC and lazy expiry hand them to Redis's background
//! thread, as Redis does for its own large values; small ones are freed at once.

use crate::support::server::*;

fn stat(con: &mut redis::Connection, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO memory"))
}

fn session(con: &mut redis::Connection, key: &str, messages: usize) {
    for i in 0..messages {
        cmd(
            con,
            &[
                "MEM.APPEND",
                key,
                "user",
                &format!("message {i}"),
                "MAXMSGS",
                "100000",
                "MAXTOKENS",
                "10000000",
            ],
        )
        .unwrap();
    }
}

#[test]
fn large_sessions_are_freed_lazily_and_small_ones_at_once() {
    let server = Server::with_args(&["--lazyfree-lazy-expire", "yes"]);
    let mut con = server.client();
    session(&mut con, "mem:{small}", 10);
    session(&mut con, "mem:{large}", 300);
    session(&mut con, "mem:{flush}", 300);
    session(&mut con, "mem:{expire}", 300);
    assert_eq!(info_mem(&mut con, "sessions"), 4);
    let lazy = stat(&mut con, "lazyfreed_objects");
    cmd(&mut con, &["UNLINK", "mem:{small}"]).unwrap();
    assert_eq!(
        stat(&mut con, "lazyfreed_objects"),
        lazy,
        "a 10-message session is freed at once"
    );
    assert_eq!(info_mem(&mut con, "sessions"), 3);
    cmd(&mut con, &["UNLINK", "mem:{large}"]).unwrap();
    poll_until(&mut con, "the large session freed in the background", |c| {
        stat(c, "lazyfreed_objects") == lazy + 1
    });
    cmd(&mut con, &["PEXPIRE", "mem:{expire}", "1"]).unwrap();
    poll_until(
        &mut con,
        "the expired session freed in the background",
        |c| stat(c, "lazyfreed_objects") == lazy + 2,
    );
    cmd(&mut con, &["FLUSHALL", "ASYNC"]).unwrap();
    poll_until(&mut con, "every session freed", |c| {
        info_mem(c, "sessions") == 0
    });
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");

    // Hostile pass 40: a few large values are slow to free too (60
    // attributes of 4 MB: UNLINK held the main thread 7-18 ms): a session of
    // 4 attributes of 1 MB, or 4 messages of 1 MB, goes to the background.
    let value = serde_json::to_string(&"v".repeat(1 << 20)).unwrap();
    for i in 0..4 {
        cmd(
            &mut con,
            &["MEM.ATTRSET", "mem:{attrs}", &format!("a{i}"), &value],
        )
        .unwrap();
        cmd(
            &mut con,
            &["MEM.APPEND", "mem:{big}", "user", &value, "TOKENS", "1"],
        )
        .unwrap();
    }
    let lazy = stat(&mut con, "lazyfreed_objects");
    for (n, key) in ["mem:{attrs}", "mem:{big}"].into_iter().enumerate() {
        cmd(&mut con, &["UNLINK", key]).unwrap();
        poll_until(&mut con, "the session freed in the background", |c| {
            stat(c, "lazyfreed_objects") == lazy + 1 + n as i64
        });
    }
}
