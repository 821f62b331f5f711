//! MEM.APPENDBATCH: several messages in one atomic command (what an agent
//! step needs without MULTI/EXEC), equal to the same MEM.APPENDs one by one.

use crate::support::reply::*;
use crate::support::server::*;
use crate::support::session;
use redis::Value;
use serde_json::{json, Value as Json};

fn batch(
    con: &mut redis::Connection,
    key: &str,
    messages: &Json,
    opts: &[&str],
) -> Vec<Vec<(String, Value)>> {
    let text = messages.to_string();
    let mut args = vec!["MEM.APPENDBATCH", key, &text];
    args.extend_from_slice(opts);
    match ok(con, &args) {
        Value::Array(items) => items.into_iter().map(as_fields).collect(),
        other => panic!("MEM.APPENDBATCH reply is not an array: {other:?}"),
    }
}

fn step() -> Json {
    json!([
        {"role": "user", "content": "Weather in Paris?", "ts": 1_700_000_000_000i64},
        {"role": "assistant", "content": "", "ts": 1_700_000_001_000i64,
         "meta": {"tool_calls": [{"id": "c1", "name": "weather"}]}},
        {"role": "tool", "content": "{\"temp_c\": 21}", "ts": 1_700_000_002_000i64, "meta": {"tool_call_id": "c1"}},
        {"role": "assistant", "content": "21 °C. 晴れ。", "ts": 1_700_000_003_000i64}
    ])
}

/// The same messages through MEM.APPEND, one by one.
fn one_by_one(
    con: &mut redis::Connection,
    key: &str,
    messages: &Json,
    opts: &[&str],
) -> Vec<Vec<(String, Value)>> {
    messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let ts = m["ts"].to_string();
            let meta = m.get("meta").map(Json::to_string);
            let mut args = vec!["TS", ts.as_str()];
            if let Some(meta) = &meta {
                args.extend(["META", meta.as_str()]);
            }
            args.extend_from_slice(opts);
            append(
                con,
                key,
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap(),
                &args,
            )
        })
        .collect()
}

fn history(con: &mut redis::Connection, key: &str) -> Json {
    json_doc(con, key)["conversation_history"].clone()
}

#[test]
fn a_batch_equals_the_same_appends_one_by_one() {
    let server = Server::start();
    let mut con = server.client();
    let opts = ["MAXMSGS", "3", "TTL", "600"];
    let replies = batch(&mut con, "mem:{b}", &step(), &opts);
    let singles = one_by_one(&mut con, "mem:{s}", &step(), &opts);
    assert_eq!(replies.len(), 4);
    for (i, (b, s)) in replies.iter().zip(&singles).enumerate() {
        assert_eq!(names(b), OUTCOME_FIELDS, "reply {i}");
        assert_eq!(b, s, "reply {i} differs from MEM.APPEND's");
    }
    // MAXMSGS 3 trimmed the first message within the batch, as it would one by one.
    assert_eq!(int_field(&replies[3], "trimmed"), 1);
    assert_eq!(history(&mut con, "mem:{b}"), history(&mut con, "mem:{s}"));
    assert_eq!(
        int_field(&replies[0], "tokens"),
        mt_o("user", "Weather in Paris?")
    );
    let pttl = int(&mut con, &["PTTL", "mem:{b}"]);
    assert!(pttl > 590_000 && pttl <= 600_000, "{pttl}");
}

