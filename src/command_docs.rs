//! Command documentation and key specs, declared with `RedisModule_SetCommandInfo`
//! (Redis 7.0+): `COMMAND DOCS` answers, redis-cli shows argument hints, and
//! key specs carry read/write flags for ACL patterns (`%R~`, `%W~`) and cluster
//! routing.

use std::ffi::{c_char, CString};

use redis_module::{raw, Context};

/// One argument of a command's documentation.
pub struct Arg {
    name: &'static str,
    kind: raw::RedisModuleCommandArgType,
    token: Option<&'static str>,
    optional: bool,
    subargs: Vec<Arg>,
}

fn arg(name: &'static str, kind: raw::RedisModuleCommandArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        subargs: Vec::new(),
    }
}

fn string(name: &'static str) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    )
}

fn integer(name: &'static str) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
    )
}

fn key() -> Arg {
    arg(
        "key",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
    )
}

/// `[TOKEN value]`
fn option(token: &'static str, value: Arg) -> Arg {
    Arg {
        token: Some(token),
        optional: true,
        ..value
    }
}

/// A bare keyword such as `REPLACE`.
fn flag(token: &'static str) -> Arg {
    Arg {
        name: token,
        kind: raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        token: Some(token),
        optional: false,
        subargs: Vec::new(),
    }
}

/// `[a | b]`
fn one_of(name: &'static str, choices: Vec<Arg>) -> Arg {
    Arg {
        name,
        kind: raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        token: None,
        optional: true,
        subargs: choices,
    }
}

/// How a command touches its key.
#[derive(Clone, Copy)]
pub enum Access {
    Read,
    /// Adds and evicts (like XADD with MAXLEN).
    Update,
    /// Updates and replies with what it read (like INCR or SET ... GET):
    /// a write-only user (`%W~`) must not read through it. MEM.APPEND,
    /// MEM.APPENDBATCH and MEM.SUMMARIZE answer a retry with the stored
    /// original's id and tokens, and every reply with the session's totals;
    /// MEM.SUMMARIZE_BEGIN with MEM.SUMMARIZE_CHECK's map.
    ReadUpdate,
    Overwrite,
    /// No key (MEM.COUNT, MEM.MODELS): no key spec.
    Keyless,
}

impl Access {
    fn flags(self) -> u64 {
        u64::from(match self {
            Access::Keyless => 0,
            Access::Read => raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
            Access::Update => raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
            Access::ReadUpdate => {
                raw::REDISMODULE_CMD_KEY_RW
                    | raw::REDISMODULE_CMD_KEY_ACCESS
                    | raw::REDISMODULE_CMD_KEY_UPDATE
            }
            Access::Overwrite => raw::REDISMODULE_CMD_KEY_OW | raw::REDISMODULE_CMD_KEY_UPDATE,
        })
    }
}

pub struct Doc {
    pub name: &'static str,
    pub summary: &'static str,
    pub complexity: &'static str,
    pub arity: i32,
    pub access: Access,
    pub args: Vec<Arg>,
}

