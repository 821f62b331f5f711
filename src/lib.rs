//! redis-mem: conversation memory for LLM agents, kept inside Redis.
//!
//! - `session`: the pure core (messages, totals, trimming, summarize rules)
//! - `tokenizer`: exact tiktoken counts and model tables
//! - `commands`: argument parsing and replies of the MEM.* commands;
//!   each declared once beside its handler (registration, docs, options),
//!   listed in `commands/table.rs`
//! - `declare`: how a declaration becomes a Redis command
//! - `persistence` / `data_type`: the versioned payload and Redis callbacks
//! - `key`, `config`, `stats`, `info`, `guard`: Redis glue

pub mod alloc_meter;
pub mod commands;
pub mod config;
pub mod data_type;
pub mod declare;
pub mod error;
pub mod guard;
pub mod info;
pub mod json_format;
pub mod key;
pub mod leb128;
pub mod module_memory;
pub mod offload;
pub mod persistence;
pub mod session;
pub mod stats;
pub mod tokenizer;
pub mod utf8;

use redis_module::configuration::ConfigurationFlags;
// AclCategory: named by the redis_module! expansion of `acl_categories`.
use redis_module::{redis_module, AclCategory, Context, RedisString, Status};

use crate::data_type::SESSION_TYPE;

/// Every Redis API function the module calls through `raw` (all exist since
/// Redis 7.0). Checked once at load, so the `.unwrap()` on these function
/// pointers at call sites cannot fire.
fn required_api_present() -> bool {
    use redis_module::raw::*;
    // Copies the pointer out (no reference to the `static mut`).
    macro_rules! present {
        ($f:ident) => {{
            let f = $f;
            f.is_some()
        }};
    }
    // SAFETY: reading the function pointers RedisModule_Init filled in; no
    // other thread runs module code during OnLoad.
    unsafe {
        [
            present!(RedisModule_CreateCommand),
            present!(RedisModule_GetCommand),
            present!(RedisModule_OpenKey),
            present!(RedisModule_CloseKey),
            present!(RedisModule_KeyType),
            present!(RedisModule_ModuleTypeGetType),
            present!(RedisModule_ModuleTypeGetValue),
            present!(RedisModule_ModuleTypeSetValue),
            present!(RedisModule_ModuleTypeReplaceValue),
            present!(RedisModule_SetExpire),
            present!(RedisModule_GetExpire),
            present!(RedisModule_LoadStringBuffer),
            present!(RedisModule_Free),
            present!(RedisModule_EmitAOF),
            present!(RedisModule_DigestAddStringBuffer),
            present!(RedisModule_DigestEndSequence),
            present!(RedisModule_Milliseconds),
            present!(RedisModule_BlockClient),
            present!(RedisModule_UnblockClient),
            present!(RedisModule_GetBlockedClientPrivateData),
            present!(RedisModule_RetainString),
            present!(RedisModule_FreeString),
            present!(RedisModule_SetModuleOptions),
            present!(RedisModule_EventLoopAddOneShot),
            present!(RedisModule_SubscribeToServerEvent),
            present!(RedisModule_AvoidReplicaTraffic),
            present!(RedisModule_Call),
            present!(RedisModule_Replicate),
            present!(RedisModule_NotifyKeyspaceEvent),
            present!(RedisModule_GetContextFlags),
            present!(RedisModule_SignalModifiedKey),
            present!(RedisModule_StringAppendBuffer),
            present!(RedisModule_GetCurrentUserName),
            present!(RedisModule_GetModuleUserFromUserName),
            present!(RedisModule_ACLCheckCommandPermissions),
            present!(RedisModule_ACLCheckKeyPermissions),
            present!(RedisModule_FreeModuleUser),
            present!(RedisModule_GetThreadSafeContext),
            present!(RedisModule_FreeThreadSafeContext),
        ]
        .into_iter()
        .all(|present| present)
    }
}

/// Module load: the crate's RedisModule_OnLoad calls this with no
/// catch_unwind of its own, so the body runs under [`guard::or`] (a panic
/// refuses the load instead of aborting the server).
fn init(ctx: &Context, args: &[RedisString]) -> Status {
    guard::install_panic_hook();
    guard::or(Status::Err, || init_guarded(ctx, args))
}