#[test]
fn a_bad_message_refuses_the_whole_batch() {
    let server = Server::start();
    let mut con = server.client();
    append(&mut con, "mem:{k}", "user", "first", &[]);
    let before = snap(&mut con, "mem:{k}");
    let good = json!({"role": "user", "content": "ok"});
    let cases: Vec<(String, &str)> = vec![
        ("[]".into(), "1 to 1000 messages"),
        ("{}".into(), "JSON array"),
        ("not json".into(), "JSON array"),
        (
            json!([good, {"role": "", "content": "x"}]).to_string(),
            "messages[1]: role",
        ),
        (
            json!([good, {"role": "user"}]).to_string(),
            "messages[1]: missing field `content`",
        ),
        (
            json!([good, {"role": "user", "content": null}]).to_string(),
            "messages[1]: content must be a string (null only on a message with tool calls)",
        ),
        (
            json!([good, {"role": "assistant", "content": null, "meta": {"tool_calls": []}}])
                .to_string(),
            "null only on a message with tool calls",
        ),
        (
            json!([good, {"role": "user", "content": "x", "meta": [1]}]).to_string(),
            "META must be a JSON object",
        ),
        (
            json!([good, {"role": "user", "content": "x", "extra": 1}]).to_string(),
            "messages[1]: unknown field",
        ),
        // serde's type errors name the item too, not only a column (pass 54 F4).
        (
            json!([good, good, {"role": "user", "content": "x", "tokens": -1}]).to_string(),
            "messages[2]: invalid value: integer `-1`",
        ),
        (
            json!([good, {"role": 5, "content": "x"}]).to_string(),
            "messages[1]: invalid type: integer `5`, expected a string",
        ),
        (
            json!([good, {"role": "user", "content": "x", "ts": "soon"}]).to_string(),
            "messages[1]: invalid type: string",
        ),
        (
            json!([good, 7]).to_string(),
            "messages[1]: invalid type: integer",
        ),
        (
            json!([good, {"role": "user", "content": "x", "ts": 253_402_300_800_000i64}])
                .to_string(),
            "ts must be at most",
        ),
        (
            json!(vec![good.clone(); 1001]).to_string(),
            "1 to 1000 messages",
        ),
    ];
    for (text, needle) in cases {
        assert_err(&mut con, &["MEM.APPENDBATCH", "mem:{k}", &text], needle);
        assert_unchanged(&mut con, "mem:{k}", &before, &format!("after {text:.60}"));
    }
    assert_err(
        &mut con,
        &["MEM.APPENDBATCH", "mem:{k}"],
        "wrong number of arguments",
    );
    assert_err(
        &mut con,
        &["MEM.APPENDBATCH", "mem:{k}", "[]", "BOGUS", "1"],
        "unknown option",
    );
    ok(&mut con, &["SET", "plain", "x"]);
    assert_err(
        &mut con,
        &["MEM.APPENDBATCH", "plain", &json!([good]).to_string()],
        "WRONGTYPE",
    );
}

#[test]
fn a_large_batch_is_counted_on_the_pool_and_replicates_identically() {
    let master = Server::start();
    let mut con = master.client();
    let (_replica, mut rcon) = start_replica(&master);
    let big: Vec<Json> = (0..6)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("{i} ").repeat(15_000)}))
        .collect();
    let before = info_mem(&mut con, "counts_off_thread");
    let replies = batch(
        &mut con,
        "mem:{big}",
        &Json::Array(big.clone()),
        &["MAXMSGS", "100"],
    );
    // (A worker counts a job done just after handing its result back.)
    poll_until(&mut con, "the batch counted on the pool", |c| {
        info_mem(c, "counts_off_thread") == before + 1
    });
    for (reply, m) in replies.iter().zip(&big) {
        assert_eq!(
            int_field(reply, "tokens"),
            mt_o(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
        );
    }
    // Inside MULTI (which cannot wait for a worker) a large batch is refused.
    let text = Json::Array(big).to_string();
    let r: redis::RedisResult<Vec<Value>> = redis::pipe()
        .atomic()
        .cmd("MEM.APPENDBATCH")
        .arg("mem:{multi}")
        .arg(&text)
        .query(&mut con);
    let e = r.expect_err("a large batch inside MULTI must be refused");
    assert!(err_text(&e).contains("cannot wait for"), "{e}");
    assert_eq!(int(&mut con, &["EXISTS", "mem:{multi}"]), 0);
    let _: Value = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    {
        let key = "mem:{big}";
        assert_eq!(
            session::digest(&mut con, key),
            session::digest(&mut rcon, key),
            "{key}"
        );
        assert_eq!(
            session::json_text(&mut con, key),
            session::json_text(&mut rcon, key),
            "{key}"
        );
    }
}

