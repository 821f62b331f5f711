//! The model table: model name -> encoding and context window.
//!
//! A built-in table of the models in use today (below, dated, a source per
//! window), and the operator's entries (`mem.models`, CONFIG SET or
//! redis.conf), which win over it. An entry is an exact name or a prefix
//! (`name*`); in each table an exact name wins, then the longest prefix.
//! Names compare case-insensitively; a name with OpenAI's `ft:` prefix of
//! fine-tuned models that matches no entry as written is looked up without
//! it, and a name with a router's `vendor/` prefix
//! (`qwen/qwen3-max`, `meta-llama/Llama-3.1-8B`) that matches nothing is
//! looked up again without it.

use std::sync::{Arc, RwLock};

use super::Encoding;

/// One entry. `encoding` None: the vendor publishes no tokenizer (Claude,
/// Gemini), the session counts with `mem.default-encoding`. `window` None:
/// unknown (the summarize threshold falls back to
/// `mem.summarize-fallback-tokens`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub prefix: bool,
    pub encoding: Option<Encoding>,
    pub window: Option<u64>,
}

impl Entry {
    /// The entry as written in `mem.models` and listed by MEM.MODELS.
    pub fn pattern(&self) -> String {
        format!("{}{}", self.name, if self.prefix { "*" } else { "" })
    }
}

/// What a model name resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub encoding: Option<Encoding>,
    pub window: Option<u64>,
    /// The entry that matched and whether it is the operator's.
    pub entry: Option<(String, bool)>,
}

use Encoding::*;

