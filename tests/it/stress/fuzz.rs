//! A seeded fuzzer of MEM.* commands (and of the internal commands'
//! payloads): the server never crashes, every failure is an error reply
//! that changes nothing, and every session stays consistent.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

use crate::support::report::*;
use crate::support::server::*;
use crate::support::session::*;

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

    /// One of `words`.
    fn word(&mut self, words: &[&'static str]) -> &'static str {
        words[self.rng.gen_range(0..words.len())]
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
                let model = s(self.word(&["gpt-4o", "gpt-4", "claude-3-5-sonnet", "o3-mini"]));
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
                let f = s(self.word(&["RESP", "JSON", "json", "XML"]));
                opt(&mut c, "FORMAT", f, &mut self.rng);
            }
            4 => {
                c = if self.rng.gen_bool(0.5) {
                    vec![s("MEM.SUMMARIZE_CHECK"), key]
                } else {
                    let lease_ms = s(self.word(&["1", "50", "60000", "86400000"]));
                    vec![s("MEM.SUMMARIZE_BEGIN"), key, lease_ms]
                };
                let m = s(self.word(&["gpt-4o", "gpt-4.1", "unknown"]));
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
                let sys = s(self.word(&["dify", "n8n", "", "x"]));
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

fn digests(con: &mut redis::Connection) -> Vec<String> {
    FUZZ_KEYS.iter().map(|k| digest(con, k)).collect()
}

/// Reference payloads for the internal commands: sessions taken from DUMP
/// (rdbcompression no) and ops of both formats built by support::session's encoder.
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
