//! The MEM.* commands: each parses its arguments, calls the session core and
//! writes the reply. What every write shares (clock, settings of a new
//! session, replication of the effect, key expiry, notifications) is here.

pub mod args;
pub mod attrs;
mod batch;
mod ext;
mod import;
mod internal;
mod lease;
mod models;
mod read;
pub mod reply;
pub mod table;
mod write;

use std::borrow::Cow;
use std::ffi::CStr;
use std::sync::Arc;

use redis_module::{raw, Context, NotifyEvent, RedisError, RedisResult, RedisString, RedisValue};

use crate::config::Config;
use crate::declare::{integer, option, string, Arg};
use crate::key::SessionKey;
use crate::persistence;
use crate::session::{Op, Outcome, Session, Settings, Thresholds};
use crate::stats;
use crate::tokenizer;

pub use attrs::{attr_del, attr_get, attr_set};
pub use batch::append_batch;
pub use ext::{ext_get, ext_set};
pub use import::import;
pub use internal::{apply, put};
pub use lease::summarize_begin;
pub use models::{count, models};
pub use read::{get, info, summarize_check};
pub use write::{append, summarize};

/// The server's clock in Unix milliseconds.
pub fn now_ms() -> i64 {
    // SAFETY: RedisModule_Milliseconds takes no arguments and only reads the clock.
    unsafe { raw::RedisModule_Milliseconds.unwrap()() }
}

/// The settings a session created now gets.
pub fn default_settings(cfg: &Config) -> Settings {
    Settings {
        model: (*cfg.default_model).into(),
        encoding: tokenizer::encoding_for_model(&cfg.default_model, cfg.default_encoding),
        ttl: cfg.ttl,
        // Never above the limits a client's MAXTOKENS / MAXMSGS is held to
        // (the defaults may be set higher): a session's FORMAT JSON imports
        // back under the same configuration.
        max_tokens: cfg.max_tokens.min(cfg.max_tokens_limit),
        max_msgs: cfg.max_messages.min(cfg.max_messages_limit),
        max_age: cfg.max_age,
    }
}

/// MEM.APPEND's and MEM.APPENDBATCH's (and MEM.IMPORT's) settings options.
pub const SETTINGS_OPTIONS: [Arg; 5] = [
    option("MODEL", string("name")),
    option("TTL", integer("seconds")),
    option("MAXTOKENS", integer("n")),
    option("MAXMSGS", integer("n")),
    option("MAXAGE", integer("seconds")),
];

/// The options that change a session's settings (MEM.APPEND, MEM.APPENDBATCH).
#[derive(Clone)]
pub struct SettingsOptions<'a> {
    /// Borrowed from the command's arguments, owned once it must outlive
    /// them (an import built on a worker: [`SettingsOptions::into_owned`]).
    model: Option<Cow<'a, str>>,
    ttl: Option<u64>,
    max_tokens: Option<u64>,
    max_msgs: Option<u64>,
    max_age: Option<u64>,
}

