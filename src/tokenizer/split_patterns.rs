//! The pre-tokenizer patterns of the open-weight encodings, and how a
//! stage's DFAs are compiled from them. Shared with build.rs (through
//! `#[path]`), which compiles every stage here once, when the module is
//! built, into tables the module carries (split.rs loads them): building
//! them at first use took 0.3-3.2 s per encoding (2.7 s of Kimi K2's 4.5 s
//! build, 3.2 s of MiniMax M2's 6.0 s). Nothing here but the patterns and
//! regex-automata.

use regex_automata::dfa::{dense, sparse, StartKind};
use regex_automata::nfa::thompson;
use regex_automata::MatchKind;

/// A split stage: its patterns, tried leftmost-first like an alternation,
/// each with whether its last character is a look-ahead to give back.
pub type Stage = &'static [(&'static str, bool)];

/// `\s+(?!\S)|\s+` written for engines without look-around (see split.rs).
macro_rules! with_whitespace {
    ($head:expr) => {
        &[
            (concat!($head, r"|\s+$"), false),
            (r"\s+\s", true),
            (r"\s+", false),
        ]
    };
}

/// The cl100k_base pattern; Llama 3 and GLM-4/5 split exactly so.
pub const CL100K: Stage = with_whitespace!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
);

pub const LLAMA3: &[Stage] = &[CL100K];

// deepseek-ai/DeepSeek-V3 tokenizer.json: a Sequence of three
// Isolated splits, no normalizer.
pub const DEEPSEEK_V3: &[Stage] = &[
    &[(r"\p{N}{1,3}", false)],
    &[(r"[一-龥぀-ゟ゠-ヿ]+", false)],
    with_whitespace!(
        r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"##
    ),
];

// Qwen/Qwen2.5 tokenizer.json: NFC, then single digits.
pub const QWEN2: &[Stage] = &[with_whitespace!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
)];

pub const GLM4: &[Stage] = &[CL100K];

pub const GLM5: &[Stage] = &[CL100K];

// moonshotai/Kimi-K2 tokenization_kimi.py: Han runs first, then
// o200k-style words that exclude Han.
pub const KIMI_K2: &[Stage] = &[with_whitespace!(concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
))];

// MiniMaxAI/MiniMax-M2 tokenizer.json: o200k_base's pattern.
pub const MINIMAX_M2: &[Stage] = &[with_whitespace!(concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
))];

// mistral-common tekken.json (v3, 240911): no contractions, single
// digits.
pub const TEKKEN: &[Stage] = &[with_whitespace!(concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
))];

/// Every stage the module carries compiled.
#[allow(dead_code)] // build.rs reads it; the module looks tables up by sources
pub const ALL: &[&[Stage]] = &[
    LLAMA3,
    DEEPSEEK_V3,
    QWEN2,
    GLM4,
    GLM5,
    KIMI_K2,
    MINIMAX_M2,
    TEKKEN,
];

/// The forward DFA: dense (the hot path: every piece is one anchored
/// search), leftmost-first, anchored and unanchored starts (unanchored
/// finds the match after a gap).
pub fn forward(sources: &[&str]) -> Result<dense::DFA<Vec<u32>>, String> {
    dense::Builder::new()
        .configure(
            dense::Config::new()
                .match_kind(MatchKind::LeftmostFirst)
                .start_kind(StartKind::Both),
        )
        .build_many(sources)
        .map_err(|e| e.to_string())
}

/// The reverse DFA, configured as regex-automata's `dfa::regex` builds its
/// own (anchored, every match, reversed): it finds where the match after a
/// gap starts, which only HuggingFace's Isolated stages leave. Sparse: a
/// tenth of the dense size, off the hot path.
pub fn reverse(sources: &[&str]) -> Result<sparse::DFA<Vec<u8>>, String> {
    dense::Builder::new()
        .configure(
            dense::Config::new()
                .prefilter(None)
                .specialize_start_states(false)
                .start_kind(StartKind::Anchored)
                .match_kind(MatchKind::All),
        )
        .thompson(thompson::Config::new().reverse(true))
        .build_many(sources)
        .map_err(|e| e.to_string())?
        .to_sparse()
        .map_err(|e| e.to_string())
}

/// A stage's pattern sources, as the DFAs are built from them.
pub fn sources(stage: Stage) -> Vec<&'static str> {
    stage.iter().map(|(p, _)| *p).collect()
}