fn init_guarded(ctx: &Context, args: &[RedisString]) -> Status {
    if !required_api_present() {
        ctx.log_warning("redis-mem: this Redis lacks module API functions redis-mem needs (Redis 7.0+ required)");
        return Status::Err;
    }
    if register_configs(ctx, args) == Status::Err {
        return Status::Err;
    }
    // SAFETY: HANDLE_IO_ERRORS makes failed RDB reads report an error to
    // rdb_load (which checks it) instead of aborting the server.
    // NO_IMPLICIT_SIGNAL_MODIFIED: a key opened for writing is not marked
    // modified when the command then refuses (WATCH and client-side caching
    // stay valid); writes signal it themselves (commands::signal_modified).
    // HANDLE_REPL_ASYNC_LOAD: without it a replica silently turns off
    // `repl-diskless-load swapdb`/`on-empty-db` async loading. Sessions are
    // self-contained values; the module's global state is counters (INFO's
    // `sessions` counts both datasets while they coexist, then the freed
    // one leaves it) and encodings, which the two datasets share.
    unsafe {
        redis_module::raw::RedisModule_SetModuleOptions.unwrap()(
            ctx.ctx,
            (redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
                | redis_module::raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD
                | redis_module::raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED)
                as i32,
        );
    }
    // Encodings are built the first time a command needs one, on the worker
    // pool (tokenizer/load.rs). The default model's is started now, off the
    // main thread, so the usual first command (and MULTI/EXEC, which cannot
    // wait for a build) finds it ready.
    let default = config::Config::current();
    let encoding = tokenizer::encoding_for_model(&default.default_model, default.default_encoding);
    let started = std::thread::Builder::new()
        .name("mem-load".into())
        .spawn(move || {
            guard::or((), || {
                let _ = tokenizer::load(encoding);
            })
        });
    if started.is_err() {
        ctx.log_warning(
            "redis-mem: could not start building the default encoding; the first command will",
        );
    }
    if !offload::register(ctx) {
        ctx.log_warning("redis-mem: cannot subscribe to the event loop");
        return Status::Err;
    }
    info::register(ctx);
    declare::register(ctx, &commands::table::ALL)
}

/// The `mem.*` configs, their defaults taken from the module's arguments
/// (`loadmodule redis-mem.so ttl 3600 default-model gpt-4`), then Redis's
/// own values (redis.conf `mem.*`, MODULE LOADEX CONFIG) applied over them
/// by LoadConfigs: what the crate's `configurations:` block with
/// `module_args_as_configuration` did, but that block runs in the crate's
/// RedisModule_OnLoad, outside any guard, and a NUL in a string or enum
/// argument made it panic there (a CString of the default, of the logged
/// error), aborting the server instead of refusing the load.
/// The module arguments as `(name, value)` pairs, each name one of `known`
/// and given once, no value holding a NUL; else the name at fault and why.
fn module_args(
    args: &[RedisString],
    known: &[&str],
) -> Result<Vec<(String, String)>, (String, String)> {
    if !args.len().is_multiple_of(2) {
        let last = args.last().map(|a| a.to_string_lossy()).unwrap_or_default();
        return Err((
            last,
            "module arguments come in `name value` pairs".to_owned(),
        ));
    }
    let mut out: Vec<(String, String)> = Vec::with_capacity(args.len() / 2);
    for pair in args.chunks(2) {
        let name = pair[0].to_string_lossy();
        let value = pair[1].to_string_lossy();
        if !known.contains(&name.as_str()) {
            return Err((name, format!("unknown (one of {})", known.join(", "))));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err((name, "given twice".to_owned()));
        }
        if value.contains('\0') {
            return Err((name, "must not hold a NUL".to_owned()));
        }
        out.push((name, value));
    }
    Ok(out)
}

/// Redis's integer syntax (string2ll): an optional `-`, digits, no leading
/// zero but in `0` itself, no `+`, no spaces.
fn redis_integer(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let canonical = digits == "0" || (!digits.is_empty() && !digits.starts_with('0'));
    if !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) || text == "-0" {
        return None;
    }
    text.parse().ok()
}

/// A numeric `mem.*` setting: name, variable, default, min, max, flags.
type Numeric = (
    &'static str,
    &'static std::sync::atomic::AtomicI64,
    i64,
    i64,
    i64,
    ConfigurationFlags,
);

