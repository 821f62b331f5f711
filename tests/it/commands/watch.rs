//! Attack: a MEM.* write that is refused changes nothing -- and so must not
//! look like a change to WATCH (optimistic locking) or client-side caching.
//! Redis's own refused writes (WRONGTYPE, a bad argument) leave a WATCHed
//! key clean. Today every key MEM.* opens for writing is signalled as
//! modified when it is closed (Redis 7.0 moduleCloseKey), even on error.

use crate::support::faults::*;
use crate::support::server::*;
use crate::support::session;

fn exec_survives(server: &Server, key: &str, refused: &[&str]) {
    let mut w = conn(server.port, 0);
    let mut other = conn(server.port, 0);
    let before = session::digest(&mut other, key);
    qok(&mut w, &["WATCH", key]);
    assert!(
        q(&mut other, refused).is_err(),
        "{refused:?} should be refused"
    );
    assert_eq!(
        session::digest(&mut other, key),
        before,
        "{refused:?} changed the key"
    );
    qok(&mut w, &["MULTI"]);
    qok(&mut w, &["PING"]);
    let exec = qok(&mut w, &["EXEC"]);
    assert!(
        !matches!(exec, redis::Value::Nil),
        "EXEC aborted: the refused {refused:?} (nothing changed) invalidated WATCH on {key}"
    );
}

#[test]
fn a_refused_summarize_does_not_invalidate_watch() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    qok(&mut c, &["MEM.APPEND", "s", "user", "hello"]);
    exec_survives(&server, "s", &["MEM.SUMMARIZE", "s", "999", "a summary"]);
}

#[test]
fn wrongtype_does_not_invalidate_watch() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    qok(&mut c, &["SET", "str", "v"]);
    exec_survives(&server, "str", &["MEM.APPEND", "str", "user", "x"]);
    exec_survives(&server, "str", &["MEM.EXTSET", "str", "dify", "c1"]);
}

/// And every write that changed the session does invalidate WATCH (the
/// module signals it itself): APPEND, APPENDBATCH, SUMMARIZE, EXTSET,
/// IMPORT REPLACE, and a large APPEND resumed after its worker.
#[test]
fn every_write_that_changes_a_session_invalidates_watch() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    qok(&mut c, &["MEM.APPEND", "s", "user", "one"]);
    qok(&mut c, &["MEM.APPEND", "s", "assistant", "two"]);
    let big = "word ".repeat(20_000);
    let writes: Vec<Vec<&str>> = vec![
        vec!["MEM.APPEND", "s", "user", "three"],
        vec![
            "MEM.APPENDBATCH",
            "s",
            r#"[{"role":"user","content":"four"}]"#,
        ],
        vec!["MEM.SUMMARIZE", "s", "1", "one was said"],
        vec!["MEM.EXTSET", "s", "dify", "c1"],
        vec![
            "MEM.IMPORT",
            "s",
            r#"{"conversation_history":[{"role":"user","content":"x"}]}"#,
            "REPLACE",
        ],
        vec!["MEM.APPEND", "s", "user", &big],
    ];
    for write in writes {
        let mut w = conn(server.port, 0);
        let mut other = conn(server.port, 0);
        qok(&mut w, &["WATCH", "s"]);
        qok(&mut other, &write);
        qok(&mut w, &["MULTI"]);
        qok(&mut w, &["PING"]);
        let exec = qok(&mut w, &["EXEC"]);
        assert!(
            matches!(exec, redis::Value::Nil),
            "{:?} did not invalidate WATCH",
            &write[..2]
        );
    }
}