/// (name, `*` = prefix, encoding, window; 0 = unknown). Checked 2026-12-01.
/// Windows are the vendors' published input context windows, from the
/// pages named above each group (and, for 2026 models, the model table of
/// the `tiktoken` crate 4.1.2, dated 2026-08, which records the same pages).
#[rustfmt::skip]
const BUILT_IN: &[(&str, Option<Encoding>, u64)] = &[
    // OpenAI: platform.openai.com/docs/models (model pages, "Context window").
    ("gpt-5.6*", Some(O200kBase), 1_050_000),
    ("gpt-5.5*", Some(O200kBase), 1_050_000),
    ("gpt-5.4-mini*", Some(O200kBase), 400_000),
    ("gpt-5.4-nano*", Some(O200kBase), 400_000),
    ("gpt-5.4*", Some(O200kBase), 1_050_000),
    ("gpt-5*", Some(O200kBase), 400_000),
    ("gpt-4.5*", Some(O200kBase), 128_000),
    ("gpt-4.1*", Some(O200kBase), 1_047_576),
    ("gpt-4o*", Some(O200kBase), 128_000),
    ("chatgpt-4o*", Some(O200kBase), 128_000),
    ("gpt-oss*", Some(O200kBase), 131_072),
    ("o1-mini*", Some(O200kBase), 128_000),
    ("o1-preview*", Some(O200kBase), 128_000),
    ("o1*", Some(O200kBase), 200_000),
    ("o3*", Some(O200kBase), 200_000),
    ("o4*", Some(O200kBase), 200_000),
    ("gpt-4-turbo*", Some(Cl100kBase), 128_000),
    ("gpt-4-1106*", Some(Cl100kBase), 128_000),
    ("gpt-4-0125*", Some(Cl100kBase), 128_000),
    ("gpt-4-vision*", Some(Cl100kBase), 128_000),
    ("gpt-4-32k*", Some(Cl100kBase), 32_768),
    ("gpt-4*", Some(Cl100kBase), 8_192),
    ("gpt-3.5-turbo-instruct*", Some(Cl100kBase), 4_096),
    ("gpt-3.5*", Some(Cl100kBase), 16_385),
    // Azure OpenAI's deployment names.
    ("gpt-35-turbo*", Some(Cl100kBase), 16_385),
    ("davinci-002", Some(Cl100kBase), 16_384),
    ("babbage-002", Some(Cl100kBase), 16_384),
    ("text-embedding-3*", Some(Cl100kBase), 8_191),
    ("text-embedding-ada-002", Some(Cl100kBase), 8_191),
    // Anthropic (no public tokenizer): docs.anthropic.com models overview.
    ("claude-opus-5*", None, 1_000_000),
    ("claude-sonnet-5*", None, 1_000_000),
    ("claude-opus-4-8*", None, 1_000_000),
    ("claude-opus-4.8*", None, 1_000_000),
    ("claude-opus-4-7*", None, 1_000_000),
    ("claude-opus-4.7*", None, 1_000_000),
    ("claude-opus-4-6*", None, 1_000_000),
    ("claude-opus-4.6*", None, 1_000_000),
    ("claude-sonnet-4-6*", None, 1_000_000),
    ("claude-sonnet-4.6*", None, 1_000_000),
    ("claude-instant*", None, 100_000),
    ("claude-2.0*", None, 100_000),
    ("claude*", None, 200_000),
    // Google (no public Gemini tokenizer): ai.google.dev/gemini-api/docs/models.
    ("gemini-1.5-pro*", None, 2_097_152),
    ("gemini-1.0-pro*", None, 32_760),
    ("gemini-pro", None, 32_760),
    ("gemini*", None, 1_048_576),
    // DeepSeek: api-docs.deepseek.com (models & pricing); V4 from its
    // release notes. deepseek-chat / deepseek-reasoner are the API's names.
    ("deepseek-v4*", Some(DeepseekV3), 1_000_000),
    ("deepseek-chat", Some(DeepseekV3), 128_000),
    ("deepseek-reasoner", Some(DeepseekV3), 128_000),
    ("deepseek-v3*", Some(DeepseekV3), 128_000),
    ("deepseek-r1*", Some(DeepseekV3), 128_000),
    ("deepseek*", Some(DeepseekV3), 128_000),
    // Qwen: Alibaba Cloud Model Studio model list (qwen-max/plus/turbo/long
    // are the API's names); open weights: the models' config.json / cards.
    ("qwen3.8-max*", Some(Qwen2), 1_000_000),
    ("qwen3.5-plus*", Some(Qwen2), 1_000_000),
    ("qwen3-max*", Some(Qwen2), 262_144),
    ("qwen3-coder*", Some(Qwen2), 262_144),
    ("qwen3*", Some(Qwen2), 131_072),
    ("qwen-max*", Some(Qwen2), 32_768),
    ("qwen-plus*", Some(Qwen2), 131_072),
    ("qwen-turbo*", Some(Qwen2), 1_000_000),
    ("qwen-long*", Some(Qwen2), 10_000_000),
    ("qwen-coder-plus*", Some(Qwen2), 131_072),
    ("qwq*", Some(Qwen2), 131_072),
    ("qwen2.5-1m*", Some(Qwen2), 1_010_000),
    ("qwen2.5*", Some(Qwen2), 131_072),
    ("qwen2*", Some(Qwen2), 131_072),
    ("qwen*", Some(Qwen2), 131_072),
    // Zhipu GLM: docs.bigmodel.cn / docs.z.ai model pages. GLM-4 (2024) and
    // GLM-4.5-4.7 share one vocabulary; GLM-5 has its own.
    ("glm-5.2*", Some(Glm5), 1_048_576),
    ("glm-5*", Some(Glm5), 200_000),
    ("glm-4.7*", Some(Glm4), 200_000),
    ("glm-4.6*", Some(Glm4), 200_000),
    ("glm-4.5*", Some(Glm4), 131_072),
    ("glm-4-long*", Some(Glm4), 1_000_000),
    ("glm-4*", Some(Glm4), 128_000),
    // Moonshot Kimi: platform.moonshot.ai docs (K3 keeps K2's vocabulary).
    // moonshot-v1-* predate K2's tokenizer: default encoding.
    ("kimi-k3*", Some(KimiK2), 1_048_576),
    ("kimi-k2-0711*", Some(KimiK2), 131_072),
    ("kimi-k2*", Some(KimiK2), 262_144),
    ("moonshot-v1-8k*", None, 8_192),
    ("moonshot-v1-32k*", None, 32_768),
    ("moonshot-v1-128k*", None, 131_072),
    // MiniMax: platform.minimax.io docs (M2 family, one tokenizer).
    ("minimax-m2*", Some(MinimaxM2), 204_800),
    // Meta Llama: the models' cards / config.json (max_position_embeddings).
    // Llama 4 has another tokenizer (not shipped): default encoding.
    ("llama-4-scout*", None, 10_000_000),
    ("llama-4-maverick*", None, 1_048_576),
    ("llama-3.1*", Some(Llama3), 131_072),
    ("llama-3.2*", Some(Llama3), 131_072),
    ("llama-3.3*", Some(Llama3), 131_072),
    ("llama-3*", Some(Llama3), 8_192),
    ("llama3.1*", Some(Llama3), 131_072),
    ("llama3.2*", Some(Llama3), 131_072),
    ("llama3.3*", Some(Llama3), 131_072),
    ("llama3*", Some(Llama3), 8_192),
    // Mistral: docs.mistral.ai models overview. Tekken models; Mixtral and
    // Mistral 7B use an older SentencePiece vocabulary (default encoding).
    ("mistral-large*", Some(Tekken), 131_072),
    ("mistral-medium*", Some(Tekken), 131_072),
    ("mistral-small*", Some(Tekken), 131_072),
    ("mistral-nemo*", Some(Tekken), 131_072),
    ("open-mistral-nemo*", Some(Tekken), 131_072),
    ("pixtral*", Some(Tekken), 131_072),
    ("ministral*", Some(Tekken), 131_072),
    ("codestral*", Some(Tekken), 256_000),
    ("devstral*", Some(Tekken), 131_072),
    ("magistral*", Some(Tekken), 131_072),
    ("mixtral-8x22b*", None, 65_536),
    ("mixtral*", None, 32_768),
    ("mistral-7b*", None, 32_768),
];