/// The numeric `mem.*` settings (a data table: one row a setting).
fn numeric_configs() -> [Numeric; 15] {
    let secs = session::MAX_TTL_SECS as i64;
    // Not Copy: consts, made anew at each use.
    const DEFAULT: ConfigurationFlags = ConfigurationFlags::DEFAULT;
    const MEMORY: ConfigurationFlags = ConfigurationFlags::MEMORY;
    [
        ("ttl", &config::TTL, config::default::TTL, 0, secs, DEFAULT),
        (
            "ext-ttl",
            &config::EXT_TTL,
            config::default::EXT_TTL,
            1,
            secs,
            DEFAULT,
        ),
        (
            "max-tokens",
            &config::MAX_TOKENS,
            config::default::MAX_TOKENS,
            1,
            i64::MAX,
            DEFAULT,
        ),
        (
            "max-messages",
            &config::MAX_MESSAGES,
            config::default::MAX_MESSAGES,
            1,
            i64::MAX,
            DEFAULT,
        ),
        (
            "max-tokens-limit",
            &config::MAX_TOKENS_LIMIT,
            config::default::MAX_TOKENS_LIMIT,
            1,
            i64::MAX,
            DEFAULT,
        ),
        (
            "max-messages-limit",
            &config::MAX_MESSAGES_LIMIT,
            config::default::MAX_MESSAGES_LIMIT,
            1,
            i64::MAX,
            DEFAULT,
        ),
        (
            "max-age",
            &config::MAX_AGE,
            config::default::MAX_AGE,
            0,
            secs,
            DEFAULT,
        ),
        (
            "summarize-ratio",
            &config::SUMMARIZE_RATIO,
            config::default::SUMMARIZE_RATIO,
            1,
            100,
            DEFAULT,
        ),
        (
            "summarize-fallback-tokens",
            &config::SUMMARIZE_FALLBACK_TOKENS,
            config::default::SUMMARIZE_FALLBACK_TOKENS,
            1,
            i64::MAX,
            DEFAULT,
        ),
        (
            "summarize-keep",
            &config::SUMMARIZE_KEEP,
            config::default::SUMMARIZE_KEEP,
            0,
            i64::MAX,
            DEFAULT,
        ),
        (
            "summarize-headroom",
            &config::SUMMARIZE_HEADROOM,
            config::default::SUMMARIZE_HEADROOM,
            0,
            90,
            DEFAULT,
        ),
        (
            "max-message-bytes",
            &config::MAX_MESSAGE_BYTES,
            config::default::MAX_MESSAGE_BYTES,
            1,
            512 * 1024 * 1024,
            MEMORY,
        ),
        (
            "async-threshold-bytes",
            &config::ASYNC_THRESHOLD_BYTES,
            config::default::ASYNC_THRESHOLD_BYTES,
            1,
            i64::MAX,
            MEMORY,
        ),
        (
            "count-threads",
            &config::COUNT_THREADS,
            config::default::COUNT_THREADS,
            1,
            64,
            DEFAULT,
        ),
        (
            "debug-count-delay-ms",
            &config::DEBUG_COUNT_DELAY_MS,
            config::default::DEBUG_COUNT_DELAY_MS,
            0,
            60_000,
            DEFAULT,
        ),
    ]
}

fn refuse(name: &str, e: &dyn std::fmt::Display) -> Status {
    // guard::log_warning: the crate's logger panics on a NUL.
    guard::log_warning(&format!("redis-mem: module argument {name}: {e}"));
    Status::Err
}

fn register_configs(ctx: &Context, args: &[RedisString]) -> Status {
    let numeric = numeric_configs();
    // Every argument a `name value` pair naming one of the settings, once,
    // each value as CONFIG SET would take it: the crate's readers skip
    // unknown names and check no range (`count-threads 0` left every large
    // append waiting forever).
    let known: Vec<&str> = numeric
        .iter()
        .map(|n| n.0)
        .chain(["default-model", "models", "encodings", "default-encoding"])
        .collect();
    let given = match module_args(args, &known) {
        Ok(given) => given,
        Err((name, e)) => return refuse(&name, &e),
    };
    for setting in numeric {
        if register_numeric(ctx, setting, &given) == Status::Err {
            return Status::Err;
        }
    }
    if register_text_configs(ctx, args) == Status::Err {
        return Status::Err;
    }
    load_configs(ctx)
}

/// One numeric setting, its default the module argument's when given.
fn register_numeric(ctx: &Context, setting: Numeric, given: &[(String, String)]) -> Status {
    use redis_module::configuration::register_i64_configuration;
    type OnChanged = Box<
        dyn Fn(
            &redis_module::configuration::ConfigurationContext,
            &str,
            &'static std::sync::atomic::AtomicI64,
        ),
    >;
    let (name, variable, fallback, min, max, flags) = setting;
    let value = match given.iter().find(|(n, _)| n == name) {
        None => fallback,
        Some((_, text)) => match redis_integer(text) {
            Some(v) if (min..=max).contains(&v) => v,
            Some(_) => return refuse(name, &format!("{text} is outside {min}..={max}")),
            None => return refuse(name, &format!("{text:?} is not an integer")),
        },
    };
    let on_changed: Option<OnChanged> = match name {
        "count-threads" => Some(Box::new(|_, _, _| guard::or((), offload::pool::resize))),
        _ => None,
    };
    register_i64_configuration(ctx, name, variable, value, min, max, flags, on_changed);
    Status::Ok
}

