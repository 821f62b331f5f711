//! attack3 (issue 12's format 3): RESTORE of DUMP payloads whose message
//! section is crafted: roles written out that have a code, roles of 0, 64
//! and 65 bytes, unknown tags, non-canonical lengths, wrong lengths and
//! totals, bad UTF-8, token counts past 2^32, ids and timestamps at their
//! limits. Each must be refused (or, when well formed, accepted and behave),
//! and the server must stay up.

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;
use redis::Value;

const CONTENT: &str = "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ";

/// A DUMP of `payload` as the module's value: the type byte and module id
/// of `model` (a real DUMP), the string opcode, the payload, EOF, footer.
fn wrap(model: &[u8], payload: &[u8]) -> Vec<u8> {
    let (body, ver) = session::split_dump(model);
    let mut out = body[..10].to_vec(); // type 7, 0x81 + 8-byte module id
    out.push(0x05); // RDB_MODULE_OPCODE_STRING
    let n = payload.len();
    if n < 64 {
        out.push(n as u8);
    } else if n < 16384 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(payload);
    out.push(0x00); // RDB_MODULE_OPCODE_EOF
    session::with_footer(&out, ver)
}

fn varint(v: u64, out: &mut Vec<u8>) {
    crate::support::leb128::push(out, v);
}

/// A one-message session (user, CONTENT, TS 5) and its DUMP / payload.
struct Sample {
    dump: Vec<u8>,
    payload: Vec<u8>,
    /// Where the message's stored bytes start (the tag).
    data_at: usize,
    tokens: u8,
}

fn sample(con: &mut redis::Connection) -> Sample {
    ok(con, &["CONFIG", "SET", "rdbcompression", "no"]);
    let k = "mem:{r3}:sample";
    ok(con, &["DEL", k]);
    let tokens = int_field(&append(con, k, "user", CONTENT, &["TS", "5"]), "tokens") as u8;
    let dump = session::dump(con, k);
    let payload = session::module_payload(&dump);
    assert_eq!(payload[0], 4, "DUMP is not format 4");
    let mut needle = vec![0u8];
    needle.extend_from_slice(CONTENT.as_bytes());
    let data_at = payload
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("message bytes in the payload");
    // count 1, id delta 1, ts zigzag(5) = 10, tokens, length 101, total 101
    assert_eq!(
        &payload[data_at - 6..data_at],
        &[1, 1, 10, tokens, 101, 101],
        "heads as FORMAT.md says"
    );
    Sample {
        dump,
        payload,
        data_at,
        tokens,
    }
}

/// The payload with the message section from the count on replaced by
/// `heads` (count and heads) and `data` (its total is written here unless
/// `total` says otherwise).
fn with_messages(s: &Sample, heads: &[u8], data: &[u8], total: Option<u64>) -> Vec<u8> {
    let mut p = s.payload[..s.data_at - 6].to_vec();
    p.extend_from_slice(heads);
    varint(total.unwrap_or(data.len() as u64), &mut p);
    p.extend_from_slice(data);
    p.extend_from_slice(&s.payload[s.data_at + 101..]);
    p
}

fn restore(con: &mut redis::Connection, dump: &[u8]) -> redis::RedisResult<Value> {
    redis::cmd("RESTORE")
        .arg("mem:{r3}:target")
        .arg(0)
        .arg(dump)
        .arg("REPLACE")
        .query::<Value>(con)
}

fn refused(con: &mut redis::Connection, s: &Sample, payload: &[u8], what: &str) {
    ok(con, &["DEL", "mem:{r3}:target"]);
    let r = restore(con, &wrap(&s.dump, payload));
    match r {
        Err(e) => assert!(e.code().is_some(), "{what}: connection error {e}"),
        Ok(_) => panic!(
            "{what}: RESTORE accepted it: {}",
            json_text(con, "mem:{r3}:target")
        ),
    }
    assert_eq!(
        int(con, &["EXISTS", "mem:{r3}:target"]),
        0,
        "{what}: a refused RESTORE left a key"
    );
}

fn heads(id_delta: u64, ts_zz: u64, tokens: u64, len: u64) -> Vec<u8> {
    let mut h = vec![1];
    for v in [id_delta, ts_zz, tokens, len] {
        varint(v, &mut h);
    }
    h
}

fn tagged(tag: &[u8], content: &str) -> Vec<u8> {
    let mut d = tag.to_vec();
    d.extend_from_slice(content.as_bytes());
    d
}