fn parse_pattern(pattern: &str) -> (String, bool) {
    match pattern.strip_suffix('*') {
        Some(name) => (name.to_ascii_lowercase(), true),
        None => (pattern.to_ascii_lowercase(), false),
    }
}

fn built_in() -> &'static [Entry] {
    static TABLE: std::sync::OnceLock<Vec<Entry>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        BUILT_IN
            .iter()
            .map(|&(pattern, encoding, window)| {
                let (name, prefix) = parse_pattern(pattern);
                Entry {
                    name,
                    prefix,
                    encoding,
                    window: (window > 0).then_some(window),
                }
            })
            .collect()
    })
}

static OPERATOR: RwLock<Option<Arc<Vec<Entry>>>> = RwLock::new(None);

fn operator() -> Arc<Vec<Entry>> {
    OPERATOR
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_else(|| Arc::clone(&NO_ENTRIES))
}

/// The operator's entries before any are set: one value, so that the
/// resolved cache sees the same entries until they change.
static NO_ENTRIES: std::sync::LazyLock<Arc<Vec<Entry>>> =
    std::sync::LazyLock::new(|| Arc::new(Vec::new()));

/// The best entry of `table` for `model` (already lowercased).
fn best<'t>(table: &'t [Entry], model: &str) -> Option<&'t Entry> {
    table
        .iter()
        .find(|e| !e.prefix && e.name == model)
        .or_else(|| {
            table
                .iter()
                .filter(|e| e.prefix && model.starts_with(e.name.as_str()))
                .max_by_key(|e| e.name.len())
        })
}

/// What `model` resolves to: the operator's entries first, then the
/// built-in table.
pub fn resolve(model: &str) -> Resolved {
    resolve_in(&operator(), model)
}

/// [`resolve`] with `ops` as the operator's entries.
pub fn resolve_in(ops: &[Entry], model: &str) -> Resolved {
    let lower = model.to_ascii_lowercase();
    let name = lower.strip_prefix("ft:").unwrap_or(&lower);
    let lookup = |name: &str| {
        best(ops, name)
            .map(|e| (e, true))
            .or_else(|| best(built_in(), name).map(|e| (e, false)))
    };
    // The full name first: an operator's entry may be written with `ft:`.
    let found = lookup(&lower)
        .or_else(|| (name.len() < lower.len()).then(|| lookup(name)).flatten())
        .or_else(|| name.rsplit_once('/').and_then(|(_, rest)| lookup(rest)));
    match found {
        Some((e, mine)) => Resolved {
            encoding: e.encoding,
            window: e.window,
            entry: Some((e.pattern(), mine)),
        },
        None => Resolved {
            encoding: None,
            window: None,
            entry: None,
        },
    }
}

/// The encoding for `model`, or `default` when its vendor publishes none
/// (or the model is unknown).
pub fn encoding_for_model(model: &str, default: Encoding) -> Encoding {
    resolved_cached(model).0.unwrap_or(default)
}

/// The model's context window in tokens, when known.
pub fn context_window(model: &str) -> Option<u64> {
    resolved_cached(model).1
}

/// Models whose encoding and window a thread keeps resolved.
const RESOLVED_CACHE_MODELS: usize = 64;

