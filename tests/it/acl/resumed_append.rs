//! Attack: ACL changes while a large MEM.APPEND is counted. SPEC 5 (v2):
//! "The command resumed after the count passes the same checks as a fresh
//! command" -- the ACL check is one of them. A user whose key pattern or
//! command permission is revoked while its append waits for a worker must
//! get NOPERM, and the key must not be written.

use crate::support::faults::*;
use crate::support::server::*;

fn revoked_while_counting(revoke: &[&str]) {
    let server = Server::start();
    let mut admin = conn(server.port, 0);
    qok(
        &mut admin,
        &["ACL", "SETUSER", "alice", "on", ">pw", "~mem:*", "+@all"],
    );
    set_delay(&mut admin, DELAY_MS);
    let content = big(1);
    let port = server.port;
    let appender = std::thread::spawn(move || {
        let mut c = conn(port, 0);
        qok(&mut c, &["AUTH", "alice", "pw"]);
        q(&mut c, &["MEM.APPEND", "mem:{a}", "user", &content])
    });
    poll_until(&mut admin, "the append blocked on a worker", |c| {
        blocked_appends(c) == 1
    });
    let mut args = vec!["ACL", "SETUSER", "alice"];
    args.extend_from_slice(revoke);
    qok(&mut admin, &args);
    // A fresh command of alice's is refused now ...
    let mut fresh = conn(port, 0);
    qok(&mut fresh, &["AUTH", "alice", "pw"]);
    let e = q(&mut fresh, &["MEM.APPEND", "mem:{a}", "user", "small"]).unwrap_err();
    assert_eq!(
        e.code(),
        Some("NOPERM"),
        "fresh command after the ACL change: {e}"
    );
    // ... and so must the resumed one be, changing nothing.
    let reply = appender.join().unwrap();
    assert!(
        matches!(&reply, Err(e) if e.code() == Some("NOPERM")),
        "the resumed append of a user whose permission was revoked ({revoke:?}) must be refused with NOPERM, got {reply:?}"
    );
    assert_eq!(
        qint(&mut admin, &["EXISTS", "mem:{a}"]),
        0,
        "the key was written"
    );
    assert_no_crash(&mut { server }, "acl");
}

#[test]
fn acl_key_pattern_revoked_while_counting_refuses_the_resumed_append() {
    revoked_while_counting(&["resetkeys", "~other:*"]);
}

#[test]
fn acl_command_revoked_while_counting_refuses_the_resumed_append() {
    revoked_while_counting(&["-mem.append"]);
}