impl<'a> SettingsOptions<'a> {
    /// No change: the session's settings, or a new session's.
    pub fn none() -> SettingsOptions<'a> {
        SettingsOptions {
            model: None,
            ttl: None,
            max_tokens: None,
            max_msgs: None,
            max_age: None,
        }
    }

    /// MAXTOKENS/MAXMSGS are bounded by `mem.max-tokens-limit` /
    /// `mem.max-messages-limit`: an operator bounds what one client can make
    /// a session hold.
    pub fn parse(
        opts: &args::Options<'a>,
        cfg: &Config,
    ) -> Result<SettingsOptions<'a>, RedisError> {
        let model = opts.str("MODEL")?;
        if let Some(model) = model {
            args::check_model(model)?;
        }
        Ok(SettingsOptions {
            model: model.map(Cow::Borrowed),
            ttl: opts.seconds("TTL", 0)?,
            max_tokens: opts.u64_at_most(
                "MAXTOKENS",
                1,
                cfg.max_tokens_limit,
                "mem.max-tokens-limit",
            )?,
            max_msgs: opts.u64_at_most(
                "MAXMSGS",
                1,
                cfg.max_messages_limit,
                "mem.max-messages-limit",
            )?,
            // Bounded like TTL, so now - maxage never nears an overflow.
            max_age: opts.seconds("MAXAGE", 0)?,
        })
    }

    /// `model` unless MODEL was given (an imported document's own model).
    pub fn default_model(&mut self, model: &str) -> Result<(), RedisError> {
        if self.model.is_none() {
            args::check_model(model)?;
            self.model = Some(Cow::Owned(model.to_owned()));
        }
        Ok(())
    }

    /// The settings an imported document carries (its `model`, and those
    /// `FORMAT JSON` wrote), where no option names others; bounded as the
    /// options are.
    pub fn default_to_document(
        &mut self,
        doc: &crate::json_format::DocSettings<'_>,
        cfg: &Config,
    ) -> Result<(), RedisError> {
        if let Some(m) = doc.model {
            self.default_model(m)?;
        }
        let bounded = |name: &str, v: Option<u64>, min: u64, max: u64, limit: &str| match v {
            Some(n) if n < min || n > max => Err(crate::error::invalid(format!(
                "the document's {name} {n} is outside {min}..={max} ({limit})"
            ))),
            other => Ok(other),
        };
        let secs = crate::session::MAX_TTL_SECS;
        self.ttl = self.ttl.or(bounded("ttl", doc.ttl, 0, secs, "100 years")?);
        self.max_tokens = self.max_tokens.or(bounded(
            "maxtokens",
            doc.max_tokens,
            1,
            cfg.max_tokens_limit,
            "mem.max-tokens-limit",
        )?);
        self.max_msgs = self.max_msgs.or(bounded(
            "maxmsgs",
            doc.max_msgs,
            1,
            cfg.max_messages_limit,
            "mem.max-messages-limit",
        )?);
        self.max_age = self
            .max_age
            .or(bounded("maxage", doc.max_age, 0, secs, "100 years")?);
        Ok(())
    }

    /// The same options, owning their model name (for a worker).
    pub fn into_owned(self) -> SettingsOptions<'static> {
        SettingsOptions {
            model: self.model.map(|m| Cow::Owned(m.into_owned())),
            ttl: self.ttl,
            max_tokens: self.max_tokens,
            max_msgs: self.max_msgs,
            max_age: self.max_age,
        }
    }

    /// The settings a write works with: the session's (a new session's when
    /// there is none), changed by these options.
    pub fn merge(&self, session: Option<&Session>, cfg: &Config) -> Settings {
        let mut settings = session.map_or_else(|| default_settings(cfg), |s| s.settings.clone());
        if let Some(model) = self.model.as_deref() {
            settings.model = model.into();
            settings.encoding = tokenizer::encoding_for_model(model, cfg.default_encoding);
        }
        settings.ttl = self.ttl.unwrap_or(settings.ttl);
        settings.max_tokens = self.max_tokens.unwrap_or(settings.max_tokens);
        settings.max_msgs = self.max_msgs.unwrap_or(settings.max_msgs);
        settings.max_age = self.max_age.unwrap_or(settings.max_age);
        settings
    }
}

/// What kind of write a command made: its keyspace event and INFO counter.
#[derive(Clone, Copy)]
pub enum Write {
    Append,
    Import,
    Summarize,
    ExtSet,
    AttrSet,
    AttrDel,
}

