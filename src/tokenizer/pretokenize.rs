//! Hand-written pre-tokenizers equal to the regexes of o200k_base and
//! cl100k_base (and the legacy cl100k form other vocabularies ship), 2-5x
//! faster than running the regexes. An encoding whose regex is one of these
//! exactly can use it: `Pattern::for_regex`.
//!
//! A tiktoken count is the sum of the BPE counts of the pieces the encoding's
//! regex cuts the text into, so the pieces must be exactly the regex's. Each
//! function below follows its pattern alternative by alternative, in the
//! order a backtracking engine tries them (leftmost-first), and says which
//! match the backtracking settles on; `tests` checks the pieces against the
//! regex itself (tiktoken's fancy-regex patterns and bpe-openai's) on large
//! random and adversarial corpora. Every alternative scans forward over a run
//! of one character class a bounded number of times, so a text is split in
//! linear time whatever its shape.
//!
//! ASCII text under o200k goes through an automaton equal to those
//! functions (`ascii_dfa`: a table lookup a byte, piece ends written without
//! a branch), handing over to them at the first non-ASCII byte; tests hold
//! it to the regex on every ASCII string of up to five bytes of its classes.
//!
//! The character classes come from `regex-syntax`, the crate the regexes
//! themselves are compiled with, so both agree on every code point's class
//! (same Unicode version).

use std::sync::OnceLock;

/// Class bits of one character.
const L: u8 = 1; // \p{L}
const UP: u8 = 2; // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
const LO: u8 = 4; // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
const N: u8 = 8; // \p{N}
const S: u8 = 16; // \s
const NL: u8 = 32; // \r or \n

/// Which pattern to split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// [`O200K_REGEX`] (o200k_base, o200k_harmony).
    O200k,
    /// [`CL100K_REGEX`]: tiktoken's cl100k_base.
    Cl100k,
    /// [`CL100K_LEGACY_REGEX`]: the earlier form of cl100k_base's regex, which
    /// other vocabularies ship (Llama 3's tokenizer.json, bpe-openai's
    /// cl100k): the same pieces except whitespace with a line break at the
    /// very end of a text, which it cuts after the last break.
    Cl100kLegacy,
}

/// tiktoken's o200k_base pattern.
pub const O200K_REGEX: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// tiktoken's cl100k_base pattern.
pub const CL100K_REGEX: &str = concat!(
    r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+",
    r"|\s++$|\s*[\r\n]|\s+(?!\S)|\s"
);
/// The earlier cl100k_base pattern (see [`Pattern::Cl100kLegacy`]).
pub const CL100K_LEGACY_REGEX: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
);

impl Pattern {
    /// The hand-written split of a tiktoken-style regex, if it is one of
    /// these exactly (an encoding with another regex keeps the regex).
    pub fn for_regex(regex: &str) -> Option<Pattern> {
        [
            (O200K_REGEX, Pattern::O200k),
            (CL100K_REGEX, Pattern::Cl100k),
            (CL100K_LEGACY_REGEX, Pattern::Cl100kLegacy),
        ]
        .into_iter()
        .find(|(r, _)| *r == regex)
        .map(|(_, p)| p)
    }
}

/// Code points per block of the class table.
const BLOCK: usize = 256;

struct Classes {
    /// Bits of the ASCII characters.
    ascii: [u8; 128],
    /// Block number of each run of `BLOCK` code points.
    index: Vec<u16>,
    /// Distinct blocks (most of Unicode shares a handful).
    blocks: Vec<[u8; BLOCK]>,
    /// Letters of the contractions (`'s 't 're 've 'm 'll 'd`) each non-ASCII
    /// character case-folds to under `(?i)` (U+017F LONG S folds to `s`).
    folds: Vec<(char, u8)>,
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(Classes::build)
}

