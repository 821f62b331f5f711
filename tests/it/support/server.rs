//! Test harness: real `redis-server` processes with the module loaded, on
//! loopback ports handed out from an atomic counter, each killed (and its
//! directory removed) in `Drop`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// The release build of the module, built by `make test` before the tests.
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("REDIS_MEM_MODULE") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_mem.so")
}

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// The command-line client that goes with the server (`redis-cli`, or e.g.
/// `valkey-cli` for Valkey): `REDIS_CLI`, default `redis-cli`.
pub fn redis_cli_bin() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A free loopback port. Each test process starts in its own band so
/// parallel runs do not collide: REDIS_MEM_TEST_PORT_BASE (tests/compat/run.sh
/// gives each server's run one), else one from its pid; ports in use are
/// skipped.
pub fn free_port() -> u16 {
    let base = std::env::var("REDIS_MEM_TEST_PORT_BASE")
        .ok()
        .and_then(|b| b.parse::<u16>().ok())
        .unwrap_or(20_000 + (std::process::id() % 200) as u16 * 100);
    let _ = NEXT_PORT.compare_exchange(0, base, Ordering::SeqCst, Ordering::SeqCst);
    loop {
        let port = NEXT_PORT.fetch_add(1, Ordering::SeqCst);
        // The cluster bus uses port + 10000: keep both free.
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port < 55_000 && free(port) && free(port + 10_000) {
            return port;
        }
    }
}

static NEXT_DIR: AtomicU16 = AtomicU16::new(0);