/// The documentation of every MEM.* command.
pub fn all() -> Vec<Doc> {
    use Access::*;
    let format = one_of("format", vec![flag("RESP"), flag("JSON")]);
    let format = Arg {
        token: Some("FORMAT"),
        ..format
    };
    vec![
        Doc {
            name: "mem.append",
            summary: "Appends a message to a session, counts its tokens, trims to the caps, refreshes the TTL and reports whether to summarize.",
            complexity: "O(N) in the size of the content (tokenizing), plus O(M) for M evicted messages.",
            arity: -4,
            access: ReadUpdate,
            args: vec![
                key(),
                string("role"),
                string("content"),
                option("TS", arg("ms", raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME)),
                option("META", string("json")),
                option("MODEL", string("name")),
                option("TTL", integer("seconds")),
                option("MAXTOKENS", integer("n")),
                option("MAXMSGS", integer("n")),
                option("MAXAGE", integer("seconds")),
                option("MSGID", string("id")),
                option("TOKENS", integer("n")),
            ],
        },
        Doc {
            name: "mem.appendbatch",
            summary: "Appends several messages (a JSON array of {role, content, ts?, meta?, msgid?, tokens?}) in one atomic step, as consecutive MEM.APPENDs.",
            complexity: "O(N) in the size of the contents (tokenizing), plus O(M) for M evicted messages.",
            arity: -3,
            access: ReadUpdate,
            args: vec![
                key(),
                string("messages"),
                option("MODEL", string("name")),
                option("TTL", integer("seconds")),
                option("MAXTOKENS", integer("n")),
                option("MAXMSGS", integer("n")),
                option("MAXAGE", integer("seconds")),
            ],
        },
        Doc {
            name: "mem.get",
            summary: "Returns the session's summary and messages, oldest first, optionally the newest, those after an id, or those fitting a token budget.",
            complexity: "O(N) for N messages returned.",
            arity: -2,
            access: Read,
            args: vec![
                key(),
                option("LAST", integer("n")),
                option("AFTER", integer("id")),
                option("BUDGET", integer("tokens")),
                format,
            ],
        },
        Doc {
            name: "mem.summarize_check",
            summary: "Reports whether the session meets its summarization threshold and which messages a summary should cover.",
            complexity: "O(N) for N messages.",
            arity: -2,
            access: Read,
            args: vec![
                key(),
                one_of("window", vec![option("MODEL", string("name")), option("CONTEXT", integer("tokens"))]),
                option("KEEP", integer("n")),
            ],
        },
        Doc {
            name: "mem.summarize_begin",
            summary: "A summarizer's start: the MEM.SUMMARIZE_CHECK answer plus a time-limited lease, granted to one worker at a time when the session meets its threshold.",
            complexity: "O(N) for N messages.",
            arity: -3,
            // Its reply is MEM.SUMMARIZE_CHECK's map.
            access: ReadUpdate,
            args: vec![
                key(),
                integer("lease-ms"),
                one_of("window", vec![option("MODEL", string("name")), option("CONTEXT", integer("tokens"))]),
                option("KEEP", integer("n")),
            ],
        },
        Doc {
            name: "mem.summarize",
            summary: "Replaces the summary and every message up to an id with a new summary (refused while another worker's lease is live).",
            complexity: "O(N) in the size of the summary (tokenizing), plus O(M) for M replaced messages.",
            arity: -4,
            access: ReadUpdate,
            args: vec![key(), integer("upto"), string("summary"), option("LEASE", integer("token"))],
        },
        Doc {
            name: "mem.extset",
            summary: "Stores an external orchestrator's conversation id for the session, with its own expiry.",
            complexity: "O(log N) for N external ids.",
            arity: -4,
            access: Update,
            args: vec![key(), string("system"), string("conversation_id"), option("EX", integer("seconds"))],
        },
        Doc {
            name: "mem.extget",
            summary: "Returns an external orchestrator's conversation id, or nil when unknown or expired.",
            complexity: "O(log N) for N external ids.",
            arity: 3,
            access: Read,
            args: vec![key(), string("system")],
        },
        Doc {
            name: "mem.import",
            summary: "Creates a session from a JSON document (MEM.GET FORMAT JSON or the client-side user_memory shape).",
            complexity: "O(N) in the size of the document.",
            arity: -3,
            access: Overwrite,
            args: vec![
                key(),
                string("json"),
                Arg { optional: true, ..flag("REPLACE") },
                option("MODEL", string("name")),
                option("TTL", integer("seconds")),
                option("MAXTOKENS", integer("n")),
                option("MAXMSGS", integer("n")),
                option("MAXAGE", integer("seconds")),
            ],
        },
        Doc {
            name: "mem.info",
            summary: "Returns the session's counts, settings and ids, or nil when the key does not exist.",
            complexity: "O(1) (O(N) for N external ids).",
            arity: 2,
            access: Read,
            args: vec![key()],
        },
        Doc {
            name: "mem.attrset",
            summary: "Stores a JSON value under a name beside the history (user_profile, context, ...), returned at the top level of MEM.GET FORMAT JSON; creates the session and refreshes its TTL.",
            complexity: "O(N) in the size of the session's attributes.",
            arity: 4,
            access: Update,
            args: vec![key(), string("name"), string("json")],
        },
        Doc {
            name: "mem.attrget",
            summary: "Returns an attribute's JSON text (nil when absent), or without a name a map of every attribute.",
            complexity: "O(N) in the size of the session's attributes.",
            arity: -2,
            access: Read,
            args: vec![key(), Arg { optional: true, ..string("name") }],
        },
        Doc {
            name: "mem.attrdel",
            summary: "Removes an attribute; returns 1 when it was set, else 0.",
            complexity: "O(N) in the size of the session's attributes.",
            arity: 3,
            access: Update,
            args: vec![key(), string("name")],
        },
        Doc {
            name: "mem.count",
            summary: "Returns the tokens of a text under the model's encoding (with ROLE, of a message as MEM.APPEND counts it: 3 + role + text).",
            complexity: "O(N) in the size of the text.",
            arity: -3,
            access: Keyless,
            args: vec![string("model"), string("text"), option("ROLE", string("role"))],
        },
        Doc {
            name: "mem.models",
            summary: "Lists the model table in effect (mem.models entries first, then the built-in ones), or what one model resolves to: encoding, whether exact, context window.",
            complexity: "O(N) for N entries.",
            arity: -1,
            access: Keyless,
            args: vec![Arg { optional: true, ..string("model") }],
        },
        Doc {
            name: "mem._apply",
            summary: "Internal: applies one write as decided by the master (replication and AOF).",
            complexity: "O(N) in the size of the payload.",
            arity: -3,
            access: Update,
            args: vec![key(), string("payload"), Arg { optional: true, ..string("content") }],
        },
        Doc {
            name: "mem._put",
            summary: "Internal: stores a whole serialized session (AOF rewrite, replication of imports).",
            complexity: "O(N) in the size of the payload.",
            arity: 3,
            access: Overwrite,
            args: vec![key(), string("payload")],
        },
    ]
}

