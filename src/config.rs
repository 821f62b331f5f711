//! Module configuration (`CONFIG SET/GET mem.*`, redis.conf, loadmodule args).
//!
//! Values are read on the main thread while a command runs; atomics and a
//! mutex keep them `Sync` for the crate's registration API.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

use redis_module::{enum_configuration, RedisString};

use crate::error::setting as setting_error;
use crate::tokenizer::Encoding;

/// The defaults of the integer settings: the statics below start at them
/// and lib.rs registers them (with their ranges) from here.
pub mod default {
    pub const TTL: i64 = 86_400;
    pub const EXT_TTL: i64 = 86_400;
    pub const MAX_TOKENS: i64 = 80_000;
    pub const MAX_MESSAGES: i64 = 30;
    pub const SUMMARIZE_RATIO: i64 = 15;
    pub const SUMMARIZE_FALLBACK_TOKENS: i64 = 15_000;
    pub const SUMMARIZE_KEEP: i64 = 10;
    pub const SUMMARIZE_HEADROOM: i64 = 20;
    pub const MAX_MESSAGE_BYTES: i64 = 4 * 1024 * 1024;
    pub const ASYNC_THRESHOLD_BYTES: i64 = 64 * 1024;
    pub const MAX_TOKENS_LIMIT: i64 = 10_000_000;
    pub const MAX_MESSAGES_LIMIT: i64 = 100_000;
    pub const MAX_AGE: i64 = 0;
    pub const COUNT_THREADS: i64 = 2;
    pub const DEBUG_COUNT_DELAY_MS: i64 = 0;
}

pub static TTL: AtomicI64 = AtomicI64::new(default::TTL);
pub static EXT_TTL: AtomicI64 = AtomicI64::new(default::EXT_TTL);
pub static MAX_TOKENS: AtomicI64 = AtomicI64::new(default::MAX_TOKENS);
pub static MAX_MESSAGES: AtomicI64 = AtomicI64::new(default::MAX_MESSAGES);
pub static SUMMARIZE_RATIO: AtomicI64 = AtomicI64::new(default::SUMMARIZE_RATIO);
pub static SUMMARIZE_FALLBACK_TOKENS: AtomicI64 =
    AtomicI64::new(default::SUMMARIZE_FALLBACK_TOKENS);
pub static SUMMARIZE_KEEP: AtomicI64 = AtomicI64::new(default::SUMMARIZE_KEEP);
/// Percent of the caps kept free below the summarize thresholds.
pub static SUMMARIZE_HEADROOM: AtomicI64 = AtomicI64::new(default::SUMMARIZE_HEADROOM);
pub static MAX_MESSAGE_BYTES: AtomicI64 = AtomicI64::new(default::MAX_MESSAGE_BYTES);
pub static ASYNC_THRESHOLD_BYTES: AtomicI64 = AtomicI64::new(default::ASYNC_THRESHOLD_BYTES);
pub static MAX_TOKENS_LIMIT: AtomicI64 = AtomicI64::new(default::MAX_TOKENS_LIMIT);
pub static MAX_MESSAGES_LIMIT: AtomicI64 = AtomicI64::new(default::MAX_MESSAGES_LIMIT);
pub static MAX_AGE: AtomicI64 = AtomicI64::new(default::MAX_AGE);
pub static COUNT_THREADS: AtomicI64 = AtomicI64::new(default::COUNT_THREADS);
/// Testing knob (as Redis's own `key-load-delay`): a worker waits this long
/// before counting, so tests can inject faults while a count is in flight.
pub static DEBUG_COUNT_DELAY_MS: AtomicI64 = AtomicI64::new(default::DEBUG_COUNT_DELAY_MS);

pub const DEFAULT_MODEL: &str = "gpt-4o";

enum_configuration! {
    #[allow(non_camel_case_types)]
    pub enum EncodingConfig {
        o200k_base = 0,
        cl100k_base = 1,
        llama3 = 2,
        deepseek_v3 = 3,
        qwen2 = 4,
        glm4 = 5,
        glm5 = 6,
        kimi_k2 = 7,
        minimax_m2 = 8,
        tekken = 9,
    }
}

pub static DEFAULT_MODEL_CONFIG: ModelSetting = ModelSetting(Mutex::new(None));
/// Its get and set are the crate's (`Mutex<T>`), which unwrap the lock: it
/// never poisons, as no code holding it can panic (the crate's own get/set
/// clone or assign a fieldless enum, `Config::current` matches on it).
pub static DEFAULT_ENCODING: Mutex<EncodingConfig> = Mutex::new(EncodingConfig::o200k_base);

