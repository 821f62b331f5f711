//! What a command declaration holds, and how one becomes a Redis command:
//! `RedisModule_CreateCommand` (name, entry point, flags, first/last/step
//! key), its ACL category, and `RedisModule_SetCommandInfo` (Redis 7.0+:
//! `COMMAND DOCS`, redis-cli's argument hints, key specs with the read/write
//! flags of ACL patterns `%R~` / `%W~` and cluster routing). Each command
//! is declared once, beside its handler in `commands/` (`commands/table.rs`
//! lists them), and each parser takes its options from its command's
//! `args`, so the registration, the docs and the parsing cannot drift apart.

use std::ffi::{c_char, c_int, CString};

use redis_module::{raw, Context, RedisResult, RedisString, Status};

type ArgType = raw::RedisModuleCommandArgType;

/// One argument of a command: documented, and (when it has a `token`) an
/// option its parser takes.
#[derive(Clone, Copy)]
pub struct Arg {
    name: &'static str,
    kind: ArgType,
    token: Option<&'static str>,
    optional: bool,
    subargs: &'static [Arg],
}

pub const fn arg(name: &'static str, kind: ArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        subargs: &[],
    }
}

pub const fn string(name: &'static str) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
    )
}

pub const fn integer(name: &'static str) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
    )
}

pub const fn unix_time(name: &'static str) -> Arg {
    arg(
        name,
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME,
    )
}

pub const fn key() -> Arg {
    arg(
        "key",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY,
    )
}

impl Arg {
    pub fn token(&self) -> Option<&'static str> {
        self.token
    }

    pub fn subargs(&self) -> &'static [Arg] {
        self.subargs
    }
}

/// `[arg]`
pub const fn optional(arg: Arg) -> Arg {
    Arg {
        optional: true,
        ..arg
    }
}

/// `[TOKEN value]`
pub const fn option(token: &'static str, value: Arg) -> Arg {
    Arg {
        token: Some(token),
        optional: true,
        ..value
    }
}

/// A bare keyword such as `REPLACE`.
pub const fn flag(token: &'static str) -> Arg {
    Arg {
        name: token,
        kind: raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
        token: Some(token),
        optional: false,
        subargs: &[],
    }
}

/// `[a | b]`
pub const fn one_of(name: &'static str, choices: &'static [Arg]) -> Arg {
    Arg {
        name,
        kind: raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF,
        token: None,
        optional: true,
        subargs: choices,
    }
}

/// `[TOKEN a | b]`: one option whose value is one of `choices`.
pub const fn option_of(token: &'static str, name: &'static str, choices: &'static [Arg]) -> Arg {
    Arg {
        token: Some(token),
        ..one_of(name, choices)
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
    /// Removes from the key (like HDEL): MEM.ATTRDEL.
    Delete,
    /// No key (MEM.COUNT, MEM.MODELS): no key spec, and first/last/step key
    /// 0, so any node of a cluster answers them.
    Keyless,
}

impl Access {
    fn key_spec_flags(self) -> u64 {
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
            Access::Delete => raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_DELETE,
        })
    }

    /// CreateCommand's first, last and step key: the key at argument 1.
    fn key_range(self) -> c_int {
        match self {
            Access::Keyless => 0,
            _ => 1,
        }
    }
}

/// The entry point Redis calls: made by [`entry!`] around a command body.
pub type Entry = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    *mut *mut raw::RedisModuleString,
    c_int,
) -> c_int;

/// A command body: the parsed call to a reply.
pub type Body = fn(&Context, Vec<RedisString>) -> RedisResult;

/// An extern "C" entry point for `body` (CreateCommand passes no data to
/// tell commands apart, so each gets a function of its own).
macro_rules! entry {
    ($body:path) => {{
        /// SAFETY: called by Redis with a command's context and arguments.
        unsafe extern "C" fn entry(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::ffi::c_int,
        ) -> std::ffi::c_int {
            // SAFETY: Redis's own context and argv/argc of this call.
            unsafe { $crate::declare::call(ctx, argv, argc, $body) }
        }
        entry as $crate::declare::Entry
    }};
}
pub(crate) use entry;

/// What the crate's `redis_command!` entry did, the body run under
/// the guard: a panic becomes an error reply instead of a dead server.
///
/// # Safety
/// `ctx`, `argv` and `argc` are those Redis passed to the entry point.
pub unsafe fn call(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    body: Body,
) -> c_int {
    let context = Context::new(ctx);
    let args = redis_module::decode_args(ctx, argv, argc);
    let response = crate::guard::or_else(|| Err(crate::error::internal()), || body(&context, args))
        .map_err(crate::error::ascii);
    crate::offload::pool::free_dropped();
    context.reply(response) as c_int
}

/// One command, declared once.
pub struct CommandDecl {
    pub name: &'static str,
    pub entry: Entry,
    /// CreateCommand's flags (`write deny-oom`, `readonly fast`, ...).
    pub flags: &'static str,
    /// The module's ACL category, or "" (the internal commands have none).
    pub acl: &'static str,
    pub summary: &'static str,
    pub complexity: &'static str,
    pub arity: i32,
    pub access: Access,
    pub args: &'static [Arg],
}

