//! ACL category `mem`: where the server has RedisModule_AddACLCategory (Redis
//! 7.4+, Valkey 8) every public MEM.* command joins it, so `+@mem` grants
//! exactly them; on older servers (Redis 7.0, 7.2) the module still loads and
//! every command works, without the category. `make test-compat` runs this
//! once per server, so both branches are exercised.

use crate::support::server::*;

/// The public commands (internal ones are refused from clients anyway).
const PUBLIC: &[&str] = &[
    "mem.append",
    "mem.appendbatch",
    "mem.get",
    "mem.summarize_check",
    "mem.summarize",
    "mem.summarize_begin",
    "mem.extset",
    "mem.extget",
    "mem.import",
    "mem.info",
    "mem.attrset",
    "mem.attrget",
    "mem.attrdel",
    "mem.count",
    "mem.models",
];

/// (major, minor) of the server, and whether it is Valkey.
fn server_version(con: &mut redis::Connection) -> ((u32, u32), bool) {
    let info: String = redis::cmd("INFO").arg("server").query(con).unwrap();
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_string())
        })
    };
    let (valkey, v) = match field("valkey_version") {
        Some(v) => (true, v),
        None => (
            false,
            field("redis_version").expect("redis_version in INFO server"),
        ),
    };
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)),
        valkey,
    )
}

fn has_add_acl_category(con: &mut redis::Connection) -> bool {
    let (version, valkey) = server_version(con);
    if valkey {
        version >= (8, 0)
    } else {
        version >= (7, 4)
    }
}

/// The ACL categories of a COMMAND INFO reply for one command.
fn command_categories(info: &redis::Value) -> Vec<String> {
    let redis::Value::Array(outer) = info else {
        panic!("COMMAND INFO: {info:?}")
    };
    let Some(redis::Value::Array(entry)) = outer.first() else {
        panic!("COMMAND INFO: {info:?}")
    };
    match entry.get(6) {
        Some(v @ (redis::Value::Array(_) | redis::Value::Set(_))) => {
            redis::from_redis_value(v).unwrap()
        }
        other => panic!("no categories in {other:?}"),
    }
}

#[test]
fn mem_commands_join_the_mem_acl_category_where_the_server_has_one() {
    let server = Server::start();
    let mut con = server.client();
    let categories: Vec<String> = redis::cmd("ACL").arg("CAT").query(&mut con).unwrap();
    if !has_add_acl_category(&mut con) {
        // Redis 7.0/7.2: no module categories; the module loaded all the same.
        assert!(!categories.iter().any(|c| c == "mem"), "{categories:?}");
        let r = map_reply(&mut con, &["MEM.APPEND", "mem:{acl}", "user", "hello"]);
        assert_eq!(int_field(&r, "id"), 1);
        assert!(
            server.log().contains("does not support"),
            "the load logs why there is no category"
        );
        return;
    }
    assert!(
        categories.iter().any(|c| c == "mem"),
        "ACL CAT lists mem: {categories:?}"
    );
    // Each public command carries @mem (COMMAND INFO's categories, element 6);
    // internal ones do not.
    for name in PUBLIC.iter().chain(&["mem._apply", "mem._put"]) {
        let info = cmd(&mut con, &["COMMAND", "INFO", name]).unwrap();
        let cats = command_categories(&info);
        assert_eq!(
            cats.iter().any(|c| c == "@mem"),
            !name.starts_with("mem._"),
            "{name}: {cats:?}"
        );
    }
    // ACL CAT mem lists exactly them (Valkey 8.0.1 lists no module command
    // under a module category, though +@mem grants them: checked below).
    let mut members: Vec<String> = redis::cmd("ACL")
        .arg("CAT")
        .arg("mem")
        .query(&mut con)
        .unwrap();
    if !(server_version(&mut con) == ((8, 0), true) && members.is_empty()) {
        members.iter_mut().for_each(|m| *m = m.to_lowercase());
        members.sort();
        let mut want: Vec<String> = PUBLIC.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(members, want, "ACL CAT mem is exactly the public commands");
    }

    // A user granted only +@mem runs MEM.* on its keys and nothing else.
    let ok: String = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">pw", "~mem:*", "-@all", "+@mem"])
        .query(&mut con)
        .unwrap();
    assert_eq!(ok, "OK");
    let mut app = server.client();
    let _: String = redis::cmd("AUTH")
        .arg("app")
        .arg("pw")
        .query(&mut app)
        .unwrap();
    let r = map_reply(&mut app, &["MEM.APPEND", "mem:{acl}", "user", "hello"]);
    assert_eq!(int_field(&r, "id"), 1);
    let got = cmd(&mut app, &["MEM.GET", "mem:{acl}"]).unwrap();
    assert!(
        matches!(got, redis::Value::Array(ref a) if a.len() == 1),
        "{got:?}"
    );
    let e = cmd(&mut app, &["SET", "mem:{acl}x", "v"]).unwrap_err();
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
    let e = cmd(&mut app, &["MEM._PUT", "mem:{acl}", "x"]).unwrap_err();
    assert_eq!(
        e.code(),
        Some("NOPERM"),
        "internal commands are not in @mem: {e}"
    );
    // -@mem takes them away again.
    let _: String = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "-@mem"])
        .query(&mut con)
        .unwrap();
    let e = cmd(&mut app, &["MEM.GET", "mem:{acl}"]).unwrap_err();
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
}