fn fresh_dir(port: u16) -> PathBuf {
    let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/test-servers")
        .join(format!("{}-{port}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create server dir");
    dir
}

/// The tests are compiled from the same sources as the module they load:
/// a module built from other sources (a stale target/release) must not pass
/// them. Skipped when REDIS_MEM_MODULE names a module on purpose.
pub fn check_module_is_current(con: &mut redis::Connection) {
    if std::env::var_os("REDIS_MEM_MODULE").is_some() {
        return;
    }
    let info: String = redis::cmd("INFO").arg("mem").query(con).unwrap_or_default();
    let want = format!("mem_build:{}", env!("REDIS_MEM_SOURCE_HASH"));
    assert!(
        info.lines().any(|l| l.trim() == want),
        "{} was not built from these sources (INFO mem has no {want}): run `cargo build --release` (make test does)",
        module_path().display()
    );
}

/// The module builds the default model's encoding in the background at
/// load (others on first use): tests start once it is ready, as they did
/// when it was built during the load.
fn wait_default_encoding(con: &mut redis::Connection, deadline: Instant) {
    loop {
        let info: String = redis::cmd("INFO").arg("mem").query(con).unwrap_or_default();
        let ready = info.lines().any(|l| {
            l.starts_with("mem_encodings_loaded:") && l.trim().len() > "mem_encodings_loaded:".len()
        });
        if ready || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A running redis-server with the module loaded.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// A server with no persistence.
    pub fn start() -> Server {
        Server::with_args(&[])
    }

    /// A server with extra `redis-server` arguments, e.g. `&["--appendonly", "yes"]`.
    pub fn with_args(extra: &[&str]) -> Server {
        Server::with_module_args(extra, &[])
    }

    /// Extra server arguments and `loadmodule` arguments (e.g. `["ttl", "5"]`).
    pub fn with_module_args(extra: &[&str], module_args: &[&str]) -> Server {
        let port = free_port();
        let dir = fresh_dir(port);
        let mut loadmodule = module_path().display().to_string();
        for a in module_args {
            loadmodule.push(' ');
            loadmodule.push_str(a);
        }
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--logfile".into(),
            "redis.log".into(),
            "--loadmodule".into(),
        ];
        args.extend(loadmodule.split(' ').map(str::to_owned));
        if std::env::var_os("REDIS_MEM_HOLDS").is_some() {
            // Measurement (make holds): every MEM.* command that held the
            // main thread 1 ms or more, collected when the server stops.
            args.extend(
                [
                    "--slowlog-log-slower-than",
                    "1000",
                    "--slowlog-max-len",
                    "4096",
                ]
                .map(str::to_owned),
            );
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut server = Server {
            port,
            dir,
            args,
            child: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(redis_server_bin())
            .args(&self.args)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed? `make test` installs it)");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = self.try_client() {
                let loading: Result<String, _> = redis::cmd("PING").query(&mut c);
                if loading.is_ok() {
                    check_module_is_current(&mut c);
                    wait_default_encoding(&mut c, deadline);
                    return;
                }
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("redis-server exited with {status}; log:\n{}", self.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn try_client(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        client.get_connection_with_timeout(Duration::from_secs(5))
    }

    /// A new connection (RESP2).
    pub fn client(&self) -> redis::Connection {
        self.try_client().expect("connect to redis-server")
    }

    /// A new RESP3 connection.
    pub fn client_resp3(&self) -> redis::Connection {
        let url = format!("redis://127.0.0.1:{}/?protocol=resp3", self.port);
        redis::Client::open(url)
            .and_then(|c| c.get_connection())
            .expect("connect with RESP3")
    }

    /// The server's log file.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Threads of the server process now (/proc/<pid>/task).
    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid())).map_or(0, |d| d.count())
    }

    /// Threads of the server process named `name` (/proc/<pid>/task/*/comm).
    pub fn threads_named(&self, name: &str) -> usize {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else {
            return 0;
        };
        tasks
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .count()
    }

    /// Whether the process is still running (a crash shows up here).
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGKILL, no chance to save anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server (SHUTDOWN NOSAVE, or SIGKILL) and starts it again on
    /// the same port and directory, e.g. to reload an RDB or AOF.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Restarts with different extra arguments (same port and directory).
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.kill9();
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        record_holds(self);
        self.kill9();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Runs a command, returning the raw value.
pub fn cmd(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// Runs a command whose reply is a map (RESP3) or a flat field/value array
/// (RESP2) of integers and strings, returning its fields in order.
pub fn map_reply(con: &mut redis::Connection, args: &[&str]) -> Vec<(String, redis::Value)> {
    let v = cmd(con, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    as_fields(v)
}

/// Turns a map or flat array value into `(field, value)` pairs.
pub fn as_fields(v: redis::Value) -> Vec<(String, redis::Value)> {
    match v {
        redis::Value::Map(pairs) => pairs
            .into_iter()
            .map(|(k, v)| (redis::from_redis_value::<String>(&k).unwrap(), v))
            .collect(),
        redis::Value::Array(items) => items
            .chunks(2)
            .map(|kv| {
                (
                    redis::from_redis_value::<String>(&kv[0]).unwrap(),
                    kv[1].clone(),
                )
            })
            .collect(),
        other => panic!("not a map: {other:?}"),
    }
}

/// An integer field of a map reply.
pub fn int_field(fields: &[(String, redis::Value)], name: &str) -> i64 {
    let (_, v) = fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"));
    redis::from_redis_value(v).unwrap()
}

/// A string field of a map reply.
pub fn str_field(fields: &[(String, redis::Value)], name: &str) -> String {
    let (_, v) = fields
        .iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"));
    redis::from_redis_value(v).unwrap()
}

/// An integer field of `INFO mem` (without the `mem_` prefix).
pub fn info_mem(con: &mut redis::Connection, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("mem").query(con).expect("INFO mem");
    let want = format!("mem_{field}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {want} in INFO mem:\n{info}"))
}

/// Clients blocked in MEM.APPEND now (flag `b` in CLIENT LIST).
pub fn blocked_appends(con: &mut redis::Connection) -> usize {
    blocked_in(con, "mem.append")
}

/// Clients blocked in MEM.IMPORT now (its document with a worker).
pub fn blocked_imports(con: &mut redis::Connection) -> usize {
    blocked_in(con, "mem.import")
}

/// Clients blocked (flag `b` in CLIENT LIST) in `command` (lower case).
pub fn blocked_in(con: &mut redis::Connection, command: &str) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(con)
        .expect("CLIENT LIST");
    list.lines()
        .filter(|l| {
            let field = |name: &str| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or("")
            };
            field("flags=").contains('b') && field("cmd=") == command
        })
        .count()
}

/// Polls `cond` (every 10 ms, at most 120 s) until it holds. A liveness
/// bound, not a timing check: a vocabulary build of 1-2 s took over 20 s
/// with four server suites, the Python tests and the oracles sharing two
/// cores (CI of f98fb55, kimi_k2 on Redis 8.0).
pub fn poll_until(
    con: &mut redis::Connection,
    what: &str,
    mut cond: impl FnMut(&mut redis::Connection) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond(con) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many times a test repeats work whose main-thread holds it reports:
/// 3 under `make holds` (REDIS_MEM_HOLDS set; a report takes the quickest
/// run, as a busy machine can deschedule any one), once otherwise, where
/// only the behaviour is asserted.
pub fn measured_runs() -> usize {
    if std::env::var_os("REDIS_MEM_HOLDS").is_some() {
        3
    } else {
        1
    }
}

/// With REDIS_MEM_HOLDS=<file>, appends the server's SLOWLOG entries of
/// MEM.* commands ("<microseconds> <command> <test>") to the file: what
/// `make holds` reports as the longest main-thread holds of the test suite.
fn record_holds(server: &Server) {
    let Some(path) = std::env::var_os("REDIS_MEM_HOLDS") else {
        return;
    };
    let Ok(client) = redis::Client::open(server.url()) else {
        return;
    };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
        return;
    };
    let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
    let Ok(redis::Value::Array(entries)) =
        redis::cmd("SLOWLOG").arg("GET").arg(4096).query(&mut con)
    else {
        return;
    };
    let test = std::thread::current().name().unwrap_or("?").to_owned();
    let mut lines = String::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let micros: i64 = fields
            .get(2)
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or(0);
        let command: String = match fields.get(3) {
            Some(redis::Value::Array(args)) => args
                .first()
                .and_then(|a| redis::from_redis_value(a).ok())
                .unwrap_or_default(),
            _ => String::new(),
        };
        if command.to_ascii_uppercase().starts_with("MEM.") {
            lines.push_str(&format!("{micros} {command} {test}\n"));
        }
    }
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(lines.as_bytes());
    }
}

/// A replica of `master`, synced, with a connection to it.
pub fn start_replica(master: &Server) -> (Server, redis::Connection) {
    let replica = Server::with_args(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let mut rcon = replica.client();
    poll_until(&mut rcon, "the replica to sync", |c| {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(c)
            .unwrap_or_default();
        info.contains("master_link_status:up")
    });
    (replica, rcon)
}

/// A varied text of about `bytes` bytes (words, numbers, CJK, emoji,
/// newlines; never pathological for tiktoken-rs, the tests' oracle).
pub fn varied_text(bytes: usize, seed: usize) -> String {
    let words = [
        "memory",
        "Redis",
        "token",
        "session",
        "summary",
        "42",
        "über",
        "日本語",
        "🎉",
        "\n",
    ];
    let mut out = String::new();
    let mut i = seed;
    while out.len() < bytes {
        out.push_str(words[i % words.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}
