//! The internal commands MEM._APPLY and MEM._PUT (SPEC "Internal commands"):
//! refused from every client, changing nothing; on the paths where they do
//! run (the master link, AOF loading: here an AOF written by hand), payloads
//! that do not decode or break an invariant are refused, never half-applied
//! and never a crash.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;

use crate::support::server::*;
use crate::support::session::*;

const MAX_ID: u64 = (1 << 53) - 1;
const MAX_TTL_SECS: u64 = 3_153_600_000;
const NOW: i64 = 1_700_000_000_000;

fn bin(args: &[&[u8]]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.to_vec()).collect()
}

/// A session of two messages ("one", "two") with no expiry: its payload (as
/// DUMP carries it) and its digest.
fn reference_session() -> (Vec<u8>, String) {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "rdbcompression", "no"]);
    ok(&mut con, &["MEM.APPEND", "ref", "user", "one", "TTL", "0"]);
    ok(&mut con, &["MEM.APPEND", "ref", "user", "two"]);
    (
        module_payload(&dump(&mut con, "ref")),
        digest(&mut con, "ref"),
    )
}

fn is_refusal(text: &str) -> bool {
    text.contains("is internal: it runs only from the master link or while loading the AOF")
}

#[test]
fn internal_commands_are_refused_from_any_client() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "rdbcompression", "no"]);
    let key = "mem:{int}";
    ok(&mut con, &["MEM.APPEND", key, "user", "one"]);
    ok(&mut con, &["MEM.APPEND", key, "user", "two"]);
    let session = module_payload(&dump(&mut con, key));
    let op = op_append(
        NOW,
        &default_psettings(),
        &PMessage {
            id: 3,
            role: b"user",
            content: b"x",
            ts: NOW,
            tokens: 4,
            meta: None,
        },
    );
    let before = snap(&mut con, key);
    let missing = "mem:{int}:missing";
    let mut refused = 0;
    for (name, payload) in [(&b"MEM._APPLY"[..], &op), (&b"MEM._PUT"[..], &session)] {
        for target in [key, missing] {
            // Plainly, with valid payloads (these would apply from the master).
            let e = cmd_bin(&mut con, &[name, target.as_bytes(), payload]).unwrap_err();
            assert!(
                is_refusal(&e.to_string()),
                "{}: {e}",
                String::from_utf8_lossy(name)
            );
            // Inside MULTI/EXEC.
            ok(&mut con, &["MULTI"]);
            let _ = cmd_bin(&mut con, &[name, target.as_bytes(), payload]);
            let exec = cmd(&mut con, &["EXEC"]);
            assert!(is_refusal(&format!("{exec:?}")), "in MULTI: {exec:?}");
            // From a script.
            let script = "return redis.call(ARGV[1], KEYS[1], ARGV[2])";
            let e = cmd_bin(
                &mut con,
                &[
                    b"EVAL",
                    script.as_bytes(),
                    b"1",
                    target.as_bytes(),
                    name,
                    payload,
                ],
            )
            .unwrap_err();
            assert!(is_refusal(&e.to_string()), "from a script: {e}");
            refused += 3;
        }
    }
    assert_same(
        &before,
        &snap(&mut con, key),
        "after refused internal commands",
        1000,
    );
    assert_eq!(
        redis::from_redis_value::<i64>(&ok(&mut con, &["EXISTS", missing])).unwrap(),
        0
    );
    println!(
        "internal/clients: {refused} internal commands from a client refused, nothing changed"
    );
}

