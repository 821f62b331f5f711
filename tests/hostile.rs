//! Hostile conditions: concurrent writers (with a summarizer racing them),
//! a seeded fuzzer of MEM.* commands, corrupt and truncated DUMP payloads,
//! maxmemory, MEMORY USAGE and ACL key patterns (crafted internal-command
//! payloads: tests/internal.rs). The server must never crash, every failure must be an error
//! reply that changes nothing, and every session must stay consistent.

mod common;
mod relkit;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

use common::*;
use relkit::*;

const BIG_CAPS: [&str; 4] = ["MAXMSGS", "100000", "MAXTOKENS", "10000000"];

fn setup_big(con: &mut redis::Connection, key: &str) {
    let mut args = vec!["MEM.APPEND", key, "system", "setup", "TTL", "0"];
    args.extend(BIG_CAPS);
    ok(con, &args);
}

/// Runs `writers` threads of `per` appends each on `key`; returns, per
/// writer, the (id, content) of each acknowledged append in order.
fn run_writers(server: &Server, key: &str, writers: usize, per: usize) -> Vec<Vec<(u64, String)>> {
    let handles: Vec<_> = (0..writers)
        .map(|t| {
            let mut con = server.client();
            let key = key.to_owned();
            std::thread::spawn(move || {
                (0..per)
                    .map(|i| {
                        let content = format!("client {t} message {i}");
                        let f = map_reply(&mut con, &["MEM.APPEND", &key, "user", &content]);
                        (int_field(&f, "id") as u64, content)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn concurrent_appends_all_land_in_order() {
    let server = Server::start();
    let mut con = server.client();
    let key = "mem:{conc}";
    setup_big(&mut con, key);
    let acked = run_writers(&server, key, 8, 500);
    let doc = check_consistent(&mut con, key);
    assert_eq!(
        doc.messages.len(),
        1 + 8 * 500,
        "messages after 8 x 500 appends"
    );
    let by_content: HashMap<&str, u64> = doc
        .messages
        .iter()
        .map(|m| (m.content.as_str(), m.id))
        .collect();
    let mut ids = HashSet::new();
    for (t, list) in acked.iter().enumerate() {
        let mut prev = 0;
        for (id, content) in list {
            assert_eq!(
                by_content.get(content.as_str()),
                Some(id),
                "client {t}: {content}"
            );
            assert!(*id > prev, "client {t}: its messages out of order");
            prev = *id;
            assert!(ids.insert(*id), "id {id} handed out twice");
        }
    }
    let last = doc.messages.last().unwrap().id;
    assert_eq!(last, 4001, "ids are 1..=4001 without gaps");
    println!("hostile/concurrency: 8 clients x 500 appends: {} acknowledged, {} present, ids unique and ordered", ids.len(), doc.messages.len() - 1);
}

#[test]
fn concurrent_appends_with_a_racing_summarizer_lose_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let key = "mem:{race}";
    setup_big(&mut con, key);
    let done = Arc::new(AtomicBool::new(false));
    let summarizer = {
        let mut con = server.client();
        let done = done.clone();
        std::thread::spawn(move || {
            let (mut applied, mut refused, mut last_upto) = (0u64, 0u64, 0i64);
            for n in 0..100_000 {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let check = map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", key, "KEEP", "20"]);
                let upto = int_field(&check, "upto");
                if upto <= last_upto {
                    continue;
                }
                match cmd(
                    &mut con,
                    &[
                        "MEM.SUMMARIZE",
                        key,
                        &upto.to_string(),
                        &format!("summary {n} up to {upto}"),
                    ],
                ) {
                    Ok(v) => {
                        let f = as_fields(v);
                        assert_eq!(int_field(&f, "id"), upto);
                        applied += 1;
                        last_upto = upto;
                    }
                    Err(e) => {
                        assert!(e.code().is_some(), "not an error reply: {e}");
                        refused += 1;
                    }
                }
            }
            (applied, refused, last_upto)
        })
    };
    let acked = run_writers(&server, key, 8, 500);
    done.store(true, Ordering::Relaxed);
    let (applied, refused, last_upto) = summarizer.join().unwrap();
    let doc = check_consistent(&mut con, key);
    assert_eq!(
        doc.summary_upto as i64, last_upto,
        "the last applied summary is the session's"
    );
    let present: HashMap<&str, u64> = doc
        .messages
        .iter()
        .map(|m| (m.content.as_str(), m.id))
        .collect();
    let (mut kept, mut summarized) = (0, 0);
    for list in &acked {
        for (id, content) in list {
            if *id as i64 <= last_upto {
                assert!(
                    !present.contains_key(content.as_str()),
                    "{content} (id {id}) survived its summary"
                );
                summarized += 1;
            } else {
                assert_eq!(
                    present.get(content.as_str()),
                    Some(id),
                    "{content} (id {id}) lost"
                );
                kept += 1;
            }
        }
    }
    assert_eq!(
        doc.messages.len(),
        kept,
        "messages in the session beyond the acknowledged ones"
    );
    assert!(applied > 0, "the summarizer never ran");
    println!(
        "hostile/summarizer race: {} appends acknowledged, {summarized} covered by {applied} summaries ({refused} refused), \
         {kept} after the last summary (upto {last_upto}) all present",
        kept + summarized
    );
}

// ---- the fuzzer -----------------------------------------------------------

const FUZZ_KEYS: [&str; 3] = ["mem:{fz}:a", "mem:{fz}:b", "mem:{fz}:c"];
const OPTIONS: [&str; 16] = [
    "TS",
    "META",
    "MODEL",
    "TTL",
    "MAXTOKENS",
    "MAXMSGS",
    "LAST",
    "AFTER",
    "BUDGET",
    "FORMAT",
    "KEEP",
    "CONTEXT",
    "EX",
    "REPLACE",
    "json",
    "maxmsgs",
];

fn deep_json(depth: usize) -> String {
    format!("{{\"d\":{}{}}}", "[".repeat(depth), "]".repeat(depth))
}

fn huge_json(items: usize) -> String {
    let body: Vec<String> = (0..items)
        .map(|i| format!("{{\"k{i}\":\"{}\"}}", "v".repeat(i % 50)))
        .collect();
    format!("{{\"items\":[{}]}}", body.join(","))
}

struct Gen {
    rng: StdRng,
    session_payloads: Vec<Vec<u8>>,
    op_payloads: Vec<Vec<u8>>,
}

impl Gen {
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.gen_range(0..items.len())]
    }

    fn random_bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.rng.gen_range(0..=max);
        (0..n).map(|_| self.rng.gen()).collect()
    }

    fn number(&mut self) -> Vec<u8> {
        let choices = [
            "0",
            "1",
            "2",
            "5",
            "30",
            "-1",
            "-0",
            "+3",
            " 5",
            "5 ",
            "3.5",
            "1e3",
            "0x10",
            "nan",
            "",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999999",
            "4294967296",
            "100000",
            "3153600000",
            "3153600001",
            "9007199254740991",
            "9007199254740992",
        ];
        if self.rng.gen_bool(0.3) {
            self.rng.gen_range(0..200u64).to_string().into_bytes()
        } else {
            self.pick(&choices).as_bytes().to_vec()
        }
    }

    fn json_doc(&mut self) -> Vec<u8> {
        let docs: Vec<String> = vec![
            "{}".into(),
            "[]".into(),
            "null".into(),
            "\"str\"".into(),
            "{".into(),
            "{\"a\":}".into(),
            "{\"a\":1,\"a\":2}".into(),
            "{\"tool_calls\":[{\"id\":\"c1\"}]}".into(),
            deep_json(10_000),
            deep_json(100),
            // META at the deepest level accepted (124) and one past it.
            deep_json(123),
            deep_json(124),
            r#"{"a":"\ud800"}"#.into(),
            r#"{"n":1e400}"#.into(),
            huge_json(20_000),
            r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"2024-01-01T00:00:00"}],"user_profile":{"n":1}}"#.into(),
            r#"{"conversation_history":[{"role":"user","content":"hi","timestamp":"not a time"}]}"#.into(),
            r#"{"conversation_history":[{"role":"","content":"hi"}]}"#.into(),
            r#"{"conversation_history":[{"id":5,"role":"user","content":"a"},{"id":3,"role":"user","content":"b"}]}"#.into(),
            r#"{"conversation_history":[{"id":-5,"role":"user","content":"a"}]}"#.into(),
            r#"{"conversation_history":[{"id":18446744073709551615,"role":"user","content":"a"}]}"#.into(),
            r#"{"conversation_history":[{"id":9007199254740991,"role":"user","content":"a"}]}"#.into(),
            r#"{"conversation_history":[{"id":9007199254740992,"role":"user","content":"a"}]}"#.into(),
            r#"{"conversation_history":[{"role":"tool","content":"orphan"},{"role":"user","content":"a"}]}"#.into(),
            r#"{"conversation_history":[],"user_profile":{"s":"\udfff"}}"#.into(),
            r#"{"conversation_history":{},"summary":[]}"#.into(),
            r#"{"conversation_history":[{"role":"user","content":"x","meta":[1]}]}"#.into(),
            r#"{"conversation_history":[{"role":"user","content":"x","ts":-99999999999999999}],"summary":{"content":"s","upto":0}}"#.into(),
            r#"{"conversation_history":[{"id":2,"role":"user","content":"x"}],"summary":{"content":"s","upto":7}}"#.into(),
            r#"{"conversation_history":[],"model":"","total_tokens":-1}"#.into(),
            format!(r#"{{"conversation_history":[],"user_profile":{}}}"#, deep_json(10_000)),
            format!(
                r#"{{"conversation_history":[{}],"context":{{}}}}"#,
                (0..3000).map(|i| format!(r#"{{"role":"user","content":"m{i}"}}"#)).collect::<Vec<_>>().join(",")
            ),
        ];
        self.pick(&docs).clone().into_bytes()
    }

    /// A value meant to break something.
    fn hostile(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..10) {
            0 | 1 => self.number(),
            2 => self.random_bytes(40),
            3 => self
                .pick(&[
                    &b"\xff\xfe"[..],
                    b"ok\x80",
                    b"\xc3\x28",
                    b"\xed\xa0\x80",
                    b"\0",
                    b"a\0b",
                ])
                .to_vec(),
            4 => self.json_doc(),
            5 => self.pick(&OPTIONS).as_bytes().to_vec(),
            6 => self
                .pick(&[
                    "user",
                    "tool",
                    "summary",
                    "",
                    "gpt-4",
                    "claude-3-5-sonnet",
                    "unknown-model",
                    "JSON",
                    "RESP",
                ])
                .as_bytes()
                .to_vec(),
            7 => "r".repeat(self.rng.gen_range(60..70)).into_bytes(),
            8 => "m".repeat(self.rng.gen_range(250..260)).into_bytes(),
            _ => format!("text {} 🚀 ü", self.rng.gen::<u32>()).into_bytes(),
        }
    }

    fn mutate_payload(&mut self, mut p: Vec<u8>) -> Vec<u8> {
        match self.rng.gen_range(0..4) {
            0 if !p.is_empty() => {
                let at = self.rng.gen_range(0..p.len());
                p.truncate(at);
            }
            1 => p.extend(self.random_bytes(4)),
            _ => {
                for _ in 0..self.rng.gen_range(1..4) {
                    if !p.is_empty() {
                        let at = self.rng.gen_range(0..p.len());
                        p[at] ^= 1 << self.rng.gen_range(0..8);
                    }
                }
            }
        }
        p
    }

    fn key(&mut self) -> Vec<u8> {
        match self.rng.gen_range(0..20) {
            0 => b"fz:string".to_vec(),
            1 => format!("mem:{{fz}}:new{}", self.rng.gen_range(0..50)).into_bytes(),
            2 => self.random_bytes(8),
            _ => self.pick(&FUZZ_KEYS).as_bytes().to_vec(),
        }
    }

    /// A well-formed command of a random kind.
    fn valid(&mut self) -> Vec<Vec<u8>> {
        let key = self.key();
        let s = |x: &str| x.as_bytes().to_vec();
        let mut c: Vec<Vec<u8>>;
        let opt = |c: &mut Vec<Vec<u8>>, name: &str, value: Vec<u8>, rng: &mut StdRng| {
            if rng.gen_bool(0.3) {
                c.push(name.as_bytes().to_vec());
                c.push(value);
            }
        };
        match self.rng.gen_range(0..12) {
            0..=2 => {
                let role = self
                    .pick(&["user", "assistant", "tool", "system"])
                    .to_string();
                c = vec![
                    s("MEM.APPEND"),
                    key,
                    s(&role),
                    format!("content {}", self.rng.gen::<u16>()).into_bytes(),
                ];
                let ts = self
                    .rng
                    .gen_range(0..2_000_000_000_000u64)
                    .to_string()
                    .into_bytes();
                opt(&mut c, "TS", ts, &mut self.rng);
                opt(&mut c, "META", s("{\"n\":1}"), &mut self.rng);
                let model = s(*self.pick(&["gpt-4o", "gpt-4", "claude-3-5-sonnet", "o3-mini"]));
                opt(&mut c, "MODEL", model, &mut self.rng);
                let ttl = self.rng.gen_range(100..100000u64).to_string().into_bytes();
                opt(&mut c, "TTL", ttl, &mut self.rng);
                let mt = self.rng.gen_range(1..5000u64).to_string().into_bytes();
                opt(&mut c, "MAXTOKENS", mt, &mut self.rng);
                let mm = self.rng.gen_range(1..40u64).to_string().into_bytes();
                opt(&mut c, "MAXMSGS", mm, &mut self.rng);
                // Few msgids, so retries (held and departed) come up.
                let msgid = format!("m{}", self.rng.gen_range(0..30)).into_bytes();
                opt(&mut c, "MSGID", msgid, &mut self.rng);
            }
            3 => {
                c = vec![s("MEM.GET"), key];
                let n = self.number();
                opt(&mut c, "LAST", n, &mut self.rng);
                let n = self.number();
                opt(&mut c, "AFTER", n, &mut self.rng);
                let n = self.number();
                opt(&mut c, "BUDGET", n, &mut self.rng);
                let f = s(*self.pick(&["RESP", "JSON", "json", "XML"]));
                opt(&mut c, "FORMAT", f, &mut self.rng);
            }
            4 => {
                c = if self.rng.gen_bool(0.5) {
                    vec![s("MEM.SUMMARIZE_CHECK"), key]
                } else {
                    let lease_ms = s(*self.pick(&["1", "50", "60000", "86400000"]));
                    vec![s("MEM.SUMMARIZE_BEGIN"), key, lease_ms]
                };
                let m = s(*self.pick(&["gpt-4o", "gpt-4.1", "unknown"]));
                opt(&mut c, "MODEL", m, &mut self.rng);
                let n = self.number();
                opt(&mut c, "CONTEXT", n, &mut self.rng);
                let n = self.number();
                opt(&mut c, "KEEP", n, &mut self.rng);
            }
            5 => {
                let upto = self.number();
                c = vec![
                    s("MEM.SUMMARIZE"),
                    key,
                    upto,
                    format!("summary {}", self.rng.gen::<u16>()).into_bytes(),
                ];
                let token = self.rng.gen_range(1..5u64).to_string().into_bytes();
                opt(&mut c, "LEASE", token, &mut self.rng);
            }
            6 => {
                let sys = s(*self.pick(&["dify", "n8n", "", "x"]));
                c = vec![s("MEM.EXTSET"), key, sys, s("conv-1")];
                let n = self.number();
                opt(&mut c, "EX", n, &mut self.rng);
            }
            7 => c = vec![s("MEM.EXTGET"), key, s("dify")],
            8 => {
                let doc = self.json_doc();
                c = vec![s("MEM.IMPORT"), key, doc];
                if self.rng.gen_bool(0.5) {
                    c.push(s("REPLACE"));
                }
                let m = s("gpt-4");
                opt(&mut c, "MODEL", m, &mut self.rng);
                let n = self.number();
                opt(&mut c, "TTL", n, &mut self.rng);
            }
            9 => c = vec![s("MEM.INFO"), key],
            10 => {
                let p = self.pick(&self.op_payloads.clone()).clone();
                let p = self.mutate_payload(p);
                c = vec![s("MEM._APPLY"), key, p];
            }
            _ => {
                let p = self.pick(&self.session_payloads.clone()).clone();
                let p = if self.rng.gen_bool(0.5) {
                    self.mutate_payload(p)
                } else {
                    self.random_bytes(64)
                };
                c = vec![s("MEM._PUT"), key, p];
            }
        }
        c
    }

    fn command(&mut self) -> Vec<Vec<u8>> {
        if self.rng.gen_bool(0.1) {
            // Pure noise after a MEM.* name.
            let name = self.pick(&[
                "MEM.APPEND",
                "MEM.GET",
                "MEM.SUMMARIZE_CHECK",
                "MEM.SUMMARIZE",
                "MEM.EXTSET",
                "MEM.EXTGET",
                "MEM.IMPORT",
                "MEM.INFO",
                "MEM._APPLY",
                "MEM._PUT",
                "mem.append",
                "MEM.SUMMARIZE_BEGIN",
            ]);
            let mut c = vec![name.as_bytes().to_vec()];
            for _ in 0..self.rng.gen_range(0..7) {
                c.push(if self.rng.gen_bool(0.5) {
                    self.key()
                } else {
                    self.hostile()
                });
            }
            return c;
        }
        let mut c = self.valid();
        for _ in 0..self.rng.gen_range(0..3) {
            match self.rng.gen_range(0..7) {
                0 if c.len() > 1 => {
                    let at = self.rng.gen_range(1..c.len());
                    c.remove(at);
                }
                1 if c.len() > 1 => {
                    let at = self.rng.gen_range(1..c.len());
                    c[at] = self.hostile();
                }
                2 if c.len() > 2 => {
                    // Repeat an option (or any trailing pair).
                    let at = self.rng.gen_range(2..c.len());
                    let pair: Vec<Vec<u8>> = c[at..(at + 2).min(c.len())].to_vec();
                    c.extend(pair);
                }
                3 => {
                    let name = self.pick(&OPTIONS).as_bytes().to_vec();
                    c.push(name); // option without its value
                }
                4 => {
                    c.push(b"NOPE".to_vec());
                    c.push(self.hostile());
                }
                5 => {
                    let at = self.rng.gen_range(1..=c.len());
                    let v = self.hostile();
                    c.insert(at, v);
                }
                _ => {}
            }
        }
        c
    }
}

fn printable(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| {
            let s = String::from_utf8_lossy(a);
            if s.len() > 60 {
                format!(
                    "{}...({} B)",
                    &s[..s.char_indices().nth(50).map_or(s.len(), |(i, _)| i)],
                    a.len()
                )
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn digests(con: &mut redis::Connection) -> Vec<String> {
    FUZZ_KEYS.iter().map(|k| digest(con, k)).collect()
}

/// Reference payloads for the internal commands: sessions taken from DUMP
/// (rdbcompression no) and ops of both formats built by relkit's encoder.
fn reference_payloads(con: &mut redis::Connection) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    ok(con, &["CONFIG", "SET", "rdbcompression", "no"]);
    let keys = populate_variety(con, "mem:{ref}");
    let sessions: Vec<Vec<u8>> = keys.iter().map(|k| module_payload(&dump(con, k))).collect();
    let s = default_psettings();
    let ops = vec![
        op_append(
            1_700_000_000_000,
            &s,
            &PMessage {
                id: 1000,
                role: b"user",
                content: b"hello",
                ts: 1,
                tokens: 5,
                meta: None,
            },
        ),
        op_append(
            1_700_000_000_000,
            &s,
            &PMessage {
                id: 1001,
                role: b"tool",
                content: b"x",
                ts: 2,
                tokens: 5,
                meta: Some(b"{}"),
            },
        ),
        op_summarize(1_700_000_000_000, b"sum", 7, 3, 5),
        op_extset(1_700_000_000_000, &s, b"dify", b"c1", 1_900_000_000_000),
        // Format 1, as the AOFs of release 0.1 carry them.
        op_append_v1(
            1_700_000_000_000,
            &s,
            &PMessage {
                id: 1002,
                role: b"user",
                content: b"old",
                ts: 3,
                tokens: 5,
                meta: Some(b"{}"),
            },
        ),
        op_summarize_v1(1_700_000_000_000, b"sum", 7, 3, 5),
        op_extset_v1(1_700_000_000_000, &s, b"n8n", b"c2", 1_900_000_000_000),
    ];
    (sessions, ops)
}

#[test]
fn fuzzed_commands_never_crash_and_failures_change_nothing() {
    let mut server = Server::start();
    let mut con = server.client();
    let (session_payloads, op_payloads) = reference_payloads(&mut con);
    ok(&mut con, &["SET", "fz:string", "not a session"]);
    for k in FUZZ_KEYS {
        for i in 0..5 {
            ok(&mut con, &["MEM.APPEND", k, "user", &format!("seed {i}")]);
        }
    }
    let mut gen = Gen {
        rng: StdRng::seed_from_u64(0x5eed_2024),
        session_payloads,
        op_payloads,
    };
    let (mut sent, mut errors, mut oks) = (0usize, 0usize, 0usize);
    let mut error_kinds: HashMap<String, usize> = HashMap::new();
    let mut violations = Violations::default();
    let mut before = digests(&mut con);
    let trace = std::env::var("FUZZ_TRACE").is_ok();
    for n in 0..6000 {
        let args = gen.command();
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        if trace {
            println!("#{n}: {}", printable(&args));
        }
        let reply = cmd_bin(&mut con, &refs);
        if trace {
            println!("   -> {reply:.200?}");
        }
        sent += 1;
        if !server.is_alive() {
            panic!(
                "server crashed on command #{n}: {}\nlog:\n{}",
                printable(&args),
                tail(&server.log())
            );
        }
        match reply {
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                panic!(
                    "connection lost on command #{n}: {} ({e})\nlog:\n{}",
                    printable(&args),
                    tail(&server.log())
                )
            }
            Err(e) if e.code().is_none() => {
                // Not a well-formed error reply (e.g. not valid UTF-8: the
                // client cannot parse it and the connection is unusable).
                errors += 1;
                *error_kinds.entry("MALFORMED".to_owned()).or_default() += 1;
                violations.add(
                    "malformed (non-UTF-8) error reply",
                    format!("{} -> {e}", printable(&args)),
                );
                con = server.client();
                let after = digests(&mut con);
                if after != before {
                    violations.add("failed command changed a session", printable(&args));
                }
                before = after;
            }
            Err(e) => {
                errors += 1;
                let code = e.code().unwrap_or("?").to_owned();
                *error_kinds.entry(code).or_default() += 1;
                let after = digests(&mut con);
                if after != before {
                    violations.add(
                        "failed command changed a session",
                        format!("{} -> {e}", printable(&args)),
                    );
                }
                before = after;
            }
            Ok(_) => {
                oks += 1;
                let after = digests(&mut con);
                for (i, k) in FUZZ_KEYS.iter().enumerate() {
                    // No command deletes a session: one gone after OK had an
                    // expiry that overflowed (a huge TTL on Redis 7.0).
                    if after[i].starts_with("0000000000") && !before[i].starts_with("0000000000") {
                        violations.add(
                            "session gone right after a successful command",
                            printable(&args),
                        );
                    }
                    if after[i] != before[i] {
                        if let Some(p) = consistency_problem(&mut con, k) {
                            let class = if p.contains("not valid JSON") {
                                "session whose FORMAT JSON is not valid JSON"
                            } else {
                                "inconsistent session after a successful command"
                            };
                            violations.add(class, format!("after {}: {p}", printable(&args)));
                        }
                        // The changed session must survive DUMP/RESTORE.
                        let d = dump(&mut con, k);
                        let r = redis::cmd("RESTORE")
                            .arg("mem:{fz}:scratch")
                            .arg(0)
                            .arg(&d)
                            .arg("REPLACE")
                            .query::<Value>(&mut con);
                        if let Err(e) = r {
                            violations.add(
                                "session no longer survives DUMP/RESTORE",
                                format!("after {}: {k}: {e}", printable(&args)),
                            );
                        }
                    }
                }
                before = after;
            }
        }
        if n % 250 == 0 {
            let pong: String = redis::cmd("PING").query(&mut con).unwrap();
            assert_eq!(pong, "PONG");
            // Keep the fixed sessions around.
            for k in FUZZ_KEYS {
                if digest(&mut con, k).starts_with("0000000000") {
                    ok(&mut con, &["MEM.APPEND", k, "user", "revive"]);
                }
            }
            before = digests(&mut con);
        }
    }
    // Everything must also survive a reload of the whole dataset.
    let final_digests = digests(&mut con);
    ok(&mut con, &["DEBUG", "RELOAD"]);
    assert!(
        server.is_alive(),
        "DEBUG RELOAD crashed the server:\n{}",
        tail(&server.log())
    );
    assert_eq!(
        digests(&mut con),
        final_digests,
        "sessions changed across DEBUG RELOAD"
    );
    let mut kinds: Vec<_> = error_kinds.into_iter().collect();
    kinds.sort();
    println!("hostile/fuzz: {sent} commands sent, {oks} ok, {errors} error replies {kinds:?}, crashes 0, violations {}", violations.total());
    violations.print();
    assert!(
        violations.is_empty(),
        "violations:\n{}",
        violations.summary()
    );
}

/// Violations by class: count and the first few examples.
#[derive(Default)]
struct Violations(Vec<(String, usize, Vec<String>)>);

impl Violations {
    fn add(&mut self, class: &str, example: String) {
        match self.0.iter_mut().find(|(c, _, _)| c == class) {
            Some((_, n, ex)) => {
                *n += 1;
                if ex.len() < 3 {
                    ex.push(example);
                }
            }
            None => self.0.push((class.to_owned(), 1, vec![example])),
        }
    }
    fn total(&self) -> usize {
        self.0.iter().map(|(_, n, _)| n).sum()
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(c, n, ex)| {
                format!(
                    "{n} x {c}, e.g.\n    {}",
                    ex.iter()
                        .map(|e| e.chars().take(400).collect::<String>())
                        .collect::<Vec<_>>()
                        .join("\n    ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
    fn print(&self) {
        if !self.is_empty() {
            println!("  VIOLATIONS:\n{}", self.summary());
        }
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

// ---- corrupt DUMP payloads ----------------------------------------------

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

// ---- memory -----------------------------------------------------------------

#[test]
fn writes_under_maxmemory_fail_with_oom_and_change_nothing() {
    let server = Server::start();
    let mut con = server.client();
    let big = "lorem ipsum dolor sit amet ".repeat(200);
    for s in 0..20 {
        let key = format!("mem:{{oom}}:{s}");
        for _ in 0..20 {
            ok(&mut con, &["MEM.APPEND", &key, "user", &big]);
        }
    }
    let key = "mem:{oom}:0";
    ok(&mut con, &["MEM.EXTSET", key, "dify", "before-oom"]);
    let before = snap(&mut con, key);
    let used: u64 = info_field(&mut con, "memory", "used_memory")
        .unwrap()
        .parse()
        .unwrap();
    ok(
        &mut con,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );
    ok(
        &mut con,
        &["CONFIG", "SET", "maxmemory", &(used / 2).to_string()],
    );
    let upto = int_field(&map_reply(&mut con, &["MEM.SUMMARIZE_CHECK", key]), "upto").to_string();
    let doc = r#"{"conversation_history":[{"role":"user","content":"x"}]}"#;
    let mut refused = 0;
    for args in [
        vec!["MEM.APPEND", key, "user", "no room"],
        vec!["MEM.APPEND", "mem:{oom}:new", "user", "no room"],
        vec!["MEM.SUMMARIZE", key, &upto, "no room for a summary"],
        vec!["MEM.EXTSET", key, "dify", "after-oom"],
        vec!["MEM.EXTSET", "mem:{oom}:new", "dify", "x"],
        vec!["MEM.IMPORT", "mem:{oom}:new", doc],
        vec!["MEM.IMPORT", key, doc, "REPLACE"],
    ] {
        let e = cmd(&mut con, &args).expect_err(&format!("{args:?} succeeded above maxmemory"));
        assert!(
            e.to_string().contains("OOM") || e.code() == Some("OOM"),
            "{args:?}: {e}"
        );
        refused += 1;
    }
    assert_same(
        &before,
        &snap(&mut con, key),
        "refused writes under maxmemory",
        1000,
    );
    assert_eq!(ok(&mut con, &["EXISTS", "mem:{oom}:new"]), Value::Int(0));
    // Reads still work.
    check_consistent(&mut con, key);
    ok(&mut con, &["MEM.SUMMARIZE_CHECK", key]);
    assert_eq!(
        ok(&mut con, &["MEM.EXTGET", key, "dify"]),
        Value::BulkString(b"before-oom".to_vec())
    );
    ok(&mut con, &["MEM.GET", key, "LAST", "2"]);
    // And writes again once there is room.
    ok(&mut con, &["CONFIG", "SET", "maxmemory", "0"]);
    ok(&mut con, &["MEM.APPEND", key, "user", "room again"]);
    println!("hostile/oom: {refused} writes refused with OOM above maxmemory, session unchanged, reads served");
}

#[test]
fn memory_usage_tracks_content_size() {
    let server = Server::start();
    let mut con = server.client();
    let text = |n: usize| {
        let words = "the quick brown fox jumps over a lazy dog while counting tokens ";
        words.repeat(n / words.len() + 1)[..n].to_owned()
    };
    for (key, size) in [("mem:{mu}:small", 600), ("mem:{mu}:big", 6000)] {
        for i in 0..30 {
            let mut content = text(size);
            content.replace_range(0..4, &format!("{i:04}"));
            ok(
                &mut con,
                &[
                    "MEM.APPEND",
                    key,
                    "user",
                    &content,
                    "MAXMSGS",
                    "30",
                    "MAXTOKENS",
                    "1000000",
                ],
            );
        }
        let info = map_reply(&mut con, &["MEM.INFO", key]);
        assert_eq!(int_field(&info, "messages"), 30);
    }
    let usage = |con: &mut redis::Connection, key: &str| -> i64 {
        redis::from_redis_value(&ok(con, &["MEMORY", "USAGE", key, "SAMPLES", "0"])).unwrap()
    };
    let small = usage(&mut con, "mem:{mu}:small");
    let big = usage(&mut con, "mem:{mu}:big");
    let expected = 30 * (6000 - 600);
    let diff = big - small;
    println!("hostile/memory usage: 30 x 600 B -> {small} B, 30 x 6000 B -> {big} B, difference {diff} (content difference {expected})");
    assert!(
        small >= 30 * 600,
        "MEMORY USAGE {small} below the content size"
    );
    assert!(
        diff as f64 >= expected as f64 * 0.9 && diff as f64 <= expected as f64 * 1.5,
        "MEMORY USAGE difference {diff} does not track the content difference {expected}"
    );
    // Summarizing shrinks it.
    let upto = int_field(
        &map_reply(
            &mut con,
            &["MEM.SUMMARIZE_CHECK", "mem:{mu}:big", "KEEP", "5"],
        ),
        "upto",
    )
    .to_string();
    ok(&mut con, &["MEM.SUMMARIZE", "mem:{mu}:big", &upto, "short"]);
    let after = usage(&mut con, "mem:{mu}:big");
    assert!(
        after < big - 20 * 6000,
        "MEMORY USAGE after summarizing 25 messages: {after} (was {big})"
    );
}

// ---- ACL --------------------------------------------------------------------

#[test]
fn acl_key_patterns_apply_to_every_command() {
    let server = Server::start();
    let mut admin = server.client();
    ok(&mut admin, &["CONFIG", "SET", "rdbcompression", "no"]);
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "alice",
            "on",
            ">pw",
            "~mem:{alice}*",
            "+@all",
        ],
    );
    let bob_key = "mem:{bob}:s1";
    ok(&mut admin, &["MEM.APPEND", bob_key, "user", "bob's"]);
    ok(&mut admin, &["MEM.EXTSET", bob_key, "dify", "b"]);
    let bob_before = snap(&mut admin, bob_key);
    // Valid internal payloads: a session (from DUMP) and an op.
    ok(
        &mut admin,
        &["MEM.APPEND", "mem:{alice}:tmpl", "user", "template"],
    );
    let session_payload = module_payload(&dump(&mut admin, "mem:{alice}:tmpl"));
    let op_payload = op_append(
        1_700_000_000_000,
        &default_psettings(),
        &PMessage {
            id: 1000,
            role: b"user",
            content: b"via _APPLY",
            ts: 1_700_000_000_000,
            tokens: 7,
            meta: None,
        },
    );

    let mut alice = server.client();
    ok(&mut alice, &["AUTH", "alice", "pw"]);
    let doc = r#"{"conversation_history":[{"role":"user","content":"imported"}]}"#;
    let mut allowed = 0;
    let mut denied = 0;
    for (session, other) in [("mem:{alice}:s1", "mem:{alice}:s2")] {
        let steps: Vec<Vec<Vec<u8>>> = vec![
            vec![
                b"MEM.APPEND".to_vec(),
                session.into(),
                b"user".to_vec(),
                b"hi".to_vec(),
            ],
            vec![
                b"MEM.APPEND".to_vec(),
                session.into(),
                b"assistant".to_vec(),
                b"hello".to_vec(),
            ],
            vec![b"MEM.GET".to_vec(), session.into()],
            vec![b"MEM.INFO".to_vec(), session.into()],
            vec![
                b"MEM.SUMMARIZE_CHECK".to_vec(),
                session.into(),
                b"KEEP".to_vec(),
                b"1".to_vec(),
            ],
            vec![
                b"MEM.SUMMARIZE".to_vec(),
                session.into(),
                b"1".to_vec(),
                b"sum".to_vec(),
            ],
            vec![
                b"MEM.EXTSET".to_vec(),
                session.into(),
                b"dify".to_vec(),
                b"c".to_vec(),
            ],
            vec![b"MEM.EXTGET".to_vec(), session.into(), b"dify".to_vec()],
            vec![b"MEM.IMPORT".to_vec(), other.into(), doc.into()],
            vec![b"MEM._APPLY".to_vec(), session.into(), op_payload.clone()],
            vec![b"MEM._PUT".to_vec(), other.into(), session_payload.clone()],
        ];
        for step in &steps {
            let refs: Vec<&[u8]> = step.iter().map(Vec::as_slice).collect();
            match cmd_bin(&mut alice, &refs) {
                // Internal commands pass the ACL, then refuse any client.
                Err(e) if step[0].starts_with(b"MEM._") => {
                    assert!(
                        e.to_string().contains("is internal"),
                        "alice: {}: {e}",
                        printable(step)
                    )
                }
                r => drop(r.unwrap_or_else(|e| panic!("alice: {}: {e}", printable(step)))),
            }
            allowed += 1;
            // The same command on bob's session is refused.
            let mut on_bob = step.clone();
            on_bob[1] = bob_key.as_bytes().to_vec();
            let refs: Vec<&[u8]> = on_bob.iter().map(Vec::as_slice).collect();
            let e = cmd_bin(&mut alice, &refs)
                .expect_err(&format!("alice ran {} on bob's key", printable(&on_bob)));
            assert!(
                e.code() == Some("NOPERM") || e.to_string().contains("NOPERM"),
                "{}: {e}",
                printable(&on_bob)
            );
            denied += 1;
        }
    }
    assert_same(
        &bob_before,
        &snap(&mut admin, bob_key),
        "bob's session after alice's refused commands",
        1000,
    );
    check_consistent(&mut admin, "mem:{alice}:s1");
    println!("hostile/acl: {allowed} commands allowed on mem:{{alice}}, {denied} refused NOPERM on mem:{{bob}}");
}