/// The keyspace events of a write, counted in INFO mem as they are added;
/// `finish_write` publishes them, in order. Names are C strings and the
/// first few are held inline: an append allocated three times for its
/// events (a Vec and a CString per event).
#[derive(Default)]
pub struct Events {
    first: [Option<&'static CStr>; 3],
    more: Vec<&'static CStr>,
}

impl Events {
    fn push(&mut self, event: &'static CStr) {
        match self.first.iter_mut().find(|e| e.is_none()) {
            Some(free) => *free = Some(event),
            None => self.more.push(event),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &'static CStr> + '_ {
        self.first
            .iter()
            .flatten()
            .copied()
            .chain(self.more.iter().copied())
    }

    /// One write that evicted `trimmed` messages and after which the session
    /// meets its threshold (`threshold`).
    pub fn add(&mut self, write: Write, trimmed: u64, threshold: bool) -> &mut Self {
        let (event, counter) = match write {
            Write::Append => (c"mem.append", &stats::APPENDS),
            Write::Import => (c"mem.import", &stats::IMPORTS),
            Write::Summarize => (c"mem.summarize", &stats::SUMMARIES_APPLIED),
            Write::ExtSet => (c"mem.extset", &stats::EXT_SETS),
            Write::AttrSet => (c"mem.attrset", &stats::ATTR_SETS),
            Write::AttrDel => (c"mem.attrdel", &stats::ATTR_DELS),
        };
        stats::add(counter, 1);
        self.push(event);
        if trimmed > 0 {
            stats::add(&stats::MESSAGES_TRIMMED, trimmed);
            self.push(c"mem.trim");
        }
        if threshold {
            stats::add(&stats::THRESHOLD_EVENTS, 1);
            self.push(c"mem.threshold");
        }
        self
    }

    /// The events of appends (each with whether it met the threshold); a
    /// retry recognised (`duplicate`) changed nothing and has none.
    pub fn appends(outcomes: &[(Outcome, bool)]) -> Events {
        let mut events = Events::default();
        for (outcome, threshold) in outcomes.iter().filter(|(o, _)| !o.duplicate) {
            events.add(Write::Append, outcome.trimmed, *threshold);
        }
        events
    }
}

/// `RM_Replicate(ctx, command, "v", args)`: the crate's `Context::replicate`
/// makes a CString of the name and a Vec of the arguments on every call (two
/// of an append's allocations).
pub fn replicate<const N: usize>(ctx: &Context, command: &CStr, args: [&RedisString; N]) {
    let mut argv = args.map(|arg| arg.inner);
    // SAFETY: ctx is the command's context; "v" takes an array of N valid
    // RedisModuleString pointers (the arguments outlive the call, Redis
    // retains what it keeps) and its length.
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.ctx,
            command.as_ptr(),
            c"v".as_ptr(),
            argv.as_mut_ptr(),
            N,
        );
    }
}

/// The summarization thresholds of `settings` under the current config.
pub fn thresholds(settings: &Settings, cfg: &Config, window: Option<u64>) -> Thresholds {
    Thresholds::new(
        window,
        cfg.summarize_ratio,
        cfg.summarize_fallback_tokens,
        settings,
        cfg.summarize_headroom,
    )
}

pub fn session_thresholds(session: &Session, cfg: &Config) -> Thresholds {
    settings_thresholds(&session.settings, cfg)
}

/// The thresholds of `settings` with its model's own context window.
pub fn settings_thresholds(settings: &Settings, cfg: &Config) -> Thresholds {
    thresholds(settings, cfg, tokenizer::context_window(&settings.model))
}

/// How a write reaches replicas and the AOF.
pub enum Propagate<'a> {
    /// The op, applied identically downstream: its encoded header
    /// ([`OpHeader::of`]) and the appended content, if any, as the client's
    /// own argument (not copied).
    Op(OpHeader, Option<&'a RedisString>),
    /// Several ops (a batch append): each one's encoded header and its
    /// content's string.
    Ops(Vec<(OpHeader, RedisString)>),
    /// The whole session (import, a re-count under a new tokenizer).
    Session,
    /// The whole session, encoded already as a string (a large import's is
    /// made by the worker that built it: no copy on the main thread).
    Encoded(RedisString),
}

/// An op's [`Op::header`], encoded before the op is applied (the op moves
/// into the session).
pub struct OpHeader {
    bytes: Vec<u8>,
    /// A large [`Op::header_text`] left out of `bytes`, and where it goes:
    /// put in as the replicated argument is built (one copy of a 4 MB META
    /// or attribute value on the main thread, not two).
    apart: Option<(usize, Arc<str>)>,
    /// An append's op carries the key's expiry.
    sets_expiry: bool,
}

/// Header texts of this many bytes or more are left apart ([`OpHeader`]).
const HEADER_TEXT_APART_BYTES: usize = 64 << 10;

impl OpHeader {
    pub fn of(op: &Op) -> OpHeader {
        let (bytes, gap) = persistence::encode_op_header_apart(op, HEADER_TEXT_APART_BYTES);
        OpHeader {
            bytes,
            apart: gap.zip(op.header_text().cloned()),
            sets_expiry: matches!(op, Op::Append { .. }),
        }
    }

