//! MEM.IMPORT: a session from a JSON document, for migrating client-side
//! `user_memory_*` keys in one pass.
//!
//! A document of `mem.async-threshold-bytes` or more is parsed, counted and
//! built into its session on the worker pool while the client waits (like a
//! large MEM.APPEND); the command then runs again on the main thread with
//! the session in hand, re-checks what may have changed meanwhile (the key
//! may exist now), and stores it. Smaller documents take the same path
//! inline.

use std::cell::Cell;

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString};

use super::args::{self, Options};
use super::SETTINGS_OPTIONS;
use super::{
    finish_write, now_ms, reply_outcome, session_thresholds, Events, Propagate, SettingsOptions,
    Write,
};
use crate::config::{Config, ENCODINGS_CONFIG};
use crate::declare::{entry, flag, key, optional, string, Access::*, CommandDecl};
use crate::error;
use crate::json_format::{self, ImportError, Imported};
use crate::key::SessionKey;
use crate::offload::{self, can_block, encoding_build, refuse_where_blocking_is_impossible, Pass};
use crate::persistence;
use crate::tokenizer::count_message;
use crate::tokenizer::{self, Encoding};

/// MEM.IMPORT key json [REPLACE] [MODEL name] [TTL seconds] [MAXTOKENS n] [MAXMSGS n] [MAXAGE seconds]
pub fn import(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    import_built(ctx, args, Pass::Fresh)
}

/// What a worker made of a large document: the session with its encoding
/// (what replicas and the AOF receive), or the error the command replies.
struct Built {
    result: Result<(Imported, Payload), RedisError>,
    /// The configuration the worker checked the document against, and
    /// `mem.encodings` then: the resumed command refuses the session if
    /// either changed meanwhile (a fresh import would be checked anew).
    cfg: Config,
    encodings: i64,
}

/// The encoded session as a Redis string, made where the session was built.
struct Payload(RedisString);

// SAFETY: the string is created without a context (RedisModule_CreateString
// with a NULL ctx only allocates through Redis's thread-safe allocator and
// copies), and nothing else refers to it until the main thread, after the
// hand-back, passes it to replication; dropping it before then (a refcount
// decrement to zero, a free) is safe on any thread.
unsafe impl Send for Payload {}

/// What building the session needs, decided on the main thread: the
/// options and config as the command found them, and its clock. The
/// document's own model is known only once parsed, so the worker applies
/// the rule itself (`SettingsOptions::default_model`, then `merge`).
#[derive(Clone)]
struct Plan {
    changes: SettingsOptions<'static>,
    cfg: Config,
    /// When the command arrived: the time of messages that carry none.
    now: i64,
    /// Whether `mem.encodings` applies (not to the replication stream or
    /// AOF loading, which apply what the master did).
    restricted: bool,
}

impl Plan {
    /// Builds the session. On the main thread (`unbuilt` given), an encoding
    /// not built yet stops it there: `unbuilt` then names it.
    fn build(
        self,
        bytes: &[u8],
        unbuilt: Option<&Cell<Option<Encoding>>>,
    ) -> Result<(Imported, Payload), RedisError> {
        let text = args::utf8_bytes("json", bytes)?;
        let Plan {
            mut changes,
            cfg,
            now,
            restricted,
        } = self;
        let max = cfg.max_message_bytes;
        let limits = json_format::Limits {
            message_bytes: max,
            given_tokens: cfg.max_tokens_limit,
        };
        let settings = |doc: json_format::DocSettings<'_>| {
            // The document's model and settings unless an option names
            // others; a new session's settings otherwise.
            changes.default_to_document(&doc, &cfg)?;
            let settings = changes.merge(None, &cfg);
            // Checked here, where the document's model is known: built or
            // not, an encoding mem.encodings leaves out is refused.
            if restricted && !crate::config::ENCODINGS_CONFIG.allows(settings.encoding) {
                return Err(encoding_build::not_allowed(settings.encoding));
            }
            if let Some(cell) = unbuilt.filter(|_| !tokenizer::is_loaded(settings.encoding)) {
                cell.set(Some(settings.encoding));
                return Err(crate::error::invalid("the encoding is not built yet"));
            }
            Ok(settings)
        };
        let imported = json_format::import(text, now, limits, settings, count_message).map_err(
            |e| match e {
                ImportError::Invalid(e) => crate::error::invalid(format!("invalid document: {e}")),
                ImportError::TooLarge(len) => args::too_large("content", len, max),
                ImportError::Settings(e) => e,
            },
        )?;
        // Encoded and copied into a string here, on the worker for a large
        // document: the kept session can be as large as the document.
        let encoded = persistence::encode_session(&imported.session);
        let payload = RedisString::create_from_slice(std::ptr::null_mut(), &encoded);
        Ok((imported, Payload(payload)))
    }
}

