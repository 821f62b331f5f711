//! Pre-tokenization of the open-weight encodings: the text split into the
//! pieces that byte-pair encoding then counts one by one.
//!
//! Two behaviours cover every vendor's tokenizer:
//! - HuggingFace `Split` with `Isolated` behaviour, applied in sequence
//!   (DeepSeek V3: digits, then CJK runs, then the word pattern): each stage
//!   splits every segment of the stage before into its matches and the gaps
//!   between them, and both go on to the next stage;
//! - the last stage's pattern, whose `\s+(?!\S)` look-ahead the `regex`
//!   engines cannot run, is written as bpe-openai writes it: `\s+$` in the
//!   first pattern, then `\s+\s` marked as a look-ahead pattern (its last
//!   character is given back), then `\s+`. Text the pattern does not match is
//!   a piece of its own (HuggingFace keeps it; tiktoken's patterns match
//!   everything, so there it never happens).
//!
//! The engine is regex-automata's fully built DFAs, read-only: each search
//! is linear in the text it scans with a small constant whatever the text,
//! and every search starts where the last piece ended. A piece is one
//! anchored forward search (a dense DFA); only after a gap (text no pattern
//! matches, which HuggingFace's Isolated stages leave) does an unanchored
//! search find the next match and a reverse DFA (sparse: rarely used, a
//! tenth of the size) where it starts. Its lazy DFA (the meta regex) was
//! 50-200x slower on text it had not seen (1-17 ms for 128 B-1 KB of fresh
//! mixed-script text under Tekken, MiniMax, Kimi). The DFAs of every
//! encoding's stages are compiled when the module is built (build.rs, from
//! split_patterns.rs) and carried in it: 0.3-3.2 s per encoding at first
//! use before; a stage the module does not carry (a test's) is compiled
//! here.

use regex_automata::dfa::{dense, sparse, Automaton};
use regex_automata::{Anchored, Input};

use super::split_patterns::{self, Stage as Patterns};

/// The DFA tables build.rs compiled: `SHIPPED`, one entry per distinct
/// stage, in the platform's byte order.
mod shipped {
    /// `include_bytes!` data aligned as the dense DFA's u32 words require.
    #[repr(C, align(4))]
    pub struct Aligned<B: ?Sized>(pub B);

    /// One stage's tables.
    pub struct Tables {
        pub sources: &'static [&'static str],
        pub forward: &'static Aligned<[u8]>,
        pub reverse: &'static [u8],
    }

    include!(concat!(env!("OUT_DIR"), "/split_tables.rs"));
}

/// A compiled stage: its forward and reverse DFAs, and for each pattern
/// whether its last character is a look-ahead to give back.
type Forward = dense::DFA<&'static [u32]>;
type Reverse = sparse::DFA<&'static [u8]>;

pub struct Stage {
    forward: Forward,
    reverse: Reverse,
    lookahead: Vec<bool>,
}

impl Stage {
    /// The stage of `patterns`: the module's compiled tables when it carries
    /// them, compiled now otherwise.
    pub fn new(patterns: Patterns) -> Result<Stage, String> {
        let sources = split_patterns::sources(patterns);
        let (forward, reverse) = match shipped_tables(&sources) {
            Some(tables) => tables,
            None => compile(&sources)?,
        };
        Ok(Stage {
            forward,
            reverse,
            lookahead: patterns.iter().map(|(_, l)| *l).collect(),
        })
    }

    /// The next piece of `segment` at or after `at`: (start, end).
    /// A gap before the next match is returned first, as a piece of its own.
    fn next(&self, segment: &str, at: usize) -> Option<(usize, usize)> {
        let rest = segment.get(at..)?;
        if rest.is_empty() {
            return None;
        }
        // Leftmost-first: a match starting here is the one an unanchored
        // search would find, so one anchored search gives the piece.
        let anchored = Input::new(rest).anchored(Anchored::Yes);
        let Ok(Some(m)) = self.forward.try_search_fwd(&anchored) else {
            return Some((at, at + self.gap(rest)));
        };
        let mut end = m.offset();
        if self
            .lookahead
            .get(m.pattern().as_usize())
            .copied()
            .unwrap_or(false)
        {
            let last = rest
                .get(..end)
                .and_then(|s| s.chars().next_back())
                .map_or(0, char::len_utf8);
            end -= last;
        }
        if end == 0 {
            // Never expected of these patterns; one character keeps the
            // split moving (and linear) whatever a pattern does.
            end = one_char(rest);
        }
        Some((at, at + end))
    }

    /// The length of the gap at the start of `rest` (no match starts there):
    /// up to where the next match starts, or all of it. These DFAs have no
    /// quit bytes and no Unicode word boundaries, so searches never fail;
    /// were one to, the gap is one character and the split moves on.
    fn gap(&self, rest: &str) -> usize {
        let Ok(found) = self.forward.try_search_fwd(&Input::new(rest)) else {
            return one_char(rest);
        };
        let Some(end) = found.map(|m| m.offset()) else {
            return rest.len();
        };
        // Where that match starts: the reverse DFA, anchored at its end (on
        // the same haystack, so `$` sees what follows as the forward did).
        let back = Input::new(rest).range(..end).anchored(Anchored::Yes);
        match self.reverse.try_search_rev(&back) {
            Ok(Some(m)) if m.offset() > 0 => m.offset(),
            _ => one_char(rest),
        }
    }
}

fn one_char(rest: &str) -> usize {
    rest.chars().next().map_or(rest.len(), char::len_utf8)
}

