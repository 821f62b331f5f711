//! attack3 (issue 13), from outside: the model table changed under running
//! sessions and under writes waiting for an encoding's build, and
//! `mem.default-encoding` moved to an encoding not built yet.

use crate::support::server::*;
use crate::support::session::digest;

fn state(con: &mut redis::Connection, encoding: &str) -> String {
    let info: String = redis::cmd("INFO").arg("mem").query(con).unwrap();
    let want = format!("mem_encoding_{encoding}:");
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(&want))
        .unwrap_or("");
    line.split(',')
        .find_map(|f| f.strip_prefix("state="))
        .unwrap_or("")
        .trim()
        .to_owned()
}

fn msg(enc: &tiktoken::CoreBpe, role: &str, text: &str) -> i64 {
    3 + (enc.count(role) + enc.count(text)) as i64
}

fn append_in_thread(
    server: &Server,
    args: &[&str],
) -> std::thread::JoinHandle<redis::RedisResult<redis::Value>> {
    let url = server.url();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cmd(&mut c, &args)
    })
}

#[test]
fn the_table_changed_while_a_write_waits_for_its_encoding() {
    let server = Server::start();
    let mut con = server.client();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "house*=qwen2:1000"],
    )
    .unwrap();
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "800"],
    )
    .unwrap();
    // Moved to another unbuilt encoding meanwhile: the resumed write cannot
    // count here, refuses with TRYAGAIN and writes nothing.
    let waiting = append_in_thread(
        &server,
        &["MEM.APPEND", "h", "user", "hello 你好", "MODEL", "house-1"],
    );
    poll_until(&mut con, "the append to wait", |c| blocked_appends(c) == 1);
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "house*=glm5:1000"],
    )
    .unwrap();
    let e = waiting.join().unwrap().unwrap_err();
    assert!(e.to_string().to_uppercase().contains("TRYAGAIN"), "{e}");
    assert_eq!(
        cmd(&mut con, &["EXISTS", "h"]).unwrap(),
        redis::Value::Int(0),
        "nothing written"
    );
    // The refusal started glm5's build: the retry counts under glm5.
    poll_until(&mut con, "glm5 built", |c| state(c, "glm5") == "loaded");
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "h", "user", "hello 你好", "MODEL", "house-1"],
    );
    let g = tiktoken::get_encoding("glm5").unwrap();
    assert_eq!(int_field(&r, "tokens"), msg(g, "user", "hello 你好"));
    // Moved to a built encoding meanwhile: counted again, inline, under it.
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "house*=kimi_k2:1000"],
    )
    .unwrap();
    let waiting = append_in_thread(
        &server,
        &[
            "MEM.APPEND",
            "h",
            "assistant",
            "ok 好的",
            "MODEL",
            "house-1",
        ],
    );
    poll_until(&mut con, "the append to wait", |c| blocked_appends(c) == 1);
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "house*=glm5:1000"],
    )
    .unwrap();
    let r = as_fields(waiting.join().unwrap().unwrap());
    assert_eq!(int_field(&r, "tokens"), msg(g, "assistant", "ok 好的"));
    let info = map_reply(&mut con, &["MEM.INFO", "h"]);
    assert_eq!(str_field(&info, "encoding"), "glm5");
    assert_eq!(
        int_field(&info, "total_tokens"),
        msg(g, "user", "hello 你好") + msg(g, "assistant", "ok 好的")
    );
}

#[test]
fn a_table_change_moves_a_session_only_when_its_model_is_given_again() {
    let server = Server::start();
    let mut con = server.client();
    let (_replica, mut rcon) = start_replica(&server);
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "house*=glm4:1000"],
    )
    .unwrap();
    map_reply(
        &mut con,
        &["MEM.APPEND", "h", "user", "hello", "MODEL", "house-1"],
    );
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.models", "house*=cl100k_base:2000"],
    )
    .unwrap();
    // The window is looked up live; the encoding is the session's own.
    let info = map_reply(&mut con, &["MEM.INFO", "h"]);
    assert_eq!(
        (
            str_field(&info, "encoding").as_str(),
            int_field(&info, "context_window")
        ),
        ("glm4", 2000)
    );
    map_reply(&mut con, &["MEM.APPEND", "h", "user", "again"]);
    assert_eq!(
        str_field(&map_reply(&mut con, &["MEM.INFO", "h"]), "encoding"),
        "glm4"
    );
    // Given again: re-counted under the new encoding, on the replica too
    // (which has neither mem.models entry: the op carries the counts).
    map_reply(
        &mut con,
        &["MEM.APPEND", "h", "user", "third", "MODEL", "house-1"],
    );
    let c = tiktoken_rs::cl100k_base_singleton();
    let n = |t: &str| c.encode_ordinary(t).len() as i64;
    let want = 3 * (3 + n("user")) + n("hello") + n("again") + n("third");
    let info = map_reply(&mut con, &["MEM.INFO", "h"]);
    assert_eq!(
        (
            str_field(&info, "encoding").as_str(),
            int_field(&info, "total_tokens")
        ),
        ("cl100k_base", want)
    );
    cmd(&mut con, &["WAIT", "1", "5000"]).unwrap();
    assert_eq!(digest(&mut rcon, "h"), digest(&mut con, "h"));
    assert_eq!(
        int_field(&map_reply(&mut rcon, &["MEM.INFO", "h"]), "total_tokens"),
        want
    );
}