/// OpenAI's shape of a turn that only calls tools, `"content": null`, is
/// read as "" when META holds tool calls, by MEM.APPENDBATCH as by
/// MEM.IMPORT (hostile pass 34 F3: IMPORT took it, APPENDBATCH refused
/// it; IMPORT took it with `tool_calls` of `[]`, `{}` or `"x"` too; pass
/// 35: `[null]`, `[[]]`). Tool calls are a non-empty array of objects.
#[test]
fn null_content_of_a_tool_calling_turn_is_empty_in_a_batch_and_an_import() {
    let server = Server::start();
    let mut con = server.client();
    let calls =
        json!([{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]);
    let messages = json!([
        {"role": "user", "content": "go", "ts": 1_700_000_000_000i64},
        {"role": "assistant", "content": null, "ts": 1_700_000_001_000i64, "meta": {"tool_calls": calls}},
        {"role": "tool", "content": "done", "ts": 1_700_000_002_000i64, "meta": {"tool_call_id": "c1"}}
    ]);
    batch(&mut con, "mem:{b}", &messages, &["TTL", "0"]);
    let doc = json!({"conversation_history": messages});
    ok(
        &mut con,
        &["MEM.IMPORT", "mem:{i}", &doc.to_string(), "TTL", "0"],
    );
    let (b, i) = (history(&mut con, "mem:{b}"), history(&mut con, "mem:{i}"));
    assert_eq!(b, i);
    assert_eq!(b[1]["content"], "");
    assert_eq!(b[1]["meta"]["tool_calls"], calls);
    for calls in [
        json!([]),
        json!({}),
        json!("x"),
        json!(0),
        json!(false),
        json!(null),
        json!([null]),
        json!([[]]),
        json!([{"id": "c1"}, 0]),
    ] {
        let one = json!([{"role": "assistant", "content": null, "meta": {"tool_calls": calls}}]);
        assert_err(
            &mut con,
            &["MEM.APPENDBATCH", "mem:{none}", &one.to_string()],
            "null only on a message with tool calls",
        );
        let doc = json!({"conversation_history": [{"role": "assistant", "content": null, "tool_calls": calls}]});
        assert_err(
            &mut con,
            &["MEM.IMPORT", "mem:{none}", &doc.to_string()],
            "content must be a string",
        );
        assert_eq!(int(&mut con, &["EXISTS", "mem:{none}"]), 0);
    }
}

/// A META is stored as its JSON text without the whitespace around it, by
/// every command that takes one (APPEND's argument, APPENDBATCH's and
/// IMPORT's members), so the same message reads back the same; `"meta":
/// null` in a document is no META (as in MEM.IMPORT), while APPEND's META
/// argument must be an object.
#[test]
fn meta_is_stored_alike_by_every_command_and_null_means_none_in_documents() {
    let server = Server::start();
    let mut con = server.client();
    let meta = r#"{"b": [1, 2.50, "x"],  "a" : {}}"#;
    let padded = format!(" \t\r\n{meta}\n ");
    append(
        &mut con,
        "mem:{a}",
        "user",
        "hi",
        &["TS", "1700000000000", "META", &padded],
    );
    let item = format!(r#"[{{"role":"user","content":"hi","ts":1700000000000,"meta": {padded}}}]"#);
    ok(&mut con, &["MEM.APPENDBATCH", "mem:{b}", &item]);
    let doc = format!(
        r#"{{"conversation_history":[{{"role":"user","content":"hi","ts":1700000000000,"meta":{padded}}}]}}"#
    );
    ok(&mut con, &["MEM.IMPORT", "mem:{i}", &doc]);
    for key in ["mem:{a}", "mem:{b}", "mem:{i}"] {
        let got = get(&mut con, &["MEM.GET", key]);
        assert_eq!(got[0].meta.as_deref(), Some(meta), "{key}");
    }
    assert_eq!(history(&mut con, "mem:{a}"), history(&mut con, "mem:{b}"));
    // null: no META in a document; refused as APPEND's argument.
    let item = r#"[{"role":"user","content":"hi","ts":1700000000000,"meta":null}]"#;
    ok(&mut con, &["MEM.APPENDBATCH", "mem:{n}", item]);
    assert_eq!(get(&mut con, &["MEM.GET", "mem:{n}"])[0].meta, None);
    assert_err(
        &mut con,
        &["MEM.APPEND", "mem:{n}", "user", "x", "META", "null"],
        "META must be a JSON object",
    );
    // Whitespace JSON does not allow around a value is still refused.
    assert_err(
        &mut con,
        &["MEM.APPEND", "mem:{n}", "user", "x", "META", "\u{3000}{}"],
        "META",
    );
    assert_eq!(get(&mut con, &["MEM.GET", "mem:{n}"]).len(), 1);
}

/// A tool result needs a message a read shows before it, in a batch as one
/// by one (hostile pass 53, F4): the batch checked only its first new
/// message, so a message whose TS was already past MAXAGE let the tool
/// result after it in, where MEM.APPEND refuses it (the aged call would be
/// kept alive by its result). Each case runs the same messages through
/// MEM.APPENDBATCH and MEM.APPEND one by one: the batch is refused whole
/// (naming the message MEM.APPEND refused, the key unchanged) or equal to
/// the appends, on the master and on a replica.
#[test]
fn a_tool_result_after_an_aged_message_is_refused_in_a_batch_as_one_by_one() {
    let master = Server::start();
    let (_replica, mut rcon) = start_replica(&master);
    let mut con = master.client();
    let now = now_ms();
    let (aged, fresh) = (1_000i64, now - 1_000);
    let msg =
        |role: &str, ts: i64| json!({"role": role, "content": format!("{role} at {ts}"), "ts": ts});
    // (name, messages already held, the batch, its options, the item refused)
    type Case<'a> = (&'a str, Json, Json, &'a [&'a str], Option<usize>);
    let cases: [Case; 5] = [
        (
            "empty",
            json!([]),
            json!([msg("user", aged), msg("tool", fresh)]),
            &["MAXAGE", "100"],
            Some(1),
        ),
        (
            "live before",
            json!([msg("user", fresh)]),
            json!([msg("assistant", aged), msg("tool", fresh)]),
            &["MAXAGE", "100"],
            None,
        ),
        (
            "capped away",
            json!([msg("user", fresh)]),
            json!([msg("assistant", aged), msg("tool", fresh)]),
            &["MAXAGE", "100", "MAXMSGS", "1"],
            Some(1),
        ),
        (
            "later in the batch",
            json!([]),
            json!([
                msg("user", fresh),
                msg("assistant", aged),
                msg("user", aged),
                msg("tool", fresh)
            ]),
            &["MAXAGE", "100", "MAXMSGS", "1"],
            Some(3),
        ),
        (
            "no maxage",
            json!([]),
            json!([msg("user", aged), msg("tool", fresh)]),
            &[],
            None,
        ),
    ];
    for (n, (name, held, items, opts, refused)) in cases.into_iter().enumerate() {
        let (by_batch, singles) = (format!("mem:{{t{n}}}b"), format!("mem:{{t{n}}}a"));
        for k in [&by_batch, &singles] {
            if !held.as_array().unwrap().is_empty() {
                batch(&mut con, k, &held, opts);
            }
        }
        let before = snap(&mut con, &by_batch);
        // One by one, up to the first refusal.
        let mut want = Vec::new();
        let mut refused_at = None;
        for (i, m) in items.as_array().unwrap().iter().enumerate() {
            let (role, content, ts) = (
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap(),
                m["ts"].to_string(),
            );
            let mut args = vec![
                "MEM.APPEND",
                singles.as_str(),
                role,
                content,
                "TS",
                ts.as_str(),
            ];
            args.extend_from_slice(opts);
            match cmd(&mut con, &args) {
                Ok(v) => want.push(as_fields(v)),
                Err(e) => {
                    assert!(
                        err_text(&e).contains("cannot be the session's first message"),
                        "{name}: {e}"
                    );
                    refused_at = Some(i);
                    break;
                }
            }
        }
        assert_eq!(refused_at, refused, "{name}: one by one");
        let text = items.to_string();
        let mut args = vec!["MEM.APPENDBATCH", by_batch.as_str(), text.as_str()];
        args.extend_from_slice(opts);
        match refused {
            Some(i) => {
                let e = err(&mut con, &args);
                assert!(
                    e.contains(&format!(
                        "messages[{i}]: a tool result cannot be the session's first message"
                    )),
                    "{name}: {e}"
                );
                assert_unchanged(&mut con, &by_batch, &before, name);
            }
            None => {
                let Value::Array(got) = ok(&mut con, &args) else {
                    panic!("{name}")
                };
                let got: Vec<_> = got.into_iter().map(as_fields).collect();
                assert_eq!(got, want, "{name}: replies");
                assert_eq!(
                    history(&mut con, &by_batch),
                    history(&mut con, &singles),
                    "{name}"
                );
            }
        }
        let view = |c: &mut redis::Connection| {
            redis::cmd("MEM.GET")
                .arg(&by_batch)
                .arg("FORMAT")
                .arg("JSON")
                .query::<Option<String>>(c)
        };
        let master_view = view(&mut con).unwrap();
        session::wait_until("the replica's copy of the batch's key", 10, || {
            view(&mut rcon).is_ok_and(|v| v == master_view)
        });
    }
    // The copy a batch is first run on switches tokenizer as the session
    // would: the same counts and the same messages as one by one.
    let items = json!([msg("assistant", aged), msg("tool", fresh)]);
    let opts = ["MAXAGE", "100", "MODEL", "gpt-4o"];
    for k in ["mem:{m}b", "mem:{m}a"] {
        let ts = fresh.to_string();
        append(&mut con, k, "user", "held", &["MODEL", "gpt-4", "TS", &ts]);
    }
    let got = batch(&mut con, "mem:{m}b", &items, &opts);
    let want = one_by_one(&mut con, "mem:{m}a", &items, &opts);
    assert_eq!(got, want, "model switch: replies");
    assert_eq!(history(&mut con, "mem:{m}b"), history(&mut con, "mem:{m}a"));
}