#[test]
fn crafted_message_sections_are_refused() {
    let server = Server::start();
    let mut con = server.client();
    let s = sample(&mut con);
    let t = u64::from(s.tokens);
    // The untouched rebuild restores (the crafting itself is right).
    let same = with_messages(&s, &heads(1, 10, t, 101), &tagged(&[0], CONTENT), None);
    assert_eq!(same, s.payload);
    restore(&mut con, &wrap(&s.dump, &same)).unwrap();
    assert_eq!(
        get(&mut con, &["MEM.GET", "mem:{r3}:target"])[0].content,
        CONTENT
    );

    let content96 = &CONTENT[..96];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        // A role with a code written out: the tool rule reads only the code.
        (
            "inline role tool",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[7, 4, b't', b'o', b'o', b'l'], content96),
                None,
            ),
        ),
        (
            "inline role user",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[7, 4, b'u', b's', b'e', b'r'], content96),
                None,
            ),
        ),
        (
            "inline empty role",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[7, 0], &CONTENT[..99]),
                None,
            ),
        ),
        ("inline role of 65 bytes", {
            let mut tag = vec![7, 65];
            tag.extend_from_slice(&[b'r'; 65]);
            with_messages(
                &s,
                &heads(1, 10, t, 67 + 34),
                &tagged(&tag, &CONTENT[..34]),
                None,
            )
        }),
        ("inline role of 200 bytes", {
            let mut tag = vec![7, 200];
            tag.extend_from_slice(&[b'r'; 200]);
            with_messages(
                &s,
                &heads(1, 10, t, 202 + 5),
                &tagged(&tag, &CONTENT[..5]),
                None,
            )
        }),
        (
            "inline role not UTF-8",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[7, 2, 0xc3, 0x28], &CONTENT[..97]),
                None,
            ),
        ),
        (
            "inline role length past the end",
            with_messages(&s, &heads(1, 10, t, 3), &[7, 9, b'x'], None),
        ),
        (
            "tag code 6",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[6], &CONTENT[..100]),
                None,
            ),
        ),
        (
            "tag high bit",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[0x80], &CONTENT[..100]),
                None,
            ),
        ),
        (
            "tag bit 4",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[0x10], &CONTENT[..100]),
                None,
            ),
        ),
        (
            "empty message bytes",
            with_messages(&s, &heads(1, 10, t, 0), &[], None),
        ),
        (
            "meta non-canonical length",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[8, 0x82, 0x00, b'{', b'}'], &CONTENT[..96]),
                None,
            ),
        ),
        (
            "meta length past the end",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[8, 0x7f], &CONTENT[..99]),
                None,
            ),
        ),
        (
            "meta length 2^63",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(
                    &[
                        8, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
                    ],
                    &CONTENT[..90],
                ),
                None,
            ),
        ),
        (
            "meta not JSON",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[8, 3, b'a', b'b', b'c'], &CONTENT[..96]),
                None,
            ),
        ),
        (
            "meta a JSON array",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[8, 3, b'[', b'1', b']'], &CONTENT[..96]),
                None,
            ),
        ),
        ("content not UTF-8", {
            let mut d = tagged(&[0], &CONTENT[..98]);
            d.extend_from_slice(&[0xe2, 0x82]);
            with_messages(&s, &heads(1, 10, t, 101), &d, None)
        }),
        (
            "length one short",
            with_messages(&s, &heads(1, 10, t, 100), &tagged(&[0], CONTENT), None),
        ),
        (
            "length one long",
            with_messages(&s, &heads(1, 10, t, 102), &tagged(&[0], CONTENT), None),
        ),
        (
            "total one short",
            with_messages(&s, &heads(1, 10, t, 101), &tagged(&[0], CONTENT), Some(100)),
        ),
        (
            "total one long",
            with_messages(&s, &heads(1, 10, t, 101), &tagged(&[0], CONTENT), Some(102)),
        ),
        (
            "total 2^40",
            with_messages(
                &s,
                &heads(1, 10, t, 101),
                &tagged(&[0], CONTENT),
                Some(1 << 40),
            ),
        ),
        (
            "length 2^63",
            with_messages(&s, &heads(1, 10, t, 1 << 63), &tagged(&[0], CONTENT), None),
        ),
        ("non-canonical length", {
            let mut h = vec![1, 1, 10, s.tokens, 0xe5, 0x00];
            h.truncate(6);
            with_messages(&s, &h, &tagged(&[0], CONTENT), None)
        }),
        (
            "non-canonical id delta",
            with_messages(
                &s,
                &[1, 0x81, 0x00, 10, s.tokens, 101],
                &tagged(&[0], CONTENT),
                None,
            ),
        ),
        (
            "id delta 0",
            with_messages(&s, &heads(0, 10, t, 101), &tagged(&[0], CONTENT), None),
        ),
        (
            "tokens 2^32",
            with_messages(
                &s,
                &heads(1, 10, 1 << 32, 101),
                &tagged(&[0], CONTENT),
                None,
            ),
        ),
        (
            "tokens 2^32-1",
            with_messages(
                &s,
                &heads(1, 10, u64::from(u32::MAX), 101),
                &tagged(&[0], CONTENT),
                None,
            ),
        ),
        (
            "tokens above the text",
            with_messages(&s, &heads(1, 10, 200, 101), &tagged(&[0], CONTENT), None),
        ),
        (
            "ts -1",
            with_messages(&s, &heads(1, 1, t, 101), &tagged(&[0], CONTENT), None),
        ),
        (
            "ts past 9999-12-31",
            with_messages(
                &s,
                &heads(1, 2 * 253_402_300_800_000, t, 101),
                &tagged(&[0], CONTENT),
                None,
            ),
        ),
        ("count 2 with one head", {
            let mut h = heads(1, 10, t, 101);
            h[0] = 2;
            with_messages(&s, &h, &tagged(&[0], CONTENT), None)
        }),
        ("count 2^62", {
            let mut h = Vec::new();
            varint(1 << 62, &mut h);
            h.extend_from_slice(&heads(1, 10, t, 101)[1..]);
            with_messages(&s, &h, &tagged(&[0], CONTENT), None)
        }),
        (
            "count 0 with bytes",
            with_messages(&s, &[0], &tagged(&[0], CONTENT), None),
        ),
    ];
    for (what, payload) in &cases {
        refused(&mut con, &s, payload, what);
    }
    // Truncated anywhere in the message section.
    for cut in s.data_at - 6..s.data_at + 101 {
        refused(&mut con, &s, &s.payload[..cut], &format!("cut at {cut}"));
    }
    // Every byte of the message section flipped: refused, or accepted and
    // consistent (a flip inside the content can stay valid UTF-8 only if the
    // token total still adds up, which it does not: tokens are per text).
    for at in s.data_at - 6..s.data_at + 101 {
        for mask in [0x01u8, 0x40, 0x80] {
            let mut p = s.payload.clone();
            p[at] ^= mask;
            ok(&mut con, &["DEL", "mem:{r3}:target"]);
            if restore(&mut con, &wrap(&s.dump, &p)).is_ok() {
                if let Some(problem) = session::consistency_problem(&mut con, "mem:{r3}:target") {
                    panic!("byte {at} ^ {mask:#x} accepted inconsistent: {problem}");
                }
                // Still takes a write and survives DUMP/RESTORE.
                append(&mut con, "mem:{r3}:target", "user", "after", &[]);
                let d = session::dump(&mut con, "mem:{r3}:target");
                restore(&mut con, &d).unwrap();
            }
        }
    }
    assert_eq!(string(&mut con, &["PING"]), "PONG");
}