    /// The header as one argument: its bytes, the text left apart in its
    /// place.
    fn to_argument(&self, ctx: &Context) -> RedisString {
        let Some((at, text)) = &self.apart else {
            return RedisString::create_from_slice(ctx.ctx, &self.bytes);
        };
        let (before, after) = self.bytes.split_at((*at).min(self.bytes.len()));
        let s = RedisString::create_from_slice(ctx.ctx, before);
        for piece in [text.as_bytes(), after] {
            // SAFETY: `s` was just created here and is referenced once (as
            // RedisModule_StringAppendBuffer requires); the buffer is valid
            // for its length.
            unsafe {
                raw::RedisModule_StringAppendBuffer.unwrap()(
                    ctx.ctx,
                    s.inner,
                    piece.as_ptr().cast(),
                    piece.len(),
                )
            };
        }
        s
    }
}

/// Marks `keyname` modified (WATCH, client-side caching): only writes that
/// changed it call this (the module opts out of the implicit signal).
pub fn signal_modified(ctx: &Context, keyname: &RedisString) {
    // SAFETY: ctx and keyname are valid for the running command.
    unsafe {
        raw::RedisModule_SignalModifiedKey.unwrap()(ctx.ctx, keyname.inner);
    }
}

/// Finishes a write on `key`: replicates its effect, sets the key's expiry
/// (replicated as an absolute PEXPIREAT so replicas agree) and notifies.
pub fn finish_write(
    ctx: &Context,
    keyname: &RedisString,
    key: &SessionKey,
    how: Propagate,
    expiry: Option<i64>,
    events: &Events,
) {
    // An append's op carries its expiry (MEM._APPLY sets it): one
    // propagated command instead of two (PEXPIREAT was 10% of an append).
    // A batch's last op sets the batch's.
    let expiry_in_op = match &how {
        Propagate::Op(header, _) => header.sets_expiry,
        Propagate::Ops(ops) => !ops.is_empty(),
        _ => false,
    };
    match how {
        Propagate::Op(header, content) => {
            let payload = header.to_argument(ctx);
            replicate_payload(ctx, keyname, &payload, content)
        }
        Propagate::Ops(ops) => {
            for (header, content) in &ops {
                replicate_payload(ctx, keyname, &header.to_argument(ctx), Some(content));
            }
        }
        Propagate::Session => {
            if let Some(s) = key.session() {
                let payload =
                    RedisString::create_from_slice(ctx.ctx, &persistence::encode_session(s));
                replicate(ctx, c"MEM._PUT", [keyname, &payload]);
            }
        }
        Propagate::Encoded(payload) => replicate(ctx, c"MEM._PUT", [keyname, &payload]),
    }
    // The absolute time the op (or the PEXPIREAT below) carries: a relative
    // expiry counted from Redis's clock a millisecond after `now` left the
    // master 1 ms after its replica and its AOF.
    key.set_abs_expiry(expiry);
    signal_modified(ctx, keyname);
    match expiry {
        _ if expiry_in_op => {}
        Some(at) => ctx.replicate(
            "PEXPIREAT",
            &[keyname.as_slice(), at.to_string().as_bytes()],
        ),
        None => ctx.replicate("PERSIST", &[keyname.as_slice()]),
    }
    for event in events.iter() {
        notify(ctx, event, keyname);
    }
}

/// Publishes a module keyspace event (`notify-keyspace-events` with `d`).
pub fn notify(ctx: &Context, event: &CStr, keyname: &RedisString) {
    // SAFETY: ctx is the command's context, event a C string, keyname
    // the command's argument (Redis retains what it keeps).
    unsafe {
        raw::RedisModule_NotifyKeyspaceEvent.unwrap()(
            ctx.ctx,
            NotifyEvent::MODULE.bits(),
            event.as_ptr(),
            keyname.inner,
        );
    }
}

/// Replicates one op (its [`Op::header`]) and the appended content, if any,
/// as the client's own argument (not copied).
pub fn replicate_op(
    ctx: &Context,
    keyname: &RedisString,
    header: &Op,
    content: Option<&RedisString>,
) {
    let payload = OpHeader::of(header).to_argument(ctx);
    replicate_payload(ctx, keyname, &payload, content);
}

fn replicate_payload(
    ctx: &Context,
    keyname: &RedisString,
    payload: &RedisString,
    content: Option<&RedisString>,
) {
    match content {
        Some(c) => replicate(ctx, c"MEM._APPLY", [keyname, payload, c]),
        None => replicate(ctx, c"MEM._APPLY", [keyname, payload]),
    }
}

/// The reply of a write recognised as a retry (`outcome.duplicate`):
/// nothing changed, so nothing is replicated, notified or refreshed.
pub fn reply_duplicate(
    ctx: &Context,
    session: &Session,
    outcome: &Outcome,
    cfg: &Config,
) -> RedisResult {
    stats::add(&stats::DUPLICATES, 1);
    reply_outcome(
        ctx,
        outcome,
        session.meets(session_thresholds(session, cfg)),
    )
}

/// The reply of MEM.APPEND, MEM.SUMMARIZE and MEM.IMPORT.
pub fn reply_outcome(ctx: &Context, outcome: &Outcome, summarize: bool) -> RedisResult {
    write_outcome(&reply::Reply::new(ctx), outcome, summarize);
    Ok(RedisValue::NoReply)
}

/// One outcome map (also each element of MEM.APPENDBATCH's reply).
pub fn write_outcome(reply: &reply::Reply, outcome: &Outcome, summarize: bool) {
    reply
        .map(7)
        .field_int("id", outcome.id)
        .field_int("tokens", outcome.tokens)
        .field_int("total_tokens", outcome.total_tokens)
        .field_int("messages", outcome.messages)
        .field_int("trimmed", outcome.trimmed)
        .field_int("summarize", u64::from(summarize))
        .field_int("duplicate", u64::from(outcome.duplicate));
}

/// Positional arguments: exactly `min` or more (options follow).
pub fn arity(args: &[RedisString], min: usize) -> Result<(), RedisError> {
    if args.len() < min {
        Err(RedisError::WrongArity)
    } else {
        Ok(())
    }
}