/// The string and enum settings: default-model, models, encodings,
/// default-encoding.
fn register_text_configs(ctx: &Context, args: &[RedisString]) -> Status {
    use config::{DEFAULT_MODEL, DEFAULT_MODEL_CONFIG, ENCODINGS_CONFIG, MODELS_CONFIG};
    use redis_module::configuration::{get_enum_default_config_value, register_enum_configuration};
    // In this order, stopping at the first refused.
    let refused = register_string(
        ctx,
        args,
        "default-model",
        &DEFAULT_MODEL_CONFIG,
        DEFAULT_MODEL,
    ) == Status::Err
        || register_string(ctx, args, "models", &MODELS_CONFIG, "") == Status::Err
        || register_string(ctx, args, "encodings", &ENCODINGS_CONFIG, "all") == Status::Err;
    if refused {
        return Status::Err;
    }
    let encoding = match get_enum_default_config_value(
        args,
        "default-encoding",
        config::EncodingConfig::o200k_base,
    ) {
        Ok(v) => v,
        Err(e) => return refuse("default-encoding", &e),
    };
    register_enum_configuration(
        ctx,
        "default-encoding",
        &config::DEFAULT_ENCODING,
        encoding,
        ConfigurationFlags::DEFAULT,
        None,
    );
    Status::Ok
}

/// One string setting, its default the module argument's when given.
fn register_string<T: redis_module::configuration::ConfigurationValue<RedisString>>(
    ctx: &Context,
    args: &[RedisString],
    name: &str,
    variable: &'static T,
    fallback: &'static str,
) -> Status {
    use redis_module::configuration::{
        get_string_default_config_value, register_string_configuration,
    };
    // A string default goes through the crate's CString::new(..).unwrap().
    let default = match get_string_default_config_value(args, name, fallback) {
        Ok(v) if v.contains('\0') => return refuse(name, &"must not hold a NUL"),
        Ok(v) => v.to_owned(),
        Err(e) => return refuse(name, &e),
    };
    register_string_configuration(
        ctx,
        name,
        variable,
        &default,
        ConfigurationFlags::DEFAULT,
        None,
    );
    Status::Ok
}

/// Applies the defaults and redis.conf's `mem.*` lines through each
/// config's set: a value a set refuses (a default-model with a newline, a
/// bad mem.models line) refuses the load, as CONFIG SET would refuse it,
/// instead of leaving the setting at its default unsaid.
fn load_configs(ctx: &Context) -> Status {
    // SAFETY: the module's load context; every config is registered before.
    if let Some(load_configs) = unsafe { redis_module::raw::RedisModule_LoadConfigs } {
        if unsafe { load_configs(ctx.ctx) } != redis_module::raw::REDISMODULE_OK as i32 {
            guard::log_warning("redis-mem: a mem.* setting was refused (see above); not loaded");
            return Status::Err;
        }
    }
    config::SETTINGS_LOADED.store(true, std::sync::atomic::Ordering::Relaxed);
    Status::Ok
}

// Metered: an encoding's size is measured as it is built (alloc_meter.rs).
#[cfg(not(test))]
type Allocator = alloc_meter::Metered<redis_module::alloc::RedisAlloc>;
#[cfg(not(test))]
const ALLOCATOR: Allocator = alloc_meter::Metered(redis_module::alloc::RedisAlloc);
// Unit tests run without Redis, whose allocator does not exist there.
#[cfg(test)]
type Allocator = alloc_meter::Metered<std::alloc::System>;
#[cfg(test)]
const ALLOCATOR: Allocator = alloc_meter::Metered(std::alloc::System);

redis_module! {
    name: "mem",
    version: 1,
    allocator: (Allocator, ALLOCATOR),
    data_types: [SESSION_TYPE],
    // ACL category `mem` (`ACL SETUSER app +@mem`) where the server has
    // RedisModule_AddACLCategory (Redis 7.4+, Valkey 8); elsewhere the crate
    // logs a warning and the module loads without it.
    acl_categories: ["mem",],
    // The commands: created by init from their declarations
    // (commands/table.rs).
    init: init,
}