/// `resolve`'s encoding and window, kept per thread for the operator's
/// entries in effect: every append asks both, and resolving lowercases the
/// name, formats the entry's pattern and scans both tables (perf: 0.2 us of
/// a 3.6 us MEM.APPEND TOKENS of 600 B). A CONFIG SET of `mem.models`
/// installs new entries, which empties the cache.
fn resolved_cached(model: &str) -> (Option<Encoding>, Option<u64>) {
    type Cache = (
        Option<Arc<Vec<Entry>>>,
        rustc_hash::FxHashMap<Box<str>, (Option<Encoding>, Option<u64>)>,
    );
    thread_local! {
        static CACHE: std::cell::RefCell<Cache> = Default::default();
    }
    let ops = operator();
    let fresh = |ops: &[Entry]| {
        let r = resolve_in(ops, model);
        (r.encoding, r.window)
    };
    CACHE
        .try_with(|cache| {
            let Ok(mut cache) = cache.try_borrow_mut() else {
                return fresh(&ops);
            };
            let (entries, found) = &mut *cache;
            if !entries.as_ref().is_some_and(|e| Arc::ptr_eq(e, &ops)) {
                *entries = Some(Arc::clone(&ops));
                found.clear();
            }
            if let Some(r) = found.get(model) {
                return *r;
            }
            let r = fresh(&ops);
            if found.len() >= RESOLVED_CACHE_MODELS {
                found.clear();
            }
            found.insert(model.into(), r);
            r
        })
        .unwrap_or_else(|_| fresh(&ops))
}

/// Every entry in effect, the operator's first (as MEM.MODELS lists them).
pub fn effective() -> Vec<(Entry, bool)> {
    let mut all: Vec<(Entry, bool)> = operator().iter().cloned().map(|e| (e, true)).collect();
    all.extend(built_in().iter().cloned().map(|e| (e, false)));
    all
}

/// At most this many operator entries (every lookup reads them all).
pub const MAX_ENTRIES: usize = 1024;
/// Longest model name, in bytes (a session's model is bounded alike).
pub const MAX_MODEL_BYTES: usize = 256;
/// Largest context window: 2^53 - 1, as JSON (and JavaScript) read integers
/// exactly (message ids stop there too).
pub const MAX_WINDOW: u64 = (1 << 53) - 1;

/// Parses `mem.models`: entries separated by spaces or commas, each
/// `name=encoding:window` or `name*=encoding:window`, where encoding is an
/// encoding name or `default` (no public tokenizer) and window a number of
/// tokens (0 = unknown). Empty: no operator entries.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    let mut entries: Vec<Entry> = Vec::new();
    for item in text
        .split([' ', ',', '\t', '\n', '\r'])
        .filter(|s| !s.is_empty())
    {
        let bad = |why: &str| {
            format!(
                "mem.models entry '{}': {why}",
                item.chars().take(80).collect::<String>()
            )
        };
        let (pattern, target) = item
            .split_once('=')
            .ok_or_else(|| bad("expected name=encoding:window"))?;
        let (encoding, window) = target
            .split_once(':')
            .ok_or_else(|| bad("expected name=encoding:window"))?;
        let (name, prefix) = parse_pattern(pattern);
        if name.is_empty() && !prefix {
            return Err(bad("the model name is empty"));
        }
        if name.len() > MAX_MODEL_BYTES || name.contains('*') {
            return Err(bad(
                "a name is 1 to 256 bytes, with '*' only at its end (a prefix)",
            ));
        }
        let encoding = if encoding.eq_ignore_ascii_case("default") {
            None
        } else {
            Some(Encoding::from_name(encoding).ok_or_else(|| {
                let names: Vec<&str> = Encoding::ALL.iter().map(|e| e.name()).collect();
                bad(&format!(
                    "unknown encoding '{encoding}' (one of {}, or default)",
                    names.join(", ")
                ))
            })?)
        };
        let window: u64 = window
            .parse()
            .map_err(|_| bad("the window must be a number of tokens (0 = unknown)"))?;
        if window > MAX_WINDOW {
            return Err(bad("the window is too large"));
        }
        if entries.iter().any(|e| e.name == name && e.prefix == prefix) {
            return Err(bad("given more than once"));
        }
        entries.push(Entry {
            name,
            prefix,
            encoding,
            window: (window > 0).then_some(window),
        });
        if entries.len() > MAX_ENTRIES {
            return Err(format!("mem.models holds at most {MAX_ENTRIES} entries"));
        }
    }
    Ok(entries)
}

/// Installs the operator's entries (parsed by [`parse`]).
pub fn set_operator(entries: Vec<Entry>) {
    *OPERATOR.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(entries));
}

/// The operator's entries as `mem.models` text (CONFIG GET).
pub fn operator_text() -> String {
    operator()
        .iter()
        .map(|e| {
            format!(
                "{}={}:{}",
                e.pattern(),
                e.encoding.map_or("default", Encoding::name),
                e.window.unwrap_or(0)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
#[path = "models_tests.rs"]
mod tests;