/// The ranges of a character class in regex syntax; empty if the crate could
/// not parse it (it always can: the patterns are constants).
fn ranges(class: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    match regex_syntax::parse(class).map(|h| h.into_kind()) {
        Ok(HirKind::Class(Class::Unicode(c))) => c
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect(),
        Ok(HirKind::Literal(lit)) => std::str::from_utf8(&lit.0)
            .ok()
            .and_then(|s| s.chars().next())
            .map(|c| vec![(u32::from(c), u32::from(c))])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

impl Classes {
    fn build() -> Classes {
        const CODE_POINTS: usize = 0x11_0000;
        let mut flat = vec![0u8; CODE_POINTS];
        let sets: [(&str, u8); 6] = [
            (r"\p{L}", L),
            (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", UP),
            (r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]", LO),
            (r"\p{N}", N),
            (r"\s", S),
            (r"[\r\n]", NL),
        ];
        for (class, bit) in sets {
            for (lo, hi) in ranges(class) {
                for cell in flat.iter_mut().take(hi as usize + 1).skip(lo as usize) {
                    *cell |= bit;
                }
            }
        }
        let mut ascii = [0u8; 128];
        ascii.copy_from_slice(flat.get(..128).unwrap_or(&[0; 128]));
        let mut index = Vec::with_capacity(CODE_POINTS / BLOCK);
        let mut blocks: Vec<[u8; BLOCK]> = Vec::new();
        let mut seen = std::collections::HashMap::new();
        for chunk in flat.chunks_exact(BLOCK) {
            let mut block = [0u8; BLOCK];
            block.copy_from_slice(chunk);
            let id = *seen.entry(block).or_insert_with(|| {
                blocks.push(block);
                blocks.len() - 1
            });
            index.push(u16::try_from(id).unwrap_or(0));
        }
        let mut folds = Vec::new();
        for letter in *b"stmdrvel" {
            let class = format!("(?i:{})", letter as char);
            for (lo, hi) in ranges(&class) {
                for cp in lo.max(0x80)..=hi {
                    if let Some(c) = char::from_u32(cp) {
                        folds.push((c, letter));
                    }
                }
            }
        }
        Classes {
            ascii,
            index,
            blocks,
            folds,
        }
    }

    /// Class bits and byte length of the character starting at `i` (0, 0 past the end).
    #[inline(always)]
    fn at(&self, b: &[u8], i: usize) -> (u8, usize) {
        let Some(&x) = b.get(i) else { return (0, 0) };
        if x < 0x80 {
            return (self.ascii[usize::from(x)], 1);
        }
        let (cp, len) = decode(b, i, x);
        let block = self.index.get(cp as usize / BLOCK).copied().unwrap_or(0);
        let bits = self
            .blocks
            .get(usize::from(block))
            .and_then(|blk| blk.get(cp as usize % BLOCK))
            .copied()
            .unwrap_or(0);
        (bits, len)
    }

    /// The contraction letter (lowercase ASCII) the character at `i` folds to, and its length.
    #[inline]
    fn fold_at(&self, b: &[u8], i: usize) -> Option<(u8, usize)> {
        let &x = b.get(i)?;
        if x < 0x80 {
            return Some((x.to_ascii_lowercase(), 1));
        }
        let (cp, len) = decode(b, i, x);
        let c = char::from_u32(cp)?;
        self.folds
            .iter()
            .find(|(f, _)| *f == c)
            .map(|&(_, letter)| (letter, len))
    }

    /// Length of `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `i`, 0 if none.
    #[inline]
    fn contraction(&self, b: &[u8], i: usize) -> usize {
        if b.get(i) != Some(&b'\'') {
            return 0;
        }
        let Some((c1, l1)) = self.fold_at(b, i + 1) else {
            return 0;
        };
        let second = |want: u8| match self.fold_at(b, i + 1 + l1) {
            Some((c2, l2)) if c2 == want => 1 + l1 + l2,
            _ => 0,
        };
        match c1 {
            b's' | b't' | b'm' | b'd' => 1 + l1,
            b'r' | b'v' => second(b'e'),
            b'l' => second(b'l'),
            _ => 0,
        }
    }

    /// End of the run of characters having any of `bits`, from `i`.
    #[inline(always)]
    fn run(&self, b: &[u8], mut i: usize, bits: u8) -> usize {
        // ASCII first, a byte at a time (most text), then any character.
        while let Some(&x) = b.get(i) {
            if x >= 0x80 || self.ascii[usize::from(x)] & bits == 0 {
                break;
            }
            i += 1;
        }
        loop {
            let (c, len) = self.at(b, i);
            if c & bits == 0 || len == 0 {
                return i;
            }
            i += len;
        }
    }

    /// `\p{N}{1,3}` at `i` (a digit is there).
    fn digits(&self, b: &[u8], i: usize) -> usize {
        let mut e = i;
        for _ in 0..3 {
            let (c, len) = self.at(b, e);
            if c & N == 0 || len == 0 {
                break;
            }
            e += len;
        }
        e
    }

    /// `[^\s\p{L}\p{N}]+` then `[\r\n]*` (with `/` too for o200k) at `j`.
    fn punct(&self, b: &[u8], j: usize, slash: bool) -> Option<usize> {
        let mut e = j;
        loop {
            let (c, len) = self.at(b, e);
            if c & (S | L | N) != 0 || len == 0 {
                break;
            }
            e += len;
        }
        if e == j {
            return None;
        }
        while let Some(&x) = b.get(e) {
            if x == b'\r' || x == b'\n' || (slash && x == b'/') {
                e += 1;
            } else {
                break;
            }
        }
        Some(e)
    }

    /// The whitespace run at `i`: its end and the end of its last `\r`/`\n`
    /// (0 if it has none).
    fn space_run(&self, b: &[u8], i: usize) -> (usize, usize) {
        let mut e = i;
        let mut after_nl = 0;
        loop {
            let (c, len) = self.at(b, e);
            if c & S == 0 || len == 0 {
                return (e, after_nl);
            }
            e += len;
            if c & NL != 0 {
                after_nl = e;
            }
        }
    }

    /// o200k `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+C?` from `j`.
    /// The first match of the backtracking: the upper run, then the lower run
    /// after it; if no lower character follows the upper run, the upper run
    /// given back up to its last character that is also lower.
    fn o_lower(&self, b: &[u8], j: usize) -> Option<usize> {
        let mut a = j;
        let mut after_last_lower = None;
        loop {
            let (c, len) = self.at(b, a);
            if c & UP == 0 || len == 0 {
                break;
            }
            a += len;
            if c & LO != 0 {
                after_last_lower = Some(a);
            }
        }
        let (c, _) = self.at(b, a);
        let end = if c & LO != 0 {
            self.run(b, a, LO)
        } else {
            after_last_lower?
        };
        Some(end + self.contraction(b, end))
    }

    /// o200k `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*C?` from `j`.
    fn o_upper(&self, b: &[u8], j: usize) -> Option<usize> {
        let a = self.run(b, j, UP);
        if a == j {
            return None;
        }
        let end = self.run(b, a, LO);
        Some(end + self.contraction(b, end))
    }

    /// The common ASCII word, `[^\r\n\p{L}\p{N}]?[A-Z]*[a-z]*` with at
    /// least one letter, ended by an ASCII byte that is neither a letter nor
    /// `'`: its end, which is what the general path below would find
    /// (lowercase after the capitals: the first alternative; capitals only:
    /// the second). `None` for anything else.
    #[inline(always)]
    fn o_ascii_word(&self, b: &[u8], i: usize) -> Option<usize> {
        let &x = b.get(i)?;
        let mut j = i;
        if x >= 0x80 {
            return None;
        }
        if self.ascii[usize::from(x)] & (L | N | NL) == 0 {
            j += 1; // the optional prefix (space, punctuation)
        }
        let mut e = j;
        while b.get(e).is_some_and(u8::is_ascii_uppercase) {
            e += 1;
        }
        while b.get(e).is_some_and(u8::is_ascii_lowercase) {
            e += 1;
        }
        if e == j {
            return None;
        }
        match b.get(e) {
            None => Some(e),
            Some(&y) if y < 0x80 && y != b'\'' && !y.is_ascii_alphabetic() => Some(e),
            _ => None,
        }
    }

    /// End of the o200k piece starting at `i` (< `b.len()`).
    fn o200k(&self, b: &[u8], i: usize) -> usize {
        if let Some(e) = self.o_ascii_word(b, i) {
            return e;
        }
        let (c0, l0) = self.at(b, i);
        // [^\r\n\p{L}\p{N}]? : tried taken first, then not.
        let prefix = c0 & (L | N | NL) == 0;
        // An ASCII character that is no letter, followed by an ASCII
        // character that is no letter either (or nothing): neither letter
        // alternative can match, with the prefix or without (digits,
        // punctuation, whitespace: half the pieces of English text).
        let letters_ahead = c0 & L != 0
            || l0 != 1
            || b.get(i + 1)
                .is_some_and(|&y| y >= 0x80 || self.ascii[usize::from(y)] & L != 0);
        if !letters_ahead {
            return self.o200k_no_letter(b, i, c0, l0);
        }
        if prefix {
            if let Some(e) = self.o_lower(b, i + l0) {
                return e;
            }
        }
        if let Some(e) = self.o_lower(b, i) {
            return e;
        }
        if prefix {
            if let Some(e) = self.o_upper(b, i + l0) {
                return e;
            }
        }
        if let Some(e) = self.o_upper(b, i) {
            return e;
        }
        self.o200k_no_letter(b, i, c0, l0)
    }

    /// The o200k alternatives after the letter ones, for the piece at `i`
    /// whose first character has class `c0` and length `l0`.
    fn o200k_no_letter(&self, b: &[u8], i: usize, c0: u8, l0: usize) -> usize {
        if c0 & N != 0 {
            return self.digits(b, i);
        }
        if b.get(i) == Some(&b' ') {
            if let Some(e) = self.punct(b, i + 1, true) {
                return e;
            }
        }
        if let Some(e) = self.punct(b, i, true) {
            return e;
        }
        // \s*[\r\n]+ | \s+(?!\S) | \s+
        let (w, after_nl) = self.space_run(b, i);
        if after_nl > 0 {
            return after_nl;
        }
        self.spaces_tail(b, i, w, l0)
    }

    /// `\s+(?!\S)` then the last resort (`\s+` in o200k, `\s` in cl100k: both
    /// one character here) for the whitespace run `i..w` with no line break
    /// that the earlier alternatives left.
    fn spaces_tail(&self, b: &[u8], i: usize, w: usize, l0: usize) -> usize {
        if w >= b.len() {
            return w.max(i + l0);
        }
        let back = prev_char(b, w);
        if back > i {
            back
        } else {
            // One whitespace character before a non-space: \s+ and \s agree.
            i + l0
        }
    }

    /// End of the cl100k piece starting at `i` (< `b.len()`): tiktoken's
    /// `'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|
    /// ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s`.
    fn cl100k(&self, b: &[u8], i: usize, legacy: bool) -> usize {
        let c = self.contraction(b, i);
        if c > 0 {
            return i + c;
        }
        let (c0, l0) = self.at(b, i);
        if c0 & (L | N | NL) == 0 {
            let (c1, _) = self.at(b, i + l0);
            if c1 & L != 0 {
                return self.run(b, i + l0, L);
            }
        }
        if c0 & L != 0 {
            return self.run(b, i, L);
        }
        if c0 & N != 0 {
            return self.digits(b, i);
        }
        if b.get(i) == Some(&b' ') {
            if let Some(e) = self.punct(b, i + 1, false) {
                return e;
            }
        }
        if let Some(e) = self.punct(b, i, false) {
            return e;
        }
        let (w, after_nl) = self.space_run(b, i);
        if w >= b.len() && !legacy {
            return w.max(i + l0); // \s++$
        }
        if after_nl > 0 {
            return after_nl; // \s*[\r\n]: up to the run's last line break
        }
        self.spaces_tail(b, i, w, l0)
    }
}

/// The code point and length of the multi-byte UTF-8 character at `i`
/// (`x` = its first byte; the text is a `str`, so it is well formed).
#[inline(always)]
fn decode(b: &[u8], i: usize, x: u8) -> (u32, usize) {
    let cont = |k: usize| u32::from(b.get(i + k).copied().unwrap_or(0x80) & 0x3f);
    if x < 0xe0 {
        ((u32::from(x & 0x1f) << 6) | cont(1), 2)
    } else if x < 0xf0 {
        ((u32::from(x & 0x0f) << 12) | (cont(1) << 6) | cont(2), 3)
    } else {
        (
            (u32::from(x & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3),
            4,
        )
    }
}

/// Start of the character before byte `i` (> 0).
fn prev_char(b: &[u8], i: usize) -> usize {
    let mut k = i.saturating_sub(1);
    while k > 0 && b.get(k).is_some_and(|x| x & 0xc0 == 0x80) {
        k -= 1;
    }
    k
}

/// The o200k split of ASCII text as a table-driven automaton: one lookup a
/// byte and the piece ends written to a buffer without a branch, where the
/// split above branches on each piece's kind and length, and mispredicts
/// (the same code splits `" the"` repeated at 736 MB/s and real text at 228).
/// Boundaries the regex decides only later (a whitespace run's last
/// character joins the next word; a contraction that fails after `'r`) are
/// written when the deciding byte is read, a fixed one or two bytes back, or
/// at the run's last line break (kept as it is read).
mod ascii_dfa {
    // Byte classes.
    pub const LO: u8 = 0; // a-z other than below
    pub const LO_STMD: u8 = 1;
    pub const LO_RV: u8 = 2;
    pub const LO_L: u8 = 3;
    pub const LO_E: u8 = 4;
    pub const UP: u8 = 5;
    pub const UP_STMD: u8 = 6;
    pub const UP_RV: u8 = 7;
    pub const UP_L: u8 = 8;
    pub const UP_E: u8 = 9;
    pub const DIGIT: u8 = 10;
    pub const SPACE: u8 = 11; // U+0020, the only optional lead of punctuation
    pub const WS: u8 = 12; // \s other than space and line breaks
    pub const NL: u8 = 13; // \r \n
    pub const APOS: u8 = 14;
    pub const PUNCT: u8 = 15;
    pub const SLASH: u8 = 16;
    pub const NON_ASCII: u8 = 17;
    pub const CLASSES: usize = 18;

    // States.
    pub const START: u8 = 0;
    pub const WORD_LO: u8 = 1; // a word with a lowercase letter
    pub const WORD_UP: u8 = 2; // a word of capitals so far
    pub const AP: u8 = 3; // a word, then '
    pub const AP_E_LO: u8 = 4; // a word, 'r or 'v (lowercase): 'e' completes it
    pub const AP_E_UP: u8 = 5;
    pub const AP_L_LO: u8 = 6; // a word, 'l: 'l' completes it
    pub const AP_L_UP: u8 = 7;
    pub const DONE: u8 = 8; // a word and its contraction
    pub const SP1: u8 = 9; // one space (no line break in the run)
    pub const WS1: u8 = 10; // one other whitespace
    pub const SPN: u8 = 11; // two or more, the last a space
    pub const WSN: u8 = 12; // two or more, the last another whitespace
    pub const NLR: u8 = 13; // a whitespace run, its last byte a line break
    pub const NL_SP1: u8 = 14; // ... then one space
    pub const NL_WS1: u8 = 15;
    pub const NL_SPN: u8 = 16;
    pub const NL_WSN: u8 = 17;
    pub const PUNCT1: u8 = 18; // one punctuation byte: a word may follow it as one piece
    pub const PUNCTN: u8 = 19; // a punctuation run (or a space and punctuation)
    pub const PUNCT_TAIL: u8 = 20; // its [\r\n/]* after a line break
    pub const DIGIT1: u8 = 21;
    pub const DIGIT2: u8 = 22;
    pub const DIGIT3: u8 = 23;
    pub const STATES: usize = 24;

    // What a step writes, in this order: the position after the run's last
    // line break, two bytes back, one byte back, before this byte.
    pub const AT_NL: u16 = 1 << 8;
    pub const BACK2: u16 = 1 << 9;
    pub const BACK1: u16 = 1 << 10;
    pub const HERE: u16 = 1 << 11;

    pub struct Table {
        pub class: [u8; 256],
        /// The step: the next state and what it writes.
        pub next: [u16; STATES * CLASSES],
        /// The next state alone, times `CLASSES`: the row the following
        /// byte's class indexes, one load and one add a step (a multiply
        /// and a mask besides made it 8 cycles a byte, not 6). Stepped for
        /// the rare pairs and a chunk's odd last byte; the rest goes two
        /// bytes a step (`pair_row`).
        pub row: [u16; STATES * CLASSES],
        /// Two steps at once, indexed by the state times `PAIRS` plus
        /// `pair(c1, c2)`: whether each byte ends a piece (`HERE1`,
        /// `HERE2`); `RARE` when either step writes more than that (`AT_NL`,
        /// `BACK1`, `BACK2`) or reads a line break, which the one-byte
        /// tables then step. Half the steps of the chain above, and fewer
        /// instructions: one cold pass over the server's 6,000 messages,
        /// split and count, 261.6 -> 226.1 million (cachegrind).
        pub pair_ends: [u8; PAIR_SLOTS],
        /// The state after both steps, times `PAIRS` (as `row`).
        pub pair_row: [u16; PAIR_SLOTS],
    }

    /// Two bytes' classes: a row of the pair tables holds this many steps.
    pub const PAIRS: usize = CLASSES * CLASSES;
    /// The pair tables' size, a power of two above `STATES * PAIRS` (an
    /// index masked by `PAIR_SLOTS - 1` needs no bounds check).
    pub const PAIR_SLOTS: usize = 1 << 13;
    const _: () = assert!(STATES * PAIRS <= PAIR_SLOTS);
    pub const HERE1: u8 = 1;
    pub const HERE2: u8 = 2;
    pub const RARE: u8 = 4;

    /// The pair table's column of the classes `c1` then `c2`.
    #[inline(always)]
    pub fn pair(c1: u8, c2: u8) -> usize {
        usize::from(c1) * CLASSES + usize::from(c2)
    }

    fn is_lo(c: u8) -> bool {
        c <= LO_E
    }

    fn is_up(c: u8) -> bool {
        (UP..=UP_E).contains(&c)
    }

    /// The state of a piece that begins with a byte of class `c`.
    fn begin(c: u8) -> u16 {
        u16::from(match c {
            c if is_lo(c) => WORD_LO,
            c if is_up(c) => WORD_UP,
            DIGIT => DIGIT1,
            SPACE => SP1,
            WS => WS1,
            NL => NLR,
            _ => PUNCT1,
        })
    }

    /// A word's step (`lower`: it has a lowercase letter, so a capital
    /// begins the next piece).
    fn word(c: u8, lower: bool) -> u16 {
        match c {
            c if is_lo(c) => u16::from(WORD_LO),
            c if is_up(c) && lower => HERE | u16::from(WORD_UP),
            c if is_up(c) => u16::from(WORD_UP),
            APOS => u16::from(AP),
            c => HERE | begin(c),
        }
    }

    /// A whitespace run's step on a byte that ends it (`lead`: the bytes
    /// written before the run's last byte's piece; `last_space`: that byte
    /// is U+0020).
    fn run_end(c: u8, lead: u16, last_space: bool) -> u16 {
        match c {
            c if is_lo(c) => lead | u16::from(WORD_LO),
            c if is_up(c) => lead | u16::from(WORD_UP),
            APOS | PUNCT | SLASH if last_space => lead | u16::from(PUNCTN),
            APOS | PUNCT | SLASH => lead | HERE | u16::from(PUNCT1),
            _ => lead | HERE | u16::from(DIGIT1), // DIGIT
        }
    }

    fn step(state: u8, c: u8) -> u16 {
        let st = |s: u8| u16::from(s);
        if c == NON_ASCII {
            return 0;
        }
        match state {
            START => begin(c),
            WORD_LO => word(c, true),
            WORD_UP => word(c, false),
            AP => match c {
                LO_STMD | UP_STMD => st(DONE),
                LO_RV => st(AP_E_LO),
                UP_RV => st(AP_E_UP),
                LO_L => st(AP_L_LO),
                UP_L => st(AP_L_UP),
                c if is_lo(c) => BACK1 | st(WORD_LO),
                c if is_up(c) => BACK1 | st(WORD_UP),
                APOS | PUNCT | SLASH => BACK1 | st(PUNCTN),
                NL => BACK1 | st(PUNCT_TAIL),
                c => BACK1 | HERE | begin(c),
            },
            AP_E_LO | AP_E_UP | AP_L_LO | AP_L_UP => {
                let done = match state {
                    AP_E_LO | AP_E_UP => [LO_E, UP_E],
                    _ => [LO_L, UP_L],
                };
                if done.contains(&c) {
                    st(DONE)
                } else {
                    // No contraction: the word ended before the `'`, and the
                    // `'` with its letter is a word of its own, going on.
                    BACK2 | word(c, matches!(state, AP_E_LO | AP_L_LO))
                }
            }
            DONE => HERE | begin(c),
            SP1 | WS1 | SPN | WSN | NL_SP1 | NL_WS1 | NL_SPN | NL_WSN => {
                let after_nl = matches!(state, NL_SP1 | NL_WS1 | NL_SPN | NL_WSN);
                match c {
                    SPACE => st(if after_nl { NL_SPN } else { SPN }),
                    WS => st(if after_nl { NL_WSN } else { WSN }),
                    NL => st(NLR),
                    c => {
                        let many = matches!(state, SPN | WSN | NL_SPN | NL_WSN);
                        let lead = if after_nl { AT_NL } else { 0 } | if many { BACK1 } else { 0 };
                        run_end(c, lead, matches!(state, SP1 | SPN | NL_SP1 | NL_SPN))
                    }
                }
            }
            NLR => match c {
                NL => st(NLR),
                SPACE => st(NL_SP1),
                WS => st(NL_WS1),
                c => HERE | begin(c),
            },
            PUNCT1 => match c {
                c if is_lo(c) => st(WORD_LO),
                c if is_up(c) => st(WORD_UP),
                APOS | PUNCT | SLASH => st(PUNCTN),
                NL => st(PUNCT_TAIL),
                c => HERE | begin(c),
            },
            PUNCTN => match c {
                APOS | PUNCT | SLASH => st(PUNCTN),
                NL => st(PUNCT_TAIL),
                c => HERE | begin(c),
            },
            PUNCT_TAIL => match c {
                NL | SLASH => st(PUNCT_TAIL),
                c => HERE | begin(c),
            },
            DIGIT1 => match c {
                DIGIT => st(DIGIT2),
                c => HERE | begin(c),
            },
            DIGIT2 => match c {
                DIGIT => st(DIGIT3),
                c => HERE | begin(c),
            },
            _ => HERE | begin(c), // DIGIT3: a fourth digit begins a piece too
        }
    }

    pub fn build(ascii: &[u8; 128]) -> Table {
        use super::{L, LO as LOWER, N, NL as BREAK, S};
        let mut class = [NON_ASCII; 256];
        for (x, cell) in class.iter_mut().enumerate().take(128) {
            let bits = ascii.get(x).copied().unwrap_or(0);
            let byte = x as u8;
            let lower = byte.to_ascii_lowercase();
            let letter_class = |base: u8| {
                base + match lower {
                    b's' | b't' | b'm' | b'd' => 1,
                    b'r' | b'v' => 2,
                    b'l' => 3,
                    b'e' => 4,
                    _ => 0,
                }
            };
            *cell = if bits & L != 0 {
                letter_class(if bits & LOWER != 0 { LO } else { UP })
            } else if bits & N != 0 {
                DIGIT
            } else if bits & BREAK != 0 {
                NL
            } else if byte == b' ' {
                SPACE
            } else if bits & S != 0 {
                WS
            } else if byte == b'\'' {
                APOS
            } else if byte == b'/' {
                SLASH
            } else {
                PUNCT
            };
        }
        let mut next = [0u16; STATES * CLASSES];
        let mut row = [0u16; STATES * CLASSES];
        for state in 0..STATES as u8 {
            for c in 0..CLASSES as u8 {
                let at = usize::from(state) * CLASSES + usize::from(c);
                if let (Some(cell), Some(r)) = (next.get_mut(at), row.get_mut(at)) {
                    *cell = step(state, c);
                    *r = (*cell & 0xff) * CLASSES as u16;
                }
            }
        }
        let mut pair_ends = [0u8; PAIR_SLOTS];
        let mut pair_row = [0u16; PAIR_SLOTS];
        for state in 0..STATES as u8 {
            for c1 in 0..CLASSES as u8 {
                for c2 in 0..CLASSES as u8 {
                    let first = step(state, c1);
                    let second = step((first & 0xff) as u8, c2);
                    // A line break is rare too: the rare steps keep
                    // `after_nl`, which the loop then need not.
                    let rare =
                        (first | second) & (AT_NL | BACK2 | BACK1) != 0 || c1 == NL || c2 == NL;
                    let at = usize::from(state) * PAIRS + self::pair(c1, c2);
                    if let (Some(r), Some(e)) = (pair_row.get_mut(at), pair_ends.get_mut(at)) {
                        *r = (second & 0xff) * PAIRS as u16;
                        *e = if first & HERE != 0 { HERE1 } else { 0 }
                            | if second & HERE != 0 { HERE2 } else { 0 }
                            | if rare { RARE } else { 0 };
                    }
                }
            }
        }
        Table {
            class,
            next,
            row,
            pair_ends,
            pair_row,
        }
    }

    /// The piece end a text that ends in `state` still owes (0: none):
    /// `len` the text's length, `after_nl` the position after its last line break.
    pub fn owed_at_end(state: u8, len: usize, after_nl: usize) -> usize {
        match state {
            AP => len.saturating_sub(1),
            AP_E_LO | AP_E_UP | AP_L_LO | AP_L_UP => len.saturating_sub(2),
            NL_SP1 | NL_WS1 | NL_SPN | NL_WSN => after_nl,
            _ => 0,
        }
    }
}

fn ascii_table() -> &'static ascii_dfa::Table {
    static TABLE: OnceLock<ascii_dfa::Table> = OnceLock::new();
    TABLE.get_or_init(|| ascii_dfa::build(&classes().ascii))
}

/// What one step of the split covers: this many bytes for the automaton,
/// this many pieces for the general split.
const CHUNK: usize = 128;
/// The automaton writes at most three ends a byte, and two at the text's end
/// (3 * CHUNK + 2); a power of two above that, so that an index masked by
/// `ENDS - 1` needs no bounds check.
const ENDS: usize = 512;
const _: () = assert!(ENDS >= 3 * CHUNK + 2 && ENDS.is_power_of_two());

/// One byte's step of the automaton from `row` (its class `c`, at `i`):
/// writes its ends after the `n` written, returns the next row.
#[inline(always)]
fn one_step(
    table: &ascii_dfa::Table,
    row: usize,
    c: u8,
    i: usize,
    after_nl: usize,
    n: &mut usize,
    ends: &mut [usize; ENDS],
) -> usize {
    use ascii_dfa::*;
    let at = row + usize::from(c);
    let step = table.next.get(at).copied().unwrap_or(0);
    if step & (AT_NL | BACK2 | BACK1) == 0 {
        // The common step writes no end or one, without a branch.
        ends[*n & (ENDS - 1)] = i;
        *n += usize::from(step & HERE != 0);
    } else {
        let back = [
            (AT_NL, after_nl),
            (BACK2, i.saturating_sub(2)),
            (BACK1, i.saturating_sub(1)),
            (HERE, i),
        ];
        for (flag, end) in back {
            if step & flag != 0 {
                ends[*n & (ENDS - 1)] = end;
                *n += 1;
            }
        }
    }
    usize::from(table.row.get(at).copied().unwrap_or(0))
}

/// The two bytes at `i` and `i + 1` (classes `c1`, `c2`) one step at a
/// time, when either writes more than its own end or is a line break;
/// returns the ends written and the position after the last line break.
/// Kept out of the two-byte loop, whose registers it took.
#[cold]
#[inline(never)]
fn rare_steps(
    table: &ascii_dfa::Table,
    row: usize,
    [c1, c2]: [u8; 2],
    i: usize,
    after_nl: usize,
    mut n: usize,
    ends: &mut [usize; ENDS],
) -> (usize, usize) {
    let row = one_step(table, row, c1, i, after_nl, &mut n, ends);
    let after_nl = if c1 == ascii_dfa::NL { i + 1 } else { after_nl };
    one_step(table, row, c2, i + 1, after_nl, &mut n, ends);
    let after_nl = if c2 == ascii_dfa::NL { i + 2 } else { after_nl };
    (n, after_nl)
}

/// Where the split of one text is.
struct Cursor {
    pattern: Pattern,
    /// The end of the last piece written.
    last: usize,
    /// The automaton: the next byte it reads, its state's row (the state
    /// times `CLASSES`), the position after the last line break it read.
    /// `None` once the general split took over.
    ascii: Option<(usize, usize, usize)>,
}

impl Cursor {
    fn new(pattern: Pattern) -> Cursor {
        Cursor {
            pattern,
            last: 0,
            ascii: (pattern == Pattern::O200k).then_some((
                0,
                usize::from(ascii_dfa::START) * ascii_dfa::CLASSES,
                0,
            )),
        }
    }

    /// Writes the ends of the next pieces of `b` to `ends`; how many (0: the
    /// text is split).
    #[inline(always)]
    fn fill(&mut self, b: &[u8], ends: &mut [usize; ENDS]) -> usize {
        loop {
            let n = match self.ascii {
                Some(scan) => self.fill_ascii(scan, b, ends),
                None => self.fill_general(b, ends),
            };
            // A chunk inside one long piece writes no end.
            if n > 0 || (self.ascii.is_none() && self.last >= b.len()) {
                return n;
            }
        }
    }

    /// The o200k automaton over the next chunk of ASCII: on a non-ASCII
    /// byte the general split goes on from the last end written (a piece
    /// boundary: the automaton writes only ends it is sure of).
    #[inline(always)]
    fn fill_ascii(
        &mut self,
        (at, mut row, mut after_nl): (usize, usize, usize),
        b: &[u8],
        ends: &mut [usize; ENDS],
    ) -> usize {
        use ascii_dfa::*;
        let table = ascii_table();
        let stop = (at + CHUNK).min(b.len());
        let mut n = 0usize;
        // Two bytes a step while both are ASCII. (The masks below change
        // no index: they spare the loop its bounds checks.)
        let mut i = at;
        let mut row2 = row * CLASSES;
        let (pairs, _) = b.get(at..stop).unwrap_or_default().as_chunks::<2>();
        for &[x, y] in pairs {
            if (x | y) >= 0x80 {
                break;
            }
            let c1 = table.class[usize::from(x)];
            let c2 = table.class[usize::from(y)];
            let slot = (row2 + pair(c1, c2)) & (PAIR_SLOTS - 1);
            let step = table.pair_ends[slot];
            if step & RARE == 0 {
                ends[n & (ENDS - 1)] = i;
                n += usize::from(step & HERE1 != 0);
                ends[n & (ENDS - 1)] = i + 1;
                n += usize::from(step & HERE2 != 0);
            } else {
                (n, after_nl) = rare_steps(table, row2 / CLASSES, [c1, c2], i, after_nl, n, ends);
            }
            row2 = usize::from(table.pair_row[slot]);
            i += 2;
        }
        row = row2 / CLASSES;
        while i < stop {
            let c = table.class[usize::from(b.get(i).copied().unwrap_or(0))];
            if c == NON_ASCII {
                self.ascii = None;
                break;
            }
            row = one_step(table, row, c, i, after_nl, &mut n, ends);
            if c == NL {
                after_nl = i + 1;
            }
            i += 1;
        }
        if self.ascii.is_some() {
            if i < b.len() {
                self.ascii = Some((i, row, after_nl));
            } else {
                // The text's end: what the state still owes, then the last piece.
                let owed = owed_at_end((row / CLASSES) as u8, b.len(), after_nl);
                for end in [owed, b.len()] {
                    let before = n.checked_sub(1).and_then(|k| ends.get(k)).copied();
                    if end > before.unwrap_or(self.last) {
                        if let Some(e) = ends.get_mut(n) {
                            *e = end;
                        }
                        n += 1;
                    }
                }
                self.ascii = None;
                self.last = b.len();
                return n;
            }
        }
        if let Some(&e) = n.checked_sub(1).and_then(|k| ends.get(k)) {
            self.last = e;
        }
        n
    }

    /// The general split, a chunk of pieces at a time.
    #[inline(always)]
    fn fill_general(&mut self, b: &[u8], ends: &mut [usize; ENDS]) -> usize {
        let classes = classes();
        let mut i = self.last;
        let mut n = 0;
        while i < b.len() && n < CHUNK {
            let e = match self.pattern {
                Pattern::O200k => classes.o200k(b, i),
                Pattern::Cl100k => classes.cl100k(b, i, false),
                Pattern::Cl100kLegacy => classes.cl100k(b, i, true),
            };
            // Every alternative consumes at least one character; never loop.
            let e = if e > i {
                e.min(b.len())
            } else {
                i + classes.at(b, i).1.max(1)
            };
            if let Some(slot) = ends.get_mut(n) {
                *slot = e;
            }
            n += 1;
            i = e;
        }
        self.last = i;
        n
    }
}

/// Calls `f` with each piece of `text` under `pattern`, in order.
#[inline]
pub fn for_each_piece<'t>(pattern: Pattern, text: &'t str, mut f: impl FnMut(&'t [u8])) {
    let b = text.as_bytes();
    for_each_piece_at(pattern, text, |i, e| f(b.get(i..e).unwrap_or_default()));
}

/// Calls `f` with the start and end of each piece of `text` under
/// `pattern`, in order.
#[inline]
pub fn for_each_piece_at(pattern: Pattern, text: &str, mut f: impl FnMut(usize, usize)) {
    for_each_chunk(pattern, text, |mut start, ends| {
        for &end in ends {
            f(start, end);
            start = end;
        }
    });
}

/// Most piece ends [`for_each_chunk`] hands over at once.
pub const MAX_CHUNK_ENDS: usize = ENDS;

/// Calls `f` with the pieces of `text` under `pattern` a chunk at a time: the
/// first piece's start and the chunk's piece ends, in order (the consumer
/// can ask memory for a whole chunk's lookups before it waits on the first).
#[inline]
pub fn for_each_chunk(pattern: Pattern, text: &str, f: impl FnMut(usize, &[usize])) {
    for_each_chunk_in(pattern, text, &mut [0usize; ENDS], f);
}

/// The ends a chunk is written to: [`for_each_chunk_in`]'s buffer.
pub type ChunkEnds = [usize; ENDS];

/// [`for_each_chunk`] writing the ends to `ends`, a buffer the caller keeps:
/// a fresh one is 3 KB cleared on every call, ~2% of counting a 600 B
/// message (a message's role and content are two calls).
#[inline]
pub fn for_each_chunk_in(
    pattern: Pattern,
    text: &str,
    ends: &mut ChunkEnds,
    mut f: impl FnMut(usize, &[usize]),
) {
    let b = text.as_bytes();
    let mut cursor = Cursor::new(pattern);
    let mut start = 0;
    loop {
        let n = cursor.fill(b, ends);
        let Some(chunk) = ends.get(..n) else { return };
        let Some(&last) = chunk.last() else { return };
        f(start, chunk);
        start = last;
    }
}

/// The pieces of `text` (for tests and tools; counting uses `for_each_piece`).
pub fn pieces(pattern: Pattern, text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at = 0;
    for_each_piece(pattern, text, |p| {
        out.push(text.get(at..at + p.len()).unwrap_or_default());
        at += p.len();
    });
    out
}

/// Builds the class table now (a few ms), not in the first command.
pub fn warm_up() {
    let _ = classes();
}

#[cfg(test)]
#[path = "pretokenize_tests.rs"]
mod tests;