/// MEM.IMPORT, run again with the session a worker built. Resumed without
/// one, the worker panicked (and logged why): an error, not a second try
/// of the whole document on the main thread.
fn import_built(ctx: &Context, args: Vec<RedisString>, pass: Pass<Built>) -> RedisResult {
    super::arity(&args, 3)?;
    let keyname = &args[1];
    let document = &args[2];
    let opts = Options::parse(&args[3..], &IMPORT)?;
    let cfg = Config::current();
    let changes = SettingsOptions::parse(&opts, &cfg)?;

    // Checked again when resumed: another client may have written the key
    // while the worker built the session.
    let mut key = SessionKey::open(ctx, keyname, true)?;
    if !key.is_empty() && !opts.has("REPLACE") {
        return Err(crate::error::Error::BusyKey.into());
    }
    let now = now_ms();
    let built = match pass {
        Pass::Resumed(Some(built)) => {
            if built.cfg != cfg || built.encodings != ENCODINGS_CONFIG.bits() {
                return Err(error::try_again(
                    "the configuration changed while the document was imported \
                     (its limits apply to it); send it again",
                ));
            }
            built.result
        }
        Pass::Resumed(None) => return Err(error::internal()),
        Pass::Fresh => {
            let restricted = !ctx
                .get_flags()
                .intersects(ContextFlags::REPLICATED | ContextFlags::LOADING);
            let plan = Plan {
                changes: changes.into_owned(),
                cfg: cfg.clone(),
                now,
                restricted,
            };
            match plan.build_here(ctx, document)? {
                Build::Here(built) => built,
                Build::OnWorker(work) => {
                    drop(key);
                    let (cfg, encodings) = (work.cfg.clone(), ENCODINGS_CONFIG.bits());
                    return offload::run(ctx, args, 1, 2, import_built, move |bytes| Built {
                        result: work.build(bytes, None),
                        cfg,
                        encodings,
                    });
                }
            }
        }
    };
    store(ctx, keyname, &mut key, built?, now, &cfg)
}

/// A fresh import's session: built on the main thread, or to be built by
/// a worker.
// Both live a moment on the stack of one command: boxing either only adds
// an allocation.
#[allow(clippy::large_enum_variant)]
enum Build {
    Here(Result<(Imported, Payload), RedisError>),
    OnWorker(Plan),
}

impl Plan {
    /// A fresh import built on the main thread, or the plan for a worker: a
    /// document that would be large for the most
    /// expensive encoding (its own is known once parsed), or one whose
    /// encoding is not built yet (built and counted by the worker).
    fn build_here(self, ctx: &Context, document: &RedisString) -> Result<Build, RedisError> {
        let limit = self.cfg.inline_limit_any();
        let large = document.len() as u64 >= limit;
        if large {
            refuse_where_blocking_is_impossible(ctx, "document", document.len(), limit)?;
        }
        if large && can_block(ctx) {
            return Ok(Build::OnWorker(self));
        }
        let unbuilt = Cell::new(None);
        let built = self.clone().build(document.as_slice(), Some(&unbuilt));
        let Some(encoding) = unbuilt.get() else {
            return Ok(Build::Here(built));
        };
        if encoding_build::must_wait(ctx, encoding)? && can_block(ctx) {
            return Ok(Build::OnWorker(self));
        }
        encoding_build::require(ctx, encoding)?;
        Ok(Build::Here(self.build(document.as_slice(), None)))
    }
}

/// Stores the built session in the key, replicates it whole, replies.
fn store(
    ctx: &Context,
    keyname: &RedisString,
    key: &mut SessionKey,
    built: (Imported, Payload),
    now: i64,
    cfg: &Config,
) -> RedisResult {
    let (
        Imported {
            session, trimmed, ..
        },
        payload,
    ) = built;
    let summarize = session.meets(session_thresholds(&session, cfg));
    let outcome = crate::session::Outcome {
        id: session.last_id,
        tokens: session.messages.back().map_or(0, |m| m.tokens),
        total_tokens: session.total_tokens,
        messages: session.message_count(),
        trimmed,
        duplicate: false,
    };
    let expiry = session.key_expiry(now);
    key.put(session)?;
    let mut events = Events::default();
    events.add(Write::Import, trimmed, summarize);
    let how = Propagate::Encoded(payload.0);
    finish_write(ctx, keyname, key, how, expiry, &events);
    reply_outcome(ctx, &outcome, summarize)
}

pub static IMPORT: CommandDecl = CommandDecl {
    name: "mem.import",
    entry: entry!(import),
    flags: "write deny-oom",
    acl: "mem",
    summary: "Creates a session from a JSON document (MEM.GET FORMAT JSON or the client-side user_memory shape).",
    complexity: "O(N) in the size of the document.",
    arity: -3,
    access: Overwrite,
    args: &[
        key(),
        string("json"),
        optional(flag("REPLACE")),
        SETTINGS_OPTIONS[0],
        SETTINGS_OPTIONS[1],
        SETTINGS_OPTIONS[2],
        SETTINGS_OPTIONS[3],
        SETTINGS_OPTIONS[4],
    ],
};