#[test]
fn the_default_encoding_moved_to_an_unbuilt_one() {
    let server = Server::start();
    let mut con = server.client();
    map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "c",
            "user",
            "hello",
            "MODEL",
            "claude-sonnet-4-5",
        ],
    );
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.default-encoding", "deepseek_v3"],
    )
    .unwrap();
    let r = map_reply(&mut con, &["MEM.MODELS", "claude-sonnet-4-5"]);
    assert_eq!(
        (str_field(&r, "encoding").as_str(), int_field(&r, "exact")),
        ("deepseek_v3", 0)
    );
    // In MULTI: TRYAGAIN, nothing written; the build starts anyway.
    let got = redis::pipe()
        .atomic()
        .cmd("MEM.APPEND")
        .arg("c")
        .arg("user")
        .arg("x")
        .arg("MODEL")
        .arg("claude-sonnet-4-5")
        .query::<redis::Value>(&mut con);
    let text = match got {
        Ok(v) => format!("{v:?}"),
        Err(e) => e.to_string(),
    };
    assert!(text.to_uppercase().contains("TRYAGAIN"), "{text}");
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "c"]), "messages"),
        1
    );
    // Outside MULTI it waits, and the Claude session is re-counted under
    // the new default (its model now resolves to another encoding).
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "c", "user", "x", "MODEL", "claude-sonnet-4-5"],
    );
    let d = tiktoken::get_encoding("deepseek_v3").unwrap();
    assert_eq!(int_field(&r, "tokens"), msg(d, "user", "x"));
    let info = map_reply(&mut con, &["MEM.INFO", "c"]);
    assert_eq!(str_field(&info, "encoding"), "deepseek_v3");
    assert_eq!(
        int_field(&info, "total_tokens"),
        msg(d, "user", "hello") + msg(d, "user", "x")
    );
    // A count of an unknown model follows the default too.
    let n = cmd(&mut con, &["MEM.COUNT", "no-such-model", "深度求索"]).unwrap();
    assert_eq!(n, redis::Value::Int(d.count("深度求索") as i64));
}

#[test]
fn debug_reload_and_flushall_async_while_writes_wait_for_a_build() {
    let server = Server::start();
    let mut con = server.client();
    map_reply(
        &mut con,
        &[
            "MEM.APPEND",
            "r",
            "user",
            "before",
            "MODEL",
            "gpt-4o",
            "MSGID",
            "m1",
        ],
    );
    cmd(
        &mut con,
        &["CONFIG", "SET", "mem.debug-count-delay-ms", "800"],
    )
    .unwrap();
    // A switch to llama3 (unbuilt) waits while the keyspace is reloaded.
    let waiting = append_in_thread(
        &server,
        &[
            "MEM.APPEND",
            "r",
            "user",
            "after",
            "MODEL",
            "llama-3.3-70b",
            "MSGID",
            "m2",
        ],
    );
    poll_until(&mut con, "the append to wait", |c| blocked_appends(c) == 1);
    cmd(&mut con, &["DEBUG", "RELOAD"]).unwrap();
    let r = as_fields(waiting.join().unwrap().unwrap());
    let l = tiktoken::get_encoding("llama3").unwrap();
    assert_eq!(int_field(&r, "id"), 2);
    let info = map_reply(&mut con, &["MEM.INFO", "r"]);
    assert_eq!(str_field(&info, "encoding"), "llama3");
    assert_eq!(
        int_field(&info, "total_tokens"),
        msg(l, "user", "before") + msg(l, "user", "after")
    );
    // Retries after the reload are duplicates.
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "r", "user", "after", "MSGID", "m2"],
    );
    assert_eq!(int_field(&r, "duplicate"), 1);
    // FLUSHALL ASYNC while a write waits for tekken: the write lands in an
    // empty keyspace as a new session.
    let waiting = append_in_thread(
        &server,
        &[
            "MEM.APPEND",
            "r",
            "user",
            "again",
            "MODEL",
            "codestral-latest",
            "MSGID",
            "m3",
        ],
    );
    poll_until(&mut con, "the append to wait", |c| blocked_appends(c) == 1);
    cmd(&mut con, &["FLUSHALL", "ASYNC"]).unwrap();
    let r = as_fields(waiting.join().unwrap().unwrap());
    assert_eq!(
        (int_field(&r, "id"), int_field(&r, "duplicate")),
        (1, 0),
        "a new session"
    );
    let r = map_reply(
        &mut con,
        &["MEM.APPEND", "r", "user", "before", "MSGID", "m1"],
    );
    assert_eq!(
        (int_field(&r, "id"), int_field(&r, "duplicate")),
        (2, 0),
        "m1 was flushed with its session"
    );
    let t = tiktoken::get_encoding("mistral_v3").unwrap();
    assert_eq!(
        int_field(&map_reply(&mut con, &["MEM.INFO", "r"]), "total_tokens"),
        msg(t, "user", "again") + msg(t, "user", "before")
    );
}
