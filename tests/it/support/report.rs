//! What the hostile tests (stress::fuzz, persistence::restore_corrupt,
//! acl::key_patterns) report: violations by class with a few examples,
//! the tail of a server log, a command's arguments in printable form.
#![allow(dead_code)]

pub fn printable(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| {
            let s = String::from_utf8_lossy(a);
            if s.len() > 60 {
                format!(
                    "{}...({} B)",
                    &s[..s.char_indices().nth(50).map_or(s.len(), |(i, _)| i)],
                    a.len()
                )
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Violations by class: count and the first few examples.
#[derive(Default)]
pub struct Violations(pub Vec<(String, usize, Vec<String>)>);

impl Violations {
    pub fn add(&mut self, class: &str, example: String) {
        match self.0.iter_mut().find(|(c, _, _)| c == class) {
            Some((_, n, ex)) => {
                *n += 1;
                if ex.len() < 3 {
                    ex.push(example);
                }
            }
            None => self.0.push((class.to_owned(), 1, vec![example])),
        }
    }
    pub fn total(&self) -> usize {
        self.0.iter().map(|(_, n, _)| n).sum()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(c, n, ex)| {
                format!(
                    "{n} x {c}, e.g.\n    {}",
                    ex.iter()
                        .map(|e| e.chars().take(400).collect::<String>())
                        .collect::<Vec<_>>()
                        .join("\n    ")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
    pub fn print(&self) {
        if !self.is_empty() {
            println!("  VIOLATIONS:\n{}", self.summary());
        }
    }
}

pub fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