/// Near the last id (2^53 - 1) a batch takes ids only for the messages new
/// by their turn, as MEM.APPEND one by one (hostile pass 53, F5: a retry
/// counted as needing one, so a batch that fitted was refused); one that
/// does not fit is refused whole, changing nothing.
#[test]
fn a_batch_near_the_last_id_takes_ids_only_for_its_new_messages() {
    let server = Server::start();
    let mut con = server.client();
    let top: u64 = (1 << 53) - 1;
    // One message (id top - 1, msgid m1) after a summary: one id left.
    let doc = json!({
        "conversation_history": [{"role": "user", "content": "near the top", "msgid": "m1"}],
        "summary": {"text": "long ago", "upto": top - 2},
    });
    for k in ["mem:{top}b", "mem:{top}a", "mem:{top}c"] {
        ok(&mut con, &["MEM.IMPORT", k, &doc.to_string()]);
    }
    let retry_then_new = json!([{"role": "user", "content": "near the top", "msgid": "m1"},
                                {"role": "user", "content": "x"}]);
    let got = batch(&mut con, "mem:{top}b", &retry_then_new, &[]);
    let want: Vec<_> = [vec!["MSGID", "m1"], vec![]]
        .iter()
        .zip(["near the top", "x"])
        .map(|(opts, content)| append(&mut con, "mem:{top}a", "user", content, opts))
        .collect();
    assert_eq!(got, want);
    assert_eq!(int_field(&got[1], "id") as u64, top);
    // The same messages (the times are each write's own).
    let untimed = |con: &mut redis::Connection, k: &str| {
        let mut h = history(con, k);
        for m in h.as_array_mut().unwrap() {
            let m = m.as_object_mut().unwrap();
            m.remove("ts");
            m.remove("timestamp");
        }
        h
    };
    assert_eq!(
        untimed(&mut con, "mem:{top}b"),
        untimed(&mut con, "mem:{top}a")
    );
    // No id left; and two new messages where one id is left.
    for (k, items) in [
        ("mem:{top}b", json!([{"role": "user", "content": "y"}])),
        (
            "mem:{top}c",
            json!([{"role": "user", "content": "near the top", "msgid": "m1"},
                              {"role": "user", "content": "y"}, {"role": "user", "content": "z"}]),
        ),
    ] {
        let before = snap(&mut con, k);
        assert_err(
            &mut con,
            &["MEM.APPENDBATCH", k, &items.to_string()],
            "used every message id",
        );
        assert_unchanged(&mut con, k, &before, k);
    }
}
