//! The hand-written pre-tokenizers against the regexes they replace:
//! tiktoken's own patterns (run by fancy-regex, as tiktoken-rs does) and
//! bpe-openai's, piece for piece, on exhaustive short strings, random strings
//! of tricky characters, random code points and long adversarial runs.

use super::*;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

struct Oracle {
    pattern: Pattern,
    tiktoken: fancy_regex::Regex,
    bpe: &'static bpe_openai::Tokenizer,
}

fn oracles() -> [Oracle; 3] {
    [
        Oracle {
            pattern: Pattern::O200k,
            tiktoken: fancy_regex::Regex::new(O200K_REGEX).unwrap(),
            bpe: bpe_openai::o200k_base(),
        },
        Oracle {
            pattern: Pattern::Cl100k,
            tiktoken: fancy_regex::Regex::new(CL100K_REGEX).unwrap(),
            bpe: bpe_openai::cl100k_base(),
        },
        // bpe-openai's cl100k regex is the legacy form: equal with no exception.
        Oracle {
            pattern: Pattern::Cl100kLegacy,
            tiktoken: fancy_regex::Regex::new(CL100K_LEGACY_REGEX).unwrap(),
            bpe: bpe_openai::cl100k_base(),
        },
    ]
}

#[test]
fn patterns_are_tiktoken_s_and_recognised() {
    assert_eq!(O200K_REGEX, tiktoken_rs::O200K_BASE_PAT_STR);
    for (regex, pattern) in [
        (O200K_REGEX, Pattern::O200k),
        (CL100K_REGEX, Pattern::Cl100k),
        (CL100K_LEGACY_REGEX, Pattern::Cl100kLegacy),
    ] {
        assert_eq!(Pattern::for_regex(regex), Some(pattern));
    }
    assert_eq!(Pattern::for_regex(r"\p{N}|\s+"), None);
    assert_eq!(Pattern::for_regex(&(CL100K_REGEX.to_owned() + "|x")), None);
}

impl Oracle {
    /// Panics with the text and both splits when the pieces differ.
    fn check(&self, text: &str) {
        let ours = pieces(self.pattern, text);
        let tik: Vec<&str> = self
            .tiktoken
            .find_iter(text)
            .map(|m| m.unwrap().as_str())
            .collect();
        assert_eq!(
            ours, tik,
            "{:?} vs tiktoken's regex on {text:?}",
            self.pattern
        );
        let bpe: Vec<&str> = self.bpe.split(text).collect();
        if ours != bpe && self.pattern == Pattern::Cl100k {
            // bpe-openai's cl100k regex predates tiktoken's `\s++$`: a text
            // ending in whitespace with a line break is one last piece for
            // tiktoken, two for bpe-openai (up to the break, the rest). Only
            // that difference is allowed; tiktoken's regex is the reference.
            let (last, head) = ours.split_last().unwrap();
            assert!(
                last.chars().all(char::is_whitespace) && last.contains(['\r', '\n']),
                "{text:?}"
            );
            assert_eq!(bpe.len(), ours.len() + 1, "{text:?}");
            assert_eq!(&bpe[..head.len()], head, "{text:?}");
            assert_eq!(bpe[head.len()..].concat(), *last, "{text:?}");
            return;
        }
        assert_eq!(
            ours, bpe,
            "{:?} vs bpe-openai's regex on {text:?}",
            self.pattern
        );
    }
}

/// Characters of every class the patterns tell apart, with the edges:
/// marks (also in both letter classes), modifier and other letters (both),
/// titlecase, non-ASCII digits and numbers, Unicode spaces, `'` and the
/// letters of the contractions in both cases, `ſ` (folds to `s`), `/`.
const TRICKY: &[char] = &[
    'a', 'z', 'A', 'Z', 's', 'S', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l', 'L', 'd',
    'D', '\'', 'ſ', 'K', '0', '7', ' ', ' ', ' ', '\t', '\n', '\r', '\u{b}', '\u{c}', '\u{85}',
    '\u{a0}', '\u{3000}', '\u{2028}', '\u{200b}', '\u{200d}', '\u{feff}', '/', '.', ',', '!', '-',
    '_', '"', '(', '\u{301}', '\u{308}', '\u{903}', 'ʰ', 'ǅ', 'É', 'é', 'ß', 'ﬁ', '我', 'の', 'ア',
    '한', 'ا', 'ह', '٣', '१', 'Ⅻ', '½', '²', '🎉', '👩', '™', '€', '\u{0}', '\u{7f}', '\u{1f}',
    'Ω', 'ω', 'İ', 'ı',
];