/// Hostile finding (fixed): MEM.* commands were in no standard category, so
/// a user `+@all -@write` could change sessions and a `+@read` one could
/// not read them. Where the server sets module commands' categories (Redis
/// 7.2+, Valkey 8), each is in `@write` or `@read` as its flags say.
#[test]
fn mem_commands_are_in_the_write_or_read_category() {
    let server = Server::start();
    let mut con = server.client();
    let (version, valkey) = server_version(&mut con);
    if !valkey && version < (7, 2) {
        return; // Redis 7.0: no RedisModule_SetCommandACLCategories.
    }
    map_reply(&mut con, &["MEM.APPEND", "mem:{c}", "user", "hello"]);
    for (user, rules) in [
        ("nowrite", &["+@all", "-@write"][..]),
        ("reader", &["-@all", "+@read"][..]),
    ] {
        let mut setuser = vec!["ACL", "SETUSER", user, "on", ">pw", "~*"];
        setuser.extend(rules);
        cmd(&mut con, &setuser).unwrap();
        let mut c = server.client();
        cmd(&mut c, &["AUTH", user, "pw"]).unwrap();
        for write in [
            &["MEM.APPEND", "mem:{c}", "user", "x"][..],
            &[
                "MEM.APPENDBATCH",
                "mem:{c}",
                r#"[{"role":"user","content":"x"}]"#,
            ],
            &["MEM.SUMMARIZE", "mem:{c}", "1", "s"],
            &["MEM.ATTRSET", "mem:{c}", "a", "1"],
            &["MEM.EXTSET", "mem:{c}", "dify", "x"],
            &["MEM.IMPORT", "mem:{d}", r#"{"conversation_history":[]}"#],
        ] {
            let e = cmd(&mut c, write).unwrap_err();
            assert!(e.to_string().contains("NOPERM"), "{user} {write:?}: {e}");
        }
        let got = cmd(&mut c, &["MEM.GET", "mem:{c}"]).unwrap();
        assert!(
            matches!(got, redis::Value::Array(ref a) if a.len() == 1),
            "{user}: {got:?}"
        );
        cmd(&mut c, &["MEM.INFO", "mem:{c}"]).unwrap();
    }
    let info = cmd(&mut con, &["COMMAND", "INFO", "mem.append"]).unwrap();
    let cats = command_categories(&info);
    assert!(
        cats.iter().any(|c| c == "@write") && cats.iter().any(|c| c == "@slow"),
        "{cats:?}"
    );
}
