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
//! The engine is regex-automata's fully built DFAs (a forward and a reverse
//! dense DFA per stage, built once with the encoding, read-only after): each
//! search is linear in the text it scans with a small constant whatever the
//! text, and every search starts where the last piece ended. Its lazy DFA
//! (the meta regex) was 50-200x slower on text it had not seen (fresh
//! mixed-script text: 1-17 ms for 128 B-1 KB under Tekken, MiniMax, Kimi,
//! each new state built as the search meets it, per thread); the dense DFAs
//! cost 1.5-6 MB and 1-3 s per stage, once, off the main thread.

use regex_automata::dfa::{dense, regex::Regex};
use regex_automata::{Input, MatchKind};

/// A compiled stage: one regex of several patterns (leftmost-first, like an
/// alternation), and for each pattern whether its last character is a
/// look-ahead to give back.
pub struct Stage {
    regex: Regex,
    lookahead: Vec<bool>,
}

impl Stage {
    pub fn new(patterns: &[(&str, bool)]) -> Result<Stage, String> {
        let sources: Vec<&str> = patterns.iter().map(|(p, _)| *p).collect();
        let regex = Regex::builder()
            .dense(dense::Config::new().match_kind(MatchKind::LeftmostFirst))
            .build_many(&sources)
            .map_err(|e| e.to_string())?;
        Ok(Stage {
            regex,
            lookahead: patterns.iter().map(|(_, l)| *l).collect(),
        })
    }

    /// The next piece of `segment` at or after `at`: (start, end, is a match).
    /// A gap before the next match is returned first, as a piece of its own.
    fn next(&self, segment: &str, at: usize) -> Option<(usize, usize)> {
        let rest = segment.get(at..)?;
        if rest.is_empty() {
            return None;
        }
        let Some(m) = self.regex.find(Input::new(rest)) else {
            return Some((at, segment.len()));
        };
        if m.start() > 0 {
            return Some((at, at + m.start()));
        }
        let mut end = m.end();
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
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        Some((at, at + end))
    }
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
    fn pieces_cover_the_text_exactly() {
        let s = Splitter::new(vec![Stage::new(&[(r"\p{L}+", false)]).unwrap()]).unwrap();
        let text = "héllo, 世界!! \u{200d}🎉 end";
        assert_eq!(pieces(&s, text).concat(), text);
    }
}
