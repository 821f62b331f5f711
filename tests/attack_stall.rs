//! Attack: no MEM.* command holds the main thread for more than 10 ms on
//! input within the configured limits (SPEC 5 v2). A pinger measures the
//! main thread's worst PING latency while the command runs; the bound here
//! is 100 ms (10x the spec, for a shared 2-core machine). Today these paths
//! count on the main thread: the resumed command re-counts inline when the
//! session's model changed during the count, and a model switch re-counts
//! the whole session inline. (The large-import test proves its point by
//! what is observable instead of by timing.)

mod common;
mod faultkit;
mod relkit;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use faultkit::*;

const BOUND: Duration = Duration::from_millis(100);

/// Varied text of about `bytes` bytes.
fn text(bytes: usize, seed: usize) -> String {
    let words = ["memory", "Redis", "token", "session", "summary", "42", "über", "日本語", "\n"];
    let mut out = String::new();
    let mut i = seed;
    while out.len() < bytes {
        out.push_str(words[i % words.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

struct Pinger {
    stop: Arc<AtomicBool>,
    worst: Arc<Mutex<Duration>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Pinger {
    fn start(port: u16) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let worst = Arc::new(Mutex::new(Duration::ZERO));
        let (s, w) = (stop.clone(), worst.clone());
        let thread = std::thread::spawn(move || {
            let mut c = conn(port, 0);
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                qok(&mut c, &["PING"]);
                let d = t.elapsed();
                let mut g = w.lock().unwrap();
                if d > *g {
                    *g = d;
                }
            }
        });
        Pinger { stop, worst, thread: Some(thread) }
    }
    fn reset(&self) {
        *self.worst.lock().unwrap() = Duration::ZERO;
    }
    fn worst(&self) -> Duration {
        std::thread::sleep(Duration::from_millis(200));
        *self.worst.lock().unwrap()
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn attack_resumed_batch_after_a_model_switch_does_not_recount_on_the_main_thread() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    qok(&mut c, &["MEM.APPEND", "sb", "user", "hi", "MAXTOKENS", "10000000"]);
    let items: Vec<serde_json::Value> =
        (0..4).map(|i| serde_json::json!({"role": "user", "content": text(3_900_000, i)})).collect();
    let doc = serde_json::to_string(&items).unwrap();
    set_delay(&mut c, DELAY_MS);
    let port = server.port;
    let batch = std::thread::spawn(move || q(&mut conn(port, 0), &["MEM.APPENDBATCH", "sb", &doc]));
    relkit::wait_until("the batch blocked on a worker", 15, || {
        info_mem(&mut c, "counts_in_flight") == 1
    });
    // Another client switches the session's tokenizer while the worker counts.
    qok(&mut c, &["MEM.APPEND", "sb", "user", "x", "MODEL", "gpt-4"]);
    let pinger = Pinger::start(port);
    std::thread::sleep(Duration::from_millis(100));
    pinger.reset();
    let reply = batch.join().unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    let worst = pinger.worst();
    assert!(
        worst < BOUND,
        "the resumed 15 MB batch re-counted under the new model on the main thread: PING waited {worst:?}"
    );
}

#[test]
fn attack_a_model_switch_of_a_large_session_does_not_recount_on_the_main_thread() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    qok(&mut c, &["MEM.APPEND", "sw", "user", "hi", "MAXTOKENS", "10000000"]);
    // 15 MB of history, each message counted by the pool.
    for i in 0..4 {
        qok(&mut c, &["MEM.APPEND", "sw", "user", &text(3_900_000, i)]);
    }
    let pinger = Pinger::start(server.port);
    std::thread::sleep(Duration::from_millis(100));
    pinger.reset();
    qok(&mut c, &["MEM.APPEND", "sw", "user", "switch", "MODEL", "gpt-4"]);
    let worst = pinger.worst();
    assert!(worst < BOUND, "a MODEL switch re-counted 15 MB on the main thread: PING waited {worst:?}");
}

/// A large import is parsed and counted by the pool: proven by what is
/// observable, not by timing (a worker holds the job for a second; during
/// it the main thread serves others, the importer is blocked, the key is
/// not there yet; afterwards the pool has done one more job).
#[test]
fn attack_a_large_import_does_not_count_on_the_main_thread() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    let items: Vec<serde_json::Value> =
        (0..4).map(|i| serde_json::json!({"role": "user", "content": text(3_900_000, i)})).collect();
    let doc = serde_json::json!({ "conversation_history": items }).to_string();
    let jobs = info_mem(&mut c, "counts_off_thread");
    set_delay(&mut c, 1000);
    let port = server.port;
    let import = std::thread::spawn(move || q(&mut conn(port, 0), &["MEM.IMPORT", "imp", &doc]));
    poll_until(&mut c, "the import blocked on a worker", |c| blocked_imports(c) == 1);
    // In flight: another client is served, the key does not exist yet.
    assert_eq!(qok(&mut c, &["PING"]), redis::Value::SimpleString("PONG".into()));
    qok(&mut c, &["MEM.APPEND", "other", "user", "served meanwhile"]);
    assert_eq!(qint(&mut c, &["EXISTS", "imp"]), 0, "the key appeared before the worker was done");
    assert_eq!(info_mem(&mut c, "counts_in_flight"), 1);
    assert_eq!(blocked_imports(&mut c), 1, "the importer is still blocked after another client was served");
    let reply = import.join().unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    // A worker counts its job done just after handing it back.
    poll_until(&mut c, "the pool's job done", |c| info_mem(c, "counts_off_thread") == jobs + 1);
    assert_eq!(qint(&mut c, &["EXISTS", "imp"]), 1);
    let info = map_reply(&mut c, &["MEM.INFO", "imp"]);
    assert_eq!(int_field(&info, "last_id"), 4);
}

#[test]
fn attack_a_large_summary_is_not_counted_on_the_main_thread() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    // Within the configured limits: mem.max-message-bytes raised to 16 MB.
    qok(&mut c, &["CONFIG", "SET", "mem.max-message-bytes", "16777216"]);
    qok(&mut c, &["MEM.APPEND", "ss", "user", "hi", "MAXTOKENS", "10000000"]);
    qok(&mut c, &["MEM.APPEND", "ss", "user", "hi again"]);
    let summary = text(12_000_000, 9);
    let pinger = Pinger::start(server.port);
    std::thread::sleep(Duration::from_millis(100));
    pinger.reset();
    qok(&mut c, &["MEM.SUMMARIZE", "ss", "1", &summary]);
    let worst = pinger.worst();
    assert!(worst < BOUND, "MEM.SUMMARIZE of a 12 MB summary counted on the main thread: PING waited {worst:?}");
}

#[test]
fn attack_resumed_append_after_a_model_switch_does_not_recount_on_the_main_thread() {
    let server = Server::start();
    let mut c = conn(server.port, 0);
    // Within the configured limits: mem.max-message-bytes raised to 16 MB.
    qok(&mut c, &["CONFIG", "SET", "mem.max-message-bytes", "16777216"]);
    qok(&mut c, &["MEM.APPEND", "sa", "user", "hi", "MAXTOKENS", "10000000"]);
    let content = text(12_000_000, 3);
    set_delay(&mut c, DELAY_MS);
    let port = server.port;
    let append = std::thread::spawn(move || q(&mut conn(port, 0), &["MEM.APPEND", "sa", "user", &content]));
    poll_until(&mut c, "the append blocked on a worker", |c| blocked_appends(c) == 1);
    qok(&mut c, &["MEM.APPEND", "sa", "user", "x", "MODEL", "gpt-4"]);
    let pinger = Pinger::start(port);
    std::thread::sleep(Duration::from_millis(100));
    pinger.reset();
    let reply = append.join().unwrap();
    assert!(reply.is_ok(), "{reply:?}");
    let worst = pinger.worst();
    assert!(
        worst < BOUND,
        "the resumed 12 MB append re-counted under the new model on the main thread: PING waited {worst:?}"
    );
}