/// `mem.models`: the operator's model table entries (tokenizer/models.rs),
/// parsed when set; a malformed value is refused and changes nothing.
pub static MODELS_CONFIG: ModelsSetting = ModelsSetting;

pub struct ModelsSetting;

impl redis_module::ConfigurationValue<RedisString> for ModelsSetting {
    fn get(&self, _: &redis_module::configuration::ConfigurationContext) -> RedisString {
        config_string(crate::tokenizer::models::operator_text)
    }

    fn set(
        &self,
        _: &redis_module::configuration::ConfigurationContext,
        val: RedisString,
    ) -> Result<(), redis_module::RedisError> {
        guarded_set(|| {
            let text = config_text(&val, "mem.models")?;
            let entries = crate::tokenizer::models::parse(text).map_err(setting_error)?;
            crate::tokenizer::models::set_operator(entries);
            Ok(())
        })
    }
}

/// `mem.encodings`: the encodings the module may build and count with
/// ("all", or names separated by spaces or commas). Building one costs
/// 25-45 MB and 1-2 s; an operator of a shared server lists those its
/// applications use, and a command that would count under another is
/// refused. A bit per encoding.
/// Set once every mem.* setting has its starting value (module load).
pub static SETTINGS_LOADED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

pub static ENCODINGS_CONFIG: EncodingsSetting = EncodingsSetting(AtomicI64::new(ALL_ENCODINGS));

const ALL_ENCODINGS: i64 = (1 << Encoding::ALL.len()) - 1;

pub struct EncodingsSetting(AtomicI64);

impl EncodingsSetting {
    pub fn allows(&self, e: Encoding) -> bool {
        self.0.load(Ordering::Relaxed) & (1 << (e as u32)) != 0
    }