/// Ops crafted to break each invariant the commands enforce. Each one is
/// applied (from the AOF) to its own copy of the reference session.
fn crafted_ops() -> Vec<(&'static str, Vec<u8>)> {
    let s = default_psettings();
    let msg = |id, role: &'static [u8], tokens| PMessage {
        id,
        role,
        content: b"x",
        ts: NOW,
        tokens,
        meta: None,
    };
    let with_meta = |meta: &'static [u8]| PMessage {
        meta: Some(meta),
        ..msg(3, b"user", 4)
    };
    let zero_caps = PSettings {
        max_msgs: 0,
        max_tokens: 0,
        ..default_psettings()
    };
    let ttl = |ttl| PSettings {
        ttl,
        ..default_psettings()
    };
    let long_model = vec![b'm'; 300];
    let big_summary = vec![b's'; 90_000];
    vec![
        (
            "append with tokens u64::MAX",
            op_append(NOW, &s, &msg(3, b"user", u64::MAX)),
        ),
        (
            "append with tokens 2^63",
            op_append(NOW, &s, &msg(3, b"user", 1 << 63)),
        ),
        (
            "append with an empty role",
            op_append(NOW, &s, &msg(3, b"", 4)),
        ),
        (
            "append with a 100-byte role",
            op_append(NOW, &s, &msg(3, &[b'r'; 100], 4)),
        ),
        (
            "append with caps 0",
            op_append(NOW, &zero_caps, &msg(3, b"user", 4)),
        ),
        (
            "append with a 300-byte model",
            op_append(
                NOW,
                &PSettings {
                    model: &long_model,
                    ..default_psettings()
                },
                &msg(3, b"user", 4),
            ),
        ),
        (
            "append with ttl u64::MAX",
            op_append(NOW, &ttl(u64::MAX), &msg(3, b"user", 4)),
        ),
        (
            "append with id u64::MAX",
            op_append(NOW, &s, &msg(u64::MAX, b"user", 4)),
        ),
        (
            "append with an id already used",
            op_append(NOW, &s, &msg(2, b"user", 4)),
        ),
        (
            "append at a negative clock",
            op_append(-5, &s, &msg(3, b"user", 4)),
        ),
        (
            "append with META that is not JSON",
            op_append(NOW, &s, &with_meta(b"not json")),
        ),
        (
            "append with META that is an array",
            op_append(NOW, &s, &with_meta(b"[1]")),
        ),
        (
            "summarize with tokens u64::MAX",
            op_summarize(NOW, b"s", u64::MAX, 1, NOW),
        ),
        (
            "summarize up to an unknown id",
            op_summarize(NOW, b"s", 5, 7, NOW),
        ),
        (
            "summarize over maxtokens",
            op_summarize(NOW, &big_summary, 85_000, 1, NOW),
        ),
        (
            "extset with caps 0",
            op_extset(NOW, &zero_caps, b"dify", b"c", NOW + 1000),
        ),
        (
            "extset with an empty system",
            op_extset(NOW, &s, b"", b"c", NOW + 1000),
        ),
        ("not an op at all", b"\x01garbage".to_vec()),
        ("an unknown payload format", b"\x09\x00".to_vec()),
    ]
}