#[test]
fn well_formed_limits_restore_and_behave() {
    let server = Server::start();
    let mut con = server.client();
    let s = sample(&mut con);
    let t = u64::from(s.tokens);
    let k = "mem:{r3}:target";
    // A role of exactly 64 bytes, written out: accepted, and reads back.
    let role64 = "r".repeat(64);
    let mut tag = vec![7, 64];
    tag.extend_from_slice(role64.as_bytes());
    let p = with_messages(
        &s,
        &heads(1, 10, t, 66 + 35),
        &tagged(&tag, &CONTENT[..35]),
        None,
    );
    restore(&mut con, &wrap(&s.dump, &p)).unwrap();
    let got = get(&mut con, &["MEM.GET", k]);
    assert_eq!(
        (got[0].role.as_str(), got[0].content.as_str()),
        (role64.as_str(), &CONTENT[..35])
    );
    // The same through MEM.APPEND, and one byte more is refused by it.
    ok(&mut con, &["DEL", "mem:{r3}:own"]);
    append(&mut con, "mem:{r3}:own", &role64, "x", &[]);
    assert!(cmd(
        &mut con,
        &["MEM.APPEND", "mem:{r3}:own", &"r".repeat(65), "x"]
    )
    .is_err());
    // Timestamps 0 and 9999-12-31T23:59:59.999 through the commands, then DUMP/RESTORE.
    let kt = "mem:{r3}:ts";
    append(&mut con, kt, "user", "", &["TS", "0"]);
    append(
        &mut con,
        kt,
        "user",
        "end of time",
        &["TS", "253402300799999", "META", r#"{"a":[1,2,{"b":null}]}"#],
    );
    append(&mut con, kt, "user", "back to 0", &["TS", "0"]);
    let before = session::snap(&mut con, kt);
    let d = session::dump(&mut con, kt);
    redis::cmd("RESTORE")
        .arg(kt)
        .arg(before.pttl.max(0))
        .arg(&d)
        .arg("REPLACE")
        .query::<()>(&mut con)
        .unwrap();
    session::assert_same(
        &before,
        &session::snap(&mut con, kt),
        "ts 0 / 9999 DUMP/RESTORE",
        2000,
    );
    let got = get(&mut con, &["MEM.GET", kt]);
    assert_eq!(
        got.iter().map(|e| e.ts).collect::<Vec<_>>(),
        vec![0, 253_402_300_799_999, 0]
    );
    assert_eq!(got[1].meta.as_deref(), Some(r#"{"a":[1,2,{"b":null}]}"#));
    assert_eq!(got[0].content, "");
    assert_eq!(string(&mut con, &["PING"]), "PONG");
}

/// Hostile pass 29 F8: the server notes the greatest lease token it loads,
/// so that a key name never gets a token again. A payload carrying a token
/// far ahead of the clock (2^53-1) set it so that MEM.SUMMARIZE_BEGIN of
/// every key answered "used every lease token", through FLUSHALL, until a
/// restart. Such a token now binds only its own key.
#[test]
fn a_restored_token_far_ahead_of_the_clock_exhausts_no_other_key() {
    let server = Server::start();
    let mut con = server.client();
    ok(&mut con, &["CONFIG", "SET", "rdbcompression", "no"]);
    let ready = |con: &mut redis::Connection, k: &str| {
        for i in 0..10 {
            append(con, k, "user", &format!("message {i}"), &["MAXMSGS", "10"]);
        }
    };
    let begin = |con: &mut redis::Connection, k: &str| -> Result<i64, String> {
        let r = redis::cmd("MEM.SUMMARIZE_BEGIN")
            .arg(k)
            .arg(60_000)
            .arg("KEEP")
            .arg(2)
            .query::<Value>(con)
            .map_err(|e| e.to_string())?;
        let map: Vec<(String, Value)> = redis::from_redis_value(&r).unwrap();
        let v = &map.iter().find(|(f, _)| f == "lease").unwrap().1;
        Ok(redis::from_redis_value(v).unwrap())
    };
    ready(&mut con, "mem:{poison}");
    let token = begin(&mut con, "mem:{poison}").unwrap() as u64;
    let dump = session::dump(&mut con, "mem:{poison}");
    let payload = session::module_payload(&dump);
    let (mut old, mut new) = (Vec::new(), Vec::new());
    varint(token, &mut old);
    varint((1 << 53) - 1, &mut new);
    let mut crafted = Vec::new();
    let mut i = 0;
    let mut replaced = 0;
    while i < payload.len() {
        if payload[i..].starts_with(&old) {
            crafted.extend_from_slice(&new);
            i += old.len();
            replaced += 1;
        } else {
            crafted.push(payload[i]);
            i += 1;
        }
    }
    assert_eq!(replaced, 2, "the lease's token and the last token");
    let r: Value = redis::cmd("RESTORE")
        .arg("mem:{poison}:crafted")
        .arg(0)
        .arg(wrap(&dump, &crafted))
        .query(&mut con)
        .unwrap();
    assert_eq!(r, Value::Okay);
    // Other keys still get leases, after FLUSHALL too.
    ready(&mut con, "mem:{other}");
    let fresh = begin(&mut con, "mem:{other}").unwrap();
    assert!(fresh > token as i64, "{fresh} after {token}");
    ok(&mut con, &["FLUSHALL"]);
    ready(&mut con, "mem:{other}");
    assert!(begin(&mut con, "mem:{other}").unwrap() > fresh);
}
