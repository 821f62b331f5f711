//! Helpers of the `faults` tests: a large MEM.APPEND held in flight by
//! `mem.debug-count-delay-ms` on its own connection, what its client got
//! back, "exactly once or refused" checks, replica comparison, signals, and
//! crash detection (process gone, ASSERTION/crashed/panic in the log).
//! Every wait is bounded; every connection has I/O timeouts, so a hung
//! server fails a test instead of hanging it.
#![allow(dead_code)]

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult, Value};

use crate::support::server::*;
use crate::support::session;

/// How long a worker holds a count before doing it (the fault window).
pub const DELAY_MS: u64 = 1200;
/// Far above `mem.async-threshold-bytes` (65536): always counted by a worker.
pub const BIG_BYTES: usize = 200_000;
const IO_TIMEOUT: Duration = Duration::from_secs(20);
const APPENDER: &str = "fault-appender";

/// A connection to `port`, database `db`, with read/write timeouts.
pub fn conn(port: u16, db: i64) -> Connection {
    let url = format!("redis://127.0.0.1:{port}/{db}");
    let con = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("connect to {port}: {e}"));
    con.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    con.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    con
}

pub fn q(con: &mut Connection, args: &[&str]) -> RedisResult<Value> {
    cmd(con, args)
}

pub fn qok(con: &mut Connection, args: &[&str]) -> Value {
    cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub fn qint(con: &mut Connection, args: &[&str]) -> i64 {
    redis::from_redis_value(&qok(con, args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// A varied UTF-8 text of about `BIG_BYTES` bytes, distinct per seed.
pub fn big(seed: usize) -> String {
    let words = [
        "memory",
        "Redis",
        "token",
        "session",
        "über",
        "日本語",
        "🎉",
        "42",
        "fault",
        "\n",
    ];
    let mut out = format!("big text {seed}: ");
    let mut i = seed;
    while out.len() < BIG_BYTES {
        out.push_str(words[i % words.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

/// A short label for a message content in assertion messages.
pub fn label(s: &str) -> String {
    if s.len() <= 60 {
        return s.to_owned();
    }
    let head: String = s.chars().take(20).collect();
    format!("<{} bytes: {head}...>", s.len())
}

/// What the appending client got back.
#[derive(Debug)]
pub enum Outcome {
    /// A normal MEM.APPEND reply (its map fields).
    Applied(Vec<(String, Value)>),
    /// An error reply: its code (READONLY, UNBLOCKED, MOVED, ASK, OOM...),
    /// text, and for MOVED/ASK the node it redirects to.
    Refused {
        code: String,
        text: String,
        redirect: Option<(String, u16)>,
    },
    /// The connection closed without a reply.
    Closed(String),
}

impl Outcome {
    fn of(r: RedisResult<Value>) -> Outcome {
        match r {
            Ok(v @ (Value::Map(_) | Value::Array(_))) => Outcome::Applied(as_fields(v)),
            Ok(other) => panic!("MEM.APPEND replied {other:?}"),
            Err(e) if e.is_timeout() => {
                panic!("MEM.APPEND: no reply within {IO_TIMEOUT:?}: the server hung")
            }
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                Outcome::Closed(e.to_string())
            }
            Err(e) => Outcome::Refused {
                code: e.code().unwrap_or("?").to_owned(),
                text: e.to_string(),
                redirect: e.redirect_node().map(|(a, s)| (a.to_owned(), s)),
            },
        }
    }

    pub fn code(&self) -> Option<&str> {
        match self {
            Outcome::Refused { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A large MEM.APPEND sent from a thread on its own (named) connection.
pub struct Appender {
    port: u16,
    rx: mpsc::Receiver<Outcome>,
}

impl Appender {
    pub fn start(port: u16, db: i64, key: &str, content: &str) -> Appender {
        let (tx, rx) = mpsc::channel();
        let (key, content) = (key.to_owned(), content.to_owned());
        let mut con = conn(port, db);
        qok(&mut con, &["CLIENT", "SETNAME", APPENDER]);
        thread::spawn(move || {
            let r = redis::cmd("MEM.APPEND")
                .arg(&key)
                .arg("user")
                .arg(&content)
                .query::<Value>(&mut con);
            let _ = tx.send(Outcome::of(r));
        });
        Appender { port, rx }
    }

    /// Its `CLIENT LIST` line, if connected.
    pub fn client_line(&self, obs: &mut Connection) -> Option<String> {
        let list: String = redis::from_redis_value(&qok(obs, &["CLIENT", "LIST"])).unwrap();
        let name = format!(" name={APPENDER} ");
        list.lines().find(|l| l.contains(&name)).map(str::to_owned)
    }

    /// Whether it is blocked (flag `b`) in MEM.APPEND.
    pub fn is_blocked(&self, obs: &mut Connection) -> bool {
        self.client_line(obs).is_some_and(|l| {
            let flags = l
                .split(' ')
                .find_map(|f| f.strip_prefix("flags="))
                .unwrap_or("");
            flags.contains('b') && l.contains(" cmd=mem.append ")
        })
    }

    /// Waits until it is blocked (its large content is with a worker);
    /// returns its client id.
    pub fn wait_blocked(&self, obs: &mut Connection) -> String {
        session::wait_until(
            &format!("the append blocked on port {}", self.port),
            15,
            || self.is_blocked(obs),
        );
        let line = self.client_line(obs).unwrap();
        line.split(' ')
            .find_map(|f| f.strip_prefix("id="))
            .unwrap()
            .to_owned()
    }

    /// The reply (bounded: the connection's read timeout).
    pub fn outcome(&self) -> Outcome {
        self.rx
            .recv_timeout(IO_TIMEOUT + Duration::from_secs(5))
            .expect("the appending thread gave no outcome")
    }
}

/// Sets the worker delay (the fault window) on a server.
pub fn set_delay(con: &mut Connection, ms: u64) {
    qok(
        con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", &ms.to_string()],
    );
}

/// Counts done so far (`mem_tokenizer_calls`, bumped by a worker when it
/// has counted); None when the server does not answer.
pub fn counts(con: &mut Connection) -> Option<u64> {
    session::info_field(con, "mem", "mem_tokenizer_calls").and_then(|v| v.parse().ok())
}

/// Waits until a count after `since` is done, then lets the main thread
/// run a few event-loop turns so it acts on it (a crash shows up here).
/// Returns early if the server stops answering.
pub fn wait_counted(con: &mut Connection, since: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match counts(con) {
            Some(n) if n > since => break,
            None => return,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "the worker never finished its count"
        );
        thread::sleep(Duration::from_millis(20));
    }
    settle(con);
}

/// A few round trips on the main thread.
pub fn settle(con: &mut Connection) {
    for _ in 0..5 {
        thread::sleep(Duration::from_millis(40));
        if q(con, &["PING"]).is_err() {
            return;
        }
    }
}

/// Log lines that show a crash or a failed assertion.
pub fn crash_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            ["ASSERTION", "crashed", "panic", "BUG REPORT"]
                .iter()
                .any(|w| l.contains(w))
        })
        .collect()
}

/// What a failure report shows of a log: the crash lines and the failed
/// assertion, else its last lines.
pub fn log_excerpt(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let mut out: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.contains("==>")
                || l.contains("ASSERTION")
                || l.contains("crashed")
                || l.contains("panic")
        })
        .take(10)
        .collect();
    if out.is_empty() {
        out = lines[lines.len().saturating_sub(15)..].to_vec();
    }
    out.join("\n")
}

pub fn assert_log_clean(server: &Server, what: &str) {
    let log = server.log();
    let bad = crash_lines(&log);
    assert!(
        bad.is_empty(),
        "{what}: port {} crashed:\n{}",
        server.port,
        log_excerpt(&log)
    );
}

/// The server process is alive and its log shows no crash.
pub fn assert_no_crash(server: &mut Server, what: &str) {
    assert!(
        server.is_alive(),
        "{what}: port {} died:\n{}",
        server.port,
        log_excerpt(&server.log())
    );
    assert_log_clean(server, what);
}

/// Seeds `key` with two small messages and returns their contents.
pub fn seed(con: &mut Connection, key: &str) -> Vec<String> {
    let prior = vec!["first message".to_owned(), "second message".to_owned()];
    for p in &prior {
        qok(con, &["MEM.APPEND", key, "user", p]);
    }
    prior
}

/// The session holds exactly `want` (contents, ids 1..) and is consistent
/// (session::check_consistent: MEM.INFO, MEM.GET and FORMAT JSON agree).
pub fn expect_session(con: &mut Connection, key: &str, want: &[String], what: &str) {
    let doc = session::check_consistent(con, key);
    let got: Vec<(u64, String)> = doc
        .messages
        .iter()
        .map(|m| (m.id, label(&m.content)))
        .collect();
    let want: Vec<(u64, String)> = want
        .iter()
        .enumerate()
        .map(|(i, c)| (i as u64 + 1, label(c)))
        .collect();
    assert_eq!(got, want, "{what}: session {key}");
}

/// Exactly once or refused: applied, the owner's session holds `before` and
/// then `content` once (and the reply carries its id); refused or closed,
/// it holds `before` only.
pub fn expect_outcome(
    out: &Outcome,
    owner: &mut Connection,
    key: &str,
    before: &[String],
    content: &str,
    what: &str,
) {
    match out {
        Outcome::Applied(fields) => {
            let mut want = before.to_vec();
            want.push(content.to_owned());
            expect_session(owner, key, &want, &format!("{what} (applied)"));
            assert_eq!(
                int_field(fields, "id"),
                want.len() as i64,
                "{what}: the reply's id"
            );
        }
        _ => expect_session(owner, key, before, &format!("{what} (refused: {out:?})")),
    }
}

/// Waits until `n` replicas acknowledged everything the master wrote.
pub fn wait_replicas(master: &mut Connection, n: i64) {
    let acked = qint(master, &["WAIT", &n.to_string(), "5000"]);
    assert!(acked >= n, "only {acked} of {n} replicas caught up");
}

pub fn wait_link_up(replica: &mut Connection) {
    session::wait_until("replica link up", 20, || {
        session::info_field(replica, "replication", "master_link_status").as_deref() == Some("up")
    });
}

pub fn role(con: &mut Connection) -> String {
    session::info_field(con, "replication", "role").unwrap_or_default()
}

/// The replica (a connection in the same database) holds what the master
/// holds: DEBUG DIGEST of the dataset, and per key of the database DEBUG
/// DIGEST-VALUE and the FORMAT JSON document.
pub fn assert_replica_same(master: &mut Connection, replica: &mut Connection, what: &str) {
    assert_eq!(
        qok(master, &["DEBUG", "DIGEST"]),
        qok(replica, &["DEBUG", "DIGEST"]),
        "{what}: DEBUG DIGEST"
    );
    let mut keys: Vec<String> = redis::from_redis_value(&qok(master, &["KEYS", "*"])).unwrap();
    let mut rkeys: Vec<String> = redis::from_redis_value(&qok(replica, &["KEYS", "*"])).unwrap();
    keys.sort();
    rkeys.sort();
    assert_eq!(keys, rkeys, "{what}: keys");
    for k in &keys {
        assert_eq!(
            session::digest(master, k),
            session::digest(replica, k),
            "{what}: DIGEST-VALUE of {k}"
        );
        let json =
            |c: &mut Connection| q(c, &["MEM.GET", k, "FORMAT", "JSON"]).map_err(|e| e.to_string());
        assert!(
            json(master) == json(replica),
            "{what}: FORMAT JSON of {k} differs"
        );
    }
}

/// A full sync starts at once (not after the default 5 s wait for more replicas).
pub const NO_SYNC_DELAY: &[&str] = &["--repl-diskless-sync-delay", "0"];

/// A master and its replica (link up), both with `extra` arguments.
pub fn master_and_replica(extra: &[&str]) -> (Server, Server) {
    let master = Server::with_args(&[NO_SYNC_DELAY, extra].concat());
    let port = master.port.to_string();
    let mut args = vec!["--replicaof", "127.0.0.1", &port];
    args.extend_from_slice(&[NO_SYNC_DELAY, extra].concat());
    let replica = Server::with_args(&args);
    wait_link_up(&mut conn(replica.port, 0));
    (master, replica)
}

/// The server's process id.
pub fn pid(con: &mut Connection) -> i32 {
    session::info_field(con, "server", "process_id")
        .unwrap()
        .parse()
        .unwrap()
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// Waits until a server's process has exited (a shutdown completed).
pub fn wait_exit(server: &mut Server, what: &str) {
    session::wait_until(what, 20, || !server.is_alive());
}
