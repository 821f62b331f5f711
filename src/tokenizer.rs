//! Token counting: which encoding a model uses, how large its context window
//! is, and exact counts with `bpe-openai` (linear time, no panics on any input).
//!
//! `tiktoken-rs` is used only for its model tables (name -> encoding, name ->
//! context window); its own BPE is never built here because it can panic or
//! take seconds on pathological inputs, which would kill or freeze Redis.

/// A tiktoken encoding the module can count with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl Encoding {
    pub const ALL: [Encoding; 2] = [Encoding::O200kBase, Encoding::Cl100kBase];

    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    pub fn from_name(name: &str) -> Option<Encoding> {
        Encoding::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(name))
    }

    fn bpe(self) -> &'static bpe_openai::Tokenizer {
        match self {
            Encoding::O200kBase => bpe_openai::o200k_base(),
            Encoding::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }

    /// Exact token count of `text`, equal to tiktoken's `len(encode(text))`.
    ///
    /// The text is split by the encoding's pattern and each piece counted by
    /// byte-pair encoding, as `bpe_openai::Tokenizer::count` does, in
    /// `piece_count`: o200k_base and cl100k_base split with the hand-written
    /// pre-tokenizers of `pretokenize` (proven equal to their regexes by its
    /// tests, 2-5x faster; an encoding added with one of their regexes can
    /// use them, see `Pattern::for_regex`), any other encoding with its regex; short pieces
    /// (words, mostly) come from a per-thread cache of exact counts.
    pub fn count(self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        let tokenizer = self.bpe();
        let text = tokenizer.normalize(text);
        #[allow(unreachable_patterns)] // encodings without a hand-written split use their regex
        let pattern = match self {
            Encoding::O200kBase => Some(crate::pretokenize::Pattern::O200k),
            Encoding::Cl100kBase => Some(crate::pretokenize::Pattern::Cl100k),
            _ => None,
        };
        crate::piece_count::count(tokenizer, pattern, self as usize, text.as_str()) as u64
    }

    /// Builds the encoder tables now, so the first command does not pay for it.
    pub fn warm_up(self) {
        crate::pretokenize::warm_up();
        let _ = self.count("warm up");
    }
}

/// Tokens of one chat message in OpenAI's chat format accounting (spec §2):
/// 3 framing tokens plus the role and the content.
pub fn message_tokens(encoding: Encoding, role: &str, content: &str) -> u64 {
    3 + encoding.count(role) + encoding.count(content)
}

/// A summary's tokens are counted as those of a message with this role
/// (spec §2: `3 + count("system") + count(text)`).
pub const SUMMARY_COUNTED_AS: &str = "system";

/// The encoding for `model`, or `default` when the vendor publishes none.
///
/// tiktoken-rs's table decides first (it tracks OpenAI's own mapping); the
/// spec's prefixes catch names it does not list (`o4`, `o1-pro...`).
pub fn encoding_for_model(model: &str, default: Encoding) -> Encoding {
    use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
    match get_tokenizer(model) {
        Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => return Encoding::O200kBase,
        Some(Tokenizer::Cl100kBase) => return Encoding::Cl100kBase,
        _ => {}
    }
    const O200K: [&str; 6] = ["gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4"];
    const CL100K: [&str; 2] = ["gpt-4", "gpt-3.5"];
    if O200K.iter().any(|p| model.starts_with(p)) {
        Encoding::O200kBase
    } else if CL100K.iter().any(|p| model.starts_with(p)) {
        Encoding::Cl100kBase
    } else {
        default
    }
}

/// Context windows of vendors that tiktoken-rs does not track, longest
/// prefix first.
const OTHER_VENDOR_WINDOWS: [(&str, u64); 8] = [
    ("claude-instant", 100_000),
    ("claude-2.0", 100_000),
    ("claude", 200_000),
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-1.5-flash", 1_048_576),
    ("gemini-1.0-pro", 32_760),
    ("gemini-pro", 32_760),
    ("gemini", 1_048_576),
];

/// The model's context window in tokens, when known.
pub fn context_window(model: &str) -> Option<u64> {
    if let Some(size) = tiktoken_rs::model::get_context_size(model) {
        return Some(size as u64);
    }
    OTHER_VENDOR_WINDOWS
        .iter()
        .find(|(prefix, _)| model.starts_with(prefix))
        .map(|&(_, size)| size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn models_map_to_the_spec_encodings() {
        let d = Encoding::Cl100kBase;
        for m in ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-5", "o1", "o3-mini", "o4-mini", "o4"] {
            assert_eq!(encoding_for_model(m, d), Encoding::O200kBase, "{m}");
        }
        let d = Encoding::O200kBase;
        for m in ["gpt-4", "gpt-4-turbo-2024-04-09", "gpt-3.5-turbo", "gpt-3.5"] {
            assert_eq!(encoding_for_model(m, d), Encoding::Cl100kBase, "{m}");
        }
        for m in ["claude-3-5-sonnet", "gemini-1.5-pro", "llama-3", ""] {
            assert_eq!(encoding_for_model(m, Encoding::Cl100kBase), Encoding::Cl100kBase);
            assert_eq!(encoding_for_model(m, Encoding::O200kBase), Encoding::O200kBase);
        }
    }

    #[test]
    fn context_windows_of_the_spec_examples() {
        assert_eq!(context_window("gpt-4o"), Some(128_000));
        assert_eq!(context_window("gpt-4.1"), Some(1_047_576));
        assert_eq!(context_window("claude-3-5-sonnet"), Some(200_000));
        assert_eq!(context_window("no-such-model"), None);
    }

    #[test]
    fn counts_equal_tiktoken() {
        let texts = [
            "hello world",
            "  leading and trailing  \n\n",
            "fn main() { println!(\"{}\", 1234567); }",
            "我们在 Redis 里保存对话记忆。",
            "I'm sure they'll've DONE it's",
            "émoji 🎉🎉 and tabs\t\tend",
        ];
        let o = tiktoken_rs::o200k_base().unwrap();
        let c = tiktoken_rs::cl100k_base().unwrap();
        for t in texts {
            assert_eq!(Encoding::O200kBase.count(t), o.encode_ordinary(t).len() as u64, "{t:?}");
            assert_eq!(Encoding::Cl100kBase.count(t), c.encode_ordinary(t).len() as u64, "{t:?}");
        }
    }

    #[test]
    fn cached_counts_equal_uncached_ones() {
        let text = "The quick brown fox jumps over the lazy dog. ".repeat(50)
            + "fn main() { let x = 42; } 我们在 Redis 里 🎉 "
            + &"abcdefghijklmnopqrstuvwxyz0123456789".repeat(3);
        for e in Encoding::ALL {
            let plain = e.bpe().count(text.as_str()) as u64;
            assert_eq!(e.count(&text), plain, "first pass (filling the cache)");
            assert_eq!(e.count(&text), plain, "second pass (from the cache)");
        }
    }

    #[test]
    fn message_accounting_adds_framing_and_role() {
        let e = Encoding::O200kBase;
        assert_eq!(message_tokens(e, "user", ""), 3 + e.count("user"));
        assert_eq!(message_tokens(e, SUMMARY_COUNTED_AS, "abc"), 3 + e.count("system") + e.count("abc"));
    }

    #[test]
    fn encoding_names_round_trip() {
        for e in Encoding::ALL {
            assert_eq!(Encoding::from_name(e.name()), Some(e));
        }
        assert_eq!(Encoding::from_name("p50k_base"), None);
    }
}
