//! MEM.COUNT and MEM.MODELS: keyless, read-only (any node of a cluster
//! answers them).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use super::args::{self, Options};
use super::reply::Reply;
use crate::config::Config;
use crate::declare::{entry, option, optional, string, Access::*, CommandDecl};
use crate::offload::{self, encoding_build, refuse_where_blocking_is_impossible};
use crate::tokenizer::{self, models, Counting, Encoding};

/// MEM.COUNT model text [ROLE role] [META json]: the tokens of `text` under
/// the model's encoding; with ROLE, those of a message (3 + role + text), as
/// MEM.APPEND counts it; with META, plus its tool calls as the model's prompt
/// renders them. Large texts, and any text whose encoding is not built yet,
/// are counted on the pool while the client waits.
pub fn count(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if args.len() < 3 {
        return Err(RedisError::WrongArity);
    }
    let model = args::utf8("model", &args[1])?;
    args::check_model(model)?;
    let opts = Options::parse(&args[3..], &COUNT)?;
    let role = opts.str("ROLE")?;
    if let Some(role) = role {
        args::check_role(role)?;
    }
    let cfg = Config::current();
    let raw = &args[2];
    args::check_size("text", raw.len(), cfg.max_message_bytes)?;
    let meta = opts.str("META")?;
    if let Some(meta) = meta {
        args::check_size("META", meta.len(), cfg.max_message_bytes)?;
    }
    let encoding = tokenizer::encoding_for_model(model, cfg.default_encoding);
    encoding_build::check_allowed(ctx, encoding)?;
    let counting = Counting::new(model, encoding);
    let len = raw.len() + meta.map_or(0, str::len);
    let limit = cfg.inline_limit(encoding);
    let large = len as u64 >= limit;
    if tokenizer::is_loaded(encoding) && !large {
        let text = args::utf8("text", raw)?;
        return tokens(counting, role, text, meta).map(|n| RedisValue::Integer(n as i64));
    }
    if tokenizer::state(encoding) == tokenizer::State::Failed {
        return Err(encoding_build::failed(encoding));
    }
    if encoding_build::cannot_wait(ctx) {
        if large {
            let what = if meta.is_some() {
                "text with META"
            } else {
                "text"
            };
            refuse_where_blocking_is_impossible(ctx, what, len, limit)?;
        }
        encoding_build::build_in_background(encoding);
        return Err(encoding_build::busy(encoding));
    }
    // Copied (at most mem.max-message-bytes each, a memcpy) so the worker
    // owns them, into the module's region, out of used_memory, as all the
    // worker allocates to check and count them (META's parse and its tool
    // calls' rendering: 4-8 bytes a byte of META, hostile pass 49): a keyless
    // read must not make Redis evict keys (module_memory.rs).
    let (bytes, role, meta) = crate::module_memory::for_module(|| {
        (
            raw.as_slice().to_vec(),
            role.map(str::to_owned),
            meta.map(str::to_owned),
        )
    });
    offload::reply_from_worker(ctx, move || {
        crate::module_memory::for_module(|| {
            let text = args::utf8_bytes("text", &bytes)?;
            tokens(counting, role.as_deref(), text, meta.as_deref())
                .map(|n| RedisValue::Integer(n as i64))
        })
    })
}

/// The count MEM.COUNT replies; META is checked as MEM.APPEND checks it.
fn tokens(
    counting: Counting,
    role: Option<&str>,
    text: &str,
    meta: Option<&str>,
) -> Result<u64, RedisError> {
    if let Some(meta) = meta {
        args::check_meta(meta)?;
    }
    Ok(match role {
        Some(role) => tokenizer::count_message(counting, role, text, meta),
        None => {
            let tools = meta.map_or(0, |m| {
                tokenizer::tool_calls::tool_call_tokens(counting.encoding, counting.tools, text, m)
            });
            tokenizer::count_text(counting.encoding, text) + tools
        }
    })
}

/// MEM.MODELS [model]: without a name, every entry of the model table in
/// effect (the operator's `mem.models` first, then the built-in ones); with
/// one, what that model resolves to.
pub fn models(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let reply = Reply::new(ctx);
    match args.len() {
        1 => {
            let all = models::effective();
            reply.array(all.len());
            for (entry, mine) in all {
                reply
                    .map(4)
                    .field_str("name", &entry.pattern())
                    .field_str("encoding", entry.encoding.map_or("default", Encoding::name))
                    .field_int("context_window", entry.window.unwrap_or(0))
                    .field_str("source", if mine { "config" } else { "builtin" });
            }
        }
        2 => {
            let model = args::utf8("model", &args[1])?;
            args::check_model(model)?;
            let cfg = Config::current();
            let r = models::resolve(model);
            let encoding = r.encoding.unwrap_or(cfg.default_encoding);
            reply
                .map(6)
                .field_str("model", model)
                .field_str("encoding", encoding.name())
                // 1: the vendor's own tokenizer; 0: mem.default-encoding
                // stands in (no public tokenizer, or an unknown model).
                .field_int("exact", u64::from(r.encoding.is_some()))
                .field_int("context_window", r.window.unwrap_or(0));
            match &r.entry {
                Some((pattern, mine)) => {
                    reply
                        .field_str("entry", pattern)
                        .field_str("source", if *mine { "config" } else { "builtin" });
                }
                None => {
                    reply.bulk("entry");
                    redis_module::raw::reply_with_null(ctx.ctx);
                    reply.field_str("source", "none");
                }
            }
        }
        _ => return Err(RedisError::WrongArity),
    }
    Ok(RedisValue::NoReply)
}

pub static COUNT: CommandDecl = CommandDecl {
    name: "mem.count",
    entry: entry!(count),
    flags: "readonly",
    acl: "mem",
    summary: "Returns the tokens of a text under the model's encoding (with ROLE, of a message as MEM.APPEND counts it: 3 + role + text; with META, plus the tool calls it carries).",
    complexity: "O(N) in the size of the text.",
    arity: -3,
    access: Keyless,
    args: &[
        string("model"),
        string("text"),
        option("ROLE", string("role")),
        option("META", string("json")),
    ],
};
pub static MODELS: CommandDecl = CommandDecl {
    name: "mem.models",
    entry: entry!(models),
    flags: "readonly",
    acl: "mem",
    summary: "Lists the model table in effect (mem.models entries first, then the built-in ones), or what one model resolves to: encoding, whether exact, context window.",
    complexity: "O(N) for N entries.",
    arity: -1,
    access: Keyless,
    args: &[optional(string("model"))],
};