/// The tests' seeded generator (rand's StdRng), with the draws they use.
struct Rng(StdRng);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }
    fn below(&mut self, n: usize) -> usize {
        self.0.gen_range(0..n)
    }
    /// `s` made `len` picks of `alphabet`, one pick in `run_odds` repeated
    /// 1 to `max_run` times (runs of one character decide the backtracking).
    fn text(
        &mut self,
        s: &mut String,
        alphabet: &[char],
        len: usize,
        run_odds: usize,
        max_run: usize,
    ) {
        s.clear();
        for _ in 0..len {
            let c = alphabet[self.below(alphabet.len())];
            let times = if self.below(run_odds) == 0 {
                1 + self.below(max_run)
            } else {
                1
            };
            for _ in 0..times {
                s.push(c);
            }
        }
    }

    /// Any Unicode scalar value, ASCII and the BMP more often.
    fn any_char(&mut self) -> char {
        let cp = match self.below(4) {
            0 => self.below(0x80) as u32,
            1 => self.below(0x800) as u32,
            2 => self.below(0x1_0000) as u32,
            _ => self.below(0x11_0000) as u32,
        };
        char::from_u32(cp).unwrap_or('\u{fffd}')
    }
}

#[test]
fn every_string_of_up_to_three_tricky_characters() {
    let oracles = oracles();
    let mut s = String::new();
    for &a in TRICKY {
        for &b in TRICKY {
            for &c in TRICKY {
                for len in 1..=3 {
                    s.clear();
                    s.extend([a, b, c].iter().take(len));
                    for o in &oracles {
                        o.check(&s);
                    }
                }
            }
        }
    }
}

#[test]
fn random_strings_of_tricky_characters() {
    let oracles = oracles();
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    let mut s = String::new();
    for round in 0..60_000 {
        let len = 1 + rng.below(if round % 10 == 0 { 300 } else { 24 });
        rng.text(&mut s, TRICKY, len, 8, 6);
        for o in &oracles {
            o.check(&s);
        }
    }
}

#[test]
fn random_code_points() {
    let oracles = oracles();
    let mut rng = Rng::new(42);
    let mut s = String::new();
    for _ in 0..30_000 {
        s.clear();
        for _ in 0..1 + rng.below(40) {
            if rng.below(3) == 0 {
                s.push(TRICKY[rng.below(TRICKY.len())]);
            } else {
                s.push(rng.any_char());
            }
        }
        for o in &oracles {
            o.check(&s);
        }
    }
}

#[test]
fn every_code_point_alone_and_between_letters() {
    let oracles = oracles();
    let mut s = String::new();
    for cp in 0..0x11_0000u32 {
        let Some(c) = char::from_u32(cp) else {
            continue;
        };
        // Every code point once, in the three places that decide its class:
        // as a prefix of a word, inside a word, after a space.
        if cp % 7 == 0 || cp < 0x3400 {
            for text in [[c, 'a', 'B'], ['A', c, 'b'], [' ', c, '\n']] {
                s.clear();
                s.extend(text);
                for o in &oracles {
                    o.check(&s);
                }
            }
        }
    }
}

#[test]
fn adversarial_runs() {
    let oracles = oracles();
    let unit = [
        " ", "\n", "\r\n", " \n", "\n ", "a", "A", "1", "!", "'s", "'", "ſ", "\u{301}", "ǅ", "ʰ",
        "我", "\u{a0}", "/", "//\n", "Aa", "aA", "A\u{301}", "1a", " 1", "\t", "\u{3000}",
    ];
    let mut rng = Rng::new(7);
    for _ in 0..4_000 {
        let mut s = String::new();
        for _ in 0..1 + rng.below(4) {
            let u = unit[rng.below(unit.len())];
            s.push_str(&u.repeat(1 + rng.below(200)));
        }
        for o in &oracles {
            o.check(&s);
        }
    }
}