/// The tables build.rs compiled for these sources, if the module carries
/// them and they load (a module built for another byte order would not).
fn shipped_tables(sources: &[&str]) -> Option<(Forward, Reverse)> {
    let tables = shipped::SHIPPED.iter().find(|t| t.sources == sources)?;
    let (forward, _) = dense::DFA::from_bytes(&tables.forward.0).ok()?;
    let (reverse, _) = sparse::DFA::from_bytes(tables.reverse).ok()?;
    Some((forward, reverse))
}

/// Compiles a stage the module does not carry. Its tables live as long as
/// the process, as the shipped ones and every encoding's do.
fn compile(sources: &[&str]) -> Result<(Forward, Reverse), String> {
    let (forward, pad) = split_patterns::forward(sources)?.to_bytes_native_endian();
    let reverse = split_patterns::reverse(sources)?.to_bytes_native_endian();
    // Vec::leak keeps the buffer where it is, so `pad` still aligns it.
    let forward: &'static [u8] = forward.leak();
    let reverse: &'static [u8] = reverse.leak();
    let (forward, _) = dense::DFA::from_bytes(forward.get(pad..).unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let (reverse, _) = sparse::DFA::from_bytes(reverse).map_err(|e| e.to_string())?;
    Ok((forward, reverse))
}

/// Stages applied in sequence; the text's pieces are those of the last.
pub struct Splitter {
    stages: Vec<Stage>,
}

/// At most this many stages (DeepSeek has three).
const MAX_STAGES: usize = 4;

impl Splitter {
    pub fn new(stages: Vec<Stage>) -> Result<Splitter, String> {
        if stages.is_empty() || stages.len() > MAX_STAGES {
            return Err(format!("a splitter has 1 to {MAX_STAGES} stages"));
        }
        Ok(Splitter { stages })
    }

    pub fn split<'a>(&'a self, text: &'a str) -> Pieces<'a> {
        let mut frames = [(0, 0, 0); MAX_STAGES];
        frames[0] = (0, text.len(), 0);
        Pieces {
            splitter: self,
            text,
            frames,
            depth: 1,
        }
    }
}

/// The pieces of a text, without allocating: a stack of the segment being
/// split at each stage, as (start, end, cursor) in the text.
pub struct Pieces<'a> {
    splitter: &'a Splitter,
    text: &'a str,
    frames: [(usize, usize, usize); MAX_STAGES],
    depth: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        while self.depth > 0 {
            let level = self.depth - 1;
            let (start, end, cursor) = self.frames[level];
            let segment = self.text.get(start..end)?;
            let stage = self.splitter.stages.get(level)?;
            let Some((from, to)) = stage.next(segment, cursor) else {
                self.depth -= 1;
                continue;
            };
            self.frames[level].2 = to;
            if level + 1 == self.splitter.stages.len() {
                return self.text.get(start + from..start + to);
            }
            // level + 1 < stages.len() <= MAX_STAGES (checked in new).
            self.frames[level + 1] = (start + from, start + to, 0);
            self.depth += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &Splitter, text: &str) -> Vec<String> {
        s.split(text).map(str::to_owned).collect()
    }

    #[test]
    fn lookahead_gives_back_one_space() {
        let s = Splitter::new(vec![Stage::new(&[
            (r"\p{L}+| ?\p{L}+|\s+$", false),
            (r"\s+\s", true),
            (r"\s+", false),
        ])
        .unwrap()])
        .unwrap();
        assert_eq!(pieces(&s, "a   b  "), ["a", "  ", " b", "  "]);
    }

    #[test]
    fn stages_isolate_matches_and_keep_gaps() {
        let s = Splitter::new(vec![
            Stage::new(&[(r"\p{N}{1,3}", false)]).unwrap(),
            Stage::new(&[(r"[一-龥]+", false)]).unwrap(),
            Stage::new(&[(r" ?\p{L}+", false)]).unwrap(),
        ])
        .unwrap();
        // " 中" is not one piece: the CJK stage isolates 中 first; "\u{1}" is
        // matched by no stage and kept as a gap.
        assert_eq!(
            pieces(&s, "ab 中文12345 x\u{1}"),
            ["ab", " ", "中文", "123", "45", " x", "\u{1}"]
        );
        assert_eq!(pieces(&s, ""), Vec::<String>::new());
    }

    #[test]
    fn every_encoding_stage_is_carried_compiled() {
        for stage in super::split_patterns::ALL.iter().flat_map(|s| s.iter()) {
            let sources = super::split_patterns::sources(stage);
            assert!(shipped_tables(&sources).is_some(), "{sources:?}");
        }
    }

    #[test]
    fn shipped_and_compiled_tables_split_alike() {
        let text = "Hello, World!  I'm 12345 中文字 🎉\n\n  x\u{1}y  ";
        for stage in super::split_patterns::ALL.iter().flat_map(|s| s.iter()) {
            let sources = super::split_patterns::sources(stage);
            let lookahead: Vec<bool> = stage.iter().map(|(_, l)| *l).collect();
            let (forward, reverse) = shipped_tables(&sources).unwrap();
            let shipped = Splitter::new(vec![Stage {
                forward,
                reverse,
                lookahead: lookahead.clone(),
            }])
            .unwrap();
            let (forward, reverse) = compile(&sources).unwrap();
            let compiled = Splitter::new(vec![Stage {
                forward,
                reverse,
                lookahead,
            }])
            .unwrap();
            assert_eq!(
                pieces(&shipped, text),
                pieces(&compiled, text),
                "{sources:?}"
            );
        }
    }

    #[test]
    fn pieces_cover_the_text_exactly() {
        let s = Splitter::new(vec![Stage::new(&[(r"\p{L}+", false)]).unwrap()]).unwrap();
        let text = "héllo, 世界!! \u{200d}🎉 end";
        assert_eq!(pieces(&s, text).concat(), text);
    }
}