    /// The setting as it stands (a bit per encoding), to tell whether it
    /// changed.
    pub fn bits(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl redis_module::ConfigurationValue<RedisString> for EncodingsSetting {
    fn get(&self, _: &redis_module::configuration::ConfigurationContext) -> RedisString {
        config_string(|| {
            let bits = self.0.load(Ordering::Relaxed);
            if bits == ALL_ENCODINGS {
                "all".to_owned()
            } else {
                Encoding::ALL
                    .iter()
                    .filter(|e| bits & (1 << (**e as u32)) != 0)
                    .map(|e| e.name())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        })
    }

    fn set(
        &self,
        _: &redis_module::configuration::ConfigurationContext,
        val: RedisString,
    ) -> Result<(), redis_module::RedisError> {
        guarded_set(|| self.parse_and_store(&val))
    }
}

impl EncodingsSetting {
    fn parse_and_store(&self, val: &RedisString) -> Result<(), redis_module::RedisError> {
        let text = config_text(val, "mem.encodings")?;
        let mut bits = 0;
        let names: Vec<&str> = text
            .split([' ', ',', '\t', '\n'])
            .filter(|s| !s.is_empty())
            .collect();
        for name in &names {
            if name.eq_ignore_ascii_case("all") {
                if names.len() > 1 {
                    return Err(setting_error(
                        "mem.encodings: 'all' stands alone (or name the encodings)".to_owned(),
                    ));
                }
                bits = ALL_ENCODINGS;
                continue;
            }
            let e = Encoding::from_name(name).ok_or_else(|| {
                setting_error(format!(
                    "mem.encodings: unknown encoding '{name}' (one of all, {})",
                    Encoding::ALL.map(|e| e.name()).join(", ")
                ))
            })?;
            bits |= 1 << (e as u32);
        }
        if bits == 0 {
            return Err(setting_error(
                "mem.encodings must name at least one encoding (or all)".to_owned(),
            ));
        }
        self.0.store(bits, Ordering::Relaxed);
        Ok(())
    }
}

/// `mem.default-model`: a string config that refuses names MODEL would
/// refuse. Shared (`Arc`), None while it is the built-in default: every
/// command reads it ([`Config::current`]), and a copy was an allocation each.
pub struct ModelSetting(Mutex<Option<Arc<str>>>);

impl ModelSetting {
    fn current(&self) -> Arc<str> {
        static BUILT_IN: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        lock(&self.0)
            .clone()
            .unwrap_or_else(|| BUILT_IN.get_or_init(|| Arc::from(DEFAULT_MODEL)).clone())
    }
}

impl redis_module::ConfigurationValue<RedisString> for ModelSetting {
    fn get(&self, _: &redis_module::configuration::ConfigurationContext) -> RedisString {
        config_string(|| self.current().to_string())
    }

    fn set(
        &self,
        _: &redis_module::configuration::ConfigurationContext,
        val: RedisString,
    ) -> Result<(), redis_module::RedisError> {
        guarded_set(|| {
            let model = config_text(&val, "mem.default-model")?;
            crate::session::check_model(model).map_err(setting_error)?;
            // As MODEL takes it: no tab or newline either (mem.models may
            // hold them, as separators).
            crate::session::check_name_chars("mem.default-model", model).map_err(setting_error)?;
            // A default that mem.encodings leaves out refused every append
            // to a new session; refused here instead, where it was set.
            // Not while loading (the settings are applied one by one, in an
            // order the server picks), nor when mem.encodings is narrowed
            // later: a server started with only `mem.encodings` keeps gpt-4o.
            let known = crate::tokenizer::models::resolve(model).encoding;
            if let Some(e) = known.filter(|_| SETTINGS_LOADED.load(Ordering::Relaxed)) {
                if !ENCODINGS_CONFIG.allows(e) {
                    return Err(setting_error(format!(
                        "mem.default-model: {model} counts with {}, which mem.encodings leaves out (CONFIG SET mem.encodings first)",
                        e.name()
                    )));
                }
            }
            *lock(&self.0) = Some(Arc::from(model));
            Ok(())
        })
    }
}

/// A string config's value: UTF-8 without control characters but the
/// separators of mem.models (tab, newline). A NUL would reach the crate's
/// CString conversions (a panic that aborts the server).
fn config_text<'a>(val: &'a RedisString, name: &str) -> Result<&'a str, redis_module::RedisError> {
    let text = std::str::from_utf8(val.as_slice())
        .map_err(|_| setting_error(format!("{name} must be valid UTF-8")))?;
    if text.chars().any(|c| {
        (c.is_control() && !matches!(c, '\t' | '\n' | '\r')) || matches!(c, '\u{2028}' | '\u{2029}')
    }) {
        return Err(setting_error(format!(
            "{name} must not hold control characters (NUL, ...)"
        )));
    }
    Ok(text)
}

/// The crate calls a config's get and set from its own `extern "C"` shims,
/// which catch no panic (one would abort the server): the value is made
/// under [`crate::guard::or`] (an empty value if it panics), then copied
/// with `create_from_slice`, which never unwraps a CString.
fn config_string(value: impl FnOnce() -> String) -> RedisString {
    let text = crate::guard::or(String::new(), value);
    RedisString::create_from_slice(std::ptr::null_mut(), text.as_bytes())
}

/// A config's set under [`crate::guard::or`] (a panic refuses the value),
/// its error made printable: the crate turns it into a RedisString through
/// a CString, which panics on a NUL.
fn guarded_set(
    set: impl FnOnce() -> Result<(), redis_module::RedisError>,
) -> Result<(), redis_module::RedisError> {
    crate::guard::or_else(|| Err(crate::error::internal()), set).map_err(|e| match e {
        redis_module::RedisError::String(s) => setting_error(s),
        other => other,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere; the value is still whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn get(v: &AtomicI64) -> u64 {
    v.load(Ordering::Relaxed).max(0) as u64
}

/// The most bytes of text counted inline under `e`: about 4 ms of its worst
/// case, measured on fresh text chosen to defeat the caches (random mixed
/// case letters, mixed scripts, combining marks: docs/PERFORMANCE.md,
/// "worst case per encoding"), quickest of 3, release build on this 2-core
/// machine: o200k_base 3.5 ms per 16 KB (6.2 KB/ms at 60 KB), cl100k_base
/// 3.8 ms per 32 KB, the open-weight encodings 1.2 ms per 3.9 KB (Qwen,
/// mixed scripts; 0.3 us a byte).
pub fn max_inline_bytes(e: Encoding) -> u64 {
    match e {
        Encoding::O200kBase => 16 * 1024,
        Encoding::Cl100kBase => 32 * 1024,
        _ => 4 * 1024,
    }
}

/// A snapshot of the configuration a command works with.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub ttl: u64,
    pub ext_ttl: u64,
    pub max_tokens: u64,
    pub max_messages: u64,
    pub max_tokens_limit: u64,
    pub max_messages_limit: u64,
    pub summarize_ratio: u64,
    pub summarize_fallback_tokens: u64,
    pub summarize_keep: u64,
    pub summarize_headroom: u64,
    pub default_model: Arc<str>,
    pub default_encoding: Encoding,
    pub max_message_bytes: u64,
    pub async_threshold_bytes: u64,
    /// Default `maxage` of new sessions, seconds (0 = none).
    pub max_age: u64,
}

impl Config {
    /// Texts of at least this many bytes are counted under `encoding` on the
    /// worker pool, not inline: `mem.async-threshold-bytes` (a sixteenth of
    /// it for the open-weight encodings, whose worst case per byte is up to
    /// 4x OpenAI's), and never more than the encoding's [`max_inline_bytes`],
    /// whatever the operator sets, so no text within it holds the main
    /// thread 10 ms.
    pub fn inline_limit(&self, encoding: Encoding) -> u64 {
        let configured = if encoding.is_openai() {
            self.async_threshold_bytes
        } else {
            (self.async_threshold_bytes / 16).max(1)
        };
        configured.min(max_inline_bytes(encoding))
    }

    /// The least [`Config::inline_limit`] of every encoding: a text whose
    /// encoding is not known before it is parsed (an import) is counted
    /// inline only below it.
    pub fn inline_limit_any(&self) -> u64 {
        Encoding::ALL
            .iter()
            .map(|e| self.inline_limit(*e))
            .min()
            .unwrap_or(self.async_threshold_bytes)
    }

    pub fn current() -> Config {
        Config {
            ttl: get(&TTL),
            ext_ttl: get(&EXT_TTL),
            max_tokens: get(&MAX_TOKENS),
            max_messages: get(&MAX_MESSAGES),
            max_tokens_limit: get(&MAX_TOKENS_LIMIT),
            max_messages_limit: get(&MAX_MESSAGES_LIMIT),
            summarize_ratio: get(&SUMMARIZE_RATIO),
            summarize_fallback_tokens: get(&SUMMARIZE_FALLBACK_TOKENS),
            summarize_keep: get(&SUMMARIZE_KEEP),
            summarize_headroom: get(&SUMMARIZE_HEADROOM),
            default_model: DEFAULT_MODEL_CONFIG.current(),
            default_encoding: match *lock(&DEFAULT_ENCODING) {
                EncodingConfig::o200k_base => Encoding::O200kBase,
                EncodingConfig::cl100k_base => Encoding::Cl100kBase,
                EncodingConfig::llama3 => Encoding::Llama3,
                EncodingConfig::deepseek_v3 => Encoding::DeepseekV3,
                EncodingConfig::qwen2 => Encoding::Qwen2,
                EncodingConfig::glm4 => Encoding::Glm4,
                EncodingConfig::glm5 => Encoding::Glm5,
                EncodingConfig::kimi_k2 => Encoding::KimiK2,
                EncodingConfig::minimax_m2 => Encoding::MinimaxM2,
                EncodingConfig::tekken => Encoding::Tekken,
            },
            max_message_bytes: get(&MAX_MESSAGE_BYTES),
            async_threshold_bytes: get(&ASYNC_THRESHOLD_BYTES),
            max_age: get(&MAX_AGE),
        }
    }

    /// `mem.count-threads`, read by the worker pool.
    pub fn count_threads() -> usize {
        get(&COUNT_THREADS) as usize
    }

    /// `mem.debug-count-delay-ms`, read by the workers.
    pub fn debug_count_delay() -> std::time::Duration {
        std::time::Duration::from_millis(get(&DEBUG_COUNT_DELAY_MS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_set_is_refused_not_propagated() {
        let r = guarded_set(|| panic!("a bug in a config's set"));
        assert_eq!(
            r.unwrap_err().to_string(),
            crate::error::internal().to_string()
        );
    }

    #[test]
    fn set_errors_carry_no_nul() {
        // The crate builds its error reply through CString::new(..).unwrap().
        let r = guarded_set(|| Err(redis_module::RedisError::String("bad \0 value".into())));
        let msg = r.unwrap_err().to_string();
        assert!(!msg.contains('\0'), "{msg:?}");
        assert!(std::ffi::CString::new(msg).is_ok());
        assert!(guarded_set(|| Ok(())).is_ok());
    }
}
