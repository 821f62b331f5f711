//! Attack: no MEM.* command holds the main thread on a large input (SPEC 5
//! v2). Proven by what is observable, never by timing (the figures are
//! `make holds`): a large import runs on the pool while others are served.
//! The model-switch and summary cases of this review are in
//! models::switch and counting::async_count.

use crate::support::faults::*;
use crate::support::server::*;

fn text(bytes: usize, seed: usize) -> String {
    varied_text(bytes, seed)
}

#[test]
fn a_large_import_does_not_count_on_the_main_thread() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    let items: Vec<serde_json::Value> = (0..4)
        .map(|i| serde_json::json!({"role": "user", "content": text(3_900_000, i)}))
        .collect();
    let doc = serde_json::json!({ "conversation_history": items }).to_string();
    let jobs = info_mem(&mut c, "counts_off_thread");
    set_delay(&mut c, 1000);
    let port = server.port;
    let import = std::thread::spawn(move || q(&mut conn(port, 0), &["MEM.IMPORT", "imp", &doc]));
    poll_until(&mut c, "the import blocked on a worker", |c| {
        blocked_imports(c) == 1
    });
    // In flight: another client is served, the key does not exist yet.
    assert_eq!(
        qok(&mut c, &["PING"]),
        redis::Value::SimpleString("PONG".into())
    );
    qok(&mut c, &["MEM.APPEND", "other", "user", "served meanwhile"]);
    assert_eq!(
        qint(&mut c, &["EXISTS", "imp"]),
        0,
        "the key appeared before the worker was done"
    );
    assert_eq!(info_mem(&mut c, "counts_in_flight"), 1);
    assert_eq!(
        blocked_imports(&mut c),
        1,
        "the importer is still blocked after another client was served"
    );
    let reply = import.join().unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    // A worker counts its job done just after handing it back.
    poll_until(&mut c, "the pool's job done", |c| {
        info_mem(c, "counts_off_thread") == jobs + 1
    });
    assert_eq!(qint(&mut c, &["EXISTS", "imp"]), 1);
    let info = map_reply(&mut c, &["MEM.INFO", "imp"]);
    assert_eq!(int_field(&info, "last_id"), 4);
}