/// Ops an earlier release (or an older master in a rolling upgrade) could
/// send: outside today's input limits, but structurally sound. A replica or
/// an AOF load must apply them, or it diverges from its master.
fn legacy_ops() -> Vec<(&'static str, Vec<u8>)> {
    let s = default_psettings();
    let msg = |id, role: &'static [u8], tokens| PMessage {
        id,
        role,
        content: b"x",
        ts: NOW,
        tokens,
        meta: None,
    };
    let with_meta = |meta: &'static [u8]| PMessage {
        meta: Some(meta),
        ..msg(3, b"user", 4)
    };
    let ttl = |ttl| PSettings {
        ttl,
        ..default_psettings()
    };
    let deep_meta: &'static [u8] = Box::leak(
        format!("{}{{}}{}", r#"{"a":"#.repeat(124), "}".repeat(124))
            .into_bytes()
            .into_boxed_slice(),
    );
    vec![
        (
            "append with ttl above 100 years",
            op_append(NOW, &ttl(MAX_TTL_SECS + 1), &msg(3, b"user", 4)),
        ),
        (
            "append with id above 2^53-1",
            op_append(NOW, &s, &msg(MAX_ID + 1, b"user", 4)),
        ),
        (
            "append with META holding a lone surrogate",
            op_append(NOW, &s, &with_meta(br#"{"a":"\ud800"}"#)),
        ),
        (
            "append with META holding 1e400",
            op_append(NOW, &s, &with_meta(br#"{"n":1e400}"#)),
        ),
        (
            "append with META nested 125 deep",
            op_append(NOW, &s, &with_meta(deep_meta)),
        ),
        (
            "extset expiring at i64::MAX",
            op_extset(NOW, &s, b"dify", b"c", i64::MAX),
        ),
        (
            "extset expiring before 1970",
            op_extset(NOW, &s, b"dify", b"c", -1),
        ),
    ]
}

#[test]
fn legacy_payloads_loaded_from_an_aof_apply_consistently() {
    let (session, reference_digest) = reference_session();
    let cases = legacy_ops();
    let mut commands = Vec::new();
    for (i, (_, op)) in cases.iter().enumerate() {
        let key = format!("mem:{{old}}:{i}");
        commands.push(bin(&[b"MEM._PUT", key.as_bytes(), &session]));
        commands.push(bin(&[b"MEM._APPLY", key.as_bytes(), op]));
    }
    let mut server = server_loading_aof(&commands);
    assert!(server.is_alive());
    let mut con = server.client();
    assert_eq!(aof_load_errors(&server.log()), Vec::<String>::new());
    for (i, (what, _)) in cases.iter().enumerate() {
        let key = format!("mem:{{old}}:{i}");
        assert_ne!(
            digest(&mut con, &key),
            reference_digest,
            "{what}: not applied"
        );
        // META that today's input check refuses: FORMAT JSON carries it as
        // stored, which serde_json (not every parser) refuses to read back.
        if what.contains("META ") {
            let info = map_reply(&mut con, &["MEM.INFO", &key]);
            assert_eq!(int_field(&info, "messages"), 3, "{what}");
        } else {
            check_consistent(&mut con, &key);
        }
        // Still DUMP/RESTORE-able and reloadable.
        let d: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut con).unwrap();
        let r: redis::RedisResult<Value> = redis::cmd("RESTORE")
            .arg(format!("{key}:copy"))
            .arg(0)
            .arg(d)
            .query(&mut con);
        r.unwrap_or_else(|e| panic!("{what}: RESTORE of the result failed: {e}"));
    }
    ok(&mut con, &["DEBUG", "RELOAD"]);
    assert!(server.is_alive());
}

#[test]
fn crafted_payloads_loaded_from_an_aof_are_refused_and_change_nothing() {
    let (session, reference_digest) = reference_session();
    let cases = crafted_ops();
    let mut commands = Vec::new();
    for (i, (_, op)) in cases.iter().enumerate() {
        let key = format!("mem:{{int}}:{i}");
        commands.push(bin(&[b"MEM._PUT", key.as_bytes(), &session]));
        commands.push(bin(&[b"MEM._APPLY", key.as_bytes(), op]));
    }
    // Controls: the same path applies valid payloads.
    let good = op_append(
        NOW,
        &default_psettings(),
        &PMessage {
            id: 3,
            role: b"user",
            content: b"three",
            ts: NOW,
            tokens: 4,
            meta: Some(br#"{"k":[1,{"v":null}]}"#),
        },
    );
    commands.push(bin(&[b"MEM._PUT", b"mem:{int}:good", &session]));
    commands.push(bin(&[b"MEM._APPLY", b"mem:{int}:good", &good]));
    // Session payloads that do not decode are refused as well.
    let truncated = &session[..session.len() - 3];
    let mut unknown_format = session.clone();
    unknown_format[0] = 9;
    commands.push(bin(&[b"MEM._PUT", b"mem:{int}:truncated", truncated]));
    commands.push(bin(&[b"MEM._PUT", b"mem:{int}:format", &unknown_format]));

    let mut server = server_loading_aof(&commands);
    assert!(server.is_alive());
    let mut con = server.client();
    let mut problems = Vec::new();
    for (i, (what, _)) in cases.iter().enumerate() {
        let key = format!("mem:{{int}}:{i}");
        if digest(&mut con, &key) != reference_digest {
            problems.push(format!("{what}: applied, or the session changed"));
        }
    }
    let doc = check_consistent(&mut con, "mem:{int}:good");
    assert_eq!(
        doc.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        [1, 2, 3],
        "the valid op applies"
    );
    for key in ["mem:{int}:truncated", "mem:{int}:format"] {
        let exists: i64 = redis::from_redis_value(&ok(&mut con, &["EXISTS", key])).unwrap();
        assert_eq!(
            exists, 0,
            "{key}: a payload that does not decode was stored"
        );
    }
    let errors = aof_load_errors(&server.log());
    assert_eq!(
        errors.len(),
        cases.len() + 2,
        "one refusal logged per crafted payload:\n{}",
        errors.join("\n")
    );
    for needle in [
        "is outside 1..=9223372036854775807",
        "ttl 18446744073709551615 is above",
        "exceed maxtokens",
        "not valid JSON",
    ] {
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "no refusal mentions {needle:?}:\n{}",
            errors.join("\n")
        );
    }
    println!(
        "internal/aof: {} crafted payloads loaded from an AOF, {} refused, {} problems",
        cases.len() + 2,
        errors.len(),
        problems.len()
    );
    assert!(problems.is_empty(), "{problems:#?}");
}

fn mutate(rng: &mut StdRng, mut p: Vec<u8>) -> Vec<u8> {
    match rng.gen_range(0..4) {
        0 if !p.is_empty() => {
            let at = rng.gen_range(0..p.len());
            p.truncate(at);
        }
        1 => p.extend((0..4).map(|_| rng.gen::<u8>())),
        _ => {
            for _ in 0..rng.gen_range(1..4) {
                if !p.is_empty() {
                    let at = rng.gen_range(0..p.len());
                    p[at] ^= 1 << rng.gen_range(0..8);
                }
            }
        }
    }
    p
}

#[test]
fn mutated_payloads_loaded_from_an_aof_never_crash_or_break_invariants() {
    let reference = Server::start();
    let mut rc = reference.client();
    ok(&mut rc, &["CONFIG", "SET", "rdbcompression", "no"]);
    let keys = populate_variety(&mut rc, "mem:{ref}");
    let sessions: Vec<Vec<u8>> = keys
        .iter()
        .map(|k| module_payload(&dump(&mut rc, k)))
        .collect();
    let s = default_psettings();
    let ops = [
        op_append(
            NOW,
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
            NOW,
            &s,
            &PMessage {
                id: 1001,
                role: b"tool",
                content: b"x",
                ts: 2,
                tokens: 5,
                meta: Some(br#"{"a":[1]}"#),
            },
        ),
        op_summarize(NOW, b"sum", 7, 3, 5),
        op_extset(NOW, &s, b"dify", b"c1", 1_900_000_000_000),
    ];
    let mut rng = StdRng::seed_from_u64(0x0a0f_2025);
    let n = 600;
    // Each session unchanged, to compare with (a digest counts the TTL, so
    // the reference server's, with TTLs, would not do).
    let mut commands: Vec<Vec<Vec<u8>>> = (0..sessions.len())
        .map(|j| {
            bin(&[
                b"MEM._PUT",
                format!("mem:{{mut}}:base{j}").as_bytes(),
                &sessions[j],
            ])
        })
        .collect();
    for i in 0..n {
        let key = format!("mem:{{mut}}:{i}");
        commands.push(bin(&[
            b"MEM._PUT",
            key.as_bytes(),
            &sessions[i % sessions.len()],
        ]));
        let c = if rng.gen_bool(0.5) {
            let pick = ops[rng.gen_range(0..ops.len())].clone();
            let op = mutate(&mut rng, pick);
            bin(&[b"MEM._APPLY", key.as_bytes(), &op])
        } else {
            let pick = sessions[rng.gen_range(0..sessions.len())].clone();
            let other = mutate(&mut rng, pick);
            bin(&[b"MEM._PUT", key.as_bytes(), &other])
        };
        commands.push(c);
    }
    let mut server = server_loading_aof(&commands);
    assert!(
        server.is_alive(),
        "loading mutated payloads crashed the server"
    );
    let mut con = server.client();
    let base: Vec<String> = (0..sessions.len())
        .map(|j| digest(&mut con, &format!("mem:{{mut}}:base{j}")))
        .collect();
    let (mut changed, mut problems) = (0, Vec::new());
    for i in 0..n {
        let key = format!("mem:{{mut}}:{i}");
        if digest(&mut con, &key) == base[i % sessions.len()] {
            continue;
        }
        changed += 1;
        if let Some(p) = consistency_problem(&mut con, &key) {
            problems.push(p);
        }
        let d = dump(&mut con, &key);
        if let Err(e) = redis::cmd("RESTORE")
            .arg("mem:{mut}:copy")
            .arg(0)
            .arg(&d)
            .arg("REPLACE")
            .query::<Value>(&mut con)
        {
            problems.push(format!("{key}: accepted, then DUMP/RESTORE fails: {e}"));
        }
    }
    let refused = aof_load_errors(&server.log()).len();
    println!("internal/mutated: {n} mutated payloads loaded from an AOF: {refused} refused, {changed} sessions changed, {} problems", problems.len());
    assert!(
        refused > n / 2,
        "most mutations must be refused ({refused} of {n})"
    );
    assert!(problems.is_empty(), "{problems:#?}");
}