impl CommandDecl {
    /// The option taking `given` (upper-cased): its token, and whether a
    /// value follows it. Positional arguments have no token; a token-less
    /// `one_of` holds options of its own.
    /// The option named `given` (any case) and whether it takes a value.
    pub fn option(&self, given: &[u8]) -> Option<(&'static str, bool)> {
        fn find(args: &'static [Arg], given: &[u8]) -> Option<(&'static str, bool)> {
            args.iter().find_map(|a| match a.token {
                Some(token) if token.as_bytes().eq_ignore_ascii_case(given) => Some((
                    token,
                    a.kind != raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN,
                )),
                Some(_) => None,
                None => find(a.subargs, given),
            })
        }
        find(self.args, given)
    }
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
                raw_args(a.subargs)
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
    spec.flags = access.key_spec_flags();
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

/// Creates every command of `decls`, with its ACL category and command
/// info. A command that cannot be created refuses the load; a category or
/// info Redis refuses is logged and the command kept (as the crate did).
pub fn register(ctx: &Context, decls: &[&CommandDecl]) -> Status {
    // SAFETY: reading a function pointer RedisModule_Init filled in.
    let set_info = unsafe { raw::RedisModule_SetCommandInfo };
    if set_info.is_none() {
        ctx.log_warning("redis-mem: this Redis has no command info API; COMMAND DOCS stays empty");
    }
    for decl in decls {
        let Some(command) = create(ctx, decl) else {
            ctx.log_notice(&format!("Error: failed to create command {}", decl.name));
            return Status::Err;
        };
        set_acl_category(ctx, command, decl);
        if let Some(set_info) = set_info {
            set_command_info(ctx, set_info, command, decl);
        }
    }
    Status::Ok
}

type SetInfo =
    unsafe extern "C" fn(*mut raw::RedisModuleCommand, *const raw::RedisModuleCommandInfo) -> c_int;

/// CreateCommand, then the command's handle (null when either fails).
fn create(ctx: &Context, decl: &CommandDecl) -> Option<*mut raw::RedisModuleCommand> {
    let name = CString::new(decl.name).ok()?;
    let flags = CString::new(decl.flags).ok()?;
    let keys = decl.access.key_range();
    // SAFETY: the module's load context; name and flags are NUL-terminated
    // and Redis copies them; entry is an extern "C" fn of the right shape.
    // RedisModule_CreateCommand and RedisModule_GetCommand exist since 7.0.
    let command = unsafe {
        let created = raw::RedisModule_CreateCommand.unwrap()(
            ctx.ctx,
            name.as_ptr(),
            Some(decl.entry),
            flags.as_ptr(),
            keys,
            keys,
            keys,
        );
        if created != raw::Status::Ok as c_int {
            return None;
        }
        raw::RedisModule_GetCommand.unwrap()(ctx.ctx, name.as_ptr())
    };
    (!command.is_null()).then_some(command)
}

/// The command's ACL categories where the server has
/// RedisModule_SetCommandACLCategories (Redis 7.2+; none on 7.0): the
/// standard ones its flags imply, as Redis gives its own commands (`@write`
/// or `@read`, `@fast` or `@slow`: a user `+@all -@write` cannot change a
/// session, a `+@read` one can read it), and the module's `@mem` (`ACL
/// SETUSER app +@mem`) where the server could add it (Redis 7.4+, Valkey 8).
fn set_acl_category(ctx: &Context, command: *mut raw::RedisModuleCommand, decl: &CommandDecl) {
    // SAFETY: reading a function pointer RedisModule_Init filled in.
    let Some(set_categories) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return;
    };
    if decl.acl.is_empty() {
        return;
    }
    let standard = implied_categories(decl.flags);
    // The categories replace each other: all at once, then (a server
    // without the module's category refuses the whole list) the standard
    // ones alone.
    for categories in [format!("{standard} {}", decl.acl), standard.to_owned()] {
        let Ok(list) = CString::new(categories) else {
            return;
        };
        // SAFETY: a command of this module, created above; list is NUL-terminated.
        if unsafe { set_categories(command, list.as_ptr()) } == raw::Status::Ok as c_int {
            return;
        }
    }
    ctx.log_notice(&format!(
        "Warning: failed to set command `{}` ACL categories `{standard}`",
        decl.name
    ));
}

/// The standard ACL categories Redis derives from a command's flags.
fn implied_categories(flags: &str) -> &'static str {
    let has = |f: &str| flags.split(' ').any(|x| x == f);
    match (has("write"), has("fast")) {
        (true, true) => "write fast",
        (true, false) => "write slow",
        (false, true) => "read fast",
        (false, false) => "read slow",
    }
}

/// The command's docs and key specs; logs when Redis refuses them.
fn set_command_info(
    ctx: &Context,
    set_info: SetInfo,
    command: *mut raw::RedisModuleCommand,
    decl: &CommandDecl,
) {
    let info = raw::RedisModuleCommandInfo {
        version: &VERSION,
        summary: leak(decl.summary),
        complexity: leak(decl.complexity),
        since: leak("0.1.0"),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: decl.arity,
        key_specs: raw_key_specs(decl.access),
        args: raw_args(decl.args),
    };
    // SAFETY: a command of this module; info points to leaked,
    // null-terminated data valid for the life of the process.
    if unsafe { set_info(command, &info) } != raw::REDISMODULE_OK as i32 {
        ctx.log_warning(&format!(
            "redis-mem: could not set the command info of {}",
            decl.name
        ));
    }
}