#[test]
fn real_text_shapes() {
    let oracles = oracles();
    let texts = [
        "Hello, world! It's a test: don't you think? I'M SURE they'll've DONE it.",
        "fn main() {\n    let v: Vec<u64> = (1..=10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
        "我们在 Redis 里保存对话记忆，每个会话一个键。今日はいい天気ですね。",
        "https://example.com/a/b?c=1&d=2 // comment\n\t\t<|endoftext|>  \n\n  ",
        "Ünïcödé wïth dïäcrïtïcs ånd lïgätürës: ﬁ ﬂ Æ œ ß. e\u{301}e\u{301} ä\u{308}",
        "CamelCaseWord snake_case_word kebab-case HTTPServer IPv6 iOS McDonald's",
        "  leading\r\n\r\n  trailing   \n",
        "",
        " ",
        "\n",
    ];
    for t in texts {
        for o in &oracles {
            o.check(t);
        }
    }
}

#[test]
fn long_runs_are_single_pieces_in_linear_time() {
    // Shapes that make a naive backtracking split quadratic: each must still
    // be cut as the regex cuts it, in one pass.
    for (text, pieces_o200k) in [
        ("a".repeat(1 << 20), 1),
        ("A".repeat(1 << 20), 1),
        (" ".repeat(1 << 20), 1),
        ("\u{301}".repeat(1 << 18), 1),
    ] {
        assert_eq!(pieces(Pattern::O200k, &text).len(), pieces_o200k);
    }
    let text = "A".repeat(1 << 20) + "a";
    assert_eq!(pieces(Pattern::O200k, &text).len(), 1);
    let text = "ʰ".to_string() + &"A".repeat(1 << 20);
    assert_eq!(pieces(Pattern::O200k, &text).len(), 2);
}

#[test]
fn trailing_line_breaks_count_as_tiktoken_does() {
    // Where bpe-openai's cl100k split differs from tiktoken's (whitespace
    // with a line break at the very end), the counts follow tiktoken's.
    let tik = tiktoken_rs::cl100k_base_singleton();
    let bpe = bpe_openai::cl100k_base();
    let mut differ = 0;
    for head in ["x", "def f():", "a.", "", "Hello world", "1"] {
        for tail in [
            "\n ", "\n  ", "\n    ", "\n\n  ", "  \n\n  ", "\r\n\t", "\n\u{a0}", " \n \n ",
        ] {
            let text = format!("{head}{tail}");
            let ours: usize = pieces(Pattern::Cl100k, &text)
                .iter()
                .map(|p| bpe.bpe.count(p.as_bytes()))
                .sum();
            let want = tik.encode_ordinary(&text).len();
            assert_eq!(ours, want, "{text:?}");
            differ += usize::from(bpe.count(text.as_str()) != want);
        }
    }
    println!("bpe-openai's cl100k count differs from tiktoken's on {differ} of 48 texts");
}

/// ASCII of every class the o200k automaton tells apart (`ascii_o200k`):
/// the contraction letters in both cases and other letters, a digit, space,
/// other whitespace, both line breaks, `'`, `/`, other punctuation, a control.
const ASCII_CLASSES: &[char] = &[
    'a', 's', 'r', 'e', 'l', 'v', 'A', 'S', 'R', 'E', 'L', '0', ' ', '\t', '\u{b}', '\n', '\r',
    '\'', '/', '.', '(', '\u{1f}',
];

#[test]
fn every_ascii_string_of_up_to_five_classes_splits_as_the_regex() {
    let o200k = &oracles()[0];
    let n = ASCII_CLASSES.len();
    let mut s = String::new();
    for len in 1..=5u32 {
        for mut k in 0..n.pow(len) {
            s.clear();
            for _ in 0..len {
                s.push(ASCII_CLASSES[k % n]);
                k /= n;
            }
            o200k.check(&s);
        }
    }
}

#[test]
fn random_ascii_and_a_late_non_ascii_character_split_as_the_regex() {
    let o200k = &oracles()[0];
    let mut rng = Rng::new(0x5EED_A5C1);
    let mut s = String::new();
    for round in 0..100_000 {
        let len = 1 + rng.below(if round % 10 == 0 { 400 } else { 40 });
        rng.text(&mut s, ASCII_CLASSES, len, 6, 5);
        // The automaton hands over to the general split at the first
        // non-ASCII character, wherever it falls.
        if round % 4 == 0 {
            let at = rng.below(s.len() + 1);
            s.insert(at, TRICKY[rng.below(TRICKY.len())]);
        }
        o200k.check(&s);
    }
}