/// Strings handed to Redis live for the whole process (set once at load).
fn leak(s: &str) -> *const c_char {
    CString::new(s).map_or(std::ptr::null(), |c| c.into_raw().cast_const())
}

fn leak_opt(s: Option<&str>) -> *const c_char {
    s.map_or(std::ptr::null(), leak)
}

/// A null-terminated array of raw args, leaked (Redis keeps pointers into it).
fn raw_args(args: &[Arg]) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| raw::RedisModuleCommandArg {
            name: leak(a.name),
            type_: a.kind,
            key_spec_index: if a.kind == raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY {
                0
            } else {
                -1
            },
            token: leak_opt(a.token),
            summary: std::ptr::null(),
            since: std::ptr::null(),
            flags: if a.optional {
                raw::REDISMODULE_CMD_ARG_OPTIONAL as i32
            } else {
                0
            },
            deprecated_since: std::ptr::null(),
            subargs: if a.subargs.is_empty() {
                std::ptr::null_mut()
            } else {
                raw_args(&a.subargs)
            },
            display_text: std::ptr::null(),
        })
        .collect();
    // SAFETY: an all-zero RedisModuleCommandArg (null pointers, zero ints)
    // is the terminator Redis expects.
    out.push(unsafe { std::mem::zeroed() });
    Box::leak(out.into_boxed_slice()).as_mut_ptr()
}

/// One key spec: the key at argument 1, with `access` flags; null-terminated.
fn raw_key_specs(access: Access) -> *mut raw::RedisModuleCommandKeySpec {
    if matches!(access, Access::Keyless) {
        // SAFETY: the all-zero terminator alone: no key specs.
        let specs = vec![unsafe { std::mem::zeroed::<raw::RedisModuleCommandKeySpec>() }];
        return Box::leak(specs.into_boxed_slice()).as_mut_ptr();
    }
    // SAFETY: zeroed is the documented terminator and a valid base value for
    // this plain C struct of integers, pointers and unions of those.
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = access.flags();
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    spec.fk.range.lastkey = 0;
    spec.fk.range.keystep = 1;
    spec.fk.range.limit = 0;
    // SAFETY: as above, the all-zero terminator.
    let specs = vec![spec, unsafe { std::mem::zeroed() }];
    Box::leak(specs.into_boxed_slice()).as_mut_ptr()
}

static VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// Declares the docs and key specs of every command; logs what fails.
pub fn register(ctx: &Context) {
    // SAFETY: the function pointers are filled in by RedisModule_Init.
    let (Some(get_command), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        ctx.log_warning("redis-mem: this Redis has no command info API; COMMAND DOCS stays empty");
        return;
    };
    for doc in all() {
        let info = raw::RedisModuleCommandInfo {
            version: &VERSION,
            summary: leak(doc.summary),
            complexity: leak(doc.complexity),
            since: leak("0.1.0"),
            history: std::ptr::null_mut(),
            tips: std::ptr::null(),
            arity: doc.arity,
            key_specs: raw_key_specs(doc.access),
            args: raw_args(&doc.args),
        };
        let name = leak(doc.name);
        // SAFETY: ctx is the module's load context; name and info point to
        // leaked, null-terminated data valid for the life of the process.
        let ok = unsafe {
            let command = get_command(ctx.ctx, name);
            !command.is_null() && set_info(command, &info) == raw::REDISMODULE_OK as i32
        };
        if !ok {
            ctx.log_warning(&format!(
                "redis-mem: could not set the command info of {}",
                doc.name
            ));
        }
    }
}
